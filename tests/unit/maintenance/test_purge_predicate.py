"""The purge predicate's allow-list: what is accepted renders to the same meaning in PostgreSQL and
Spark; what cannot be rendered identically is refused with one line naming why."""

from __future__ import annotations

import pytest
from coldharbor.capture.registry import LakeColumn
from coldharbor.maintenance.purge_predicate import parse
from coldharbor.runtime.errors import ConfigError

COLUMNS = [LakeColumn("id", "bigint", "LONG", 1), LakeColumn("customer", "text", "STRING", None),
           LakeColumn("amount", "numeric(10,2)", "DECIMAL(10,2)", None),
           LakeColumn("code", "character(3)", "STRING", None),
           LakeColumn("at", "timestamp with time zone", "TIMESTAMP", None),
           LakeColumn("local", "timestamp without time zone", "TIMESTAMP_NTZ", None),
           LakeColumn("day", "date", "DATE", None), LakeColumn("u", "uuid", "STRING", None),
           LakeColumn("flag", "boolean", "BOOLEAN", None), LakeColumn("doc", "jsonb", "STRING", None)]


@pytest.mark.parametrize("text, postgres, spark", [
    ("customer = 'c1'", "\"customer\" COLLATE \"C\" = 'c1'", "`customer` = 'c1'"),
    ("customer < 'm' AND customer LIKE 'c%'",
     "\"customer\" COLLATE \"C\" < 'm' AND \"customer\" COLLATE \"C\" LIKE 'c%'",
     "`customer` < 'm' AND `customer` LIKE 'c%'"),
    ("id BETWEEN 1 AND 10 OR NOT amount IN (1, -2.5)", "\"id\" BETWEEN 1 AND 10 OR NOT \"amount\" IN (1, -2.5)",
     "`id` BETWEEN 1 AND 10 OR NOT `amount` IN (1, -2.5)"),
    ("at < '2026-01-01 01:00:00+01:00'", "\"at\" < CAST('2026-01-01 00:00:00+00:00' AS TIMESTAMPTZ)",
     "`at` < CAST('2026-01-01 00:00:00+00:00' AS TIMESTAMP)"),
    ("at >= '2026-01-01T00:00:00Z'", "\"at\" >= CAST('2026-01-01 00:00:00+00:00' AS TIMESTAMPTZ)",
     "`at` >= CAST('2026-01-01 00:00:00+00:00' AS TIMESTAMP)"),
    ("local < '2026-01-01 00:00'", "\"local\" < CAST('2026-01-01 00:00:00' AS TIMESTAMP)",
     "`local` < CAST('2026-01-01 00:00:00' AS TIMESTAMP_NTZ)"),
    ("day = '2026-02-03'", "\"day\" = CAST('2026-02-03' AS DATE)", "`day` = CAST('2026-02-03' AS DATE)"),
    ("u = '6F1C0E1A-0000-4000-8000-000000000001'", "\"u\" = '6f1c0e1a-0000-4000-8000-000000000001'",
     "`u` = '6f1c0e1a-0000-4000-8000-000000000001'"),
    ("flag = TRUE AND code IS NULL AND doc IS NOT NULL", "\"flag\" = TRUE AND \"code\" IS NULL AND \"doc\" IS NOT NULL",
     "`flag` = TRUE AND `code` IS NULL AND `doc` IS NOT NULL"),
    ("id IN (9223372036854775807, 99999999999999999999999999999999999999, 0.5)",
     "\"id\" IN (9223372036854775807, 99999999999999999999999999999999999999, 0.5)",
     "`id` IN (9223372036854775807, 99999999999999999999999999999999999999, 0.5)"),
])
def test_accepted_predicates_render_alike(text, postgres, spark):
    predicate = parse(text, COLUMNS)
    assert (predicate.postgres, predicate.spark) == (postgres, spark)


@pytest.mark.parametrize("text, message", [
    ("at < '2026-01-01 00:00:00'", "with an explicit zone"),
    ("local < '2026-01-01 00:00Z'", "without a zone"),
    ("code = 'ab'", "char(n) pads with blanks"),
    ("doc = '{}'", "only with IS [NOT] NULL"),
    ("u < '6f1c0e1a-0000-4000-8000-000000000001'", "cannot use < on column 'u'"),
    ("u = 'x'", "it takes a uuid"),
    ("flag", "it has COLUMN"),
    ("customer = 'a\\b'", "without a backslash"),
    ("customer ILIKE 'c%'", "it has ILIKE"),
    ("id = 'x'", "it takes a number"),
    ("day = '2026-2-3'", "a date 'YYYY-MM-DD'"),
    ("id = customer", "one column with literals"),
    ("1 = 1", "one column with literals"),
    ("'c' LIKE customer", "one column with literals"),
    ("customer = 'c1' OR pg_sleep(1) IS NULL", "one column with literals"),
    ("lower(customer) = 'c1'", "one column with literals"),
    # Found by a cold attack: the subquery reached PostgreSQL and Spark ("an error no check foresaw").
    ("customer IN (SELECT customer FROM t_big)", "no subquery or other part"),
    ("customer IN (SELECT current_setting('data_directory'))", "no subquery or other part"),
    ("customer IN (SELECT table_name FROM coldharbor.tables)", "no subquery or other part"),
    ("id = 1 OR customer IN (SELECT 'zz')", "no subquery or other part"),
    ("customer LIKE 'a!%' ESCAPE '!'", "it has ESCAPE"),
    ("id IN UNNEST(ARRAY[1, 2])", "no subquery or other part"),
    ("id IN (1, 2) AND NOT (customer IN (SELECT 1))", "no subquery or other part"),
    ("custmer = 'c1'", "column 'custmer'"),
    ("t.id = 1", "without a table"),
    ("", "is empty"),
    # An exponent is exact in PostgreSQL but a double in Spark: 9223372036854775806 would match it there.
    ("id = 9223372036854775807e0", "without an exponent"),
    ("amount = 1.5E2", "without an exponent"),
    ("id = 123456789012345678901234567890123456789", "at most 38 digits"),
    ("amount < 0.000000000000000000000000000000000000001", "at most 38 digits"),
    ("at < '0001-01-01 00:00:00+01:00'", "between years 1 and 9999"),
    ("customer = 'a\x00b'", "NUL character"),
    ("(" * 3000 + "id = 1" + ")" * 3000, "nested too deeply"),
    ("NOT " * 3000 + "id = 1", "nested too deeply"),
    (" OR ".join(f"id = {n}" for n in range(20_000)), "at most 100,000"),
])
def test_predicates_that_cannot_mean_the_same_are_refused(text, message):
    with pytest.raises(ConfigError) as refused:
        parse(text, COLUMNS)
    assert message in str(refused.value) and "\n" not in str(refused.value)

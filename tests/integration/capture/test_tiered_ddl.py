"""DDL a tiered table's evicted rows cannot follow (sql/migrations/018).

Rows evicted from the hot tier live in the lake alone, under their columns' names and lake types,
and no base rewrites them. Before sql/migrations/018 a `RENAME COLUMN` of such a table made every evicted row
read NULL in the renamed column, a column added under a dropped one's name showed the dropped
column's values in them, and a type change the lake cannot widen to left the table refused by every
export. All three are refused now once rows were evicted; before any eviction they go through as
before. A rename spelled `ALTER TYPE ... RENAME ATTRIBUTE` (or through ALTER VIEW, MATERIALIZED VIEW,
FOREIGN TABLE) reached no trigger at all before: the lake kept the old name for every table.
"""

from __future__ import annotations

import threading
import time

import psycopg
import pytest
from coldharbor.capture import registry
from coldharbor.maintenance import resync, verify

from tests.helpers import export, lake_live, pg_rows, report_run, serve_report

DDL = "id bigint PRIMARY KEY, customer text, amount numeric(12,2), status text, qty integer"


def tiered_table(conn, name: str) -> registry.RegisteredTable:
    """A tiered table registered with 200 rows (its initial load), and 60 more written after."""
    conn.execute(f"CREATE TABLE {name} ({DDL})")
    conn.execute(f"INSERT INTO {name} SELECT g, 'c' || (g % 13), g * 0.5, 'new', g FROM generate_series(1, 200) g")
    conn.execute("SELECT coldharbor.register_table(%s, p_hot_retention => interval '1 hour')", (name,))
    conn.execute(f"INSERT INTO {name} SELECT g, 'late ' || g, g, 'paid', g FROM generate_series(201, 260) g")
    [table] = registry.load(conn, name)
    return table


def in_the_lake(spark, dsn: str, conn, name: str, lake_root: str) -> None:
    """Exports until the table's load and every change are in the lake."""
    assert export(spark, dsn, name, lake_root).status in ("loaded", "exported")
    assert export(spark, dsn, name, lake_root).status in ("exported", "clean")
    assert lake_live(spark, lake_root, name, ["id"]) == pg_rows(conn, f"SELECT * FROM {name}", ["id"])


def evict_written_rows(conn, table: registry.RegisteredTable) -> int:
    """Makes every logged change look made and flushed two hours ago, then evicts (1 hour retention)."""
    conn.execute("""UPDATE coldharbor.change_log SET created_at = created_at - interval '2 hours',
                           flushed_at = flushed_at - interval '2 hours' WHERE table_id = %s""", (table.table_id,))
    return conn.execute("SELECT coldharbor.evict(%s, now())", (table.table_id,)).fetchone()[0]


def evicted_tiered_table(spark, dsn: str, conn, name: str, lake_root: str) -> tuple[registry.RegisteredTable, dict]:
    """A tiered table in the lake whose 60 rows written after registration were evicted; with every
    row it held before the eviction (what its reports must still show)."""
    table = tiered_table(conn, name)
    in_the_lake(spark, dsn, conn, name, lake_root)
    everything = pg_rows(conn, f"SELECT * FROM {name}", ["id"])
    assert evict_written_rows(conn, table) == 60
    return table, everything


def report(monkeypatch, conn, dsn: str, lake_root: str, name: str, run_id: str) -> dict:
    assert serve_report(monkeypatch, dsn, lake_root, "--sql", f"SELECT * FROM {name}",
                        "--target", f"adhoc_{run_id}", "--run-id", run_id) == 0
    return pg_rows(conn, f"SELECT * FROM reports.adhoc_{run_id}", ["id"])


def rebase_serial(conn, table: registry.RegisteredTable) -> int:
    return conn.execute("SELECT rebase_serial FROM coldharbor.tables WHERE table_id = %s",
                        (table.table_id,)).fetchone()[0]


def test_a_column_of_a_tiered_table_with_evicted_rows_is_neither_renamed_nor_reused(
        spark, pg_dsn, pg_conn, table_name, lake_root, monkeypatch):
    t = table_name
    table, everything = evicted_tiered_table(spark, pg_dsn, pg_conn, t, lake_root)
    assert pg_conn.execute("SELECT evicted_at IS NOT NULL FROM coldharbor.tables WHERE table_id = %s",
                           (table.table_id,)).fetchone()[0]
    serial = rebase_serial(pg_conn, table)

    with pytest.raises(psycopg.errors.FeatureNotSupported) as refused:
        pg_conn.execute(f"ALTER TABLE {t} RENAME COLUMN customer TO buyer")
    message = str(refused.value)
    assert message.startswith(f"cannot rename column customer of public.{t} to buyer: rows evicted from its hot "
                              "tier (last at ") and "would read NULL under the new one" in message
    assert "\n" not in message.split("HINT")[0].strip()
    assert [c.name for c in registry.lake_columns(pg_conn, table)][:2] == ["id", "customer"]
    assert rebase_serial(pg_conn, table) == serial  # nothing requested: the DDL rolled back
    assert report(monkeypatch, pg_conn, pg_dsn, lake_root, t, f"a_{t}") == everything

    # A dropped column's name is not taken again: evicted rows hold its values under that name.
    pg_conn.execute(f"ALTER TABLE {t} DROP COLUMN status")
    with pytest.raises(psycopg.errors.FeatureNotSupported, match=(
            f"cannot add column status to public.{t}: rows evicted from its hot tier .* holding the values of "
            "the dropped column status, and would show them as the new column's")):
        pg_conn.execute(f"ALTER TABLE {t} ADD COLUMN status text")
    pg_conn.execute(f"ALTER TABLE {t} ADD COLUMN state text")  # another name is a column like any other
    for row in everything.values():
        del row["status"]
        row["state"] = None
    export(spark, pg_dsn, t, lake_root)
    assert report(monkeypatch, pg_conn, pg_dsn, lake_root, t, f"b_{t}") == everything
    live = lake_live(spark, lake_root, t, ["id"])
    assert {k: r["customer"] for k, r in live.items()} == {k: r["customer"] for k, r in everything.items()}


def test_a_tiered_table_with_nothing_evicted_renames_a_column_as_any_table(
        spark, pg_dsn, pg_conn, table_name, lake_root, monkeypatch):
    t = table_name
    table = tiered_table(pg_conn, t)
    in_the_lake(spark, pg_dsn, pg_conn, t, lake_root)
    # Changes made just now are inside the retention: nothing goes.
    assert pg_conn.execute("SELECT coldharbor.evict(%s, now() - interval '1 hour')",
                           (table.table_id,)).fetchone()[0] == 0

    pg_conn.execute(f"ALTER TABLE {t} RENAME COLUMN customer TO buyer")

    assert rebase_serial(pg_conn, table) == 1
    assert export(spark, pg_dsn, t, lake_root).status == "loaded"  # the rename's base
    expected = pg_rows(pg_conn, f"SELECT * FROM {t}", ["id"])
    assert len(expected) == 260
    live = lake_live(spark, lake_root, t, ["id"])
    assert {k: r["buyer"] for k, r in live.items()} == {k: r["buyer"] for k, r in expected.items()}
    assert report(monkeypatch, pg_conn, pg_dsn, lake_root, t, f"n_{t}") == expected


def test_a_table_registered_again_after_its_evictions_renames_a_column(
        spark, pg_dsn, pg_conn, table_name, lake_root, monkeypatch):
    """The evicted rows were the old relation's: the new relation's base marks their keys deleted."""
    t = table_name
    table, _ = evicted_tiered_table(spark, pg_dsn, pg_conn, t, lake_root)
    pg_conn.execute(f"DROP TABLE {t}")
    pg_conn.execute(f"CREATE TABLE {t} ({DDL})")
    pg_conn.execute(f"INSERT INTO {t} SELECT g, 'n' || g, g, 'new', g FROM generate_series(100, 150) g")
    pg_conn.execute("SELECT coldharbor.register_table(%s, p_hot_retention => interval '1 hour')", (t,))

    pg_conn.execute(f"ALTER TABLE {t} RENAME COLUMN customer TO buyer")

    assert export(spark, pg_dsn, t, lake_root).status in ("loaded", "exported")
    expected = pg_rows(pg_conn, f"SELECT * FROM {t}", ["id"])
    assert report(monkeypatch, pg_conn, pg_dsn, lake_root, t, f"c_{t}") == expected
    live = lake_live(spark, lake_root, t, ["id"])
    assert {k: r["buyer"] for k, r in live.items()} == {k: r["buyer"] for k, r in expected.items()}


# Every spelling PostgreSQL accepts for renaming a column of a table.
RENAMES = ["ALTER TABLE {t} RENAME COLUMN customer TO buyer", "ALTER TYPE {t} RENAME ATTRIBUTE customer TO buyer",
           "ALTER VIEW {t} RENAME COLUMN customer TO buyer", "ALTER MATERIALIZED VIEW {t} RENAME COLUMN customer TO buyer",
           "ALTER FOREIGN TABLE {t} RENAME COLUMN customer TO buyer"]
RENAME_IDS = ["table", "type attribute", "view", "materialized view", "foreign table"]


@pytest.mark.parametrize("rename", RENAMES, ids=RENAME_IDS)
def test_every_spelling_of_a_rename_sends_the_table_back_for_a_new_base(
        spark, pg_dsn, pg_conn, table_name, lake_root, monkeypatch, rename):
    t = table_name
    pg_conn.execute(f"CREATE TABLE {t} ({DDL})")
    pg_conn.execute(f"INSERT INTO {t} SELECT g, 'c' || g, g, 'new', g FROM generate_series(1, 120) g")
    pg_conn.execute("SELECT coldharbor.register_table(%s)", (t,))
    [table] = registry.load(pg_conn, t)
    in_the_lake(spark, pg_dsn, pg_conn, t, lake_root)

    pg_conn.execute(rename.format(t=t))

    assert pg_conn.execute("SELECT load_state, rebase_reason FROM coldharbor.tables WHERE table_id = %s",
                           (table.table_id,)).fetchone() == ("pending", "column customer was renamed to buyer")
    expected = pg_rows(pg_conn, f"SELECT * FROM {t}", ["id"])
    assert report(monkeypatch, pg_conn, pg_dsn, lake_root, t, f"p_{t}") == expected
    assert export(spark, pg_dsn, t, lake_root).status == "loaded"
    live = lake_live(spark, lake_root, t, ["id"])
    assert {k: r["buyer"] for k, r in live.items()} == {k: r["buyer"] for k, r in expected.items()}
    assert report(monkeypatch, pg_conn, pg_dsn, lake_root, t, f"q_{t}") == expected


@pytest.mark.parametrize("rename", RENAMES[1:], ids=RENAME_IDS[1:])
def test_every_spelling_of_a_rename_is_refused_once_rows_were_evicted(
        spark, pg_dsn, pg_conn, table_name, lake_root, monkeypatch, rename):
    t = table_name
    table, _ = evicted_tiered_table(spark, pg_dsn, pg_conn, t, lake_root)

    with pytest.raises(psycopg.errors.FeatureNotSupported, match=f"cannot rename column customer of public.{t} to buyer"):
        pg_conn.execute(rename.format(t=t))
    assert rebase_serial(pg_conn, table) == 0


@pytest.mark.parametrize("ddl, lake_types", [
    ("ALTER TABLE {t} ALTER COLUMN amount TYPE numeric(12,0)", "DECIMAL(12,2), and the lake cannot widen them to DECIMAL(12,0)"),
    ("ALTER TABLE {t} ALTER COLUMN qty TYPE text", "INT, and the lake cannot widen them to STRING"),
    ("ALTER TABLE {t} ALTER COLUMN qty TYPE smallint", "INT, and the lake cannot widen them to SHORT"),
], ids=["decimal scale", "integer to text", "narrower integer"])
def test_a_type_change_the_lake_cannot_widen_is_refused_once_rows_were_evicted(
        spark, pg_dsn, pg_conn, table_name, lake_root, monkeypatch, ddl, lake_types):
    """The export would refuse the table for good, and its way out (the lake moved aside, a resync)
    would lose the evicted rows."""
    t = table_name
    table, everything = evicted_tiered_table(spark, pg_dsn, pg_conn, t, lake_root)

    with pytest.raises(psycopg.errors.FeatureNotSupported) as refused:
        pg_conn.execute(ddl.format(t=t))
    assert str(refused.value).startswith("cannot change the type of column ")
    assert f"of public.{t} to " in str(refused.value) and f"live in the lake alone, as {lake_types}" in str(refused.value)
    assert rebase_serial(pg_conn, table) == 0
    assert report(monkeypatch, pg_conn, pg_dsn, lake_root, t, f"r_{t}") == everything


def test_a_type_change_the_lake_widens_goes_through_after_evictions(
        spark, pg_dsn, pg_conn, table_name, lake_root, monkeypatch):
    t = table_name
    table, everything = evicted_tiered_table(spark, pg_dsn, pg_conn, t, lake_root)

    pg_conn.execute(f"ALTER TABLE {t} ALTER COLUMN qty TYPE bigint")

    assert export(spark, pg_dsn, t, lake_root).status == "loaded"
    assert report(monkeypatch, pg_conn, pg_dsn, lake_root, t, f"w_{t}") == everything
    # the next change is checked against the widened type
    with pytest.raises(psycopg.errors.FeatureNotSupported, match="as LONG, and the lake cannot widen them to INT"):
        pg_conn.execute(f"ALTER TABLE {t} ALTER COLUMN qty TYPE integer")


# Text a key and a value hold as they are: quotes, a backslash, a newline, SQL, non-ASCII.
HOSTILE = ["o'brien \"q\"", "a\\b\nc; DROP TABLE x; --", "zürich ☃ 東京"]
PENDING_CASES = {
    "add_column_default": (
        "id bigint PRIMARY KEY, customer text, amount numeric(12,2), status text", ["id"],
        "ALTER TABLE {t} ADD COLUMN region text DEFAULT 'eu'", lambda row: {**row, "region": None}),
    "type_change_using": (
        "shop text, id int, customer text, amount numeric(12,2), status text, PRIMARY KEY (shop, id)", ["shop", "id"],
        "ALTER TABLE {t} ALTER COLUMN status TYPE text USING upper(status)", lambda row: row),
}


def keyed_tiered_table(conn, name: str, ddl: str, keys: list[str]) -> registry.RegisteredTable:
    """`tiered_table` with the case's key (a composite one holds hostile text in its first column)."""
    conn.execute(f"CREATE TABLE {name} ({ddl})")
    shop = "(ARRAY[%s, %s, %s])[g %% 3 + 1], " if keys != ["id"] else ""
    insert = f"INSERT INTO {name} SELECT {shop}g, %s || (g %% 13), g * 0.5, %s FROM generate_series(%s::int, %s::int) g"
    hostile = HOSTILE if shop else []
    conn.execute(insert, (*hostile, HOSTILE[2], "new", 1, 200))
    conn.execute("SELECT coldharbor.register_table(%s, p_hot_retention => interval '1 hour')", (name,))
    conn.execute(insert, (*hostile, "late " + HOSTILE[1], "paid", 201, 260))
    [table] = registry.load(conn, name)
    return table


def exported_until_clean(spark, dsn: str, name: str, lake_root: str) -> None:
    statuses = [export(spark, dsn, name, lake_root).status for _ in range(3)]
    assert statuses[-1] == "clean", statuses


def keyed_report(monkeypatch, conn, dsn: str, lake_root: str, select: str, keys: list[str], run_id: str) -> dict:
    assert serve_report(monkeypatch, dsn, lake_root, "--sql", select, "--target", f"adhoc_{run_id}",
                        "--run-id", run_id) == 0
    return pg_rows(conn, f"SELECT * FROM reports.adhoc_{run_id}", keys)


@pytest.mark.parametrize("case", sorted(PENDING_CASES))
def test_a_tiered_table_pending_a_rebase_keeps_its_evicted_rows_in_reports(
        spark, pg_dsn, pg_conn, table_name, lake_root, monkeypatch, case):
    """While DDL keeps a tiered table pending its new base, reports read PostgreSQL's rows plus the
    lake's rows of the keys PostgreSQL does not hold and no unexported change touched: the evicted
    rows, as the lake holds them. Before, the table was read from PostgreSQL alone and every evicted
    row was missing until the export wrote the base."""
    ddl, keys, change, evicted_after = PENDING_CASES[case]
    t = table_name
    table = keyed_tiered_table(pg_conn, t, ddl, keys)
    assert export(spark, pg_dsn, t, lake_root).status in ("loaded", "exported")
    pg_conn.execute(f"DELETE FROM {t} WHERE id = 3")  # its delete marker is exported
    exported_until_clean(spark, pg_dsn, t, lake_root)
    before = pg_rows(pg_conn, f"SELECT * FROM {t}", keys)
    assert evict_written_rows(pg_conn, table) == 60
    left = pg_rows(pg_conn, f"SELECT * FROM {t}", keys)
    evicted = {k: row for k, row in before.items() if k not in left}
    assert len(evicted) == 60 and all(row["id"] > 200 for row in evicted.values())
    back = next(k for k in sorted(evicted) if evicted[k]["id"] == 210)
    pg_conn.execute(f"INSERT INTO {t} SELECT * FROM (VALUES ({', '.join(['%s'] * len(before[back]))})) v",
                    tuple({**before[back], "customer": "back in the hot tier"}.values()))  # an evicted key again
    del evicted[back]
    pg_conn.execute(f"DELETE FROM {t} WHERE id = 4")  # not exported: must not come back from the lake
    pg_conn.execute(change.format(t=t))
    assert pg_conn.execute("SELECT load_state, rebase_reason IS NOT NULL FROM coldharbor.tables WHERE table_id = %s",
                           (table.table_id,)).fetchone() == ("pending", True)
    expected = pg_rows(pg_conn, f"SELECT * FROM {t}", keys)
    assert not set(expected) & set(evicted) and not any(row["id"] in (3, 4) for row in expected.values())
    expected.update({k: evicted_after(row) for k, row in evicted.items()})
    assert len(expected) == 258

    run = f"p_{t}"
    assert keyed_report(monkeypatch, pg_conn, pg_dsn, lake_root, f"SELECT * FROM {t}", keys, run) == expected
    record = report_run(pg_conn, run)
    assert not record["served_from_postgres"] and not record["degraded"]
    assert record["dirty_rows"] == {f"public.{t}": 199 + 1}  # every row PostgreSQL holds, and the deleted key
    assert keyed_report(monkeypatch, pg_conn, pg_dsn, lake_root, f"SELECT count(*) AS n FROM {t}", ["n"],
                        f"n_{t}") == {(258,): {"n": 258}}
    as_of = pg_conn.execute("SELECT now()").fetchone()[0]
    assert serve_report(monkeypatch, pg_dsn, lake_root, "--sql", f"SELECT * FROM {t}", "--target",
                        f"adhoc_a_{t}", "--run-id", f"a_{t}", "--as-of", as_of.isoformat()) == 2
    assert "it falls inside a rebase" in report_run(pg_conn, f"a_{t}")["error"]

    exported_until_clean(spark, pg_dsn, t, lake_root)  # the rebase's base and the changes
    assert pg_conn.execute("SELECT load_state, rebase_reason FROM coldharbor.tables WHERE table_id = %s",
                           (table.table_id,)).fetchone() == ("loaded", None)
    assert keyed_report(monkeypatch, pg_conn, pg_dsn, lake_root, f"SELECT * FROM {t}", keys, f"e_{t}") == expected
    assert not report_run(pg_conn, f"e_{t}")["served_from_postgres"]


def test_a_resync_after_the_hot_retention_was_removed_keeps_the_evicted_rows(
        spark, pg_dsn, pg_conn, table_name, lake_root, monkeypatch):
    """Registered again without a retention, the table evicts nothing more, but the rows it evicted
    still live in the lake alone: a base (here a resync's) must not mark them deleted."""
    t = table_name
    _, everything = evicted_tiered_table(spark, pg_dsn, pg_conn, t, lake_root)
    pg_conn.execute("SELECT coldharbor.register_table(%s)", (t,))
    assert pg_conn.execute("SELECT hot_retention FROM coldharbor.tables WHERE table_name = %s",
                           (t,)).fetchone()[0] is None
    monkeypatch.setenv("COLDHARBOR_PG_DSN", pg_dsn)
    assert resync.main(["--table", t, "--lake-root", lake_root]) == 0
    assert report(monkeypatch, pg_conn, pg_dsn, lake_root, t, f"u_{t}") == everything
    assert lake_live(spark, lake_root, t, ["id"]) == everything
    # verify takes them as evicted rows too, not as rows the lake has and PostgreSQL lacks
    assert verify.main(["--table", t, "--lake-root", lake_root]) == 0


INT_KEYED = "id integer PRIMARY KEY, customer text, amount numeric(12,2), status text"


@pytest.mark.parametrize("ddl", [
    "ALTER TABLE {t} ALTER COLUMN id TYPE bigint USING id + 1000",
    "ALTER TABLE {t} ALTER COLUMN id TYPE integer USING id + 1000",
    "ALTER TABLE {t} ALTER COLUMN id TYPE bigint USING id, ALTER COLUMN status TYPE text",
    "/* plain? */ ALTER TABLE {t} ALTER COLUMN id TYPE bigint",
], ids=["widening with using", "same type with using", "two subcommands", "a comment"])
def test_a_rewrite_of_the_key_of_a_tiered_table_with_evicted_rows_is_refused(
        spark, pg_dsn, pg_conn, table_name, lake_root, monkeypatch, ddl):
    """A base keeps the lake's keys PostgreSQL lacks as evicted rows: before sql/migrations/019 a USING rewrite
    of the key went through, and every old key stayed in reports beside its new one (460 rows for
    260, pending and after the base). Only what is known to keep every key is accepted."""
    t = table_name
    table = keyed_tiered_table(pg_conn, t, INT_KEYED, ["id"])
    in_the_lake(spark, pg_dsn, pg_conn, t, lake_root)
    everything = pg_rows(pg_conn, f"SELECT * FROM {t}", ["id"])
    assert evict_written_rows(pg_conn, table) == 60

    with pytest.raises(psycopg.errors.FeatureNotSupported) as refused:
        pg_conn.execute(ddl.format(t=t))
    message = str(refused.value)
    assert message.startswith(f"cannot rewrite key column id of public.{t} (integer to "), message
    assert "a base cannot tell them from keys the rewrite took away" in message
    assert rebase_serial(pg_conn, table) == 0
    assert pg_conn.execute(f"SELECT min(id) FROM {t}").fetchone()[0] == 1
    assert report(monkeypatch, pg_conn, pg_dsn, lake_root, t, f"k_{t}") == everything


def test_a_plain_widening_of_the_key_goes_through_after_evictions(
        spark, pg_dsn, pg_conn, table_name, lake_root, monkeypatch):
    t = table_name
    table = keyed_tiered_table(pg_conn, t, INT_KEYED, ["id"])
    in_the_lake(spark, pg_dsn, pg_conn, t, lake_root)
    everything = pg_rows(pg_conn, f"SELECT * FROM {t}", ["id"])
    assert evict_written_rows(pg_conn, table) == 60

    pg_conn.execute(f"alter table public.{t} alter id set data type BIGINT;")
    pg_conn.execute(f"UPDATE {t} SET id = id + 5000 WHERE id = 7")  # a key changed by DML is logged
    everything[(5007,)] = {**everything.pop((7,)), "id": 5007}

    result = export(spark, pg_dsn, t, lake_root)  # the rewrite's base (200 rows) and the update
    assert (result.status, result.loaded_rows) == ("exported", 200)
    assert report(monkeypatch, pg_conn, pg_dsn, lake_root, t, f"g_{t}") == everything
    assert len(everything) == 260
    # the next change is checked against the wider type: narrowing it back rewrites the keys
    with pytest.raises(psycopg.errors.FeatureNotSupported):
        pg_conn.execute(f"ALTER TABLE {t} ALTER COLUMN id TYPE integer")


@pytest.mark.parametrize("change, keeps", [
    (("bigint", -1, "bigint", -1), True), (("smallint", -1, "bigint", -1), True),
    (("integer", -1, "bigint", -1), True), (("bigint", -1, "integer", -1), False),
    (("character varying", 14, "character varying", 24), True), (("character varying", 24, "character varying", 14), False),
    (("character varying", 14, "text", -1), True), (("text", -1, "character varying", 14), False),
    (("character", 9, "text", -1), False), (("text", -1, "character", 9), False),
    (("character", 10, "character", 12), False), (("character", 10, "character", 10), True),
    (("character", 10, "character varying", -1), False),
    (("timestamp without time zone", 3, "timestamp without time zone", 6), True),
    (("timestamp without time zone", -1, "timestamp without time zone", 0), False),
    (("numeric", (12 << 16 | 2) + 4, "numeric", (14 << 16 | 2) + 4), True),
    (("numeric", (12 << 16 | 2) + 4, "numeric", (14 << 16 | 1) + 4), False),
    (("numeric", (12 << 16 | 2) + 4, "numeric", -1), True), (("integer", -1, "numeric", -1), False),
    (("date", -1, "timestamp without time zone", -1), False), (("text", -1, "uuid", -1), False),
])
def test_key_casts_that_keep_every_value(pg_conn, change, keeps):
    from_type, from_mod, to_type, to_mod = change
    assert pg_conn.execute("SELECT coldharbor.key_cast_keeps_values(%s::regtype, %s, %s::regtype, %s)",
                           (from_type, from_mod, to_type, to_mod)).fetchone()[0] is keeps


@pytest.mark.parametrize("sql, plain", [
    ("ALTER TABLE t ALTER COLUMN id TYPE bigint", True),
    ("  alter table if exists only s.\"T x\" alter \"I\"\"d\" set data type character varying(40) ;\n", True),
    ("ALTER TABLE t ALTER COLUMN at TYPE timestamp(3) with time zone", True),
    ("ALTER TABLE t ALTER COLUMN id TYPE public.\"my type\"", True),
    ("ALTER TABLE t ALTER COLUMN id TYPE bigint USING id", False),
    ("ALTER TABLE t ALTER COLUMN id TYPE bigint using(id)", False),
    ("ALTER TABLE t ALTER COLUMN id TYPE text COLLATE \"C\"", False),
    ("ALTER TABLE t ALTER COLUMN id TYPE bigint; UPDATE t SET id = id + 1", False),
    ("ALTER TABLE t ALTER COLUMN id TYPE bigint, ADD COLUMN x int", False),
    ("ALTER TABLE t ALTER COLUMN id TYPE bigint -- widen", False),
    ("ALTER TABLE t RENAME COLUMN id TO k", False),
    ("SELECT migrate()", False),
])
def test_a_plain_type_change_is_recognised_by_its_whole_text(pg_conn, sql, plain):
    assert pg_conn.execute("SELECT coldharbor.is_plain_type_change(%s)", (sql,)).fetchone()[0] is plain


def test_a_dropped_registration_owns_no_relation_when_its_oid_is_given_again(
        spark, pg_dsn, pg_conn, table_name, lake_root):
    """PostgreSQL may give a dropped table's oid to a new relation: before sql/migrations/019 DDL on that
    unrelated relation was checked against the dropped registration (refused, as here, when its
    rows had been evicted)."""
    t = table_name
    table, _ = evicted_tiered_table(spark, pg_dsn, pg_conn, t, lake_root)
    pg_conn.execute(f"DROP TABLE {t}")
    pg_conn.execute(f"CREATE TABLE other_{t} (id bigint PRIMARY KEY, customer text)")
    # the state after the oid came back: the dropped registration still names it (set past the
    # registration triggers, which take the relation from the name)
    pg_conn.execute("SET session_replication_role = replica")
    pg_conn.execute("UPDATE coldharbor.tables SET relid = %s::regclass WHERE table_id = %s",
                    (f"other_{t}", table.table_id))
    pg_conn.execute("RESET session_replication_role")
    assert pg_conn.execute("SELECT dropped_at IS NOT NULL FROM coldharbor.tables WHERE table_id = %s",
                           (table.table_id,)).fetchone()[0]

    pg_conn.execute(f"ALTER TABLE other_{t} RENAME COLUMN customer TO buyer")
    assert rebase_serial(pg_conn, table) == 0


def test_event_triggers_missing_after_a_migration_without_a_superuser_are_installed(pg_conn):
    pg_conn.execute("DROP EVENT TRIGGER coldharbor_rebase_ddl")
    pg_conn.execute("DROP EVENT TRIGGER coldharbor_evicted_keys_watch")
    try:
        assert pg_conn.execute("SELECT coldharbor.install_ddl_triggers()").fetchone()[0] == []
    finally:
        pg_conn.execute("SELECT coldharbor.install_ddl_triggers()")
    assert {r[0] for r in pg_conn.execute("SELECT evtname FROM pg_event_trigger WHERE evtname LIKE 'coldharbor%'")} == {
        "coldharbor_guard_capture_ddl", "coldharbor_guard_capture_drop", "coldharbor_grant_partition_capture",
        "coldharbor_rebase_ddl", "coldharbor_rebase_rewrite", "coldharbor_evicted_rows_guard",
        "coldharbor_evicted_keys_watch", "coldharbor_note_registered_drop", "coldharbor_guard_concurrent_detach"}


def test_a_rename_no_trigger_saw_is_reconciled(spark, pg_dsn, pg_conn, table_name, lake_root):
    """A rename made before sql/migrations/018 through ALTER TYPE ... RENAME ATTRIBUTE left `columns_seen` with
    the old name and asked for no base: reconcile_columns_seen (run by sql/migrations/019) asks for it."""
    t = table_name
    pg_conn.execute(f"CREATE TABLE {t} ({DDL})")
    pg_conn.execute(f"INSERT INTO {t} SELECT g, 'c' || g, g, 'new', g FROM generate_series(1, 50) g")
    pg_conn.execute("SELECT coldharbor.register_table(%s)", (t,))
    [table] = registry.load(pg_conn, t)
    in_the_lake(spark, pg_dsn, pg_conn, t, lake_root)
    pg_conn.execute("ALTER EVENT TRIGGER coldharbor_rebase_ddl DISABLE")
    try:
        pg_conn.execute(f"ALTER TYPE {t} RENAME ATTRIBUTE customer TO buyer")
    finally:
        pg_conn.execute("ALTER EVENT TRIGGER coldharbor_rebase_ddl ENABLE")
    assert rebase_serial(pg_conn, table) == 0

    assert pg_conn.execute("SELECT coldharbor.reconcile_columns_seen()").fetchone()[0] == 1
    assert pg_conn.execute("SELECT load_state, rebase_reason FROM coldharbor.tables WHERE table_id = %s",
                           (table.table_id,)).fetchone() == ("pending", "column customer was renamed to buyer")
    assert pg_conn.execute("SELECT coldharbor.reconcile_columns_seen()").fetchone()[0] == 0
    assert export(spark, pg_dsn, t, lake_root).status == "loaded"
    live = lake_live(spark, lake_root, t, ["id"])
    assert {k: r["buyer"] for k, r in live.items()} == {(g,): f"c{g}" for g in range(1, 51)}


def test_a_char_key_keeps_its_type_and_length_after_evictions(spark, pg_dsn, pg_conn, table_name, lake_root,
                                                              monkeypatch):
    """The lake holds a char(n) key padded to n: `TYPE text` (or varchar, or a longer char) made every
    hot key another one, 'k1' beside 'k1    ' (460 rows for 260), and went through."""
    t = table_name
    table = keyed_tiered_table(pg_conn, t, "id char(6) PRIMARY KEY, customer text, amount numeric(12,2), status text",
                               ["id"])
    in_the_lake(spark, pg_dsn, pg_conn, t, lake_root)
    everything = pg_rows(pg_conn, f"SELECT * FROM {t}", ["id"])
    assert evict_written_rows(pg_conn, table) == 60
    for to in ("text", "varchar(6)", "char(8)"):
        with pytest.raises(psycopg.errors.FeatureNotSupported, match="cannot rewrite key column id"):
            pg_conn.execute(f"ALTER TABLE {t} ALTER COLUMN id TYPE {to}")
    assert report(monkeypatch, pg_conn, pg_dsn, lake_root, t, f"c_{t}") == everything


def test_a_typed_table_s_key_is_not_rewritten_through_its_type(spark, pg_dsn, pg_conn, table_name, lake_root,
                                                               monkeypatch):
    """`ALTER TYPE ... ALTER ATTRIBUTE ... CASCADE` rewrites the tables of the type (CREATE TABLE ...
    OF) but reports the type alone: it reached neither trigger, and rounded every timestamp key."""
    t = table_name
    pg_conn.execute(f"CREATE TYPE {t}_row AS (ts timestamp(6), customer text, n integer)")
    pg_conn.execute(f"CREATE TABLE {t} OF {t}_row (PRIMARY KEY (ts))")
    key = "timestamp '2024-01-01' + g * interval '1 second' + interval '0.4 second'"
    pg_conn.execute(f"INSERT INTO {t} SELECT {key}, 'c' || g, g FROM generate_series(1, 200) g")
    pg_conn.execute("SELECT coldharbor.register_table(%s, p_hot_retention => interval '1 hour')", (t,))
    pg_conn.execute(f"INSERT INTO {t} SELECT {key}, 'late' || g, g FROM generate_series(201, 260) g")
    [table] = registry.load(pg_conn, t)
    exported_until_clean(spark, pg_dsn, t, lake_root)
    everything = pg_rows(pg_conn, f"SELECT * FROM {t}", ["ts"])
    assert lake_live(spark, lake_root, t, ["ts"]) == everything
    assert evict_written_rows(pg_conn, table) == 60

    with pytest.raises(psycopg.errors.FeatureNotSupported, match="cannot rewrite key column ts"):
        pg_conn.execute(f"ALTER TYPE {t}_row ALTER ATTRIBUTE ts TYPE timestamp(0) CASCADE")
    with pytest.raises(psycopg.errors.FeatureNotSupported, match="cannot rename column customer"):
        pg_conn.execute(f"ALTER TYPE {t}_row RENAME ATTRIBUTE customer TO buyer CASCADE")
    assert keyed_report(monkeypatch, pg_conn, pg_dsn, lake_root, f"SELECT * FROM {t}", ["ts"], f"t_{t}") == everything


def test_a_key_rewrite_waiting_for_an_eviction_s_lock_is_checked_against_it(
        spark, pg_dsn, pg_conn, admin_dsn, table_name, lake_root, monkeypatch):
    """The statement's picture of the tables was taken before it waited for its lock, when nothing
    was evicted yet: the eviction that committed meanwhile went unseen, and the USING rewrite went
    through (460 rows for 260)."""
    t = table_name
    table = keyed_tiered_table(pg_conn, t, INT_KEYED, ["id"])
    in_the_lake(spark, pg_dsn, pg_conn, t, lake_root)
    everything = pg_rows(pg_conn, f"SELECT * FROM {t}", ["id"])
    pg_conn.execute("""UPDATE coldharbor.change_log SET created_at = created_at - interval '2 hours',
                       flushed_at = flushed_at - interval '2 hours' WHERE table_id = %s""", (table.table_id,))
    outcome: dict = {}

    def alter() -> None:
        try:
            with psycopg.connect(admin_dsn, autocommit=True) as conn:
                conn.execute(f"ALTER TABLE {t} ALTER COLUMN id TYPE bigint USING id + 1000")
            outcome["done"] = True
        except psycopg.Error as exc:
            outcome["refused"] = exc

    with psycopg.connect(admin_dsn) as evictor:
        assert evictor.execute("SELECT coldharbor.evict(%s, now())", (table.table_id,)).fetchone()[0] == 60
        waiting = threading.Thread(target=alter)
        waiting.start()
        deadline = time.monotonic() + 30
        while not pg_conn.execute("SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                                  "AND query LIKE 'ALTER TABLE %%USING id + 1000')").fetchone()[0]:
            assert time.monotonic() < deadline and waiting.is_alive()
            time.sleep(0.05)
        evictor.commit()
    waiting.join(60)
    assert isinstance(outcome.get("refused"), psycopg.errors.FeatureNotSupported), outcome
    assert pg_conn.execute(f"SELECT min(id) FROM {t}").fetchone()[0] == 1
    assert report(monkeypatch, pg_conn, pg_dsn, lake_root, t, f"w_{t}") == everything

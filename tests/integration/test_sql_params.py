"""Report parameters bound into the checked SQL (coldharbor.sql_params) give what Spark's own
binding (`spark.sql(..., args=...)`) gives: the same values of the same types, for every declared
parameter type, with text no one chose: quotes, backslashes, escapes, markers and emoji."""

from __future__ import annotations

from datetime import date, datetime, timedelta, timezone
from decimal import Decimal

import pytest

from coldharbor import registry, sql_guard, sql_params
from coldharbor.errors import ReportError
from coldharbor.report_spec import ParamSpec

HOSTILE_TEXT = ["it's", "back\\slash", "\\'", "'; SELECT 1; --", "\\u0027", "line\nbreak\ttab\r", "${env:HOME}",
                ":other", "?", "🙂 日本", "", "\x00nul", "%_", "a' || 'b", "\\\\'"]
VALUES = [
    ("int", "7"), ("int", "-2147483648"), ("int", "2147483647"),
    ("bigint", "5"), ("bigint", "-9223372036854775808"), ("bigint", "9223372036854775807"),
    ("double", "1.5"), ("double", "-0.0"), ("double", "1e300"), ("double", "inf"), ("double", "-inf"),
    ("decimal(12,2)", "0"), ("decimal(12,2)", "-1234.5"), ("decimal(38,10)", "1234567890123456789012345678"),
    ("decimal", "0.05"), ("decimal", "1E+3"), ("decimal", "-0.000"),
    ("boolean", "yes"), ("boolean", "false"),
    ("date", "2026-02-28"), ("date", "9999-12-31"), ("date", "1970-01-01"),
    ("timestamp", "2026-03-29T01:30:00.000001+01:00"), ("timestamp", "1969-12-31T23:59:59.999999"),
    ("timestamp", "2026-01-01"),
    *[("string", text) for text in HOSTILE_TEXT],
]


# Spark 4.2 binds :name inside its parser, which Delta's parser wrapper does not pass on; its
# analysis-time binding (this legacy setting) is the reference the bound SQL is held to.
REFERENCE_BINDING = "spark.sql.legacy.parameterSubstitution.constantsOnly"


def bound_and_spark_bound(spark, sql: str, params: dict):
    mine = spark.sql(sql_params.bind(sql, params))
    spark.conf.set(REFERENCE_BINDING, "true")
    try:
        theirs = spark.sql(sql, args=params)
        theirs.schema  # analysed while the setting holds
    finally:
        spark.conf.unset(REFERENCE_BINDING)
    return mine, theirs


@pytest.mark.parametrize(("type_", "raw"), VALUES, ids=[f"{t}:{r!r}" for t, r in VALUES])
def test_a_bound_value_equals_what_spark_binds(spark, type_, raw):
    value = ParamSpec("p", type_).parse(raw)
    sql = "SELECT :p AS v, :p IS NULL AS missing, typeof(:p) AS kind"
    mine, theirs = bound_and_spark_bound(spark, sql, {"p": value})
    if raw.endswith("inf"):  # no literal spells infinity: a cast from text, which Spark counts as nullable
        assert mine.schema.simpleString() == theirs.schema.simpleString()
    else:
        assert mine.schema == theirs.schema
    assert mine.collect() == theirs.collect()
    if type_ == "string":
        assert mine.collect()[0]["v"] == raw


@pytest.mark.parametrize("raw", ["0001-01-01", "1582-10-10", "1582-10-15"])
def test_dates_before_the_gregorian_switch_bind_exactly(spark, raw):
    """Spark's own binding passes dates through java.sql.Date (the Julian calendar before 1582: it
    fails or moves them); a bound date is the proleptic Gregorian day Spark stores."""
    value = ParamSpec("p", "date").parse(raw)
    row = spark.sql(sql_params.bind("SELECT :p AS v, CAST(:p AS STRING) AS text", {"p": value})).collect()[0]
    assert (row["v"], row["text"]) == (value, raw)


def test_parameters_in_a_checked_report_bind_where_they_stand(spark, pg_conn, table_name):
    """Markers in WHERE, in expressions and bare in the select list (named after the parameter);
    the same marker twice; a marker inside a string literal is text, not a marker."""
    pg_conn.execute(f"CREATE TABLE {table_name} (id int PRIMARY KEY, note text, amount numeric(8,2))")
    pg_conn.execute(f"SELECT coldharbor.register_table('{table_name}')")
    tables = registry.load(pg_conn, table_name)
    checked = sql_guard.check_query(
        f"SELECT :who, note || :who AS tagged, ':who' AS text, amount * :rate AS scaled FROM {table_name} "
        "WHERE note <> :who OR amount > :rate", tables)
    sql = sql_params.bind(checked.sql, {"who": "o'neil\\", "rate": Decimal("1.50")})
    assert ":" not in sql.replace("':who'", "")
    spark.createDataFrame([(1, "x", Decimal("2.00"))], "id int, note string, amount decimal(8,2)") \
        .createOrReplaceTempView(sql_guard.view_name(tables[0]))
    row = spark.sql(sql).collect()[0]
    assert row.asDict() == {"who": "o'neil\\", "tagged": "xo'neil\\", "text": ":who", "scaled": Decimal("3.0000")}


def test_a_parameter_without_a_value_or_of_an_unknown_type_is_refused():
    with pytest.raises(ReportError, match=r"parameter :x, which has no value"):
        sql_params.bind("SELECT :x AS a", {})
    with pytest.raises(ReportError, match=r"parameter x: a value of type list cannot be bound"):
        sql_params.bind("SELECT :x AS a", {"x": [1]})
    with pytest.raises(ReportError, match=r"parameter x: the value is not valid text"):
        sql_params.bind("SELECT :x AS a", {"x": "\ud800"})
    with pytest.raises(ReportError, match=r"more than 38 digits"):
        sql_params.bind("SELECT :x AS a", {"x": Decimal("1" * 39)})
    for huge in ("1E+999999", "1.5E-40"):
        with pytest.raises(ReportError, match=r"more than 38 digits"):
            sql_params.bind("SELECT :x AS a", {"x": Decimal(huge)})


def test_every_literal_is_written_from_safe_characters_only():
    """Whatever the value, the SQL a value becomes holds no quote or backslash of its own: strings
    travel as hex, so the text after binding differs from the text before only by the literals."""
    for text in HOSTILE_TEXT:
        sql = sql_params.bind("SELECT :x AS a", {"x": text})
        assert sql == f"SELECT CAST(X'{text.encode().hex()}' AS STRING) AS `a`", sql
    moment = datetime(2026, 1, 1, tzinfo=timezone(timedelta(hours=2)))
    assert sql_params.bind("SELECT :t AS a", {"t": moment}) == \
        f"SELECT TIMESTAMP_MICROS({int(moment.timestamp()) * 1_000_000}) AS `a`"
    assert sql_params.bind("SELECT :d AS a", {"d": date(1969, 12, 31)}) == "SELECT DATE_FROM_UNIX_DATE(-1) AS `a`"
    assert sql_params.bind("SELECT :n AS a", {"n": Decimal("-12.50")}) == "SELECT -12.50BD AS `a`"

"""Report parameters bound into the checked SQL (coldharbor.serve.sql_params) give the values Spark's own
binding (`spark.sql(..., args=...)`) gives, in the type each was declared with, for every
parameter type, with text no one chose: quotes, backslashes, escapes, markers and emoji."""

from __future__ import annotations

import math
from datetime import date, datetime, timedelta, timezone
from decimal import Decimal

import pytest
from coldharbor.capture import registry
from coldharbor.runtime.errors import ReportError
from coldharbor.serve import sql_guard, sql_params
from coldharbor.serve.report_spec import ParamSpec, ParamValues

HOSTILE_TEXT = ["it's", "back\\slash", "\\'", "'; SELECT 1; --", "\\u0027", "line\nbreak\ttab\r", "${env:HOME}",
                ":other", "?", "🙂 日本", "", "\x01\x7fctl", "%_", "a' || 'b", "\\\\'"]
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
# analysis-time binding (this legacy setting) is the reference the bound values are held to.
REFERENCE_BINDING = "spark.sql.legacy.parameterSubstitution.constantsOnly"
# The type each declared type binds as (Spark's own binding types a value by its size instead).
SPARK_TYPES = {"int": "int", "bigint": "bigint", "double": "double", "boolean": "boolean", "date": "date",
               "timestamp": "timestamp", "string": "string", "decimal(12,2)": "decimal(12,2)",
               "decimal(38,10)": "decimal(38,10)"}


def values(type_: str, raw: str) -> ParamValues:
    return ParamValues({"p": ParamSpec("p", type_).parse(raw)}, {"p": type_})


def spark_bound(spark, sql: str, params: dict):
    spark.conf.set(REFERENCE_BINDING, "true")
    try:
        return spark.sql(sql, args=params).collect()
    finally:
        spark.conf.unset(REFERENCE_BINDING)


@pytest.mark.parametrize(("type_", "raw"), VALUES, ids=[f"{t}:{r!r}" for t, r in VALUES])
def test_a_bound_value_equals_what_spark_binds_in_the_declared_type(spark, type_, raw):
    params = values(type_, raw)
    sql = "SELECT :p AS v, :p IS NULL AS missing, typeof(:p) AS kind"
    mine = spark.sql(sql_params.bind(sql, params))
    [row] = mine.collect()
    [theirs] = spark_bound(spark, sql, dict(params))
    assert (row["v"], row["missing"]) == (theirs["v"], theirs["missing"])
    assert row["kind"] == SPARK_TYPES.get(type_, theirs["kind"])
    assert mine.schema["v"].nullable is raw.endswith("inf")  # no literal spells infinity: a cast from text
    if type_ == "string":
        assert row["v"] == raw


def test_the_declared_type_holds_whatever_the_value(spark):
    """Found by a cold attack: values typed by their size overflowed a bigint product, lost the sign
    of -0.0, and gave a decimal column a precision that changed with the value."""
    bigint = ParamValues({"b": 10}, {"b": "bigint"})
    assert spark.sql(sql_params.bind("SELECT :b * 1000000000 AS x", bigint)).collect()[0]["x"] == 10_000_000_000
    zero = ParamValues({"z": -0.0}, {"z": "double"})
    row = spark.sql(sql_params.bind("SELECT CAST(:z AS STRING) AS s, :z AS z", zero)).collect()[0]
    assert row["s"] == "-0.0" and math.copysign(1, row["z"]) < 0
    for raw in ("1", "1234567.89"):
        money = ParamValues({"f": ParamSpec("f", "decimal(12,2)").parse(raw)}, {"f": "decimal(12,2)"})
        assert spark.sql(sql_params.bind("SELECT :f AS f, CAST(3 AS DECIMAL(12, 2)) / :f AS q", money)) \
            .schema.simpleString() == "struct<f:decimal(12,2),q:decimal(27,15)>"


@pytest.mark.parametrize("raw", ["0001-01-01", "1582-10-10", "1582-10-15"])
def test_dates_before_the_gregorian_switch_bind_exactly(spark, raw):
    """Spark's own binding passes dates through java.sql.Date (the Julian calendar before 1582: it
    fails or moves them); a bound date is the proleptic Gregorian day Spark stores."""
    params = values("date", raw)
    row = spark.sql(sql_params.bind("SELECT :p AS v, CAST(:p AS STRING) AS text", params)).collect()[0]
    assert (row["v"], row["text"]) == (params["p"], raw)


def test_parameters_in_a_checked_report_bind_where_they_stand(spark, pg_conn, table_name):
    """Markers in WHERE and in expressions, the same marker twice; a marker inside a string
    literal is text, not a marker; an unnamed select-list item that uses one is refused."""
    pg_conn.execute(f"CREATE TABLE {table_name} (id int PRIMARY KEY, note text, amount numeric(8,2))")
    pg_conn.execute(f"SELECT coldharbor.register_table('{table_name}')")
    tables = registry.load(pg_conn, table_name)
    checked = sql_guard.check_query(
        f"SELECT :who AS who, note || :who AS tagged, ':who' AS text, amount * :rate AS scaled FROM {table_name} "
        "WHERE note <> :who OR amount > :rate", tables)
    sql = sql_params.bind(checked.sql, ParamValues({"who": "o'neil\\", "rate": Decimal("1.50")},
                                                   {"who": "string", "rate": "decimal(3,2)"}))
    assert ":" not in sql.replace("':who'", "")
    spark.createDataFrame([(1, "x", Decimal("2.00"))], "id int, note string, amount decimal(8,2)") \
        .createOrReplaceTempView(sql_guard.view_name(tables[0]))
    row = spark.sql(sql).collect()[0]
    assert row.asDict() == {"who": "o'neil\\", "tagged": "xo'neil\\", "text": ":who", "scaled": Decimal("3.0000")}
    for unnamed in (f"SELECT id, :s FROM {table_name}", f"SELECT id, upper(:s) FROM {table_name}",
                    f"SELECT x FROM (SELECT :s FROM {table_name}) q"):
        with pytest.raises(ReportError, match=r"name the column that uses parameter :s .*write it with AS"):
            sql_guard.check_query(unnamed, tables)


def test_a_parameter_without_a_value_or_of_an_unknown_type_is_refused():
    with pytest.raises(ReportError, match=r"parameter :x, which has no value"):
        sql_params.bind("SELECT :x AS a", ParamValues({}, {}))
    with pytest.raises(ReportError, match=r"parameter x: a value of type list cannot be bound as string"):
        sql_params.bind("SELECT :x AS a", ParamValues({"x": [1]}, {"x": "string"}))
    with pytest.raises(ReportError, match=r"parameter x: the value is not valid text"):
        sql_params.bind("SELECT :x AS a", ParamValues({"x": "\ud800"}, {"x": "string"}))
    for huge in ("1" * 39, "1E+999999", "1.5E-40"):
        with pytest.raises(ReportError, match=r"more than 38 digits"):
            sql_params.bind("SELECT :x AS a", ParamValues({"x": Decimal(huge)}, {"x": "decimal"}))


def test_every_literal_is_written_from_safe_characters_only():
    """Whatever the value, the SQL a value becomes holds no quote or backslash of its own: strings
    travel as hex, so the text after binding differs from the text before only by the literals."""
    for text in HOSTILE_TEXT:
        sql = sql_params.bind("SELECT :x AS a", ParamValues({"x": text}, {"x": "string"}))
        assert sql == f"SELECT CAST(X'{text.encode().hex()}' AS STRING) AS `a`", sql
    moment = datetime(2026, 1, 1, tzinfo=timezone(timedelta(hours=2)))
    assert sql_params.bind("SELECT :t AS a", ParamValues({"t": moment}, {"t": "timestamp"})) == \
        f"SELECT TIMESTAMP_MICROS({int(moment.timestamp()) * 1_000_000}) AS `a`"
    assert sql_params.bind("SELECT :d AS a", ParamValues({"d": date(1969, 12, 31)}, {"d": "date"})) == \
        "SELECT DATE_FROM_UNIX_DATE(-1) AS `a`"
    assert sql_params.bind("SELECT :n AS a", ParamValues({"n": Decimal("-12.50")}, {"n": "decimal(6,2)"})) == \
        "SELECT CAST(-12.50BD AS DECIMAL(6, 2)) AS `a`"
    assert sql_params.bind("SELECT :n AS a", ParamValues({"n": -0.0}, {"n": "double"})) == "SELECT -0.0D AS `a`"

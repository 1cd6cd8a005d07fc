"""The row digest verify compares is the same in PostgreSQL and in Spark, for every accepted type
(real PostgreSQL and Spark + Delta).

Verify digests PostgreSQL's rows in SQL and the lake's rows in Spark: one value spelled two ways
would be a difference that is not there, and a spelling two values share would hide one that is.
Every value here went through the initial load into the lake, so the Spark side digests what the
lake really holds, not what a test put in a DataFrame.
"""

from __future__ import annotations

import pytest
from coldharbor.capture import registry
from coldharbor.lake.unified import cold_live
from coldharbor.maintenance import row_digest, verify
from coldharbor.runtime import pg
from psycopg import sql

from tests.helpers import export, lake_table

# (column, type, values as SQL): row i holds the i-th value of every column, NULL past its last.
COLUMNS = [
    ("c_smallint", "smallint", ["-32768", "32767", "0"]),
    ("c_integer", "integer", ["-2147483648", "2147483647", "0"]),
    ("c_bigint", "bigint", ["-9223372036854775808", "9223372036854775807", "0"]),
    ("c_real", "real", ["'-0'", "'NaN'", "'Infinity'", "'-Infinity'", "'1.4e-45'", "'3.4028235e38'", "'0.1'", "'0'"]),
    ("c_double", "double precision", ["'-0'", "'NaN'", "'Infinity'", "'-Infinity'", "'4.9e-324'",
                                      "'1.7976931348623157e308'", "'0.1'", "'0'",
                                      "'Infinity'::float8 - 'Infinity'::float8", "1.0 / 3"]),
    ("c_numeric38", "numeric(38,0)", ["'99999999999999999999999999999999999999'",
                                      "'-99999999999999999999999999999999999999'", "0"]),
    ("c_numeric_tiny", "numeric(38,30)", ["'0.000000000000000000000000000001'",
                                          "'-12345678.123456789012345678901234567890'", "0"]),
    ("c_numeric_frac", "numeric(5,5)", ["0.00001", "-0.99999", "0"]),
    ("c_numeric", "numeric(12,2)", ["-0.01", "1234567890.12", "0", "5"]),
    ("c_boolean", "boolean", ["true", "false"]),
    # Together with c_text2 these rows spell alike when values are merely joined: ('a|b', 'c') and
    # ('a', 'b|c'); ('', NULL) and (NULL, ''); ('N', NULL) and (NULL, NULL).
    ("c_text", "text", ["'a|b'", "'a'", "''", "NULL", "'N'", "'1:x'", "'😀 ü 中文 é'",
                        "E'\\x01\\x02\\t\\n\\r\\x7f'", "$$'\"\\ ;--$$", "repeat('long ü|', 20000)"]),
    ("c_text2", "text", ["'c'", "'b|c'", "NULL", "''"]),
    ("c_varchar", "varchar(40)", ["'x'", "' padded  '", "''"]),
    ("c_char", "char(12)", ["'ab'", "''", "' lead'", "'exactly12chr'"]),
    ("c_date", "date", ["'0001-01-01'", "'9999-12-31'", "'1582-10-04'", "'1582-10-15'", "'1969-12-31'",
                        "'1970-01-01'", "'2000-02-29'"]),
    ("c_timestamp", "timestamp", ["'0001-01-01 00:00:00'", "'9999-12-31 23:59:59.999999'",
                                  "'1969-12-31 23:59:59.999999'", "'2000-01-01 00:00:00'", "'1582-10-04 12:00:00.5'"]),
    ("c_timestamptz", "timestamptz", ["'0001-01-01 00:00:00+00'", "'9999-12-31 23:59:59.999999+00'",
                                      "'1969-12-31 23:59:59.999999-03'", "'2000-01-01 00:00+14'"]),
    ("c_uuid", "uuid", ["'00000000-0000-0000-0000-000000000000'", "'ffffffff-ffff-ffff-ffff-ffffffffffff'",
                        "'A0EEBC99-9C0B-4EF8-BB6D-6BB9BD380A11'"]),
    ("c_bytea", "bytea", ["'\\x'", "'\\x00ff7c'", "decode(repeat('ab', 50000), 'hex')"]),
    ("c_json", "json", ["'{\"b\": 1,  \"a\": [1, 2.50]}'", "'\"x|y\"'", "'null'"]),
    ("c_jsonb", "jsonb", ["'{\"b\": 1,  \"a\": [1, 2.50]}'", "'{\"😀\": \"ü\\\\n\"}'", "'[]'"]),
]
ROWS = max(len(values) for _, _, values in COLUMNS) + 1  # the last row is NULL in every column


@pytest.fixture()
def hostile_table(spark, pg_dsn, pg_conn, table_name, lake_root) -> str:
    """A table of every accepted type holding hostile values, registered with them and loaded."""
    ddl = ", ".join(f"{name} {kind}" for name, kind, _ in COLUMNS)
    pg_conn.execute(f"CREATE TABLE {table_name} (k integer PRIMARY KEY, {ddl})")
    for i in range(ROWS):
        values = ", ".join(f"({values[i]})::{kind}" if i < len(values) else "NULL" for _, kind, values in COLUMNS)
        pg_conn.execute(f"INSERT INTO {table_name} VALUES ({i}, {values})")
    pg_conn.execute("SELECT coldharbor.register_table(%s)", (table_name,))
    assert export(spark, pg_dsn, table_name, lake_root).loaded_rows == ROWS
    return table_name


def lake_columns(conn, name: str):
    [table] = registry.load(conn, name)
    return table, registry.lake_columns(conn, table)


def test_postgres_and_spark_spell_and_digest_every_accepted_type_alike(spark, pg_conn, hostile_table, lake_root):
    table, columns = lake_columns(pg_conn, hostile_table)
    assert {c.lake_type for c in columns} >= {"SHORT", "INT", "LONG", "FLOAT", "DOUBLE", "BOOLEAN", "STRING", "DATE",
                                             "TIMESTAMP_NTZ", "TIMESTAMP", "BINARY", "DECIMAL(38,0)"}

    def value_of(c):
        return sql.SQL("t.{}").format(sql.Identifier(c.name))

    spelled_pg = pg_conn.execute(sql.SQL("SELECT k, {}, {} FROM {} t").format(
        sql.SQL(", ").join(row_digest.pg_spelling(c, value_of(c)) for c in columns),
        row_digest.pg_digest(columns, value_of), table.identifier)).fetchall()
    live = lake_table(spark, lake_root, hostile_table).transform(cold_live(columns))
    spelled_spark = live.select("k", *[row_digest.spark_spelling(c, live[c.name]) for c in columns],
                                row_digest.spark_digest(columns)).collect()

    by_key_pg = {row[0]: tuple(row[1:]) for row in spelled_pg}
    by_key_spark = {row[0]: tuple(row[1:]) for row in spelled_spark}
    assert len(by_key_pg) == ROWS and set(by_key_spark) == set(by_key_pg)
    for k, pg_row in by_key_pg.items():
        for column, mine, theirs in zip([*columns, "digest"], by_key_spark[k], pg_row):
            assert mine == theirs, f"row {k}, {column}: Spark {mine!r:.200} PostgreSQL {theirs!r:.200}"
    digests = [row[-1] for row in by_key_pg.values()]
    assert len(set(digests)) == ROWS  # rows that merely joined values would spell alike differ


def test_verify_compares_every_accepted_type_exactly(spark, pg_dsn, pg_conn, hostile_table, lake_root):
    """In sync whether a row is read from the lake or, dirty, from PostgreSQL; -0.0 written as 0.0
    behind capture's back is a difference."""
    def run_verify() -> verify.VerifyResult:
        with pg.connect(pg_dsn) as conn:
            [table] = registry.load(conn, hostile_table)
            return verify.verify_table(spark, conn, pg.JdbcTarget.from_dsn(pg_dsn), table,
                                       verify.VerifyConfig(hostile_table, lake_root, 3, "test-digest"))

    assert run_verify().in_sync
    pg_conn.execute(f"UPDATE {hostile_table} SET k = k WHERE k % 2 = 0")  # dirty: the view reads their hot images
    assert run_verify().in_sync
    export(spark, pg_dsn, hostile_table, lake_root)  # nothing dirty: the view reads every row from the lake
    with pg_conn.transaction():
        pg_conn.execute("SET LOCAL session_replication_role = replica")  # behind capture: the lake keeps -0.0
        pg_conn.execute(f"UPDATE {hostile_table} SET c_double = 0 WHERE k = 0")
    found = run_verify()
    assert [s["key"] for s in found.samples] == ["(k=0)"]
    assert "different values" in found.samples[0]["problem"]

"""verify and resync over keys at the edges of what the lake holds, for every key type (real
PostgreSQL and Spark + Delta): in sync says so, a row changed in the lake by hand is found (exit 1),
resync repairs it."""

from __future__ import annotations

import time

import pytest
from coldharbor.export import export_job as export_job
from coldharbor.maintenance import resync, verify
from delta.tables import DeltaTable
from pyspark.sql import functions as F

from tests.helpers import export

# key type, lowest and highest keys the lake holds, an ordinary key of the row number g
EDGE_KEYS = [
    ("timestamptz", "'0001-01-01 00:00:00+00'", "'9999-12-31 23:59:59.999999+00'",
     "timestamptz '2020-01-01 00:00:00+00' + g * interval '1 hour 1.5 second'"),
    ("timestamp", "'0001-01-01 00:00:00'", "'9999-12-31 23:59:59.999999'",
     "timestamp '2020-01-01' + g * interval '1 hour 1.5 second'"),
    ("date", "'0001-01-01'", "'9999-12-31'", "date '2020-01-01' + g"),
    ("smallint", "-32768", "32767", "g"),
    ("integer", "-2147483648", "2147483647", "g"),
    ("bigint", "-9223372036854775808", "9223372036854775807", "g"),
    ("numeric(38,0)", "-99999999999999999999999999999999999999", "99999999999999999999999999999999999999", "g"),
    ("text", "''", "E'\\U0010FFFF ''q'' \\n; DROP TABLE x; --'", "'k' || g"),
    ("uuid", "'00000000-0000-0000-0000-000000000000'", "'ffffffff-ffff-ffff-ffff-ffffffffffff'", "md5(g::text)::uuid"),
    ("bytea", "'\\x'", "'\\xffffffffffffffffffff'", "decode(md5(g::text), 'hex')"),
]


def edge_table(conn, name: str, key_type: str, low: str, high: str, ordinary: str) -> None:
    """A table holding its key type's lowest and highest keys and ordinary ones, then registered."""
    conn.execute(f"CREATE TABLE {name} (k {key_type} PRIMARY KEY, v text)")
    conn.execute(f"INSERT INTO {name} VALUES ({low}, 'lo'), ({high}, 'hi')")
    conn.execute(f"INSERT INTO {name} SELECT {ordinary}, 'row ' || g FROM generate_series(1, 40) g")
    conn.execute("SELECT coldharbor.register_table(%s)", (name,))


@pytest.mark.parametrize("key_type,low,high,ordinary", EDGE_KEYS, ids=[k[0].split("(")[0] for k in EDGE_KEYS])
def test_keys_at_the_edges_verify_in_sync_and_a_hand_edit_is_found(spark, pg_dsn, pg_conn, table_name, lake_root,
                                                                   monkeypatch, capsys, caplog,
                                                                   key_type, low, high, ordinary):
    edge_table(pg_conn, table_name, key_type, low, high, ordinary)
    export(spark, pg_dsn, table_name, lake_root)
    pg_conn.execute(f"UPDATE {table_name} SET v = 'dirty' WHERE v = 'row 7'")  # a dirty key beside them
    monkeypatch.setenv("COLDHARBOR_PG_DSN", pg_dsn)
    for chunks in ("1", "16"):
        assert verify.main(["--table", table_name, "--lake-root", lake_root, "--chunks", chunks]) == 0, caplog.text
        assert f"public.{table_name} in sync: 42 rows in {chunks} chunks" in capsys.readouterr().out

    DeltaTable.forPath(spark, f"{lake_root}/public/{table_name}").update("v IN ('lo', 'hi')", {"v": F.lit("edited")})
    assert verify.main(["--table", table_name, "--lake-root", lake_root, "--chunks", "5"]) == 1, caplog.text
    out = capsys.readouterr().out
    assert "NOT in sync" in out and out.count("has different values in the lake view and in PostgreSQL") == 2, out

    assert resync.main(["--table", table_name, "--lake-root", lake_root]) == 0, caplog.text
    assert verify.main(["--table", table_name, "--lake-root", lake_root]) == 0, caplog.text
    assert "Traceback" not in caplog.text


def test_timestamptz_keys_at_the_edges_verify_on_spark_connect(on_connect, pg_dsn, pg_conn, table_name, lake_root,
                                                               monkeypatch, capsys, caplog):
    """The jobs' usual engine: a Connect client turns a TIMESTAMP into Python through Arrow, not as
    the classic one does."""
    from coldharbor.runtime.spark import get_session

    edge_table(pg_conn, table_name, *EDGE_KEYS[0])
    monkeypatch.setenv("COLDHARBOR_PG_DSN", pg_dsn)
    common = ["--table", table_name, "--lake-root", lake_root]
    assert export_job.main(common) == 0, caplog.text
    assert verify.main(common) == 0, caplog.text
    assert f"public.{table_name} in sync: 42 rows" in capsys.readouterr().out

    path = f"{lake_root}/public/{table_name}"
    rows = get_session("coldharbor-test-edit").read.format("delta").load(path)
    rows = rows.withColumn("v", F.when(F.col("v").isin("lo", "hi"), F.lit("edited")).otherwise(F.col("v")))
    rows.write.format("delta").mode("overwrite").save(path)  # the same rows, two of them edited
    assert verify.main(common) == 1, caplog.text
    out = capsys.readouterr().out
    assert "NOT in sync" in out and out.count("has different values in the lake view and in PostgreSQL") == 2, out
    assert resync.main(common) == 0, caplog.text
    assert verify.main(common) == 0, caplog.text
    assert "Traceback" not in caplog.text


@pytest.fixture()
def python_in_tokyo(monkeypatch):
    """This Python process's local time zone east of UTC (the JVM and PostgreSQL sessions stay in UTC)."""
    monkeypatch.setenv("TZ", "Asia/Tokyo")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


def test_timestamptz_sample_keys_are_utc_whatever_the_python_zone(spark, pg_dsn, pg_conn, table_name, lake_root,
                                                                  monkeypatch, capsys, caplog, python_in_tokyo):
    """In local time, 9999-12-31 23:59:59.999999 UTC is in the year 10000, which Python has not."""
    edge_table(pg_conn, table_name, *EDGE_KEYS[0])
    export(spark, pg_dsn, table_name, lake_root)
    DeltaTable.forPath(spark, f"{lake_root}/public/{table_name}").update("v IN ('lo', 'hi')", {"v": F.lit("edited")})
    monkeypatch.setenv("COLDHARBOR_PG_DSN", pg_dsn)
    capsys.readouterr()
    assert verify.main(["--table", table_name, "--lake-root", lake_root, "--chunks", "3"]) == 1, caplog.text
    out = capsys.readouterr().out
    assert "chunk 0 (keys 0001-01-01 00:00:00+00:00 .. " in out, out
    assert "(k=9999-12-31 23:59:59.999999+00:00) has different values" in out, out
    assert "(k=0001-01-01 00:00:00+00:00) has different values" in out, out


def test_an_error_no_check_foresaw_is_one_line_and_exit_2_never_1(spark, pg_dsn, pg_conn, table_name, lake_root,
                                                                  monkeypatch, capsys, caplog):
    """verify's exit 1 means "differences found" alone. A lake whose key column was rewritten by hand
    as text that is no number fails the view's cast to the key's type: one line, exit 2."""
    edge_table(pg_conn, table_name, *EDGE_KEYS[5])  # bigint
    export(spark, pg_dsn, table_name, lake_root)
    path = f"{lake_root}/public/{table_name}"
    rows = spark.read.format("delta").load(path).withColumn("k", F.concat(F.lit("key "), F.col("k").cast("string")))
    rows.write.format("delta").mode("overwrite").option("overwriteSchema", "true").save(path)
    monkeypatch.setenv("COLDHARBOR_PG_DSN", pg_dsn)
    capsys.readouterr()

    assert verify.main(["--table", table_name, "--lake-root", lake_root]) == 2
    [line] = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert line.startswith("verify failed: an error no check foresaw (at coldharbor/") and "key " in line, line
    assert "\n" not in line and "Traceback" not in caplog.text + capsys.readouterr().err
    assert pg_conn.execute("SELECT state FROM coldharbor.maintenance_runs WHERE kind = 'verify' AND table_id = "
                           "(SELECT table_id FROM coldharbor.tables WHERE table_name = %s)",
                           (table_name,)).fetchall() == [("failed",)]


def test_a_lake_root_that_holds_no_lake_table_of_a_loaded_table_is_refused(
        spark, pg_dsn, pg_conn, table_name, lake_root, tmp_path, monkeypatch, caplog):
    """Before, while only the initial load had reached the lake, verify against a mistyped lake root
    read the table from PostgreSQL alone and compared it with PostgreSQL: "in sync: 42 rows"."""
    edge_table(pg_conn, table_name, *EDGE_KEYS[5])  # bigint
    assert export(spark, pg_dsn, table_name, lake_root).status == "loaded"
    monkeypatch.setenv("COLDHARBOR_PG_DSN", pg_dsn)
    elsewhere = str(tmp_path / "no lake here")

    assert verify.main(["--table", table_name, "--lake-root", elsewhere]) == 2
    [line] = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert line.startswith(f"verify failed: the lake table of public.{table_name} is missing at {elsewhere}/public/"
                           f"{table_name}, but batches of it landed there (the last at "), line
    assert verify.main(["--table", table_name, "--lake-root", lake_root]) == 0

    # an empty table's load writes no lake table: nothing is missing
    pg_conn.execute(f"CREATE TABLE empty_{table_name} (k bigint PRIMARY KEY, v text)")
    pg_conn.execute("SELECT coldharbor.register_table(%s)", (f"empty_{table_name}",))
    export(spark, pg_dsn, f"empty_{table_name}", lake_root)
    assert verify.main(["--table", f"empty_{table_name}", "--lake-root", lake_root]) == 0

"""verify's last write per key over many batches (real PostgreSQL and Spark + Delta).

Verify resolves last-write-wins without sorting the biggest batch: a row of it is its key's last
write unless another batch holds the key. These tests give it every mix -- keys inserted, updated
twice, deleted and inserted again across exports, a resync outranking the load -- and hand edits
that break what it relies on.
"""

from __future__ import annotations

from delta.tables import DeltaTable
from pyspark.sql import functions as F

from tests.helpers import export
from tests.integration.maintenance.test_verify_resync import run_resync, run_verify


def exported_many_times(spark, dsn, conn, name: str, lake_root: str) -> str:
    conn.execute(f"CREATE TABLE {name} (id integer PRIMARY KEY, v text, n double precision)")
    conn.execute(f"INSERT INTO {name} SELECT g, 'v' || g, g / 3.0 FROM generate_series(1, 2000) g")
    conn.execute("SELECT coldharbor.register_table(%s)", (name,))
    steps = [f"UPDATE {name} SET v = 'first' WHERE id % 7 = 0",
             f"INSERT INTO {name} SELECT g, 'new', -0.0 FROM generate_series(2001, 2100) g",
             f"DELETE FROM {name} WHERE id % 11 = 0",
             f"UPDATE {name} SET v = 'second' WHERE id % 7 = 0",
             f"INSERT INTO {name} SELECT g, 'back', 'NaN' FROM generate_series(11, 2000, 22) g",  # deleted, inserted again
             f"DELETE FROM {name} WHERE id > 2050"]
    for step in steps:
        conn.execute(step)
        export(spark, dsn, name, lake_root)
    conn.execute(f"UPDATE {name} SET v = 'dirty' WHERE id % 13 = 0")  # left dirty: read from PostgreSQL
    return f"{lake_root}/public/{name}"


def test_a_table_exported_many_times_and_resynced_is_in_sync(spark, pg_dsn, pg_conn, table_name, lake_root):
    exported_many_times(spark, pg_dsn, pg_conn, table_name, lake_root)
    assert run_verify(spark, pg_dsn, table_name, lake_root).in_sync
    run_resync(spark, pg_dsn, table_name, lake_root)  # a second base as big as the load, outranking it
    pg_conn.execute(f"DELETE FROM {table_name} WHERE id % 17 = 0")
    export(spark, pg_dsn, table_name, lake_root)
    assert run_verify(spark, pg_dsn, table_name, lake_root).in_sync


def test_a_later_batch_changed_by_hand_is_found(spark, pg_dsn, pg_conn, table_name, lake_root):
    path = exported_many_times(spark, pg_dsn, pg_conn, table_name, lake_root)
    DeltaTable.forPath(spark, path).update("id = 14 AND v = 'second'", {"v": F.lit("tampered")})
    found = run_verify(spark, pg_dsn, table_name, lake_root)
    assert [(s["key"], "different values" in s["problem"]) for s in found.samples] == [("(id=14)", True)]


def test_a_key_a_batch_holds_twice_is_named(spark, pg_dsn, pg_conn, table_name, lake_root):
    """Only a hand edit makes one batch hold a key twice; reports would read either copy."""
    path = exported_many_times(spark, pg_dsn, pg_conn, table_name, lake_root)
    lake_rows = spark.read.format("delta").load(path)
    lake_rows.filter("id = 5").write.format("delta").mode("append").save(path)
    found = run_verify(spark, pg_dsn, table_name, lake_root)
    assert not found.in_sync
    assert [s["key"] for s in found.samples] == ["(id=5)"] and "more than once" in found.samples[0]["problem"]

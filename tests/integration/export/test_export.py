"""CDC export against real PostgreSQL and real Spark + Delta: round trip, races, crashes, locking."""

from __future__ import annotations

import json
import threading
from datetime import datetime, timedelta, timezone

import psycopg
import pytest
from coldharbor.lake import commits, delta, writes
from coldharbor.runtime import pg
from delta.tables import DeltaTable
from pyspark.sql import functions as F

from tests.helpers import dirty_ids, export, lake_live, lake_table, pg_rows

ALL_TYPES = """id bigint PRIMARY KEY, a smallint, b integer, c real, d double precision, e numeric(38,10),
    f boolean, g text, h varchar(20), i char(3), j date, k timestamp, l timestamptz, m uuid, n bytea,
    o json, p jsonb"""
PG_AS_LAKE = "SELECT id, a, b, c, d, e, f, g, h, i, j, k, l, m::text AS m, n, o::text AS o, p::text AS p FROM {}"


def make_table(conn, name: str, ddl: str = "id bigint PRIMARY KEY, v text") -> None:
    conn.execute(f"CREATE TABLE {name} ({ddl})")
    conn.execute("SELECT coldharbor.register_table(%s)", (name,))


def test_round_trip_of_every_supported_type(spark, pg_dsn, pg_conn, table_name, lake_root):
    make_table(pg_conn, table_name, ALL_TYPES)
    pg_conn.execute(f"""INSERT INTO {table_name} VALUES
        (1, -32768, 2147483647, 1.5, 0.1, 1234567890123456789012345678.0123456789, true, 'héllo ☃', '',
         'ab', '2024-02-29', '2024-03-10 02:30:00.123456', '2024-03-10 02:30:00.654321+05:30',
         'A0EEBC99-9C0B-4EF8-BB6D-6BB9BD380A11', '\\x00ff10', '{{"b": 1,  "a": [1,2]}}', '{{"b": 1, "a": null}}'),
        (2, NULL, NULL, 'NaN', '-Infinity', NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL),
        (3, 0, 0, -0.0, 1e-300, -0.0000000001, false, E'line\\nbreak, "quoted"', 'x', ' ', '0001-01-01',
         '1970-01-01 00:00:00', '1900-01-01 00:00:00+00', '00000000-0000-0000-0000-000000000000', '', '[]', '{{}}')""")
    result = export(spark, pg_dsn, table_name, lake_root)
    assert (result.status, result.rows, result.changes) == ("exported", 3, 3)
    expected = pg_rows(pg_conn, PG_AS_LAKE.format(table_name), ["id"])
    actual = lake_live(spark, lake_root, table_name, ["id"])
    # NaN != NaN: compare it by its text.
    for rows in (expected, actual):
        rows[(2,)]["c"] = repr(rows[(2,)]["c"])
    assert actual == expected
    assert actual[(1,)]["m"] == "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"  # canonical uuid form
    assert dirty_ids(pg_conn, table_name) == []


def test_updates_deletes_and_reinserts_converge_across_batches(spark, pg_dsn, pg_conn, table_name, lake_root):
    make_table(pg_conn, table_name)
    pg_conn.execute(f"INSERT INTO {table_name} SELECT g, 'v1' FROM generate_series(1, 100) g")
    export(spark, pg_dsn, table_name, lake_root)
    pg_conn.execute(f"UPDATE {table_name} SET v = 'v2' WHERE id <= 30")
    pg_conn.execute(f"DELETE FROM {table_name} WHERE id BETWEEN 20 AND 40")
    pg_conn.execute(f"INSERT INTO {table_name} VALUES (25, 'reborn'), (500, 'new')")
    pg_conn.execute(f"UPDATE {table_name} SET id = 1000 WHERE id = 50")
    second = export(spark, pg_dsn, table_name, lake_root)
    assert second.status == "exported" and second.batch_id == 2
    expected = pg_rows(pg_conn, f"SELECT id, v FROM {table_name}", ["id"])
    assert lake_live(spark, lake_root, table_name, ["id"]) == expected
    assert len(expected) == 100 - 21 + 2
    versions = pg_conn.execute("""SELECT DISTINCT lake_version FROM coldharbor.change_log c
                                  JOIN coldharbor.tables t USING (table_id) WHERE t.table_name = %s""",
                               (table_name,)).fetchall()
    assert sorted(v[0] for v in versions) == [0, 1]


def test_export_with_nothing_dirty_does_nothing(spark, pg_dsn, pg_conn, table_name, lake_root):
    make_table(pg_conn, table_name)
    pg_conn.execute(f"INSERT INTO {table_name} VALUES (1, 'a')")
    export(spark, pg_dsn, table_name, lake_root)
    again = export(spark, pg_dsn, table_name, lake_root)
    assert again.status == "clean"
    assert DeltaTable.forPath(spark, f"{lake_root}/public/{table_name}").history().count() == 1


def test_partitioned_table_lands_in_key_partitions(spark, pg_dsn, pg_conn, table_name, lake_root):
    pg_conn.execute(f"CREATE TABLE {table_name} (region text, id int, v text, PRIMARY KEY (region, id))")
    pg_conn.execute("SELECT coldharbor.register_table(%s, p_partition_by => '{region}')", (table_name,))
    pg_conn.execute(f"INSERT INTO {table_name} VALUES ('eu', 1, 'a'), ('us', 1, 'b'), ('eu', 2, 'c')")
    export(spark, pg_dsn, table_name, lake_root)
    pg_conn.execute(f"DELETE FROM {table_name} WHERE region = 'us'")
    export(spark, pg_dsn, table_name, lake_root)
    detail = DeltaTable.forPath(spark, f"{lake_root}/public/{table_name}").detail().first()
    assert detail["partitionColumns"] == ["region"]
    assert lake_live(spark, lake_root, table_name, ["region", "id"]) == pg_rows(
        pg_conn, f"SELECT region, id, v FROM {table_name}", ["region", "id"])


def test_a_created_lake_table_keeps_statistics_of_keys_sort_columns_and_metadata_only(
        spark, pg_dsn, pg_conn, table_name, lake_root):
    pg_conn.execute(f"CREATE TABLE {table_name} (region text, id int, label text, note text, "
                    "PRIMARY KEY (region, id))")
    pg_conn.execute("SELECT coldharbor.register_table(%s, p_partition_by => '{region}', "
                    "p_sort_by => '{label}')", (table_name,))
    pg_conn.execute(f"INSERT INTO {table_name} VALUES ('eu', 1, 'x', 'n1'), ('eu', 2, 'y', 'n2')")
    export(spark, pg_dsn, table_name, lake_root)
    pg_conn.execute(f"UPDATE {table_name} SET note = 'n3' WHERE id = 2")
    export(spark, pg_dsn, table_name, lake_root)
    path = f"{lake_root}/public/{table_name}"
    properties = DeltaTable.forPath(spark, path).detail().first()["properties"]
    assert properties["delta.dataSkippingStatsColumns"] == \
        "`id`,`label`,`_ch_seq`,`_ch_changed_at`,`_ch_batch_id`,`_ch_settled`"
    snapshot = delta.snapshot(spark, path)
    assert sorted(f.max_batch_id for f in snapshot.files) == [1, 2], "compaction still sees each file's batch"
    for entry in spark.read.json(f"{path}/_delta_log/*.json").where("add IS NOT NULL").select("add.stats").collect():
        stats = json.loads(entry["stats"])
        assert set(stats["minValues"]) == {"id", "label", "_ch_seq", "_ch_changed_at", "_ch_batch_id"}
        # an export's rows are unsettled: all NULL, which the current read skips files by
        assert set(stats["nullCount"]) == {"id", "label", "_ch_seq", "_ch_changed_at", "_ch_batch_id", "_ch_settled"}
        assert stats["nullCount"]["_ch_settled"] == stats["numRecords"]


def test_an_update_committed_between_read_and_mark_stays_dirty(spark, pg_dsn, admin_dsn, pg_conn, table_name, lake_root):
    """The mark race (invariant 1): marking by key would lose this update."""
    make_table(pg_conn, table_name)
    pg_conn.execute(f"INSERT INTO {table_name} VALUES (1, 'before'), (2, 'other')")

    def update_after_read(point: str) -> None:
        if point == "after_read":
            with psycopg.connect(admin_dsn, autocommit=True) as writer:
                writer.execute(f"UPDATE {table_name} SET v = 'racing' WHERE id = 1")

    first = export(spark, pg_dsn, table_name, lake_root, hook=update_after_read)
    assert first.changes == 2
    assert lake_live(spark, lake_root, table_name, ["id"])[(1,)]["v"] == "before"
    assert len(dirty_ids(pg_conn, table_name)) == 1, "the racing update must stay dirty"
    export(spark, pg_dsn, table_name, lake_root)
    assert lake_live(spark, lake_root, table_name, ["id"])[(1,)]["v"] == "racing"
    assert dirty_ids(pg_conn, table_name) == []


def test_a_transaction_holding_a_lower_id_open_is_not_lost(spark, pg_dsn, admin_dsn, pg_conn, table_name, lake_root):
    """Invariant 2: ids are taken at insert, not commit; no high-water mark may skip id N."""
    make_table(pg_conn, table_name)
    pg_conn.execute(f"INSERT INTO {table_name} VALUES (1, 'a'), (2, 'b')")
    export(spark, pg_dsn, table_name, lake_root)
    slow = psycopg.connect(admin_dsn)  # not autocommit: holds its transaction open
    try:
        slow.execute(f"UPDATE {table_name} SET v = 'slow' WHERE id = 1")
        pg_conn.execute(f"UPDATE {table_name} SET v = 'fast' WHERE id = 2")
        newest_id = pg_conn.execute("SELECT max(id) FROM coldharbor.change_log").fetchone()[0]
        export(spark, pg_dsn, table_name, lake_root)
        assert lake_live(spark, lake_root, table_name, ["id"])[(2,)]["v"] == "fast"
        slow.commit()
    finally:
        slow.close()
    [slow_id] = dirty_ids(pg_conn, table_name)
    assert slow_id < newest_id, "the open transaction took the lower id"
    export(spark, pg_dsn, table_name, lake_root)
    assert lake_live(spark, lake_root, table_name, ["id"]) == pg_rows(pg_conn, f"SELECT id, v FROM {table_name}", ["id"])


def test_many_writers_during_exports_converge(spark, pg_dsn, admin_dsn, pg_conn, table_name, lake_root):
    make_table(pg_conn, table_name)
    stop = threading.Event()

    def writer(offset: int) -> None:
        with psycopg.connect(admin_dsn, autocommit=True) as conn:
            n = 0
            while not stop.is_set() and n < 400:
                key = offset + n % 40
                conn.execute(f"INSERT INTO {table_name} VALUES (%s, %s) ON CONFLICT (id) DO UPDATE SET v = EXCLUDED.v",
                             (key, f"w{offset}-{n}"))
                if n % 7 == 0:
                    conn.execute(f"DELETE FROM {table_name} WHERE id = %s", (offset + (n * 3) % 40,))
                n += 1

    threads = [threading.Thread(target=writer, args=(o,)) for o in (0, 20)]  # overlapping keys 20..39
    for t in threads:
        t.start()
    for _ in range(2):
        export(spark, pg_dsn, table_name, lake_root)
    stop.set()
    for t in threads:
        t.join()
    export(spark, pg_dsn, table_name, lake_root)
    assert dirty_ids(pg_conn, table_name) == []
    assert lake_live(spark, lake_root, table_name, ["id"]) == pg_rows(pg_conn, f"SELECT id, v FROM {table_name}", ["id"])


def test_a_replayed_batch_is_a_delta_no_op(spark, pg_dsn, pg_conn, table_name, lake_root):

    make_table(pg_conn, table_name)
    pg_conn.execute(f"INSERT INTO {table_name} VALUES (1, 'a')")
    first = export(spark, pg_dsn, table_name, lake_root)
    path = f"{lake_root}/public/{table_name}"
    rows = lake_table(spark, lake_root, table_name)
    [table_id] = pg_conn.execute("SELECT table_id FROM coldharbor.tables WHERE table_name = %s", (table_name,)).fetchone()
    writes.append_batch(rows, path, app_id=commits.export_app_id(table_id), batch_id=first.batch_id, partition_by=(),
                      metadata={"replay": True})
    assert DeltaTable.forPath(spark, path).history().count() == 1
    assert lake_table(spark, lake_root, table_name).count() == 1


def test_an_unsupported_column_added_later_fails_before_anything_is_written(spark, pg_dsn, pg_conn, table_name, lake_root):
    from coldharbor.runtime.errors import ConfigError

    make_table(pg_conn, table_name)
    pg_conn.execute(f"INSERT INTO {table_name} VALUES (1, 'a')")
    pg_conn.execute(f"ALTER TABLE {table_name} ADD COLUMN addr inet")
    with pytest.raises(ConfigError, match=f"column addr of table {table_name} has type inet"):
        export(spark, pg_dsn, table_name, lake_root)
    assert len(dirty_ids(pg_conn, table_name)) == 1
    assert not DeltaTable.isDeltaTable(spark, f"{lake_root}/public/{table_name}")
    assert pg_conn.execute("SELECT count(*) FROM coldharbor.export_batches b JOIN coldharbor.tables t "
                           "USING (table_id) WHERE t.table_name = %s", (table_name,)).fetchone()[0] == 0


def test_an_unwritable_lake_changes_nothing(spark, pg_dsn, pg_conn, table_name, tmp_path):
    from coldharbor.runtime.errors import LakeUnavailableError

    make_table(pg_conn, table_name)
    pg_conn.execute(f"INSERT INTO {table_name} VALUES (1, 'a')")
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("a file where the lake folder should be")
    with pytest.raises(LakeUnavailableError, match="cannot write the lake at"):
        export(spark, pg_dsn, table_name, str(blocker))
    assert len(dirty_ids(pg_conn, table_name)) == 1


def test_lock_held_elsewhere_means_skip(spark, pg_dsn, pg_conn, table_name, lake_root):
    make_table(pg_conn, table_name)
    pg_conn.execute(f"INSERT INTO {table_name} VALUES (1, 'a')")
    [table_id] = pg_conn.execute("SELECT table_id FROM coldharbor.tables WHERE table_name = %s", (table_name,)).fetchone()
    with pg.connect(pg_dsn) as other, pg.advisory_lock(other, "export", table_id) as held:
        assert held
        assert export(spark, pg_dsn, table_name, lake_root).status == "skipped"
    assert len(dirty_ids(pg_conn, table_name)) == 1
    assert export(spark, pg_dsn, table_name, lake_root).status == "exported"


def test_commit_waits_for_the_lake_commit_lock_where_the_store_needs_it(spark, pg_dsn, pg_conn, table_name,
                                                                        lake_root, monkeypatch):
    """On S3 two jobs must not commit to one table at once: the export reads and writes its files,
    then waits for the lake commit lock before its Delta commit (forced on here for local disk)."""
    monkeypatch.setenv("COLDHARBOR_LAKE_COMMIT_LOCK", "on")
    make_table(pg_conn, table_name)
    pg_conn.execute(f"INSERT INTO {table_name} VALUES (1, 'a')")
    [table_id] = pg_conn.execute("SELECT table_id FROM coldharbor.tables WHERE table_name = %s", (table_name,)).fetchone()
    results = []
    with pg.connect(pg_dsn) as other:
        other.execute("SELECT pg_advisory_lock(%s, %s)", (pg.LOCK_NAMESPACES["lake_commit"], table_id))
        runner = threading.Thread(target=lambda: results.append(export(spark, pg_dsn, table_name, lake_root)))
        runner.start()
        waiting = 0
        for _ in range(600):
            waiting = pg_conn.execute("""SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'
                                         AND NOT granted AND classid = %s AND objid = %s""",
                                      (pg.LOCK_NAMESPACES["lake_commit"], table_id)).fetchone()[0]
            if waiting or not runner.is_alive():
                break
            runner.join(0.1)
        assert waiting == 1, "the export did not wait for the lake commit lock"
        assert not DeltaTable.isDeltaTable(spark, f"{lake_root}/public/{table_name}")
        assert len(dirty_ids(pg_conn, table_name)) == 1
        other.execute("SELECT pg_advisory_unlock(%s, %s)", (pg.LOCK_NAMESPACES["lake_commit"], table_id))
    runner.join(120)
    assert [r.status for r in results] == ["exported"]
    assert dirty_ids(pg_conn, table_name) == []


def test_change_and_export_times_are_recorded_in_utc_whatever_the_local_zone(spark, pg_dsn, pg_conn, table_name,
                                                                             lake_root, monkeypatch):
    """The export runs with the Python process in New York (PySpark converts naive and returned
    timestamps in its zone); every time it records must still be the instant, checked against
    this process's own clock read around the change and around the export (not against another
    value PostgreSQL computes the same way): a time recorded in local time is 5 hours off."""
    import time

    make_table(pg_conn, table_name)
    slack = timedelta(milliseconds=1)  # PostgreSQL and Python read one clock, each to the microsecond
    before_change = datetime.now(timezone.utc)
    pg_conn.execute(f"INSERT INTO {table_name} VALUES (1, 'a')")
    after_change = datetime.now(timezone.utc)
    monkeypatch.setenv("TZ", "America/New_York")
    time.tzset()
    try:
        before_export = datetime.now(timezone.utc)
        export(spark, pg_dsn, table_name, lake_root)
        after_export = datetime.now(timezone.utc)
    finally:
        monkeypatch.setenv("TZ", "UTC")
        time.tzset()
    oldest = pg_conn.execute("""SELECT b.oldest_change_at FROM coldharbor.export_batches b
                                JOIN coldharbor.tables t USING (table_id) WHERE t.table_name = %s""",
                             (table_name,)).fetchone()[0]
    assert before_change - slack <= oldest <= after_change + slack
    # Epoch seconds from Spark: no zone conversion on the way back into this test.
    row = lake_table(spark, lake_root, table_name).select(
        F.col("_ch_changed_at").cast("double"), F.col("_ch_first_changed_at").cast("double"),
        F.col("_ch_exported_at").cast("double")).first()
    changed, first_changed, exported = (datetime.fromtimestamp(v, timezone.utc) for v in row)
    assert before_change - slack <= first_changed <= changed <= after_change + slack
    assert before_export - slack <= exported <= after_export + slack


def test_a_batch_commit_is_found_behind_newer_commits(spark, lake_root):
    """The lookup reads the newest commits first, then further back."""
    path = f"{lake_root}/history"
    for batch_id in range(1, 10):
        writes.append_batch(spark.range(1).selectExpr(f"{batch_id} AS id"), path, app_id="app", batch_id=batch_id,
                          partition_by=[], metadata={"app_id": "app", "batch_id": batch_id})
    assert [commits.find_batch_commit(spark, path, "app", b) for b in (9, 5, 2, 1)] == [8, 4, 1, 0]
    assert commits.find_batch_commit(spark, path, "app", 10) is None
    assert commits.find_batch_commit(spark, path, "other", 1) is None


def test_marking_a_batch_never_plans_a_nested_loop_on_statistics_without_dirty_rows(pg_conn, table_name):
    """Found measuring a 1M-row export (and by the cold attack, as an export hung in its mark with
    the table's lock held): with statistics taken while the table had nothing dirty, PostgreSQL
    planned the mark as a nested loop over the batch's change ids per dirty row, quadratic (a
    300,000-row mark ran for more than 5 minutes)."""
    from coldharbor.capture import registry
    from coldharbor.export import batches

    pg_conn.execute(f"CREATE TABLE {table_name} (id bigint PRIMARY KEY, v int)")
    pg_conn.execute(f"INSERT INTO {table_name} SELECT g, 0 FROM generate_series(1, 5000) g")
    pg_conn.execute("SELECT coldharbor.register_table(%s)", (table_name,))
    pg_conn.execute("UPDATE coldharbor.tables SET load_state = 'loaded' WHERE table_name = %s", (table_name,))
    [table] = registry.load(pg_conn, table_name)
    pg_conn.execute(f"UPDATE {table_name} SET v = 1")
    with pg_conn.transaction():
        first = batches.begin(pg_conn, table, "test", 5000)
    assert batches.mark_flushed(pg_conn, table.table_id, first.batch_id, 1, lambda point: None) == 5000
    pg_conn.execute("ANALYZE coldharbor.change_log")  # nothing of the table is dirty now
    pg_conn.execute(f"UPDATE {table_name} SET v = 2")
    with pg_conn.transaction():
        batch = batches.begin(pg_conn, table, "test", 5000)
        pg_conn.execute(batches.MARK_PLANNING)
        plan = "\n".join(r[0] for r in pg_conn.execute(
            "EXPLAIN " + batches.MARK, {"version": 2, "table": table.table_id, "batch": batch.batch_id}))
    assert "Nested Loop" not in plan, plan
    assert batches.mark_flushed(pg_conn, table.table_id, batch.batch_id, 2, lambda point: None) == 5000
    assert pg_conn.execute("SELECT count(*) FROM coldharbor.change_log WHERE table_id = %s AND flushed_at IS NULL",
                           (table.table_id,)).fetchone()[0] == 0

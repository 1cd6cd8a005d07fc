"""The initial load as production runs it (spark-submit): killed at every point, run twice at once, bad input."""

from __future__ import annotations

import time

import psycopg
import pytest
from coldharbor.capture import registry
from coldharbor.export import base_state

from tests.helpers import (
    export,
    lake_live,
    lake_table,
    pg_rows,
    spark_submit,
    spark_submit_export,
    wait_until_locks_released,
)

ROWS = 4000


def filled_table(conn, name: str) -> None:
    conn.execute(f"CREATE TABLE {name} (id bigint PRIMARY KEY, v text, n integer)")
    conn.execute(f"INSERT INTO {name} SELECT g, 'v' || g, g % 5 FROM generate_series(1, {ROWS}) g")
    conn.execute("SELECT coldharbor.register_table(%s)", (name,))


def batches(conn, name: str) -> list[tuple[int, str, str]]:
    return conn.execute("""SELECT b.batch_id, b.kind, b.state FROM coldharbor.export_batches b
                           JOIN coldharbor.tables t USING (table_id) WHERE t.table_name = %s
                           ORDER BY b.batch_id""", (name,)).fetchall()


def load_pending(conn, name: str) -> bool:
    [table] = registry.load(conn, name)
    return base_state.load_state(conn, table.table_id).pending


@pytest.mark.parametrize("point", ["load_after_intent", "load_after_snapshot", "load_during_write",
                                   "load_after_commit"])
def test_a_load_killed_at_any_point_is_finished_by_the_next_run_with_no_row_lost_or_doubled(
        spark, pg_dsn, pg_conn, table_name, lake_root, point):
    filled_table(pg_conn, table_name)
    pg_conn.execute(f"UPDATE {table_name} SET v = 'changed before the load' WHERE id % 97 = 0")
    crashed = spark_submit_export(pg_dsn, lake_root, "--table", table_name, env={"COLDHARBOR_CRASH_AT": point})
    assert crashed.returncode != 0, crashed.stdout
    if point == "load_during_write":  # a Spark task kills the JVM, spark-submit itself (as the harness checks)
        assert crashed.returncode == -9, crashed.stdout[-3000:]
    else:
        assert f"killing the process at {point}" in crashed.stdout
    assert load_pending(pg_conn, table_name), "the crash left the load unrecorded"
    wait_until_locks_released(pg_conn)

    pg_conn.execute(f"UPDATE {table_name} SET v = 'changed after the crash' WHERE id % 89 = 0")
    pg_conn.execute(f"DELETE FROM {table_name} WHERE id % 83 = 0")
    result = export(spark, pg_dsn, table_name, lake_root)

    assert not load_pending(pg_conn, table_name)
    kinds = batches(pg_conn, table_name)
    loads = [b for b in kinds if b[1] == "load"]
    if point == "load_after_commit":  # committed before the kill: recovered, not written again
        assert result.recovered_batches == 1 and loads == [(1, "load", "flushed")]
    else:
        assert loads[-1][2] == "flushed" and all(state == "abandoned" for _, _, state in loads[:-1])
    # A committed load holds the rows before the deletes; a redone one reads them after.
    expected_base = ROWS if point == "load_after_commit" else ROWS - ROWS // 83
    base = lake_table(spark, lake_root, table_name).filter("_ch_seq = 0")
    assert base.count() == base.select("id").distinct().count() == expected_base, "one base, no double"
    assert lake_live(spark, lake_root, table_name, ["id"]) == pg_rows(pg_conn, f"SELECT * FROM {table_name}", ["id"])


def test_a_second_run_during_a_load_skips(spark, pg_dsn, admin_dsn, pg_conn, table_name, lake_root, tmp_path):
    filled_table(pg_conn, table_name)
    first_log = tmp_path / "first.log"
    first = spark_submit_export(pg_dsn, lake_root, "--table", table_name, log_file=first_log,
                                env={"COLDHARBOR_PAUSE_AT": "load_after_snapshot",
                                     "COLDHARBOR_PAUSE_DIR": str(tmp_path)})
    try:
        deadline = time.monotonic() + 300
        while not (tmp_path / "load_after_snapshot.reached").exists():
            assert first.poll() is None, first_log.read_text()
            assert time.monotonic() < deadline, "the first run never reached its snapshot"
            time.sleep(0.2)
        # The application writes freely while the load's snapshot is open.
        with psycopg.connect(admin_dsn, autocommit=True) as app:
            app.execute("SET lock_timeout = '2s'")
            app.execute(f"UPDATE {table_name} SET v = 'during the load' WHERE id <= 10")
        second = spark_submit_export(pg_dsn, lake_root, "--table", table_name)
        assert second.returncode == 0, second.stdout
        assert f"skipped public.{table_name}: another export of this table holds its lock" in second.stdout
    finally:
        (tmp_path / "load_after_snapshot.resume").write_text("go")
        first.wait(timeout=300)
    assert first.returncode == 0, first_log.read_text()
    assert [b for b in batches(pg_conn, table_name) if b[1] == "load"] == [(1, "load", "flushed")]
    assert lake_live(spark, lake_root, table_name, ["id"]) == pg_rows(pg_conn, f"SELECT * FROM {table_name}", ["id"])


def test_a_load_into_an_unwritable_lake_fails_clearly_and_the_next_run_retries(spark, pg_dsn, pg_conn, table_name,
                                                                              tmp_path):
    filled_table(pg_conn, table_name)
    blocked = tmp_path / "not-a-folder"
    blocked.write_text("a file where the lake should be")
    failed = spark_submit_export(pg_dsn, str(blocked), "--table", table_name)
    assert failed.returncode == 2, failed.stdout
    assert "cdc_export failed: cannot write the lake at" in failed.stdout and "Traceback" not in failed.stdout
    assert load_pending(pg_conn, table_name)
    lake_root = str(tmp_path / "lake")
    export(spark, pg_dsn, table_name, lake_root)
    assert not load_pending(pg_conn, table_name)
    assert lake_live(spark, lake_root, table_name, ["id"]) == pg_rows(pg_conn, f"SELECT * FROM {table_name}", ["id"])


def test_a_load_whose_postgres_connection_drops_fails_clearly_and_the_next_run_retries(
        spark, pg_dsn, pg_conn, table_name, lake_root, tmp_path):
    filled_table(pg_conn, table_name)
    log_file = tmp_path / "load.log"
    job = spark_submit_export(pg_dsn, lake_root, "--table", table_name, log_file=log_file,
                              env={"COLDHARBOR_PAUSE_AT": "load_after_snapshot", "COLDHARBOR_PAUSE_DIR": str(tmp_path)})
    try:
        deadline = time.monotonic() + 300
        while not (tmp_path / "load_after_snapshot.reached").exists():
            assert job.poll() is None, log_file.read_text()
            assert time.monotonic() < deadline
            time.sleep(0.2)
        # The job's own connection (its snapshot's exporter) is cut, as a failover or a DBA would.
        pg_conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                        "WHERE application_name = 'coldharbor' AND pid <> pg_backend_pid()")
    finally:
        (tmp_path / "load_after_snapshot.resume").write_text("go")
        job.wait(timeout=300)
    output = log_file.read_text()
    assert job.returncode == 2, output
    assert "cdc_export failed:" in output and "Traceback" not in output
    assert load_pending(pg_conn, table_name)
    export(spark, pg_dsn, table_name, lake_root)
    assert lake_live(spark, lake_root, table_name, ["id"]) == pg_rows(pg_conn, f"SELECT * FROM {table_name}", ["id"])


@pytest.mark.parametrize("point", ["resync_after_snapshot", "resync_after_commit"])
def test_a_resync_killed_is_redone_or_recorded(spark, pg_dsn, pg_conn, table_name, lake_root, point):
    filled_table(pg_conn, table_name)
    export(spark, pg_dsn, table_name, lake_root)
    crashed = spark_submit("resync.py", pg_dsn, lake_root, "--table", table_name, env={"COLDHARBOR_CRASH_AT": point})
    assert crashed.returncode != 0 and f"killing the process at {point}" in crashed.stdout, crashed.stdout
    pg_conn.execute(f"UPDATE {table_name} SET v = 'after the resync crash' WHERE id <= 5")
    export(spark, pg_dsn, table_name, lake_root)  # recovers the resync batch, then exports the changes
    resyncs = [b for b in batches(pg_conn, table_name) if b[1] == "resync"]
    assert resyncs == [(2, "resync", "flushed" if point == "resync_after_commit" else "abandoned")]
    assert lake_live(spark, lake_root, table_name, ["id"]) == pg_rows(pg_conn, f"SELECT * FROM {table_name}", ["id"])

"""Report runs hold a lease while they run: a serve_report process killed by SIGKILL, or one that
loses PostgreSQL mid-run, is found dead and recorded as failed (by cleanup, by the next report
run), so eviction's cutoff and the staging-table cleanup work again. Real processes, real kills."""

from __future__ import annotations

import time
from datetime import timedelta

from coldharbor.capture import registry
from coldharbor.maintenance.cleanup import CleanupConfig, cleanup_tables
from coldharbor.runtime import pg
from coldharbor.serve import report_runs
from coldharbor.serve.report_runs import RunRecord

from tests.helpers import export, report_run, serve_report, server_with_orders, spark_submit, wait_until_paused

DEAD = "the run ended without finishing: its serve process was killed or lost PostgreSQL"


def tiered_table(conn, name: str, rows: int = 10) -> registry.RegisteredTable:
    conn.execute(f"CREATE TABLE {name} (id bigint PRIMARY KEY, v text)")
    conn.execute("SELECT coldharbor.register_table(%s, p_hot_retention => '1 hour')", (name,))
    conn.execute(f"INSERT INTO {name} SELECT g, 'v' || g FROM generate_series(1, {rows}) g")
    return registry.load(conn, name)[0]


def age_changes(conn, table: registry.RegisteredTable, hours: int) -> None:
    """The controlled clock: the table's changes were made and flushed `hours` ago."""
    conn.execute(f"""UPDATE coldharbor.change_log SET created_at = created_at - interval '{hours} hours',
                            flushed_at = flushed_at - interval '{hours} hours' WHERE table_id = %s""",
                 (table.table_id,))


def cleanup(spark, dsn: str, lake_root: str, table: str | None):
    config = CleanupConfig(table=table, lake_root=lake_root, run_id=f"lease-{time.time()}",
                           retention=timedelta(hours=3), allow_short_retention=True)
    with pg.connect(dsn) as conn:
        return cleanup_tables(spark, conn, config)


def staging_tables(conn) -> list[str]:
    return [r[0] for r in conn.execute("SELECT tablename FROM pg_tables WHERE schemaname = 'reports' "
                                       "AND tablename LIKE '\\_ch\\_stage\\_%' ORDER BY 1").fetchall()]


def test_a_report_killed_by_sigkill_is_expired_by_cleanup_and_eviction_and_staging_cleanup_resume(
        spark, pg_dsn, pg_conn, table_name, lake_root, tmp_path):
    table = tiered_table(pg_conn, table_name)
    export(spark, pg_dsn, table_name, lake_root)
    run_id = f"killed-{table_name}"
    killed = spark_submit("serve_report.py", pg_dsn, lake_root, "--sql", f"SELECT * FROM {table_name}",
                          "--target", f"adhoc_{table_name}", "--run-id", run_id,
                          env={"COLDHARBOR_CRASH_AT": "report_after_stage"})
    assert killed.returncode != 0 and "killing the process at report_after_stage" in killed.stdout, \
        killed.stdout[-3000:]
    assert report_run(pg_conn, run_id)["state"] == "running"
    assert any(name.startswith(f"_ch_stage_adhoc_{table_name}") for name in staging_tables(pg_conn))
    # It was killed three hours ago; the table's rows were changed and flushed two hours ago.
    pg_conn.execute("UPDATE coldharbor.report_runs SET started_at = now() - interval '3 hours' WHERE run_id = %s",
                    (run_id,))
    age_changes(pg_conn, table, 2)

    [result] = [r for r in cleanup(spark, pg_dsn, lake_root, None) if r.table == f"public.{table_name}"]
    run = report_run(pg_conn, run_id)
    assert run["state"] == "failed" and run["error"].startswith(DEAD) and "by cleanup" in run["error"]
    assert result.evicted_rows == 10  # the dead run no longer holds the cutoff three hours back
    assert staging_tables(pg_conn) == []


def test_a_running_report_keeps_its_lease_until_its_session_ends(spark, pg_dsn, pg_conn, table_name, lake_root):
    """A live run is never expired, and eviction waits for it; once its session is gone (the
    process ended without recording the end), the next cleanup expires it and evicts."""
    table = tiered_table(pg_conn, table_name, rows=1)
    export(spark, pg_dsn, table_name, lake_root)
    age_changes(pg_conn, table, 2)
    record = RunRecord(f"live-{table_name}", "slow", None, "postgres", "strict", None)
    holder = pg.connect(pg_dsn)
    try:
        report_runs.start(holder, record)
        pg_conn.execute("UPDATE coldharbor.report_runs SET started_at = now() - interval '3 hours' "
                        "WHERE run_id = %s", (record.run_id,))
        [held] = cleanup(spark, pg_dsn, lake_root, table_name)
        assert held.evicted_rows == 0
        assert report_run(pg_conn, record.run_id)["state"] == "running"
    finally:
        holder.close()  # as a killed process's connection: no end recorded, the lease released
    [done] = cleanup(spark, pg_dsn, lake_root, table_name)
    assert done.evicted_rows == 1
    assert report_run(pg_conn, record.run_id)["state"] == "failed"


def test_a_report_that_loses_postgres_mid_run_is_expired_by_the_next_report(spark, tmp_path, monkeypatch):
    """PostgreSQL restarts while a serve_report process has its result staged: the process ends
    with one line (exit 2) and cannot record its end; the next report run records it as failed,
    and cleanup then drops the staging table it left."""
    lake_root = str(tmp_path / "lake")
    with server_with_orders(tmp_path / "server", rows=20) as (server, dsn):
        export(spark, dsn, "public.orders", lake_root)
        pause = tmp_path / "pause"
        pause.mkdir()
        job = spark_submit("serve_report.py", dsn, lake_root, "--sql", "SELECT * FROM orders", "--target",
                           "adhoc_lost", "--run-id", "lost-mid-run", log_file=tmp_path / "serve.log",
                           env={"COLDHARBOR_PAUSE_AT": "report_after_stage", "COLDHARBOR_PAUSE_DIR": str(pause)})
        try:
            wait_until_paused(pause, "report_after_stage", job)
            server.stop()
            server.start()
            (pause / "report_after_stage.resume").touch()
            assert job.wait(300) == 2
        finally:
            if job.poll() is None:
                job.kill()
        output = (tmp_path / "serve.log").read_text()
        assert "serve_report failed (run lost-mid-run): lost PostgreSQL" in output and "Traceback" not in output
        with pg.connect(dsn) as conn:
            assert report_run(conn, "lost-mid-run")["state"] == "running"
            assert len(staging_tables(conn)) == 1

            assert serve_report(monkeypatch, dsn, lake_root, "--sql", "SELECT count(*) AS n FROM orders",
                                "--target", "adhoc_next", "--run-id", "next-run") == 0
            lost = report_run(conn, "lost-mid-run")
            assert lost["state"] == "failed" and lost["error"].startswith(DEAD)
            assert "by report run next-run" in lost["error"]
            cleanup(spark, dsn, lake_root, None)
            assert staging_tables(conn) == []

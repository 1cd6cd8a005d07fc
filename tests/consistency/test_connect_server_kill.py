"""The Spark Connect server killed (SIGKILL of its process group) in the middle of an export, a
compaction and a report: the job fails in one line (exit 2), and the next run, on a server that is
up, converges: no row lost or doubled, no batch marked flushed that the lake lacks, no report table
half-written.

Each job is stopped inside the Spark tasks of its write (COLDHARBOR_PAUSE_AT=<point>: the server's
task waits, its files half written) on a server the test started for it alone; the next run uses
the run's shared server (it stands in for the engine the supervisor brings back)."""

from __future__ import annotations

import os
import signal
import uuid
from pathlib import Path

from coldharbor.capture import registry
from coldharbor.lake import commits, delta

from tests.connect_server import run_job, running_server, start_job
from tests.helpers import dirty_ids, lake_live, lake_table, pg_rows, wait_until_paused
from tests.integration.runtime.test_connect_sessions import one_error_line

# Hostile text and a composite key of text and bigint: the rows must come back byte for byte.
NOTES = ["'; DROP TABLE x; --", "line\nbreak", "back\\slash", "🙂 emoji", "${env:HOME}", "", None]
REGIONS = ["eu'x", "a/b=c d%", "日本"]
LOST = "is unreachable or was restarted"


def make_table(conn, name: str) -> None:
    """Rows before registration (an initial load), then changes captured after it."""
    conn.execute(f"CREATE TABLE {name} (region text, id bigint, amount numeric(12,2), note text, "
                 "PRIMARY KEY (region, id))")
    fill(conn, name, 1, 120)
    conn.execute("SELECT coldharbor.register_table(%s)", (name,))
    change(conn, name, 1)


def fill(conn, name: str, first: int, last: int) -> None:
    conn.execute(f"""INSERT INTO {name} SELECT (%s::text[])[1 + g %% 3], g, g * 1.25, (%s::text[])[1 + g %% 7]
                     FROM generate_series(%s::bigint, %s::bigint) g""", (REGIONS, NOTES, first, last))


def change(conn, name: str, round_: int) -> None:
    conn.execute(f"UPDATE {name} SET amount = amount + {round_}, note = coalesce(note, '') || %s "
                 f"WHERE id %% 5 = {round_ % 5}", (f" r{round_}'",))
    conn.execute(f"DELETE FROM {name} WHERE id % 11 = {round_ % 11}")
    fill(conn, name, 1000 * round_, 1000 * round_ + 15)


def ok(done) -> None:
    assert done.returncode == 0, f"exit {done.returncode}\n{done.stderr[-4000:]}\n{done.stdout[-2000:]}"
    assert "Traceback" not in done.stderr


def killed_midway(job: str, point: str, folder: Path, dsn: str, lake_root: str, *args: str) -> str:
    """Runs `job` on a Connect server of its own, waits until its write's tasks reach `point`, kills
    the server's whole process group with SIGKILL and lets the tasks go; returns the job's output
    after asserting it failed with exit 2."""
    pause = folder / "pause"
    pause.mkdir(parents=True)
    with running_server(folder) as server:
        process = start_job(job, server.url, dsn, lake_root, *args, log=folder / "job.log",
                            env={"COLDHARBOR_PAUSE_AT": point, "COLDHARBOR_PAUSE_DIR": str(pause),
                                 "COLDHARBOR_SPARK_REMOTE_WAIT_SECONDS": "1"})
        try:
            wait_until_paused(pause, point, process)
            os.killpg(server.process.pid, signal.SIGKILL)
            server.process.wait(60)
            (pause / f"{point}.resume").write_text("go")
            assert process.wait(300) == 2, (folder / "job.log").read_text()[-4000:]
        finally:
            if process.poll() is None:
                process.kill()
                process.wait(60)
    return (folder / "job.log").read_text()


def assert_converged(spark, conn, name: str, lake_root: str) -> None:
    """Nothing dirty, the lake's live rows equal PostgreSQL's, no change in the lake twice, and
    every batch marked flushed has its commit in the lake."""
    keys = ["region", "id"]
    assert dirty_ids(conn, name) == []
    live = {k: {c: v[c] for c in ("region", "id", "amount", "note")} for k, v in
            lake_live(spark, lake_root, f"public.{name}", keys).items()}
    assert live == pg_rows(conn, f"SELECT region, id, amount, note FROM {name}", keys)
    doubled = (lake_table(spark, lake_root, f"public.{name}").groupBy("region", "id", "_ch_seq").count()
               .filter("count > 1").collect())
    assert doubled == []
    [table] = registry.load(conn, f"public.{name}")
    path = table.lake_path(lake_root)
    flushed = conn.execute("SELECT batch_id, commit_token::text FROM coldharbor.export_batches "
                           "WHERE table_id = %s AND state = 'flushed' AND kind = 'changes'", (table.table_id,)).fetchall()
    assert flushed
    missing = [b for b, token in flushed
               if commits.find_batch_commit(spark, path, commits.export_app_id(table.table_id), b, token, name) is None]
    assert missing == []


def test_a_server_killed_in_the_middle_of_an_export(connect_url, connect_spark, pg_dsn, pg_conn, table_name,
                                                    lake_root, tmp_path):
    make_table(pg_conn, table_name)
    ok(run_job("cdc_export.py", connect_url, pg_dsn, lake_root, "--table", table_name))
    change(pg_conn, table_name, 2)
    dirty = dirty_ids(pg_conn, table_name)

    output = killed_midway("cdc_export.py", "during_write", tmp_path / "export", pg_dsn, lake_root,
                           "--table", table_name)
    assert LOST in one_error_line(output)
    assert dirty_ids(pg_conn, table_name) == dirty, "nothing marked"

    ok(run_job("cdc_export.py", connect_url, pg_dsn, lake_root, "--table", table_name))
    assert_converged(connect_spark, pg_conn, table_name, lake_root)


def test_a_server_killed_in_the_middle_of_a_compaction(connect_url, connect_spark, pg_dsn, pg_conn, table_name,
                                                       lake_root, tmp_path):
    make_table(pg_conn, table_name)
    for round_ in (2, 3, 4):  # small files to compact
        ok(run_job("cdc_export.py", connect_url, pg_dsn, lake_root, "--table", table_name))
        change(pg_conn, table_name, round_)
    path = f"{lake_root}/public/{table_name}"
    version = delta.pin_version(connect_spark, path)
    compact = ("--table", table_name, "--min-small-files", "2", "--target-file-mb", "1")

    output = killed_midway("compact.py", "compact_during_write", tmp_path / "compact", pg_dsn, lake_root, *compact)
    assert LOST in one_error_line(output)
    assert delta.pin_version(connect_spark, path) == version, "nothing committed"

    ok(run_job("compact.py", connect_url, pg_dsn, lake_root, *compact))
    assert [r.operation for r in connect_spark.sql(f"DESCRIBE HISTORY '{path}' LIMIT 1").collect()] == ["WRITE"]
    assert delta.pin_version(connect_spark, path) > version, "the next compaction rewrote the files"
    ok(run_job("cdc_export.py", connect_url, pg_dsn, lake_root, "--table", table_name))
    assert_converged(connect_spark, pg_conn, table_name, lake_root)


def test_a_server_killed_in_the_middle_of_a_report(connect_url, connect_spark, pg_dsn, pg_conn, table_name,
                                                   lake_root, tmp_path):
    make_table(pg_conn, table_name)
    ok(run_job("cdc_export.py", connect_url, pg_dsn, lake_root, "--table", table_name))
    target = f"adhoc_{uuid.uuid4().hex[:8]}"
    query = f"SELECT region, id, amount, note FROM public.{table_name}"

    def serve(url: str, run_id: str, **kwargs):
        return run_job("serve_report.py", url, pg_dsn, lake_root, "--sql", query, "--target", target,
                       "--run-id", run_id, **kwargs)

    def served() -> dict:
        return pg_rows(pg_conn, f"SELECT region, id, amount, note FROM reports.{target}", ["region", "id"])

    ok(serve(connect_url, f"{target}-1"))
    before = served()
    assert before == pg_rows(pg_conn, f"SELECT region, id, amount, note FROM {table_name}", ["region", "id"])
    change(pg_conn, table_name, 2)

    pause = tmp_path / "report"
    output = killed_midway("serve_report.py", "report_during_write", pause, pg_dsn, lake_root, "--sql", query,
                           "--target", target, "--run-id", f"{target}-2")
    assert LOST in one_error_line(output)
    assert served() == before, "the previous report table is intact"
    assert pg_conn.execute("SELECT state FROM coldharbor.report_runs WHERE run_id = %s",
                           (f"{target}-2",)).fetchone() == ("failed",)
    assert pg_conn.execute("SELECT count(*) FROM pg_tables WHERE schemaname = 'reports' AND tablename LIKE %s",
                           (f"\\_ch\\_stage\\_{target}%",)).fetchone() == (0,), "no staging table left"

    ok(serve(connect_url, f"{target}-3"))
    assert served() == pg_rows(pg_conn, f"SELECT region, id, amount, note FROM {table_name}", ["region", "id"])

"""Jobs sharing one Spark Connect server each have a session of their own (temp views, settings,
checkpoints), and a job whose server is unreachable or dies fails in one line with exit 2."""

from __future__ import annotations

import threading
import uuid

from coldharbor.capture import registry
from coldharbor.export.table_export import ExportConfig, export_table
from coldharbor.runtime import pg
from coldharbor.runtime.spark import get_session, release_sessions
from coldharbor.serve import serve_cli, serve_job, sql_guard

from tests.connect_server import free_port, run_job, running_server, start_job, stop
from tests.helpers import dirty_ids, export, lake_live, pg_rows, wait_until_paused

BARRIER_TIMEOUT_S = 300


def make_table(conn, name: str, rows: int = 100, loaded: bool = True) -> registry.RegisteredTable:
    """A table of `rows` rows, there before registration (an initial load to write) or, not
    `loaded`, inserted after it (dirty changes to export)."""
    conn.execute(f"CREATE TABLE {name} (id bigint PRIMARY KEY, v text, amount numeric(12,2))")
    insert = f"INSERT INTO {name} SELECT g, 'v''' || g, g * 1.5 FROM generate_series(1, {rows}) g"
    if loaded:
        conn.execute(insert)
    conn.execute("SELECT coldharbor.register_table(%s)", (name,))
    if not loaded:
        conn.execute(insert)
    [table] = registry.load(conn, name)
    return table


def batches_of(conn, name: str) -> int:
    return conn.execute("""SELECT count(*) FROM coldharbor.export_batches b JOIN coldharbor.tables t
                           USING (table_id) WHERE t.table_name = %s""", (name,)).fetchone()[0]


def dirty_again(conn, name: str) -> None:
    conn.execute(f"UPDATE {name} SET amount = amount + 1, v = v || '!' WHERE id % 3 = 0")
    conn.execute(f"DELETE FROM {name} WHERE id % 10 = 1")
    conn.execute(f"INSERT INTO {name} SELECT g, 'new', g FROM generate_series(1000, 1010) g")


def test_two_reports_and_an_export_at_once_keep_their_sessions_apart(on_connect, pg_dsn, pg_conn, lake_root,
                                                                     monkeypatch):
    """Mid-run, all three at once: the export plants views under the names the reports read,
    turns path identifiers on in its session and checkpoints rows; the reports must not see any of
    it, nor read the export's checkpoint, and each answer equals PostgreSQL."""
    monkeypatch.setenv("COLDHARBOR_PG_DSN", pg_dsn)  # the reports' serve_cli.main reads it
    names = [f"t_{uuid.uuid4().hex[:10]}" for _ in range(2)]
    tables = [make_table(pg_conn, name) for name in names]
    setup = get_session("coldharbor-test-setup")
    for name in names:
        export(setup, pg_dsn, name, lake_root)
        dirty_again(pg_conn, name)
    release_sessions()

    barrier = threading.Barrier(3, timeout=BARRIER_TIMEOUT_S)
    planted: dict[str, object] = {}
    seen: dict[str, dict] = {}
    failures: list[BaseException] = []
    run_query = serve_job.run_query

    def report_at_barrier(spark, checked, params):
        barrier.wait()   # 1: each report has registered its views
        barrier.wait()   # 2: the export has planted its own
        seen[threading.current_thread().name] = observe(spark, planted["checkpoint"])
        return run_query(spark, checked, params)

    def export_hook(point: str) -> None:
        if point != "after_read":
            return
        spark = planted["session"]
        barrier.wait()
        for table in tables:
            spark.sql("SELECT 1 AS n, 2 AS s").createOrReplaceTempView(sql_guard.view_name(table))
        spark.conf.set("spark.sql.runSQLOnFiles", "true")
        planted["checkpoint"] = spark.range(7).localCheckpoint()
        barrier.wait()

    def export_thread() -> None:
        planted["session"] = spark = get_session("coldharbor-cdc-export")
        try:
            with pg.connect(pg_dsn) as conn:
                config = ExportConfig(table=names[0], lake_root=lake_root, run_id="concurrent")
                planted["result"] = export_table(spark, conn, pg.JdbcTarget.from_dsn(pg_dsn), tables[0], config,
                                                 export_hook)
        finally:
            release_sessions()

    monkeypatch.setattr(serve_job, "run_query", report_at_barrier)
    targets = [f"adhoc_{uuid.uuid4().hex[:8]}" for _ in names]
    threads = [threading.Thread(target=guarded(failures, barrier, export_thread), name="export")]
    threads += [threading.Thread(target=guarded(failures, barrier, serve_cli.main, [
        "--lake-root", lake_root, "--sql", f"SELECT count(*) AS n, sum(amount) AS s FROM public.{name}",
        "--target", target, "--run-id", target]), name=target) for name, target in zip(names, targets)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(600)
    assert not failures, failures

    for table, target in zip(tables, targets):
        assert seen[target] == {"views": [sql_guard.view_name(table)], "run_sql_on_files": "false",
                                "foreign_checkpoint": "refused"}
        served = pg_conn.execute(f"SELECT n, s FROM reports.{target}").fetchall()
        assert served == pg_conn.execute(f"SELECT count(*), sum(amount) FROM {table.qualified_name}").fetchall()
    assert planted["result"].status == "exported"
    assert dirty_ids(pg_conn, names[0]) == []
    reader = get_session("coldharbor-test-reader")
    assert lake_live(reader, lake_root, f"public.{names[0]}", ["id"]) == \
        pg_rows(pg_conn, f"SELECT id, v, amount FROM {names[0]}", ["id"])
    release_sessions()


def guarded(failures: list, barrier: threading.Barrier, target, *args):
    """`target` for a thread: its exception (or a report's exit code other than 0) is kept for the
    test, and breaks the barrier so the other threads stop waiting."""
    def run() -> None:
        try:
            code = target(*args)
            if code not in (None, 0):
                raise AssertionError(f"{threading.current_thread().name} exited with {code}")
        except BaseException as exc:
            failures.append(exc)
            barrier.abort()
    return run


def observe(spark, foreign_checkpoint) -> dict:
    """What a report's session sees of the others: its temp views, its path-identifier setting,
    and whether the export session's checkpoint can be read through it."""
    from pyspark.sql.connect.dataframe import DataFrame

    try:
        DataFrame(foreign_checkpoint._plan, spark).count()
        foreign = "readable"
    except Exception as exc:
        foreign = "refused" if "NOT_FOUND" in str(exc) else f"failed otherwise: {exc}"
    return {"views": sorted(t.name for t in spark.catalog.listTables() if t.isTemporary),
            "run_sql_on_files": spark.conf.get("spark.sql.runSQLOnFiles"), "foreign_checkpoint": foreign}


def one_error_line(output: str) -> str:
    assert "Traceback" not in output and "Warning" not in output, output[-3000:]
    errors = [line for line in output.splitlines() if " ERROR " in line]
    assert len(errors) == 1, output[-3000:]
    return errors[0]


def test_a_job_whose_connect_server_is_unreachable_fails_in_one_line(pg_dsn, pg_conn, table_name, lake_root):
    make_table(pg_conn, table_name, loaded=False)
    nowhere = f"sc://127.0.0.1:{free_port()}"
    env = {"COLDHARBOR_SPARK_REMOTE_WAIT_SECONDS": "1"}
    exported = run_job("cdc_export.py", nowhere, pg_dsn, lake_root, "--table", table_name, env=env)
    assert exported.returncode == 2
    assert f"the Spark Connect server at {nowhere} is unreachable" in one_error_line(exported.stderr)
    assert len(dirty_ids(pg_conn, table_name)) == 100 and batches_of(pg_conn, table_name) == 0, "nothing recorded"

    target = f"adhoc_{uuid.uuid4().hex[:8]}"
    served = run_job("serve_report.py", nowhere, pg_dsn, lake_root, "--sql", f"SELECT count(*) AS n FROM "
                     f"public.{table_name}", "--target", target, "--run-id", target, env=env)
    assert served.returncode == 2
    assert f"the Spark Connect server at {nowhere} is unreachable" in one_error_line(served.stderr)
    assert pg_conn.execute("SELECT state FROM coldharbor.report_runs WHERE run_id = %s", (target,)).fetchone() == \
        ("failed",)
    assert pg_conn.execute("SELECT to_regclass(%s)", (f"reports.{target}",)).fetchone() == (None,)


def test_a_job_whose_connect_server_dies_midway_fails_in_one_line(pg_dsn, pg_conn, table_name, lake_root, tmp_path):
    make_table(pg_conn, table_name, loaded=False)
    pause = tmp_path / "pause"
    pause.mkdir()
    with running_server(tmp_path) as server:
        job = start_job("cdc_export.py", server.url, pg_dsn, lake_root, "--table", table_name, log=tmp_path / "job.log",
                        env={"COLDHARBOR_PAUSE_AT": "after_read", "COLDHARBOR_PAUSE_DIR": str(pause),
                             "COLDHARBOR_SPARK_REMOTE_WAIT_SECONDS": "1"})
        try:
            wait_until_paused(pause, "after_read", job)  # the images are checkpointed on the server
            stop(server)
            (pause / "after_read.resume").write_text("go")
            assert job.wait(300) == 2
        finally:
            if job.poll() is None:
                job.kill()
    assert "is unreachable or was restarted" in one_error_line((tmp_path / "job.log").read_text())
    assert len(dirty_ids(pg_conn, table_name)) == 100 and batches_of(pg_conn, table_name) == 0, "nothing recorded"


def test_jobs_in_a_thread_that_opened_another_session_first(on_connect, pg_dsn, pg_conn, table_name, lake_root,
                                                            monkeypatch):
    """PySpark's Connect client hands a checkpoint to the thread's active session, the first one the
    thread opened; the export's images and the report's hot images are checkpoints of the job's own
    session, which must still find them when another session of the process came first (tests, a
    worker running jobs in-process)."""
    from coldharbor.runtime.spark import connect_session

    monkeypatch.setenv("COLDHARBOR_PG_DSN", pg_dsn)  # serve_cli.main reads it
    make_table(pg_conn, table_name, loaded=False)
    first = connect_session(on_connect, "coldharbor-test-first")
    try:
        for change in (dirty_again, lambda conn, name: conn.execute(f"UPDATE {name} SET v = v || '?' WHERE id % 4 = 0")):
            result = export(get_session("coldharbor-cdc-export"), pg_dsn, table_name, lake_root)
            release_sessions()
            assert result.status == "exported", result
            change(pg_conn, table_name)  # dirty keys: the report checkpoints their hot images
        target = f"adhoc_{uuid.uuid4().hex[:8]}"
        assert serve_cli.main(["--lake-root", lake_root, "--sql", f"SELECT id, v, amount FROM public.{table_name}",
                               "--target", target, "--run-id", target]) == 0
        assert pg_rows(pg_conn, f"SELECT id, v, amount FROM reports.{target}", ["id"]) == \
            pg_rows(pg_conn, f"SELECT id, v, amount FROM {table_name}", ["id"])
    finally:
        first.stop()

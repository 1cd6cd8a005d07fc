"""Failures a user can do nothing about in code end in one clear line and exit 2, never a
traceback: a malformed DSN, a registered table whose schema was dropped, PostgreSQL lost under a
Spark JDBC read, a lake on S3 that cannot be reached. Real processes where the failure is one."""

from __future__ import annotations

import subprocess
import sys
import uuid

import pytest
from coldharbor.capture import registry
from coldharbor.embedded.stack import free_port
from coldharbor.export import batches
from coldharbor.runtime import pg
from coldharbor.runtime.errors import PostgresUnavailableError

from tests.helpers import (
    PROJECT,
    dirty_ids,
    export,
    report_run,
    serve_report,
    server_with_orders,
    spark_submit,
    spark_submit_export,
    wait_until_paused,
)

JOB_ARGS = {"cdc_export.py": [], "cleanup.py": [], "compact.py": [], "verify.py": ["--table", "public.t"],
            "resync.py": ["--table", "public.t"], "purge.py": ["--table", "public.t", "--where", "id = 1",
                                                                "--vacuum-retention-hours", "168"],
            "serve_report.py": ["--sql", "SELECT 1 AS x FROM t", "--target", "adhoc_x"]}


def run_job(job: str, *args: str, dsn: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """A job's main() in a plain Python process (each refusal here comes before Spark starts)."""
    return subprocess.run([sys.executable, str(PROJECT / "jobs" / job), *args], capture_output=True, text=True,
                          timeout=300, env={"PYTHONPATH": str(PROJECT / "jobs"), "COLDHARBOR_PG_DSN": dsn,
                                            "PATH": "/usr/bin:/bin", "SPARK_LOCAL_IP": "127.0.0.1", **(env or {})})


def one_error_line(output: str) -> str:
    """The job's one ERROR line (Spark's own JVM log lines aside); no Python traceback anywhere."""
    assert "Traceback" not in output, output[-3000:]
    errors = [line for line in output.splitlines() if " ERROR coldharbor" in line]
    assert len(errors) == 1, output[-3000:]
    return errors[0]


@pytest.mark.parametrize("job", sorted(JOB_ARGS))
@pytest.mark.parametrize("dsn, message", [
    ("postgresql://app:s3cret@127.0.0.1:5432/shop?connect_timeout=soon",
     "the PostgreSQL DSN's connect_timeout 'soon' is not a whole number of seconds"),
    ("postgresql://app:s3cret@127.0.0.1:54x2/shop", "the PostgreSQL DSN's port '54x2' is not a port number"),
    ("host=127.0.0.1 user=app password=s3cret sslmode=strict", "the PostgreSQL DSN's sslmode 'strict' is not one of"),
])
def test_a_malformed_dsn_is_one_line_and_exit_2_for_every_job(job, dsn, message, lake_root):
    done = run_job(job, "--lake-root", lake_root, *JOB_ARGS[job], dsn=dsn)
    assert done.returncode == 2, done.stderr[-3000:]
    assert message in one_error_line(done.stderr)
    assert "s3cret" not in done.stderr + done.stdout


@pytest.mark.parametrize("job", ["cdc_export.py", "serve_report.py", "verify.py", "resync.py"])
def test_a_dsn_spark_s_jdbc_cannot_use_is_refused_before_anything_is_read_or_recorded(job, pg_dsn, pg_conn,
                                                                                      lake_root):
    """Found by the cold attack on the job shape: with PostgreSQL reachable through a DSN of two hosts
    (libpq takes it, Spark's JDBC readers cannot), the export passed a cycle with nothing to do and
    started a JVM for one with work, and a report recorded a run, before the refusal."""
    host = pg_dsn.split("@", 1)[1].split("/", 1)[0]
    two_hosts = pg_dsn.replace(f"@{host}/", f"@{host},{host}/")
    run_id = f"jdbc-{uuid.uuid4().hex[:8]}"
    extra = ["--run-id", run_id] if job == "serve_report.py" else []
    samples = pg_conn.execute("SELECT count(*) FROM coldharbor.health_samples").fetchone()[0]
    done = run_job(job, "--lake-root", lake_root, *JOB_ARGS[job], *extra, dsn=two_hosts,
                   env={"JAVA_HOME": "/nonexistent"})  # a JVM started would fail otherwise
    assert done.returncode == 2, done.stderr[-3000:]
    assert "the PostgreSQL DSN names several hosts" in one_error_line(done.stderr)
    assert pg_conn.execute("SELECT count(*) FROM coldharbor.health_samples").fetchone()[0] == samples
    assert report_run(pg_conn, run_id) == {}


def test_a_refused_report_in_best_effort_without_postgres_says_its_refusal_alone(lake_root):
    """Found by the same attack: the lake-alone warning came before the report's checks, so a refused
    report also said it was reading the lake."""
    done = run_job("serve_report.py", "--lake-root", lake_root, "--sql", "DELETE FROM t", "--target", "adhoc_x",
                   "--mode", "best_effort", dsn=f"postgresql://app@127.0.0.1:{free_port()}/db")
    assert done.returncode == 2, done.stderr[-3000:]
    assert "a report is a read-only SELECT" in one_error_line(done.stderr)
    assert "reading the lake alone" not in done.stderr


@pytest.mark.parametrize("job", sorted(JOB_ARGS))
@pytest.mark.parametrize("name, raw, message", [
    ("COLDHARBOR_JDBC_READERS", "x", "COLDHARBOR_JDBC_READERS='x' is not a number of readers"),
    ("COLDHARBOR_LAKE_COMMIT_LOCK", "maybe", "COLDHARBOR_LAKE_COMMIT_LOCK must be auto, on or off"),
    ("COLDHARBOR_SPARK_REMOTE", "sc://h:1/;token=s3cret;use_ssl=false", "a token is only ever sent over TLS"),
])
def test_a_malformed_setting_is_one_line_and_exit_2_for_every_job(job, name, raw, message, pg_dsn, lake_root):
    """Found by the second cold attack: settings a run might not read were accepted, or refused late."""
    done = run_job(job, "--lake-root", lake_root, *JOB_ARGS[job], dsn=pg_dsn, env={name: raw})
    assert done.returncode == 2, done.stderr[-3000:]
    assert message in one_error_line(done.stderr)
    assert "s3cret" not in done.stderr + done.stdout


def test_a_registered_table_whose_schema_was_dropped_is_one_line_and_exit_2(
        spark, own_database, lake_root, monkeypatch, caplog):
    admin_dsn, pg_dsn = own_database  # the runs over every table meet this test's alone
    with pg.connect(admin_dsn) as pg_conn:
        schema_was_dropped(spark, pg_dsn, pg_conn, lake_root, monkeypatch, caplog)


def schema_was_dropped(spark, pg_dsn, pg_conn, lake_root, monkeypatch, caplog):
    schema = f"s_{uuid.uuid4().hex[:8]}"
    pg_conn.execute(f"CREATE SCHEMA {schema}; CREATE TABLE {schema}.gone (id bigint PRIMARY KEY, v text)")
    pg_conn.execute("SELECT coldharbor.register_table(%s, p_hot_retention => '1 hour')", (f"{schema}.gone",))
    pg_conn.execute(f"INSERT INTO {schema}.gone VALUES (1, 'a')")
    [table] = registry.load(pg_conn, f"{schema}.gone")
    pg_conn.execute(f"DROP SCHEMA {schema} CASCADE")
    message = f"{schema}.gone is registered with coldharbor but PostgreSQL has no such table any more"
    try:
        for job, args in [("cdc_export.py", []), ("cdc_export.py", ["--table", f"{schema}.gone"]),
                          ("cleanup.py", []), ("verify.py", ["--table", f"{schema}.gone"]),
                          ("resync.py", ["--table", f"{schema}.gone"]),
                          ("purge.py", ["--table", f"{schema}.gone", "--where", "id = 1",
                                        "--vacuum-retention-hours", "168"])]:
            done = run_job(job, "--lake-root", lake_root, *args, dsn=pg_dsn)
            assert done.returncode == 2, (job, done.stderr[-3000:])
            assert message in one_error_line(done.stderr), job
        caplog.clear()
        assert serve_report(monkeypatch, pg_dsn, lake_root, "--sql", f"SELECT * FROM {schema}.gone",
                            "--target", "adhoc_gone", "--run-id", f"gone-{schema}") == 2
        assert message in report_run(pg_conn, f"gone-{schema}")["error"] and "Traceback" not in caplog.text
    finally:
        pg_conn.execute("DELETE FROM coldharbor.change_log WHERE table_id = %s", (table.table_id,))
        pg_conn.execute("DELETE FROM coldharbor.tables WHERE table_id = %s", (table.table_id,))


def test_a_spark_jdbc_read_that_loses_postgres_is_told_apart_from_a_bad_query(spark, pg_dsn):
    """The classifier every job uses, on real JDBC failures of the test's own Spark session."""
    dead = pg.JdbcTarget.from_dsn(f"postgresql://postgres:x@127.0.0.1:{free_port()}/postgres")
    with pytest.raises(Exception) as refused:
        spark.read.format("jdbc").options(**dead.options()).option("query", "SELECT 1 AS x").load().collect()
    lost = pg.lost_postgres(refused.value)
    assert isinstance(lost, PostgresUnavailableError) and "Connection to 127.0.0.1" in str(lost)
    live = pg.JdbcTarget.from_dsn(pg_dsn)
    with pytest.raises(Exception) as bad_query:
        spark.read.format("jdbc").options(**live.options()).option("query", "SELECT * FROM no_such_table").load()
    assert pg.lost_postgres(bad_query.value) is None  # a bug, not a lost server: its traceback stays


def test_postgres_lost_during_the_export_s_jdbc_read_is_one_line_and_nothing_is_marked(spark, tmp_path):
    lake_root = str(tmp_path / "lake")
    with server_with_orders(tmp_path / "server", rows=100) as (server, dsn):
        with pg.connect(dsn) as conn:
            dirty = dirty_ids(conn, "public.orders")
        pause = tmp_path / "pause"
        pause.mkdir()
        job = spark_submit_export(dsn, lake_root, "--table", "public.orders", log_file=tmp_path / "export.log",
                                  env={"COLDHARBOR_PAUSE_AT": "before_jdbc_read", "COLDHARBOR_PAUSE_DIR": str(pause)})
        try:
            wait_until_paused(pause, "before_jdbc_read", job)
            server.stop()  # the readers' connections are refused
            (pause / "before_jdbc_read.resume").touch()
            assert job.wait(300) == 2
        finally:
            if job.poll() is None:
                job.kill()
        line = one_error_line((tmp_path / "export.log").read_text())
        assert "cdc_export failed: lost PostgreSQL" in line
        server.start()
        with pg.connect(dsn) as conn:
            assert dirty_ids(conn, "public.orders") == dirty
            assert conn.execute("SELECT count(*) FROM coldharbor.export_batches WHERE state <> 'abandoned'"
                                ).fetchone()[0] == 0
        assert export(spark, dsn, "public.orders", lake_root).status == "exported"


def test_an_error_no_check_foresaw_is_one_line_naming_its_kept_traceback(spark, tmp_path):
    """Before, only verify said so in one line: every other job printed the traceback (exit 1). Here
    the error is real and unforeseen by the export: a pause point whose folder does not exist."""
    lake_root = str(tmp_path / "lake")
    kept = tmp_path / "tracebacks"
    kept.mkdir()
    with server_with_orders(tmp_path / "server", rows=100) as (_, dsn):
        with pg.connect(dsn) as conn:
            dirty = dirty_ids(conn, "public.orders")
        done = spark_submit_export(dsn, lake_root, "--table", "public.orders", env={
            "COLDHARBOR_PAUSE_AT": "before_jdbc_read", "COLDHARBOR_PAUSE_DIR": str(tmp_path / "no such folder"),
            "COLDHARBOR_TRACEBACK_DIR": str(kept)})
        assert done.returncode == 1, done.stdout[-3000:]
        line = one_error_line(done.stdout)
        assert "cdc_export failed: an error no check foresaw (at coldharbor/runtime/faults.py:" in line
        assert "FileNotFoundError" in line and "its traceback is in " in line
        [traceback_file] = kept.iterdir()
        assert line.endswith(str(traceback_file)) and "Traceback (most recent call last)" in traceback_file.read_text()
        with pg.connect(dsn) as conn:
            assert dirty_ids(conn, "public.orders") == dirty
        assert export(spark, dsn, "public.orders", lake_root).status == "exported"


S3_UNREACHABLE = ["--conf", "spark.hadoop.fs.s3a.endpoint=http://127.0.0.1:{port}",
                  "--conf", "spark.hadoop.fs.s3a.endpoint.region=us-east-1",
                  "--conf", "spark.hadoop.fs.s3a.path.style.access=true",
                  "--conf", "spark.hadoop.fs.s3a.connection.ssl.enabled=false",
                  # Fail in seconds rather than minutes of retries: the message is what is tested.
                  "--conf", "spark.hadoop.fs.s3a.attempts.maximum=1", "--conf", "spark.hadoop.fs.s3a.retry.limit=1",
                  "--conf", "spark.hadoop.fs.s3a.retry.interval=10ms"]


def test_an_unreachable_s3_lake_is_one_line_for_export_recovery_cleanup_and_compaction(
        spark, pg_dsn, pg_conn, table_name):
    """hadoop-aws (and the jobs' own Delta log reads, configured by AWS_ENDPOINT_URL as the README
    says) against a closed local port: the export finishing a killed run's batch (it looks the
    batch's commit up), cleanup's VACUUM and compaction's snapshot each say which lake read failed,
    in one line, and change nothing."""
    lake_root = "s3a://coldharbor-lake/lake"
    pg_conn.execute(f"CREATE TABLE {table_name} (id bigint PRIMARY KEY, v text)")
    pg_conn.execute("SELECT coldharbor.register_table(%s)", (table_name,))
    pg_conn.execute(f"INSERT INTO {table_name} SELECT g, 'v' FROM generate_series(1, 10) g")
    [table] = registry.load(pg_conn, table_name)
    with pg_conn.transaction():  # the intent a killed export left: recorded, never committed to the lake
        batch = batches.begin(pg_conn, table, "killed-run", 10)
    dirty = dirty_ids(pg_conn, table_name)
    port = free_port()
    env = {"COLDHARBOR_EXTRA_PACKAGES": "org.apache.hadoop:hadoop-aws:3.5.0", "AWS_ACCESS_KEY_ID": "coldharbor",
           "AWS_SECRET_ACCESS_KEY": "not-used", "AWS_REGION": "us-east-1",
           "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}", "AWS_ALLOW_HTTP": "true"}
    s3a = [arg.format(port=port) for arg in S3_UNREACHABLE]
    path = f"{lake_root}/public/{table_name}"
    for job, args, message in [
            ("cdc_export.py", [], f"cdc_export failed: reading the Delta history of {path} failed: "),
            ("cleanup.py", [], f"cleanup failed: reading the Delta log of {path} failed: "),
            ("compact.py", [], f"compact failed: reading the Delta log of {path} failed: ")]:
        done = spark_submit(job, pg_dsn, lake_root, "--table", table_name, *args, env=env, spark_args=s3a)
        assert done.returncode == 2, (job, done.stdout[-3000:])
        assert message in one_error_line(done.stdout), job
    assert dirty_ids(pg_conn, table_name) == dirty
    assert batches.pending(pg_conn, table.table_id) == [(batch.batch_id, "changes", batch.commit_token)]

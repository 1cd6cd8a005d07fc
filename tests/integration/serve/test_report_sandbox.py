"""The report sandbox against real PostgreSQL and Spark + Delta: every hostile report of the corpus
is refused by the job before Spark runs anything and changes nothing, from the command line before
a JVM starts; and the attacks are real when Spark runs them."""

from __future__ import annotations

import getpass
import os
import subprocess
import sys

import pytest

from tests.helpers import PROJECT, report_run, serve_report
from tests.report_corpus import CANARY_ENV, ORDERS, fill, hostile, table_counts

HOSTILE = hostile()


def spark_jobs(spark) -> int:
    """The newest Spark job's id: ids only grow, and the status store keeps the newest jobs only."""
    return max(spark.sparkContext.statusTracker().getJobIdsForGroup(), default=-1)


@pytest.mark.parametrize("report", HOSTILE, ids=[r.id for r in HOSTILE])
def test_a_hostile_report_is_refused_by_the_job_and_changes_nothing(
        spark, pg_dsn, pg_conn, sandbox, report, tmp_path, monkeypatch, caplog):
    marker = tmp_path / "marker"
    monkeypatch.setenv(CANARY_ENV, "canary-value-7f3a")
    run_id = f"hostile-{report.id}"
    jobs_before = spark_jobs(spark)
    rc = serve_report(monkeypatch, pg_dsn, sandbox.lake_root, "--sql", fill(report.sql, str(marker)),
                      "--target", "adhoc_hostile", "--run-id", run_id)
    assert rc == 2, report.harm
    errors = [r.getMessage() for r in caplog.records if r.levelname == "ERROR" and "serve_report" in r.name]
    assert len(errors) == 1 and report.refused in errors[0], errors
    run = report_run(pg_conn, run_id)
    assert run["state"] == "failed" and report.refused in run["error"], run
    assert spark_jobs(spark) == jobs_before, "Spark ran a job for a refused report"
    assert not marker.exists()
    assert table_counts(pg_conn) == sandbox.counts
    assert pg_conn.execute("SELECT to_regclass('reports.adhoc_hostile')").fetchone()[0] is None


def test_the_attacks_are_real_when_spark_runs_them(spark, tmp_path):
    """What the corpus refuses is harmful in Spark 4.2 itself: a shell command runs, a bare `user`
    (in any spelling Java folds) is the account running Spark, reflection reads the JVM."""
    spark.range(1).createOrReplaceTempView("sandbox_attack")
    marker = tmp_path / "marker"
    spark.sql(f"SELECT TRANSFORM(id) USING 'touch {marker}' AS (x) FROM sandbox_attack").collect()
    assert marker.exists()
    assert spark.sql("SELECT user AS a, `u\u017fer` AS b FROM sandbox_attack").first() == (getpass.getuser(),) * 2
    java_home = spark.sql("SELECT reflect('java.lang.System', 'getProperty', 'java.home') AS h "
                          "FROM sandbox_attack").first()["h"]
    assert java_home and os.path.isdir(java_home)


def test_the_views_hide_the_files_behind_them(pg_dsn, pg_conn, sandbox, monkeypatch, caplog):
    """Spark's hidden `_metadata` column (file paths of a file scan) does not reach a report: a
    unified view is a temporary view over a union, which exposes the table's columns only."""
    rc = serve_report(monkeypatch, pg_dsn, sandbox.lake_root, "--sql",
                      f"SELECT o._metadata.file_path AS path FROM {ORDERS} o", "--target", "adhoc_files")
    assert rc == 2
    assert any("the report does not run" in r.getMessage() and "_metadata" in r.getMessage()
               for r in caplog.records if r.levelname == "ERROR")
    assert pg_conn.execute("SELECT to_regclass('reports.adhoc_files')").fetchone()[0] is None


def run_cli(pg_dsn: str, lake_root: str, sql: str, no_java) -> subprocess.CompletedProcess:
    """serve_report.py as the CLI runs it, where no JVM can start (JAVA_HOME has no java)."""
    env = {**os.environ, "COLDHARBOR_PG_DSN": pg_dsn, "PYTHONPATH": str(PROJECT / "jobs"),
           "JAVA_HOME": str(no_java), CANARY_ENV: "canary-value-7f3a"}
    return subprocess.run([sys.executable, str(PROJECT / "jobs" / "serve_report.py"), "--lake-root", lake_root,
                           "--sql", sql, "--target", "adhoc_cli"], env=env, capture_output=True, text=True,
                          timeout=300)


@pytest.mark.parametrize("report_id", ["transform-using-touch", "reflect-getenv", "two-statements", "bare-user"])
def test_the_command_line_refuses_before_a_jvm_starts(pg_dsn, pg_conn, sandbox, report_id, tmp_path):
    no_java = tmp_path / "no-java"
    no_java.mkdir()
    marker = tmp_path / "marker"
    [report] = [r for r in HOSTILE if r.id == report_id]
    done = run_cli(pg_dsn, sandbox.lake_root, fill(report.sql, str(marker)), no_java)
    assert done.returncode == 2, done.stderr[-2000:]
    assert report.refused in done.stderr and "Traceback" not in done.stderr
    assert "canary-value-7f3a" not in done.stdout + done.stderr
    assert not marker.exists() and table_counts(pg_conn) == sandbox.counts
    assert pg_conn.execute("SELECT to_regclass('reports.adhoc_cli')").fetchone()[0] is None
    assert pg_conn.execute("SELECT count(*) FROM coldharbor.report_runs WHERE state = 'running'").fetchone()[0] == 0


def test_an_accepted_report_needs_the_jvm_the_refusals_never_reached(pg_dsn, sandbox, tmp_path):
    """The control of the test above: in the same environment an accepted report fails starting Spark."""
    no_java = tmp_path / "no-java"
    no_java.mkdir()
    done = run_cli(pg_dsn, sandbox.lake_root, f"SELECT count(*) AS n FROM {ORDERS}", no_java)
    assert done.returncode == 1 and "JAVA_GATEWAY_EXITED" in done.stderr, done.stderr[-2000:]

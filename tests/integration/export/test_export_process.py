"""The export job as a real process (spark-submit): crashes by SIGKILL, concurrent runs, bad input."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import pytest
from delta.tables import DeltaTable

from tests.helpers import PROJECT, dirty_ids, export, lake_live, lake_table, pg_rows, spark_submit_export


def make_table(conn, name: str) -> None:
    conn.execute(f"CREATE TABLE {name} (id bigint PRIMARY KEY, v text)")
    conn.execute("SELECT coldharbor.register_table(%s)", (name,))
    conn.execute(f"INSERT INTO {name} SELECT g, 'v' || g FROM generate_series(1, 50) g")


def batch_states(conn, name: str) -> list[tuple[int, str]]:
    return conn.execute("""SELECT b.batch_id, b.state FROM coldharbor.export_batches b
                           JOIN coldharbor.tables t USING (table_id) WHERE t.table_name = %s
                           ORDER BY b.batch_id""", (name,)).fetchall()


def test_crash_after_delta_commit_before_mark_converges_without_duplicates(spark, pg_dsn, pg_conn, table_name,
                                                                           lake_root):
    make_table(pg_conn, table_name)
    crashed = spark_submit_export(pg_dsn, lake_root, "--table", table_name,
                                  env={"COLDHARBOR_CRASH_AT": "after_commit"})
    assert crashed.returncode != 0, crashed.stdout
    assert "fault injection: killing the process at after_commit" in crashed.stdout
    path = f"{lake_root}/public/{table_name}"
    assert DeltaTable.forPath(spark, path).history().count() == 1, "the commit landed before the kill"
    assert len(dirty_ids(pg_conn, table_name)) == 50, "nothing was marked"
    assert batch_states(pg_conn, table_name) == [(1, "pending")]

    pg_conn.execute(f"UPDATE {table_name} SET v = 'after crash' WHERE id = 7")
    result = export(spark, pg_dsn, table_name, lake_root)
    assert result.recovered_batches == 1
    assert batch_states(pg_conn, table_name) == [(1, "flushed"), (2, "flushed")]
    assert result.rows == 1, "the recovered batch was marked, not written again"
    assert lake_table(spark, lake_root, table_name).count() == 51, "no logical duplicate"
    assert lake_live(spark, lake_root, table_name, ["id"]) == pg_rows(pg_conn, f"SELECT id, v FROM {table_name}", ["id"])
    assert dirty_ids(pg_conn, table_name) == []


@pytest.mark.parametrize("point", ["after_read", "after_intent"])
def test_crash_before_the_delta_commit_leaves_everything_dirty(spark, pg_dsn, pg_conn, table_name, lake_root, point):
    make_table(pg_conn, table_name)
    crashed = spark_submit_export(pg_dsn, lake_root, "--table", table_name, env={"COLDHARBOR_CRASH_AT": point})
    assert crashed.returncode != 0
    assert f"killing the process at {point}" in crashed.stdout
    assert len(dirty_ids(pg_conn, table_name)) == 50
    result = export(spark, pg_dsn, table_name, lake_root)
    assert result.status == "exported" and result.rows == 50
    expected_states = [(1, "abandoned"), (2, "flushed")] if point == "after_intent" else [(1, "flushed")]
    assert batch_states(pg_conn, table_name) == expected_states
    assert lake_table(spark, lake_root, table_name).count() == 50
    assert dirty_ids(pg_conn, table_name) == []


def test_two_exporters_at_once_one_skips_nothing_doubled(spark, pg_dsn, pg_conn, table_name, lake_root, tmp_path):
    make_table(pg_conn, table_name)
    first_log = tmp_path / "first.log"
    first = spark_submit_export(pg_dsn, lake_root, "--table", table_name, log_file=first_log,
                                env={"COLDHARBOR_PAUSE_AT": "after_read", "COLDHARBOR_PAUSE_DIR": str(tmp_path)})
    try:
        deadline = time.monotonic() + 300
        while not (tmp_path / "after_read.reached").exists():
            assert first.poll() is None, first_log.read_text()
            assert time.monotonic() < deadline, "the first exporter never reached its read"
            time.sleep(0.2)
        second = spark_submit_export(pg_dsn, lake_root, "--table", table_name)
        assert second.returncode == 0, second.stdout
        assert "skipped public." + table_name + ": another export of this table holds its lock" in second.stdout
    finally:
        (tmp_path / "after_read.resume").write_text("go")
        first.wait(timeout=300)
    assert first.returncode == 0, first_log.read_text()
    assert batch_states(pg_conn, table_name) == [(1, "flushed")]
    assert lake_table(spark, lake_root, table_name).count() == 50
    assert lake_live(spark, lake_root, table_name, ["id"]) == pg_rows(pg_conn, f"SELECT id, v FROM {table_name}", ["id"])


def run_job(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    """The entrypoint with plain Python: the paths that must fail before Spark starts."""
    return subprocess.run([sys.executable, str(PROJECT / "jobs" / "cdc_export.py"), *args],
                          env={"PATH": "/usr/bin:/bin", **env}, capture_output=True, text=True, timeout=120)


def test_help_documents_the_job():
    result = run_job("--help", env={})
    assert result.returncode == 0
    assert "--table" in result.stdout and "COLDHARBOR_PG_DSN" in result.stdout


def test_missing_connection_settings_fail_clearly(lake_root):
    result = run_job("--lake-root", lake_root, env={})
    assert result.returncode == 2
    assert "COLDHARBOR_PG_DSN is not set" in result.stderr


def test_unreachable_postgres_fails_clearly(lake_root):
    from coldharbor.embedded.stack import free_port

    port = free_port()
    result = run_job("--lake-root", lake_root, env={"COLDHARBOR_PG_DSN": f"postgresql://u:p@127.0.0.1:{port}/db"})
    assert result.returncode == 2
    assert f"PostgreSQL at 127.0.0.1:{port}/db is unreachable" in result.stderr
    assert ":p@" not in result.stderr, "the password must not be logged"


def test_unknown_table_fails_clearly(pg_dsn, lake_root):
    result = run_job("--table", "public.nope", "--lake-root", lake_root, env={"COLDHARBOR_PG_DSN": pg_dsn})
    assert result.returncode == 2
    assert "table public.nope is not registered with coldharbor" in result.stderr


def test_nothing_dirty_exits_without_starting_spark(pg_dsn, pg_conn, table_name, lake_root):
    pg_conn.execute(f"CREATE TABLE {table_name} (id bigint PRIMARY KEY)")
    pg_conn.execute("SELECT coldharbor.register_table(%s)", (table_name,))
    result = run_job("--table", table_name, "--lake-root", lake_root, env={"COLDHARBOR_PG_DSN": pg_dsn})
    assert result.returncode == 0, result.stderr
    assert "nothing dirty in 1 registered table(s); no Spark session started" in result.stderr


@pytest.mark.parametrize("name, raw, message", [
    ("COLDHARBOR_SPARK_REMOTE", "sc://127.0.0.1:15002/;session_id=x", "COLDHARBOR_SPARK_REMOTE"),
    ("COLDHARBOR_DRIVER_MEMORY", "2 GB", "is not a JVM memory size"),
    ("COLDHARBOR_EXPORT_WORKERS", "0", "COLDHARBOR_EXPORT_WORKERS must be"),
    # Found by the second cold attack: accepted, or refused per table after a batch's intent.
    ("COLDHARBOR_JDBC_READERS", "x", "COLDHARBOR_JDBC_READERS='x' is not a number of readers"),
    ("COLDHARBOR_BASE_READERS", "0", "COLDHARBOR_BASE_READERS must be"),
    ("COLDHARBOR_LAKE_COMMIT_LOCK", "maybe", "COLDHARBOR_LAKE_COMMIT_LOCK must be auto, on or off"),
    ("COLDHARBOR_REPORT_LEASE_SECONDS", "5", "COLDHARBOR_REPORT_LEASE_SECONDS must be"),
])
def test_a_bad_setting_is_refused_by_a_cycle_with_nothing_dirty_too(pg_dsn, pg_conn, table_name, lake_root,
                                                                      name, raw, message):
    """Found by a cold attack: a malformed COLDHARBOR_SPARK_REMOTE went unnoticed until the first
    cycle with changes to export, and then failed that one."""
    pg_conn.execute(f"CREATE TABLE {table_name} (id bigint PRIMARY KEY)")
    pg_conn.execute("SELECT coldharbor.register_table(%s)", (table_name,))
    result = run_job("--table", table_name, "--lake-root", lake_root, env={"COLDHARBOR_PG_DSN": pg_dsn, name: raw})
    assert result.returncode == 2, result.stderr
    assert message in result.stderr and "Traceback" not in result.stderr


def test_sigkill_is_a_real_kill_not_an_exception():
    """The crash hook ends the process by SIGKILL: no finally block, no cleanup runs."""
    code = ("import os, sys; sys.path.insert(0, 'jobs'); os.environ['COLDHARBOR_CRASH_AT'] = 'x'\n"
            "from coldharbor.runtime import faults\n"
            "try:\n    faults.from_environment('x')\nfinally:\n    print('cleanup ran')")
    result = subprocess.run([sys.executable, "-c", code], cwd=PROJECT, capture_output=True, text=True, timeout=60)
    assert result.returncode == -signal.SIGKILL
    assert "cleanup ran" not in result.stdout

"""The maintenance jobs as production runs them: spark-submit jobs/<job>.py."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.helpers import PROJECT, export, lake_live, pg_rows, spark_submit


@pytest.mark.parametrize("job", ["compact.py", "cleanup.py", "purge.py"])
def test_help_documents_the_job(job):
    out = subprocess.run([sys.executable, str(PROJECT / "jobs" / job), "--help"], capture_output=True, text=True,
                         env={"PYTHONPATH": str(PROJECT / "jobs")}, timeout=120)
    assert out.returncode == 0 and "--lake-root" in out.stdout


def test_compact_then_cleanup_under_spark_submit(spark, pg_dsn, pg_conn, table_name, lake_root):
    pg_conn.execute(f"CREATE TABLE {table_name} (id bigint PRIMARY KEY, v text)")
    pg_conn.execute("SELECT coldharbor.register_table(%s)", (table_name,))
    for i in range(3):
        pg_conn.execute(f"INSERT INTO {table_name} VALUES ({i}, 'a') ON CONFLICT (id) DO UPDATE SET v = 'b'")
        export(spark, pg_dsn, table_name, lake_root)
    compacted = spark_submit("compact.py", pg_dsn, lake_root, "--table", table_name, "--min-small-files", "2")
    assert compacted.returncode == 0, compacted.stdout[-3000:]
    assert "compacted version 2 into 3" in compacted.stdout
    assert lake_live(spark, lake_root, table_name, ["id"]) == pg_rows(pg_conn, f"SELECT * FROM {table_name}", ["id"])
    dry = spark_submit("cleanup.py", pg_dsn, lake_root, "--table", table_name, "--dry-run")
    assert dry.returncode == 0, dry.stdout[-3000:]
    assert "would remove 0 hot rows (evicted)" in dry.stdout
    refused = spark_submit("cleanup.py", pg_dsn, lake_root, "--retention-hours", "1")
    assert refused.returncode == 2 and "--allow-short-retention" in refused.stdout

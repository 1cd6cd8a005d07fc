"""Helpers shared by the integration tests: run an export, read the lake, read PostgreSQL."""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timezone
from decimal import Decimal
from pathlib import Path

import psycopg
from coldharbor.capture import migrate, registry, roles, table_names
from coldharbor.export.table_export import ExportConfig, TableResult, export_table
from coldharbor.lake.lake_rows import live_rows
from coldharbor.runtime import faults, pg

PROJECT = Path(__file__).resolve().parents[1]
SINGLE_DIRECTORY_LAYOUT = PROJECT / "tests" / "corpus" / "sql_single_directory_layout.tar.gz"


def single_directory_layout(below: str = "999") -> migrate.Layout:
    """The migrations numbered below `below` as the single-directory layout of sql/ held them
    (functions included; frozen in tests/corpus): what migrated every database made before
    sql/migrations and sql/definitions, and what such a database is upgraded from."""
    with tarfile.open(SINGLE_DIRECTORY_LAYOUT) as tar:
        files = sorted((m.name, tar.extractfile(m).read().decode()) for m in tar.getmembers() if m.name < below)
    return migrate.Layout(tuple(migrate.Migration(name, sql) for name, sql in files))


def export(spark, dsn: str, name: str, lake_root: str, hook: faults.Hook = lambda point: None) -> TableResult:
    """One in-process export of one table, as the job's run() does it."""
    with pg.connect(dsn) as conn:
        [table] = registry.load(conn, name)
        config = ExportConfig(table=name, lake_root=lake_root, run_id="test")
        return export_table(spark, conn, pg.JdbcTarget.from_dsn(dsn), table, config, hook)


def lake_table(spark, lake_root: str, name: str):
    schema, table = table_names.split_name(name)
    return spark.read.format("delta").load(f"{lake_root}/{schema}/{table}")


def lake_live(spark, lake_root: str, name: str, keys: list[str]) -> dict:
    """The live rows of the lake table (last write per key, no delete markers), keyed by key."""
    rows = lake_table(spark, lake_root, name).transform(live_rows(keys)).collect()
    return {tuple(r[k] for k in keys): {k: _normal(v) for k, v in r.asDict().items()} for r in rows}


def pg_rows(conn: psycopg.Connection, query: str, keys: list[str]) -> dict:
    cur = conn.execute(query)
    names = [d.name for d in cur.description]
    return {tuple(row[names.index(k)] for k in keys): {n: _normal(v) for n, v in zip(names, row)}
            for row in cur.fetchall()}


def _normal(value):
    """One comparable form for values from psycopg and from Spark."""
    if isinstance(value, (bytearray, memoryview)):
        return bytes(value)
    if isinstance(value, datetime) and value.tzinfo is not None:
        return value.astimezone(timezone.utc).replace(tzinfo=None)
    if isinstance(value, Decimal):
        return value.normalize()
    return value


def app_login(admin_dsn: str) -> tuple[str, str]:
    """A new application login (a member of coldharbor_app) with a schema of its own: (name, DSN)."""
    name = f"app_{uuid.uuid4().hex[:8]}"
    password = uuid.uuid4().hex
    with pg.connect(admin_dsn) as admin:
        roles.ensure_app_login(admin, name, password)
        admin.execute(f"CREATE SCHEMA {name} AUTHORIZATION {name}")
    return name, roles.login_dsn(admin_dsn, name, password)


def evict(admin: psycopg.Connection, name: str, where: str) -> None:
    """What hot-tier eviction does, for any rows: delete them without logging a change. Only a
    superuser can (replica mode, in which capture triggers do not fire); `admin` is set-up's login."""
    with admin.transaction():
        admin.execute("SET LOCAL session_replication_role = replica")
        admin.execute(f"DELETE FROM {name} WHERE {where}")


def dirty_ids(conn: psycopg.Connection, name: str) -> list[int]:
    schema, table = table_names.split_name(name)
    return [r[0] for r in conn.execute(
        """SELECT c.id FROM coldharbor.change_log c JOIN coldharbor.tables t USING (table_id)
           WHERE t.schema_name = %s AND t.table_name = %s AND c.flushed_at IS NULL ORDER BY c.id""",
        (schema, table)).fetchall()]


def spark_submit_export(dsn: str, lake_root: str, *args: str, env: dict[str, str] | None = None,
                        log_file: Path | None = None,
                        spark_args: list[str] | None = None) -> subprocess.Popen | subprocess.CompletedProcess:
    return spark_submit("cdc_export.py", dsn, lake_root, *args, env=env, log_file=log_file, spark_args=spark_args)


def spark_submit(job: str, dsn: str, lake_root: str, *args: str, env: dict[str, str] | None = None,
                 log_file: Path | None = None,
                 spark_args: list[str] | None = None) -> subprocess.Popen | subprocess.CompletedProcess:
    """A job as production runs it: spark-submit jobs/<job>.

    spark-submit relays the Python process's output on its stdout: both streams come back merged.
    With `log_file` the job runs in the background writing there (a pipe nobody reads would fill
    up and stall it); otherwise it is waited for.
    """
    from coldharbor.runtime.spark import ivy_dir, maven_packages

    bin_dir = Path(sys.executable).parent
    full_env = {**os.environ, "COLDHARBOR_PG_DSN": dsn, "PATH": f"{bin_dir}:{os.environ['PATH']}",
                "SPARK_LOCAL_IP": "127.0.0.1", **(env or {})}
    with _environment(full_env):  # COLDHARBOR_EXTRA_PACKAGES may be in `env`
        packages = ",".join(maven_packages())
    command = [str(bin_dir / "spark-submit"), "--master", "local[1]",
               "--packages", packages, "--conf", f"spark.jars.ivy={ivy_dir()}",
               "--conf", "spark.ui.enabled=false", *(spark_args or []), str(PROJECT / "jobs" / job),
               "--lake-root", lake_root, *args]
    if log_file is None:
        return subprocess.run(command, env=full_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              timeout=600)
    with open(log_file, "w") as out:
        return subprocess.Popen(command, env=full_env, stdout=out, stderr=subprocess.STDOUT)


@contextmanager
def _environment(values: dict[str, str]) -> Iterator[None]:
    saved = dict(os.environ)
    os.environ.update(values)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


def serve_report(monkeypatch, dsn: str, lake_root: str, *args: str) -> int:
    """serve_report.py's main() in this process (it reuses the test session's SparkSession)."""
    from coldharbor.serve import serve_cli

    monkeypatch.setenv("COLDHARBOR_PG_DSN", dsn)
    return serve_cli.main(["--lake-root", lake_root, *args])


def report_run(conn: psycopg.Connection, run_id: str) -> dict:
    cur = conn.execute("SELECT * FROM coldharbor.report_runs WHERE run_id = %s", (run_id,))
    row = cur.fetchone()
    return dict(zip([d.name for d in cur.description], row)) if row else {}


@contextmanager
def server_with_orders(folder: Path, rows: int, **server_settings: str) -> Iterator[tuple]:
    """(server, the jobs' DSN) of a PostgreSQL of the test's own (to stop, restart, or start with
    other settings) holding public.orders (id bigint key, v text) registered, with `rows` rows."""
    from coldharbor.embedded.stack import throwaway

    with throwaway(folder, **server_settings) as (server, logins):
        with pg.connect(logins.admin) as conn:
            conn.execute("CREATE TABLE orders (id bigint PRIMARY KEY, v text)")
            conn.execute("SELECT coldharbor.register_table('public.orders')")
            conn.execute("INSERT INTO orders SELECT g, 'v' FROM generate_series(1, %s) g", (rows,))
        yield server, logins.pipeline


def wait_until_locks_released(conn: psycopg.Connection, timeout_s: float = 60) -> None:
    """Waits until no other session holds an advisory lock: a job killed by SIGKILL leaves its
    PostgreSQL backend to notice the closed socket, and until it has, the job's lock is held and the
    next run would skip as if a run were going on."""
    import time

    deadline = time.monotonic() + timeout_s
    while conn.execute("""SELECT count(*) FROM pg_locks
                           WHERE locktype = 'advisory' AND granted AND pid <> pg_backend_pid()""").fetchone()[0]:
        assert time.monotonic() < deadline, "a killed job's advisory lock was never released"
        time.sleep(0.2)


def wait_until_paused(pause_dir: Path, point: str, process: subprocess.Popen, timeout_s: float = 300) -> None:
    """Waits until a job started with COLDHARBOR_PAUSE_AT=<point> reaches it (fails if it ends first)."""
    import time

    deadline = time.monotonic() + timeout_s
    while not (pause_dir / f"{point}.reached").exists():
        assert process.poll() is None, f"the job ended before reaching {point}"
        assert time.monotonic() < deadline, f"the job did not reach {point}"
        time.sleep(0.2)


def connect_session(url: str):
    """A client session of the Connect server at `url` (PySpark's Connect builder: a classic
    session in this process does not stand in its way)."""
    from pyspark.sql.connect.session import SparkSession

    return SparkSession.builder.remote(url).create()

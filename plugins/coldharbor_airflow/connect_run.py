"""Which Spark a job runs on, decided in one place from the configured Spark connection, and how a
job runs in the worker's own process as a Spark Connect client.

| the Spark connection's type | a job runs |
|---|---|
| `spark_connect` (sc://host:port) | in the Airflow worker's process: the job's `main(argv)`, its session a thin client of that server (COLDHARBOR_SPARK_REMOTE) |
| `spark` (local[N], spark://, yarn, k8s://) | under spark-submit, a JVM of its own (ColdharborSparkJobOperator's classic path) |
"""

from __future__ import annotations

import os
import runpy
import socket
import sys
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import urlparse

from airflow.providers.apache.spark.hooks.spark_connect import SparkConnectHook
from airflow.sdk import BaseHook, Connection, Variable
from airflow.sdk.exceptions import AirflowException, AirflowNotFoundException

from coldharbor_airflow.dsn_delivery import PG_DSN_FILE_ENV, write_dsn_file
from coldharbor_airflow.paths import JOBS_DIR, import_jobs_package

# The Airflow Variable naming the Spark connection every Coldharbor job uses (`make run` sets it to
# its Spark Connect server's connection); without it, `spark_default`.
SPARK_CONN_VARIABLE = "coldharbor_spark_conn_id"
DEFAULT_SPARK_CONN_ID = "spark_default"
# What a job's get_session connects to when it is set (jobs/coldharbor/runtime/spark.py).
SPARK_REMOTE_ENV = "COLDHARBOR_SPARK_REMOTE"
DEFAULT_CONNECT_PORT = 15002


def resolve_spark_conn_id(explicit: str | None = None) -> str:
    """The operator's spark_conn_id, else the Variable coldharbor_spark_conn_id, else spark_default."""
    return explicit or Variable.get(SPARK_CONN_VARIABLE, default=None) or DEFAULT_SPARK_CONN_ID


def spark_connection(conn_id: str) -> Connection:
    """The Spark connection, or a clear error: without it the provider would silently submit to YARN."""
    try:
        return BaseHook.get_connection(conn_id)
    except AirflowNotFoundException:
        raise AirflowException(
            f"the Spark connection {conn_id!r} is not defined: create it (Admin > Connections, or "
            f"AIRFLOW_CONN_{conn_id.upper()}='{{\"conn_type\": \"spark\", \"host\": \"local[2]\", "
            "\"extra\": {\"deploy-mode\": \"client\"}}', or a Spark Connect server: '{\"conn_type\": "
            "\"spark_connect\", \"host\": \"127.0.0.1\", \"port\": 15002}'); nothing was submitted") from None


def runs_on_connect(conn: Connection) -> bool:
    """The one decision: a `spark_connect` connection runs jobs as Connect clients in the worker;
    any other Spark connection runs them under spark-submit."""
    return conn.conn_type == SparkConnectHook.conn_type


def engine_connection(conn_id: str | None = None) -> Connection:
    return spark_connection(resolve_spark_conn_id(conn_id))


def connect_url(conn: Connection) -> str:
    """sc://host:port/[;user_id=..;token=..] as the provider builds it (the token stays out of logs)."""
    return SparkConnectHook(conn.conn_id).get_connection_url()


def check_connect_reachable(url: str, timeout_s: float = 5.0) -> None:
    """The server must accept a TCP connection; otherwise the client would retry for minutes."""
    address = urlparse(url)
    host, port = address.hostname, address.port or DEFAULT_CONNECT_PORT
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return
    except OSError as exc:
        raise AirflowException(f"the Spark Connect server sc://{host}:{port} is unreachable ({exc}); nothing "
                               "was run") from None


def job_main(job: str) -> Callable[[list[str]], int]:
    """The `main` of jobs/<job>, loaded as spark-submit would load the file (not as __main__:
    loading runs nothing)."""
    import_jobs_package()
    return runpy.run_path(str(JOBS_DIR / job), run_name="coldharbor_job")["main"]


@contextmanager
def job_environment(values: dict[str, str]) -> Iterator[None]:
    """os.environ with `values` for the block, then exactly as it was: the worker's process may run
    the next task (dag.test does), and PySpark leaves markers of its own (SPARK_CONNECT_MODE_ENABLED)."""
    saved = dict(os.environ)
    os.environ.update(values)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


def run_as_connect_client(main: Callable[[list[str]], int], argv: list[str], url: str, dsn: str) -> int:
    """Runs a job's main(argv) here with its session on the Connect server at `url`; returns its exit
    code. The DSN reaches it in a file of this run (mode 0600, removed afterwards), as under
    spark-submit; the Connect session the job made is released on the server when it ends, however
    it ends (PySpark makes a new session the active or default one only when there is none: a
    worker's process has none; a session that was there before is left alone)."""
    before = current_connect_session()
    with tempfile.TemporaryDirectory(prefix="coldharbor-run-") as folder:
        dsn_file = write_dsn_file(Path(folder), dsn)
        with job_environment({SPARK_REMOTE_ENV: url, PG_DSN_FILE_ENV: str(dsn_file)}):
            try:
                return main(argv) or 0
            except SystemExit as exc:  # argparse's usage errors, sys.exit() in a job
                return 0 if exc.code is None else exc.code if isinstance(exc.code, int) else 1
            finally:
                session = current_connect_session()
                if session is not None and session is not before:
                    session.stop()  # released on the server: its views and settings go, its work is interrupted


def current_connect_session():
    """The Spark Connect session a job made here: this thread's, else the process's default (a
    job's worker thread made it), or None. PySpark's Connect client is imported only by a job that
    used it."""
    module = sys.modules.get("pyspark.sql.connect.session")
    if module is None:
        return None
    from pyspark.errors import PySparkRuntimeError

    try:
        return module.SparkSession.active()
    except PySparkRuntimeError:  # NO_ACTIVE_OR_DEFAULT_SESSION
        return None


def interrupt_connect_session() -> None:
    """Interrupts every operation of the job's session on the server (a killed task's work must not
    outlive it: its locks in PostgreSQL end with its process)."""
    session = current_connect_session()
    if session is not None:
        session.interruptAll()

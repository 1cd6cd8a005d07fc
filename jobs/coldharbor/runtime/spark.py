"""The SparkSession every job uses: Delta enabled, UTC, jars resolved from Maven Central once.

A job runs on a classic session (spark-submit, or plain `python` starting its own JVM) or, when
COLDHARBOR_SPARK_REMOTE names a Spark Connect server (`sc://127.0.0.1:15002`), as a thin client
of that long-lived server: the same DataFrame/SQL code either way.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

from coldharbor.runtime import settings
from coldharbor.runtime.errors import SparkUnavailableError
from coldharbor.runtime.jvm_locale import jvm_environment
from coldharbor.runtime.spark_errors import first_line, lost_spark

# Settings a session may change for itself: every job sets them on its own session, so a Connect
# server started by anyone gives each job the same behaviour.
SESSION_CONF = {
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.shuffle.partitions": os.environ.get("COLDHARBOR_SHUFFLE_PARTITIONS", "4"),
    # Reports must not read arbitrary files from SQL (SELECT * FROM parquet.`/etc/...`).
    "spark.sql.runSQLOnFiles": "false",
    # ...nor substitute ${var}, ${system:...} or ${env:...} into SQL text after it was checked.
    "spark.sql.variable.substitute": "false",
    "spark.databricks.delta.schema.autoMerge.enabled": "false",
    # Delta rebuilds table state (for txnVersion checks) in this many tasks; its default of 50
    # turns a per-minute export into seconds of task overhead on a small machine.
    "spark.databricks.delta.snapshotPartitions": os.environ.get("COLDHARBOR_DELTA_SNAPSHOT_PARTITIONS", "2"),
    # VACUUM lists the table's folders in this many tasks; the default of 10,000 makes it minutes
    # of task overhead even for a table of one folder.
    "spark.sql.sources.parallelPartitionDiscovery.parallelism":
        os.environ.get("COLDHARBOR_LISTING_PARALLELISM", "8"),
}

# Settings fixed when the JVM starts: spark-submit's (or the Connect server's launch) conf.
SERVER_CONF = {
    "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
    "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
    "spark.driver.extraJavaOptions": "-Duser.timezone=UTC",
    "spark.executor.extraJavaOptions": "-Duser.timezone=UTC",
    "spark.ui.enabled": "false",
    # The driver's heap (local mode: the executors' too). Spark's 1g filled up in a long-lived engine
    # (the test suite's, after ~1,000 tests) until a broadcast of a few rows failed for memory.
    "spark.driver.memory": os.environ.get(settings.DRIVER_MEMORY_ENV, "2g"),
    # Without the UI, nothing reads the status store's history of jobs, stages and SQL executions
    # (each with its plan's metrics); a warm engine kept 1,000 of each for good.
    "spark.sql.ui.retainedExecutions": "50",
    "spark.ui.retainedJobs": "100",
    "spark.ui.retainedStages": "100",
    "spark.ui.retainedTasks": "10000",
}

# Knobs with their defaults; each can be overridden by spark-submit --conf or the environment.
DEFAULT_CONF = {**SERVER_CONF, **SESSION_CONF}

REMOTE_ENV = settings.SPARK_REMOTE_ENV
CONNECT_SERVER_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"


def maven_packages() -> list[str]:
    """Delta for this PySpark's major.minor, the PostgreSQL JDBC driver, and any extra packages
    (hadoop-aws for an s3a:// lake)."""
    import pyspark

    spark_minor = ".".join(pyspark.__version__.split(".")[:2])
    return [
        f"io.delta:delta-spark_{spark_minor}_{settings.SCALA_BINARY_VERSION}:{settings.DELTA_JAR_VERSION}",
        f"org.postgresql:postgresql:{settings.POSTGRES_JDBC_VERSION}",
        *settings.extra_packages(),
    ]


def ivy_dir() -> str:
    """Where resolved jars are cached: set-up fills it once so scheduled runs never download."""
    return os.environ.get("COLDHARBOR_IVY_DIR", str(settings.DATA_DIR / "ivy"))


def session_conf(master: str | None = None) -> dict[str, str]:
    settings.check_spark_settings()
    conf = dict(DEFAULT_CONF)
    conf["spark.jars.packages"] = ",".join(maven_packages())
    conf["spark.jars.ivy"] = ivy_dir()
    if master:
        conf["spark.master"] = master
    return conf


def connect_server_command(port: int, master: str = "local[2]", host: str = "127.0.0.1",
                           extra_conf: Mapping[str, str] | None = None) -> list[str]:
    """The spark-submit argv that starts a Spark Connect server the jobs can use: Delta, the JDBC
    driver and every setting of `session_conf` (the session ones become each session's defaults),
    listening on host:port only. `extra_conf` adds settings (the s3a ones for a lake on S3), never
    the address or port (a --conf spark.connect.grpc.binding.address=0.0.0.0 listened everywhere).
    Run it with SPARK_LOCAL_IP set and this environment's bin first on PATH (its Python runs the
    server's Python workers)."""
    conf = {k: v for k, v in session_conf().items() if k != "spark.jars.packages"}
    conf.update({**(extra_conf or {}),
                 "spark.connect.grpc.binding.address": host, "spark.connect.grpc.binding.port": str(port)})
    command = [spark_submit(), "--class", CONNECT_SERVER_CLASS, "--master", master,
               "--packages", ",".join(maven_packages())]
    for key, value in conf.items():
        command += ["--conf", f"{key}={value}"]
    return [*command, "spark-internal"]


def spark_submit() -> str:
    """spark-submit of the PySpark installed beside this Python (the one its jars match)."""
    beside = Path(sys.executable).parent / "spark-submit"
    return str(beside) if beside.exists() else "spark-submit"


@contextmanager
def temporary_conf(spark, values: dict[str, str]) -> Iterator[None]:
    """Session settings for the duration of one block, restored (or unset) afterwards."""
    previous = {key: spark.conf.get(key, None) for key in values}
    try:
        for key, value in values.items():
            spark.conf.set(key, value)
        yield
    finally:
        for key, value in previous.items():
            if value is None:
                spark.conf.unset(key)
            else:
                spark.conf.set(key, value)


def get_session(app_name: str):
    """The job's session. With COLDHARBOR_SPARK_REMOTE, a new session of its own on that Spark
    Connect server (its temp views, settings and checkpoints are its own). Under spark-submit the
    submitted conf wins and only missing keys are filled in; run directly (tests, `python
    jobs/x.py`) it starts `COLDHARBOR_SPARK_MASTER`.
    """
    url = settings.spark_remote()
    if url is not None:
        spark = connect_session(url, app_name)
        _opened.__dict__.setdefault("sessions", []).append(spark)
        return spark
    from pyspark import SparkConf
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.appName(app_name)
    if "PYSPARK_GATEWAY_PORT" in os.environ:  # launched by spark-submit
        from pyspark import SparkContext

        # Connect to spark-submit's JVM first: a SparkConf made before that is an empty Python dict,
        # and every default below would then override what was submitted (spark.ui.enabled, ...).
        SparkContext._ensure_initialized()
        submitted = SparkConf()
        conf = {k: v for k, v in session_conf().items() if not submitted.contains(k)}
    else:
        conf = session_conf(os.environ.get("COLDHARBOR_SPARK_MASTER", "local[2]"))
        # The JVM PySpark starts now inherits this process's environment.
        os.environ.update(jvm_environment(os.environ))
    for key, value in conf.items():
        builder = builder.config(key, value)
    return builder.getOrCreate()


def sibling_session(spark, app_name: str):
    """A session of its own for a worker thread of a job that runs work in parallel (temp views,
    settings and checkpoints apart from `spark`'s): on Spark Connect a new session on the same
    server, which the thread releases with release_sessions(); classic, spark.newSession() on the
    same SparkContext, with `spark`'s values of the session settings (a new classic session starts
    from the SparkContext's conf, which lacks them when the context was made elsewhere)."""
    if is_connect(spark):
        return get_session(app_name)
    sibling = spark.newSession()
    for key in SESSION_CONF:
        value = spark.conf.get(key, None)
        if value is not None:
            sibling.conf.set(key, value)
    return sibling


# The Connect sessions get_session opened, per thread, until release_sessions().
_opened = threading.local()


def release_sessions() -> None:
    """Releases the Spark Connect sessions this thread opened with get_session: the server drops
    their temp views, settings and checkpoints now rather than after its idle timeout. Best effort,
    without retrying: the server may be the thing that was lost."""
    from pyspark.sql.connect.client.retries import DefaultPolicy

    sessions, _opened.sessions = _opened.__dict__.get("sessions", []), []
    for spark in sessions:
        spark.client.set_retry_policies([DefaultPolicy(max_retries=0)])
        spark.stop()


def connect_session(url: str, app_name: str):
    """A new Spark Connect session on the server at `url`, with the jobs' session settings; an
    unreachable server is a SparkUnavailableError after at most COLDHARBOR_SPARK_REMOTE_WAIT_SECONDS."""
    # Delta's commit conflicts then arrive as delta.exceptions classes (lake.delta.CONFLICTS); imported
    # here, not with the lake: it loads the whole Connect client (1.3 s), which classic jobs never need.
    import delta.connect.exceptions  # noqa: F401
    from pyspark.sql import SparkSession
    from pyspark.sql.connect.client.retries import DefaultPolicy

    wait_s = settings.spark_remote_wait_seconds()
    settings.check_spark_settings()
    # The job's name travels as the client's user agent (the server's log and UI show it).
    named = url if "user_agent=" in url else f"{url.rstrip('/')}{';' if '/;' in url else '/;'}user_agent={app_name}"
    # PySpark's own builder (not the Connect module's) also switches pyspark.sql.functions and the
    # other shared entry points to their Connect forms for this process.
    spark = SparkSession.builder.remote(named).create()
    spark.client.set_retry_policies([DefaultPolicy(**_retry_budget(wait_s))])
    try:
        for key, value in SESSION_CONF.items():
            spark.conf.set(key, value)
    except Exception as exc:
        try:
            spark.client.set_retry_policies([DefaultPolicy(max_retries=0)])
            spark.stop()  # the server drops it now, not after its idle timeout
        except Exception:  # noqa: BLE001 - best effort; the refusal below is what is reported
            pass
        raise lost_spark(exc) or SparkUnavailableError(
            f"the Spark Connect server at {settings.shown_remote(url)} refused the session: {first_line(exc)}"
        ) from exc
    return spark


def _retry_budget(wait_s: float) -> dict[str, float | int]:
    """DefaultPolicy arguments whose backoffs (0.2 s doubling up to 2 s) add up to about `wait_s`."""
    retries, total, backoff = 0, 0.0, 0.2
    while total + backoff <= wait_s:
        total += backoff
        retries += 1
        backoff = min(backoff * 2, 2.0)
    return {"max_retries": retries, "initial_backoff": 200, "backoff_multiplier": 2.0, "max_backoff": 2000,
            "jitter": 0, "min_jitter_threshold": 2000}


def local_checkpoint(rows, eager: bool):
    """`rows.localCheckpoint(eager)`, bound to the session `rows` belong to.

    PySpark's Connect client gives the DataFrame a checkpoint returns to the thread's active
    session, which stays the first session the thread opened: in a process with several sessions
    (tests, a worker running jobs in-process) the checkpoint of a later one was then looked for in
    the first one (DATAFRAME_NOT_FOUND), or released there. The session of `rows` is made the
    thread's active one for the call; a classic session has no such step."""
    holder = getattr(type(rows.sparkSession), "_active_session", None)  # a Connect session's thread-local
    if holder is None:
        return rows.localCheckpoint(eager)
    previous = getattr(holder, "session", None)
    holder.session = rows.sparkSession
    try:
        return rows.localCheckpoint(eager)
    finally:
        holder.session = previous


def interrupt_sessions(sessions) -> None:
    """Best effort: stops what `sessions` run in Spark now (a Connect session's operations; a
    classic session's jobs, which are its SparkContext's). For a job being stopped, whose own
    failure is what gets reported."""
    for session in sessions:
        try:
            if is_connect(session):
                session.interruptAll()
            else:
                session.sparkContext.cancelAllJobs()
        except Exception:  # noqa: BLE001 - the server may be the thing that was lost
            continue


def is_connect(session) -> bool:
    """Whether `session` is a Spark Connect client's session (else a classic one)."""
    return type(session).__module__.startswith("pyspark.sql.connect")

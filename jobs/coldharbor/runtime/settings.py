"""Settings that come from the environment, each with its documented default.

Secrets (the PostgreSQL DSN) have no default: a missing one fails loudly.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from pathlib import Path

from coldharbor.runtime.errors import ConfigError

PG_DSN_ENV = "COLDHARBOR_PG_DSN"               # the jobs' login: coldharbor_pipeline, never a superuser
# A file holding the DSN (the Airflow operator writes one per run, mode 0600); it wins over PG_DSN_ENV.
PG_DSN_FILE_ENV = "COLDHARBOR_PG_DSN_FILE"
ADMIN_PG_DSN_ENV = "COLDHARBOR_ADMIN_PG_DSN"   # set-up only (migrations, demo): a superuser or an admin
PIPELINE_PASSWORD_ENV = "COLDHARBOR_PIPELINE_PASSWORD"   # set-up sets coldharbor_pipeline's password from it
LAKE_ROOT_ENV = "COLDHARBOR_LAKE_ROOT"

PROJECT_DIR = Path(__file__).resolve().parents[3]
# Where the embedded stack keeps PostgreSQL's data, the lake and the Spark jar cache.
DATA_DIR = Path(os.environ.get("COLDHARBOR_DATA_DIR", PROJECT_DIR / "data"))

# Delta's jar for Spark 4.2: Maven Central holds delta-spark_4.2_2.13 up to 4.4.0, the release the
# delta-spark 4.4.1 Python package drives (its Python API is unchanged between the two).
DELTA_JAR_VERSION = os.environ.get("COLDHARBOR_DELTA_JAR_VERSION", "4.4.0")
POSTGRES_JDBC_VERSION = os.environ.get("COLDHARBOR_PG_JDBC_VERSION", "42.7.8")
SCALA_BINARY_VERSION = "2.13"
EXTRA_PACKAGES_ENV = "COLDHARBOR_EXTRA_PACKAGES"


def extra_packages() -> list[str]:
    """More Maven coordinates for spark.jars.packages, comma-separated in COLDHARBOR_EXTRA_PACKAGES:
    for a lake on S3, org.apache.hadoop:hadoop-aws at the version of PySpark's Hadoop client (3.5.0
    for PySpark 4.2). Set-up fetches them with the others."""
    raw = os.environ.get(EXTRA_PACKAGES_ENV, "")
    packages = [p.strip() for p in raw.split(",") if p.strip()]
    for package in packages:
        if len(package.split(":")) != 3 or not all(package.split(":")):
            raise ConfigError(f"{EXTRA_PACKAGES_ENV}: {package!r} is not a Maven coordinate group:artifact:version")
    return packages


def require_env(name: str) -> str:
    """The value of a required environment variable, or a ConfigError naming it."""
    value = os.environ.get(name)
    if not value:
        raise ConfigError(f"{name} is not set: it must hold the setting (see README, 'Configuration')")
    return value


def pg_dsn() -> str:
    """The hot tier's libpq connection string (URL or key=value form), as the jobs' role: the content of the file
    COLDHARBOR_PG_DSN_FILE names when it is set, else COLDHARBOR_PG_DSN. A file keeps the password
    out of the job's environment and command line; an unreadable or empty one is a ConfigError."""
    path = os.environ.get(PG_DSN_FILE_ENV)
    if not path:
        return require_env(PG_DSN_ENV)
    try:
        dsn = Path(path).read_text(encoding="utf-8").strip()
    except OSError as exc:
        raise ConfigError(f"{PG_DSN_FILE_ENV}: cannot read the DSN file {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{PG_DSN_FILE_ENV}: the DSN file {path} is not UTF-8 text") from None
    if not dsn:
        raise ConfigError(f"{PG_DSN_FILE_ENV}: the DSN file {path} is empty")
    return dsn


def admin_pg_dsn() -> str:
    """The set-up connection string (migrations, the demo): never given to a job."""
    return require_env(ADMIN_PG_DSN_ENV)


def lake_root(explicit: str | None = None) -> str:
    """The folder or URI under which registered tables without a lake location live."""
    root = explicit or os.environ.get(LAKE_ROOT_ENV)
    if not root:
        raise ConfigError(f"no lake root: pass --lake-root or set {LAKE_ROOT_ENV}")
    return root.rstrip("/")


LAKE_COMMIT_LOCK_ENV = "COLDHARBOR_LAKE_COMMIT_LOCK"
# Stores whose Hadoop file system cannot create a file only-if-absent across processes.
STORES_WITHOUT_EXCLUSIVE_CREATE = ("s3://", "s3a://", "s3n://")


def lake_commit_lock_needed(path: str) -> bool:
    """Whether lake commits to `path` must be serialized through PostgreSQL: `auto` (the default)
    for S3 paths, `on` always, `off` never."""
    mode = os.environ.get(LAKE_COMMIT_LOCK_ENV, "auto").lower()
    if mode not in ("auto", "on", "off"):
        raise ConfigError(f"{LAKE_COMMIT_LOCK_ENV} must be auto, on or off, not {mode!r}")
    if mode == "auto":
        return path.lower().startswith(STORES_WITHOUT_EXCLUSIVE_CREATE)
    return mode == "on"


HISTORY_WINDOW_ENV = "COLDHARBOR_HISTORY_WINDOW_HOURS"
# How far back as-of reports may ask; compaction keeps every version inside it.
DEFAULT_HISTORY_WINDOW_HOURS = 168.0
REPORTS_DIR = Path(os.environ.get("COLDHARBOR_REPORTS_DIR", PROJECT_DIR / "sql" / "reports"))


def reports_dir() -> Path:
    """The report files' folder as the environment says now (the Airflow worker checks a report in
    its own long-lived process, whose environment can change after this module was imported)."""
    return Path(os.environ.get("COLDHARBOR_REPORTS_DIR", PROJECT_DIR / "sql" / "reports"))


def history_window_hours() -> float:
    return number_setting(HISTORY_WINDOW_ENV, DEFAULT_HISTORY_WINDOW_HOURS, "hours", lambda hours: hours > 0,
                          "a positive number of hours")


# A number setting as written: ASCII digits, and a fraction after a point.
DECIMAL = re.compile(r"[0-9]+(?:\.[0-9]+)?")


def number_setting(name: str, default: float, unit: str, accept: Callable[[float], bool], rule: str) -> float:
    """The environment's number `name`, or `default` when unset; ConfigError naming it when it is not
    a number of `unit`, or one `accept` refuses (`rule` says which are accepted)."""
    raw = os.environ.get(name)
    if raw is None:
        return default
    if not DECIMAL.fullmatch(raw):  # not float(): it takes '1_0', '٣', ' 3 ', 'nan' and '1e3'
        raise ConfigError(f"{name}={raw!r} is not a number of {unit}")
    value = float(raw)
    if not accept(value):
        raise ConfigError(f"{name} must be {rule}, not {raw!r}")
    return value


SPARK_REMOTE_ENV = "COLDHARBOR_SPARK_REMOTE"
SPARK_REMOTE_WAIT_ENV = "COLDHARBOR_SPARK_REMOTE_WAIT_SECONDS"
# How long a Connect client keeps retrying an unreachable server before the job fails (one line,
# exit 2): a scheduled job fails fast and is retried by its scheduler rather than hanging.
DEFAULT_SPARK_REMOTE_WAIT_S = 15.0
JDBC_READERS_ENV = "COLDHARBOR_JDBC_READERS"
BASE_READERS_ENV = "COLDHARBOR_BASE_READERS"
EXPORT_WORKERS_ENV = "COLDHARBOR_EXPORT_WORKERS"
# An export cycle's tables in parallel by default: at most this many, and no more than Spark's cores.
DEFAULT_MAX_EXPORT_WORKERS = 4


def spark_remote() -> str | None:
    """The Spark Connect server the jobs use (COLDHARBOR_SPARK_REMOTE), or None: a classic session."""
    url = os.environ.get(SPARK_REMOTE_ENV, "").strip()
    if not url:
        return None
    match = _REMOTE.fullmatch(url)
    if not match or not 0 < int(match["port"] or 15002) < 65536:
        raise ConfigError(f"{SPARK_REMOTE_ENV} must be a Spark Connect URL such as sc://127.0.0.1:15002 "
                          f"(sc://host[:port][/;name=value...]), not {shown_remote(url)!r}")
    params = dict(param.split("=", 1) for param in match["params"].split(";")[1:])
    for name, value in params.items():
        if name not in REMOTE_PARAMS or (name == "use_ssl" and value.lower() not in ("true", "false")):
            shown = "***" if name == "token" else value
            raise ConfigError(f"{SPARK_REMOTE_ENV}: {name}={shown!r} is not allowed in the URL (only "
                              f"{', '.join(REMOTE_PARAMS)}; use_ssl true or false; every run opens its own sessions)")
    if "token" in params and params.get("use_ssl", "true").lower() == "false":
        raise ConfigError(f"{SPARK_REMOTE_ENV}: a token is only ever sent over TLS (Spark Connect's client), so "
                          "use_ssl=false cannot go with it")
    return url


def shown_remote(url: str) -> str:
    """A Spark Connect URL as a message may show it: its token's value hidden."""
    return re.sub(r"(;token=)[^;]*", r"\1***", url)


# sc://host[:port][/][;name=value]...: a host name, an IPv4 address or a bracketed IPv6 one.
_REMOTE = re.compile(r"sc://(?:\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9](?:[A-Za-z0-9.-]*[A-Za-z0-9])?)(?::(?P<port>[0-9]{1,5}))?"
                     r"/?(?P<params>(?:;[A-Za-z_]+=[^;]*)*)")
# The URL parameters a job passes on (the Spark provider's connection writes user_id and token);
# never session_id: a run's workers open sessions of their own, and one shared would be closed
# under the others by the first to finish.
REMOTE_PARAMS = ("token", "use_ssl", "user_agent", "user_id")


def spark_remote_wait_seconds() -> float:
    return number_setting(SPARK_REMOTE_WAIT_ENV, DEFAULT_SPARK_REMOTE_WAIT_S, "seconds",
                          lambda seconds: 0 <= seconds <= 3600, "between 0 and 3600 seconds")


# Spark settings the environment tunes (read by coldharbor.runtime.spark when it is imported), checked
# before a session or server starts: a bad one made a JVM that never started, which the engine's
# supervisor then started again for good.
SPARK_TASK_SETTINGS = ("COLDHARBOR_SHUFFLE_PARTITIONS", "COLDHARBOR_DELTA_SNAPSHOT_PARTITIONS",
                       "COLDHARBOR_LISTING_PARALLELISM")
DRIVER_MEMORY_ENV = "COLDHARBOR_DRIVER_MEMORY"
JVM_SIZE = re.compile(r"[1-9][0-9]{0,6}[kmgt]", re.IGNORECASE)  # a JVM size with its unit: 2g, 1536m


def check_spark_settings() -> None:
    """ConfigError naming the first of the Spark settings above that is malformed."""
    for name in SPARK_TASK_SETTINGS:
        number_setting(name, 1, "tasks", lambda n: n == int(n) and 1 <= n <= 100_000,
                       "a whole number from 1 to 100000")
    memory = os.environ.get(DRIVER_MEMORY_ENV)
    if memory is not None and not JVM_SIZE.fullmatch(memory):
        raise ConfigError(f"{DRIVER_MEMORY_ENV}={memory!r} is not a JVM memory size such as 2g or 1536m")


def jdbc_readers() -> int | None:
    """COLDHARBOR_JDBC_READERS: the JDBC readers of one PostgreSQL read, or None (Spark's default
    parallelism)."""
    readers = number_setting(JDBC_READERS_ENV, 0, "readers", lambda n: n in range(1, 1025),
                             "a whole number from 1 to 1024")
    return int(readers) or None


def base_readers() -> int | None:
    """COLDHARBOR_BASE_READERS: the JDBC readers of a base (an initial load, a rebase, a resync), or
    None (one fewer than the cores: `spark_parallelism.base_parallelism`)."""
    readers = number_setting(BASE_READERS_ENV, 0, "readers", lambda n: n in range(1, 1025),
                             "a whole number from 1 to 1024")
    return int(readers) or None


def export_workers() -> int | None:
    """COLDHARBOR_EXPORT_WORKERS: how many tables one export cycle exports at once, or None (Spark's
    default parallelism, at most DEFAULT_MAX_EXPORT_WORKERS: `export.workers.worker_count`)."""
    workers = number_setting(EXPORT_WORKERS_ENV, 0, "workers", lambda n: n in range(1, 65),
                             "a whole number from 1 to 64")
    return int(workers) or None


REPORT_LEASE_ENV = "COLDHARBOR_REPORT_LEASE_SECONDS"
# How soon PostgreSQL drops the session (and with it the lease) of a report run whose client
# vanished without closing its connection (a lost host or network): its TCP keepalive budget.
DEFAULT_REPORT_LEASE_SECONDS = 120


def report_lease_seconds() -> int:
    raw = os.environ.get(REPORT_LEASE_ENV)
    if raw is None:
        return DEFAULT_REPORT_LEASE_SECONDS
    if not (raw.strip().isascii() and raw.strip().isdigit() and int(raw) >= 10):
        raise ConfigError(f"{REPORT_LEASE_ENV} must be a whole number of seconds, at least 10, not {raw!r}")
    return int(raw)


def check_settings() -> None:
    """Every COLDHARBOR_* setting a job reads from the environment, checked before any job starts
    (job_main.run_job): a malformed one is one ConfigError naming it, in every job and whether or
    not this run would have read it (a bad reader count went unnoticed until a big dirty set, a bad
    commit-lock mode until after a batch's intent was recorded)."""
    spark_remote()
    spark_remote_wait_seconds()
    check_spark_settings()
    jdbc_readers()
    base_readers()
    export_workers()
    lake_commit_lock_needed("")
    history_window_hours()
    report_lease_seconds()
    extra_packages()

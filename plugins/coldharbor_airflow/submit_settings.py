"""What the operator works out around a spark-submit, each from one source: the master URL (the
provider hook's rules), the connection's Spark conf, the lake root (argument, Airflow Variable,
environment), whether the master answers before anything is submitted, the jobs package zip shipped
with --py-files, and the exit code spark-submit ended with."""

from __future__ import annotations

import os
import socket
import zipfile
from pathlib import Path

from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook
from airflow.sdk import Connection, Variable
from airflow.sdk.exceptions import AirflowException

from coldharbor_airflow.paths import JOBS_DIR

LAKE_ROOT_VARIABLE = "coldharbor_lake_root"


def submit_exit_code(hook: SparkSubmitHook | None) -> int | None:
    """The exit code of the spark-submit the provider's hook ran (its process, which the hook keeps;
    in Kubernetes cluster mode the driver's, which the hook read from the pod's log), or None when
    it ran none.

    :param hook: the hook of the operator's last submit (`SparkSubmitOperator._hook`)
    """
    process = getattr(hook, "_submit_sp", None)
    if process is None or process.returncode is None:
        return None
    driver = getattr(hook, "_spark_exit_code", None)
    return process.returncode or (driver if getattr(hook, "_is_kubernetes", False) and driver else 0)


def spark_master(conn: Connection) -> str:
    """The master URL the provider's hook derives from the connection (same rules).

    :param conn: the Spark connection (`spark` type: host a URL such as local[2] or spark://h:7077,
        or a host with a port; other types: <conn_type>://host[:port])
    """
    if conn.conn_type == "spark" and conn.host and ("://" in conn.host or not conn.port):
        master = conn.host
    else:
        master = f"{conn.conn_type}://{conn.host or ''}"
    return f"{master}:{conn.port}" if conn.port else master


def connection_conf(conn: Connection) -> dict[str, str]:
    """Spark conf from the connection's extra `conf` object (s3a endpoint, executor sizes, ...).

    :param conn: the Spark connection; its extra's `conf` must be a JSON object (AirflowException if not)
    """
    conf = conn.extra_dejson.get("conf") or {}
    if not isinstance(conf, dict):
        raise AirflowException(f"the extra 'conf' of connection {conn.conn_id!r} must be a JSON object of "
                               f"Spark settings, not {type(conf).__name__}")
    return {str(k): str(v) for k, v in conf.items()}


def resolve_lake_root(explicit: str | None) -> str:
    """The operator's lake_root, else the Variable coldharbor_lake_root, else COLDHARBOR_LAKE_ROOT.

    :param explicit: the operator's `lake_root` argument, if the DAG gave one
    """
    root = explicit or Variable.get(LAKE_ROOT_VARIABLE, default=None) or os.environ.get("COLDHARBOR_LAKE_ROOT")
    if not root:
        raise AirflowException(f"no lake root: set the Airflow Variable {LAKE_ROOT_VARIABLE!r} (or "
                               "COLDHARBOR_LAKE_ROOT in the workers' environment) to a folder or s3a:// URI; "
                               "nothing was submitted")
    return root


def check_master_reachable(master: str, timeout_s: float = 5.0) -> None:
    """A standalone master (spark://host:port[,host:port]) must accept a TCP connection; otherwise
    spark-submit spends a minute in registration retries before it says so. Other masters pass.

    :param master: the master URL (`spark_master`)
    :param timeout_s: how long each address may take to accept
    """
    if not master.startswith("spark://"):
        return
    errors = []
    for address in master.removeprefix("spark://").split(","):
        host, _, port = address.rpartition(":")
        try:
            with socket.create_connection((host, int(port)), timeout=timeout_s):
                return
        except (OSError, ValueError) as exc:
            errors.append(f"{address}: {exc}")
    raise AirflowException(f"the Spark master {master} is unreachable ({'; '.join(errors)}); nothing was submitted")


def package_zip(folder: Path) -> str:
    """jobs/coldharbor zipped for --py-files (executors of a real cluster import it from there),
    without the embedded service (coldharbor/embedded: set-up of one machine, never run by a job).

    :param folder: the run's private folder, removed with the zip when the run ends
    """
    target = folder / "coldharbor.zip"
    package = JOBS_DIR / "coldharbor"
    with zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as archive:
        for path in sorted(package.rglob("*.py")):
            if path.relative_to(package).parts[0] != "embedded":
                archive.write(path, path.relative_to(JOBS_DIR))
    return str(target)

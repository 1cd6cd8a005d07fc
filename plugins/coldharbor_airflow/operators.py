"""One operator turns a Coldharbor job and its arguments into a spark-submit call."""

from __future__ import annotations

import os
import re
import socket
import sys
import tempfile
import zipfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook
from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator
from airflow.sdk import BaseHook, Connection, Variable
from airflow.sdk.exceptions import AirflowException, AirflowNotFoundException

from coldharbor_airflow.dsn_delivery import SECRET_EXTRA, DsnDelivery, deliver_dsn, secret_leaks
from coldharbor_airflow.hooks import DEFAULT_CONN_ID, ColdharborHook
from coldharbor_airflow.paths import JOBS_DIR, import_jobs_package

LAKE_ROOT_VARIABLE = "coldharbor_lake_root"
JOBS = ("cdc_export.py", "compact.py", "cleanup.py", "purge.py", "serve_report.py", "resync.py", "verify.py")
# What prepared_submit sets for one run and puts back afterwards.
_PREPARED_FIELDS = ("application_args", "packages", "conf", "env_vars", "files", "py_files")


class ColdharborSparkJobOperator(SparkSubmitOperator):
    """spark-submit jobs/<job> with its arguments.

    Spark's master, deploy mode and conf come from the `spark_default` connection (the provider's
    hook reads it); the Delta and JDBC jars from the pinned Maven coordinates; the `coldharbor`
    package travels as --py-files. PostgreSQL credentials come from the `coldharbor_pg`
    connection and reach the driver through a file of this run or a Kubernetes secret
    (dsn_delivery), never its command line, a Spark setting or a log line.
    """

    template_fields: Sequence[str] = (*SparkSubmitOperator.template_fields, "job_args", "lake_root")

    def __init__(self, *, job: str, job_args: list[str] | str | None = None, lake_root: str | None = None,
                 coldharbor_conn_id: str = DEFAULT_CONN_ID, spark_conn_id: str = "spark_default",
                 **kwargs: Any) -> None:
        if job not in JOBS:
            raise ValueError(f"unknown Coldharbor job {job!r}; one of: {', '.join(JOBS)}")
        kwargs.setdefault("name", f"coldharbor-{job.removesuffix('.py')}")
        super().__init__(application=str(JOBS_DIR / job), conn_id=spark_conn_id, **kwargs)
        self.job = job
        # A list, or a template that renders to one (render_template_as_native_obj DAGs).
        self.job_args = job_args if isinstance(job_args, str) else list(job_args or [])
        self.lake_root = lake_root
        self.coldharbor_conn_id = coldharbor_conn_id

    def execute(self, context: Any) -> Any:
        if self.job == "serve_report.py":
            self.refuse_before_submit()
        with self.prepared_submit():
            try:
                return super().execute(context)
            except AirflowException as exc:
                # The provider says "Cannot execute: <command>. Error code is: N."; the job's own
                # message is in the log lines above it. Say what the exit code means.
                code = _exit_code(str(exc))
                if code is None:
                    raise
                meaning = {**JOB_EXIT_CODES, **JOB_SPECIFIC_EXIT_CODES.get(self.job, {})}.get(
                    code, "Spark or the job failed")
                raise AirflowException(f"{self.job} exited with code {code}: {meaning}; the job's own message "
                                       "is in the log lines above") from exc

    def refuse_before_submit(self) -> None:
        """A report the sandbox refuses fails here, in the worker, before spark-submit starts a JVM
        (the job would refuse it too, 20 s later); the refusal is recorded as a failed run."""
        import_jobs_package()
        from coldharbor.serve_cli import refusal

        lake_root = resolve_lake_root(self.lake_root)
        message = refusal([*self.job_args, "--lake-root", lake_root], ColdharborHook(self.coldharbor_conn_id).dsn())
        if message is not None:
            self.log.error("serve_report refused the report: %s", message)
            raise AirflowException(f"serve_report refused the report before Spark started: {message}")

    @contextmanager
    def prepared_submit(self) -> Iterator[None]:
        """Checks everything the submit needs (a missing piece is one clear message, and nothing
        has started), then sets the job's arguments, conf, environment and files for the run; the
        run's private folder (the DSN file, the package zip) is removed when the block ends."""
        from psycopg.conninfo import conninfo_to_dict

        import_jobs_package()
        spark_conn = spark_connection(self._conn_id)
        dsn = ColdharborHook(self.coldharbor_conn_id).dsn()
        lake_root = resolve_lake_root(self.lake_root)
        master = spark_master(spark_conn)
        check_master_reachable(master)
        declared = {name: getattr(self, name) for name in _PREPARED_FIELDS}
        try:
            with tempfile.TemporaryDirectory(prefix="coldharbor-run-") as folder:  # mode 0700
                delivery = deliver_dsn(dsn, master, self._deploy_mode or spark_conn.extra_dejson.get("deploy-mode"),
                                       Path(folder), spark_conn.extra_dejson.get(SECRET_EXTRA))
                self._apply(delivery, spark_conn, lake_root, Path(folder))
                if secret_leaks(conninfo_to_dict(dsn).get("password"), self.conf, self.env_vars,
                                self.application_args, self.files, self.name):
                    raise AirflowException("the PostgreSQL password appears in the job's Spark settings, "
                                           "environment or arguments (set by the DAG or the Spark connection's "
                                           "extra); nothing was submitted")
                yield
        finally:
            for name, value in declared.items():  # a second run of this operator starts from the DAG's values
                setattr(self, name, value)
            self._hook = None

    def _apply(self, delivery: DsnDelivery, spark_conn: Connection, lake_root: str, folder: Path) -> None:
        from coldharbor.spark import ivy_dir, maven_packages

        bin_dir = str(Path(sys.executable).parent)  # spark-submit of this environment comes first
        self.application_args = [*self.job_args, "--lake-root", lake_root]
        self.packages = ",".join(maven_packages())
        self.conf = {"spark.jars.ivy": ivy_dir(), "spark.ui.enabled": "false",
                     **connection_conf(spark_conn), **(self.conf or {}), **delivery.conf}
        self.env_vars = {**(self.env_vars or {}), **delivery.env,
                         "PYTHONPATH": os.pathsep.join(filter(None, [str(JOBS_DIR), os.environ.get("PYTHONPATH")])),
                         "PATH": os.pathsep.join([bin_dir, os.environ.get("PATH", "")]),
                         "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable}
        self.files = ",".join(filter(None, [self.files, *delivery.files])) or None
        self.py_files = package_zip(folder)
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")

    def _get_hook(self) -> SparkSubmitHook:
        hook = super()._get_hook()
        if hook._is_kubernetes and hook._connection["deploy_mode"] != "cluster":
            # Client mode: the driver is spark-submit's own process, but the provider hands the
            # environment to Kubernetes driverEnv settings only (for a pod client mode never starts).
            hook._env = dict(self.env_vars or {})
        return hook


# The jobs' exit codes (job_main and each job's --help).
JOB_EXIT_CODES = {
    1: "an unexpected error (the traceback is above)",
    2: "refused or a tier was unreachable; nothing was changed or marked",
    3: "compaction gave up after repeated conflicts; the table is unchanged",
    4: "the purge is incomplete (rows still match)",
}


JOB_SPECIFIC_EXIT_CODES = {
    "verify.py": {1: "the lake view differs from PostgreSQL (the differing key ranges and sample keys are above); "
                     "repair it with the coldharbor_resync DAG"},
}


def _exit_code(message: str) -> int | None:
    match = re.search(r"Error code is: (-?\d+)", message)
    return int(match.group(1)) if match else None


def spark_connection(conn_id: str) -> Connection:
    """The Spark connection, or a clear error: without it the provider would silently submit to YARN."""
    try:
        return BaseHook.get_connection(conn_id)
    except AirflowNotFoundException:
        raise AirflowException(
            f"the Spark connection {conn_id!r} is not defined: create it (Admin > Connections, or "
            f"AIRFLOW_CONN_{conn_id.upper()}='{{\"conn_type\": \"spark\", \"host\": \"local[2]\", "
            "\"extra\": {\"deploy-mode\": \"client\"}}'); nothing was submitted") from None


def spark_master(conn: Connection) -> str:
    """The master URL the provider's hook derives from the connection (same rules)."""
    if conn.conn_type == "spark" and conn.host and ("://" in conn.host or not conn.port):
        master = conn.host
    else:
        master = f"{conn.conn_type}://{conn.host or ''}"
    return f"{master}:{conn.port}" if conn.port else master


def connection_conf(conn: Connection) -> dict[str, str]:
    """Spark conf from the connection's extra `conf` object (s3a endpoint, executor sizes, ...)."""
    conf = conn.extra_dejson.get("conf") or {}
    if not isinstance(conf, dict):
        raise AirflowException(f"the extra 'conf' of connection {conn.conn_id!r} must be a JSON object of "
                               f"Spark settings, not {type(conf).__name__}")
    return {str(k): str(v) for k, v in conf.items()}


def resolve_lake_root(explicit: str | None) -> str:
    """The operator's lake_root, else the Variable coldharbor_lake_root, else COLDHARBOR_LAKE_ROOT."""
    root = explicit or Variable.get(LAKE_ROOT_VARIABLE, default=None) or os.environ.get("COLDHARBOR_LAKE_ROOT")
    if not root:
        raise AirflowException(f"no lake root: set the Airflow Variable {LAKE_ROOT_VARIABLE!r} (or "
                               "COLDHARBOR_LAKE_ROOT in the workers' environment) to a folder or s3a:// URI; "
                               "nothing was submitted")
    return root


def check_master_reachable(master: str, timeout_s: float = 5.0) -> None:
    """A standalone master (spark://host:port[,host:port]) must accept a TCP connection; otherwise
    spark-submit spends a minute in registration retries before it says so."""
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
    """jobs/coldharbor zipped for --py-files (executors of a real cluster import it from there)."""
    target = folder / "coldharbor.zip"
    with zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as archive:
        for path in sorted((JOBS_DIR / "coldharbor").rglob("*.py")):
            archive.write(path, path.relative_to(JOBS_DIR))
    return str(target)

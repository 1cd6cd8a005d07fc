"""One operator runs a Coldharbor job with its arguments: as a Spark Connect client in the worker,
or as a spark-submit call, as the configured Spark connection's type says (connect_run)."""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook
from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator
from airflow.sdk import Connection
from airflow.sdk.exceptions import AirflowException, AirflowFailException

from coldharbor_airflow.connect_run import (
    DEFAULT_SPARK_CONN_ID,
    check_connect_reachable,
    connect_url,
    engine_connection,
    interrupt_connect_session,
    job_main,
    resolve_spark_conn_id,
    run_as_connect_client,
    runs_on_connect,
    spark_connection,
)
from coldharbor_airflow.dsn_delivery import SECRET_EXTRA, DsnDelivery, deliver_dsn, secret_leaks
from coldharbor_airflow.hooks import DEFAULT_CONN_ID, ColdharborHook
from coldharbor_airflow.paths import JOBS_DIR, import_jobs_package
from coldharbor_airflow.submit_settings import (
    check_master_reachable,
    connection_conf,
    package_zip,
    resolve_lake_root,
    spark_master,
    submit_exit_code,
)

JOBS = ("cdc_export.py", "compact.py", "cleanup.py", "purge.py", "serve_report.py", "resync.py", "verify.py",
        "changes.py")
# What prepared_submit sets for one run and puts back afterwards.
_PREPARED_FIELDS = ("application_args", "packages", "conf", "env_vars", "files", "py_files")


class ColdharborSparkJobOperator(SparkSubmitOperator):
    """Runs jobs/<job> with its arguments on the configured Spark connection (`spark_conn_id`, else
    the Variable coldharbor_spark_conn_id, else `spark_default`).

    A `spark_connect` connection: the job's main(argv) runs in this worker's process, its session a
    client of that Spark Connect server. Any other: spark-submit, with master, deploy mode and conf
    from the connection (the provider's hook reads it); the Delta and JDBC jars from the pinned
    Maven coordinates; the `coldharbor` package as --py-files. Either way PostgreSQL credentials
    come from the `coldharbor_pg` connection and reach the job through a file of this run or a
    Kubernetes secret (dsn_delivery), never its command line, a Spark setting or a log line.
    """

    template_fields: Sequence[str] = (*SparkSubmitOperator.template_fields, "job_args", "lake_root")

    def __init__(self, *, job: str, job_args: list[str] | str | None = None, lake_root: str | None = None,
                 coldharbor_conn_id: str = DEFAULT_CONN_ID, spark_conn_id: str | None = None,
                 **kwargs: Any) -> None:
        if job not in JOBS:
            raise ValueError(f"unknown Coldharbor job {job!r}; one of: {', '.join(JOBS)}")
        kwargs.setdefault("name", f"coldharbor-{job.removesuffix('.py')}")
        super().__init__(application=str(JOBS_DIR / job), conn_id=spark_conn_id or DEFAULT_SPARK_CONN_ID, **kwargs)
        self.spark_conn_id = spark_conn_id  # None: resolved when the task runs (connect_run)
        self.on_connect = False
        self.job = job
        # A list, or a template that renders to one (render_template_as_native_obj DAGs).
        self.job_args = job_args if isinstance(job_args, str) else list(job_args or [])
        self.lake_root = lake_root
        self.coldharbor_conn_id = coldharbor_conn_id

    def execute(self, context: Any) -> Any:
        if self.job == "serve_report.py":
            self.refuse_before_submit()
        self._conn_id = resolve_spark_conn_id(self.spark_conn_id)
        spark_conn = spark_connection(self._conn_id)
        self.on_connect = runs_on_connect(spark_conn)
        return self.run_on_connect(spark_conn) if self.on_connect else self.run_submitted(context)

    def run_on_connect(self, spark_conn: Connection) -> None:
        """The job as a Spark Connect client in this worker; a non-zero exit fails the task, saying why.

        :param spark_conn: the task's Spark connection, one that names a Spark Connect server
        """
        code = self.run_as_connect_client(spark_conn)
        if code != 0:
            raise self.job_failed(code)

    def run_submitted(self, context: Any) -> Any:
        """The job through spark-submit (the provider's operator), prepared and put back around it.

        :param context: the task's Airflow context, handed to the provider's execute
        """
        with self.prepared_submit():
            try:
                return super().execute(context)
            except AirflowException as exc:
                # The job's own message is in the log lines above; say what its exit code means.
                code = submit_exit_code(self._hook)
                if not code:
                    raise
                raise self.job_failed(code) from exc

    def get_openlineage_facets_on_complete(self, task_instance: Any) -> Any:
        """What this run read and wrote, for Airflow's OpenLineage provider (coldharbor_airflow.lineage);
        called only when the provider has a transport. Never fails the task: a registry that cannot
        be read gives no datasets, and the reason is logged."""
        from airflow.providers.openlineage.extractors import OperatorLineage

        from coldharbor_airflow.lineage import job_lineage

        try:
            args = self.job_args if isinstance(self.job_args, list) else []
            return job_lineage(self.job, args, ColdharborHook(self.coldharbor_conn_id).dsn(),
                               resolve_lake_root(self.lake_root))
        except Exception as exc:  # noqa: BLE001 - lineage is a by-product: the run's own result stands
            self.log.warning("no OpenLineage datasets for this run of %s: %s", self.job, str(exc).splitlines()[0])
            return OperatorLineage()

    def job_failed(self, code: int) -> AirflowException:
        """The task's failure for the job's non-zero exit code, saying what the code means
        (`job_main.exit_meaning`: one table of exit codes for every job).

        :param code: the job's exit code (spark-submit's, or main's over Spark Connect)
        """
        import_jobs_package()
        from coldharbor.runtime.job_main import exit_meaning

        meaning = exit_meaning(self.job, code)
        return AirflowException(f"{self.job} exited with code {code}: {meaning}; the job's own message "
                                "is in the log lines above")

    def run_as_connect_client(self, spark_conn: Connection) -> int:
        """The job's main(argv) in this process, a client of the connection's Spark Connect server;
        checks first (nothing has run when a piece is missing), returns the job's exit code.

        :param spark_conn: the task's Spark connection, one that names a Spark Connect server
        """
        dsn = ColdharborHook(self.coldharbor_conn_id).dsn()
        lake_root = resolve_lake_root(self.lake_root)
        url = connect_url(spark_conn)
        check_connect_reachable(url)
        main = job_main(self.job)
        self.log.info("running %s in this worker as a client of the Spark Connect server %s (connection %r)",
                      self.job, url.split(";")[0], spark_conn.conn_id)
        return run_as_connect_client(main, [*self.job_args, "--lake-root", lake_root], url, dsn)

    def on_kill(self) -> None:
        if self.on_connect:
            interrupt_connect_session()
        else:
            super().on_kill()

    def refuse_before_submit(self) -> None:
        """A report the sandbox refuses fails here, in the worker, before spark-submit starts a JVM
        (the job would refuse it too, 20 s later); the refusal is recorded as a failed run. A retry
        would be refused the same way (the report, its arguments or its tables are what is wrong),
        so the task fails without one."""
        import_jobs_package()
        from coldharbor.serve.serve_cli import refusal

        lake_root = resolve_lake_root(self.lake_root)
        message = refusal([*self.job_args, "--lake-root", lake_root], ColdharborHook(self.coldharbor_conn_id).dsn())
        if message is not None:
            self.log.error("serve_report refused the report: %s", message)
            raise AirflowFailException(f"serve_report refused the report before Spark started: {message}")

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
        """Sets the provider's submit arguments for this run: the job's arguments, the packages, the
        conf (the connection's, the DAG's, the DSN delivery's), the environment and the jobs' zip.

        :param delivery: how this run hands the DSN to the driver (dsn_delivery)
        :param spark_conn: the task's Spark connection (its extra's `conf`)
        :param lake_root: the lake root the job is given (`resolve_lake_root`)
        :param folder: the run's private folder (the zip of the jobs package goes there)
        """
        from coldharbor.runtime.jvm_locale import jvm_environment
        from coldharbor.runtime.spark import ivy_dir, maven_packages

        bin_dir = str(Path(sys.executable).parent)  # spark-submit of this environment comes first
        self.application_args = [*self.job_args, "--lake-root", lake_root]
        self.packages = ",".join(maven_packages())
        self.conf = {"spark.jars.ivy": ivy_dir(), "spark.ui.enabled": "false",
                     **connection_conf(spark_conn), **(self.conf or {}), **delivery.conf}
        self.env_vars = {**(self.env_vars or {}), **delivery.env,
                         "PYTHONPATH": os.pathsep.join(filter(None, [str(JOBS_DIR), os.environ.get("PYTHONPATH")])),
                         "PATH": os.pathsep.join([bin_dir, os.environ.get("PATH", "")]),
                         "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable}
        # spark-submit's JVM gets the worker's environment and these; with a UTF-8 locale.
        locale = jvm_environment({**os.environ, **self.env_vars}).get("LC_ALL")
        if locale:
            self.env_vars["LC_ALL"] = locale
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


def export_job_args(tables: list[str], spark_conn_id: str | None = None) -> list[list[str]]:
    """The export's mapped arguments for the tables with something to export: on a Spark Connect
    connection one task whose one session exports every dirty table (the job without --table,
    each table's result logged and recorded); under spark-submit one task per table.

    :param tables: the registered tables with something to export (the cdc DAG's probe)
    :param spark_conn_id: the Spark connection the export runs on (default: Coldharbor's engine connection)
    """
    if not tables:
        return []
    if runs_on_connect(engine_connection(spark_conn_id)):
        return [[]]
    return [["--table", name] for name in tables]

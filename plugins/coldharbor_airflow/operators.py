"""One operator turns a Coldharbor job and its arguments into a spark-submit call."""

from __future__ import annotations

import os
import sys
import tempfile
import zipfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator

from coldharbor_airflow.hooks import DEFAULT_CONN_ID, ColdharborHook
from coldharbor_airflow.paths import JOBS_DIR

JOBS = ("cdc_export.py", "compact.py", "cleanup.py", "purge.py", "serve_report.py")


class ColdharborSparkJobOperator(SparkSubmitOperator):
    """spark-submit jobs/<job> with its arguments.

    Spark's master, deploy mode and conf come from the `spark_default` connection (the provider's
    hook reads it); the Delta and JDBC jars from the pinned Maven coordinates; the `coldharbor`
    package travels as --py-files. PostgreSQL credentials come from the `coldharbor_pg`
    connection and reach the job through its environment (COLDHARBOR_PG_DSN), never its command
    line; Airflow masks the password in the task log.
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
        sys.path.insert(0, str(JOBS_DIR))  # the jobs package, for its pinned jar coordinates
        from coldharbor.spark import ivy_dir, maven_packages

        lake_root = self.lake_root or os.environ.get("COLDHARBOR_LAKE_ROOT")
        self.application_args = [*self.job_args, *(["--lake-root", lake_root] if lake_root else [])]
        self.packages = ",".join(maven_packages())
        self.conf = {"spark.jars.ivy": ivy_dir(), "spark.ui.enabled": "false", **(self.conf or {})}
        bin_dir = str(Path(sys.executable).parent)  # spark-submit of this environment comes first
        self.env_vars = {**(self.env_vars or {}),
                          "COLDHARBOR_PG_DSN": ColdharborHook(self.coldharbor_conn_id).dsn(),
                          "PYTHONPATH": os.pathsep.join(filter(None, [str(JOBS_DIR), os.environ.get("PYTHONPATH")])),
                          "PATH": os.pathsep.join([bin_dir, os.environ.get("PATH", "")]),
                          "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable}
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        with tempfile.TemporaryDirectory(prefix="coldharbor-pyfiles-") as folder:
            self.py_files = package_zip(Path(folder))
            return super().execute(context)


def package_zip(folder: Path) -> str:
    """jobs/coldharbor zipped for --py-files (executors of a real cluster import it from there)."""
    target = folder / "coldharbor.zip"
    with zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as archive:
        for path in sorted((JOBS_DIR / "coldharbor").rglob("*.py")):
            archive.write(path, path.relative_to(JOBS_DIR))
    return str(target)

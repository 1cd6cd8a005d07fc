"""A report run waits for the export that brings its as-of instant into the lake.

A report DAG's run answers as of its interval's end. Changes committed before that instant are in
the lake only after the next export; until then the report would be refused ("not in the lake
yet") and retried blindly. This sensor waits instead, in reschedule mode (no worker slot held
between pokes), and lets `serve` run once nothing the next export brings in is missing. When it
gives up it says which table holds the run back, and since when.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from airflow.sdk import BaseSensorOperator
from airflow.sdk.exceptions import AirflowException, AirflowSensorTimeout

from coldharbor_airflow.hooks import DEFAULT_CONN_ID, ColdharborHook
from coldharbor_airflow.paths import import_jobs_package
from coldharbor_airflow.submit_settings import resolve_lake_root


class LakeCoversAsOfSensor(BaseSensorOperator):
    """Done when the lake holds everything a report's as-of read needs that an export brings (its
    tables' changes committed at or before the instant, their bases); at once for a run without an
    as-of, or for a report the run will refuse anyway (the serve task says why and records it).

    `job_args` are the serve task's arguments (templated the same way)."""

    template_fields: Sequence[str] = ("job_args", "lake_root")

    def __init__(self, *, job_args: list[str] | str, lake_root: str | None = None,
                 coldharbor_conn_id: str = DEFAULT_CONN_ID, **kwargs: Any) -> None:
        kwargs.setdefault("mode", "reschedule")
        super().__init__(**kwargs)
        self.job_args = job_args if isinstance(job_args, str) else list(job_args)
        self.lake_root = lake_root
        self.coldharbor_conn_id = coldharbor_conn_id
        self.waiting_for: str | None = None

    def poke(self, context: Any) -> bool:
        import_jobs_package()
        from coldharbor.serve.serve_cli import waiting_for

        if not isinstance(self.job_args, list):  # a template that rendered to text, not to a list
            raise AirflowException(f"wait_for_lake needs the serve task's arguments as a list, got "
                                   f"{type(self.job_args).__name__}; render the DAG's templates as native objects")
        argv = [*self.job_args, "--lake-root", resolve_lake_root(self.lake_root)]
        self.waiting_for = waiting_for(argv, ColdharborHook(self.coldharbor_conn_id).dsn())
        if self.waiting_for is None:
            return True
        self.log.info("waiting for the next export: %s", self.waiting_for)
        return False

    def execute(self, context: Any) -> Any:
        try:
            return super().execute(context)
        except AirflowSensorTimeout:
            waited = timedelta(seconds=self.timeout) if isinstance(self.timeout, (int, float)) else self.timeout
            raise AirflowSensorTimeout(f"gave up after {waited} of waiting for an export: {self.waiting_for}; is "
                                       "the coldharbor_cdc DAG running, and does its task for that table succeed "
                                       "(an export refused for a value or a privilege leaves its changes "
                                       "dirty)?") from None

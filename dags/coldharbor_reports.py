"""One DAG per report file in sql/reports/, scheduled as its header says.

Every run serves its interval's report as of the interval's end (an as-of read: equal to
PostgreSQL at that time), so a backfill of a past interval gives that interval's report. With a
`start:` in the header the DAG catches up every interval from then (keep it inside the history
window); without one it runs forward only. A run whose interval end is not in the lake yet
(changes before it still to be exported) waits for the export that brings it in (wait_for_lake,
up to $COLDHARBOR_AS_OF_WAIT_S seconds) before `serve` starts. A run triggered by hand without a logical date (the
UI's Trigger button) has no interval and serves the report as of now.
"""

from __future__ import annotations

from datetime import datetime, time, timedelta, timezone

from airflow.sdk import Param, dag
from coldharbor_airflow.operators import ColdharborSparkJobOperator
from coldharbor_airflow.reports import param_default, param_schema, report_specs
from coldharbor_airflow.sensors import LakeCoversAsOfSensor
from coldharbor_common import SPARK_POOL, START, as_of_wait, default_args


def report_dag(spec):
    params = {p.name: Param(param_default(p.type, p.default), **param_schema(p.type),
                            description=f"{p.type}" + ("" if p.default is not None else " (required)"))
              for p in spec.params}
    args = ["--report", spec.name, "--run-id", "{{ dag.dag_id }}-{{ run_id }}",
            # A run triggered by hand without a logical date has no interval: it serves the report now.
            "--as-of", "{{ data_interval_end.isoformat() if data_interval_end is defined and data_interval_end "
                       "else 'now' }}"]
    for p in spec.params:
        args += ["--param", f"{p.name}={{{{ params.{p.name} }}}}"]

    @dag(
        dag_id=f"coldharbor_report_{spec.name}",
        schedule=spec.schedule,
        start_date=datetime.combine(spec.start, time(), timezone.utc) if spec.start else START,
        catchup=spec.start is not None,
        max_active_runs=1,
        params=params,
        default_args={**default_args(timeout=timedelta(minutes=30), retries=3),
                      "retry_delay": timedelta(seconds=60)},
        tags=["coldharbor", "report"],
        doc_md=f"Report **{spec.name}** into {spec.sink} target `{spec.target}` (from `{spec.source}`).\n\n"
               f"```sql\n{spec.sql}\n```",
    )
    def serve():
        wait = LakeCoversAsOfSensor(task_id="wait_for_lake", job_args=args, **as_of_wait())
        wait >> ColdharborSparkJobOperator(task_id="serve", job="serve_report.py", job_args=args, pool=SPARK_POOL)

    return serve()


for _spec in report_specs():
    report_dag(_spec)

"""coldharbor_adhoc_report: an analyst's report, triggered by hand from the UI's form.

Give either a report defined in sql/reports/ (with its parameters' defaults) or one SELECT over
registered tables, a target table named adhoc_* (a chosen report writes there too, not to its
scheduled table), a mode and optionally a time to answer as of. The form's JSON schema refuses
malformed values before a run is created. The form checks each field on its own, so giving both a
report and SQL, or neither, is refused by the run before spark-submit starts, with one clear line;
so is SQL that is not one SELECT on the report sandbox's allow-list. A time to answer as of that the
lake does not hold yet waits for the export that brings it in (wait_for_lake).
"""

from __future__ import annotations

from datetime import timedelta

from airflow.sdk import Param, dag
from coldharbor_airflow.operators import ColdharborSparkJobOperator
from coldharbor_airflow.params import whole
from coldharbor_airflow.reports import report_specs
from coldharbor_airflow.sensors import LakeCoversAsOfSensor
from coldharbor_common import SPARK_POOL, START, as_of_wait, default_args

# Both or neither of report and SQL reach the job as given: its command line refuses either case
# (one of --report/--sql, never both) before a JVM starts.
ARGS = (
    "{% set p = params %}"
    "{{ (['--report', p.report] if p.report else []) + (['--sql', p.sql] if p.sql else [])"
    " + ['--target', p.target, '--mode', p.mode, '--run-id', 'adhoc-' ~ run_id]"
    " + (['--as-of', p.as_of] if p.as_of else []) }}"
)


@dag(
    dag_id="coldharbor_adhoc_report",
    schedule=None,
    start_date=START,
    catchup=False,
    max_active_runs=4,
    render_template_as_native_obj=True,
    params={
        "report": Param(None, type=["null", "string"], enum=[None, *sorted(s.name for s in report_specs())],
                        description="a report defined in sql/reports/ (leave empty to give SQL)"),
        "sql": Param(None, type=["null", "string"], minLength=1, maxLength=20000,
                     description="one SELECT over registered tables (when no report is chosen)"),
        "target": Param("adhoc_result", type="string", pattern=whole(r"adhoc_[a-z0-9_]{1,40}"),
                        description="report table in the reports schema: adhoc_<name> (also for a chosen report)"),
        "mode": Param("strict", type="string", enum=["strict", "best_effort"]),
        # format gives the form its date picker; the pattern enforces it (jsonschema checks formats
        # only with optional packages).
        "as_of": Param(None, type=["null", "string"], format="date-time",
                       pattern=whole(r"\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}(:\d{2}(\.\d+)?)?(Z|[+-]\d{2}:?\d{2})?"),
                       description="answer as PostgreSQL held the data at this time (ISO 8601)"),
    },
    default_args=default_args(timeout=timedelta(minutes=30), retries=1),
    tags=["coldharbor", "report", "adhoc"],
    doc_md=__doc__,
)
def coldharbor_adhoc_report():
    wait = LakeCoversAsOfSensor(task_id="wait_for_lake", job_args=ARGS, **as_of_wait())
    wait >> ColdharborSparkJobOperator(task_id="serve", job="serve_report.py", job_args=ARGS, pool=SPARK_POOL)


coldharbor_adhoc_report()

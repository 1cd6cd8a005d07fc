"""coldharbor_cdc: every minute, export each registered table that has dirty changes to Delta.

One mapped spark-submit per table with something to export; a clean minute maps nothing (one
index probe per table, no Spark start). One run at a time: the export of a table is also
guarded by its advisory lock, so an overlapping manual run skips instead of doubling.
"""

from __future__ import annotations

from datetime import timedelta

from airflow.sdk import Asset, dag, task
from coldharbor_airflow.operators import ColdharborSparkJobOperator
from coldharbor_common import SPARK_POOL, START, default_args

# Updated by every export: compaction listens to it.
LAKE_EXPORTS = Asset("coldharbor://lake/exports")


@dag(
    dag_id="coldharbor_cdc",
    schedule="* * * * *",
    start_date=START,
    catchup=False,
    max_active_runs=1,
    dagrun_timeout=timedelta(minutes=15),
    default_args=default_args(timeout=timedelta(minutes=10)),
    tags=["coldharbor", "cdc"],
    doc_md=__doc__,
)
def coldharbor_cdc():
    @task(execution_timeout=timedelta(minutes=1))
    def tables_to_export() -> list[list[str]]:
        from coldharbor_airflow.hooks import ColdharborHook

        return [["--table", name] for name in ColdharborHook().tables_needing_export()]

    ColdharborSparkJobOperator.partial(
        task_id="export", job="cdc_export.py", pool=SPARK_POOL, outlets=[LAKE_EXPORTS],
        # Freshness first: an export takes the Spark pool's next slot ahead of reports and maintenance.
        priority_weight=100, weight_rule="absolute",
        map_index_template="{{ task.job_args[1] }}",
    ).expand(job_args=tables_to_export())


coldharbor_cdc()

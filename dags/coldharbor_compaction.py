"""coldharbor_compaction: the lake's files compacted, hourly and as soon as exports have landed.

Compaction runs hourly, and also as soon as exports have updated the lake asset (LAKE_EXPORTS);
either way it compacts only the tables with enough exports since their last compaction (the job
then checks the actual small files), in the job's `auto` mode: the small files of the exports are
merged (no row changes) and a table is rewritten with last-write-wins once a day, or sooner when its
exported rows pass a tenth of the table.
"""

from __future__ import annotations

from datetime import timedelta

from airflow.sdk import dag, task
from airflow.timetables.assets import AssetOrTimeSchedule
from airflow.timetables.trigger import CronTriggerTimetable
from coldharbor_airflow.operators import ColdharborSparkJobOperator
from coldharbor_common import LAKE_EXPORTS, SPARK_POOL, START, default_args

MIN_NEW_EXPORTS = 30  # about half an hour of per-minute exports


@dag(
    dag_id="coldharbor_compaction",
    schedule=AssetOrTimeSchedule(timetable=CronTriggerTimetable("17 * * * *", timezone="UTC"), assets=LAKE_EXPORTS),
    start_date=START,
    catchup=False,
    max_active_runs=1,
    default_args=default_args(timeout=timedelta(hours=1)),
    tags=["coldharbor", "maintenance"],
    doc_md=__doc__,
)
def coldharbor_compaction():
    @task(execution_timeout=timedelta(minutes=1))
    def tables_to_compact() -> list[list[str]]:
        from coldharbor_airflow.hooks import ColdharborHook

        return [["--table", name, "--mode", "auto"]
                for name in ColdharborHook().tables_needing_compaction(MIN_NEW_EXPORTS)]

    ColdharborSparkJobOperator.partial(
        task_id="compact", job="compact.py", pool=SPARK_POOL, map_index_template="{{ task.job_args[1] }}",
    ).expand(job_args=tables_to_compact())


coldharbor_compaction()

"""coldharbor_compaction and coldharbor_cleanup: lake maintenance on their own schedules.

Compaction runs hourly, and also as soon as exports have updated the lake asset; either way it
compacts only the tables with enough exports since their last compaction (the job then checks
the actual small files), in the job's `auto` mode: the small files of the exports are merged (no
row changes) and a table is rewritten with last-write-wins once a day, or sooner when its exported
rows pass a tenth of the table. Cleanup (eviction, VACUUM, change-log pruning, run expiry) runs daily,
then verifies each table whose last verify is older than COLDHARBOR_VERIFY_EVERY_DAYS (default 7)
against PostgreSQL; a table out of sync fails its mapped verify task.
"""

from __future__ import annotations

import os
from datetime import timedelta

from airflow.sdk import Asset, dag, task
from airflow.timetables.assets import AssetOrTimeSchedule
from airflow.timetables.trigger import CronTriggerTimetable
from coldharbor_airflow.operators import ColdharborSparkJobOperator
from coldharbor_common import SPARK_POOL, START, default_args

LAKE_EXPORTS = Asset("coldharbor://lake/exports")
MIN_NEW_EXPORTS = 30  # about half an hour of per-minute exports
# Each table is verified against PostgreSQL after the daily cleanup once its last verify is this old.
VERIFY_EVERY_DAYS = float(os.environ.get("COLDHARBOR_VERIFY_EVERY_DAYS", "7"))


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


@dag(
    dag_id="coldharbor_cleanup",
    schedule="43 3 * * *",
    start_date=START,
    catchup=False,
    max_active_runs=1,
    default_args=default_args(timeout=timedelta(hours=2)),
    tags=["coldharbor", "maintenance"],
    doc_md=__doc__,
)
def coldharbor_cleanup():
    cleanup = ColdharborSparkJobOperator(task_id="cleanup", job="cleanup.py", pool=SPARK_POOL)

    @task(execution_timeout=timedelta(minutes=1))
    def tables_to_verify() -> list[list[str]]:
        from coldharbor_airflow.hooks import ColdharborHook

        return [["--table", name] for name in ColdharborHook().tables_needing_verify(VERIFY_EVERY_DAYS)]

    # A table whose lake view differs from PostgreSQL fails its mapped task: the log names the key ranges.
    verify = ColdharborSparkJobOperator.partial(
        task_id="verify", job="verify.py", pool=SPARK_POOL, map_index_template="{{ task.job_args[1] }}",
    ).expand(job_args=tables_to_verify())
    cleanup >> verify


coldharbor_compaction()
coldharbor_cleanup()

"""coldharbor_cleanup: daily eviction, VACUUM, change-log pruning and run expiry, then verify.

Cleanup runs daily, then verifies each table whose last verify is older than
COLDHARBOR_VERIFY_EVERY_DAYS (default 7) against PostgreSQL; a table out of sync fails its mapped
verify task, whose log names the differing key ranges (repair: the coldharbor_resync DAG).
"""

from __future__ import annotations

import os
from datetime import timedelta

from airflow.sdk import dag, task
from coldharbor_airflow.operators import ColdharborSparkJobOperator
from coldharbor_common import SPARK_POOL, START, default_args

# Each table is verified against PostgreSQL after the daily cleanup once its last verify is this old.
VERIFY_EVERY_DAYS = float(os.environ.get("COLDHARBOR_VERIFY_EVERY_DAYS", "7"))


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


coldharbor_cleanup()

"""coldharbor_resync: rebuild one table's lake state from PostgreSQL, triggered by hand.

The way out after PostgreSQL was restored from a backup, the lake was edited by hand, or verify
found a difference: trigger with the table (schema.table). The job reads the table in one snapshot
and appends it as a new base that outranks every older lake row; earlier versions stay for as-of
reports until cleanup. Reports stay exact while it runs. An unregistered table, or one being
exported or compacted right now, is refused with one line in the task log and nothing changed.
"""

from __future__ import annotations

from datetime import timedelta

from airflow.sdk import Param, dag
from coldharbor_airflow.operators import ColdharborSparkJobOperator
from coldharbor_airflow.params import whole
from coldharbor_common import SPARK_POOL, START, default_args

IDENTIFIER = r"[A-Za-z_][A-Za-z0-9_$]{0,62}"


@dag(
    dag_id="coldharbor_resync",
    schedule=None,
    start_date=START,
    catchup=False,
    max_active_runs=1,
    params={
        "table": Param(type="string", pattern=whole(rf"{IDENTIFIER}(\.{IDENTIFIER})?"),
                       description="the registered table to rebuild in the lake: schema.table"),
    },
    default_args=default_args(timeout=timedelta(hours=6), retries=1),
    tags=["coldharbor", "maintenance"],
    doc_md=__doc__,
)
def coldharbor_resync():
    ColdharborSparkJobOperator(task_id="resync", job="resync.py", job_args=["--table", "{{ params.table }}"],
                               pool=SPARK_POOL)


coldharbor_resync()

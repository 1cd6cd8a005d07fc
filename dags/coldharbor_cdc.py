"""coldharbor_cdc: every minute (or continuously), export each registered table that has dirty
changes to Delta.

On a Spark Connect connection one task exports every dirty table on the warm server, several at
once (COLDHARBOR_EXPORT_WORKERS); under spark-submit one mapped task per table with something to
export. A clean cycle maps nothing and starts no Spark (one index probe per table). One run at a time:
the export of a table is also guarded by its advisory lock, so an overlapping manual run skips
instead of doubling. The cadence is COLDHARBOR_EXPORT_CADENCE: `minute` (default) or `continuous`
(each run starts when the last one ends). Each cycle also sends the health figures to StatsD
(when Airflow's [metrics] statsd_on is set), and check_freshness, after the exports whatever they did,
fails naming each table whose oldest unexported change is older than its freshness promise (the alert).
"""

from __future__ import annotations

from datetime import timedelta

from airflow.sdk import dag, task
from coldharbor_airflow.alerts import alert_broken_promises
from coldharbor_airflow.operators import ColdharborSparkJobOperator
from coldharbor_common import LAKE_EXPORTS, SPARK_POOL, START, default_args, export_schedule

# Updated by every export: compaction listens to it.


@dag(
    dag_id="coldharbor_cdc",
    schedule=export_schedule(),
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
        from coldharbor_airflow.operators import export_job_args

        return export_job_args(ColdharborHook().tables_needing_export())

    dirty = tables_to_export()
    exports = ColdharborSparkJobOperator.partial(
        task_id="export", job="cdc_export.py", pool=SPARK_POOL, outlets=[LAKE_EXPORTS],
        # Freshness first: an export takes the Spark pool's next slot ahead of reports and maintenance.
        priority_weight=100, weight_rule="absolute",
        map_index_template="{{ task.job_args[1] if task.job_args else 'every dirty table' }}",
    ).expand(job_args=dirty)

    # Beside the exports, from the cycle's start: the health figures as StatsD gauges through
    # Airflow's metrics client (coldharbor_airflow.metrics), PostgreSQL down included (up 0). Not
    # after the exports: a leaf that succeeds would turn a run whose export failed into a successful
    # one. Short timeout and retry: a slow lake must not hold the next cycle back for long.
    @task(execution_timeout=timedelta(seconds=40), retries=1, retry_delay=timedelta(seconds=5),
          retry_exponential_backoff=False)
    def publish_metrics() -> int:
        from coldharbor_airflow.metrics import publish_statsd

        return publish_statsd()

    publish_metrics()

    @task(trigger_rule="all_done", retries=0, execution_timeout=timedelta(seconds=40),
          on_failure_callback=alert_broken_promises)
    def check_freshness() -> int:
        """Fails naming every table whose oldest unexported change is older than its promise."""
        from coldharbor_airflow.alerts import check_freshness

        return check_freshness()

    exports >> check_freshness()


coldharbor_cdc()

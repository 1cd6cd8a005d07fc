"""What every Coldharbor DAG shares: owner, retries with back-off, timeouts, the Spark pool."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

START = datetime(2026, 1, 1, tzinfo=timezone.utc)
# Every Spark job runs in this pool: its slots bound how many spark-submits share the machine.
SPARK_POOL = "coldharbor_spark"


def default_args(timeout: timedelta, retries: int = 2) -> dict:
    return {
        "owner": "coldharbor",
        "retries": retries,
        "retry_delay": timedelta(seconds=20),
        "retry_exponential_backoff": True,
        "max_retry_delay": timedelta(minutes=5),
        "execution_timeout": timeout,
    }

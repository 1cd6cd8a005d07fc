"""What every Coldharbor DAG shares: owner, retries with back-off, timeouts, the Spark pool."""

from __future__ import annotations

import os
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


EXPORT_CADENCE_ENV = "COLDHARBOR_EXPORT_CADENCE"
# minute: a run every minute. continuous: the next run starts as soon as the last one ends (the
# lake at most one cycle behind; with a Spark Connect connection a cycle costs no JVM start).
EXPORT_SCHEDULES = {"minute": "* * * * *", "continuous": "@continuous"}


def export_schedule() -> str:
    """The export DAG's schedule from COLDHARBOR_EXPORT_CADENCE (read where the DAG is parsed)."""
    cadence = os.environ.get(EXPORT_CADENCE_ENV, "minute")
    if cadence not in EXPORT_SCHEDULES:
        raise ValueError(f"{EXPORT_CADENCE_ENV}={cadence!r} is not a cadence: one of {', '.join(EXPORT_SCHEDULES)}")
    return EXPORT_SCHEDULES[cadence]

"""What every Coldharbor DAG shares: owner, retries with back-off, timeouts, the Spark pool."""

from __future__ import annotations

import os
from datetime import datetime, timedelta, timezone

from airflow.sdk import CronDataIntervalTimetable

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
EXPORT_CADENCES = ("minute", "continuous")


def export_schedule() -> str | CronDataIntervalTimetable:
    """The export DAG's schedule from COLDHARBOR_EXPORT_CADENCE (read where the DAG is parsed).

    minute: a run every minute. continuous: the next run starts as soon as the last one ends (the
    lake at most one cycle behind; with a Spark Connect connection a cycle costs no JVM start).
    The minute's runs cover a minute each (a data interval, not Airflow's default zero-length
    trigger): `@continuous` starts its first run's interval where the last run's ended, and after a
    zero-length interval that is the last run's own logical date, so the scheduler would skip the
    run as existing, every second, for good, and the lake would fall silently behind.
    """
    cadence = os.environ.get(EXPORT_CADENCE_ENV, "minute")
    if cadence not in EXPORT_CADENCES:
        raise ValueError(f"{EXPORT_CADENCE_ENV}={cadence!r} is not a cadence: one of {', '.join(EXPORT_CADENCES)}")
    if cadence == "continuous":
        return "@continuous"
    return CronDataIntervalTimetable("* * * * *", timezone="UTC")

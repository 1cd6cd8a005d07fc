"""What every Coldharbor DAG shares: owner, retries with back-off, timeouts, the Spark pool."""

from __future__ import annotations

import os
from datetime import datetime, timedelta, timezone

from airflow.sdk import Asset, CronDataIntervalTimetable

START = datetime(2026, 1, 1, tzinfo=timezone.utc)
# Every Spark job runs in this pool: its slots bound how many spark-submits share the machine.
SPARK_POOL = "coldharbor_spark"
# Updated by every export run that landed batches (coldharbor_cdc); compaction runs on it.
LAKE_EXPORTS = Asset("coldharbor://lake/exports")


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


AS_OF_WAIT_ENV = "COLDHARBOR_AS_OF_WAIT_S"


def as_of_wait() -> dict:
    """How a report run waits for the export that brings its as-of instant into the lake: the
    sensor's timeout from COLDHARBOR_AS_OF_WAIT_S (read where the DAG is parsed; default 15 minutes,
    fifteen of the per-minute exports) and a poke every thirtieth of it, between 1 and 30 seconds."""
    raw = os.environ.get(AS_OF_WAIT_ENV, "900")
    try:
        seconds = float(raw)
    except ValueError:
        seconds = -1.0
    if not 0 < seconds <= 86400:
        raise ValueError(f"{AS_OF_WAIT_ENV}={raw!r} is not a number of seconds between 0 and 86400")
    return {"timeout": seconds, "poke_interval": min(30.0, max(1.0, seconds / 30))}

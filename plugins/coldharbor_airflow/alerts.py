"""Freshness alerts: each registered table promises how far behind PostgreSQL its lake may fall
(`register_table(..., p_freshness => '5 minutes')`, 5 minutes unless asked).

The coldharbor_cdc DAG's `check_freshness` task runs after every cycle's exports (whether they
succeeded or not) and fails, naming each table, its lag and its promise, when a table's oldest
unexported change is older than its promise: an export failing, held by another run's lock, or too
slow for the write rate. Its failure is the alert: `alert_broken_promises` (its failure callback)
logs one line per table, and Airflow's notifiers (e-mail on failure, a Slack or SMTP notifier added
to `on_failure_callback` in dags/coldharbor_cdc.py) receive the same message. The health page shows
such a table red, with the rule.
"""

from __future__ import annotations

import logging
from typing import Any

from airflow.sdk.exceptions import AirflowFailException

from coldharbor_airflow.hooks import DEFAULT_CONN_ID, ColdharborHook
from coldharbor_airflow.paths import import_jobs_package

log = logging.getLogger(__name__)


def describe(broken: dict[str, Any]) -> str:
    lag, promise = float(broken["lag_s"]), float(broken["promise_s"])
    import_jobs_package()
    from coldharbor.runtime.errors import one_line

    name = one_line(broken["name"])  # a newline in a table's name must not forge a second log line
    why = (f"its initial load (or a new base after DDL) has been pending since {broken['oldest'].isoformat()}: "
           "the lake lacks the whole table" if broken.get("pending")
           else f"its oldest unexported change is from {broken['oldest'].isoformat()}")
    return f"{name!r} is {_duration(lag)} behind PostgreSQL, promised at most {_duration(promise)} ({why})"


def _duration(seconds: float) -> str:
    return f"{seconds:,.0f} s" if seconds < 120 else f"{seconds / 60:,.1f} min"


def check_freshness(conn_id: str = DEFAULT_CONN_ID) -> int:
    """The number of registered tables checked clean; AirflowFailException (no retry) naming every
    table whose freshness promise is broken."""
    broken = ColdharborHook(conn_id).broken_promises()
    if broken:
        raise AirflowFailException(
            f"freshness promise broken for {len(broken)} table(s): " + "; ".join(describe(b) for b in broken)
            + ". Is the table's export failing or held (see this run's export tasks), or slower than its writes?")
    return 0


def alert_broken_promises(context: dict[str, Any]) -> None:
    """on_failure_callback of check_freshness: the alert, one log line per table (a notifier added
    beside it receives the task's exception, which names them all)."""
    exception = context.get("exception")
    log.error("coldharbor freshness alert: %s", exception if exception is not None else "check_freshness failed")

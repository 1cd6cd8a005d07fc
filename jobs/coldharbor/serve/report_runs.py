"""`coldharbor.report_runs`: one row per report run, written when it starts and when it ends.

A running run holds a lease (sql/migrations/010_report_leases.sql): its session's advisory lock on the run's
lease id. A 'running' row whose lease nobody holds belongs to a process that was killed or lost
PostgreSQL; `expire_dead` records it as failed (cleanup and each new run call it).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime

import psycopg

from coldharbor.runtime import faults, settings
from coldharbor.runtime.pg import LOCK_NAMESPACES

log = logging.getLogger(__name__)


@dataclass
class RunRecord:
    run_id: str
    report: str
    target: str | None
    sink: str
    mode: str
    as_of: datetime | None
    degraded: bool = False
    missing_tier: str | None = None
    stale_since: datetime | None = None
    detail: str | None = None
    pg_snapshot_at: datetime | None = None
    lake_versions: dict[str, int | None] = field(default_factory=dict)
    dirty_rows: dict[str, int] = field(default_factory=dict)
    row_count: int | None = None
    served_from_postgres: list[str] = field(default_factory=list)  # `HotTable.postgres_alone`
    lease_id: int | None = None  # held by this process's session while the run is running


def _lease_key(lease_id: int) -> tuple[int, int]:
    return LOCK_NAMESPACES["report_run"], lease_id % 2**31


def start(conn: psycopg.Connection, run: RunRecord) -> None:
    """Takes the run's lease on `conn` (held until `succeed`/`fail` or the session ends), records
    the run as running, then expires the runs that died without finishing."""
    run.lease_id = conn.execute("SELECT nextval('coldharbor.report_run_leases')").fetchone()[0]
    conn.execute("SELECT pg_advisory_lock(%s, %s)", _lease_key(run.lease_id))  # before the row is visible
    _keep_alive(conn, settings.report_lease_seconds())
    conn.execute("""INSERT INTO coldharbor.report_runs (run_id, report, target, sink, mode, as_of, lease_id)
                    VALUES (%s, %s, %s, %s, %s, %s, %s)
                    ON CONFLICT (run_id) DO UPDATE   -- a retried task reuses its run id
                    SET state = 'running', error = NULL, started_at = now(), finished_at = NULL,
                        lease_id = EXCLUDED.lease_id""",
                 (run.run_id, run.report, run.target, run.sink, run.mode, run.as_of, run.lease_id))
    expire_dead(conn, f"report run {run.run_id}")
    faults.from_environment("report_started")


def _keep_alive(conn: psycopg.Connection, seconds: int) -> None:
    """The server drops this session within about `seconds` of its client vanishing (a lost host
    or network sends no FIN): TCP keepalives while idle, a send timeout while busy. A killed
    process's connection closes at once either way."""
    interval = max(1, seconds // 12)
    conn.execute("""SELECT set_config('tcp_keepalives_idle', %s, false), set_config('tcp_keepalives_interval', %s, false),
                           set_config('tcp_keepalives_count', '6', false), set_config('tcp_user_timeout', %s, false)""",
                 (str(seconds - 6 * interval), str(interval), str(seconds * 1000)))


# A running run whose lease is not held (no lease at all: a row from before leases existed).
_DEAD = """r.state = 'running'
           AND NOT EXISTS (SELECT 1 FROM pg_catalog.pg_locks l
                            WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 2
                              AND l.database = (SELECT oid FROM pg_catalog.pg_database WHERE datname = current_database())
                              AND l.classid = %(namespace)s::oid AND l.objid = (r.lease_id %% 2147483648)::oid)"""
_EXPIRE = """UPDATE coldharbor.report_runs r
                SET state = 'failed', finished_at = clock_timestamp(),
                    error = format('the run ended without finishing: its serve process was killed or lost '
                                   'PostgreSQL (the lease its session held while running is gone); recorded as '
                                   'failed by %%s at %%s', %(found_by)s::text, clock_timestamp())
              WHERE """ + _DEAD + " RETURNING r.run_id, r.report, r.started_at"


def expire_dead(conn: psycopg.Connection, found_by: str, dry_run: bool = False) -> list[str]:
    """Records as failed every 'running' run whose lease nobody holds (its process was killed or
    lost PostgreSQL); returns their run ids (with `dry_run`, those it would expire)."""
    params = {"namespace": LOCK_NAMESPACES["report_run"], "found_by": found_by}
    if dry_run:
        return [r[0] for r in conn.execute("SELECT r.run_id FROM coldharbor.report_runs r WHERE " + _DEAD,
                                           params).fetchall()]
    expired = conn.execute(_EXPIRE, params).fetchall()
    for run_id, report, started_at in expired:
        log.warning("report run %s (%s, started %s) died without finishing: recorded as failed", run_id, report,
                    started_at.isoformat())
    return [r[0] for r in expired]


def _figures(run: RunRecord) -> Mapping[str, object]:
    return {"run_id": run.run_id, "target": run.target, "sink": run.sink, "as_of": run.as_of,
            "degraded": run.degraded, "missing_tier": run.missing_tier,
            "stale_since": run.stale_since, "detail": run.detail, "pg_snapshot_at": run.pg_snapshot_at,
            "lake_versions": json.dumps(run.lake_versions), "dirty_rows": json.dumps(run.dirty_rows),
            "row_count": run.row_count, "served_from_postgres": run.served_from_postgres or None}


_FINISH = """UPDATE coldharbor.report_runs
                SET state = %(state)s, target = %(target)s, sink = %(sink)s, as_of = %(as_of)s,
                    degraded = %(degraded)s, missing_tier = %(missing_tier)s,
                    stale_since = %(stale_since)s, detail = %(detail)s, pg_snapshot_at = %(pg_snapshot_at)s,
                    lake_versions = %(lake_versions)s::jsonb, dirty_rows = %(dirty_rows)s::jsonb,
                    row_count = %(row_count)s, served_from_postgres = %(served_from_postgres)s,
                    error = %(error)s, finished_at = clock_timestamp()
              WHERE run_id = %(run_id)s"""

# A run refused before it started (a report the allow-list refuses) is recorded in one statement,
# already failed: it is never seen running.
_FAIL = """INSERT INTO coldharbor.report_runs (run_id, report, target, sink, mode, as_of, state, error, finished_at)
           VALUES (%(run_id)s, %(report)s, %(target)s, %(sink)s, %(mode)s, %(as_of)s, 'failed', %(error)s,
                   clock_timestamp())
           ON CONFLICT (run_id) DO UPDATE
           SET state = 'failed', target = EXCLUDED.target, sink = EXCLUDED.sink, as_of = EXCLUDED.as_of,
               degraded = %(degraded)s, missing_tier = %(missing_tier)s, stale_since = %(stale_since)s,
               detail = %(detail)s, pg_snapshot_at = %(pg_snapshot_at)s,
               lake_versions = %(lake_versions)s::jsonb, dirty_rows = %(dirty_rows)s::jsonb,
               row_count = %(row_count)s, error = EXCLUDED.error, finished_at = clock_timestamp()"""


def succeed(conn: psycopg.Connection, run: RunRecord) -> None:
    conn.execute(_FINISH, {**_figures(run), "state": "succeeded", "error": None})
    _release(conn, run)


def fail(conn: psycopg.Connection, run: RunRecord, error: str) -> None:
    """Records the run as failed, whether or not it was started."""
    # PostgreSQL text holds no NUL: an error quoting a value that held one is still recorded
    conn.execute(_FAIL, {**_figures(run), "report": run.report, "mode": run.mode,
                         "error": error.replace("\x00", "\\x00")[:2000]})
    _release(conn, run)


def _release(conn: psycopg.Connection, run: RunRecord) -> None:
    if run.lease_id is not None:
        conn.execute("SELECT pg_advisory_unlock(%s, %s)", _lease_key(run.lease_id))
        run.lease_id = None

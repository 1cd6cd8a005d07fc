"""`coldharbor.report_runs`: one row per report run, written when it starts and when it ends."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime

import psycopg


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
    served_from_postgres: list[str] = field(default_factory=list)  # tables whose initial load had not landed


def start(conn: psycopg.Connection, run: RunRecord) -> None:
    conn.execute("""INSERT INTO coldharbor.report_runs (run_id, report, target, sink, mode, as_of)
                    VALUES (%s, %s, %s, %s, %s, %s)
                    ON CONFLICT (run_id) DO UPDATE   -- a retried task reuses its run id
                    SET state = 'running', error = NULL, started_at = now(), finished_at = NULL""",
                 (run.run_id, run.report, run.target, run.sink, run.mode, run.as_of))


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


def fail(conn: psycopg.Connection, run: RunRecord, error: str) -> None:
    """Records the run as failed, whether or not it was started."""
    conn.execute(_FAIL, {**_figures(run), "report": run.report, "mode": run.mode, "error": error[:2000]})

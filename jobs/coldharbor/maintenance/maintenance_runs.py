"""`coldharbor.maintenance_runs`: one row per maintenance job run and table (compact, cleanup, purge)."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from datetime import datetime, timedelta, timezone

import psycopg

from coldharbor.runtime.errors import TableBusyError
from coldharbor.runtime.job_main import reason


def new_run_id(kind: str) -> str:
    return f"{kind}-{datetime.now(timezone.utc):%Y%m%dT%H%M%S}-{uuid.uuid4().hex[:8]}"


def start(conn: psycopg.Connection, run_id: str, table_id: int, kind: str) -> None:
    conn.execute("""INSERT INTO coldharbor.maintenance_runs (run_id, table_id, kind) VALUES (%s, %s, %s)
                    ON CONFLICT (run_id, table_id, kind) DO UPDATE
                       SET state = 'running', started_at = now(), finished_at = NULL, error = NULL""",
                 (run_id, table_id, kind))


def finish(conn: psycopg.Connection, run_id: str, table_id: int, kind: str, state: str,
           detail: Mapping[str, object] | None = None, lake_version: int | None = None,
           error: str | None = None) -> None:
    conn.execute("""UPDATE coldharbor.maintenance_runs
                       SET state = %s, detail = %s, lake_version = %s, error = %s, finished_at = now()
                     WHERE run_id = %s AND table_id = %s AND kind = %s""",
                 (state, json.dumps(dict(detail or {}), default=str), lake_version, error, run_id, table_id, kind))


def full_compaction_due(conn: psycopg.Connection, table_id: int, every: timedelta) -> bool:
    """Whether the table's last compaction that rewrote a partition fully (status `compacted`)
    finished longer than `every` ago, or never did."""
    last = conn.execute("""SELECT max(finished_at) FROM coldharbor.maintenance_runs
                            WHERE table_id = %s AND kind = 'compact' AND state = 'succeeded'
                              AND detail ->> 'status' = 'compacted'""", (table_id,)).fetchone()[0]
    return last is None or last < datetime.now(timezone.utc) - every


@contextmanager
def recorded(conn: psycopg.Connection, run_id: str, table_id: int, kind: str) -> Iterator[None]:
    """Starts the run's row; an error inside the block ends it (skipped when the table was busy,
    else failed, with the error's first line) and goes on. Success is the block's to record."""
    start(conn, run_id, table_id, kind)
    try:
        yield
    except Exception as exc:
        state = "skipped" if isinstance(exc, TableBusyError) else "failed"
        finish(conn, run_id, table_id, kind, state, error=reason(exc))
        raise

"""The PostgreSQL side of an export batch: intent, mark (compare-and-set by change id), abandon.

Publish order (invariant 3): intent -> Delta commit -> mark. The intent row holds the exact change
ids read in the export snapshot, so the mark never touches a change the lake does not hold, and a
run that died after the commit can be finished by the next one.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

import psycopg

from coldharbor import faults

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Batch:
    table_id: int
    batch_id: int
    change_count: int
    row_count: int
    oldest_change_at: datetime | None


def begin(conn: psycopg.Connection, table_id: int, run_id: str, change_ids: Sequence[int],
          row_count: int, oldest_change_at: datetime | None) -> Batch:
    """Allocates the next batch id of the table and records the batch's change ids (committed)."""
    with conn.transaction():
        batch_id = conn.execute(
            "UPDATE coldharbor.tables SET last_batch_id = last_batch_id + 1 WHERE table_id = %s "
            "RETURNING last_batch_id", (table_id,)).fetchone()[0]
        conn.execute(
            """INSERT INTO coldharbor.export_batches
                   (table_id, batch_id, run_id, change_ids, change_count, row_count, oldest_change_at)
               VALUES (%s, %s, %s, %s, %s, %s, %s)""",
            (table_id, batch_id, run_id, list(change_ids), len(change_ids), row_count, oldest_change_at))
    return Batch(table_id, batch_id, len(change_ids), row_count, oldest_change_at)


def mark_flushed(conn: psycopg.Connection, table_id: int, batch_id: int, lake_version: int,
                 hook: faults.Hook = faults.from_environment) -> int:
    """Marks exactly the batch's change ids flushed at `lake_version`; returns how many it marked.

    The batch keeps its change ids: a report that pinned an older lake version finds through them
    the changes this mark made invisible to `flushed_at IS NULL` (invariant 6).
    """
    with conn.transaction():
        marked = conn.execute(
            """UPDATE coldharbor.change_log c
                  SET flushed_at = now(), lake_version = %(version)s
                 FROM (SELECT unnest(change_ids) AS id FROM coldharbor.export_batches
                        WHERE table_id = %(table)s AND batch_id = %(batch)s AND state = 'pending') m
                WHERE c.id = m.id AND c.flushed_at IS NULL""",
            {"version": lake_version, "table": table_id, "batch": batch_id}).rowcount
        hook("during_mark")  # the change rows are updated, the transaction not committed
        conn.execute(
            """UPDATE coldharbor.export_batches
                  SET state = 'flushed', lake_version = %s, finished_at = now()
                WHERE table_id = %s AND batch_id = %s""", (lake_version, table_id, batch_id))
    return marked


def abandon(conn: psycopg.Connection, table_id: int, batch_id: int) -> None:
    """A batch that never reached the lake: its changes simply stay dirty for the next batch."""
    conn.execute("""UPDATE coldharbor.export_batches
                       SET state = 'abandoned', finished_at = now(), change_ids = NULL
                     WHERE table_id = %s AND batch_id = %s AND state = 'pending'""", (table_id, batch_id))


def pending(conn: psycopg.Connection, table_id: int) -> list[int]:
    rows = conn.execute("SELECT batch_id FROM coldharbor.export_batches "
                        "WHERE table_id = %s AND state = 'pending' ORDER BY batch_id", (table_id,))
    return [r[0] for r in rows.fetchall()]

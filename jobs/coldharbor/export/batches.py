"""The PostgreSQL side of an export batch: intent, mark (compare-and-set by change id), abandon.

Publish order (invariant 3): intent -> Delta commit -> mark. The intent row holds the exact change
ids read in the export snapshot, so the mark never touches a change the lake does not hold, and a
run that died after the commit can be finished by the next one.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

import psycopg
from psycopg import sql

from coldharbor.capture.registry import RegisteredTable
from coldharbor.export import hot_reader
from coldharbor.runtime import faults


@dataclass(frozen=True)
class Batch:
    table_id: int
    batch_id: int
    change_count: int
    row_count: int
    oldest_change_at: datetime | None
    commit_token: str     # written into the Delta commit: tells this batch's commit from a reused id's


def next_batch_id(conn: psycopg.Connection, table_id: int) -> int:
    """The batch id the table's next batch (export or base) takes, as the caller's snapshot sees it."""
    return conn.execute("SELECT last_batch_id + 1 FROM coldharbor.tables WHERE table_id = %s",
                        (table_id,)).fetchone()[0]


def begin(conn: psycopg.Connection, table: RegisteredTable, run_id: str, row_count: int) -> Batch:
    """Allocates the next batch id of the table and records as the batch's change ids every dirty
    change of the table in the caller's transaction: the export's snapshot, the one its images
    were read in. The caller commits it before the Delta commit."""
    batch_id = conn.execute(
        "UPDATE coldharbor.tables SET last_batch_id = last_batch_id + 1 WHERE table_id = %s "
        "RETURNING last_batch_id", (table.table_id,)).fetchone()[0]
    change_count, oldest_change_at, token = conn.execute(sql.SQL(
        """INSERT INTO coldharbor.export_batches
               (table_id, batch_id, run_id, change_ids, change_count, row_count, oldest_change_at)
           SELECT {table_id}, {batch_id}, {run_id}, intent.ids, intent.n, {row_count}, intent.oldest
             FROM ({intent}) intent(ids, n, oldest)
           RETURNING change_count, oldest_change_at, commit_token::text""").format(
        table_id=sql.Literal(table.table_id), batch_id=sql.Literal(batch_id), run_id=sql.Literal(run_id),
        row_count=sql.Literal(row_count), intent=hot_reader.intent_query(table))).fetchone()
    return Batch(table.table_id, batch_id, change_count, row_count, oldest_change_at, token)


# The batch's change rows, marked flushed. Planned with nested loops off: with statistics taken
# while the table had no dirty change (the usual state between exports), PostgreSQL expects one
# dirty row and may scan the whole batch's change ids once per dirty row, quadratic: a 300,000-row
# mark ran for more than 5 minutes (holding the table's export lock) where a hash join takes 1 s.
# The hash holds the batch's change rows in memory: 1,000,000 marked in 2.9 s with the export's
# work_mem, 4.1 s spilling in PostgreSQL's default 4MB (as fast as the nested loop on fresh statistics).
MARK_PLANNING = f"SET LOCAL enable_nestloop = off; SET LOCAL work_mem = '{hot_reader.EXPORT_WORK_MEM}'"
MARK = """UPDATE coldharbor.change_log c
             SET flushed_at = now(), lake_version = %(version)s
            FROM (SELECT unnest(change_ids) AS id FROM coldharbor.export_batches
                   WHERE table_id = %(table)s AND batch_id = %(batch)s AND state = 'pending') m
           WHERE c.table_id = %(table)s AND c.id = m.id AND c.flushed_at IS NULL"""


def mark_flushed(conn: psycopg.Connection, table_id: int, batch_id: int, lake_version: int,
                 hook: faults.Hook = faults.from_environment) -> int:
    """Marks exactly the batch's change ids flushed at `lake_version`; returns how many it marked.

    The changes keep `lake_version`: a report that pinned an older lake version finds through it
    the changes this mark made invisible to `flushed_at IS NULL` (invariant 6).
    """
    with conn.transaction():
        conn.execute(MARK_PLANNING)
        marked = conn.execute(MARK, {"version": lake_version, "table": table_id, "batch": batch_id}).rowcount
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


def pending(conn: psycopg.Connection, table_id: int) -> list[tuple[int, str, str | None]]:
    """(batch id, kind, commit token) of the table's batches whose intent is recorded and whose end
    is not. The token is None for a batch recorded before commit tokens (sql/migrations/012)."""
    rows = conn.execute("SELECT batch_id, kind, commit_token::text FROM coldharbor.export_batches "
                        "WHERE table_id = %s AND state = 'pending' ORDER BY batch_id", (table_id,))
    return [(r[0], r[1], r[2]) for r in rows.fetchall()]

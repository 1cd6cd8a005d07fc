"""What an export checks and finishes before it reads anything new: the batches a dead run left
between intent and mark (finished if their commit landed, else fenced and abandoned: invariants 3
and 4), and the lake it would write to (refused when Delta already holds the next batch id, or when
the lake table is gone although batches were committed there)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TypeVar

import psycopg
from pyspark.sql import SparkSession

from coldharbor.capture.registry import RegisteredTable
from coldharbor.export import base_load, batches
from coldharbor.lake import commits, delta
from coldharbor.runtime import pg
from coldharbor.runtime.errors import LakeUnavailableError

log = logging.getLogger(__name__)


T = TypeVar("T")


def refuse_if_lake_ahead(spark: SparkSession, conn: psycopg.Connection, table: RegisteredTable, path: str) -> None:
    """LakeAheadError, before anything is read or recorded, when Delta already recorded the batch id
    the next batch would take: the append would be skipped as a replay. Checked before the intent,
    so a refused run uses up no batch id and every retry is refused until a resync."""
    commits.require_unused_batch_id(spark, path, commits.export_app_id(table.table_id),
                                 batches.next_batch_id(conn, table.table_id), table.qualified_name)


def refuse_if_lake_gone(spark: SparkSession, conn: psycopg.Connection, table: RegisteredTable, path: str) -> None:
    """LakeUnavailableError when there is no lake table at `path` although batches of the table were
    committed there: a batch of changes alone would start a lake without the table's other rows.
    A new base (resync) starts the lake again, and as-of history with it (`base_state.starts_lake`)."""
    if delta.pin_version(spark, path) is not None:
        return
    committed = conn.execute("SELECT EXISTS (SELECT 1 FROM coldharbor.export_batches WHERE table_id = %s "
                             "AND state = 'flushed')", (table.table_id,)).fetchone()[0]
    if committed:
        raise LakeUnavailableError(
            f"there is no lake table of {table.quoted_name} at {path}, although batches of it were committed there "
            "(it was moved aside or removed, or the lake root is wrong); nothing was exported. Restore it or fix the "
            f"lake root; if it was moved aside on purpose, write it whole again from PostgreSQL with "
            f"`jobs/resync.py --table {table.cli_name}`")


def recover_pending(spark: SparkSession, conn: psycopg.Connection, table: RegisteredTable, path: str,
                    abandon_foreign: bool = False) -> int:
    """Finishes batches whose run died after the intent: mark (or record the base) if committed,
    else abandon. An abandoned initial load stays pending and is written again.

    A batch whose id the lake holds from another export (PostgreSQL restored from a backup) is a
    LakeAheadError; with `abandon_foreign` (resync, which rebuilds the lake from PostgreSQL) it is
    abandoned instead, its changes left dirty."""
    app_id = commits.export_app_id(table.table_id)
    pending = batches.pending(conn, table.table_id)
    for batch_id, kind, token in pending:
        try:
            if kind in base_load.KINDS:
                def finish():
                    return base_load.finish_if_committed(spark, conn, table, path, batch_id, kind, token)

                if committed_or_fenced(spark, conn, table, path, batch_id, finish) is None:
                    batches.abandon(conn, table.table_id, batch_id)
                    log.warning("%s: the %s in batch %s never reached the lake; it is written again",
                                table.qualified_name, kind, batch_id)
                continue
            version = committed_or_fenced(spark, conn, table, path, batch_id, lambda: commits.find_batch_commit(
                spark, path, app_id, batch_id, token, table.qualified_name))
        except commits.LakeAheadError:
            if not abandon_foreign:
                raise
            batches.abandon(conn, table.table_id, batch_id)
            log.warning("%s: batch %s's id is held in the lake by another export; abandoned, its changes stay dirty",
                        table.qualified_name, batch_id)
            continue
        if version is None:
            batches.abandon(conn, table.table_id, batch_id)
            log.warning("%s: batch %s never reached the lake; its changes stay dirty and go in a new batch",
                        table.qualified_name, batch_id)
        else:
            marked = batches.mark_flushed(conn, table.table_id, batch_id, version)
            log.warning("%s: batch %s was committed as Delta version %s but not marked; marked %s changes now",
                        table.qualified_name, batch_id, version, marked)
    return len(pending)


def committed_or_fenced(spark: SparkSession, conn: psycopg.Connection, table: RegisteredTable, path: str,
                        batch_id: int, find: Callable[[], T | None]) -> T | None:
    """What `find` finds of a pending batch's commit; when it finds nothing, the batch is fenced
    first (`commits.fence_batch`: a write of it still running, as on a Spark Connect server whose client
    died, can then never land) and looked for once more, in case it landed just before the fence."""
    found = find()
    if found is None:
        with pg.lake_commit_lock(conn, table.table_id, path):
            commits.fence_batch(spark, path, commits.export_app_id(table.table_id), batch_id)
        found = find()
    return found

"""The changes an incremental refresh applies: every change after the state's lake version as signed
rows (minus the row a key's first change removed, plus the row its last change left), read in one
PostgreSQL snapshot taken after the lake version was pinned, as a report reads.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import psycopg
import pyarrow as pa
from psycopg import sql

from coldharbor.capture import registry
from coldharbor.capture.registry import LakeColumn, RegisteredTable
from coldharbor.export import base_state, hot_reader, image_sql
from coldharbor.lake import lake_values
from coldharbor.serve.hot_snapshot import arrow_type
from coldharbor.serve.incremental_state import Frontier

SIGN, COLD, HOT, VALID = "_ch_sign", "_ch_cold", "_ch_hot", "_ch_valid"


@dataclass(frozen=True)
class Window:
    version: int                 # P: the lake version pinned before the snapshot (the cold part's)
    batch_id: int                # the newest batch it holds
    changes: pa.Table            # signed rows (the columns, SIGN, COLD, HOT, VALID)
    cold_valid: str | None       # why the window (V, V1] cannot be applied to the state, or None
    now: str                     # PostgreSQL's now() (ISO 8601)


def changes_query(table: RegisteredTable, columns: Sequence[LakeColumn], since: int, pinned: int) -> sql.Composed:
    """Signed rows of every change after lake version `since` (flushed since, or dirty). A key's
    flushed changes come before its dirty ones (a key's writers queue on its row lock), so its
    trail is a COLD part, from its row at `since` to its row at V1 (the newest flushed batch), then
    a HOT part, from there to its row now. COLD rows: minus the first change's old row, plus the
    last flushed change's row; HOT rows: minus the row at V1 (that same row, or the first change's
    old row when none was flushed), plus the last change's row. VALID false (one row, no values)
    for a key whose changes do not chain or miss a row they need."""
    def values(image: str):
        return image_sql.checked_select(columns, lambda c: image_sql.logged_image_value(c, image),
                                         through_jdbc=False)

    return sql.SQL("""
        WITH logged AS (
            SELECT c.key AS k, c.id, c.op, c.flushed_at IS NOT NULL AND c.lake_version <= {pinned} AS cold,
                   CASE WHEN c.op <> 'D' AND {usable_new} THEN c.image END AS image,
                   CASE WHEN c.op <> 'I' AND {usable_old} THEN c.old_image END AS old_image,
                   CASE WHEN c.op <> 'D' AND {readable} THEN {image_hash} END AS new_hash, c.old_hash
              FROM coldharbor.change_log c
             WHERE c.table_id = {table_id} AND (c.flushed_at IS NULL OR c.lake_version > {since})),
        changes AS (
            SELECT *, {chained} AS chained,
                   row_number() OVER (PARTITION BY k ORDER BY id) AS nth,
                   row_number() OVER (PARTITION BY k ORDER BY id DESC) AS nth_back,
                   row_number() OVER (PARTITION BY k, cold ORDER BY id DESC) AS nth_back_here
              FROM logged),
        keys AS (
            SELECT *, bool_and(chained AND (op = 'D' OR image IS NOT NULL)) OVER (PARTITION BY k)
                      AND bool_and(nth > 1 OR op = 'I' OR old_image IS NOT NULL) OVER (PARTITION BY k) AS fine,
                      bool_or(NOT cold) OVER (PARTITION BY k) AS has_hot
              FROM changes)
        SELECT {old_values}, -1 AS {sign}, cold AS {cold}, NOT cold AS {hot}, true AS {valid}
          FROM keys d WHERE fine AND nth = 1 AND op <> 'I'
        UNION ALL
        SELECT {new_values}, 1, true, false, true
          FROM keys d WHERE fine AND cold AND nth_back_here = 1 AND op <> 'D'
        UNION ALL
        SELECT {new_values}, -1, false, true, true
          FROM keys d WHERE fine AND cold AND nth_back_here = 1 AND op <> 'D' AND has_hot
        UNION ALL
        SELECT {new_values}, 1, false, true, true
          FROM keys d WHERE fine AND NOT cold AND nth_back = 1 AND op <> 'D'
        UNION ALL
        SELECT {no_values}, 0, false, false, false
          FROM keys d WHERE NOT fine AND nth = 1""").format(
        usable_new=hot_reader.image_usable(table, columns, "c.image"),
        usable_old=hot_reader.image_usable(table, columns, "c.old_image"),
        readable=hot_reader.image_readable(table, columns), image_hash=hot_reader.image_hash(columns),
        table_id=sql.Literal(table.table_id), since=sql.Literal(since), pinned=sql.Literal(pinned), chained=hot_reader.chained(sql.SQL("k")),
        old_values=values("d.old_image"), new_values=values("d.image"),
        no_values=sql.SQL(", ").join([sql.SQL("NULL") for _ in columns] + [sql.SQL("NULL")]),
        sign=sql.Identifier(SIGN), cold=sql.Identifier(COLD), hot=sql.Identifier(HOT),
        valid=sql.Identifier(VALID))


def _fetch(conn: psycopg.Connection, query: sql.Composed, columns: Sequence[LakeColumn]) -> pa.Table:
    schema = pa.schema([pa.field(c.name, arrow_type(c.lake_type)) for c in columns]
                       + [pa.field(lake_values.PROBLEM, pa.string()), pa.field(SIGN, pa.int32()),
                          pa.field(COLD, pa.bool_()), pa.field(HOT, pa.bool_()), pa.field(VALID, pa.bool_())])
    batches = []
    with conn.cursor(name="coldharbor_incremental") as cur:
        cur.itersize = 10_000
        cur.execute(query)
        while rows := cur.fetchmany(10_000):
            batches.append(pa.record_batch([pa.array(col, type=f.type) for col, f in zip(zip(*rows), schema)],
                                           schema=schema))
    return pa.Table.from_batches(batches, schema=schema)


def read_window(conn: psycopg.Connection, table: RegisteredTable, columns: Sequence[LakeColumn],
                frontier: Frontier | None, pinned: int | None, committed: int | None,
                why_none: str = "no state yet") -> Window | str:
    """The changes to apply, read in one snapshot taken after the lake version `pinned` (P) and
    its newest committed batch id `committed` were read, as a report pins its versions; or why
    none can be (the run is a full refresh). The cold part is lake@P: every batch committed there
    must be marked flushed in the snapshot (else an export is between its commit and its mark)."""
    with conn.transaction():
        conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
        registry.guard_read(conn, table)
        load = base_state.load_state(conn, table.table_id)
        if load.pending:
            return f"{table.qualified_name} is waiting for its initial load or a new base"
        if pinned is None:
            return f"{table.qualified_name} has nothing in the lake yet"
        flushed, batch_id = conn.execute(
            """SELECT max(batch_id), max(batch_id) FILTER (WHERE lake_version <= %s)
                 FROM coldharbor.export_batches WHERE table_id = %s AND state = 'flushed'""",
            (pinned, table.table_id)).fetchone()
        if batch_id is None:
            return f"{table.qualified_name} has nothing in the lake yet"
        if committed is not None and committed > flushed:
            return "an export of the table is between its lake commit and its mark"
        now = conn.execute("SELECT now()").fetchone()[0].isoformat()
        cold_valid = why_none if frontier is None else _window_problem(conn, table, frontier, batch_id, pinned)
        since = frontier.version if frontier is not None and cold_valid is None else pinned
        changes = _fetch(conn, changes_query(table, columns, since, pinned), columns)
    return Window(pinned, batch_id, changes, cold_valid, now)


def _window_problem(conn: psycopg.Connection, table: RegisteredTable, frontier: Frontier, batch_id: int,
                    version: int) -> str | None:
    """Why the changes of lake versions (frontier, version] cannot move the state there, or None."""
    if version < frontier.version or batch_id < frontier.batch_id:
        return "the lake or its newest batch is older than the state's (restored from a backup?)"
    tid = table.table_id
    kinds = conn.execute("""SELECT count(*), count(*) FILTER (WHERE kind <> 'changes' AND state = 'flushed'),
                                   coalesce(sum(change_count) FILTER (WHERE kind = 'changes' AND state = 'flushed'), 0)
                              FROM coldharbor.export_batches
                             WHERE table_id = %s AND batch_id > %s AND batch_id <= %s""",
                         (tid, frontier.batch_id, batch_id)).fetchone()
    if kinds[0] != batch_id - frontier.batch_id:
        return "batches of its window were pruned from the change log"
    if kinds[1]:
        return "a new base (initial load, resync or rebase after DDL) was written since"
    logged = conn.execute("SELECT count(*) FROM coldharbor.change_log WHERE table_id = %s AND lake_version > %s "
                          "AND lake_version <= %s", (tid, frontier.version, version)).fetchone()[0]
    if logged != kinds[2]:
        return "changes of its window were pruned from the change log"
    purged = conn.execute("""SELECT count(*) FROM coldharbor.maintenance_runs WHERE table_id = %s AND kind = 'purge'
                               AND (finished_at IS NULL OR finished_at >= %s::timestamptz)""",
                          (tid, frontier.built_at)).fetchone()[0]
    if purged:
        return "keys were purged since"
    return None

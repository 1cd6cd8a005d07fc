"""Reads a whole table from one exported PostgreSQL snapshot, in parallel, with Spark's JDBC reader.

The initial load, resync and verify read every row of a table as one consistent image: a
transaction exports its snapshot (`pg_export_snapshot()`), and each JDBC reader imports it
(`SET TRANSACTION SNAPSHOT`) before reading its share. Shares are ranges of the table's physical
blocks (`ctid`, a TID range scan: each reader reads only its blocks, whatever the key's type),
the last one open-ended so rows on blocks added after the estimate are still read exactly once.
A select takes ACCESS SHARE only: the application's writes are never blocked.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

import psycopg
from psycopg import sql
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from coldharbor.errors import UnrepresentableValueError
from coldharbor.hot_reader import AS_TEXT, snapshot_read
from coldharbor.pg import JdbcTarget
from coldharbor.registry import LakeColumn, RegisteredTable
from coldharbor.spark import parallelism as spark_parallelism


@dataclass(frozen=True)
class TableSnapshot:
    """An exported snapshot, held open by the transaction of the connection that exported it."""

    snapshot_id: str
    taken_at: datetime      # a clock reading after the snapshot was taken: it holds every commit before this
    blocks: int             # the table's size in blocks when the snapshot was taken (an estimate for shares)


def export_snapshot(conn: psycopg.Connection, table: RegisteredTable) -> TableSnapshot:
    """Exports the snapshot of the transaction open on `conn` (REPEATABLE READ, set by the caller).

    `taken_at` is read in the statement that takes the snapshot, after it: every transaction the
    snapshot holds committed before `taken_at`.
    """
    snapshot_id, taken_at = conn.execute("SELECT pg_export_snapshot(), clock_timestamp()").fetchone()
    blocks = conn.execute(sql.SQL(
        "SELECT coalesce(max(pg_relation_size(r.relid) / current_setting('block_size')::bigint), 0) "
        "FROM pg_partition_tree({rel}::regclass) r WHERE r.isleaf").format(
        rel=sql.Literal(table.identifier.as_string(conn)))).fetchone()[0]
    return TableSnapshot(snapshot_id, taken_at, int(blocks))


# Dates and timestamps the lake holds exactly: Spark's range (years 1 to 9999, so no infinity and no
# BC), less the ten days 1582-10-05..14, which the JDBC driver's Julian/Gregorian calendar lacks (it
# moves them ten days on). Timestamps with time zone are checked in UTC, as the lake holds them.
DATE_RANGE = ("0001-01-01", "9999-12-31 23:59:59.999999")
CALENDAR_GAP = ("1582-10-05", "1582-10-14")
DATE_TYPES = {"DATE", "TIMESTAMP_NTZ", "TIMESTAMP"}  # lake types; TIMESTAMP is timestamptz


def refuse_unrepresentable(conn: psycopg.Connection, table: RegisteredTable, columns: Sequence[LakeColumn]) -> None:
    """Raises UnrepresentableValueError, naming the column, the value and its key, when a date or
    timestamp of the table (in the caller's snapshot) lies outside what the lake holds exactly:
    written, it would fail the Delta write or land as another day. One scan, stopped at the first."""
    def outside(c: LakeColumn) -> sql.Composable:
        value = sql.SQL("t.{}").format(sql.Identifier(c.name))
        if c.lake_type == "TIMESTAMP":
            value = sql.SQL("({} AT TIME ZONE 'UTC')").format(value)
        return sql.SQL("NOT ({v} BETWEEN {lo} AND {hi} AND {v}::date NOT BETWEEN {g0} AND {g1})").format(
            v=value, lo=sql.Literal(DATE_RANGE[0]), hi=sql.Literal(DATE_RANGE[1]),
            g0=sql.Literal(CALENDAR_GAP[0]), g1=sql.Literal(CALENDAR_GAP[1]))

    dated = [c for c in columns if c.lake_type in DATE_TYPES]
    if not dated:
        return
    keys = [c for c in columns if c.is_key]
    row = conn.execute(sql.SQL("SELECT {keys}, {found} FROM {table} t WHERE {any} LIMIT 1").format(
        keys=sql.SQL(", ").join(sql.SQL("t.{}::text").format(sql.Identifier(k.name)) for k in keys),
        found=sql.SQL(", ").join(sql.SQL("CASE WHEN {} THEN t.{}::text END").format(outside(c), sql.Identifier(c.name))
                                 for c in dated),
        table=table.identifier, any=sql.SQL(" OR ").join(outside(c) for c in dated))).fetchone()
    if row is None:
        return
    key = ", ".join(f"{k.name}={v}" for k, v in zip(keys, row))
    column, value = next((c.name, v) for c, v in zip(dated, row[len(keys):]) if v is not None)
    raise UnrepresentableValueError(
        f"{table.qualified_name}: column {column} holds {value!r} (row {key}), which the lake cannot hold exactly: "
        f"dates and timestamps must lie from {DATE_RANGE[0]} to 9999-12-31 (no infinity, no BC) and outside "
        f"{CALENDAR_GAP[0]}..{CALENDAR_GAP[1]}; nothing of the table was written. Change such values; the next "
        "run reads the table again")


def block_ranges(blocks: int, parts: int) -> list[tuple[int | None, int | None]]:
    """[start, end) block ranges covering the table: the first starts at None (block 0), the last
    ends at None (open: blocks added later are read too). One range for a small table."""
    parts = max(1, min(parts, blocks))
    if parts == 1:
        return [(None, None)]
    step = -(-blocks // parts)
    bounds = [i * step for i in range(1, parts) if i * step < blocks]
    starts = [None, *bounds]
    ends = [*bounds, None]
    return list(zip(starts, ends))


def share_query(table: RegisteredTable, columns: Sequence[LakeColumn], start: int | None,
                end: int | None) -> sql.Composed:
    """The rows of one block range, typed for the lake (uuid and json as text)."""
    def output(c: LakeColumn) -> sql.Composable:
        expr = sql.SQL("t.{}").format(sql.Identifier(c.name))
        if c.pg_type in AS_TEXT:
            expr = sql.SQL("({})::text").format(expr)
        return sql.SQL("{} AS {}").format(expr, sql.Identifier(c.name))

    bounds = []
    if start is not None:
        bounds.append(sql.SQL("t.ctid >= {}::tid").format(sql.Literal(f"({start},0)")))
    if end is not None:
        bounds.append(sql.SQL("t.ctid < {}::tid").format(sql.Literal(f"({end},0)")))
    where = sql.SQL(" WHERE ") + sql.SQL(" AND ").join(bounds) if bounds else sql.SQL("")
    return sql.SQL("SELECT {columns} FROM {table} t{where}").format(
        columns=sql.SQL(", ").join(output(c) for c in columns), table=table.identifier, where=where)


# A reader waits at most this long for its ACCESS SHARE lock. It waits at all only behind a stronger
# lock requested after the exporting transaction locked the table (a TRUNCATE, a rewriting ALTER
# TABLE, VACUUM FULL): that request waits for the exporter, which waits for its readers, a cycle
# PostgreSQL cannot see, with the application's statements queued behind it. The reader gives up,
# the exporter rolls back, the application's statement goes through; the next run reads again.
READER_LOCK_TIMEOUT = "5s"


def read_table(spark: SparkSession, conn: psycopg.Connection, jdbc: JdbcTarget, snapshot: TableSnapshot,
               table: RegisteredTable, columns: Sequence[LakeColumn], parts: int | None = None) -> DataFrame:
    """Every row of the table as of `snapshot`, one JDBC reader per core (or `parts`).

    Lazy: each action re-reads, so the exporting transaction must stay open until the last action
    over the frame has run (an import needs the exporter alive). Columns keep their JDBC types;
    callers cast with their own contract.
    """
    parts = parts or spark_parallelism(spark)
    frame = None
    for start, end in block_ranges(snapshot.blocks, parts):
        share = snapshot_read(spark, jdbc, share_query(table, columns, start, end).as_string(conn),
                              snapshot.snapshot_id, lock_timeout=READER_LOCK_TIMEOUT)
        frame = share if frame is None else frame.union(share)
    return frame.select(*[F.col(c.name) for c in columns])

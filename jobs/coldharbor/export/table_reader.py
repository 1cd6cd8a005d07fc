"""Reads a whole table from one exported PostgreSQL snapshot, in parallel, with Spark's JDBC reader.

The initial load, resync and verify read every row of a table as one consistent image: a
transaction exports its snapshot (`pg_export_snapshot()`), and each JDBC reader imports it
(`SET TRANSACTION SNAPSHOT`) before reading its share. Shares are ranges of the table's physical
blocks (`ctid`, a TID range scan: each reader reads only its blocks, whatever the key's type),
the last one open-ended so rows on blocks added after the estimate are still read exactly once.
A select takes ACCESS SHARE only: the application's writes are never blocked.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime

import psycopg
from psycopg import sql
from pyspark.sql import DataFrame, SparkSession

from coldharbor.capture.registry import LakeColumn, RegisteredTable
from coldharbor.export.hot_reader import snapshot_read
from coldharbor.export.image_sql import as_output
from coldharbor.lake.lake_rows import column
from coldharbor.runtime.pg import JdbcTarget
from coldharbor.runtime.spark_parallelism import parallelism as spark_parallelism


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
    return TableSnapshot(snapshot_id, taken_at, table_blocks(conn, table))


def table_blocks(conn: psycopg.Connection, table: RegisteredTable) -> int:
    """The table's size in blocks, or its largest partition's (a TID range applies to each partition).

    pg_partition_tree() lists nothing for a table that is neither partitioned nor a partition: the
    table's own size counts too, else every plain table was read by one reader."""
    blocks = conn.execute(sql.SQL(
        "SELECT greatest(pg_relation_size(rel.oid), "
        "                (SELECT coalesce(max(pg_relation_size(r.relid)), 0) "
        "                   FROM pg_partition_tree(rel.oid) r WHERE r.isleaf)) / current_setting('block_size')::bigint "
        "FROM (SELECT {rel}::regclass AS oid) rel").format(
        rel=sql.Literal(table.identifier.as_string(conn)))).fetchone()[0]
    return int(blocks)


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


def block_range(start: int | None, end: int | None) -> sql.Composable:
    """SQL true for the rows of `t` in the blocks [start, end) (a TID range scan); TRUE for (None, None)."""
    bounds = []
    if start is not None:
        bounds.append(sql.SQL("t.ctid >= {}::tid").format(sql.Literal(f"({start},0)")))
    if end is not None:
        bounds.append(sql.SQL("t.ctid < {}::tid").format(sql.Literal(f"({end},0)")))
    return sql.SQL(" AND ").join(bounds) if bounds else sql.SQL("TRUE")


def share_query(table: RegisteredTable, columns: Sequence[LakeColumn], share: sql.Composable) -> sql.Composed:
    """The rows of one share (`block_range`), typed for the lake (uuid and json as text)."""
    return sql.SQL("SELECT {columns} FROM {table} t WHERE {share}").format(
        columns=sql.SQL(", ").join(as_output(c, sql.SQL("t.{}").format(sql.Identifier(c.name))) for c in columns),
        table=table.identifier, share=share)


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
    frame = read_shares(spark, conn, jdbc, snapshot, lambda share: share_query(table, columns, share), parts)
    return frame.select(*[column(c.name) for c in columns])


def read_shares(spark: SparkSession, conn: psycopg.Connection, jdbc: JdbcTarget, snapshot: TableSnapshot,
                query: Callable[[sql.Composable], sql.Composed], parts: int | None = None) -> DataFrame:
    """The union of `query(share)` over the table's block ranges, one JDBC reader per core (or
    `parts`), each importing `snapshot`: a query over the table's rows `t` that is true to the
    snapshot and reads each row exactly once when it selects `WHERE share`. Lazy, as `read_table`."""
    parts = parts or spark_parallelism(spark)
    frame = None
    for start, end in block_ranges(snapshot.blocks, parts):
        share = snapshot_read(spark, jdbc, query(block_range(start, end)).as_string(conn),
                              snapshot.snapshot_id, lock_timeout=READER_LOCK_TIMEOUT)
        frame = share if frame is None else frame.union(share)
    return frame

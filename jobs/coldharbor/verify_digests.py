"""The two sides verify compares: per chunk, PostgreSQL's rows counted and digested inside
PostgreSQL, and the unified view's rows digested in Spark, both cut into the same chunks.

PostgreSQL's side never leaves the server: each reader sends back one row per chunk (count, XOR of
the rows' `row_digest`s, the first key column's bounds) for its block range of the table, so the
whole table costs PostgreSQL a scan and Spark next to nothing. The lake's side is the view every
report reads (invariant 6), reduced to keys and a digest before its last-write-wins window, so the
window sorts a key and three numbers per lake row rather than whole rows.

Chunks are ranges of the first key column's position -- the value of an integer, the days or
microseconds since 1970 of a date or timestamp: integer arithmetic, the same in both engines --
when it has one; else hash buckets of the key's digest.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import psycopg
from psycopg import sql
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from coldharbor import hot_reader, lake, lake_values, row_digest
from coldharbor.hot_snapshot import HotTable
from coldharbor.lake_rows import BATCH_ID, DELETED, SEQ, latest_per_key
from coldharbor.registry import LakeColumn, RegisteredTable

CHUNK = "_ch_chunk"
HASH = "_ch_hash"
RANGE_TYPES = ("SHORT", "INT", "LONG", "DATE", "TIMESTAMP", "TIMESTAMP_NTZ")
# Positions further apart than this would overflow a bigint in the range arithmetic: hash buckets.
MAX_SPAN = 1 << 62
# The lake rows outside the biggest batch whose keys are broadcast to every task (the biggest
# batch then needs no shuffle): at most this many, else the keys are shuffled as usual.
BROADCAST_KEYS = 2_000_000


@dataclass(frozen=True)
class Chunking:
    """How rows are cut into `chunks`, alike in SQL and in Spark: ranges of `width` positions from
    `low` to `high` of the first key column, or (low None) hash buckets of the key."""

    chunks: int
    keys: tuple[LakeColumn, ...]
    low: int | None = None
    high: int | None = None
    width: int | None = None

    @property
    def by_range(self) -> bool:
        return self.low is not None

    def pg_chunk(self, value_of: row_digest.ValueOf) -> sql.Composable:
        if not self.by_range:
            digest = row_digest.pg_digest(self.keys, value_of)
            return sql.SQL("((({d}) % {n}) + {n}) % {n}").format(d=digest, n=sql.Literal(self.chunks))
        position = _pg_position(self.keys[0], value_of(self.keys[0]))
        return sql.SQL("((least(greatest({p}, {lo}), {hi}) - {lo}) / {w})::integer").format(
            p=position, lo=sql.Literal(self.low), hi=sql.Literal(self.high), w=sql.Literal(self.width))

    def with_chunk(self, rows: DataFrame) -> DataFrame:
        """`rows` (keys typed as the lake types them) with their chunk as CHUNK."""
        if not self.by_range:
            return rows.withColumn(CHUNK, F.pmod(row_digest.spark_digest(self.keys), F.lit(self.chunks)).cast("int"))
        clamped = F.least(F.greatest(_spark_position(self.keys[0]), F.lit(self.low)), F.lit(self.high)) - F.lit(self.low)
        return (rows.withColumn(CHUNK, clamped)
                .withColumn(CHUNK, F.expr(f"{CHUNK} div {self.width}").cast("int")))  # integer division


def _pg_position(column: LakeColumn, value: sql.Composable) -> sql.Composable:
    if column.lake_type == "DATE":
        return sql.SQL("(({}) - DATE '1970-01-01')::bigint").format(value)
    if column.lake_type in ("TIMESTAMP", "TIMESTAMP_NTZ"):
        return sql.SQL("(extract(epoch FROM {}) * 1000000)::bigint").format(value)
    return sql.SQL("({})::bigint").format(value)


def _spark_position(column: LakeColumn) -> Column:
    value = F.col(column.name)
    if column.lake_type == "DATE":
        return F.unix_date(value).cast("long")
    if column.lake_type in ("TIMESTAMP", "TIMESTAMP_NTZ"):
        return F.unix_micros(value.cast("timestamp"))  # a TIMESTAMP_NTZ as UTC, as PostgreSQL's epoch reads it
    return value.cast("long")


def chunking(conn: psycopg.Connection, table: RegisteredTable, columns: Sequence[LakeColumn],
             chunks: int) -> Chunking:
    """Ranges when the first key column has a position (bounds from its min and max, read in the
    caller's snapshot through the key's index), else hash buckets."""
    keys = tuple(sorted((c for c in columns if c.is_key), key=lambda c: c.key_position))
    first = keys[0]
    if first.lake_type not in RANGE_TYPES or table.source_kind == "entity":
        return Chunking(chunks, keys)
    bound = sql.SQL("SELECT {lo}, {hi} FROM (SELECT min(t.{k}) AS lo, max(t.{k}) AS hi FROM {t} t) b").format(
        lo=_pg_position(first, sql.SQL("b.lo")), hi=_pg_position(first, sql.SQL("b.hi")),
        k=sql.Identifier(first.name), t=table.identifier)
    low, high = conn.execute(bound).fetchone()
    if low is None or high - low >= MAX_SPAN:
        return Chunking(chunks, keys)
    return Chunking(chunks, keys, low, high, max(1, -(-(high - low + 1) // chunks)))


def pg_figures_query(table: RegisteredTable, columns: Sequence[LakeColumn], chunks: Chunking, utf8: bool,
                     share: sql.Composable) -> sql.Composed:
    """Per chunk of one share: rows, XOR of their digests, the first key column's bounds (range
    chunks; NULL for hash buckets) and the first `lake_values.PROBLEM` met (verify refuses then).
    Values the lake cannot hold are digested as NULL: they never reach a conversion that fails."""
    values, problem = lake_values.checked_values(columns, lambda c: sql.SQL("t.{}").format(sql.Identifier(c.name)),
                                                 through_jdbc=True)
    masked = {c.name: v for c, v in zip(columns, values)}

    def value_of(c: LakeColumn) -> sql.Composable:
        return masked[c.name]

    first = sql.SQL("t.{}").format(sql.Identifier(chunks.keys[0].name))
    low, high = ((sql.SQL("min({})").format(first), sql.SQL("max({})").format(first)) if chunks.by_range
                 else (sql.SQL("NULL::text"), sql.SQL("NULL::text")))
    return sql.SQL("""SELECT {chunk} AS {c}, count(*) AS rows, bit_xor({digest}) AS hash, {low} AS first_key,
                             {high} AS last_key, min({problem}) AS problem
                        FROM {table} t WHERE {share} GROUP BY 1""").format(
        chunk=chunks.pg_chunk(value_of), c=sql.Identifier(CHUNK), digest=row_digest.pg_digest(columns, value_of, utf8),
        low=low, high=high, problem=problem, table=table.identifier, share=share)


def pg_digests_query(table: RegisteredTable, columns: Sequence[LakeColumn], chunks: Chunking, utf8: bool,
                     bad: Sequence[int], share: sql.Composable) -> sql.Composed:
    """The keys (typed for the lake) and digests of one share's rows in the chunks `bad`."""
    def value_of(c: LakeColumn) -> sql.Composable:
        return sql.SQL("t.{}").format(sql.Identifier(c.name))

    return sql.SQL("SELECT {keys}, {digest} AS {h} FROM {table} t WHERE {share} AND {chunk} IN ({bad})").format(
        keys=sql.SQL(", ").join(hot_reader.as_output(c, value_of(c)) for c in chunks.keys),
        digest=row_digest.pg_digest(columns, value_of, utf8), h=sql.Identifier(HASH), table=table.identifier,
        share=share, chunk=chunks.pg_chunk(value_of), bad=sql.SQL(", ").join(sql.Literal(i) for i in bad))


def server_is_utf8(conn: psycopg.Connection) -> bool:
    return conn.execute("SELECT current_setting('server_encoding') = 'UTF8'").fetchone()[0]


def _typed(column: LakeColumn, present: set[str]) -> Column:
    """A lake column as the view types it; NULL when the lake has no such column yet (`table_contract`)."""
    return (F.col(column.name) if column.name in present else F.lit(None)).cast(column.lake_type)


def typed_keys(rows: DataFrame, keys: Sequence[LakeColumn]) -> list[Column]:
    return [_typed(k, set(rows.columns)).alias(k.name) for k in keys]


def view_digests(spark: SparkSession, hot: HotTable, version: int | None, lake_root: str,
                 biggest_batch: int | None) -> DataFrame:
    """The unified view's rows as keys and HASH: the lake at `version` less the dirty keys, last
    write wins, delete markers dropped, plus the hot images of the dirty keys that still exist.

    A batch holds one row per key (an export writes one image per key, a base one per key), so a
    row of `biggest_batch` whose key is in no other batch is its key's last write: only the other
    batches' keys, and the rows of those keys, go through the window.
    """
    from coldharbor.serve import hot_frame, table_view

    columns = hot.columns
    keys = [c for c in columns if c.is_key]
    names = [k.name for k in keys]
    if hot.hot_only or version is None:
        rows = table_view(spark, hot, version, lake_root, None)
        return rows.select(*names, row_digest.spark_digest(columns).alias(HASH))
    images = hot_frame(spark, hot)
    typed_images = images.filter(~F.col(DELETED)).select(*[_typed(c, set(images.columns)).alias(c.name)
                                                            for c in columns])
    hot_rows = typed_images.select(*names, row_digest.spark_digest(columns).alias(HASH))
    rows = lake.read_version(spark, hot.table.lake_path(lake_root), version)
    # A left anti join, never NOT IN: a NULL in the dirty set must not empty the result.
    rows = rows.join(F.broadcast(images.select(*names)), on=names, how="left_anti")
    present = set(rows.columns)
    narrow = rows.select(*typed_keys(rows, keys), F.col(SEQ), F.col(BATCH_ID), F.col(DELETED),
                         row_digest.spark_digest(columns, lambda c: _typed(c, present)).alias(HASH))
    return _last_writes(narrow, names, biggest_batch).filter(~F.col(DELETED)).select(*names, HASH).unionByName(hot_rows)


def _last_writes(narrow: DataFrame, keys: Sequence[str], biggest_batch: int | None) -> DataFrame:
    """`latest_per_key` over the narrow lake rows, sparing the biggest batch's uncontested rows the window."""
    if biggest_batch is None:
        return narrow.transform(latest_per_key(keys))
    in_biggest = F.col(BATCH_ID).eqNullSafe(F.lit(biggest_batch))
    biggest, others = narrow.filter(in_biggest), narrow.filter(~in_biggest)
    other_keys = others.select(*keys)
    if others.count() <= BROADCAST_KEYS:  # Delta skips the biggest batch's files by their batch id statistics
        other_keys = F.broadcast(other_keys)
    contested = biggest.join(other_keys, on=keys, how="left_semi").unionByName(others)
    alone = biggest.join(other_keys, on=keys, how="left_anti")
    return alone.unionByName(contested.transform(latest_per_key(keys)))


def biggest_batch(conn: psycopg.Connection, table: RegisteredTable, version: int | None) -> int | None:
    """The batch with the most rows in lake versions up to `version` (a base, usually)."""
    if version is None:
        return None
    found = conn.execute("""SELECT batch_id FROM coldharbor.export_batches
                             WHERE table_id = %s AND state = 'flushed' AND lake_version <= %s
                             ORDER BY row_count DESC, batch_id DESC LIMIT 1""", (table.table_id, version)).fetchone()
    return found[0] if found else None

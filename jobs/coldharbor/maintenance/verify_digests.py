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

from coldharbor.capture.registry import LakeColumn, RegisteredTable
from coldharbor.export import image_sql
from coldharbor.lake import delta, lake_values
from coldharbor.lake.lake_rows import BATCH_ID, DELETED, SEQ, Transform, column, latest_per_key, quoted
from coldharbor.maintenance import row_digest
from coldharbor.serve.hot_snapshot import HotTable

CHUNK = "_ch_chunk"
HASH = "_ch_hash"
WEIGHT = "_ch_weight"
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
                .withColumn(CHUNK, F.expr(f"{quoted(CHUNK)} div {self.width}").cast("int")))  # integer division


def _pg_position(column: LakeColumn, value: sql.Composable) -> sql.Composable:
    if column.lake_type == "DATE":
        return sql.SQL("(({}) - DATE '1970-01-01')::bigint").format(value)
    if column.lake_type in ("TIMESTAMP", "TIMESTAMP_NTZ"):
        return sql.SQL("(extract(epoch FROM {}) * 1000000)::bigint").format(value)
    return sql.SQL("({})::bigint").format(value)


def _spark_position(key: LakeColumn) -> Column:
    value = column(key.name)
    if key.lake_type == "DATE":
        return F.unix_date(value).cast("long")
    if key.lake_type in ("TIMESTAMP", "TIMESTAMP_NTZ"):
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


def _plain(c: LakeColumn) -> sql.Composable:
    return sql.SQL("t.{}").format(sql.Identifier(c.name))


def _chunk_key(chunks: Chunking) -> row_digest.ValueOf:
    """The row's values for its chunk: the first key column's NULL where the lake cannot hold it (its
    position would fail to compute, infinity has none; verify refuses such a row anyway)."""
    first = chunks.keys[0]
    check = lake_values.held(first, _plain(first), through_jdbc=True)

    def value_of(c: LakeColumn) -> sql.Composable:
        if c != first or check is None:
            return _plain(c)
        return sql.SQL("(CASE WHEN {} THEN {} END)").format(check, _plain(c))

    return value_of


def pg_figures_query(table: RegisteredTable, columns: Sequence[LakeColumn], chunks: Chunking, utf8: bool,
                     share: sql.Composable) -> sql.Composed:
    """Per chunk of one share: rows, XOR of their digests, the first key column's bounds (range
    chunks; NULL for hash buckets) and the first `lake_values.PROBLEM` met (verify refuses then).
    Every value spells, even one the lake cannot hold: no row makes the scan fail."""
    _, problem = lake_values.checked_values(columns, _plain, through_jdbc=True)
    key_of = _chunk_key(chunks)
    first = key_of(chunks.keys[0])
    low, high = ((sql.SQL("min({})").format(first), sql.SQL("max({})").format(first)) if chunks.by_range
                 else (sql.SQL("NULL::text"), sql.SQL("NULL::text")))
    return sql.SQL("""SELECT {chunk} AS {c}, count(*) AS rows, bit_xor({digest}) AS hash, {low} AS first_key,
                             {high} AS last_key, min({problem}) AS problem
                        FROM {table} t WHERE {share} GROUP BY 1""").format(
        chunk=chunks.pg_chunk(key_of), c=sql.Identifier(CHUNK), digest=row_digest.pg_digest(columns, _plain, utf8),
        low=low, high=high, problem=problem, table=table.identifier, share=share)


def pg_digests_query(table: RegisteredTable, columns: Sequence[LakeColumn], chunks: Chunking, utf8: bool,
                     bad: Sequence[int], share: sql.Composable) -> sql.Composed:
    """The keys (typed for the lake) and digests of one share's rows in the chunks `bad`."""
    return sql.SQL("SELECT {keys}, {digest} AS {h} FROM {table} t WHERE {share} AND {chunk} IN ({bad})").format(
        keys=sql.SQL(", ").join(image_sql.as_output(c, _plain(c)) for c in chunks.keys),
        digest=row_digest.pg_digest(columns, _plain, utf8), h=sql.Identifier(HASH), table=table.identifier,
        share=share, chunk=chunks.pg_chunk(_chunk_key(chunks)), bad=sql.SQL(", ").join(sql.Literal(i) for i in bad))


def server_is_utf8(conn: psycopg.Connection) -> bool:
    return conn.execute("SELECT current_setting('server_encoding') = 'UTF8'").fetchone()[0]


def _typed(lake_column: LakeColumn, present: set[str]) -> Column:
    """A lake column as the view types it; NULL when the lake has no such column yet (`table_contract`)."""
    return (column(lake_column.name) if lake_column.name in present else F.lit(None)).cast(lake_column.lake_type)


def typed_keys(rows: DataFrame, keys: Sequence[LakeColumn]) -> list[Column]:
    return [_typed(k, set(rows.columns)).alias(k.name) for k in keys]


def view_digests(spark: SparkSession, hot: HotTable, version: int | None, lake_root: str,
                 biggest_batch: int | None) -> DataFrame:
    """The unified view's rows -- the lake at `version` less the dirty keys, last write wins, delete
    markers dropped, plus the hot images of the dirty keys that still exist -- as keys, HASH and
    WEIGHT: a chunk holds sum(WEIGHT) rows and its hash is the XOR of HASH (`_last_writes` folds
    a contested key's rows into one that adds its winner and takes away what another adds)."""
    from coldharbor.serve.serve_job import hot_frame, table_view

    columns = hot.columns
    keys = [c for c in columns if c.is_key]
    names = [k.name for k in keys]
    if hot.hot_only or version is None:
        rows = table_view(spark, hot, version, lake_root, None)
        return rows.select(*map(column, names), row_digest.spark_digest(columns).alias(HASH), F.lit(1).alias(WEIGHT))
    images = hot_frame(spark, hot)
    typed_images = images.filter(~column(DELETED)).select(*[_typed(c, set(images.columns)).alias(c.name)
                                                            for c in columns])
    hot_rows = typed_images.select(*map(column, names), row_digest.spark_digest(columns).alias(HASH),
                                   F.lit(1).alias(WEIGHT))
    # A left anti join, never NOT IN: a NULL in the dirty set must not empty the result.
    rows = delta.read_version(spark, hot.table.lake_path(lake_root), version).join(
        F.broadcast(images.select(*map(column, names))), on=names, how="left_anti")
    return _last_writes(rows, narrowed(columns, set(rows.columns)), names, biggest_batch).unionByName(hot_rows)


def narrowed(columns: Sequence[LakeColumn], present: set[str]) -> Transform:
    """Lake rows -> typed keys, SEQ, BATCH_ID, DELETED and HASH. Filter the rows before: the digest
    calls Java (doubleToLongBits), which Spark counts nondeterministic and pushes no filter below."""
    keys = [c for c in columns if c.is_key]

    def transform(rows: DataFrame) -> DataFrame:
        return rows.select(*[_typed(k, present).alias(k.name) for k in keys], column(SEQ), column(BATCH_ID),
                           column(DELETED), row_digest.spark_digest(columns, lambda c: _typed(c, present)).alias(HASH))

    return transform


def keys_twice_in_a_batch(spark: SparkSession, hot: HotTable, version: int | None, lake_root: str) -> DataFrame:
    """The keys a lake batch holds more than once (only a hand edit makes one): `_last_writes`
    would count such a key twice where the view has one of its rows."""
    keys = [c.name for c in hot.columns if c.is_key]
    if hot.hot_only or version is None:
        return spark.range(0).select(*[F.lit(None).cast(c.lake_type).alias(c.name) for c in hot.columns if c.is_key])
    rows = delta.read_version(spark, hot.table.lake_path(lake_root), version)
    rows = rows.select(*typed_keys(rows, [c for c in hot.columns if c.is_key]), column(BATCH_ID))
    return (rows.groupBy(*map(column, keys), column(BATCH_ID)).count().filter(column("count") > 1)
            .select(*map(column, keys)))


def window_last_writes(narrow: DataFrame, keys: Sequence[str]) -> DataFrame:
    """`latest_per_key` over narrow lake rows: the live last writes, WEIGHT 1."""
    return (narrow.transform(latest_per_key(keys)).filter(~column(DELETED))
            .select(*map(column, keys), column(HASH), F.lit(1).alias(WEIGHT)))


def _last_writes(rows: DataFrame, narrow: Transform, keys: Sequence[str], biggest_batch: int | None) -> DataFrame:
    """The live last writes of the narrow lake rows, weighted, without sorting the biggest batch.

    A batch holds one row per key (an export writes one image per key, a base one per key). So a
    row of `biggest_batch` is its key's last write unless another batch holds the key; the other
    batches' last writes (few: broadcast) are joined to the biggest batch's rows, and a row whose
    key they hold yields the winner of the two and takes back the other batches' row, which is
    added once on its own (its key may be in no row of the biggest batch). One pass, no shuffle.
    """
    if biggest_batch is None:
        return window_last_writes(narrow(rows), keys)
    # Delta skips the biggest batch's files by their batch id statistics.
    in_others = (column(BATCH_ID) != F.lit(biggest_batch)) | column(BATCH_ID).isNull()
    if rows.filter(in_others).count() > BROADCAST_KEYS:
        return window_last_writes(narrow(rows), keys)
    latest = narrow(rows.filter(in_others)).transform(latest_per_key(keys)).select(
        *map(column, keys), F.lit(True).alias("_ch_o"), column(SEQ).alias("_ch_o_seq"),
        column(BATCH_ID).alias("_ch_o_batch"), column(DELETED).alias("_ch_o_deleted"), column(HASH).alias("_ch_o_hash"))
    rows = narrow(rows.filter(column(BATCH_ID) == F.lit(biggest_batch))).join(F.broadcast(latest), on=keys,
                                                                               how="left_outer")
    low = F.lit(-(1 << 63))  # latest_per_key sorts NULL sequences and batch ids last
    mine = F.struct(F.coalesce(column(SEQ), low), F.coalesce(column(BATCH_ID), low))
    theirs = F.struct(F.coalesce(column("_ch_o_seq"), low), F.coalesce(column("_ch_o_batch"), low))
    matched = column("_ch_o").isNotNull()
    mine_wins = ~matched | (mine > theirs)
    winner_live = F.when(mine_wins, ~column(DELETED)).otherwise(~column("_ch_o_deleted"))
    winner_hash = F.when(winner_live, F.when(mine_wins, column(HASH)).otherwise(column("_ch_o_hash"))).otherwise(0)
    taken_back = matched & ~column("_ch_o_deleted")
    folded = rows.select(*map(column, keys), F.when(taken_back, winner_hash.bitwiseXOR(column("_ch_o_hash")))
                         .otherwise(winner_hash).alias(HASH),
                         (winner_live.cast("int") - taken_back.cast("int")).alias(WEIGHT))
    others_live = latest.filter(~column("_ch_o_deleted")).select(*map(column, keys), column("_ch_o_hash").alias(HASH),
                                                                F.lit(1).alias(WEIGHT))
    return folded.unionByName(others_live)


def biggest_batch(conn: psycopg.Connection, table: RegisteredTable, version: int | None) -> int | None:
    """The batch with the most rows in lake versions up to `version` (a base, usually)."""
    if version is None:
        return None
    found = conn.execute("""SELECT batch_id FROM coldharbor.export_batches
                             WHERE table_id = %s AND state = 'flushed' AND lake_version <= %s
                             ORDER BY row_count DESC, batch_id DESC LIMIT 1""", (table.table_id, version)).fetchone()
    return found[0] if found else None

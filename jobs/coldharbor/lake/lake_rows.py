"""The lake's row layout and the pure transformations over it (DataFrame -> DataFrame).

A lake row is the table's columns plus metadata:
  _ch_seq          change_log id that produced the image (last write wins by it, never by clock)
  _ch_deleted      delete marker: the key did not exist at the export snapshot
  _ch_changed_at   when the change committed in PostgreSQL (as-of reports filter on it; the start of
                   its transaction when the server does not track commit timestamps)
  _ch_first_changed_at  when the first of the changes this row stands for committed: an export
                   writes one image per key for all its changes since the last export, so the
                   key's state between this time and _ch_changed_at is not in the lake (as-of
                   reports inside that span are refused, not answered with the older version)
  _ch_batch_id     export batch that wrote the row (ties on _ch_seq are broken by it)
  _ch_exported_at  when the batch was built
  _ch_settled      1: the newest version of its key among the batches the commit that wrote it
                   replaced (a compaction's newest kept version, a base that holds the table alone);
                   0: an older version a compaction kept for as-of reports; NULL: written by an
                   export (or before this column). A current read ranks only the keys that hold a
                   NULL row (`current_rows`); as-of reads, compaction and purge rank every version.
                   An integer, not a boolean: Delta keeps no file statistics of booleans, and the
                   current read skips files by this column's statistics

A column is named to Spark through `column` (or `quoted` in SQL text), never by a bare string:
Spark parses a name it is given as a string (`F.col`, `select`, `groupBy`, `Window.partitionBy`,
`orderBy`, `F.max("...")`), where '.' selects a field of a struct and a backtick quotes a part, and
PostgreSQL's column names may hold both. The APIs that take a name literally (`withColumn`,
`withColumnRenamed`, `drop`, `join(on=...)`, `unionByName`, `alias`, a Row's fields) get it bare:
a quoted name there names nothing (`drop` and `withColumnRenamed` then silently do nothing), on a
classic session and on Spark Connect alike. Not used: `df[name]` (Connect resolves even a quoted
name there only sometimes) and `fillna(subset=...)` (fails when any column holds a backtick).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from coldharbor.capture.registry import LakeColumn

SEQ = "_ch_seq"
DELETED = "_ch_deleted"
CHANGED_AT = "_ch_changed_at"
FIRST_CHANGED_AT = "_ch_first_changed_at"
BATCH_ID = "_ch_batch_id"
EXPORTED_AT = "_ch_exported_at"
SETTLED = "_ch_settled"
NEWEST, OLDER = 1, 0  # values of SETTLED
METADATA_COLUMNS = (SEQ, DELETED, CHANGED_AT, BATCH_ID, EXPORTED_AT, FIRST_CHANGED_AT, SETTLED)

Transform = Callable[[DataFrame], DataFrame]


def quoted(name: str) -> str:
    """`name` as Spark SQL spells an identifier: in backticks, a backtick inside doubled."""
    return "`" + name.replace("`", "``") + "`"


def column(name: str) -> Column:
    """The column named exactly `name` (whatever it holds: '.', a backtick)."""
    return F.col(quoted(name))


def to_lake_rows(columns: Sequence[LakeColumn], batch_id: int, exported_at: datetime,
                 settled: bool = False) -> Transform:
    """Images read from PostgreSQL -> lake rows: the schema contract of the Delta table. `settled`
    only for a base the lake will hold alone (one version per key, nothing older)."""

    def transform(images: DataFrame) -> DataFrame:
        return images.select(
            *[column(c.name).cast(c.lake_type).alias(c.name) for c in columns],
            column(SEQ).cast("long").alias(SEQ),
            column(DELETED).cast("boolean").alias(DELETED),
            column(CHANGED_AT).cast("timestamp").alias(CHANGED_AT),
            F.lit(batch_id).cast("long").alias(BATCH_ID),
            F.lit(exported_at).cast("timestamp").alias(EXPORTED_AT),
            column(FIRST_CHANGED_AT).cast("timestamp").alias(FIRST_CHANGED_AT),
            F.lit(NEWEST if settled else None).cast("int").alias(SETTLED),
        )

    return transform


def latest_per_key(key_columns: Sequence[str]) -> Transform:
    """Keeps the last write of every key: highest change sequence, then the latest batch."""
    if not key_columns:
        raise ValueError("latest_per_key needs at least one key column")
    newest_first = Window.partitionBy(*[column(k) for k in key_columns]).orderBy(
        column(SEQ).desc(), column(BATCH_ID).desc())

    def transform(rows: DataFrame) -> DataFrame:
        return (rows.withColumn("_ch_rank", F.row_number().over(newest_first))
                .filter(column("_ch_rank") == 1)
                .drop("_ch_rank"))

    return transform


@dataclass(frozen=True)
class SettledSplit:
    """How many rows of a lake version sit in files with unsettled rows (exports') and in files of
    settled rows only (compaction's, a lone base's), from the Delta log (`lake.settled_split`)."""

    unsettled_rows: int
    settled_rows: int


# Up to this many unsettled rows, they are read once and their keys broadcast to the anti- and
# semi-join with the settled rows: the settled side (the whole compacted table) is never shuffled.
# Without statistics of its own, Spark sizes a filtered scan as the whole scan (every file of the
# table), far above its broadcast threshold, so it would not broadcast them by itself.
BROADCAST_UNSETTLED_ROWS = 1_000_000


def current_rows(key_columns: Sequence[str], split: SettledSplit | None = None) -> Transform:
    """The newest version of every key (what `latest_per_key` returns), ranking only the keys that can
    have more than one candidate.

    A settled row (`_ch_settled` 1) is the newest of its key among everything written before it
    (a compaction's or a lone base's), and a kept older version (0) never outranks it: the only
    rows that can are the NULL ones, written by exports since. So a settled row whose key holds no
    NULL row is its key's newest as it stands, with no window; the keys that hold a NULL row rank
    their NULL rows and their settled row by last-write-wins. Kept older versions are left out
    (as-of reads need them, `latest_per_key` over every row). A lake table without the column (no
    export or compaction since it was added) ranks every row.

    With the version's `split`: no unsettled row, the settled rows are the answer (no join); no
    settled file, every row is ranked; few unsettled rows, their keys are broadcast.
    """
    latest = latest_per_key(key_columns)

    def transform(rows: DataFrame) -> DataFrame:
        if SETTLED not in rows.columns or (split is not None and split.settled_rows == 0):
            return latest(rows)
        # IS NOT NULL first: Delta skips a file by it when the file's null count is its row count (an
        # export's file), which it does not for `= 1` over a column with no minimum or maximum.
        settled = rows.filter(column(SETTLED).isNotNull() & (column(SETTLED) == NEWEST))
        if split is not None and split.unsettled_rows == 0:
            return settled
        fresh = rows.filter(column(SETTLED).isNull())
        few = split is not None and split.unsettled_rows <= BROADCAST_UNSETTLED_ROWS
        if few:
            # Read once: the plan uses them three times (their keys against the settled rows twice,
            # the rows themselves ranked), and they are many small files (a day of exports: 1,440).
            from coldharbor.runtime.spark import local_checkpoint

            fresh = local_checkpoint(fresh, eager=True)
        fresh_keys = fresh.select(*[column(k) for k in key_columns])
        if few:
            fresh_keys = F.broadcast(fresh_keys)
        lone = settled.join(fresh_keys, on=list(key_columns), how="left_anti")
        contested = fresh.unionByName(settled.join(fresh_keys, on=list(key_columns), how="left_semi"))
        return lone.unionByName(latest(contested))

    return transform


def live_rows(key_columns: Sequence[str], split: SettledSplit | None = None) -> Transform:
    """The table as the lake holds it now: last write per key, delete markers dropped, no metadata."""
    current = current_rows(key_columns, split)

    def transform(rows: DataFrame) -> DataFrame:
        return current(rows).filter(~column(DELETED)).drop(*METADATA_COLUMNS)

    return transform


def mark_settled(key_columns: Sequence[str]) -> Transform:
    """Sets `_ch_settled` for a rewrite of every version of its keys (a compaction of a partition):
    NEWEST on each key's newest version (`latest_per_key`'s order), OLDER on the others."""
    if not key_columns:
        raise ValueError("mark_settled needs at least one key column")
    newest_first = Window.partitionBy(*[column(k) for k in key_columns]).orderBy(
        column(SEQ).desc(), column(BATCH_ID).desc())

    def transform(rows: DataFrame) -> DataFrame:
        newest = F.row_number().over(newest_first) == 1
        return rows.withColumn(SETTLED, F.when(newest, F.lit(NEWEST)).otherwise(F.lit(OLDER)))

    return transform


KEEP = "_ch_keep"


def mark_kept(key_columns: Sequence[str], cutoff: datetime) -> Transform:
    """Adds `_ch_keep`: whether a compaction that rewrites every file holding the key keeps the row.

    Kept: every version changed after `cutoff` (as-of reports inside the history window need them),
    and the base version -- the newest one changed at or before `cutoff` -- unless it is a delete
    marker. A dropped base marker loses nothing: with no older version left, the key is absent
    at every time from the cutoff until its next version. Everything older than the base is
    superseded. Order: change sequence, then batch id (deterministic, never the clock).

    Older by that order, whatever its time: a change time is its transaction's start when the server
    does not track commit timestamps, so a version can be changed after the cutoff and still rank
    below the base (a transaction that began earlier wrote the base later). Every as-of read after
    the cutoff sees the base too and ranks it first; kept, that version would outlive a dropped
    base marker and come back.
    """
    if not key_columns:
        raise ValueError("mark_kept needs at least one key column")
    in_window = F.coalesce(column(CHANGED_AT) > F.lit(cutoff), F.lit(False))
    keys = [column(k) for k in key_columns]
    newest_first = Window.partitionBy(*keys, in_window).orderBy(column(SEQ).desc(), column(BATCH_ID).desc())
    order = F.struct(column(SEQ), column(BATCH_ID))
    base_order = F.max(F.when(~in_window, order)).over(Window.partitionBy(*keys))

    def transform(rows: DataFrame) -> DataFrame:
        is_base = ~in_window & (F.row_number().over(newest_first) == 1)
        outranks_base = base_order.isNull() | (order > base_order)
        return rows.withColumn(KEEP, (in_window & outranks_base) | (is_base & ~column(DELETED)))

    return transform

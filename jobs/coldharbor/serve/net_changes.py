"""A change feed's rows from lake-shaped rows: each key written inside (start, end], its last write
at `start` against its last write at `end`, as `insert`, `delete`, or `update_preimage` and
`update_postimage`, with the sequence and commit time of its last change in the window. The net
change, so consecutive windows compose; `changes` reads the rows and checks the window."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from coldharbor.capture.registry import LakeColumn
from coldharbor.lake.lake_rows import BATCH_ID, CHANGED_AT, DELETED, FIRST_CHANGED_AT, SEQ, column, latest_per_key

# The feed's own columns, besides the table's.
CHANGE_TYPE = "_change_type"
CHANGE_SEQ = "_change_seq"
COMMIT_TIMESTAMP = "_commit_timestamp"
CHANGE_TYPES = ("insert", "delete", "update_preimage", "update_postimage")


def full_rows(rows: DataFrame, columns: Sequence[LakeColumn]) -> DataFrame:
    """Lake rows with every column of the table (NULL where the lake has not got it yet) and the
    metadata the feed ranks and reports by."""
    present = set(rows.columns)
    first = column(FIRST_CHANGED_AT) if FIRST_CHANGED_AT in present else F.lit(None).cast("timestamp")
    return rows.select(*[(column(c.name) if c.name in present else F.lit(None)).cast(c.lake_type).alias(c.name)
                         for c in columns],
                       column(SEQ), column(DELETED), column(CHANGED_AT), column(BATCH_ID),
                       first.alias(FIRST_CHANGED_AT))


def net_changes(rows: DataFrame, columns: Sequence[LakeColumn], start: datetime, end: datetime) -> DataFrame:
    """The feed of (start, end] from lake-shaped `rows` (`full_rows`): each key's last write at
    `start` against its last write at `end`, for the keys written in between."""
    keys = [c.name for c in sorted((c for c in columns if c.is_key), key=lambda c: c.key_position)]
    latest = latest_per_key(keys)
    written = rows.filter((column(CHANGED_AT) > F.lit(start)) & (column(CHANGED_AT) <= F.lit(end)))
    touched = written.select(*map(column, keys)).distinct()
    # Only the keys written in the window are ranked: the rest of the table is the same at both ends.
    versions = rows.join(touched, on=keys, how="left_semi")

    def side(at: datetime, tag: str) -> DataFrame:
        last = latest(versions.filter(column(CHANGED_AT) <= F.lit(at)))
        return last.select(*[column(k).alias(f"_k{i}") for i, k in enumerate(keys)],
                           *[column(c.name).alias(f"_{tag}{i}") for i, c in enumerate(columns)],
                           column(SEQ).alias(f"_{tag}_seq"), column(DELETED).alias(f"_{tag}_deleted"),
                           column(CHANGED_AT).alias(f"_{tag}_at"))

    joined = side(start, "o").join(side(end, "n"), on=[f"_k{i}" for i in range(len(keys))], how="full_outer")
    was = column("_o_seq").isNotNull() & ~column("_o_deleted")
    now = column("_n_seq").isNotNull() & ~column("_n_deleted")
    moved = ~column("_o_seq").eqNullSafe(column("_n_seq"))
    same = F.lit(True)
    for i, c in enumerate(columns):
        old, new = column(f"_o{i}"), column(f"_n{i}")
        if c.lake_type in ("FLOAT", "DOUBLE"):  # Spark's = holds -0.0 equal to 0.0; their texts differ
            old, new = old.cast("string"), new.cast("string")
        same = same & old.eqNullSafe(new)

    def rows_of(tag: str, kind: str, where) -> DataFrame:
        return joined.filter(moved & where).select(
            *[column(f"_{tag}{i}").alias(c.name) for i, c in enumerate(columns)],
            F.lit(kind).alias(CHANGE_TYPE), column("_n_seq").alias(CHANGE_SEQ),
            column("_n_at").alias(COMMIT_TIMESTAMP))

    updated = was & now & ~same
    return (rows_of("n", "insert", ~was & now)
            .unionByName(rows_of("o", "delete", was & ~now))
            .unionByName(rows_of("o", "update_preimage", updated))
            .unionByName(rows_of("n", "update_postimage", updated)))

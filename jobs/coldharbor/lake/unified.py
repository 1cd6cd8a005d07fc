"""The dirty-set anti-join (invariant 6) as pure DataFrame transformations.

    unified = (last write per key of lake@V, delete markers dropped) LEFT ANTI JOIN dirty keys
              UNION hot images of the dirty keys that still exist
(the anti-join runs on the lake rows, before last-write-wins: the same rows, less to shuffle)

`hot` carries one row per dirty key: the key, the row as PostgreSQL holds it in the snapshot
(NULLs when the key is gone) and `_ch_deleted`. The dirty set is collected once by the caller.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from coldharbor.capture.registry import LakeColumn
from coldharbor.lake.lake_rows import CHANGED_AT, DELETED, SettledSplit, Transform, column, latest_per_key, live_rows


def table_contract(columns: Sequence[LakeColumn]) -> Transform:
    """The view's schema: the table's columns in catalog order, typed as the lake types them.

    Columns the lake does not have yet (added after the rows were exported) read as NULL.
    """

    def transform(rows: DataFrame) -> DataFrame:
        present = set(rows.columns)
        return rows.select(*[
            (column(c.name) if c.name in present else F.lit(None)).cast(c.lake_type).alias(c.name)
            for c in columns])

    return transform


def cold_live(columns: Sequence[LakeColumn], as_of: datetime | None = None,
              split: SettledSplit | None = None) -> Transform:
    """Lake rows -> the table as the lake holds it (optionally as of a change time).

    Now, only the keys that can have several candidates are ranked (`current_rows`); as of a time,
    every version up to it is (a settled row may be newer than the time, the version before it
    kept unsettled). `split`: the lake version's (`lake.settled_split`), for the current read's plan."""
    keys = [c.name for c in sorted((c for c in columns if c.is_key), key=lambda c: c.key_position)]
    contract = table_contract(columns)
    if as_of is None:
        live = live_rows(keys, split)
        return lambda lake: contract(live(lake))
    latest = latest_per_key(keys)

    def transform(lake: DataFrame) -> DataFrame:
        rows = latest(lake.filter(column(CHANGED_AT) <= F.lit(as_of)))
        return contract(rows.filter(~column(DELETED)))

    return transform


def unified_rows(hot: DataFrame, columns: Sequence[LakeColumn], broadcast_dirty: bool = True,
                 split: SettledSplit | None = None) -> Transform:
    """lake rows -> their live rows minus the dirty keys, plus the hot images that still exist.

    The dirty keys leave before last-write-wins: a key's versions go together, so the result is
    the same as removing it afterwards, and the window shuffles fewer rows.
    """
    keys = [c.name for c in columns if c.is_key]
    contract = table_contract(columns)
    live = cold_live(columns, split=split)
    dirty_keys = hot.select(*map(column, keys))
    if broadcast_dirty:
        dirty_keys = F.broadcast(dirty_keys)
    hot_rows = contract(hot.filter(~column(DELETED)))

    def transform(lake: DataFrame) -> DataFrame:
        # A left anti join, never NOT IN: a NULL in the dirty set must not empty the result.
        return live(lake.join(dirty_keys, on=keys, how="left_anti")).unionByName(hot_rows)

    return transform

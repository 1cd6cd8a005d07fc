"""The dirty-set anti-join over tiny DataFrames."""

from __future__ import annotations

from datetime import datetime

from coldharbor.capture.registry import LakeColumn
from coldharbor.lake.unified import cold_live, unified_rows
from pyspark.testing import assertDataFrameEqual

COLUMNS = [LakeColumn("id", "bigint", "LONG", 1), LakeColumn("v", "text", "STRING", None)]
LAKE = "id LONG, v STRING, _ch_seq LONG, _ch_deleted BOOLEAN, _ch_changed_at TIMESTAMP, _ch_batch_id LONG, " \
       "_ch_exported_at TIMESTAMP"
HOT = "id LONG, v STRING, _ch_deleted BOOLEAN"
T = [datetime(2026, 1, 1, h) for h in range(24)]


def lake_rows(spark, rows):
    return spark.createDataFrame([(*r, T[0]) for r in rows], LAKE)


def test_cold_minus_dirty_plus_hot_images(spark):
    lake = lake_rows(spark, [
        (1, "exported, unchanged", 1, False, T[1], 1),
        (2, "exported, then updated", 2, False, T[1], 1),
        (3, "exported, then deleted", 3, False, T[1], 1),
        (4, "older image", 4, False, T[1], 1),
        (4, "newest image", 9, False, T[2], 2),
        (5, "deleted in the lake", 5, False, T[1], 1),
        (5, None, 10, True, T[2], 2),
    ])
    hot = spark.createDataFrame([(2, "updated", False), (3, None, True), (6, "only in PostgreSQL", False)], HOT)
    result = lake.transform(unified_rows(hot, COLUMNS))
    expected = spark.createDataFrame([(1, "exported, unchanged"), (2, "updated"), (4, "newest image"),
                                      (6, "only in PostgreSQL")], "id LONG, v STRING")
    assertDataFrameEqual(result, expected)


def test_every_lake_version_of_a_dirty_key_leaves_before_last_write_wins(spark):
    """The anti-join runs on the lake rows: no older version of a dirty key may resurface."""
    lake = lake_rows(spark, [
        (1, "old", 1, False, T[1], 1), (1, "newer", 4, False, T[2], 2),     # dirty: updated again
        (2, "old", 2, False, T[1], 1), (2, None, 5, True, T[2], 2),         # dirty: re-inserted after a delete
        (3, "old", 3, False, T[1], 1), (3, "newest", 6, False, T[2], 2),    # dirty: deleted in PostgreSQL
    ])
    hot = spark.createDataFrame([(1, "hot", False), (2, "back", False), (3, None, True)], HOT)
    result = lake.transform(unified_rows(hot, COLUMNS))
    assertDataFrameEqual(result, spark.createDataFrame([(1, "hot"), (2, "back")], "id LONG, v STRING"))


def test_a_null_key_in_the_dirty_set_does_not_empty_the_result(spark):
    lake = lake_rows(spark, [(1, "a", 1, False, T[1], 1), (2, "b", 2, False, T[1], 1)])
    hot = spark.createDataFrame([(None, None, True), (2, "b2", False)], HOT)
    result = lake.transform(unified_rows(hot, COLUMNS, broadcast_dirty=False))
    assertDataFrameEqual(result, spark.createDataFrame([(1, "a"), (2, "b2")], "id LONG, v STRING"))


def test_as_of_keeps_the_last_write_at_or_before_that_time(spark):
    lake = lake_rows(spark, [
        (1, "v1", 1, False, T[1], 1),
        (1, "v2", 5, False, T[5], 2),
        (2, "born late", 6, False, T[6], 3),
        (3, "deleted later", 2, False, T[2], 1),
        (3, None, 7, True, T[7], 3),
    ])
    at_3 = lake.transform(cold_live(COLUMNS, as_of=T[3]))
    assertDataFrameEqual(at_3, spark.createDataFrame([(1, "v1"), (3, "deleted later")], "id LONG, v STRING"))
    at_8 = lake.transform(cold_live(COLUMNS, as_of=T[8]))
    assertDataFrameEqual(at_8, spark.createDataFrame([(1, "v2"), (2, "born late")], "id LONG, v STRING"))


def test_a_column_the_lake_lacks_reads_as_null(spark):
    lake = lake_rows(spark, [(1, "a", 1, False, T[1], 1)])
    columns = [*COLUMNS, LakeColumn("added", "integer", "INT", None)]
    result = lake.transform(cold_live(columns))
    assertDataFrameEqual(result, spark.createDataFrame([(1, "a", None)], "id LONG, v STRING, added INT"))

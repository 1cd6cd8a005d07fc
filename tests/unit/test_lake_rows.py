"""Pure transformations over tiny DataFrames."""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal

import pytest
from pyspark.testing import assertDataFrameEqual

from coldharbor.lake_rows import BATCH_ID, DELETED, SEQ, latest_per_key, live_rows, to_lake_rows
from coldharbor.registry import LakeColumn

LAKE_SCHEMA = "id LONG, v STRING, _ch_seq LONG, _ch_deleted BOOLEAN, _ch_changed_at TIMESTAMP, _ch_batch_id LONG"
T0 = datetime(2026, 1, 1, 12, 0, 0)


def test_to_lake_rows_casts_to_the_lake_types_and_adds_metadata(spark):
    images = spark.createDataFrame(
        [(1, "10.50", 7, False, T0, T0, T0, [6, 7])],
        "id INT, amount STRING, _ch_seq LONG, _ch_deleted BOOLEAN, _ch_changed_at TIMESTAMP, "
        "_ch_first_changed_at TIMESTAMP, _ch_oldest_change_at TIMESTAMP, _ch_change_ids ARRAY<LONG>")
    columns = [LakeColumn("id", "bigint", "LONG", 1), LakeColumn("amount", "numeric(10,2)", "DECIMAL(10,2)", None)]
    rows = images.transform(to_lake_rows(columns, batch_id=42, exported_at=T0))
    assert rows.columns == ["id", "amount", "_ch_seq", "_ch_deleted", "_ch_changed_at", "_ch_batch_id",
                            "_ch_exported_at", "_ch_first_changed_at"]
    assert dict(rows.dtypes)["id"] == "bigint"
    assert dict(rows.dtypes)["amount"] == "decimal(10,2)"
    row = rows.first()
    assert (row["amount"], row[BATCH_ID], row[SEQ]) == (Decimal("10.50"), 42, 7)


def test_latest_per_key_orders_by_change_sequence_not_by_clock(spark):
    later_clock_older_change = datetime(2030, 1, 1)
    rows = spark.createDataFrame([
        (1, "old", 5, False, later_clock_older_change, 1),
        (1, "new", 9, False, T0, 1),
        (2, "only", 3, False, T0, 1),
    ], LAKE_SCHEMA)
    latest = rows.transform(latest_per_key(["id"])).select("id", "v")
    assertDataFrameEqual(latest, spark.createDataFrame([(1, "new"), (2, "only")], "id LONG, v STRING"))


def test_latest_per_key_breaks_equal_sequences_by_the_later_batch(spark):
    rows = spark.createDataFrame([(1, "first batch", 5, False, T0, 1), (1, "replayed", 5, False, T0, 2)],
                                 LAKE_SCHEMA)
    assert [r["v"] for r in rows.transform(latest_per_key(["id"])).collect()] == ["replayed"]


def test_live_rows_drops_keys_whose_last_write_is_a_delete_marker(spark):
    rows = spark.createDataFrame([
        (1, "v1", 1, False, T0, 1),
        (1, None, 2, True, T0, 2),    # deleted after export
        (2, None, 3, True, T0, 1),    # deleted...
        (2, "back", 4, False, T0, 3),  # ...then inserted again
    ], LAKE_SCHEMA)
    live = rows.transform(live_rows(["id"]))
    assert DELETED not in live.columns
    assertDataFrameEqual(live, spark.createDataFrame([(2, "back")], "id LONG, v STRING"))


def test_latest_per_key_with_a_composite_key(spark):
    rows = spark.createDataFrame([("a", 1, "x", 1, 1), ("a", 1, "y", 2, 1), ("a", 2, "z", 1, 1)],
                                 "k1 STRING, k2 INT, v STRING, _ch_seq LONG, _ch_batch_id LONG")
    latest = rows.transform(latest_per_key(["k1", "k2"])).select("k1", "k2", "v")
    assertDataFrameEqual(latest, spark.createDataFrame([("a", 1, "y"), ("a", 2, "z")], "k1 STRING, k2 INT, v STRING"))


def test_latest_per_key_needs_a_key():
    with pytest.raises(ValueError, match="at least one key column"):
        latest_per_key([])

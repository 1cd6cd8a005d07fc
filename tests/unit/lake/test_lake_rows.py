"""Pure transformations over tiny DataFrames."""

from __future__ import annotations

import random
from datetime import datetime, timedelta
from decimal import Decimal

import pytest
from coldharbor.capture.registry import LakeColumn
from coldharbor.lake.lake_rows import (
    BATCH_ID,
    DELETED,
    SEQ,
    SETTLED,
    SettledSplit,
    column,
    current_rows,
    latest_per_key,
    live_rows,
    mark_settled,
    quoted,
    to_lake_rows,
)
from pyspark.sql import functions as F
from pyspark.testing import assertDataFrameEqual

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
                            "_ch_exported_at", "_ch_first_changed_at", "_ch_settled"]
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


# Names Spark parses in a string: '.' selects a struct field, a backtick quotes a part.
ODD_NAMES = ["a.b", "x`y", "`", "``", "ü.1", '"q"', "a.`b`"]


@pytest.mark.parametrize("name", ODD_NAMES)
def test_column_names_a_column_exactly_as_it_is_called(spark, name):
    rows = spark.createDataFrame([(1, 2)], f"{quoted(name)} INT, other INT")
    assert rows.columns == [name, "other"]
    assert rows.select(column(name).alias("v")).first()["v"] == 1
    assert quoted("a`b.c") == "`a``b.c`"


def test_a_struct_of_the_same_name_is_not_what_a_dotted_name_means(spark):
    rows = spark.createDataFrame([((1,), 2)], "a STRUCT<b: INT>, `a.b` INT")
    assert rows.select(column("a.b").alias("v")).first()["v"] == 2


def test_the_transforms_take_keys_whose_names_spark_would_parse(spark):
    rows = spark.createDataFrame([
        (1, "p", "old", 5, False, T0, 1),
        (1, "p", "new", 9, False, T0, 1),
        (2, "q", "gone", 3, False, T0, 1),
        (2, "q", None, 4, True, T0, 2),
    ], "`k.1` LONG, `k``2` STRING, `v.v` STRING, _ch_seq LONG, _ch_deleted BOOLEAN, _ch_changed_at TIMESTAMP, "
       "_ch_batch_id LONG")
    live = rows.transform(live_rows(["k.1", "k`2"]))
    assert [tuple(r) for r in live.collect()] == [(1, "p", "new")]
    assert live.columns == ["k.1", "k`2", "v.v"]


def test_no_job_names_a_column_through_f_col():
    """`F.col(name)` parses `name`; the jobs call `lake_rows.column`, which quotes it (only it may
    call F.col)."""
    import ast
    from pathlib import Path

    import coldharbor

    found = []
    for path in sorted(Path(coldharbor.__file__).parent.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                    and node.func.attr in ("col", "column") and isinstance(node.func.value, ast.Name) \
                    and node.func.value.id == "F":
                found.append(f"{path.name}:{node.lineno}")
    assert [f.split(":")[0] for f in found] == ["lake_rows.py"], found  # column() itself


SETTLED_SCHEMA = LAKE_SCHEMA + ", _ch_settled INT"


def test_current_rows_ranks_a_settled_row_with_the_fresh_rows_of_its_key_only(spark):
    rows = spark.createDataFrame([
        (1, "settled, alone", 10, False, T0, 3, 1),
        (1, "kept older version", 4, False, T0, 2, 0),
        (2, "settled", 11, False, T0, 3, 1),
        (2, "exported after", 20, False, T0, 5, None),
        (3, "settled, newer than the export (an older change exported late)", 30, False, T0, 3, 1),
        (3, "exported after", 12, False, T0, 6, None),
        (4, "settled", 13, False, T0, 3, 1),
        (4, None, 21, True, T0, 5, None),     # deleted after the compaction
        (5, "only exported", 22, False, T0, 5, None),
        (5, "exported again", 23, False, T0, 6, None),
        (6, None, 14, True, T0, 3, 1),     # a settled delete marker
    ], SETTLED_SCHEMA)
    current = rows.transform(current_rows(["id"])).select("id", "v", DELETED)
    assertDataFrameEqual(current, spark.createDataFrame([
        (1, "settled, alone", False), (2, "exported after", False),
        (3, "settled, newer than the export (an older change exported late)", False), (4, None, True),
        (5, "exported again", False), (6, None, True)], "id LONG, v STRING, _ch_deleted BOOLEAN"))


def test_current_rows_without_the_settled_column_ranks_every_row(spark):
    rows = spark.createDataFrame([(1, "old", 1, False, T0, 1), (1, "new", 2, False, T0, 2)], LAKE_SCHEMA)
    assert [r["v"] for r in rows.transform(current_rows(["id"])).collect()] == ["new"]


def _history(rng: random.Random, keys: int) -> list[tuple]:
    """Random exports of random keys (updates, deletes, re-inserts), change sequences increasing."""
    seq, rows = 0, []
    for batch in range(1, 9):
        for key in rng.sample(range(keys), rng.randint(1, keys)):
            seq += 1
            deleted = rng.random() < 0.25
            rows.append((key, None if deleted else f"k{key} s{seq}", seq, deleted, T0 + timedelta(minutes=seq),
                         batch))
    return rows


@pytest.mark.parametrize("seed", range(6))
def test_current_rows_equals_last_write_wins_over_compacted_and_fresh_rows(spark, seed):
    """A compaction at a random batch (settling its newest versions, keeping a random part of the
    older ones), then exports on top: the current read ranks less and answers the same."""
    rng = random.Random(seed)
    history = _history(rng, 40)
    through = rng.randint(1, 8)
    compacted = spark.createDataFrame([r for r in history if r[5] <= through], LAKE_SCHEMA).transform(
        mark_settled(["id"]))
    kept = compacted.filter((column(SETTLED) == 1) | (F.rand(seed) < 0.5))
    fresh = spark.createDataFrame([(*r, None) for r in history if r[5] > through] or
                                  [(-1, "never read", 0, True, T0, 99, None)], SETTLED_SCHEMA)
    lake = kept.unionByName(fresh)
    expected = lake.transform(latest_per_key(["id"])).select("id", "v", SEQ, DELETED)
    unsettled = lake.filter(column(SETTLED).isNull()).count()
    for split in (None, SettledSplit(unsettled, lake.count() - unsettled)):  # planned without and with the log's figures
        assertDataFrameEqual(lake.transform(current_rows(["id"], split)).select("id", "v", SEQ, DELETED), expected)
    assert lake.transform(current_rows(["id"])).count() == lake.select("id").distinct().count()


def test_current_rows_plans_by_the_split_and_answers_the_same(spark):
    settled_only = spark.createDataFrame([(1, "a", 1, False, T0, 1, 1), (1, "older", 0, False, T0, 1, 0),
                                          (2, None, 2, True, T0, 1, 1)], SETTLED_SCHEMA)
    assert sorted((r.id, r.v) for r in settled_only.transform(current_rows(["id"], SettledSplit(0, 3))).collect()) \
        == [(1, "a"), (2, None)]
    exported_only = spark.createDataFrame([(1, "a", 1, False, T0, 1, None), (1, "b", 2, False, T0, 2, None)],
                                          SETTLED_SCHEMA)
    assert [r.v for r in exported_only.transform(current_rows(["id"], SettledSplit(2, 0))).collect()] == ["b"]


def test_mark_settled_sets_the_newest_version_of_each_key(spark):
    rows = spark.createDataFrame([(1, "a", 1, False, T0, 1), (1, "b", 1, False, T0, 2), (1, "c", 0, False, T0, 3),
                                  (2, None, 5, True, T0, 1)], LAKE_SCHEMA)
    marked = {r["v"] or "marker": r[SETTLED] for r in rows.transform(mark_settled(["id"])).collect()}
    assert marked == {"a": 0, "b": 1, "c": 0, "marker": 1}


def test_mark_kept_drops_a_version_inside_the_window_that_ranks_below_the_base(spark):
    """Change times are transaction starts without commit timestamps: the delete (seq 11) of a
    transaction that began before the cutoff outranks an update (seq 10) that began after it. The
    delete is the base, a marker, dropped; the update must go with it, or it would come back."""
    from coldharbor.lake.lake_rows import KEEP, mark_kept

    cutoff = datetime(2026, 1, 1, 12, 30)
    rows = spark.createDataFrame([
        (1, "update, began after the cutoff", 10, False, datetime(2026, 1, 1, 12, 40), 2),
        (1, None, 11, True, datetime(2026, 1, 1, 12, 20), 3),
        (2, "base", 5, False, datetime(2026, 1, 1, 12, 0), 1),
        (2, "inside the window", 12, False, datetime(2026, 1, 1, 12, 45), 3),
        (3, "older", 1, False, datetime(2026, 1, 1, 11, 0), 1),
        (3, "base", 2, False, datetime(2026, 1, 1, 12, 0), 2),
    ], LAKE_SCHEMA)
    kept = {(r["id"], r["v"]) for r in rows.transform(mark_kept(["id"], cutoff)).filter(column(KEEP)).collect()}
    assert kept == {(2, "base"), (2, "inside the window"), (3, "base")}

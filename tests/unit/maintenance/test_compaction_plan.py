"""Which partitions compaction rewrites fully, merges, or leaves (`compaction_plan.plan_partition`)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from coldharbor.lake.delta import LakeFile
from coldharbor.maintenance.compaction_plan import CompactionConfig, plan_partition, small_export_files
from coldharbor.runtime.errors import ConfigError

MB = 1024 * 1024


def config(**overrides) -> CompactionConfig:
    return CompactionConfig(**{"table": None, "lake_root": "/lake", "run_id": "t", "min_small_files": 3,
                               "target_file_bytes": 128 * MB, **overrides})


def settled(size: int = 20 * MB, records: int = 1_000_000) -> LakeFile:
    return LakeFile(path=f"base-{size}-{records}", partition=(), size=size, records=records, max_batch_id=1,
                    unsettled_rows=0)


def export(i: int, records: int = 100, unsettled: int | None = None) -> LakeFile:
    return LakeFile(path=f"export-{i}", partition=(), size=4096, records=records, max_batch_id=i + 1,
                    unsettled_rows=records if unsettled is None else unsettled)


BASE = [settled() for _ in range(4)]  # 4M settled rows in files under 0.75 x the target: "small"
EXPORTS = [export(i) for i in range(5)]  # 500 unsettled rows


def test_full_mode_rewrites_any_partition_with_enough_small_files():
    assert plan_partition(BASE + EXPORTS, config(), full_due=False) == "full"
    assert plan_partition([settled(200 * MB), export(1), export(2)], config(), full_due=False) is None


def test_merge_mode_takes_only_small_files_whose_rows_are_all_unsettled():
    assert plan_partition(BASE + EXPORTS, config(mode="merge"), full_due=False) == "merge"
    assert plan_partition(BASE + EXPORTS[:2], config(mode="merge"), full_due=False) is None  # the base is no export
    mixed = [export(i, records=100, unsettled=50) for i in range(5)]  # a purge's rewrite leaves such files
    assert small_export_files(mixed, config()) == []
    assert plan_partition(BASE + mixed, config(mode="merge"), full_due=False) is None


def test_merge_needs_the_statistics_of_every_file():
    old = LakeFile(path="before-the-column", partition=(), size=MB, records=10, max_batch_id=1, unsettled_rows=None)
    assert plan_partition([old, *EXPORTS], config(mode="merge"), full_due=False) is None
    assert plan_partition([old, *EXPORTS], config(mode="auto"), full_due=False) == "full"


def test_auto_merges_a_small_share_of_exported_rows_and_rewrites_when_due_or_past_the_share():
    assert plan_partition(BASE + EXPORTS, config(mode="auto"), full_due=False) == "merge"
    assert plan_partition(BASE + EXPORTS, config(mode="auto"), full_due=True) == "full"
    under = [export(i, records=80_000) for i in range(5)]  # 400k of 4.4M rows: under a tenth
    assert plan_partition(BASE + under, config(mode="auto"), full_due=False) == "merge"
    assert plan_partition(BASE + under, config(mode="auto", full_rewrite_fraction=0.05), full_due=False) == "full"
    heavier = [export(i, records=200_000) for i in range(5)]  # 1M of 5M: a fifth
    assert plan_partition(BASE + heavier, config(mode="auto"), full_due=False) == "full"
    assert plan_partition(BASE + heavier, config(mode="auto", full_rewrite_fraction=0.5), full_due=False) == "merge"


def test_auto_rewrites_a_partition_that_holds_no_settled_row_yet():
    assert plan_partition(EXPORTS, config(mode="auto"), full_due=False) == "full"


def test_auto_leaves_a_partition_with_too_few_small_export_files_until_the_rewrite_is_due():
    big_base = [settled(200 * MB, 10_000_000)]
    assert plan_partition(big_base + EXPORTS[:2], config(mode="auto"), full_due=False) is None
    assert plan_partition(BASE + EXPORTS[:2], config(mode="auto"), full_due=False) is None
    assert plan_partition(BASE + EXPORTS[:2], config(mode="auto"), full_due=True) == "full"


@pytest.mark.parametrize("overrides, message", [
    ({"mode": "sometimes"}, "compaction mode must be one of full, merge, auto"),
    ({"full_rewrite_fraction": 0}, "full rewrite fraction"),
    ({"full_rewrite_fraction": 1.5}, "full rewrite fraction"),
    ({"full_every": timedelta(0)}, "positive time"),
])
def test_settings_that_make_no_sense_are_refused(overrides, message):
    with pytest.raises(ConfigError, match=message):
        config(**overrides)

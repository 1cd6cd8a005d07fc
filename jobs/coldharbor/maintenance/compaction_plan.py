"""What compaction does to each partition of a table: its settings (`CompactionConfig`), the plan
(rewrite with last-write-wins, merge the small export files, or leave it), the number and size of
the files it writes, and the results it reports.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import timedelta

from coldharbor.lake.delta import LakeFile, LakeSnapshot
from coldharbor.lake.lake_rows import quoted
from coldharbor.runtime import settings
from coldharbor.runtime.errors import ConfigError

OPERATION = "coldharbor-compaction"


MERGE_OPERATION = "coldharbor-merge-small-files"


MODES = ("full", "merge", "auto")


@dataclass(frozen=True)
class CompactionConfig:
    table: str | None
    lake_root: str
    run_id: str
    target_file_bytes: int = 128 * 1024 * 1024
    min_small_files: int = 5
    small_file_ratio: float = 0.75
    history_window: timedelta = timedelta(hours=settings.DEFAULT_HISTORY_WINDOW_HOURS)
    max_attempts: int = 4
    retry_backoff_s: float = 1.0
    mode: str = "full"                  # full | merge | auto (module docstring)
    full_rewrite_fraction: float = 0.1  # auto: a full rewrite once exported rows pass this share
    full_every: timedelta = timedelta(hours=24)  # auto: and at least this often per table

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ConfigError(f"compaction mode must be one of {', '.join(MODES)}, got {self.mode!r}")
        if not 0 < self.full_rewrite_fraction <= 1:
            raise ConfigError(f"full rewrite fraction must be in (0, 1], got {self.full_rewrite_fraction}")
        if self.full_every <= timedelta(0):
            raise ConfigError(f"full rewrites must be due after a positive time, got {self.full_every}")
        if self.target_file_bytes < 1024 * 1024:
            raise ConfigError(f"target file size must be at least 1 MB, got {self.target_file_bytes} bytes")
        if self.min_small_files < 2:
            raise ConfigError(f"min small files must be at least 2 (rewriting one file into one file gains "
                              f"nothing), got {self.min_small_files}")
        if not 0 < self.small_file_ratio <= 1:
            raise ConfigError(f"small file ratio must be in (0, 1], got {self.small_file_ratio}")
        if self.max_attempts < 1:
            raise ConfigError(f"max attempts must be at least 1, got {self.max_attempts}")

    @property
    def small_file_bytes(self) -> int:
        return int(self.target_file_bytes * self.small_file_ratio)


@dataclass
class PartitionResult:
    partition: dict[str, str | None]
    status: str                 # compacted | merged | below_threshold | gave_up
    files_before: int = 0
    bytes_before: int = 0
    files_after: int = 0
    bytes_after: int = 0
    rows_before: int = 0
    rows_after: int = 0
    versions_dropped: int = 0
    markers_dropped: int = 0
    read_version: int | None = None
    lake_version: int | None = None
    attempts: int = 0


@dataclass
class TableResult:
    table: str
    status: str                 # compacted | merged | nothing_to_do | no_lake_table | skipped | gave_up | failed
    partitions: list[PartitionResult] = field(default_factory=list)
    error: str | None = None    # why a table of a run over every table was left out


def partitions_of(snap: LakeSnapshot) -> dict[tuple, list[LakeFile]]:
    grouped: dict[tuple, list[LakeFile]] = {}
    for f in snap.files:
        grouped.setdefault(f.partition, []).append(f)
    return grouped


def needs_rewrite(files: Sequence[LakeFile], config: CompactionConfig) -> bool:
    return sum(1 for f in files if f.size < config.small_file_bytes) >= config.min_small_files


def small_export_files(files: Sequence[LakeFile], config: CompactionConfig) -> list[LakeFile]:
    """The small files whose rows are all unsettled (exports' own, or an earlier merge of them)."""
    return [f for f in files if f.only_unsettled and f.size < config.small_file_bytes]


def plan_partition(files: Sequence[LakeFile], config: CompactionConfig, full_due: bool) -> str | None:
    """What a partition gets: "full" (the last-write-wins rewrite), "merge" (its small export files
    merged, no row changed) or None (nothing worth doing).

    A merge needs every file's statistics of `_ch_settled` (else a file's unsettled rows are not
    known). `auto` rewrites fully when that is due for the table, when the statistics are missing,
    when the partition holds no settled row yet, or when its unsettled rows pass
    `full_rewrite_fraction` of its rows (each of them is ranked by every current read)."""
    full = "full" if needs_rewrite(files, config) else None
    known = bool(files) and all(f.records is not None and f.unsettled_rows is not None for f in files)
    merge = "merge" if known and len(small_export_files(files, config)) >= config.min_small_files else None
    if config.mode == "full":
        return full
    if config.mode == "merge":
        return merge
    if not known or full_due:
        return full
    rows = sum(f.records for f in files)
    unsettled = sum(f.unsettled_rows for f in files)
    if unsettled == rows or unsettled > config.full_rewrite_fraction * rows:
        return full or merge
    return merge


def output_file_count(total_bytes: int, config: CompactionConfig) -> int:
    return max(1, math.ceil(total_bytes / config.target_file_bytes))


def sql_literal(value: str) -> str:
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def partition_predicate(partition: tuple[tuple[str, str | None], ...], table_columns: dict[str, str]) -> str:
    """The SQL predicate selecting one partition (values come from the Delta log as strings)."""
    terms = []
    for name, value in partition:
        if value is None:
            terms.append(f"{quoted(name)} IS NULL")
        else:
            terms.append(f"{quoted(name)} = CAST({sql_literal(value)} AS {table_columns[name]})")
    return " AND ".join(terms) if terms else "true"

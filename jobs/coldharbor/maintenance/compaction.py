"""Compaction: rewrite a table's small files the way Iceberg's rewrite_data_files does, with
last-write-wins per key (invariants 5 and 7).

Per table (under its compaction lock) and per partition:
  1. plan from the Delta log: a partition is rewritten when it holds at least `min_small_files`
     files smaller than `small_file_ratio` x the target size;
  2. read the partition at the planned version V and keep, per key, the versions inside the
     history window plus the newest older one (`lake_rows.mark_kept`), the newest of all settled
     and the others not (`lake_rows.mark_settled`: current reads rank only what exports add
     after it); the rewrite covers every
     file of the partition, and partition columns are part of the key, so it covers every file
     that can hold an older version of a key: dropping a delete marker cannot resurrect anything;
  3. write ceil(bytes / target) files sorted by the table's sort columns (else its key) as ONE
     commit that replaces exactly the rows of V: `replaceWhere <partition> AND _ch_batch_id <= N`,
     N the largest batch id in V. An export that commits meanwhile adds a higher batch id, so its
     rows are neither read nor replaced; Delta's conflict checks catch the rest, and a conflict
     is retried (bounded) from a fresh plan.

A merge (`--mode merge`) is the cheap kind, in the way of Delta's OPTIMIZE bin-packing: the small
files exports wrote (every row unsettled, by their statistics) become ceil(bytes / target) files
holding exactly the same rows, in one commit:
`replaceWhere <partition> AND _ch_settled IS NULL AND _ch_batch_id <= N` (Delta refuses
`dataChange=false` with a replaceWhere on data columns, so the commit counts as a data change). No
version is dropped and no row changes, so every read (current, as-of, verify) answers as before; a
report then opens a few files instead of one per export. OPTIMIZE itself cannot be told which
files to take: it bin-packs every file under a size, the settled base's too, and a base file
merged with export files would be ranked by every current read.

`--mode auto` (the compaction DAG's) merges a partition whose exported rows are a small share of it
(`full_rewrite_fraction`) while a full rewrite of the table ran within `full_every`, and rewrites
it fully otherwise.
"""

from __future__ import annotations

import logging
import sys
import time
from dataclasses import asdict
from datetime import timedelta

import psycopg
from pyspark.sql import SparkSession

from coldharbor.capture import registry
from coldharbor.capture.registry import RegisteredTable
from coldharbor.lake import delta
from coldharbor.lake.delta import LakeSnapshot
from coldharbor.maintenance import maintenance_runs
from coldharbor.maintenance.compaction_commits import ConcurrentRewriteError
from coldharbor.maintenance.compaction_plan import (
    MODES,
    CompactionConfig,
    PartitionResult,
    TableResult,
    partitions_of,
    plan_partition,
)
from coldharbor.maintenance.compaction_rewrite import merge_partition, rewrite_partition
from coldharbor.runtime import faults, pg, settings
from coldharbor.runtime.errors import ConfigError, jvm_message, raise_if_tables_failed
from coldharbor.runtime.job_main import EXIT_GAVE_UP, job_parser, reason, run_job

log = logging.getLogger(__name__)


def compact_table(spark: SparkSession, conn: psycopg.Connection, table: RegisteredTable,
                  config: CompactionConfig, hook: faults.Hook = faults.from_environment) -> TableResult:
    with pg.advisory_lock(conn, "compact", table.table_id) as acquired:
        if not acquired:
            log.info("skipped %s: another compaction of this table holds its lock", table.qualified_name)
            return TableResult(table.qualified_name, "skipped")
        registry.refuse_replaced(conn, table)
        maintenance_runs.start(conn, config.run_id, table.table_id, "compact")
        try:
            result = _compact(spark, conn, table, config, hook)
        except Exception as exc:
            maintenance_runs.finish(conn, config.run_id, table.table_id, "compact", "failed", error=reason(exc))
            raise
        versions = [p.lake_version for p in result.partitions if p.lake_version is not None]
        maintenance_runs.finish(conn, config.run_id, table.table_id, "compact",
                                "failed" if result.status == "gave_up" else "succeeded",
                                detail={"status": result.status, "partitions": [asdict(p) for p in result.partitions]},
                                lake_version=max(versions) if versions else None)
        return result


def _compact(spark: SparkSession, conn: psycopg.Connection, table: RegisteredTable, config: CompactionConfig,
             hook: faults.Hook) -> TableResult:
    path = table.lake_path(config.lake_root)
    snap = delta.snapshot(spark, path)
    if snap is None:
        log.info("%s: no lake table yet at %s; nothing to compact", table.qualified_name, path)
        return TableResult(table.qualified_name, "no_lake_table")
    full_due = config.mode == "auto" and maintenance_runs.full_compaction_due(conn, table.table_id, config.full_every)
    todo = [(p, kind) for p, files in partitions_of(snap).items()
            if (kind := plan_partition(files, config, full_due)) is not None]
    if not todo:
        log.info("%s: %s files in %s partition(s) at version %s, none with %s small files%s; nothing to compact",
                 table.qualified_name, len(snap.files), len(partitions_of(snap)), snap.version,
                 config.min_small_files, "" if config.mode == "full" else " to rewrite or merge")
        return TableResult(table.qualified_name, "nothing_to_do")
    results = [_rewrite_with_retries(spark, conn, table, path, partition, config, hook, snap, kind)
               for partition, kind in todo]
    if any(r.status == "gave_up" for r in results):
        status = "gave_up"
    else:
        status = "compacted" if any(r.status == "compacted" for r in results) else "merged"
    return TableResult(table.qualified_name, status, results)


def _rewrite_with_retries(spark: SparkSession, conn: psycopg.Connection, table: RegisteredTable, path: str,
                          partition: tuple,
                          config: CompactionConfig, hook: faults.Hook, planned: LakeSnapshot,
                          kind: str = "full") -> PartitionResult:
    attempt_once = rewrite_partition if kind == "full" else merge_partition
    for attempt in range(1, config.max_attempts + 1):
        # The first attempt reads the version it was planned on; a retry plans again from the latest.
        snap = planned if attempt == 1 else delta.snapshot(spark, path)
        try:
            result = attempt_once(spark, conn, table, path, partition, snap, config, hook)
            result.attempts = attempt
            return result
        except Exception as exc:
            if not _is_conflict(exc):
                raise
            log.warning("%s %s: attempt %s/%s lost to a concurrent commit (%s)", table.qualified_name,
                        dict(partition), attempt, config.max_attempts, jvm_message(exc))
            time.sleep(config.retry_backoff_s * 2 ** (attempt - 1))
    log.error("%s %s: gave up after %s attempts, each lost to a concurrent commit; the table is unchanged "
              "by this partition's rewrite", table.qualified_name, dict(partition), config.max_attempts)
    return PartitionResult(dict(partition), "gave_up", attempts=config.max_attempts)


def _is_conflict(exc: Exception) -> bool:
    """Lost to a concurrent commit: Delta's conflict classes, or a rewrite seen before the write."""
    return isinstance(exc, (ConcurrentRewriteError, *delta.CONFLICTS))


def parse_args(argv: list[str]) -> CompactionConfig:
    parser = job_parser(
        "compact.py",
        "Rewrite the small files of registered tables' Delta tables with last-write-wins per key, keeping the "
        "versions as-of reports need (the history window). PostgreSQL (registry, locks, run log) is reached "
        f"through {settings.PG_DSN_ENV}.",
        table_help="compact only this registered table (schema.table); default: all",
        run_id_help="identifier recorded with the run (default: a new one)")
    parser.add_argument("--target-file-mb", type=float, default=128.0,
                        help="size of the files the rewrite writes (default 128)")
    parser.add_argument("--min-small-files", type=int, default=5,
                        help="rewrite a partition once it has this many small files (default 5)")
    parser.add_argument("--small-file-ratio", type=float, default=0.75,
                        help="a file is small below this fraction of the target size (default 0.75)")
    parser.add_argument("--history-hours", type=float, default=None,
                        help=f"keep every version changed within this many hours (default: "
                             f"${settings.HISTORY_WINDOW_ENV}, else {settings.DEFAULT_HISTORY_WINDOW_HOURS:g})")
    parser.add_argument("--max-attempts", type=int, default=4,
                        help="attempts per partition when concurrent commits win (default 4)")
    parser.add_argument("--mode", choices=MODES, default="full",
                        help="full: the last-write-wins rewrite (default); merge: only merge the small files "
                             "exports wrote, no row changed; auto: merge, and the full rewrite when due "
                             "(see --full-rewrite-fraction and --full-every-hours)")
    parser.add_argument("--full-rewrite-fraction", type=float, default=0.1,
                        help="auto: rewrite a partition fully once its exported rows pass this share of its "
                             "rows (default 0.1)")
    parser.add_argument("--full-every-hours", type=float, default=24.0,
                        help="auto: rewrite a table fully when its last full rewrite is older (default 24)")
    args = parser.parse_args(argv)
    window = settings.history_window_hours()
    hours = args.history_hours if args.history_hours is not None else window
    if not hours > 0:
        raise ConfigError(f"the history window must be a positive number of hours, got {hours}")
    if hours < window:
        # Versions dropped inside the window as-of reports may ask for would make them answer wrongly.
        raise ConfigError(f"--history-hours {hours:g} is shorter than the window as-of reports may ask for "
                          f"({settings.HISTORY_WINDOW_ENV}={window:g} hours): the versions it would drop would make "
                          "those reports wrong; keep at least that many hours, or shorten the window first")
    return CompactionConfig(
        table=args.table, lake_root=settings.lake_root(args.lake_root),
        run_id=args.run_id or maintenance_runs.new_run_id("compact"),
        target_file_bytes=int(args.target_file_mb * 1024 * 1024), min_small_files=args.min_small_files,
        small_file_ratio=args.small_file_ratio, history_window=timedelta(hours=hours),
        max_attempts=args.max_attempts, mode=args.mode, full_rewrite_fraction=args.full_rewrite_fraction,
        full_every=timedelta(hours=args.full_every_hours))


def run(spark: SparkSession | None, conn: psycopg.Connection, config: CompactionConfig) -> int:
    """Compacts the table, or every registered one (`spark` None: none is there to compact). Over
    every table, one gone or dropped and created again is named at the end; the others are still
    compacted. Exit 0, 3 when concurrent commits won every attempt on a table."""
    refused, todo = registry.left_out(registry.load(conn, config.table))
    results = [TableResult(t.qualified_name, "failed", error=why) for t, why in refused]
    if todo and spark is None:  # registered since main looked
        from coldharbor.runtime.spark import get_session

        spark = get_session("coldharbor-compact")
    results += [compact_table(spark, conn, t, config) for t in todo]
    for result in results:
        log.info("result: %s", result)
    raise_if_tables_failed(results, "compacted")
    gave_up = [r.table for r in results if r.status == "gave_up"]
    if gave_up:
        log.error("compact gave up on %s: concurrent commits won every attempt; nothing of those "
                  "partitions was rewritten; run it again later", ", ".join(gave_up))
        return EXIT_GAVE_UP
    return 0


def main(argv: list[str]) -> int:
    def body() -> int:
        config = parse_args(argv)
        with pg.connect(settings.pg_dsn()) as conn:
            tables = registry.load(conn, config.table)
            if config.table is not None:
                registry.require_present(tables)  # before Spark starts
            spark = None
            if registry.left_out(tables)[1]:  # a table to compact: only then a JVM
                from coldharbor.runtime.spark import get_session

                spark = get_session("coldharbor-compact")
            return run(spark, conn, config)

    return run_job("compact", body)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

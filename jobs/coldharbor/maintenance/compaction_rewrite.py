"""One partition's commit of a compaction (the steps are in `compaction`'s docstring): a full
rewrite (`rewrite_partition`: per key the versions the history window keeps, the newest settled,
delete markers dropped where nothing older can resurface) or a merge of the small export files
(`merge_partition`: the same rows in fewer files). Each reads the partition at the planned
version, replaces exactly the rows of that version (`replaceWhere ... _ch_batch_id <= N`) in one
commit under the table's lake commit lock, and records the commit's figures."""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from datetime import datetime, timezone

import psycopg
from pyspark.sql import DataFrame, Observation, SparkSession
from pyspark.sql import functions as F

from coldharbor.capture.registry import RegisteredTable
from coldharbor.lake import delta, writes
from coldharbor.lake.delta import LakeFile, LakeSnapshot
from coldharbor.lake.lake_rows import BATCH_ID, DELETED, KEEP, SETTLED, column, mark_kept, mark_settled, quoted
from coldharbor.maintenance.compaction_commits import check_no_rewrites_since, record_commit, record_history_kept
from coldharbor.maintenance.compaction_plan import (
    MERGE_OPERATION,
    OPERATION,
    CompactionConfig,
    PartitionResult,
    needs_rewrite,
    output_file_count,
    partition_predicate,
    partitions_of,
    small_export_files,
)
from coldharbor.runtime import faults, pg

log = logging.getLogger(__name__)


def rewrite_partition(spark: SparkSession, conn: psycopg.Connection, table: RegisteredTable, path: str,
                       partition: tuple, snap: LakeSnapshot, config: CompactionConfig,
                       hook: faults.Hook) -> PartitionResult:
    files = partitions_of(snap).get(partition, [])
    result = PartitionResult(dict(partition), "below_threshold", files_before=len(files),
                             bytes_before=sum(f.size for f in files), read_version=snap.version)
    if not needs_rewrite(files, config):
        return result
    rows = delta.read_version(spark, path, snap.version)
    lake_types = {f.name: f.dataType.simpleString() for f in rows.schema.fields}
    where = partition_predicate(partition, lake_types)
    rows = rows.filter(where)
    max_batch = _max_batch(rows, files)
    cutoff = datetime.now(timezone.utc) - config.history_window
    observation = Observation(f"compaction-{config.run_id}-{snap.version}")
    adds_settled = SETTLED not in rows.columns  # a lake table written before the column
    kept = (rows.transform(mark_settled(table.key_columns)).transform(mark_kept(table.key_columns, cutoff))
            .observe(observation,
                     F.count(F.lit(1)).alias("rows_before"),
                     F.count(F.when(column(DELETED), 1)).alias("markers_before"),
                     F.count(F.when(column(KEEP), 1)).alias("rows_after"),
                     F.count(F.when(column(KEEP) & column(DELETED), 1)).alias("markers_after"))
            .filter(column(KEEP)).drop(KEEP))
    out = _layout(kept, table, output_file_count(result.bytes_before, config))
    out = faults.inside_tasks(out, "compact_during_write")  # killed with the rewrite's files half written
    metadata = {"operation": OPERATION, "run_id": config.run_id, "table": table.qualified_name,
                "partition": dict(partition), "read_version": snap.version, "max_batch_id": max_batch}
    hook("compact_before_commit")
    record_history_kept(conn, table, cutoff)
    writer = (out.write.format("delta").mode("overwrite")
              .option("replaceWhere", f"({where}) AND {quoted(BATCH_ID)} <= {max_batch}")
              .option("userMetadata", json.dumps(metadata, sort_keys=True))
              .option("mergeSchema", str(adds_settled).lower()))
    if table.partition_by:
        writer = writer.partitionBy(*table.partition_by)
    with pg.lake_commit_lock(conn, table.table_id, path):
        check_no_rewrites_since(spark, path, snap.version, config.run_id, dict(partition))
        # The current read skips files by the column's statistics. Delta checks the property against
        # the schema: a table still without the column gains it with the rewrite, and the property
        # after it (that rewrite's files have none; the next ones do).
        if not adds_settled:
            writes.collect_statistics_of(spark, path, SETTLED)
        writer.save(path)
        if adds_settled:
            writes.collect_statistics_of(spark, path, SETTLED)
    hook("compact_after_commit")
    figures = observation.get
    record_commit(spark, path, metadata, result, "compacted")
    result.rows_before = figures["rows_before"]
    result.rows_after = figures["rows_after"]
    result.markers_dropped = figures["markers_before"] - figures["markers_after"]
    result.versions_dropped = result.rows_before - result.rows_after - result.markers_dropped
    log.info("%s %s: compacted version %s into %s: files %s -> %s, bytes %s -> %s, rows %s -> %s "
             "(%s superseded versions and %s delete markers dropped)", table.qualified_name, dict(partition),
             snap.version, result.lake_version, result.files_before, result.files_after, result.bytes_before,
             result.bytes_after, result.rows_before, result.rows_after, result.versions_dropped,
             result.markers_dropped)
    return result


def merge_partition(spark: SparkSession, conn: psycopg.Connection, table: RegisteredTable, path: str,
                     partition: tuple, snap: LakeSnapshot, config: CompactionConfig,
                     hook: faults.Hook) -> PartitionResult:
    """The partition's unsettled rows of version V, unchanged, in fewer files (module docstring)."""
    files = partitions_of(snap).get(partition, [])
    small = small_export_files(files, config)
    fresh = [f for f in files if f.unsettled_rows]  # every file the replaceWhere below rewrites
    result = PartitionResult(dict(partition), "below_threshold", files_before=len(fresh),
                             bytes_before=sum(f.size for f in fresh), read_version=snap.version)
    if len(small) < config.min_small_files:
        return result
    rows = delta.read_version(spark, path, snap.version)
    lake_types = {f.name: f.dataType.simpleString() for f in rows.schema.fields}
    max_batch = _max_batch(rows.filter(partition_predicate(partition, lake_types)), fresh)
    where = (f"({partition_predicate(partition, lake_types)}) AND {quoted(SETTLED)} IS NULL "
             f"AND {quoted(BATCH_ID)} <= {max_batch}")
    observation = Observation(f"merge-{config.run_id}-{snap.version}")
    merged = rows.filter(where).observe(observation, F.count(F.lit(1)).alias("rows"))
    out = _layout(merged, table, output_file_count(result.bytes_before, config))
    out = faults.inside_tasks(out, "compact_during_write")
    metadata = {"operation": MERGE_OPERATION, "run_id": config.run_id, "table": table.qualified_name,
                "partition": dict(partition), "read_version": snap.version, "max_batch_id": max_batch}
    hook("compact_before_commit")
    writer = (out.write.format("delta").mode("overwrite").option("replaceWhere", where)
              .option("userMetadata", json.dumps(metadata, sort_keys=True)))
    if table.partition_by:
        writer = writer.partitionBy(*table.partition_by)
    with pg.lake_commit_lock(conn, table.table_id, path):
        check_no_rewrites_since(spark, path, snap.version, config.run_id, dict(partition))
        writer.save(path)
    hook("compact_after_commit")
    record_commit(spark, path, metadata, result, "merged")
    result.rows_before = result.rows_after = observation.get["rows"]
    log.info("%s %s: merged the small export files of version %s into %s: files %s -> %s, bytes %s -> %s, "
             "%s rows unchanged", table.qualified_name, dict(partition), snap.version, result.lake_version,
             result.files_before, result.files_after, result.bytes_before, result.bytes_after, result.rows_after)
    return result


def _max_batch(rows: DataFrame, files: Sequence[LakeFile]) -> int:
    if files and all(f.max_batch_id is not None for f in files):
        return max(f.max_batch_id for f in files)
    return rows.agg(F.max(column(BATCH_ID))).first()[0]  # statistics missing: read it


def _layout(rows: DataFrame, table: RegisteredTable, n_files: int) -> DataFrame:
    """n_files files, each a range of the sort columns (the key when none are configured)."""
    order = [column(name) for name in table.sort_by or table.key_columns]
    if n_files == 1:
        return rows.repartition(1).sortWithinPartitions(*order)
    return rows.repartitionByRange(n_files, *order).sortWithinPartitions(*order)

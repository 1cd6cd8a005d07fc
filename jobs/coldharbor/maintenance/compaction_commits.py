"""A compaction commit's guards and record: the history the rewrite may drop, recorded before it
commits (as-of reads before it are refused from then on), the check that no commit rewrote rows
since the version it read (invariant 7), and the commit found again for its figures.
"""

from __future__ import annotations

import json
from datetime import datetime

import psycopg
from pyspark.sql import SparkSession

from coldharbor.capture.registry import RegisteredTable
from coldharbor.lake import commits, delta
from coldharbor.maintenance.compaction_plan import MERGE_OPERATION, OPERATION, PartitionResult
from coldharbor.runtime.errors import LakeUnavailableError


def record_history_kept(conn: psycopg.Connection, table: RegisteredTable, cutoff: datetime) -> None:
    """Records, before the rewrite commits, that versions older than `cutoff` may be gone from the
    lake (sql/migrations/025): as-of reads before it are refused from then on, whatever the window is raised
    to. A rewrite that then fails leaves the record a little early: refusals, never wrong answers."""
    with conn.transaction():
        conn.execute("INSERT INTO coldharbor.history_kept (table_id, kept_from) VALUES (%s, %s) "
                     "ON CONFLICT (table_id) DO UPDATE SET kept_from = greatest(history_kept.kept_from, "
                     "EXCLUDED.kept_from), recorded_at = now()", (table.table_id, cutoff))


def record_commit(spark: SparkSession, path: str, metadata: dict, result: PartitionResult, status: str) -> None:
    """The partition's commit (found by its metadata) into `result`: its version, files and bytes."""
    keys = ("operation", "run_id", "read_version", "partition")
    entry = commits.find_commit_entry(spark, path, {k: metadata[k] for k in keys})
    if entry is None:
        raise LakeUnavailableError(f"the {metadata['operation']} commit of {metadata['table']} is not in the "
                                   "Delta history")
    metrics = entry["metrics"]
    result.status = status
    result.lake_version = entry["version"]
    result.files_after = int(metrics.get("numFiles", 0))
    result.bytes_after = int(metrics.get("numOutputBytes", 0))


class ConcurrentRewriteError(Exception):
    """A commit other than a blind append landed after the version the rewrite read."""


# Commits that leave every row the rewrite read in place: appends (exports) and table upkeep.
_HARMLESS_OPERATIONS = {"VACUUM START", "VACUUM END", "SET TBLPROPERTIES"}


def check_no_rewrites_since(spark: SparkSession, path: str, version: int, run_id: str | None = None,
                             partition: dict | None = None) -> None:
    """Refuses to commit over a commit that removed or rewrote rows after `version`.

    replaceWhere removes the matching files of the table as it is when the write starts, not as
    the rewrite read it: a DELETE or MERGE that committed in between would be undone. Delta's
    own conflict checks cover commits after the write starts; this covers the ones before. The
    same run's commits of other partitions (`run_id`, `partition`) touched none of this one's rows:
    without this, every partition after a run's first lost its first attempt to the run itself.
    """
    latest = delta.pin_version(spark, path)
    if latest == version:
        return
    history = delta.history_of(spark, path, latest - version).collect()
    for entry in history:
        if entry["version"] > version and not entry["isBlindAppend"] \
                and entry["operation"] not in _HARMLESS_OPERATIONS \
                and not _own_other_partition(entry["userMetadata"], run_id, partition):
            raise ConcurrentRewriteError(f"version {entry['version']} "
                                         f"({entry['operation']}) changed rows after version {version} was read")


def _own_other_partition(user_metadata: str | None, run_id: str | None, partition: dict | None) -> bool:
    """Whether a commit's metadata names a rewrite or merge of this run in another partition."""
    if run_id is None or not user_metadata:
        return False
    try:
        metadata = json.loads(user_metadata)
    except ValueError:
        return False
    return (isinstance(metadata, dict) and metadata.get("operation") in (OPERATION, MERGE_OPERATION)
            and metadata.get("run_id") == run_id and metadata.get("partition") != partition)

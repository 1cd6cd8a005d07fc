"""A table's export batches in the lake: the export's app id and batch ids (txnAppId/txnVersion,
invariant 4), a batch's commit found in the Delta history (publish order, invariant 3), the fence
that stops a dead export's write, and the lake that holds batches PostgreSQL never recorded.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping

from delta.exceptions import ConcurrentTransactionException
from pyspark.sql import SparkSession

from coldharbor.lake import lake_store
from coldharbor.lake.delta import lake_error, reaching
from coldharbor.runtime.errors import ColdharborError, LakeUnavailableError

log = logging.getLogger(__name__)


# How far back in the Delta history to look for a batch's commit (compaction and cleanup commits
# can land between an export's commit and its lookup).
COMMIT_SEARCH_DEPTH = 200
RECENT_COMMITS = 5


def export_app_id(table_id: int) -> str:
    """Delta txnAppId of a table's export: with txnVersion=batch id, a replay is a no-op."""
    return f"coldharbor-export-{table_id}"


class LakeAheadError(ColdharborError):
    """The lake holds a commit of a batch id PostgreSQL is about to use or has recorded for another
    export: PostgreSQL was restored to an earlier point (or its coldharbor schema rewound) while the
    lake kept later commits. Delta would skip a reused batch id as already written, so nothing may
    be written or marked until a resync rebuilds the lake from PostgreSQL."""

    def __init__(self, table: str, batch_id: int, detail: str):
        super().__init__(
            f"PostgreSQL is behind the lake for {table} (restored from a backup?): {detail}; nothing was "
            f"written or marked. Rebuild the table's lake state from PostgreSQL with "
            f"`jobs/resync.py --table {table}`")
        self.batch_id = batch_id
        self.detail = detail


def committed_txn_version(spark: SparkSession, path: str, app_id: str) -> int | None:
    """The newest txnVersion Delta recorded for `app_id` (the batch id it skips at or below), or
    None when the table does not exist or never saw that app id."""
    return lake_store.txn_version(path, app_id)


class ForeignLakeError(LakeUnavailableError):
    """The table's lake folder holds a Delta table its registration never wrote: an earlier
    registration's (its row removed from coldharbor.tables, the table registered anew), or another
    table's. Its rows would mix with this registration's, and its batch ids and sequences outrank
    them; nothing may be written there."""

    def __init__(self, table: str, path: str):
        super().__init__(
            f"the lake folder {path} holds a Delta table that this registration of {table} did not write (an "
            "earlier registration of a table of that name, or another table's lake), so nothing was written to it; "
            "move that folder aside (or remove it) and the next export writes the table whole into a new lake "
            "table there")


def foreign_lake(path: str, app_id: str) -> bool:
    """Whether `path` holds a Delta table in which `app_id` (the registration's export, which every
    write of its own carries: exports, bases and fences) never committed."""
    return lake_store.txn_version(path, app_id) is None and lake_store.version(path) is not None


def require_own_lake(spark: SparkSession, path: str, app_id: str, table: str) -> None:
    """ForeignLakeError, before anything is recorded or written, when `path` holds a Delta table the
    registration did not write (`foreign_lake`). A missing lake table is the registration's to start."""
    if foreign_lake(path, app_id):
        raise ForeignLakeError(table, path)


def require_unused_batch_id(spark: SparkSession, path: str, app_id: str, batch_id: int, table: str) -> None:
    """LakeAheadError when Delta would treat `batch_id` as already written (a silent no-op)."""
    check_batch_id(committed_txn_version(spark, path, app_id), batch_id, table)


def check_batch_id(recorded: int | None, batch_id: int, table: str) -> None:
    """LakeAheadError when `batch_id`, the next one PostgreSQL would use, is at or below `recorded`,
    the last one Delta committed (`committed_txn_version`): PostgreSQL is behind the lake. The lake's
    figure must be read before PostgreSQL's: an export records its intent before its commit, so
    then a batch id the lake holds is always one PostgreSQL has used."""
    if recorded is not None and batch_id <= recorded:
        raise LakeAheadError(table, batch_id, f"its next batch id {batch_id} is at or below the lake's last "
                                              f"committed batch id {recorded}")


def fence_batch(spark: SparkSession, path: str, app_id: str, batch_id: int) -> None:
    """Makes sure batch `batch_id` can no longer commit: an empty commit that records it with Delta as
    written (txnAppId/txnVersion), or nothing when Delta has it already (it committed: look again).

    A write whose job died may still be running: a Spark Connect server carries an operation whose
    client is gone to its end. Its transaction read the app id's version, so any commit recording
    that app id makes it fail (ConcurrentTransactionException) instead of landing after the next run
    gave the batch up. Before the table exists there is nothing to fence. The empty commit takes the
    table's own partitioning: the registration's may differ (another relation registered under the
    name, whose base replaces the lake table: `DELTA_PARTITION_COLUMN_NOT_FOUND` stuck it for good)."""
    if not lake_store.is_delta_table(path):
        return
    for attempt in range(FENCE_ATTEMPTS):
        # Read each time: the commit the fence lost to may have changed the table's columns.
        empty = spark.read.format("delta").load(path).limit(0)
        writer = (empty.write.format("delta").mode("append")
                  .option("txnAppId", app_id)
                  .option("txnVersion", batch_id)
                  .option("userMetadata", json.dumps({"app_id": app_id, "fenced_batch_id": batch_id}, sort_keys=True)))
        try:
            writer.save(path)
            return
        except Exception as exc:
            # The fence lost to a commit recording the same app id: the running write it is there
            # to stop landed first. Fenced again, Delta now skips the fence if that was this batch
            # (the caller then finds its commit), or records it if it was an earlier one.
            if not isinstance(exc, ConcurrentTransactionException) or attempt == FENCE_ATTEMPTS - 1:
                raise lake_error(f"fencing batch {batch_id} of {path} failed", exc) from exc
            log.warning("fencing batch %s of %s: a commit of the same export landed meanwhile; fencing again",
                        batch_id, path)


FENCE_ATTEMPTS = 3


def batch_commit_entry(spark: SparkSession, path: str, app_id: str, batch_id: int, commit_token: str | None = None,
                       table: str = "", depth: int = COMMIT_SEARCH_DEPTH) -> dict | None:
    """The history entry of the commit of this batch, or None if it never committed.

    A commit of the same (app id, batch id) made by another export -- its `commit_token` differs
    from the one PostgreSQL recorded at intent -- is a LakeAheadError, never taken for this batch's.
    Batches recorded before commit tokens existed (token None) match by app id and batch id alone.
    """
    entry = find_commit_entry(spark, path, {"app_id": app_id, "batch_id": batch_id}, depth)
    if entry is None or commit_token is None:
        return entry
    found = json.loads(entry["user_metadata"]).get("commit_token")
    if found != commit_token:
        raise LakeAheadError(table, batch_id, f"the lake's commit of batch {batch_id} (Delta version "
                                              f"{entry['version']}) was made by another export than the one "
                                              "PostgreSQL recorded")
    return entry


def find_batch_commit(spark: SparkSession, path: str, app_id: str, batch_id: int, commit_token: str | None = None,
                      table: str = "", depth: int = COMMIT_SEARCH_DEPTH) -> int | None:
    """The Delta version of the commit of this batch (see `batch_commit_entry`), or None."""
    return (batch_commit_entry(spark, path, app_id, batch_id, commit_token, table, depth) or {}).get("version")


def find_commit_entry(spark: SparkSession, path: str, metadata: Mapping[str, object],
                      depth: int = COMMIT_SEARCH_DEPTH) -> dict | None:
    """The history entry of that commit (version, metrics, user_metadata), or None."""
    with reaching("reading the Delta history of", path):
        return _find_commit_entry(spark, path, metadata, depth)


def _find_commit_entry(spark: SparkSession, path: str, metadata: Mapping[str, object], depth: int) -> dict | None:
    # The commit is nearly always among the newest few; each history entry is a log file to read.
    # Read from the log in this process: a few milliseconds, where DESCRIBE HISTORY takes a query.
    for window in sorted({min(RECENT_COMMITS, depth), depth}):
        history = lake_store.history(path, window)
        if history is None:
            return None
        for entry in history:
            if not entry.get("userMetadata"):
                continue
            try:
                meta = json.loads(entry["userMetadata"])
            except ValueError:
                continue
            if isinstance(meta, dict) and all(meta.get(k) == v for k, v in metadata.items()):
                return {"version": entry["version"], "metrics": dict(entry.get("operationMetrics") or {}),
                        "user_metadata": entry["userMetadata"]}
        if len(history) < window:  # the whole history was read
            break
    return None

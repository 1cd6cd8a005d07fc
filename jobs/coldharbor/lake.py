"""Delta Lake I/O of the export: the writability probe, the idempotent append, commit lookup."""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence

from pyspark.sql import DataFrame, SparkSession

from coldharbor.errors import LakeUnavailableError

log = logging.getLogger(__name__)

# How far back in the Delta history to look for a batch's commit (compaction and cleanup commits
# can land between an export's commit and its lookup).
COMMIT_SEARCH_DEPTH = 200


def export_app_id(table_id: int) -> str:
    """Delta txnAppId of a table's export: with txnVersion=batch id, a replay is a no-op."""
    return f"coldharbor-export-{table_id}"


def ensure_writable(spark: SparkSession, path: str) -> None:
    """Creates the table folder if needed and proves a file can be written there."""
    jvm = spark.sparkContext._jvm
    hadoop_path = jvm.org.apache.hadoop.fs.Path(path)
    try:
        fs = hadoop_path.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration())
        fs.mkdirs(hadoop_path)
        probe = jvm.org.apache.hadoop.fs.Path(hadoop_path, "_coldharbor_write_probe")
        fs.create(probe, True).close()
        fs.delete(probe, False)
    except Exception as exc:  # py4j wraps every JVM error; the message is what matters
        raise LakeUnavailableError(f"cannot write the lake at {path}: {_jvm_message(exc)}") from exc


def append_batch(rows: DataFrame, path: str, *, app_id: str, batch_id: int,
                 partition_by: Sequence[str], metadata: Mapping[str, object]) -> None:
    """One Delta commit holding the batch; a second call with the same batch id changes nothing."""
    writer = (rows.write.format("delta").mode("append")
              .option("txnAppId", app_id)
              .option("txnVersion", batch_id)
              .option("userMetadata", json.dumps(dict(metadata), sort_keys=True)))
    if partition_by:
        writer = writer.partitionBy(*partition_by)
    try:
        writer.save(path)
    except Exception as exc:
        raise LakeUnavailableError(f"the Delta commit to {path} failed: {_jvm_message(exc)}") from exc


def find_batch_commit(spark: SparkSession, path: str, app_id: str, batch_id: int,
                      depth: int = COMMIT_SEARCH_DEPTH) -> int | None:
    """The Delta version whose commit metadata names this batch, or None if it never committed."""
    from delta.tables import DeltaTable

    if not DeltaTable.isDeltaTable(spark, path):
        return None
    history = DeltaTable.forPath(spark, path).history(depth).select("version", "userMetadata").collect()
    for entry in history:
        if not entry["userMetadata"]:
            continue
        try:
            meta = json.loads(entry["userMetadata"])
        except ValueError:
            continue
        if meta.get("app_id") == app_id and meta.get("batch_id") == batch_id:
            return entry["version"]
    return None


def _jvm_message(exc: Exception) -> str:
    text = str(exc).strip().splitlines()
    for line in text:  # the first JVM exception line names the cause
        if "Exception:" in line or "Error:" in line:
            return line.strip()[:500]
    return (text[0] if text else type(exc).__name__)[:500]

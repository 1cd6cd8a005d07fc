"""Reading a table's Delta table as every job does: a version pinned and read, its history, its
files (snapshots), and what a failure to reach it or a commit conflict is (`CONFLICTS`)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timezone

from delta.exceptions import (
    ConcurrentAppendException,
    ConcurrentDeleteDeleteException,
    ConcurrentDeleteReadException,
    ConcurrentTransactionException,
    ConcurrentWriteException,
    DeltaConcurrentModificationException,
    MetadataChangedException,
    ProtocolChangedException,
)
from pyspark.sql import DataFrame, SparkSession

from coldharbor.lake import lake_store
from coldharbor.lake.lake_rows import SETTLED, SettledSplit, column
from coldharbor.runtime.errors import ColdharborError, LakeUnavailableError, jvm_message

# Delta's commit conflicts, raised as these classes in-process (importing delta.exceptions converts
# the JVM's) and over Spark Connect (runtime.spark.connect_session registers the server's names).
CONFLICTS = (DeltaConcurrentModificationException, ConcurrentWriteException, MetadataChangedException,
             ProtocolChangedException, ConcurrentAppendException, ConcurrentDeleteReadException,
             ConcurrentDeleteDeleteException, ConcurrentTransactionException)


@contextmanager
def reaching(what: str, path: str) -> Iterator[None]:
    """A failure to reach the lake inside the block (an unreachable store, a lost folder: Spark
    relays every JVM error) becomes one LakeUnavailableError saying what failed where."""
    try:
        yield
    except ColdharborError:
        raise
    except Exception as exc:
        raise lake_error(f"{what} {path} failed", exc) from exc


def lake_error(what: str, exc: Exception) -> ColdharborError:
    """LakeUnavailableError, unless the operation failed because a lazy JDBC read of PostgreSQL it
    consumed lost the server, or the Spark Connect server itself was lost: then that, naming what
    was lost. A ColdharborError stays itself."""
    from coldharbor.runtime.pg import lost_postgres
    from coldharbor.runtime.spark_errors import lost_spark

    if isinstance(exc, ColdharborError):
        return exc
    return lost_postgres(exc) or lost_spark(exc) or LakeUnavailableError(f"{what}: {jvm_message(exc)}")


def history_of(spark: SparkSession, path: str, limit: int | None = None) -> DataFrame:
    """The table's Delta history, newest first (`limit` entries), as DESCRIBE HISTORY gives it. The
    path is a string literal, which Delta resolves itself: no path identifiers (runSQLOnFiles)."""
    return spark.sql(f"DESCRIBE HISTORY {path_literal(path)}" + (f" LIMIT {int(limit)}" if limit else ""))


def path_literal(path: str) -> str:
    """A lake path as a Spark SQL string literal."""
    return "'" + path.replace("\\", "\\\\").replace("'", "\\'") + "'"


def path_identifier(path: str) -> str:
    """A Delta table named by path where SQL takes only an identifier (ALTER TABLE, MERGE INTO):
    resolved only while spark.sql.runSQLOnFiles is on, which report sessions keep off."""
    return "delta.`" + path.replace("`", "``") + "`"


def pin_version(spark: SparkSession, path: str) -> int | None:
    """The table's current version (what a report will read AS OF), or None if there is no table yet."""
    return lake_store.version(path)


def commit_time(spark: SparkSession, path: str, version: int) -> datetime:
    """When a version was committed (UTC)."""
    # Epoch seconds: PySpark would hand timestamps back in the Python process's local zone.
    with reaching("reading the Delta history of", path):
        row = (history_of(spark, path).filter(column("version") == version)
               .select(column("timestamp").cast("double").alias("epoch")).first())
    if row is None:
        raise LakeUnavailableError(f"version {version} of {path} is not in its Delta history")
    return datetime.fromtimestamp(row["epoch"], timezone.utc)


def settled_split(path: str, version: int) -> SettledSplit | None:
    """How the rows of `version` divide between files with unsettled rows and files of settled rows
    only (`lake_rows.current_rows` plans by it); None when the Delta log has no statistics of it."""
    with reaching("reading the file statistics of", path):
        split = lake_store.settled_split(path, version, SETTLED)
    return None if split is None else SettledSplit(*split)


def read_version(spark: SparkSession, path: str, version: int) -> DataFrame:
    try:
        return spark.read.format("delta").option("versionAsOf", version).load(path)
    except Exception as exc:
        raise LakeUnavailableError(f"cannot read version {version} of the lake table at {path}: "
                                   f"{jvm_message(exc)}") from exc


def files_gone(exc: Exception) -> bool:
    """Whether a read failed because files of the version were removed (VACUUM, a lost folder)."""
    text = str(exc)
    return any(marker in text for marker in ("FileNotFoundException", "FILE_NOT_FOUND", "DELTA_FILE_NOT_FOUND",
                                             "VERSION_NOT_FOUND", "does not exist"))


@dataclass(frozen=True)
class LakeFile:
    """One live data file of a Delta snapshot, as its add action describes it."""

    path: str                         # relative to the table folder (or absolute)
    partition: tuple[tuple[str, str | None], ...]
    size: int
    records: int | None
    max_batch_id: int | None          # from the file's column statistics
    unsettled_rows: int | None = None  # its rows with a NULL _ch_settled (an export's), from the same

    @property
    def only_unsettled(self) -> bool:
        """Whether every row of the file is unsettled (an export's file, or a merge of them)."""
        return self.records is not None and self.unsettled_rows == self.records


@dataclass(frozen=True)
class LakeSnapshot:
    version: int
    files: tuple[LakeFile, ...]

    @property
    def bytes(self) -> int:
        return sum(f.size for f in self.files)


def snapshot(spark: SparkSession, path: str) -> LakeSnapshot | None:
    """The current version of a Delta table and its live files, or None if there is no table.

    Read from the Delta log (Spark's SQL has no per-file listing); the statistics give each file's
    largest batch id without opening it.
    """
    found = lake_store.live_files(path)
    if found is None:
        return None
    version, files = found
    return LakeSnapshot(version=version, files=tuple(
        LakeFile(path=f["path"], partition=tuple(sorted(f["partition"].items())), size=f["size"],
                 records=f["records"], max_batch_id=f["max_batch_id"], unsettled_rows=f["unsettled_rows"])
        for f in files))

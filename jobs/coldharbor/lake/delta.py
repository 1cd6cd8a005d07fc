"""Delta Lake I/O of every job: the writability probe, the idempotent append, commit lookup, conflicts, snapshots."""

from __future__ import annotations

import json
import logging
import shlex
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timezone

from delta.connect import exceptions as _connect_conflicts  # noqa: F401 (registers the classes below over Connect)
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
from pyspark.sql.types import StructType

from coldharbor.lake import lake_store
from coldharbor.lake.lake_rows import BATCH_ID, CHANGED_AT, METADATA_COLUMNS, SEQ, SETTLED, SettledSplit, column, quoted
from coldharbor.runtime import spark as spark_sessions
from coldharbor.runtime.errors import ColdharborError, ConfigError, LakeUnavailableError, jvm_message

log = logging.getLogger(__name__)

# Delta's commit conflicts, raised as these classes in-process (importing delta.exceptions converts
# the JVM's) and over Spark Connect (delta.connect.exceptions maps the server's class names).
CONFLICTS = (DeltaConcurrentModificationException, ConcurrentWriteException, MetadataChangedException,
             ProtocolChangedException, ConcurrentAppendException, ConcurrentDeleteReadException,
             ConcurrentDeleteDeleteException, ConcurrentTransactionException)

# How far back in the Delta history to look for a batch's commit (compaction and cleanup commits
# can land between an export's commit and its lookup).
COMMIT_SEARCH_DEPTH = 200
RECENT_COMMITS = 5


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
    from coldharbor.runtime.spark import lost_spark

    if isinstance(exc, ColdharborError):
        return exc
    return lost_postgres(exc) or lost_spark(exc) or LakeUnavailableError(f"{what}: {jvm_message(exc)}")


def export_app_id(table_id: int) -> str:
    """Delta txnAppId of a table's export: with txnVersion=batch id, a replay is a no-op."""
    return f"coldharbor-export-{table_id}"


# A file the export writes and removes to prove the lake is writable; hidden from VACUUM by its
# leading underscore, so cleanup removes the ones killed exports left.
WRITE_PROBE = "_coldharbor_write_probe"


def ensure_writable(spark: SparkSession, path: str) -> None:
    """Creates the table folder if needed and proves a file can be written there, under its own
    name by Spark too."""
    spark_sessions.require_utf8_file_names(spark, path)
    try:
        lake_store.probe_writable(path, WRITE_PROBE)
    except LakeUnavailableError as exc:
        raise LakeUnavailableError(f"cannot write the lake at {path}: {lake_store.message(exc.__cause__ or exc)}"
                                   ) from exc


def append_batch(rows: DataFrame, path: str, *, app_id: str, batch_id: int,
                 partition_by: Sequence[str], metadata: Mapping[str, object], add_columns: bool = False,
                 stats_columns: Sequence[str] = (), replace: bool = False) -> None:
    """One Delta commit holding the batch; a second call with the same batch id changes nothing.

    With `add_columns` the commit also adds the columns the rows have and the table lacks. A commit
    that creates the table limits its file statistics to `stats_columns` when some are given. With
    `replace` the commit holds the batch alone, with its columns and partitioning (the earlier
    versions stay in the history until cleanup).
    """
    writer = (rows.write.format("delta").mode("overwrite" if replace else "append")
              .option("overwriteSchema", str(replace).lower())
              .option("mergeSchema", str(add_columns and not replace).lower())
              .option("txnAppId", app_id)
              .option("txnVersion", batch_id)
              .option("userMetadata", json.dumps(dict(metadata), sort_keys=True)))
    exists = lake_store.is_delta_table(path)
    wanted = None
    if stats_columns and (replace or not exists):
        types = {f.name: f.dataType.typeName() for f in rows.schema.fields}
        skippable = [c for c in stats_columns if types.get(c) not in NO_STATISTICS_TYPES]
        wanted = stats_property(skippable, partition_by)
        writer = writer.option(STATS_COLUMNS_PROPERTY, wanted)
    if replace and exists:
        # The table's statistics columns name its old columns, which Delta checks the new schema
        # against; the replacing commit's own are set after it (a writer option applies at creation).
        set_table_property(rows.sparkSession, path, STATS_COLUMNS_PROPERTY, None)
    _save(writer, path, partition_by, "the Delta commit to")
    if replace and exists and wanted:
        set_table_property(rows.sparkSession, path, STATS_COLUMNS_PROPERTY, wanted)


def set_table_property(spark: SparkSession, path: str, name: str, value: str | None) -> None:
    """Sets (None: unsets) a property of the Delta table at `path`. ALTER TABLE names a table by path
    only as an identifier: the jobs that write the lake (export, maintenance) run no report SQL, so
    path identifiers may be on for this statement."""
    from coldharbor.runtime.spark import temporary_conf

    change = (f"UNSET TBLPROPERTIES IF EXISTS ('{name}')" if value is None
              else "SET TBLPROPERTIES ('" + name + "' = '" + value.replace("\\", "\\\\").replace("'", "\\'") + "')")
    with temporary_conf(spark, {"spark.sql.runSQLOnFiles": "true"}):
        spark.sql(f"ALTER TABLE {path_identifier(path)} {change}")


# Delta computes min/max/null statistics of the first 32 columns of every file it writes, which is
# a third of the export's write time. The lake's readers only skip files by key (a report's key
# filter passes the last-write-wins window), by sort columns (what compaction clusters by) and by
# the metadata below (compaction's batch ids, as-of reports' change times, the current read's split
# of settled and fresh rows); a table created by the export keeps statistics of just those.
STATS_COLUMNS_PROPERTY = "delta.dataSkippingStatsColumns"
STATS_METADATA_COLUMNS = (SEQ, CHANGED_AT, BATCH_ID, SETTLED)
# Delta refuses to collect statistics of these (DELTA_COLUMN_DATA_SKIPPING_NOT_SUPPORTED_TYPE): a
# bytea or boolean key column gets none.
NO_STATISTICS_TYPES = frozenset({"binary", "boolean"})


def collect_statistics_of(spark: SparkSession, path: str, name: str) -> None:
    """Adds `name` to the table's statistics columns when it has a list without it (a table created
    before the column was): files written from now on carry its statistics."""
    wanted = lake_store.table_property(path, STATS_COLUMNS_PROPERTY)
    if wanted is None or name in stats_property_columns(wanted):
        return
    set_table_property(spark, path, STATS_COLUMNS_PROPERTY, f"{wanted},{quoted(name)}")


def stats_property_columns(value: str) -> list[str]:
    """The column names a statistics-columns property lists: comma-separated, each bare or in
    backticks (a backtick inside doubled), spaces around them ignored."""
    names, current, quoted_part, i = [], "", False, 0
    while i < len(value):
        char = value[i]
        if char == "`":
            if quoted_part and value[i + 1:i + 2] == "`":
                current += "`"
                i += 1
            else:
                quoted_part = not quoted_part
        elif char == "," and not quoted_part:
            names.append(current.strip())
            current = ""
        else:
            current += char
        i += 1
    names.append(current.strip())
    return [n for n in names if n]


def stats_property(columns: Sequence[str], partition_by: Sequence[str]) -> str:
    """The property's value: each column once, quoted, in order; partition columns have none."""
    wanted = [c for c in dict.fromkeys([*columns, *STATS_METADATA_COLUMNS]) if c not in partition_by]
    return ",".join(quoted(c) for c in wanted)


def _save(writer, path: str, partition_by: Sequence[str], what: str) -> None:
    if partition_by:
        writer = writer.partitionBy(*partition_by)
    try:
        writer.save(path)
    except Exception as exc:
        raise lake_error(f"{what} {path} failed", exc) from exc


@dataclass(frozen=True)
class SchemaChange:
    added: tuple[str, ...]     # in PostgreSQL, not yet in the lake: added by the next commit
    dropped: tuple[str, ...]   # in the lake, gone from PostgreSQL: kept, NULL in new rows
    metadata_added: tuple[str, ...] = ()  # Coldharbor metadata columns newer than the lake table
    widened: tuple[tuple[str, str], ...] = ()  # (column, wider type): the lake table is rewritten first


# Type changes every value survives, as (lake type, new type) simple strings. An entity attribute
# that goes from integer to number is bigint -> double (exact up to 2^53, as JSON numbers are).
SAFE_WIDENINGS = frozenset({
    ("smallint", "int"), ("smallint", "bigint"), ("smallint", "double"), ("int", "bigint"), ("int", "double"),
    ("bigint", "double"), ("float", "double"),
})


def schema_change(spark: SparkSession, path: str, wanted: StructType, table: str) -> SchemaChange:
    """How the lake table's columns differ from the rows about to be written.

    A column whose type changed cannot be written, unless the change is a safe widening: then the
    change lists it and the export rewrites the table first (`widen_columns`). Any other type
    change is a ConfigError naming the column, before anything is written.
    """
    with reaching("reading the schema of", path):
        if not lake_store.is_delta_table(path):
            return SchemaChange((), ())
        current = {f.name: f.dataType for f in spark.read.format("delta").load(path).schema.fields}
    by_fold = {n.lower(): n for n in current}
    clash = next((f.name for f in wanted.fields if f.name not in current and f.name.lower() in by_fold), None)
    if clash is not None:
        # Spark matches names ignoring case: the new column's values would land in the old one.
        raise ConfigError(f"cannot export {table}: its column {clash} differs only in case from the lake table's "
                          f"column {by_fold[clash.lower()]} (a dropped column's, or one renamed since), which the lake "
                          f"would write its values into; rename it in PostgreSQL to a name the lake table has not "
                          f"used; nothing was exported")
    changed = [(f.name, current[f.name], f.dataType) for f in wanted.fields
               if f.name in current and current[f.name] != f.dataType]
    unsafe = [c for c in changed if (c[1].simpleString(), c[2].simpleString()) not in SAFE_WIDENINGS]
    if unsafe:
        name, old, new = unsafe[0]
        raise ConfigError(f"cannot export {table}: column {name}'s type changed: its values now need the lake "
                          f"(Spark SQL) type {new.simpleString()}, but the lake table at {path} holds it as "
                          f"{old.simpleString()}; a type change is not carried over "
                          "unless it widens safely (change the column back, or move the lake table aside and "
                          f"write it whole again with `jobs/resync.py --table {shlex.quote(table)}`); nothing was exported")
    names = {f.name for f in wanted.fields}
    return SchemaChange(tuple(f.name for f in wanted.fields if f.name not in current),
                        tuple(n for n in current if n not in names and n not in METADATA_COLUMNS),
                        tuple(n for n in METADATA_COLUMNS if n not in current),
                        tuple((name, new.simpleString()) for name, _, new in changed))


def widen_columns(spark: SparkSession, path: str, widened: Sequence[tuple[str, str]],
                  partition_by: Sequence[str], metadata: Mapping[str, object]) -> None:
    """Rewrites the table with the widened column types, every row and version kept, in one
    commit. Delta has no in-place long -> double widening; older versions keep their files, so
    reports pinned before the rewrite still read them (and cast them to the new type)."""
    types = dict(widened)
    rows = spark.read.format("delta").load(path)
    rows = rows.select(*[column(c).cast(types[c]).alias(c) if c in types else column(c) for c in rows.columns])
    writer = (rows.write.format("delta").mode("overwrite").option("overwriteSchema", "true")
              .option("userMetadata", json.dumps(dict(metadata), sort_keys=True)))
    _save(writer, path, partition_by, "widening the columns of")


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

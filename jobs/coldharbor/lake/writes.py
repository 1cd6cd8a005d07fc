"""Writes to a table's Delta table: the writability probe, the idempotent append of a batch
(txnAppId/txnVersion, invariant 4), the file statistics it keeps, and the schema changes a
batch may bring (columns added, widened).
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.types import StructType

from coldharbor.lake import lake_store
from coldharbor.lake.delta import lake_error, path_identifier, reaching
from coldharbor.lake.lake_rows import BATCH_ID, CHANGED_AT, METADATA_COLUMNS, SEQ, SETTLED, column, quoted
from coldharbor.runtime.errors import ConfigError, LakeUnavailableError
from coldharbor.runtime.jvm_locale import require_utf8_file_names

# A file the export writes and removes to prove the lake is writable; hidden from VACUUM by its
# leading underscore, so cleanup removes the ones killed exports left.
WRITE_PROBE = "_coldharbor_write_probe"


def ensure_writable(spark: SparkSession, path: str) -> None:
    """Creates the table folder if needed and proves a file can be written there, under its own
    name by Spark too."""
    require_utf8_file_names(spark, path)
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

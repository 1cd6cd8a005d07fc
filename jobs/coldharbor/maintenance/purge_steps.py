"""The purge's steps on keys and on the lake: keys of both tiers as equal Python values, the
PostgreSQL queries of a set of keys (which rows it still holds, their change_log rows), the one
Delta MERGE that deletes the purged keys' versions and every other matching one, and the check
that no purged row remains in PostgreSQL, the change log, the lake or any data file kept."""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from datetime import datetime, timezone

import psycopg
from psycopg import sql
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from coldharbor.capture import registry
from coldharbor.capture.registry import LakeColumn, RegisteredTable
from coldharbor.export import image_sql
from coldharbor.lake import commits, delta, lake_store
from coldharbor.lake.lake_rows import DELETED, SETTLED, column, quoted
from coldharbor.maintenance.purge_predicate import Predicate
from coldharbor.runtime.errors import LakeUnavailableError
from coldharbor.runtime.spark import temporary_conf


def key_rows(keys: list[LakeColumn], values: set[tuple]) -> tuple[sql.Composable, list[list]]:
    """A query of `values` (keys as the lake holds them) as rows u(key columns) of their PostgreSQL
    types, and its parameters."""
    query = sql.SQL("SELECT * FROM unnest({arrays}) AS u({names})").format(
        arrays=sql.SQL(", ").join(sql.SQL("%s::{}[]").format(sql.SQL(c.pg_type)) for c in keys),
        names=sql.SQL(", ").join(sql.Identifier(c.name) for c in keys))
    return query, [[key[i] for key in values] for i in range(len(keys))]


def current_keys(conn: psycopg.Connection, table: RegisteredTable, keys: list[LakeColumn],
                  values: set[tuple]) -> set[tuple]:
    """Those of `values` whose row PostgreSQL holds now (read in the purge's transaction)."""
    if not values:
        return set()
    rows, params = key_rows(keys, values)
    names = sql.SQL(", ").join(sql.Identifier(c.name) for c in keys)
    found = conn.execute(sql.SQL("SELECT {lake} FROM {table} WHERE ({names}) IN ({rows})").format(
        lake=sql.SQL(", ").join(as_lake_value(c) for c in keys), table=table.identifier, names=names, rows=rows),
        params).fetchall()
    return {lake_key(r) for r in found}


def change_log_of(conn: psycopg.Connection, table: RegisteredTable, keys: list[LakeColumn],
                   values: set[tuple]) -> tuple[sql.Composable, list]:
    """A condition on coldharbor.change_log selecting the rows of these keys, and its parameters.
    The keys are matched as capture logs them: coldharbor.key_sql() builds their canonical form."""
    rows, params = key_rows(keys, values)
    canonical_key = conn.execute("SELECT coldharbor.key_sql(%s, 'u')", (table.table_id,)).fetchone()[0]
    return sql.SQL("table_id = {} AND key IN (SELECT {} FROM ({}) u)").format(
        sql.Literal(table.table_id), sql.SQL(canonical_key), rows), params


def lake_key(values) -> tuple:
    """A key as one Python value whichever tier it came from: a timestamptz zone-aware in UTC (psycopg
    gives it in the session's zone, `spark_python.collected` in UTC; PySpark sends it back to Spark by
    its instant, whatever this process's zone); binary comes as bytearray or bytes. Keys of the two
    tiers are compared as sets, so they must be equal values, not merely equal instants."""
    def one(value):
        if isinstance(value, datetime) and value.tzinfo is not None:
            return value.astimezone(timezone.utc)
        if isinstance(value, (bytearray, memoryview)):
            return bytes(value)
        return value
    return tuple(one(v) for v in values)


def as_lake_value(column: LakeColumn) -> sql.Composable:
    """A key column as the lake holds it (uuid as text), so hot and lake keys compare equal."""
    if column.pg_type in image_sql.AS_TEXT:
        return sql.SQL("{}::text").format(sql.Identifier(column.name))
    return sql.Identifier(column.name)


def merge_delete(spark: SparkSession, path: str, schema, key_names: list[str], keys: list[tuple],
                  predicate: Predicate, run_id: str, partition_by: Sequence[str],
                  kept: Sequence[tuple] = ()) -> tuple[int, int]:
    """One Delta commit: every version of the purged keys, and every other matching live version.

    A `kept` key (its newest lake version matches, its current row in PostgreSQL does not) loses
    its matching versions only; when that took its settled row (`_ch_settled`), its other versions
    are ranked again (set NULL), so the current read finds its newest remaining version."""
    # The source's columns are named apart from the table's: the predicate names the table's
    # columns unqualified, and a matched clause sees both sides.
    key_schema = ", ".join(f"_ch_purge_k{i} {schema[k].dataType.simpleString()}" for i, k in enumerate(key_names))
    source = f"_ch_purge_keys_{uuid.uuid4().hex}"
    spark.createDataFrame([(*k, False) for k in keys] + [(*k, True) for k in kept],
                          f"{key_schema}, {KEPT} boolean").createOrReplaceTempView(source)
    unsettle = (f"WHEN MATCHED AND s.{KEPT} AND t.{quoted(SETTLED)} IS NOT NULL THEN UPDATE SET {quoted(SETTLED)} = NULL "
                if SETTLED in schema.fieldNames() else "")
    on = " AND ".join(f"t.{quoted(k)} <=> s._ch_purge_k{i}" for i, k in enumerate(key_names))
    metadata = json.dumps({"operation": "coldharbor-purge", "run_id": run_id, "predicate": predicate.text})
    # MERGE names its target by path only as an identifier: path identifiers are on for this
    # statement alone (a purge runs no report SQL).
    merge_conf = {"spark.databricks.delta.commitInfo.userMetadata": metadata, "spark.sql.runSQLOnFiles": "true"}
    if any("." in name or "`" in name for name in partition_by):
        # Delta's MERGE repartitions its output by the partition columns named as strings that it
        # parses (a '.' or a backtick fails the statement): such a table's purge writes without.
        merge_conf["spark.databricks.delta.merge.repartitionBeforeWrite.enabled"] = "false"
    try:
        with temporary_conf(spark, merge_conf):
            spark.sql(f"MERGE INTO {delta.path_identifier(path)} AS t USING {source} AS s ON {on} "
                      f"WHEN MATCHED AND NOT s.{KEPT} THEN DELETE "
                      f"WHEN MATCHED AND ({live_match(predicate)}) THEN DELETE "
                      f"{unsettle}"
                      f"WHEN NOT MATCHED BY SOURCE AND ({live_match(predicate)}) THEN DELETE").collect()
    finally:
        spark.catalog.dropTempView(source)
    entry = commits.find_commit_entry(spark, path, {"operation": "coldharbor-purge", "run_id": run_id})
    if entry is None:
        raise LakeUnavailableError(f"the purge commit of {path} is not in its Delta history")
    return int(entry["metrics"].get("numTargetRowsDeleted", 0)), entry["version"]


KEPT = "_ch_purge_kept"


def live_match(predicate: Predicate) -> str:
    """The predicate over lake rows: a delete marker holds no values (NULL columns), so it never
    matches; removing it (say for `col IS NULL`) would bring the key's older version back."""
    return f"NOT {quoted(DELETED)} AND ({predicate.spark})"


def verify(spark: SparkSession, conn: psycopg.Connection, table: RegisteredTable, path: str,
           key_columns: list[LakeColumn], keys: set[tuple], predicate: Predicate, has_lake: bool) -> dict[str, int]:
    """Counts of purged rows still present; all zero when the purge is complete. The change log is
    checked by key (its rows hold keys, no values to match)."""
    key_names = [c.name for c in key_columns]
    where, params = change_log_of(conn, table, key_columns, keys)
    with conn.transaction():
        registry.guard_read(conn, table)
        remaining = {
            "postgres_rows": conn.execute(sql.SQL("SELECT count(*) FROM {} WHERE {}").format(
                table.identifier, sql.SQL(predicate.postgres))).fetchone()[0],
            "change_log_rows": conn.execute(sql.SQL("SELECT count(*) FROM coldharbor.change_log WHERE {}").format(
                where), params).fetchone()[0],
        }
    if has_lake:
        def matches(rows: DataFrame) -> int:
            hit = F.expr(live_match(predicate))
            if keys:
                source = spark.createDataFrame(sorted(keys, key=repr), rows.select(*map(column, key_names)).schema)
                rows = rows.join(source.withColumn("_ch_purged", F.lit(True)), on=key_names, how="left")
                hit = hit | column("_ch_purged").isNotNull()
            return rows.filter(F.coalesce(hit, F.lit(False))).count()

        remaining["lake_current_rows"] = matches(spark.read.format("delta").load(path))
        files = lake_store.data_files(path)
        remaining["lake_rows_in_kept_files"] = matches(spark.read.option("mergeSchema", "true").parquet(*files)) \
            if files else 0
    return remaining

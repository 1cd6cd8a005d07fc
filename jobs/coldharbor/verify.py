"""verify: prove that a table's unified view equals PostgreSQL, at one snapshot, chunk by chunk.

The view is what every report reads (invariant 6): lake@V minus the dirty keys plus their hot
images. PostgreSQL is the whole table read in parallel through the same exported snapshot the
dirty set is read in. Both sides are cut into the same chunks -- key ranges of the first key column
when it is a number, date or timestamp (bounds from PostgreSQL's min and max, read through the
key's index), else hash buckets of the key -- and each chunk's row count and XOR of row hashes are
compared. Only when a chunk differs is it read again, to name sample keys and what is wrong.

Exit codes: 0 in sync, 1 differences found, 2 refused (unknown table, a tier unreachable, a value the
lake cannot hold exactly, see `lake_values`).
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import date, datetime, timezone
from decimal import Decimal

import psycopg
from psycopg import sql
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from coldharbor import (base_load, batches, hot_snapshot, lake, lake_values, maintenance_runs, pg, registry, settings,
                        table_reader)
from coldharbor.errors import ColdharborError, ConfigError, LakeUnavailableError
from coldharbor.job_main import one_table, run_job
from coldharbor.registry import LakeColumn, RegisteredTable
from coldharbor.unified import table_contract

log = logging.getLogger(__name__)

DEFAULT_CHUNKS = 16
SAMPLE_KEYS = 10
EXIT_DIFFERENT = 1
RANGE_TYPES = ("SHORT", "INT", "LONG", "FLOAT", "DOUBLE", "DATE", "TIMESTAMP", "TIMESTAMP_NTZ")
# Verify reads PostgreSQL through the export's JDBC reader: such a value would be converted the same
# way on both sides and compare equal however the lake holds it.
VERIFY_REFUSED = ("the table cannot be verified until the value is changed (a lake exported before such values were "
                  "refused may hold it moved or clamped); change it: the next export carries the change")


@dataclass(frozen=True)
class VerifyConfig:
    table: str
    lake_root: str
    chunks: int
    run_id: str


@dataclass(frozen=True)
class Chunk:
    chunk: int
    rows: int
    hash: int
    first_key: object
    last_key: object


@dataclass
class VerifyResult:
    table: str
    rows: int
    chunks: int
    lake_version: int | None
    differing: list[dict] = field(default_factory=list)   # per differing chunk: both sides' figures
    samples: list[dict] = field(default_factory=list)     # sample keys and what is wrong with each

    @property
    def in_sync(self) -> bool:
        return not self.differing

    def summary(self) -> str:
        if self.in_sync:
            return f"{self.table} in sync: {self.rows} rows in {self.chunks} chunks (lake version {self.lake_version})"
        ranges = "; ".join(f"chunk {d['chunk']} (keys {d['first_key']} .. {d['last_key']}): view {d['view_rows']} "
                           f"rows, PostgreSQL {d['pg_rows']} rows" for d in self.differing)
        samples = ", ".join(f"{s['key']} {s['problem']}" for s in self.samples)
        return (f"{self.table} NOT in sync at lake version {self.lake_version}: {len(self.differing)} of "
                f"{self.chunks} chunks differ: {ranges}; sample keys: {samples}")


def _projection(value: object) -> float:
    """A key value of a range type as a number, the way `_numeric` computes it in Spark."""
    if isinstance(value, datetime):
        aware = value if value.tzinfo else value.replace(tzinfo=timezone.utc)
        return (aware - datetime(1970, 1, 1, tzinfo=timezone.utc)).total_seconds() * 1_000_000
    if isinstance(value, date):
        return float((value - date(1970, 1, 1)).days)
    if isinstance(value, (int, float, Decimal)):
        return float(value)
    raise TypeError(f"no numeric projection for {type(value).__name__}")


def _numeric(column: LakeColumn) -> Column:
    col = F.col(column.name)
    if column.lake_type == "DATE":
        return F.unix_date(col).cast("double")
    if column.lake_type in ("TIMESTAMP", "TIMESTAMP_NTZ"):
        return F.unix_micros(col.cast("timestamp")).cast("double")
    return col.cast("double")


def chunk_expr(conn: psycopg.Connection, table: RegisteredTable, columns: Sequence[LakeColumn], chunks: int) -> Column:
    """The chunk of a row: a key range of the first key column where it is a number, date or
    timestamp; otherwise a hash bucket of the whole key."""
    keys = sorted((c for c in columns if c.is_key), key=lambda c: c.key_position)
    first = keys[0]
    if first.lake_type in RANGE_TYPES and table.source_kind != "entity":
        low, high = conn.execute(sql.SQL("SELECT min({k}), max({k}) FROM {t}").format(
            k=sql.Identifier(first.name), t=table.identifier)).fetchone()
        if low is not None:
            low, high = _projection(low), _projection(high)
            width = (high - low) / chunks or 1.0
            bucket = F.floor((_numeric(first) - F.lit(low)) / F.lit(width)).cast("int")
            return F.least(F.greatest(bucket, F.lit(0)), F.lit(chunks - 1))
    return F.pmod(F.xxhash64(*[F.col(k.name) for k in keys]), F.lit(chunks)).cast("int")


def hashed(rows: DataFrame, columns: Sequence[LakeColumn], chunk: Column) -> DataFrame:
    """keys, chunk and a hash of the whole row (the table contract's types on both sides)."""
    keys = [c.name for c in columns if c.is_key]
    typed = rows.transform(table_contract(columns))
    return typed.select(*keys, chunk.alias("_ch_chunk"),
                        F.xxhash64(*[F.col(c.name) for c in columns]).alias("_ch_hash"))


def chunk_figures(rows: DataFrame, first_key: str) -> dict[int, Chunk]:
    found = rows.groupBy("_ch_chunk").agg(F.count(F.lit(1)).alias("rows"), F.bit_xor("_ch_hash").alias("hash"),
                                          F.min(first_key).alias("first"), F.max(first_key).alias("last")).collect()
    return {r["_ch_chunk"]: Chunk(r["_ch_chunk"], r["rows"], r["hash"], r["first"], r["last"]) for r in found}


def sample_differences(view: DataFrame, postgres: DataFrame, keys: Sequence[str], bad: Sequence[int]) -> list[dict]:
    """Up to SAMPLE_KEYS keys of the differing chunks, each with what is wrong with it."""
    left = view.filter(F.col("_ch_chunk").isin(list(bad))).withColumnRenamed("_ch_hash", "_ch_view")
    right = postgres.filter(F.col("_ch_chunk").isin(list(bad))).select(*keys, F.col("_ch_hash").alias("_ch_pg"))
    diff = (left.join(right, on=keys, how="full_outer")
            .filter(~F.col("_ch_view").eqNullSafe(F.col("_ch_pg"))).limit(SAMPLE_KEYS).collect())
    samples = []
    for row in diff:
        if row["_ch_view"] is None:
            problem = "is in PostgreSQL but missing from the lake view"
        elif row["_ch_pg"] is None:
            problem = "is in the lake view but not in PostgreSQL"
        else:
            problem = "has different values in the lake view and in PostgreSQL"
        samples.append({"key": "(" + ", ".join(f"{k}={row[k]!r}" for k in keys) + ")", "problem": problem})
    return samples


def verify_table(spark: SparkSession, conn: psycopg.Connection, jdbc: pg.JdbcTarget, table: RegisteredTable,
                 config: VerifyConfig) -> VerifyResult:
    from coldharbor.serve import table_view

    state = base_load.load_state(conn, table.table_id)
    if state.rebase_pending:
        raise ConfigError(f"{table.qualified_name} cannot be verified yet: its lake rows are being rebuilt from "
                          f"PostgreSQL ({state.rebase_reason}); the next export writes the new base")
    if state.pending:
        raise ConfigError(f"{table.qualified_name} cannot be verified yet: its initial load has not landed "
                          "(the next export writes it)")
    registry.require_privileges(conn, table)
    columns = registry.lake_columns(conn, table)
    keys = [c.name for c in sorted((c for c in columns if c.is_key), key=lambda c: c.key_position)]
    path = table.lake_path(config.lake_root)
    version = lake.pin_version(spark, path)
    refuse_if_lake_ahead(spark, conn, table, path)
    with conn.transaction():
        # One snapshot: the dirty set and the whole-table read both come from it.
        conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        registry.guard_read(conn, table)  # before the snapshot
        snapshot = table_reader.export_snapshot(conn, table)
        lake_values.refuse_in_table(conn, table, columns, VERIFY_REFUSED)  # before any reader converts one
        hot = hot_snapshot.read_in_transaction(conn, {table.table_id: version}, [table]).tables[table.table_id]
        chunk = chunk_expr(conn, table, columns, config.chunks)
        current = table_reader.read_table(spark, conn, jdbc, snapshot, table, columns)
        view = table_view(spark, hot, version, config.lake_root, None)
        if table.hot_retention is not None:
            # Evicted rows are in the lake alone by design: compare the keys PostgreSQL holds.
            view = view.join(current.select(*keys), on=keys, how="left_semi")
        view, postgres = hashed(view, columns, chunk), hashed(current, columns, chunk)
        try:
            view_chunks, pg_chunks = chunk_figures(view, keys[0]), chunk_figures(postgres, keys[0])
        except Exception as exc:
            if lake.files_gone(exc):
                raise LakeUnavailableError(f"files of lake version {version} of {table.qualified_name} are gone: "
                                           f"{lake.jvm_message(exc)}") from exc
            raise
        result = VerifyResult(table.qualified_name, sum(c.rows for c in pg_chunks.values()), config.chunks, version)
        for i in sorted(set(view_chunks) | set(pg_chunks)):
            mine, theirs = view_chunks.get(i), pg_chunks.get(i)
            if mine is None or theirs is None or (mine.rows, mine.hash) != (theirs.rows, theirs.hash):
                bounds = [c for c in (mine, theirs) if c is not None]
                result.differing.append({
                    "chunk": i, "view_rows": mine.rows if mine else 0, "pg_rows": theirs.rows if theirs else 0,
                    "first_key": min(c.first_key for c in bounds), "last_key": max(c.last_key for c in bounds)})
        if result.differing:
            result.samples = sample_differences(view, postgres, keys, [d["chunk"] for d in result.differing])
    return result


class LakeAheadOfPostgresError(ColdharborError):
    """The lake holds batches PostgreSQL never recorded (it was restored from a backup): the lake is
    not PostgreSQL's past, and comparing the two would only list the restore's differences."""


def refuse_if_lake_ahead(spark: SparkSession, conn: psycopg.Connection, table: RegisteredTable, path: str) -> None:
    """LakeAheadOfPostgresError, naming the way out, when the lake committed a batch id PostgreSQL
    has not used (`lake.check_batch_id`; the lake's figure is read first, as the export reads it)."""
    lake_batch_id = lake.committed_txn_version(spark, path, lake.export_app_id(table.table_id))
    try:
        lake.check_batch_id(lake_batch_id, batches.next_batch_id(conn, table.table_id), table.qualified_name)
    except lake.LakeAheadError as exc:
        raise LakeAheadOfPostgresError(
            f"{table.quoted_name} cannot be verified: the lake is ahead of PostgreSQL (restored from a backup?): "
            f"{exc.detail}, so the lake's later commits are not PostgreSQL's past; rebuild the table's lake state "
            f"from PostgreSQL with `jobs/resync.py --table {table.cli_name}`, then verify again") from None


def parse_args(argv: list[str]) -> VerifyConfig:
    parser = argparse.ArgumentParser(
        prog="verify.py",
        description="Compare a registered table's unified view (lake minus dirty keys plus hot images) with "
                    "PostgreSQL at one snapshot, chunk by chunk. Exit 0 in sync, 1 differences found, 2 refused. "
                    f"PostgreSQL is reached through {settings.PG_DSN_ENV}.")
    parser.add_argument("--table", required=True, help="the registered table (schema.table)")
    parser.add_argument("--chunks", type=int, default=DEFAULT_CHUNKS, help=f"chunks to compare (default {DEFAULT_CHUNKS})")
    parser.add_argument("--lake-root", help=f"lake folder or URI (default: ${settings.LAKE_ROOT_ENV})")
    parser.add_argument("--run-id", help="identifier recorded in coldharbor.maintenance_runs (default: a new one)")
    args = parser.parse_args(argv)
    if not 1 <= args.chunks <= 100_000:
        parser.error(f"--chunks must be between 1 and 100000, got {args.chunks}")
    return VerifyConfig(args.table, settings.lake_root(args.lake_root), args.chunks,
                        args.run_id or maintenance_runs.new_run_id("verify"))


def main(argv: list[str]) -> int:
    def body() -> int:
        config = parse_args(argv)
        with one_table(config.table, "coldharbor-verify") as (spark, conn, jdbc, table):
            with maintenance_runs.recorded(conn, config.run_id, table.table_id, "verify"):
                result = verify_table(spark, conn, jdbc, table, config)
            detail = {"result": "in sync" if result.in_sync else "differences", "rows": result.rows,
                      "chunks": result.chunks, "differing": result.differing, "samples": result.samples}
            maintenance_runs.finish(conn, config.run_id, table.table_id, "verify",
                                    "succeeded" if result.in_sync else "failed", detail, result.lake_version,
                                    None if result.in_sync else result.summary()[:2000])
        print(result.summary(), flush=True)
        return 0 if result.in_sync else EXIT_DIFFERENT

    return run_job("verify", body)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""One table's export, and several at once. Per table, under the table's export lock:
  1. finish a batch a previous run left between Delta commit and mark (or abandon it);
  2. read the dirty keys' current images and record the batch's change ids (intent) in one snapshot;
  3. append the rows in one idempotent Delta commit;
  4. mark exactly those change ids flushed, with the Delta version.
A table refused for a reason of its own is a `failed` result; the cycle around it (which tables,
when Spark starts, the health samples, lake-first removal) is `export_job`'s."""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from dataclasses import dataclass
from datetime import datetime, timezone

import psycopg
from pyspark.sql import SparkSession

from coldharbor.capture import registry
from coldharbor.capture.registry import LakeColumn, RegisteredTable
from coldharbor.export import base_load, base_state, batches, hot_reader
from coldharbor.export import workers as export_workers
from coldharbor.export.recovery import recover_pending, refuse_if_lake_ahead, refuse_if_lake_gone
from coldharbor.lake import commits, writes
from coldharbor.lake.lake_rows import to_lake_rows
from coldharbor.lake.unified import table_contract
from coldharbor.runtime import faults, pg
from coldharbor.runtime.errors import ColdharborError, LakeUnavailableError

log = logging.getLogger(__name__)


# A base (an initial load, a rebase) reads a whole table with every reader but one core
# (`spark_parallelism.base_parallelism`); the workers of a cycle take turns at it rather than multiply that.
BASE_LOAD_TURN = threading.Lock()


@dataclass(frozen=True)
class ExportConfig:
    table: str | None   # schema.table, or None for every registered table
    lake_root: str
    run_id: str


@dataclass(frozen=True)
class TableResult:
    table: str
    status: str          # exported | loaded | clean | skipped | failed
    batch_id: int | None = None
    rows: int = 0
    changes: int = 0
    lake_version: int | None = None
    recovered_batches: int = 0
    loaded_rows: int = 0     # rows of an initial load this run wrote first
    error: str | None = None  # failed: why, one line; nothing of the table was marked or recorded
    seconds: float = 0.0     # how long the table's export took


def export_tables(spark: SparkSession, conn: psycopg.Connection, jdbc: pg.JdbcTarget, config: ExportConfig,
                  tables: list[RegisteredTable], hook: faults.Hook = faults.from_environment, *,
                  dsn: str | None = None, workers: int = 1) -> list[TableResult]:
    """Exports each table, the results in the tables' order. A table refused for a reason of its own
    (a ColdharborError: a privilege revoked, a column changed, a value the lake cannot hold) is a
    `failed` result and the others still export; its own transaction rolled back, so nothing of it
    was marked or recorded.

    With `workers` > 1 (and the `dsn` to open more connections with) that many tables export at
    once: each worker has a PostgreSQL connection and a Spark session of its own (the first worker
    `conn` and `spark`), and takes the next table when its last one is done. Every table is still
    one export of its own, under its own lock, so a crash anywhere leaves what a sequential run
    would. An unforeseen error stops the other workers after their current table and is raised."""
    workers = min(workers, len(tables)) if dsn is not None else 1

    def one(session: SparkSession, connection: psycopg.Connection, table: RegisteredTable) -> TableResult:
        return _export_or_refuse(session, connection, jdbc, table, config, hook)

    if workers <= 1:
        return [one(spark, conn, table) for table in tables]
    log.info("exporting %s tables, %s at once", len(tables), workers)
    return export_workers.in_parallel(spark, conn, dsn, tables, workers, one)


def _export_or_refuse(spark: SparkSession, conn: psycopg.Connection, jdbc: pg.JdbcTarget, table: RegisteredTable,
                      config: ExportConfig, hook: faults.Hook) -> TableResult:
    started = time.monotonic()
    try:
        result = export_table(spark, conn, jdbc, table, config, hook)
    except ColdharborError as exc:
        result = table_refused(table, exc)
    return dataclasses.replace(result, seconds=time.monotonic() - started)


def table_refused(table: RegisteredTable, exc: ColdharborError) -> TableResult:
    """A table refused for a reason of its own: a warning (the run ends with one error line)."""
    log.warning("%s not exported: %s", table.qualified_name, exc)
    return TableResult(table.qualified_name, "failed", error=str(exc))


def export_table(spark: SparkSession, conn: psycopg.Connection, jdbc: pg.JdbcTarget, table: RegisteredTable,
                 config: ExportConfig, hook: faults.Hook = faults.from_environment) -> TableResult:
    with pg.advisory_lock(conn, "export", table.table_id) as acquired:
        if not acquired:
            log.info("skipped %s: another export of this table holds its lock", table.qualified_name)
            return TableResult(table.qualified_name, "skipped")
        registry.require_privileges(conn, table)
        path = table.lake_path(config.lake_root)
        recovered = recover_pending(spark, conn, table, path)
        loaded = _write_pending_base(spark, conn, jdbc, table, path, config, hook)
        if not hot_reader.has_dirty(conn, table.table_id):
            log.info("%s: nothing dirty", table.qualified_name)
            return TableResult(table.qualified_name, "loaded" if loaded else "clean", recovered_batches=recovered,
                               loaded_rows=loaded.rows if loaded else 0)
        columns = registry.lake_columns(conn, table)
        change = _prepare_lake(spark, conn, table, path, columns)
        # One snapshot for the images and the batch's change ids (invariant 1): this transaction
        # exports it, the JDBC readers import it, and the intent is recorded in it and committed.
        with conn.transaction():
            conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
            registry.guard_read(conn, table)  # before the snapshot; held while the readers read
            snapshot_id = conn.execute("SELECT pg_export_snapshot()").fetchone()[0]
            images = hot_reader.read_dirty_images(spark, conn, jdbc, snapshot_id, table, columns)
            hook("after_read")
            batch = batches.begin(conn, table, config.run_id, images.count())
        hook("after_intent")

        exported_at = datetime.now(timezone.utc)
        app_id = commits.export_app_id(table.table_id)
        rows = images.transform(to_lake_rows(columns, batch.batch_id, exported_at))
        rows = faults.inside_tasks(rows, "during_write")
        with pg.lake_commit_lock(conn, table.table_id, path):
            if change.widened:
                writes.widen_columns(spark, path, change.widened, table.partition_by,
                                   {"operation": "coldharbor-widen", "run_id": config.run_id,
                                    "columns": dict(change.widened)})
            writes.append_batch(rows, path,
                              app_id=app_id, batch_id=batch.batch_id, partition_by=table.partition_by,
                              metadata={"app_id": app_id, "batch_id": batch.batch_id, "run_id": config.run_id,
                                        "table": table.qualified_name, "commit_token": batch.commit_token},
                              add_columns=bool(change.added or change.metadata_added),
                              stats_columns=[*table.key_columns, *table.sort_by])
        hook("after_commit")
        version = commits.find_batch_commit(spark, path, app_id, batch.batch_id, batch.commit_token, table.qualified_name)
        if version is None:
            raise LakeUnavailableError(f"batch {batch.batch_id} of {table.qualified_name} was written to {path} "
                                       "but its commit is not in the Delta history; nothing was marked")
        marked = batches.mark_flushed(conn, table.table_id, batch.batch_id, version, hook)
        hook("after_mark")
        _log_batch(table, batch, version, marked)
        return TableResult(table.qualified_name, "exported", batch.batch_id, batch.row_count, marked, version, recovered,
                           loaded.rows if loaded else 0)


def _write_pending_base(spark: SparkSession, conn: psycopg.Connection, jdbc: pg.JdbcTarget, table: RegisteredTable,
                        path: str, config: ExportConfig, hook: faults.Hook) -> base_load.BaseResult | None:
    """The table's initial load (or a rebase after DDL, sql/migrations/014), when one is pending: it
    lands before the next batch of changes (invariant 12). None when none was written."""
    state = base_state.load_state(conn, table.table_id)
    if not state.pending or base_load.settle_without_spark(conn, table):
        return None
    if state.rebase_pending:
        log.warning("%s: writing a new base from PostgreSQL: %s", table.qualified_name, state.rebase_reason)
    with BASE_LOAD_TURN:
        return base_load.write_base(spark, conn, jdbc, table, registry.lake_columns(conn, table), path,
                                    state.base_kind, config.run_id, hook, rebase=state.rebase_pending)


def _prepare_lake(spark: SparkSession, conn: psycopg.Connection, table: RegisteredTable, path: str,
                  columns: list[LakeColumn]) -> writes.SchemaChange:
    """Before a batch of changes is read: the lake table is there and writable, is this table's own,
    and does not hold the next batch id already; how its columns differ from PostgreSQL's (said in
    the log: the append adds or widens them)."""
    refuse_if_lake_gone(spark, conn, table, path)
    writes.ensure_writable(spark, path)
    change = writes.schema_change(spark, path, spark.range(0).transform(table_contract(columns)).schema,
                                table.qualified_name)
    if change.added or change.dropped:
        log.warning("%s: columns added in PostgreSQL: %s (the lake table gains them, NULL in older rows); "
                    "dropped: %s (the lake keeps them, NULL in new rows)", table.qualified_name,
                    ", ".join(change.added) or "none", ", ".join(change.dropped) or "none")
    if change.widened:
        log.warning("%s: column types widened in PostgreSQL: %s; the lake table is rewritten with them first",
                    table.qualified_name, ", ".join(f"{c} -> {t}" for c, t in change.widened))
    if change.metadata_added:
        log.info("%s: the lake table gains metadata column(s) %s (NULL in older rows)", table.qualified_name,
                 ", ".join(change.metadata_added))

    commits.require_own_lake(spark, path, commits.export_app_id(table.table_id), table.quoted_name)
    refuse_if_lake_ahead(spark, conn, table, path)
    return change


def _log_batch(table: RegisteredTable, batch: batches.Batch, version: int, marked: int) -> None:
    age_s = None
    if batch.oldest_change_at is not None:
        age_s = (datetime.now(timezone.utc) - batch.oldest_change_at).total_seconds()
    log.info("%s: exported batch %s: %s rows, %s changes marked flushed, Delta version %s, "
             "oldest change %.1fs old", table.qualified_name, batch.batch_id, batch.row_count, marked,
             version, age_s if age_s is not None else float("nan"))
    if marked != batch.change_count:
        log.warning("%s: batch %s held %s change ids but %s were still dirty to mark",
                    table.qualified_name, batch.batch_id, batch.change_count, marked)

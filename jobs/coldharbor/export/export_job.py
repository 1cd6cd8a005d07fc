"""CDC export: copy every dirty change of the registered tables into their Delta tables.

Per table, under the table's export lock:
  1. finish a batch a previous run left between Delta commit and mark (or abandon it);
  2. read the dirty keys' current images and record the batch's change ids (intent) in one snapshot;
  3. append the rows in one idempotent Delta commit;
  4. mark exactly those change ids flushed, with the Delta version.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import sys
import threading
import time
import uuid
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
from coldharbor.runtime import faults, pg, settings
from coldharbor.runtime import spark as spark_sessions
from coldharbor.runtime.errors import ColdharborError, LakeUnavailableError, one_line, raise_if_tables_failed
from coldharbor.runtime.job_main import run_job

log = logging.getLogger(__name__)


# A base (an initial load, a rebase) reads a whole table with every reader but one core
# (`spark.base_parallelism`); the workers of a cycle take turns at it rather than multiply that.
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


def parse_args(argv: list[str]) -> ExportConfig:
    parser = argparse.ArgumentParser(
        prog="cdc_export.py",
        description="Copy the dirty changes of registered PostgreSQL tables into Delta Lake and mark "
                    "exactly those changes flushed. PostgreSQL is reached through the "
                    f"{settings.PG_DSN_ENV} environment variable (libpq URL or key=value string).")
    parser.add_argument("--table", help="export only this registered table (schema.table); default: all")
    parser.add_argument("--lake-root", help=f"lake folder or URI for tables without their own location "
                                            f"(default: ${settings.LAKE_ROOT_ENV})")
    parser.add_argument("--run-id", help="identifier recorded with each batch (default: a new one)")
    args = parser.parse_args(argv)
    run_id = args.run_id or f"manual-{datetime.now(timezone.utc):%Y%m%dT%H%M%S}-{uuid.uuid4().hex[:8]}"
    return ExportConfig(table=args.table, lake_root=settings.lake_root(args.lake_root), run_id=run_id)


def needs_spark(conn: psycopg.Connection, table: RegisteredTable) -> bool:
    """Whether the table has dirty changes, an unfinished batch or an initial load to write; cheap
    probes. A pending load with nothing to read (an empty table) is settled here, without Spark.
    A ColdharborError (the job's role may not read a pending table) refuses this table alone."""
    if base_state.load_state(conn, table.table_id).pending:
        registry.require_privileges(conn, table)
        with pg.advisory_lock(conn, "export", table.table_id) as acquired:
            if not acquired or not base_load.settle_without_spark(conn, table):
                return True
    return hot_reader.has_dirty(conn, table.table_id) or bool(batches.pending(conn, table.table_id))


def run(spark: SparkSession, conn: psycopg.Connection, jdbc: pg.JdbcTarget, config: ExportConfig,
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
        result = _refused(table, exc)
    return dataclasses.replace(result, seconds=time.monotonic() - started)


def record_samples(conn: psycopg.Connection, tables: list[RegisteredTable], results: list[TableResult]) -> None:
    """One health sample per table the run handled (coldharbor.health_samples, for the health page):
    its outcome and figures, and its dirty backlog after it. One statement; a failure to write them
    is a warning, never the export's failure."""
    ids = {t.qualified_name: t.table_id for t in tables}
    handled = [r for r in results if r.table in ids]
    if not handled:
        return
    try:
        with conn.transaction():
            conn.execute("""
                INSERT INTO coldharbor.health_samples (table_id, export_status, export_rows, export_s, dirty_rows, lag_s)
                SELECT r.table_id, r.status, r.rows, r.seconds, d.n,
                       coalesce(extract(epoch FROM now() - d.oldest), 0)
                  FROM unnest(%s::int[], %s::text[], %s::bigint[], %s::float8[]) AS r(table_id, status, rows, seconds)
                 CROSS JOIN LATERAL (SELECT count(*) AS n, min(created_at) AS oldest FROM coldharbor.change_log c
                                      WHERE c.table_id = r.table_id AND c.flushed_at IS NULL) d""",
                         ([ids[r.table] for r in handled], [r.status for r in handled],
                          [r.rows + r.loaded_rows for r in handled], [r.seconds for r in handled]))
    except psycopg.Error as exc:
        log.warning("the health samples of this run were not written: %s", str(exc).strip().splitlines()[0])


def _refused(table: RegisteredTable, exc: ColdharborError) -> TableResult:
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
        loaded = None
        state = base_state.load_state(conn, table.table_id)
        if state.pending and not base_load.settle_without_spark(conn, table):
            # The initial load (or a rebase after DDL, sql/migrations/014) lands before the next batch of changes
            # (invariant 12).
            if state.rebase_pending:
                log.warning("%s: writing a new base from PostgreSQL: %s", table.qualified_name, state.rebase_reason)
            with BASE_LOAD_TURN:
                loaded = base_load.write_base(spark, conn, jdbc, table, registry.lake_columns(conn, table), path,
                                              state.base_kind, config.run_id, hook, rebase=state.rebase_pending)
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


def remove_landed(conn: psycopg.Connection, tables: list[RegisteredTable]) -> dict[str, str]:
    """After the exports: from each lake-first table (sql/migrations/027), every row the lake now holds leaves
    PostgreSQL (coldharbor.remove_landed; no change is logged). Its own transaction per table, after
    the table's batch was marked flushed; a removal refused (a foreign key now references the table,
    say) is that table's failure, returned as {table: why}, and the rows stay until a run can remove
    them."""
    failed = {}
    for table in tables:
        if table.mode != "lake_first":
            continue
        try:
            with conn.transaction():
                removed = conn.execute("SELECT coldharbor.remove_landed(%s)", (table.table_id,)).fetchone()[0]
        except psycopg.Error as exc:
            why = one_line(exc.diag.message_primary or str(exc).strip())
            log.warning("%s: its exported rows stay in PostgreSQL: %s", table.qualified_name, why)
            failed[table.qualified_name] = f"exported, but its rows in the lake could not leave PostgreSQL: {why}"
            continue
        if removed:
            log.info("%s: %s rows that are in the lake left PostgreSQL (lake-first)", table.qualified_name, removed)
    return failed


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


def main(argv: list[str]) -> int:
    def body() -> int:
        config = parse_args(argv)
        dsn = settings.pg_dsn()
        jdbc = pg.JdbcTarget.from_dsn(dsn)
        with pg.connect(dsn) as conn:
            tables = registry.load(conn, config.table)
            if config.table is not None:
                registry.require_present(tables)
            # Over every table, one gone or dropped and created again is named at the end; the
            # others still export.
            refused, usable = registry.left_out(tables)
            results = [TableResult(t.qualified_name, "failed", error=why) for t, why in refused]
            todo = []
            for table in usable:
                try:
                    if needs_spark(conn, table):
                        todo.append(table)
                except ColdharborError as exc:
                    results.append(_refused(table, exc))
            if not todo and not results:
                log.info("nothing dirty in %s registered table(s); no Spark session started", len(tables))
                raise_if_tables_failed([TableResult(name, "failed", error=why)
                                        for name, why in remove_landed(conn, usable).items()], "exported")
                return 0
            if len(todo) == 1 and not results:
                registry.require_privileges(conn, todo[0])  # refuse before Spark starts
            if todo:
                try:
                    spark = spark_sessions.get_session("coldharbor-cdc-export")
                    results += run(spark, conn, jdbc, config, todo, dsn=dsn, workers=export_workers.worker_count(spark, len(todo)))
                except Exception as exc:
                    # An unforeseen failure: the page must show these tables failing too (their outcome
                    # is not known table by table), then the job fails as before.
                    record_samples(conn, tables, results + [TableResult(t.qualified_name, "failed", error=str(exc))
                                                            for t in todo])
                    raise
            stuck = remove_landed(conn, usable)
            results = [dataclasses.replace(r, status="failed", error=stuck.pop(r.table)) if r.table in stuck else r
                       for r in results] + [TableResult(name, "failed", error=why) for name, why in stuck.items()]
            for result in results:
                log.info("result: %s", result)
            record_samples(conn, tables, results)
            raise_if_tables_failed(results, "exported")
        return 0

    return run_job("cdc_export", body)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

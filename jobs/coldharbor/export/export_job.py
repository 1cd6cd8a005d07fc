"""CDC export job: one cycle copies every dirty change of the registered tables into their Delta
tables. `table_export` exports each table (intent, idempotent append, mark, under the table's
lock); the cycle around it is here: which tables have anything to write (cheap probes, so a cycle
with nothing to do starts no JVM), several tables at once, the lake-first tables' landed rows
leaving PostgreSQL, one health sample per table, and one error line naming every failed table.
"""

from __future__ import annotations

import dataclasses
import logging
import sys
import uuid
from datetime import datetime, timezone

import psycopg
from pyspark.sql import SparkSession

from coldharbor.capture import registry
from coldharbor.capture.registry import RegisteredTable
from coldharbor.capture.table_job import jdbc_target
from coldharbor.export import base_load, base_state, batches, hot_reader
from coldharbor.export import workers as export_workers
from coldharbor.export.table_export import ExportConfig, TableResult, export_tables, table_refused
from coldharbor.runtime import faults, pg, settings
from coldharbor.runtime import spark as spark_sessions
from coldharbor.runtime.errors import ColdharborError, one_line, raise_if_tables_failed
from coldharbor.runtime.job_main import job_parser, run_job

log = logging.getLogger(__name__)


def parse_args(argv: list[str]) -> ExportConfig:
    parser = job_parser(
        "cdc_export.py",
        "Copy the dirty changes of registered PostgreSQL tables into Delta Lake and mark exactly those changes "
        f"flushed. PostgreSQL is reached through the {settings.PG_DSN_ENV} environment variable (libpq URL or "
        "key=value string).",
        table_help="export only this registered table (schema.table); default: all",
        lake_root_help=f"lake folder or URI for tables without their own location (default: ${settings.LAKE_ROOT_ENV})",
        run_id_help="identifier recorded with each batch (default: a new one)")
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


def run(spark: SparkSession | None, conn: psycopg.Connection, config: ExportConfig,
        hook: faults.Hook = faults.from_environment) -> int:
    """One export cycle over the table, or every registered one: exit 0, or 2 when a table failed
    (each named in one line at the end; the others still exported).

    :param spark: the session to export with, or None: one is started only when a table has
        something to write (dirty changes, an unfinished batch, an initial load); a cycle with
        nothing to do starts no JVM
    :param hook: fault points for tests (``faults.from_environment`` outside them)
    """
    dsn = settings.pg_dsn()
    jdbc = pg.JdbcTarget.from_dsn(dsn)  # a DSN Spark's JDBC readers cannot use is refused first
    tables = registry.load(conn, config.table)
    if config.table is not None:
        registry.require_present(tables)
    # Over every table, one gone or dropped and created again is named at the end; the others
    # still export.
    refused, usable = registry.left_out(tables)
    results = [TableResult(t.qualified_name, "failed", error=why) for t, why in refused]
    todo = []
    for table in usable:
        try:
            if needs_spark(conn, table):
                todo.append(table)
        except ColdharborError as exc:
            results.append(table_refused(table, exc))
    if not todo and not results:
        log.info("nothing dirty in %s registered table(s); no Spark session started", len(tables))
        raise_if_tables_failed([TableResult(name, "failed", error=why)
                                for name, why in remove_landed(conn, usable).items()], "exported")
        return 0
    if len(todo) == 1 and not results:
        registry.require_privileges(conn, todo[0])  # refuse before Spark starts
    if todo:
        try:
            spark = spark or spark_sessions.get_session("coldharbor-cdc-export")
            results += export_tables(spark, conn, jdbc, config, todo, hook, dsn=dsn,
                                     workers=export_workers.worker_count(spark, len(todo)))
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


def main(argv: list[str]) -> int:
    def body() -> int:
        config = parse_args(argv)
        jdbc_target()  # a DSN Spark's JDBC readers cannot use: refused before anything is read or started
        with pg.connect(settings.pg_dsn()) as conn:
            return run(None, conn, config)

    return run_job("cdc_export", body)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

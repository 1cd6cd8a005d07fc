"""Cleanup: the tombstones and leftovers the other jobs leave behind (invariants 8 and 10).

Per registered table, under its cleanup lock:
  1. evict from the hot tier the rows the lake holds and nobody changed for the table's hot
     retention (tiered tables only; nothing is logged: eviction is not deletion);
  2. VACUUM the Delta table: files no version inside the retention references, including the
     files of runs that were killed before their commit, go once older than the retention;
  3. prune change_log rows flushed before the retention, and batches finished before it
     (the newest flushed batch stays: it proves the table has reached the lake).
First, report runs that died without finishing (their lease is gone) are recorded as failed.
Then, once: expire old report_runs, prune health samples older than two days and drop report
staging tables that crashed runs left.

Everything is idempotent; with --dry-run it only lists what would go.
"""

from __future__ import annotations

import logging
import sys
from dataclasses import asdict, dataclass, field
from datetime import datetime, timedelta, timezone

import psycopg
from pyspark.sql import SparkSession

from coldharbor.capture import registry
from coldharbor.capture.registry import RegisteredTable
from coldharbor.lake import delta, lake_store, writes
from coldharbor.maintenance import maintenance_runs
from coldharbor.maintenance.pruning import (
    HEALTH_SAMPLES_KEPT,
    drop_stale_staging_tables,
    expire_report_runs,
    prune_change_log,
    prune_health_samples,
)
from coldharbor.runtime import faults, pg, settings
from coldharbor.runtime.errors import ColdharborError, ConfigError, raise_if_tables_failed
from coldharbor.runtime.job_main import job_parser, reason, run_job
from coldharbor.runtime.spark import temporary_conf
from coldharbor.serve import report_runs

log = logging.getLogger(__name__)

# Delta's own guard: VACUUM below this needs an explicit override (it breaks readers and time
# travel of versions younger than the retention).
DELTA_GUARD_HOURS = 168.0
# Files of our own that Delta's VACUUM never touches (their names start with '_' or '.').
OWN_LEFTOVERS = (writes.WRITE_PROBE,)
RETENTION_PROPERTY = "delta.deletedFileRetentionDuration"


def check_retention(retention: timedelta, allow_short: bool) -> None:
    """Delta's guard, enforced before anything runs: below it only with the explicit override."""
    hours = retention.total_seconds() / 3600
    if hours < 0:
        raise ConfigError(f"the retention must not be negative, got {hours:g} hours")
    if hours < DELTA_GUARD_HOURS and not allow_short:
        raise ConfigError(f"a retention of {hours:g} hours is below Delta's {DELTA_GUARD_HOURS:g}-hour guard: "
                          "reports and exports still reading older versions would lose their files; pass "
                          "--allow-short-retention to do it anyway")


@dataclass(frozen=True)
class CleanupConfig:
    table: str | None
    lake_root: str
    run_id: str
    retention: timedelta = timedelta(hours=DELTA_GUARD_HOURS)
    allow_short_retention: bool = False
    report_runs_retention: timedelta = timedelta(days=30)
    evict: bool = True
    dry_run: bool = False

    def __post_init__(self) -> None:
        check_retention(self.retention, self.allow_short_retention)
        if self.report_runs_retention <= timedelta(0):
            raise ConfigError("the report-run retention must be positive")


@dataclass
class TableCleanup:
    table: str
    status: str = "cleaned"       # cleaned | skipped | failed
    evicted_rows: int = 0
    vacuumed_files: list[str] = field(default_factory=list)
    leftovers_removed: list[str] = field(default_factory=list)
    change_log_pruned: int = 0
    batches_pruned: int = 0
    error: str | None = None      # why a table of a run over every table was not cleaned


def cleanup_table(spark: SparkSession, conn: psycopg.Connection, table: RegisteredTable,
                  config: CleanupConfig) -> TableCleanup:
    registry.require_present([table])
    with pg.advisory_lock(conn, "cleanup", table.table_id) as acquired:
        if not acquired:
            log.info("skipped %s: another cleanup of this table holds its lock", table.qualified_name)
            return TableCleanup(table.qualified_name, "skipped")
        registry.refuse_replaced(conn, table)
        if config.evict and table.hot_retention is not None:
            registry.require_privileges(conn, table, deletes=True)
        if not config.dry_run:
            maintenance_runs.start(conn, config.run_id, table.table_id, "cleanup")
        result = TableCleanup(table.qualified_name)
        try:
            path = table.lake_path(config.lake_root)  # a table with no folder of its own is refused before evicting
            result.evicted_rows = evict(conn, table, config.dry_run) if config.evict else 0
            with pg.lake_commit_lock(conn, table.table_id, path):
                result.vacuumed_files = vacuum(spark, path, config)
            result.leftovers_removed = remove_own_leftovers(spark, path, config)
            result.change_log_pruned, result.batches_pruned = prune_change_log(conn, table, config)
        except Exception as exc:
            if not config.dry_run:
                maintenance_runs.finish(conn, config.run_id, table.table_id, "cleanup", "failed",
                                        error=reason(exc))
            raise
        verb = "would remove" if config.dry_run else "removed"
        log.info("%s: %s %s hot rows (evicted), %s lake files, %s leftovers, %s change_log rows, %s batches",
                 table.qualified_name, verb, result.evicted_rows, len(result.vacuumed_files),
                 len(result.leftovers_removed), result.change_log_pruned, result.batches_pruned)
        for name in result.vacuumed_files + result.leftovers_removed:
            log.info("%s: %s %s", table.qualified_name, verb, name)
        if not config.dry_run:
            detail = asdict(result)
            detail["vacuumed_files"] = len(result.vacuumed_files)
            maintenance_runs.finish(conn, config.run_id, table.table_id, "cleanup", "succeeded", detail=detail,
                                    lake_version=delta.pin_version(spark, path))
        return result


def eviction_cutoff(conn: psycopg.Connection, table: RegisteredTable) -> datetime | None:
    """Rows changed and flushed before this can go: now minus the hot retention, and never after the
    start of a report still running (it may have pinned a lake version older than their flush)."""
    if table.hot_retention is None:
        return None
    return conn.execute("""SELECT least(now() - %s::interval,
                                        (SELECT min(started_at) FROM coldharbor.report_runs
                                          WHERE state = 'running'))""", (table.hot_retention,)).fetchone()[0]


def evict(conn: psycopg.Connection, table: RegisteredTable, dry_run: bool) -> int:
    """Evicts the table's old, flushed, unchanged rows (coldharbor.evict, one transaction).

    Tiered tables are for rows the application no longer changes, but a write racing the eviction
    must not vanish: coldharbor.evict() holds the table's eviction lock, which every UPDATE/DELETE
    statement on it takes shared (evict_guard), so a statement that ran while an eviction committed
    fails with SQLSTATE 40001 and the application retries; an UPDATE/DELETE of a key evicted before
    it started changes nothing (the row is in the lake only), an INSERT of it writes a new version.
    Eviction tries for a few seconds to get past writers' open transactions, else evicts nothing this run."""
    cutoff = eviction_cutoff(conn, table)
    if cutoff is None:
        return 0
    with conn.transaction():
        return conn.execute("SELECT coldharbor.evict(%s, %s, %s)", (table.table_id, cutoff, dry_run)).fetchone()[0]


def vacuum(spark: SparkSession, path: str, config: CleanupConfig) -> list[str]:
    """Delta VACUUM at the configured retention; returns the files removed (or, dry, that would be)."""
    return vacuum_files(spark, path, config.retention, dry_run=config.dry_run, align_untracked=True)


def vacuum_files(spark: SparkSession, path: str, retention: timedelta, *, dry_run: bool,
                 align_untracked: bool) -> list[str]:
    """VACUUM ... RETAIN; with `align_untracked` also files no version references (see below).

    A retention below the guard must have been allowed by the caller (an explicit override).
    """
    with delta.reaching("reading", path):
        if not lake_store.is_delta_table(path):
            return []
    hours = retention.total_seconds() / 3600
    values = {}
    if hours < DELTA_GUARD_HOURS:
        values["spark.databricks.delta.retentionDurationCheck.enabled"] = "false"
    try:
        with temporary_conf(spark, values):
            if align_untracked and not dry_run:
                _align_retention_property(spark, path, retention)
            vacuum_sql = f"VACUUM {delta.path_literal(path)} RETAIN {hours} HOURS"
            listed = [r[0] for r in spark.sql(f"{vacuum_sql} DRY RUN").collect()]
            if not dry_run and listed:
                with faults.kill_during("during_vacuum"):
                    spark.sql(vacuum_sql).collect()
        return listed
    except Exception as exc:
        raise delta.lake_error(f"VACUUM of {path} failed", exc) from exc


def _align_retention_property(spark: SparkSession, path: str, retention: timedelta) -> None:
    """VACUUM removes files no version references (those of killed writers) once they are older
    than the table's delta.deletedFileRetentionDuration, whatever RETAIN says: keep the property
    equal to the configured retention. A change is one metadata commit."""
    wanted = f"interval {int(retention.total_seconds())} seconds"
    current = spark.sql(f"DESCRIBE DETAIL {delta.path_literal(path)}").first()["properties"].get(RETENTION_PROPERTY)
    if current != wanted:
        writes.set_table_property(spark, path, RETENTION_PROPERTY, wanted)
        log.info("%s: %s set to %s (was %s)", path, RETENTION_PROPERTY, wanted, current or "the default")


def remove_own_leftovers(spark: SparkSession, path: str, config: CleanupConfig) -> list[str]:
    """Probe files of killed exports: hidden from VACUUM by their leading underscore."""
    cutoff = datetime.now(timezone.utc) - config.retention
    removed = [lake_store.remove_if_older(path, name, cutoff, config.dry_run) for name in OWN_LEFTOVERS]
    return [leftover for leftover in removed if leftover is not None]


def parse_args(argv: list[str]) -> CleanupConfig:
    parser = job_parser(
        "cleanup.py",
        "Evict cold rows from the hot tier, VACUUM the lake, prune the change log and expire old run records. "
        f"PostgreSQL is reached through {settings.PG_DSN_ENV}.",
        table_help="clean only this registered table (schema.table); default: all",
        run_id_help="identifier recorded with the run (default: a new one)")
    parser.add_argument("--retention-hours", type=float, default=DELTA_GUARD_HOURS,
                        help=f"keep lake files and flushed change_log rows this long (default {DELTA_GUARD_HOURS:g}; "
                             "it must exceed the longest report and export)")
    parser.add_argument("--allow-short-retention", action="store_true",
                        help=f"allow a retention below Delta's {DELTA_GUARD_HOURS:g}-hour guard")
    parser.add_argument("--report-runs-days", type=float, default=30.0,
                        help="expire report_runs rows finished longer ago than this (default 30)")
    parser.add_argument("--no-evict", action="store_true", help="leave the hot tier alone")
    parser.add_argument("--dry-run", action="store_true", help="list what would go; change nothing")
    args = parser.parse_args(argv)
    return CleanupConfig(table=args.table, lake_root=settings.lake_root(args.lake_root),
                         run_id=args.run_id or maintenance_runs.new_run_id("cleanup"),
                         retention=timedelta(hours=args.retention_hours),
                         allow_short_retention=args.allow_short_retention,
                         report_runs_retention=timedelta(days=args.report_runs_days),
                         evict=not args.no_evict, dry_run=args.dry_run)


def run(spark: SparkSession, conn: psycopg.Connection, config: CleanupConfig) -> int:
    """Cleans the table, or every registered one, and the report runs, health samples and staging
    tables they leave: exit 0, or 2 when a table failed (each named in one line at the end)."""
    results = cleanup_tables(spark, conn, config)
    for result in results:
        log.info("result: %s", result)
    raise_if_tables_failed(results, "cleaned")
    return 0


def cleanup_tables(spark: SparkSession, conn: psycopg.Connection, config: CleanupConfig) -> list[TableCleanup]:
    """What `run` does, each table's outcome returned (a failed table is a `failed` result)."""
    tables = registry.load(conn, config.table)  # main() refused a dropped one before Spark started
    # Dead report runs first: while one still looks 'running', eviction's cutoff and the staging
    # tables wait on it.
    for run_id in report_runs.expire_dead(conn, "cleanup", config.dry_run):
        log.info("%s report run %s: it died without finishing", "would expire" if config.dry_run else "expired",
                 run_id)
    results = [cleanup_one(spark, conn, t, config) for t in tables]
    if config.table is None:
        verb = "would expire" if config.dry_run else "expired"
        log.info("%s %s report runs", verb, expire_report_runs(conn, config))
        log.info("%s %s health samples older than %s", "would prune" if config.dry_run else "pruned",
                 prune_health_samples(conn, config.dry_run), HEALTH_SAMPLES_KEPT)
        for name in drop_stale_staging_tables(conn, config.dry_run):
            log.info("%s stale report staging table reports.%s", "would drop" if config.dry_run else "dropped", name)
    return results


def cleanup_one(spark: SparkSession, conn: psycopg.Connection, table: RegisteredTable,
                config: CleanupConfig) -> TableCleanup:
    """One table of the run. Over every table (the daily DAG), a table refused for a reason of its
    own (dropped, dropped and created again, a privilege revoked) is a `failed` result and the
    others are still cleaned: one team's dropped table must not stop everyone's VACUUM and eviction."""
    if config.table is not None:
        return cleanup_table(spark, conn, table, config)
    try:
        return cleanup_table(spark, conn, table, config)
    except ColdharborError as exc:
        log.warning("%s not cleaned: %s", table.qualified_name, exc)  # the run ends with one error line
        return TableCleanup(table.qualified_name, "failed", error=str(exc))


def main(argv: list[str]) -> int:
    def body() -> int:
        config = parse_args(argv)
        with pg.connect(settings.pg_dsn()) as conn:
            # An unknown table, or a registered one PostgreSQL lost, fails before Spark starts.
            tables = registry.load(conn, config.table)
            if config.table is not None:  # one table: refused before Spark starts
                registry.require_present(tables)
                if config.evict and tables[0].hot_retention is not None:
                    registry.require_privileges(conn, tables[0], deletes=True)
            from coldharbor.runtime.spark import get_session

            return run(get_session("coldharbor-cleanup"), conn, config)

    return run_job("cleanup", body)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""Purge: remove every row matching a predicate from PostgreSQL, the lake's live files, the lake's
old files and the change log, then verify that none remains anywhere the table keeps rows.

Under the table's export, compaction and cleanup locks (so no job writes it meanwhile):
  1. PostgreSQL, one transaction held open across step 2: delete the matching rows (capture off:
     the rows must not travel to the lake as changes) and collect their keys;
  2. lake, one MERGE commit: delete every version of those keys and of the keys whose latest lake
     version matches and that PostgreSQL no longer holds (rows evicted from the hot tier, deletes
     not yet exported), and every other version that matches;
  3. delete the change_log rows of those keys; commit PostgreSQL. A crash before this commit
     leaves rows in PostgreSQL that reports miss: rows being purged anyway, and a rerun finishes;
  4. VACUUM with the purge's own retention, so the files holding old versions go;
  5. verify: no matching row or purged key in the current version, in any data file left in the
     table's folder, in the table or in the change log.

The purge decides per key by its current row: a key whose newest lake version matches but whose
current PostgreSQL row does not (an update not yet exported) loses its matching lake versions only;
its row and its dirty change_log rows stay, so reports keep showing the current row.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import asdict, dataclass, field
from datetime import timedelta

import psycopg
from psycopg import sql
from pyspark.sql import SparkSession

from coldharbor.capture import registry
from coldharbor.capture.registry import LakeColumn, RegisteredTable
from coldharbor.export.recovery import recover_pending
from coldharbor.lake import delta, lake_values
from coldharbor.lake.lake_rows import DELETED, column, latest_per_key
from coldharbor.maintenance import maintenance_runs, purge_predicate
from coldharbor.maintenance.cleanup import DELTA_GUARD_HOURS, check_retention, vacuum_files
from coldharbor.maintenance.purge_predicate import Predicate
from coldharbor.maintenance.purge_steps import (
    as_lake_value,
    change_log_of,
    current_keys,
    lake_key,
    merge_delete,
    verify,
)
from coldharbor.runtime import pg, settings
from coldharbor.runtime.errors import TableBusyError
from coldharbor.runtime.job_main import EXIT_INCOMPLETE, job_parser, reason, run_job
from coldharbor.runtime.spark_python import collectable, collected

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PurgeConfig:
    table: str
    where: str
    lake_root: str
    run_id: str
    vacuum_retention: timedelta
    allow_short_retention: bool = False

    def __post_init__(self) -> None:
        check_retention(self.vacuum_retention, self.allow_short_retention)


@dataclass
class PurgeResult:
    table: str
    predicate: str
    hot_rows_deleted: int = 0
    keys_purged: int = 0
    keys_kept: int = 0       # newest lake version matched, current row does not: only matching versions went
    lake_rows_deleted: int = 0
    change_log_deleted: int = 0
    files_vacuumed: int = 0
    lake_version: int | None = None
    remaining: dict[str, int] = field(default_factory=dict)

    @property
    def complete(self) -> bool:
        return not any(self.remaining.values())


def purge(spark: SparkSession, conn: psycopg.Connection, table: RegisteredTable, config: PurgeConfig) -> PurgeResult:
    registry.require_privileges(conn, table, deletes=True)
    columns = registry.lake_columns(conn, table)
    predicate = purge_predicate.parse(config.where, columns)  # before any lock or change
    with ExitStack() as locks:
        for kind in ("export", "compact", "cleanup"):
            if not locks.enter_context(pg.advisory_lock(conn, kind, table.table_id)):
                raise TableBusyError(f"cannot purge {table.qualified_name} now: a {kind} run holds its lock; "
                                     "nothing was changed, try again when it has finished")
        # An export that died before its mark leaves a pending batch whose write may still be running
        # (a Spark Connect server finishes a dead client's write): settled first, it cannot land the
        # purged rows again after the purge.
        recover_pending(spark, conn, table, table.lake_path(config.lake_root))
        maintenance_runs.start(conn, config.run_id, table.table_id, "purge")
        try:
            result = _purge(spark, conn, table, columns, predicate, config)
        except Exception as exc:
            maintenance_runs.finish(conn, config.run_id, table.table_id, "purge", "failed", error=reason(exc))
            raise
        maintenance_runs.finish(conn, config.run_id, table.table_id, "purge",
                                "succeeded" if result.complete else "failed", detail=asdict(result),
                                lake_version=result.lake_version,
                                error=None if result.complete else f"rows remain: {result.remaining}")
        return result


def _purge(spark: SparkSession, conn: psycopg.Connection, table: RegisteredTable, columns: list[LakeColumn],
           predicate: Predicate, config: PurgeConfig) -> PurgeResult:
    keys = [c for c in sorted((c for c in columns if c.is_key), key=lambda c: c.key_position)]
    key_names = [c.name for c in keys]
    path = table.lake_path(config.lake_root)
    result = PurgeResult(table.qualified_name, predicate.text)
    has_lake = delta.pin_version(spark, path) is not None
    with conn.transaction():
        registry.guard_read(conn, table)
        hot_keys = _delete_hot_rows(conn, table, keys, predicate)
        result.hot_rows_deleted = len(hot_keys)
        all_keys = set(hot_keys)
        if has_lake:
            rows = delta.read_version(spark, path, delta.pin_version(spark, path))
            latest_match = (rows.transform(latest_per_key(key_names))
                            .filter(~column(DELETED)).filter(predicate.spark)
                            .select(*[collectable(column(c.name), c.lake_type).alias(c.name) for c in keys]))
            lake_matches = {lake_key([collected(v, c.lake_type) for v, c in zip(r, keys)])
                            for r in latest_match.collect()} - all_keys
            current = current_keys(conn, table, keys, lake_matches)
            result.keys_kept = len(current)
            all_keys |= lake_matches - current
            with pg.lake_commit_lock(conn, table.table_id, path):
                result.lake_rows_deleted, result.lake_version = merge_delete(
                    spark, path, rows.schema, key_names, sorted(all_keys, key=repr), predicate, config.run_id,
                    table.partition_by, kept=sorted(current, key=repr))
        result.keys_purged = len(all_keys)
        where, params = change_log_of(conn, table, keys, all_keys)
        result.change_log_deleted = conn.execute(
            sql.SQL("DELETE FROM coldharbor.change_log WHERE {}").format(where), params).rowcount
    if has_lake:
        with pg.lake_commit_lock(conn, table.table_id, path):
            result.files_vacuumed = len(vacuum_files(spark, path, config.vacuum_retention, dry_run=False,
                                                     align_untracked=False))
    result.remaining = verify(spark, conn, table, path, keys, all_keys, predicate, has_lake)
    log.info("%s: purged %s: %s hot rows, %s keys (%s kept for their current row), %s lake rows (version %s), "
             "%s change_log rows, %s files vacuumed; remaining: %s", table.qualified_name, predicate.text,
             result.hot_rows_deleted, result.keys_purged, result.keys_kept, result.lake_rows_deleted,
             result.lake_version, result.change_log_deleted, result.files_vacuumed, result.remaining)
    return result


def _delete_hot_rows(conn: psycopg.Connection, table: RegisteredTable, keys: list[LakeColumn],
                     predicate: Predicate) -> list[tuple]:
    """Deletes the rows matching the predicate from PostgreSQL, logging no change; returns their keys
    as the lake holds them. The job reads the matching rows with its own privileges; the schema
    owner's coldharbor.purge_rows() deletes them (only it may suspend capture) if each is still as
    read: a row changed in between stays, and verify() reports it if it still matches. No SQL text
    reaches the owner's function."""
    refuse_unheld_keys(conn, table, keys, predicate)
    read = conn.execute(sql.SQL("SELECT {}, to_jsonb(t)::text FROM {} t WHERE {}").format(
        sql.SQL(", ").join(as_lake_value(c) for c in keys), table.identifier,
        sql.SQL(predicate.postgres))).fetchall()
    if not read:
        return []
    images = "[" + ",".join(row[-1] for row in read) + "]"  # JSON text as PostgreSQL wrote it: no float round trip
    deleted = conn.execute("SELECT coldharbor.purge_rows(%s, %s::jsonb)", (table.table_id, images)).fetchall()
    return [lake_key(read[position - 1][:-1]) for (position,) in deleted]


PURGE_REFUSED = ("nothing was purged. The lake never held that row (its export is refused): delete it in "
                 "PostgreSQL, or change its key, then purge again")


def refuse_unheld_keys(conn: psycopg.Connection, table: RegisteredTable, columns: Sequence[LakeColumn],
                       predicate: Predicate) -> None:
    """UnrepresentableValueError, in one line naming the first, when a row the predicate matches has a
    key the purge cannot read (infinity, a BC date, a numeric NaN: `lake_values`): the purge reads
    the matching keys as Python values to remove them from the lake and the change log."""
    keys = [c for c in columns if c.is_key]
    if not lake_values.has_limits(keys, through_jdbc=False):
        return

    def value_of(c: LakeColumn) -> sql.Composable:
        return sql.SQL("t.{}").format(sql.Identifier(c.name))

    _, problem = lake_values.checked_values(keys, value_of, through_jdbc=False)
    found = conn.execute(sql.SQL("SELECT p FROM (SELECT {} AS p FROM {} t WHERE {}) r WHERE p IS NOT NULL LIMIT 1")
                         .format(problem, table.identifier, sql.SQL(predicate.postgres))).fetchone()
    if found is not None:
        raise lake_values.refusal(table.quoted_name, found[0], PURGE_REFUSED, through_jdbc=False)


def parse_args(argv: list[str]) -> PurgeConfig:
    parser = job_parser(
        "purge.py",
        "Remove every row matching a predicate from PostgreSQL, the lake (current and old files) and the change "
        f"log, then verify none remains. PostgreSQL is reached through {settings.PG_DSN_ENV}. Exit 0: purged and "
        "verified; 2: refused, nothing changed; 4: purged, but rows remain in files the retention keeps.",
        run_id_help="identifier recorded with the run (default: a new one)")
    parser.add_argument("--where", required=True,
                        help="the rows to purge, e.g. \"customer = 'c-17'\": comparisons of one column with "
                             "literals (=, <>, <, <=, >, >=, BETWEEN, IN, LIKE, IS NULL) joined by AND/OR/NOT; "
                             "a timestamptz literal names its zone (see README)")
    parser.add_argument("--vacuum-retention-hours", type=float, required=True,
                        help="VACUUM retention of this purge: files holding old versions go once older; 0 removes "
                             "them now (needs --allow-short-retention)")
    parser.add_argument("--allow-short-retention", action="store_true",
                        help=f"allow a retention below Delta's {DELTA_GUARD_HOURS:g}-hour guard")
    args = parser.parse_args(argv)
    return PurgeConfig(table=args.table, where=args.where, lake_root=settings.lake_root(args.lake_root),
                       run_id=args.run_id or maintenance_runs.new_run_id("purge"),
                       vacuum_retention=timedelta(hours=args.vacuum_retention_hours),
                       allow_short_retention=args.allow_short_retention)


def check(conn: psycopg.Connection, config: PurgeConfig) -> RegisteredTable:
    """The table to purge, once the predicate and the job's privileges are checked (before Spark
    starts: bad input changes nothing and starts no JVM)."""
    [table] = registry.load(conn, config.table)
    registry.require_present([table])
    registry.require_privileges(conn, table, deletes=True)
    columns = registry.lake_columns(conn, table)
    refuse_unheld_keys(conn, table, columns, purge_predicate.parse(config.where, columns))
    return table


def run(spark: SparkSession, conn: psycopg.Connection, config: PurgeConfig) -> int:
    """Purges the matching rows everywhere, once `check` passed: exit 0, or 4 when files the
    retention keeps still hold some."""
    [table] = registry.load(conn, config.table)
    result = purge(spark, conn, table, config)
    if not result.complete:
        log.error("purge of %s incomplete: %s (files kept by the retention still hold them; run VACUUM "
                  "after the retention, or purge with a shorter one)", table.qualified_name, result.remaining)
        return EXIT_INCOMPLETE
    return 0


def main(argv: list[str]) -> int:
    def body() -> int:
        config = parse_args(argv)
        with pg.connect(settings.pg_dsn()) as conn:
            check(conn, config)
            from coldharbor.runtime.spark import get_session

            return run(get_session("coldharbor-purge"), conn, config)

    return run_job("purge", body)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

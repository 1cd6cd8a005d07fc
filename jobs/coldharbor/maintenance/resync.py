"""resync: rebuild a table's current lake state from PostgreSQL as a new base commit.

The way out after PostgreSQL was restored from a backup, the lake was edited by hand, or a bug: the
table is read whole in one snapshot and appended as a base that outranks every older lake row key
by key (see `base_load`), with delete markers for keys PostgreSQL no longer has. Older versions stay
for as-of reports until compaction's history window and cleanup let them go. Reports stay exact
throughout: before the base commit they read the old state and its dirty set, after it the new one.

It holds the table's export and compaction locks (a second resync, an export or a compaction of
the table at the same time skips or waits its turn), and is logged in coldharbor.maintenance_runs.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

import psycopg
from pyspark.sql import SparkSession

from coldharbor.capture import registry
from coldharbor.capture.table_job import jdbc_target, registered, table_job_main
from coldharbor.export import base_load, base_state
from coldharbor.export.recovery import recover_pending
from coldharbor.maintenance import maintenance_runs
from coldharbor.runtime import pg, settings
from coldharbor.runtime.errors import TableBusyError
from coldharbor.runtime.job_main import job_parser


@dataclass(frozen=True)
class ResyncConfig:
    table: str
    lake_root: str
    run_id: str


def parse_args(argv: list[str]) -> ResyncConfig:
    parser = job_parser(
        "resync.py",
        "Rebuild a registered table's lake state from PostgreSQL as a new base commit (after a restore of "
        "PostgreSQL, a manual edit of the lake, or a bug). Earlier versions stay readable for as-of reports until "
        f"cleanup. PostgreSQL is reached through {settings.PG_DSN_ENV}.",
        run_id_help="identifier recorded with the base (default: a new one)")
    args = parser.parse_args(argv)
    return ResyncConfig(args.table, settings.lake_root(args.lake_root),
                        args.run_id or maintenance_runs.new_run_id("resync"))


def resync_table(spark: SparkSession, conn: psycopg.Connection, jdbc: pg.JdbcTarget, table: registry.RegisteredTable,
                 config: ResyncConfig) -> base_load.BaseResult:
    """Writes the new base under the table's export and compaction locks; TableBusyError if either is held."""
    with pg.advisory_lock(conn, "export", table.table_id) as exporting, \
            pg.advisory_lock(conn, "compact", table.table_id) as compacting:
        if not (exporting and compacting):
            raise TableBusyError(f"{table.qualified_name} is being exported or compacted right now; "
                                 "nothing was changed, run the resync again when it is done")
        registry.require_privileges(conn, table)
        path = table.lake_path(config.lake_root)
        recover_pending(spark, conn, table, path, abandon_foreign=True)
        # A table whose initial load is still pending gets exactly that: its first base.
        kind = base_state.load_state(conn, table.table_id).base_kind
        return base_load.write_base(spark, conn, jdbc, table, registry.lake_columns(conn, table), path, kind,
                                    config.run_id)


def run(spark: SparkSession, conn: psycopg.Connection, config: ResyncConfig) -> int:
    """Writes the table's new base, records the run and says so."""
    table = registered(conn, config.table)
    with maintenance_runs.recorded(conn, config.run_id, table.table_id, "resync"):
        result = resync_table(spark, conn, jdbc_target(), table, config)
    maintenance_runs.finish(conn, config.run_id, table.table_id, "resync", "succeeded",
                            {"kind": result.kind, "rows": result.rows, "batch_id": result.batch_id},
                            result.lake_version)
    print(f"{table.qualified_name}: resynced from PostgreSQL as Delta version {result.lake_version} "
          f"({result.rows} rows and delete markers in the new base)", flush=True)
    return 0


def main(argv: list[str]) -> int:
    return table_job_main("resync", argv, parse_args, run)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""The connections of a job over one registered table (verify, resync, the change feed)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

import psycopg

from coldharbor.capture import registry
from coldharbor.capture.registry import RegisteredTable
from coldharbor.runtime import pg, settings
from coldharbor.runtime.job_main import run_job


def registered(conn: psycopg.Connection, table_name: str) -> RegisteredTable:
    """The registered table named `table_name`; UnknownTableError (exit 2) if none is."""
    [table] = registry.load(conn, table_name)
    registry.require_present([table])
    return table


def jdbc_target() -> pg.JdbcTarget:
    """Spark's JDBC view of the job's PostgreSQL (COLDHARBOR_PG_DSN)."""
    return pg.JdbcTarget.from_dsn(settings.pg_dsn())


@contextmanager
def one_table(table_name: str, app_name: str) -> Iterator[tuple]:
    """(spark, conn) for a job over one registered table: the table is looked up before Spark
    starts, so an unregistered one is refused (exit 2) without a JVM, as is a DSN Spark's JDBC
    driver cannot use."""
    jdbc_target()
    with pg.connect(settings.pg_dsn()) as conn:
        registered(conn, table_name)
        from coldharbor.runtime.spark import get_session  # after the look-up: no JVM for an unknown table

        yield get_session(app_name), conn


def table_job_main(name: str, argv: list[str], parse_args: Callable, run: Callable, **run_job_options) -> int:
    """main() of a job over one registered table (`config.table`): its configuration, then its
    `run(spark, conn, config)` with the table's Spark session and connection (`one_table`), through
    `run_job` (which `run_job_options` go to)."""
    def body() -> int:
        config = parse_args(argv)
        with one_table(config.table, f"coldharbor-{name}") as (spark, conn):
            return run(spark, conn, config)

    return run_job(name, body, **run_job_options)

"""The connections of a job over one registered table (verify, resync, the change feed)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from coldharbor.capture import registry
from coldharbor.runtime import pg, settings


@contextmanager
def one_table(table_name: str, app_name: str) -> Iterator[tuple]:
    """(spark, conn, jdbc, table) for a job over one registered table: the table is looked up before
    Spark starts, so an unregistered one is refused (exit 2) without a JVM."""
    dsn = settings.pg_dsn()
    jdbc = pg.JdbcTarget.from_dsn(dsn)
    with pg.connect(dsn) as conn:
        [table] = registry.load(conn, table_name)
        registry.require_present([table])
        from coldharbor.runtime.spark import get_session  # after the look-up: no JVM for an unknown table

        yield get_session(app_name), conn, jdbc, table


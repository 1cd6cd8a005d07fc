"""A report's change feeds as views: each `changes(table, from, to)` the SQL guard took out of the
report (`sql_feeds`) becomes the view it put in its place, filled with the feed `changes.read_feed`
reads in its own PostgreSQL snapshot. Its points are taken as the report gave them: a lake version,
an instant, a parameter holding one, or now (the as-of instant in an as-of run)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timezone
from typing import TYPE_CHECKING

import psycopg
from pyspark.sql import SparkSession

from coldharbor.runtime.errors import ReportError
from coldharbor.runtime.pg import JdbcTarget
from coldharbor.serve import sql_guard
from coldharbor.serve.sql_feeds import FeedPoint

if TYPE_CHECKING:
    from coldharbor.serve.serve_job import ServeConfig


def feed_point(point: FeedPoint, which: str, config: ServeConfig) -> int | datetime | None:
    """A change feed's point as the window takes it: a lake version, an instant, or None for now
    (in an as-of run, now is the as-of instant: a backfill's window ends at its interval's end)."""
    from coldharbor.serve.changes import parse_point

    where = f"changes() {which}"  # named as the report wrote it
    if point.kind == "version":
        return int(point.value)
    value: object = point.value
    if point.kind == "param":
        value = config.params[str(point.value)]
        where = f"changes() {which} (:{point.value})"
        if isinstance(value, datetime):
            return value if value.tzinfo else value.replace(tzinfo=timezone.utc)
        if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            return value
        if not isinstance(value, str):
            raise ReportError(f"{where} is {value!r}: a change feed's point is a timestamp, a lake version "
                              "(a whole number from 0) or a string holding one of them")
    instant = parse_point(str(value), where, now_allowed=which == "to")
    return config.as_of if instant is None and config.as_of is not None else instant


def register_feeds(spark: SparkSession, conn: psycopg.Connection, jdbc: JdbcTarget,
                   feeds: Sequence[sql_guard.ResolvedFeed], config: ServeConfig) -> None:
    """Each `changes(table, from, to)` of the report as its view: the feed jobs/changes.py writes,
    read in its own PostgreSQL snapshot (to `now`: with the still-dirty changes of that snapshot)."""
    from coldharbor.serve.changes import FeedConfig, read_feed

    for feed in feeds:
        window = FeedConfig(feed.table.qualified_name, feed_point(feed.start, "from", config),
                            feed_point(feed.end, "to", config), target="", sink="", lake_root=config.lake_root)
        flags = (f"{feed.table.qualified_name}'s changes() from", f"{feed.table.qualified_name}'s changes() to")
        read_feed(spark, conn, jdbc, feed.table, window, flags).createOrReplaceTempView(feed.view)

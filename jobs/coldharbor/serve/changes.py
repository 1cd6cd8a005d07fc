"""changes: a registered table's change feed between two points, written as a report table.

Every key whose last write differs between the two points gives rows tagged `insert`, `delete`, or
`update_preimage` and `update_postimage` (the image before and after), with the change sequence and
commit time of the key's last change inside the window. The feed is the net change: a key changed
and changed back inside the window gives nothing, so consecutive windows compose: applying the
feeds of (a, b] and (b, c] gives what applying the feed of (a, c] gives.

A point is an instant (ISO 8601), a lake version of the table (a number: the instant of the newest
change that version holds) or, for `--to`, `now`: the lake plus the still-dirty changes, read from
PostgreSQL in one snapshot as the export would read them. Each instant must be one an as-of report
could answer (inside the history window, from the table's initial load on, outside every rebase
window, not inside a span of changes one export wrote as one image), and the window must hold no
rebase; otherwise the job refuses, naming the nearest usable instants, and writes nothing. The
feed is in the table's current columns (one added since reads NULL before it existed).
"""

from __future__ import annotations

import dataclasses
import logging
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone

import psycopg
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from coldharbor.capture import registry
from coldharbor.capture.registry import RegisteredTable
from coldharbor.capture.table_job import jdbc_target, registered, table_job_main
from coldharbor.export import hot_reader, table_reader
from coldharbor.export.base_state import RebaseWindow
from coldharbor.lake import delta
from coldharbor.lake.lake_rows import CHANGED_AT, column, to_lake_rows
from coldharbor.runtime import pg, settings
from coldharbor.runtime.errors import ConfigError, ReportError, one_line
from coldharbor.runtime.job_main import job_parser
from coldharbor.serve import hot_snapshot, report_spec, sinks
from coldharbor.serve.as_of import check_as_of, refuse_inexact
from coldharbor.serve.hot_snapshot import HotSnapshot
from coldharbor.serve.net_changes import CHANGE_SEQ, CHANGE_TYPE, CHANGE_TYPES, COMMIT_TIMESTAMP, full_rows, net_changes
from coldharbor.serve.serve_job import history_window

log = logging.getLogger(__name__)

TARGET_PREFIX = "changes_"
NOW = "now"
# Ranks the still-dirty images above every lake row of the same change sequence (the same change,
# exported after the snapshot): PostgreSQL's image is the one of the snapshot.
DIRTY_BATCH_ID = 2**62


@dataclass(frozen=True)
class FeedConfig:
    table: str
    start: int | datetime
    end: int | datetime | None   # None: now
    target: str
    sink: str
    lake_root: str


def parse_point(raw: str, flag: str, now_allowed: bool) -> int | datetime | None:
    """A lake version (digits), an ISO-8601 instant (UTC if no zone) or, where allowed, None for `now`."""
    text = raw.strip()
    if text.lower() == NOW:
        if not now_allowed:
            raise ConfigError(f"{flag} cannot be now: the window starts at a lake version or a time")
        return None
    if re.fullmatch(r"[0-9]+", text):
        return int(text)
    try:
        instant = datetime.fromisoformat(text)
    except ValueError:
        kinds = ("a lake version (a whole number from 0), an ISO-8601 time (e.g. 2026-11-22T06:00:00Z) or now"
                 if now_allowed else "a lake version (a whole number from 0) nor an ISO-8601 time "
                                     "(e.g. 2026-11-22T06:00:00Z)")
        raise ConfigError(f"{flag} {raw!r} is {'not' if now_allowed else 'neither'} {kinds}") from None
    return instant if instant.tzinfo else instant.replace(tzinfo=timezone.utc)


def parse_args(argv: list[str]) -> FeedConfig:
    parser = job_parser(
        "changes.py",
        "Write a registered table's change feed between two points (lake versions, ISO-8601 times, or now for "
        "--to) to a report table: one row per insert and delete, two per update (update_preimage, "
        f"update_postimage), with {CHANGE_SEQ} and {COMMIT_TIMESTAMP}. Exit 0 written, 2 refused or failed (one "
        f"line says why; nothing written). PostgreSQL is reached through {settings.PG_DSN_ENV}.")
    parser.add_argument("--from", dest="start", required=True, help="where the window starts (excluded)")
    parser.add_argument("--to", dest="end", default=NOW, help="where it ends (included; default now)")
    parser.add_argument("--target", required=True,
                        help=f"report table to write: {TARGET_PREFIX}<name> in the {report_spec.REPORTS_SCHEMA} "
                             "schema (or the Delta reports folder)")
    parser.add_argument("--sink", choices=report_spec.SINKS, default="postgres")
    args = parser.parse_args(argv)
    target = report_spec.target_name(args.target)
    if not target.startswith(TARGET_PREFIX):
        raise ConfigError(f"target {target!r} is not allowed: a change feed writes a table named "
                          f"{TARGET_PREFIX}<name>")
    return FeedConfig(args.table, parse_point(args.start, "--from", False), parse_point(args.end, "--to", True),
                      target, args.sink, settings.lake_root(args.lake_root))


def version_instant(spark: SparkSession, table: RegisteredTable, path: str, version: int, newest: int | None) -> datetime:
    """The instant a lake version stands for: the newest change it holds."""
    if newest is None or version > newest:
        raise ConfigError(f"lake version {version} of {table.qualified_name} does not exist"
                          + (f"; its newest is {newest}" if newest is not None else ": nothing was exported yet"))
    try:
        found = delta.read_version(spark, path, version).agg(
            F.unix_micros(F.max(column(CHANGED_AT))).alias("micros")).first()["micros"]
    except Exception as exc:
        if not delta.files_gone(exc):
            raise
        raise ConfigError(f"lake version {version} of {table.qualified_name} can no longer be read (VACUUM removed "
                          "its files); give the window's point as a time inside the history window") from exc
    if found is None:
        raise ConfigError(f"lake version {version} of {table.qualified_name} holds no change; give a later one")
    return datetime(1970, 1, 1, tzinfo=timezone.utc) + timedelta(microseconds=found)


def check_point(instant: datetime, snapshot: HotSnapshot, flag: str) -> None:
    try:
        check_as_of(instant, snapshot, history_window())
    except ReportError as exc:
        raise ReportError(f"{flag}: {exc}") from None


def refuse_rebase_inside(table: RegisteredTable, windows: Sequence[RebaseWindow], start: datetime,
                         end: datetime) -> None:
    """ConfigError when (start, end] holds a rebase: DDL changed the rows (a default filled in, a
    rewrite, a rename) without a change of its own, and the base that followed wrote every key again,
    so the feed could not tell the table's changes from what the DDL did."""
    for window in windows:
        if window.starts_at <= end and (window.settled_at is None or start < window.settled_at):
            settled = window.settled_at.isoformat() if window.settled_at else "its new base (the next export)"
            raise ConfigError(f"the window ({start.isoformat()}, {end.isoformat()}] holds a rebase of "
                              f"{table.qualified_name} ({one_line(window.reason)}): DDL changed its rows "
                              "without changes the feed could list; use windows that end before "
                              f"{window.starts_at.isoformat()} or start from {settled} on")


def read_feed(spark: SparkSession, conn: psycopg.Connection, jdbc: pg.JdbcTarget, table: RegisteredTable,
              config: FeedConfig, flags: tuple[str, str] = ("--from", "--to")) -> DataFrame:
    """The feed, computed and pinned, in one PostgreSQL snapshot (for `now`, its dirty images too).
    Refusals name the window's ends as `flags` (the job's options, or a report's changes() call)."""
    to_flag = flags[1]
    path = table.lake_path(config.lake_root)
    columns = tuple(registry.lake_columns(conn, table))
    taken = [c.name for c in columns if c.name.lower() in (CHANGE_TYPE, CHANGE_SEQ, COMMIT_TIMESTAMP)]
    if taken:
        raise ConfigError(f"{table.qualified_name} has a column named {taken[0]}, which the change feed's own "
                          "column of that name would hide; the feed of this table cannot be written")
    registry.require_privileges(conn, table)
    with conn.transaction():
        conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        registry.guard_read(conn, table)
        pg_snapshot = table_reader.export_snapshot(conn, table)
        hot_reader.require_commit_times(conn)
        version = delta.pin_version(spark, path)  # after the snapshot: a change it saw dirty is here or dirty
        # A missing lake table of a table whose changes were flushed: the lake root is wrong (raises).
        snapshot = hot_snapshot.read_in_transaction(conn, {table.table_id: version}, [table])
        if version is None:
            raise ConfigError(f"{table.qualified_name} has no lake table yet: its change feed starts at its "
                              "initial load, which the next export writes")
        hot = snapshot.tables[table.table_id]
        if hot.hot_only or hot.load_pending:
            raise ReportError(f"the change feed of {table.qualified_name} cannot be read yet: its initial load or "
                              "a rebase's new base is not in the lake; retry after the next export")
        start = config.start if isinstance(config.start, datetime) else \
            version_instant(spark, table, path, config.start, version)
        rows = full_rows(delta.read_version(spark, path, version), columns)
        if config.end is None:
            end = pg_snapshot.taken_at
            dirty = hot_reader.read_dirty_images(spark, conn, jdbc, pg_snapshot.snapshot_id, table, columns)
            rows = rows.filter(column(CHANGED_AT) <= F.lit(end)).unionByName(
                full_rows(dirty.transform(to_lake_rows(columns, DIRTY_BATCH_ID, end)), columns))
            # The dirty images are in the feed: what the lake lacks of them is no reason to refuse.
            snapshot = HotSnapshot(snapshot.taken_at, {table.table_id: dataclasses.replace(hot, unexported_since=None)})
        else:
            end = config.end if isinstance(config.end, datetime) else \
                version_instant(spark, table, path, config.end, version)
            check_point(end, snapshot, to_flag)
        _check_window(rows, table, snapshot, start, end, flags)
        from coldharbor.runtime.spark import local_checkpoint, temporary_conf

        # Without constraint propagation: the optimizer infers constraints from every pair of the
        # feed's per-column comparisons and aliases, and for a table of 16 columns that ran for
        # more than 15 minutes before the plan started (it infers nothing the feed needs).
        with temporary_conf(spark, {"spark.sql.constraintPropagation.enabled": "false"}):
            feed = local_checkpoint(net_changes(rows, columns, start, end), eager=True)  # read once
    log.info("%s: change feed of (%s, %s] over lake version %s", table.qualified_name, start.isoformat(),
             end.isoformat(), version)
    return feed


def _check_window(rows: DataFrame, table: RegisteredTable, snapshot: HotSnapshot, start: datetime, end: datetime,
                  flags: tuple[str, str]) -> None:
    """Refuses a window that is empty or reversed, that starts before the history kept, that a
    rebase cuts, or whose ends the lake cannot place exactly; each end named by its flag."""
    from_flag, to_flag = flags
    hot = snapshot.tables[table.table_id]
    if start >= end:
        raise ConfigError(f"{from_flag} ({start.isoformat()}) is not before {to_flag} ({end.isoformat()}): the "
                          "window is empty or reversed")
    check_point(start, snapshot, from_flag)
    refuse_rebase_inside(table, hot.rebase_windows, start, end)
    for flag, instant in ((from_flag, start), (to_flag, end)):
        try:
            refuse_inexact(rows, instant, table.qualified_name, table.history == "exact", hot.answerable_from)
        except ReportError as exc:
            raise ReportError(f"{flag}: {exc}") from None


def write_feed(feed: DataFrame, conn: psycopg.Connection, jdbc: pg.JdbcTarget, config: FeedConfig,
               table: RegisteredTable) -> int:
    if config.sink == "postgres":
        return sinks.write_postgres(feed, conn, jdbc, config.target)
    return sinks.write_delta(feed, sinks.delta_path(config.lake_root, config.target),
                             {"change_feed": table.qualified_name})


def run(spark: SparkSession, conn: psycopg.Connection, config: FeedConfig) -> int:
    """Writes the table's change feed between the two points to the target and says how many of each kind."""
    table, jdbc = registered(conn, config.table), jdbc_target()
    feed = read_feed(spark, conn, jdbc, table, config)
    rows = write_feed(feed, conn, jdbc, config, table)
    counts = {r[CHANGE_TYPE]: r["n"] for r in feed.groupBy(CHANGE_TYPE).agg(F.count(F.lit(1)).alias("n")).collect()}
    print(f"{table.qualified_name}: {rows} change feed rows in {report_spec.REPORTS_SCHEMA}.{config.target} ("
          + ", ".join(f"{counts.get(kind, 0)} {kind}" for kind in CHANGE_TYPES) + ")", flush=True)
    return 0


def main(argv: list[str]) -> int:
    return table_job_main("changes", argv, parse_args, run)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

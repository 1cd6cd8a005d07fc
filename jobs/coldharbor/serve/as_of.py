"""Which instants an as-of report can answer exactly, and the one line refusing the others.

An as-of read is the lake's rows whose change committed at or before the instant, last write per
key (`unified.cold_live`). It is exact only inside the history window, before the oldest change the
pinned lake version lacks, from the lake's start on, outside every rebase window (sql/migrations/015-016:
from the oldest change not exported when DDL changed rows without writing them, or the DDL, until
the base that answered it; before a rename, every instant until its base) and outside a span of
changes one export wrote as one image.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import datetime, timedelta

import psycopg
from pyspark.sql import DataFrame, Window
from pyspark.sql import functions as F

from coldharbor.capture.registry import LakeColumn, RegisteredTable
from coldharbor.export import base_state, hot_reader
from coldharbor.export.base_state import RebaseWindow
from coldharbor.lake.lake_rows import CHANGED_AT, FIRST_CHANGED_AT, column
from coldharbor.lake.unified import cold_live
from coldharbor.runtime.errors import ReportError, one_line
from coldharbor.serve.hot_snapshot import HotSnapshot, HotTable

log = logging.getLogger(__name__)


def check_as_of(as_of: datetime, snapshot: HotSnapshot, window: timedelta) -> None:
    """An as-of read is exact only inside the history window and before the oldest change the
    pinned lake versions lack."""
    if as_of > snapshot.taken_at:
        raise ReportError(f"as-of {as_of.isoformat()} is in the future (now: {snapshot.taken_at.isoformat()})")
    if as_of < snapshot.taken_at - window:
        raise ReportError(f"as-of {as_of.isoformat()} is outside the history window of "
                          f"{window.total_seconds() / 3600:g} hours; the oldest time a report can be asked for "
                          f"is {(snapshot.taken_at - window).isoformat()}")
    for hot in snapshot.tables.values():
        refuse_table_as_of(as_of, hot)


def refuse_table_as_of(as_of: datetime, hot: HotTable) -> None:
    """ReportError when lake@V cannot answer for `hot`'s table as of `as_of`: a lake that is not
    PostgreSQL's past, a rebase window, a base not in V, before the lake's start, before what
    compaction kept, or changes not exported yet."""
    name = hot.table.qualified_name
    if hot.lake_ahead:
        raise ReportError(f"as-of {as_of.isoformat()} cannot be answered for {name}: the lake's history is not "
                          f"PostgreSQL's: {hot.lake_ahead}")
    window = hot.hiding_window(as_of) or (hot.open_window if hot.load_pending else None)
    if window is not None and (window.settled_at is None or as_of < window.settled_at):
        raise ReportError(rebase_refusal(as_of, hot.table, window))
    if hot.load_pending and hot.known_from is not None:  # a base landed after the pin (the window is settled)
        raise ReportError(f"as-of {as_of.isoformat()} cannot be answered for {name}: its newest base landed in "
                          f"the lake after the version this report read ({hot.pinned_version}); retry")
    if hot.load_pending:
        raise ReportError(f"as-of {as_of.isoformat()} cannot be answered for {name}: its initial load has not "
                          "landed in the lake yet; retry after the next export")
    if hot.known_from is not None and as_of < hot.known_from:
        raise ReportError(f"as-of {as_of.isoformat()} is before {name} was loaded into the lake: its initial load "
                          f"(or its registration, for a table registered empty) read the table as of "
                          f"{hot.known_from.isoformat()}, and the lake knows nothing earlier; the oldest time a "
                          "report can be asked for is that one")
    if hot.history_from is not None and as_of < hot.history_from:
        raise ReportError(f"as-of {as_of.isoformat()} cannot be answered for {name}: a compaction kept its versions "
                          f"from {hot.history_from.isoformat()} on only (the history window was shorter then than "
                          "it is now), so the lake may lack the versions before; the oldest time a report can be "
                          "asked for is that one (or, when a key's changes exported together span it, the end of "
                          "that span, which a report there names)")
    if hot.unexported_since is not None and hot.unexported_since <= as_of:
        raise ReportError(f"as-of {as_of.isoformat()} is not in the lake yet: {name} has changes from "
                          f"{hot.unexported_since.isoformat()} that are not exported; retry after the next export")


def waiting_for_export(conn: psycopg.Connection, tables: Sequence[RegisteredTable], as_of: datetime) -> str | None:
    """What keeps `as_of` out of the lake that the next export brings in, as one line (None: nothing
    does, or nothing an export brings would make the instant answerable): a change committed at or
    before it still dirty, or a rebase's new base not landed yet for an instant before the rebase. A
    report run waits on this instead of being refused and retried. A pending base after which the
    instant is refused anyway (an initial load, which the lake knows nothing before; a rebase from
    before the instant on; a rename or a key change, which hide every earlier instant) is not
    waited for: the run refuses it at once, saying why (`check_as_of`)."""
    waiting = []
    for table in tables:
        state = conn.execute("SELECT load_state, loaded_at FROM coldharbor.tables WHERE table_id = %s",
                             (table.table_id,)).fetchone()
        if state is None:
            return None  # unregistered since: the run says so
        if state[0] == "pending":
            open_windows = [w for w in base_state.rebase_windows(conn, table.table_id) if w.settled_at is None]
            if state[1] is None or not open_windows or any(w.hides_earlier or as_of >= w.starts_at
                                                              for w in open_windows):
                return None
            waiting.append(f"{table.qualified_name}: the new base of a rebase is not in the lake yet")
            continue
        oldest = hot_reader.oldest_dirty_change(conn, table.table_id, up_to=as_of)
        if oldest is not None and oldest <= as_of:
            waiting.append(f"{table.qualified_name}: changes from {oldest.isoformat()} are not exported yet")
    if not waiting:
        return None
    return f"as-of {as_of.isoformat()} is not in the lake yet; " + "; ".join(waiting)


def rebase_refusal(as_of: datetime, table: RegisteredTable, window: RebaseWindow) -> str:
    """The one line refusing an as-of instant a rebase window hides, saying where it falls: inside
    the window (from the DDL on), before the DDL but after a change it rewrote before that change
    was exported, before a rename, or before a rebase no base has answered yet (the table is then
    read from PostgreSQL alone: `check_as_of`)."""
    start, since = window.starts_at.isoformat(), window.requested_at.isoformat()
    reason = one_line(window.reason)
    if window.settled_at is None:
        until = "its new base, which the next export writes"
        ask = f"retry after that export (then instants before {start} and from the new base on are answered)"
    else:
        until = f"its new base of {window.settled_at.isoformat()} (lake version {window.settled_version})"
        ask = (f"ask for an instant from {window.settled_at.isoformat()} on (none before it can be read)"
               if window.hides_earlier else
               f"ask for an instant before {start}, or from {window.settled_at.isoformat()} on")
    head = f"as-of {as_of.isoformat()} cannot be answered for {table.quoted_name}: it falls"
    if as_of >= window.requested_at:
        return (f"{head} inside a rebase: {reason}; PostgreSQL held values the lake does not have from {since} "
                f"until {until}; {ask}")
    if window.hides_earlier:
        then = ("retry after the next export writes the new base, then ask for an instant from it on"
                if window.settled_at is None else f"ask for an instant from {window.settled_at.isoformat()} on")
        held = ("hold the column under its old name" if window.renames_column
                else "are keyed by the old primary key")
        return (f"{head} before a {'rename' if window.renames_column else 'key change'} ({reason}, at {since}): "
                f"lake rows written before it {held}, so no earlier instant can be read under the new one; {then}")
    if as_of >= window.starts_at:
        return (f"{head} before a rebase ({reason}), but changes from {start} on were not exported when its DDL "
                f"ran at {since}: the lake holds those keys only with the values the DDL left, from {start} until "
                f"{until}; {ask}")
    return (f"{head} before a rebase ({reason}, at {since}) that no base has answered yet: until the next "
            f"export writes it, reports read the table from PostgreSQL alone; {ask}")


def lake_as_of(rows: DataFrame, columns: Sequence[LakeColumn], as_of: datetime, table: str,
               exact: bool = False, floor: datetime | None = None) -> DataFrame:
    """The table as of `as_of` from its lake rows, or ReportError when the lake cannot know it
    (`refuse_inexact`; `exact`: the table keeps exact history)."""
    refuse_inexact(rows, as_of, table, exact, floor)
    return rows.transform(cold_live(columns, as_of))


# Why a table with exact history (sql/migrations/021) still has a span of changes in one lake row.
NO_IMAGE = ("have changes around that instant with no row image the lake could hold (logged before the table "
            "kept exact history or before a rebase, brought in by ATTACH PARTITION, holding a value the lake "
            "cannot hold or a JSON null, or whose logged order could not be proven: a row written again inside "
            "its statement by a trigger or function, a column dropped or added between two changes of the key, "
            "or a partition written directly whose columns are in another order than the table's)")


def _refused_around(rows: DataFrame, as_of: datetime) -> tuple[str, str]:
    """The stretch of refused instants around `as_of`, as ISO texts (start, end): the union of every
    key's span [first change, last change) that overlaps it, directly or through another span, so
    that the instants named are answered (a span of one key can end inside another key's)."""
    spans = (rows.filter(column(FIRST_CHANGED_AT) < column(CHANGED_AT))
             .select(column(FIRST_CHANGED_AT).alias("s"), column(CHANGED_AT).alias("e")))
    earlier = Window.orderBy("s", "e").rowsBetween(Window.unboundedPreceding, -1)
    # A span starts a new stretch when it begins after every earlier one has ended.
    stretches = (spans.withColumn("reach", F.max("e").over(earlier))
                 .withColumn("starts", (column("reach").isNull() | (column("s") > column("reach"))).cast("int"))
                 .withColumn("stretch", F.sum("starts").over(earlier.rowsBetween(Window.unboundedPreceding, 0)))
                 .groupBy("stretch").agg(F.min("s").alias("s"), F.max("e").alias("e")))
    iso = "yyyy-MM-dd'T'HH:mm:ss.SSSSSSXXX"  # in the session's zone (UTC), with it
    found = (stretches.filter((column("s") <= F.lit(as_of)) & (column("e") > F.lit(as_of)))
             .select(F.date_format("s", iso).alias("start"), F.date_format("e", iso).alias("end")).first())
    return found["start"], found["end"]


def refuse_inexact(rows: DataFrame, as_of: datetime, table: str, exact: bool = False,
                   floor: datetime | None = None) -> None:
    """ReportError when lake rows `rows` hold no exact state of `table` at `as_of`.

    An export writes one image per key for all of the key's changes since the previous export; a
    key changed more than once in that time has no lake version for the instants between its first
    and its last change. Serving the older version there would be a stale answer: refused instead,
    naming the nearest instants that are exact (`_refused_around`); not an earlier one when it lies
    before `floor`, the oldest instant the table can be answered for otherwise (a load, what
    compaction kept), which would refuse it in turn.
    """
    if FIRST_CHANGED_AT in rows.columns:
        spans = rows.filter((column(FIRST_CHANGED_AT) <= F.lit(as_of)) & (column(CHANGED_AT) > F.lit(as_of)))
        keys = spans.count()
        if keys:
            start, end = _refused_around(rows, as_of)
            nearest = (f"the nearest exact instants are before {start} or from {end} on"
                       if floor is None or datetime.fromisoformat(start) > floor
                       else f"the nearest exact instant is from {end} on")
            why = (NO_IMAGE if exact else "changed more than once between two exports around that instant, and the "
                   "lake holds one version per key per export")
            raise ReportError(
                f"as-of {as_of.isoformat()} cannot be answered exactly for {table}: {keys} key(s) {why}; {nearest}")
    else:
        log.warning("%s: lake rows written before %s existed; as-of answers inside a span of changes exported "
                    "together cannot be told apart", table, FIRST_CHANGED_AT)

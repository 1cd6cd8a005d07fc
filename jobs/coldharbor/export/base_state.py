"""What PostgreSQL records of a table's bases, read without Spark: its initial-load state and newest
base (`coldharbor.tables`), the rebase windows when the lake did not hold PostgreSQL's values
(`coldharbor.rebases`), the history a compaction kept, and what a base must keep or replace (evicted
rows, another relation registered under the name, another key). The export's bases write by them
(`base_load`); reports read as of them (`serve.hot_snapshot`, `serve.as_of`)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

import psycopg

from coldharbor.capture.registry import RegisteredTable


@dataclass(frozen=True)
class LoadState:
    """A table's initial-load state and newest base, as `coldharbor.tables` records them."""

    state: str                      # pending | loaded
    loaded_version: int | None      # Delta version of the initial load (None: nothing to load)
    loaded_at: datetime | None      # the snapshot time of the base that started the lake table there now
                                    # (the initial load, or `starts_lake`): the lake knows nothing earlier
    base_version: int | None
    base_at: datetime | None
    rebase_reason: str | None = None  # why the newest rebase was requested (sql/migrations/014)
    registered_at: datetime | None = None  # when the registration began: a table registered empty is
                                           # known to the lake from then on (and nothing earlier)

    @property
    def known_from(self) -> datetime | None:
        """The oldest instant the lake can answer for: the initial load's snapshot, or the
        registration of a table registered empty (which needed no load)."""
        return self.loaded_at if self.loaded_at is not None else (None if self.pending else self.registered_at)

    @property
    def pending(self) -> bool:
        return self.state == "pending"

    @property
    def rebase_pending(self) -> bool:
        """Pending because DDL changed rows capture cannot carry (not an initial load): the lake
        may hold rows PostgreSQL no longer has, so the base must be written even for an empty table."""
        return self.pending and self.rebase_reason is not None

    @property
    def base_kind(self) -> str:
        """The kind of the next base: a table never loaded gets its initial load, any other a resync
        (which keeps the initial load's version and time, from which as-of reports start, unless it
        is the first commit of its lake table: `starts_lake`)."""
        return "load" if self.pending and self.loaded_at is None and self.rebase_reason is None else "resync"


def load_state(conn: psycopg.Connection, table_id: int) -> LoadState:
    row = conn.execute("SELECT load_state, loaded_version, loaded_at, base_version, base_at, rebase_reason, "
                       "registered_at FROM coldharbor.tables WHERE table_id = %s", (table_id,)).fetchone()
    return LoadState(*row)


@dataclass(frozen=True)
class RebaseWindow:
    """A time when the lake does not hold PostgreSQL's values (sql/migrations/015, sql/migrations/016): from the oldest
    change not yet exported when DDL changed rows without writing them (its image is read after
    the DDL, with the values the DDL left, under the change's earlier time), or from the request
    itself, until the snapshot of the base that answered it. Before a rename the lake holds the
    column under its old name, before a key change its rows are keyed by the old key: every instant
    before the base is hidden."""

    reason: str
    requested_at: datetime
    settled_at: datetime | None       # None: no base has answered it yet
    settled_version: int | None
    dirty_since: datetime | None = None  # the oldest change not exported at the request, if before it
    renames_column: bool = False
    replaces_lake: bool = False       # the key changed (sql/migrations/020): the base replaced the lake's rows

    @property
    def hides_earlier(self) -> bool:
        """Whether no instant before the base can be read as the table is now: a rename (the lake
        holds the column under its old name) or a key change (its rows are keyed by the old key)."""
        return self.renames_column or self.replaces_lake

    @property
    def starts_at(self) -> datetime:
        """The first instant the lake cannot answer: the oldest change dirty at the DDL, or the request."""
        if self.dirty_since is None:
            return self.requested_at
        return min(self.dirty_since, self.requested_at)

    def hides(self, instant: datetime, version: int | None, lake_from: datetime | None) -> bool:
        """Whether lake@version read as of `instant` would miss the rebase's values. A window settled
        before `lake_from` (the start of the lake there now) belongs to an earlier lake: its version
        says nothing about this one."""
        if self.hides_earlier and not self.of_earlier_lake(lake_from) and (
                self.settled_at is None or instant < self.settled_at):
            return True
        if instant < self.starts_at:
            return False
        if self.settled_at is None or instant < self.settled_at:
            return True
        return self.lacks_base(version, lake_from)

    def of_earlier_lake(self, lake_from: datetime | None) -> bool:
        """Whether the base that answered the window started before the lake there now did."""
        return self.settled_at is not None and lake_from is not None and self.settled_at <= lake_from

    def lacks_base(self, version: int | None, lake_from: datetime | None) -> bool:
        """Whether lake@version lacks the base that answered the window (it landed after V)."""
        if self.settled_version is None or self.of_earlier_lake(lake_from):
            return False
        return version is None or version < self.settled_version


def history_kept_from(conn: psycopg.Connection, table_id: int) -> datetime | None:
    """The newest cutoff a compaction of the table recorded (sql/migrations/025): the lake may lack the versions
    older than it, so no as-of read before it is exact."""
    row = conn.execute("SELECT kept_from FROM coldharbor.history_kept WHERE table_id = %s", (table_id,)).fetchone()
    return None if row is None else row[0]


def rebase_windows(conn: psycopg.Connection, table_id: int) -> tuple[RebaseWindow, ...]:
    """The table's rebase windows, oldest first, as the caller's snapshot sees them."""
    rows = conn.execute("SELECT reason, requested_at, settled_at, settled_version, dirty_since, renames_column, "
                        "replaces_lake FROM coldharbor.rebases WHERE table_id = %s ORDER BY serial",
                        (table_id,)).fetchall()
    return tuple(RebaseWindow(*row) for row in rows)


def has_evicted_rows(conn: psycopg.Connection, table_id: int) -> bool:
    """Whether rows of the table were ever evicted (sql/migrations/018): they live in the lake alone even after
    its hot retention was removed (registered again without one), so a base must keep them."""
    return conn.execute("SELECT evicted_at IS NOT NULL FROM coldharbor.tables WHERE table_id = %s",
                        (table_id,)).fetchone()[0]


def keeps_lake_only_rows(conn: psycopg.Connection, table: RegisteredTable) -> bool:
    """Whether keys only the lake holds may be rows evicted from PostgreSQL, not deleted ones: a
    tiered table, or one that ever evicted rows (what a base keeps, verify does not compare, and a
    lake ahead of PostgreSQL makes unreadable)."""
    return table.hot_retention is not None or has_evicted_rows(conn, table.table_id)


def answers_new_relation(conn: psycopg.Connection, table_id: int) -> bool:
    """Whether the base answers the registration of another relation under the table's name (sql/migrations/017):
    the lake's rows are then the old table's, none of them evicted by the new one, so even a tiered
    table's base marks deleted every lake key the new table lacks, or replaces them all when they
    cannot stand beside its own (`base_schema_change`)."""
    return conn.execute("SELECT EXISTS (SELECT 1 FROM coldharbor.rebases WHERE table_id = %s "
                        "AND settled_at IS NULL AND new_relation)", (table_id,)).fetchone()[0]


def replaces_lake(conn: psycopg.Connection, table_id: int) -> bool:
    """Whether the base answers a registration with another primary key (sql/migrations/020): the lake's rows are
    keyed by a key that no longer identifies a row, so the base replaces them."""
    return conn.execute("SELECT EXISTS (SELECT 1 FROM coldharbor.rebases WHERE table_id = %s "
                        "AND settled_at IS NULL AND replaces_lake)", (table_id,)).fetchone()[0]


def starts_lake(kind: str, version: int, replaces: bool = False) -> bool:
    """Whether a base starts the history of the lake table it landed in: an initial load, or any
    base that is the table's first Delta commit (the lake table was moved aside, or never written);
    a base that replaced the lake's rows does too (its commit's `replaces`).
    As-of reports start there (`loaded_at`): the lake there now knows nothing earlier."""
    return kind == "load" or version == 0 or replaces

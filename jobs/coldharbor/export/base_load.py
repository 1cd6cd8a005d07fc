"""Base commits: the initial load of a table registered with rows in it, and resync (invariant 12).

A base is the whole table read in ONE snapshot taken after capture was committed (so every change
the snapshot misses is in change_log), written as one idempotent Delta append:

- every row of the snapshot, with `_ch_seq` = the newest change sequence the lake holds for its key
  (0 when it holds none: an initial load sorts before every captured change) and the base's batch
  id, which is larger than every earlier batch's: the base wins over every older lake row of the
  key (ties on the sequence go to the newer batch) and loses to every change exported after it;
- a delete marker for every key the lake holds live and the snapshot does not (resync only);
- `_ch_changed_at` = `_ch_first_changed_at` = the snapshot's time.

Older lake rows stay, so as-of reports before the base still read them until compaction's history
window lets them go. Changes the snapshot already saw and that are still dirty are exported later
with their own sequence and resolve by last write wins.

Publish order as for an export: intent (an `export_batches` row of kind load/resync) -> Delta
commit (its metadata names the batch and the snapshot time) -> record the base. A run that dies
after the commit is finished by the next run's recovery; one that dies before it left nothing.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timezone

import psycopg
from psycopg import sql
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from coldharbor.capture import registry
from coldharbor.capture.registry import LakeColumn, RegisteredTable
from coldharbor.export import table_reader
from coldharbor.lake import commits, delta, lake_values, writes
from coldharbor.lake.lake_rows import CHANGED_AT, DELETED, FIRST_CHANGED_AT, SEQ, column, latest_per_key, to_lake_rows
from coldharbor.lake.unified import table_contract
from coldharbor.runtime import faults, pg
from coldharbor.runtime.errors import ConfigError, LakeUnavailableError, TableBusyError, jvm_message
from coldharbor.runtime.spark import base_parallelism

log = logging.getLogger(__name__)

KINDS = ("load", "resync")
LOAD_REFUSED = "nothing of the table was written. Change such values; the next run reads the table again"


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


@dataclass(frozen=True)
class BaseResult:
    table: str
    kind: str
    batch_id: int | None
    rows: int
    lake_version: int | None


def settle_without_spark(conn: psycopg.Connection, table: RegisteredTable) -> bool:
    """Records as loaded a pending table that needs no base commit; whether it did.

    An entity schema's registration logged every record (its first export carries them). A table
    is empty when a snapshot taken now -- after its registration committed, so every later write is
    captured -- holds no row. The caller holds the table's export lock.
    """
    if load_state(conn, table.table_id).rebase_pending:
        return False
    with conn.transaction():
        conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        registry.guard_read(conn, table)  # before the snapshot: no code of the table's owner runs here
        if table.source_kind != "entity":
            has_rows = conn.execute(sql.SQL("SELECT EXISTS (SELECT 1 FROM {})").format(table.identifier)).fetchone()[0]
            if has_rows:
                return False
        settled = conn.execute("UPDATE coldharbor.tables SET load_state = 'loaded', base_rows = 0 "
                               "WHERE table_id = %s AND load_state = 'pending' AND rebase_reason IS NULL",
                               (table.table_id,)).rowcount
    if settled:
        log.info("%s: registered without rows to load; capture carries every row", table.qualified_name)
    return True


def begin(conn: psycopg.Connection, table: RegisteredTable, kind: str, run_id: str,
          lake_batch_id: int | None) -> tuple[int, str]:
    """Records the base's intent (committed before the Delta commit); returns its batch id and
    commit token. The id is past `lake_batch_id`, the last batch id Delta recorded for the table:
    after PostgreSQL was restored from a backup its own counter is behind, and Delta would skip a
    reused id as already written."""
    with conn.transaction():
        batch_id = conn.execute(
            "UPDATE coldharbor.tables SET last_batch_id = greatest(last_batch_id, %s) + 1 WHERE table_id = %s "
            "RETURNING last_batch_id", (lake_batch_id or 0, table.table_id)).fetchone()[0]
        token = conn.execute(
            "INSERT INTO coldharbor.export_batches (table_id, batch_id, run_id, kind, change_count, row_count) "
            "VALUES (%s, %s, %s, %s, 0, 0) RETURNING commit_token::text",
            (table.table_id, batch_id, run_id, kind)).fetchone()[0]
    return batch_id, token


def lake_sequences(spark: SparkSession, path: str, keys: Sequence[str]) -> DataFrame | None:
    """Per key the lake holds: its newest change sequence and whether that version is live."""
    version = delta.pin_version(spark, path)
    if version is None:
        return None
    newest = delta.read_version(spark, path, version).transform(latest_per_key(keys))
    return newest.select(*map(column, keys), column(SEQ).alias("_ch_lake_seq"),
                         (~column(DELETED)).alias("_ch_lake_live"))


SEQUENCE_WAIT_S = 60


def advance_change_sequence(conn: psycopg.Connection, lake_keys: DataFrame, table: RegisteredTable,
                            path: str) -> None:
    """Makes every change id from now on larger than every sequence the lake holds.

    Normally it already is. After PostgreSQL was restored from a backup the sequence is back in the
    past, and a new change with a smaller id than the lake's newest version of its key would lose to
    it. Once the sequence is moved, the base waits for the transactions that may hold an id taken
    before (they were running when it moved), so its snapshot holds every such change.

    This is the base's first read of every lake file: one removed by hand is refused here, in one
    line, before the base records its intent.
    """
    try:
        newest = lake_keys.agg(F.max(column("_ch_lake_seq"))).first()[0]
    except Exception as exc:
        if not delta.files_gone(exc):
            raise
        raise LakeUnavailableError(
            f"files of the lake table of {table.quoted_name} at {path} are gone (removed by hand, or a lost "
            f"folder): {jvm_message(exc)}; a base outranks the lake's rows key by key and cannot do so "
            "without them: move that folder aside (or remove it) and run the resync again, which writes the "
            "table whole into a new lake table there; nothing was written") from None
    if newest is None:
        return
    moved = conn.execute(
        """SELECT pg_snapshot_xmax(pg_current_snapshot())::text::bigint,
                  setval('coldharbor.change_log_id_seq', %s)
             FROM coldharbor.change_log_id_seq WHERE last_value < %s""", (newest, newest)).fetchone()
    if moved is None:
        return
    log.warning("the change_log id sequence was behind the lake's newest change sequence %s (PostgreSQL "
                "restored from a backup?); moved it past, waiting for transactions that took ids before", newest)
    deadline = time.monotonic() + SEQUENCE_WAIT_S
    while conn.execute("SELECT pg_snapshot_xmin(pg_current_snapshot())::text::bigint < %s",
                       (moved[0],)).fetchone()[0]:
        if time.monotonic() > deadline:
            raise TableBusyError(f"transactions open since the change sequence was moved did not end within "
                                 f"{SEQUENCE_WAIT_S} s; nothing was written, retry the resync")
        time.sleep(0.2)


def base_rows(snapshot_rows: DataFrame, lake_keys: DataFrame | None, columns: Sequence[LakeColumn],
              taken_at: datetime, tiered: bool = False) -> DataFrame:
    """The base's images before `to_lake_rows`: the snapshot's rows, and delete markers for the
    keys the lake holds live that the snapshot does not.

    A tiered table's rows leave PostgreSQL by eviction too, and nothing tells an evicted key from a
    deleted one but the change log (a captured delete reaches the lake as its own marker): a key
    only the lake holds is left as the lake has it, never marked deleted by the base."""
    keys = [c.name for c in columns if c.is_key]
    stamp = F.lit(taken_at).cast("timestamp")
    if lake_keys is None:
        rows = snapshot_rows.withColumn(SEQ, F.lit(0).cast("long")).withColumn(DELETED, F.lit(False))
    else:
        present = snapshot_rows.withColumn("_ch_present", F.lit(True))
        joined = present.join(lake_keys, on=keys, how="full_outer")
        present_now = column("_ch_present").isNotNull()
        kept = present_now if tiered else present_now | column("_ch_lake_live")
        rows = (joined.filter(kept)
                .withColumn(SEQ, F.coalesce(column("_ch_lake_seq"), F.lit(0)).cast("long"))
                .withColumn(DELETED, column("_ch_present").isNull()))
    return rows.select(*[column(c.name) for c in columns], column(SEQ), column(DELETED),
                       stamp.alias(CHANGED_AT), stamp.alias(FIRST_CHANGED_AT))


def write_base(spark: SparkSession, conn: psycopg.Connection, jdbc: pg.JdbcTarget, table: RegisteredTable,
               columns: Sequence[LakeColumn], path: str, kind: str, run_id: str,
               hook: faults.Hook = faults.from_environment, rebase: bool = False) -> BaseResult:
    """Reads the table in one snapshot and commits it as a base; the caller holds the export lock.
    The crash points are named after the kind (`load_after_intent`, ...), or `rebase_...` for a base
    that answers a rebase (sql/migrations/014: the export's, of kind resync)."""
    points = "rebase" if rebase else kind
    if kind not in KINDS:
        raise ValueError(f"a base is one of {KINDS}, not {kind!r}")
    app_id = commits.export_app_id(table.table_id)
    # Refusals (an unwritable lake, a type the lake table cannot take) come before the intent, so a
    # refused base leaves nothing behind.
    writes.ensure_writable(spark, path)
    commits.require_own_lake(spark, path, app_id, table.quoted_name)
    keys = [c.name for c in columns if c.is_key]
    new_relation = answers_new_relation(conn, table.table_id)
    change, replace = base_schema_change(spark, table, columns, path, new_relation,
                                         replaces_lake(conn, table.table_id))
    lake_keys = None
    if not replace:
        # A lake table already there (a resync, or a load into a location used before) keeps its rows:
        # the base outranks them key by key, and marks the keys PostgreSQL no longer has deleted.
        lake_keys = lake_sequences(spark, path, keys)
        if lake_keys is not None:
            advance_change_sequence(conn, lake_keys, table, path)
    batch_id, token = begin(conn, table, kind, run_id, commits.committed_txn_version(spark, path, app_id))
    hook(f"{points}_after_intent")
    try:
        _read_and_append(spark, conn, jdbc, table, columns, path, kind, run_id, batch_id, token, lake_keys,
                         change, hook, points, new_relation, replace)
    except Exception as exc:
        if not pg.lock_timed_out(exc):
            raise
        raise TableBusyError(
            f"the {kind} of {table.qualified_name} gave way to a statement that locks the table exclusively "
            f"(TRUNCATE, a rewriting ALTER TABLE, VACUUM FULL): its readers waited {table_reader.READER_LOCK_TIMEOUT} "
            "for their lock; nothing was written, the next run reads the table again") from None
    hook(f"{points}_after_commit")
    landed = finish_if_committed(spark, conn, table, path, batch_id, kind, token)
    if landed is None:
        raise LakeUnavailableError(f"the {kind} of {table.qualified_name} was written to {path} but its commit "
                                   "is not in the Delta history; nothing was recorded")
    return landed


def base_schema_change(spark: SparkSession, table: RegisteredTable, columns: Sequence[LakeColumn], path: str,
                       new_relation: bool, replacing: bool = False) -> tuple[writes.SchemaChange, bool]:
    """How the base's columns differ from the lake table's, and whether the base replaces the lake's
    rows. Another relation registered under the name (sql/migrations/017) owns none of them, evicted ones
    included (sql/migrations/018): when the lake table cannot take its rows beside them (a key column it lacks,
    a type it cannot widen to), its base replaces them, and as-of history starts again there (as for
    a lake moved aside). So does a base that answers a change of the table's key (`replacing`,
    sql/migrations/020). Otherwise the base outranks them key by key, so instants before it are still
    answered. Any other table with a type the lake cannot widen to is refused (ConfigError)."""
    if replacing:
        return writes.SchemaChange((), ()), True
    wanted = spark.range(0).transform(table_contract(columns)).schema
    try:
        change = writes.schema_change(spark, path, wanted, table.qualified_name)
    except ConfigError:
        if not new_relation:
            raise
        return writes.SchemaChange((), ()), True
    if new_relation and any(c.is_key and c.name in change.added for c in columns):
        return writes.SchemaChange((), ()), True
    return change, False


def _read_and_append(spark: SparkSession, conn: psycopg.Connection, jdbc: pg.JdbcTarget, table: RegisteredTable,
                     columns: Sequence[LakeColumn], path: str, kind: str, run_id: str, batch_id: int, token: str,
                     lake_keys: DataFrame | None, change: writes.SchemaChange, hook: faults.Hook,
                     points: str, new_relation: bool, replace: bool) -> None:
    """Reads the table in one exported snapshot and appends the base in one Delta commit (`replace`:
    the commit holds the base alone)."""
    app_id = commits.export_app_id(table.table_id)
    with conn.transaction():
        # The exporting transaction stays open until the write's tasks have imported its snapshot.
        conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        registry.guard_read(conn, table)  # before the snapshot; its ACCESS SHARE lock is held while the readers read
        snapshot = table_reader.export_snapshot(conn, table)
        # The rebase requests this snapshot answers; one made after it keeps the table pending. So does
        # DDL that committed between the caller's reading of the columns and this snapshot: the base
        # is written with the columns it was given, and must not settle the table (None never matches).
        rebase_serial = conn.execute("SELECT rebase_serial FROM coldharbor.tables WHERE table_id = %s",
                                     (table.table_id,)).fetchone()[0]
        if registry.lake_columns(conn, table) != list(columns):
            rebase_serial = None
        lake_values.refuse_in_table(conn, table, columns, LOAD_REFUSED)
        hook(f"{points}_after_snapshot")
        current = table_reader.read_table(spark, conn, jdbc, snapshot, table, columns, base_parallelism(spark))
        tiered = keeps_lake_only_rows(conn, table) and not new_relation
        # A base the lake holds alone (no lake table before it, or one it replaces) has one version
        # per key and nothing older: settled. Over rows the lake keeps, its rows rank like an export's.
        rows = (base_rows(current, lake_keys, columns, snapshot.taken_at, tiered=tiered)
                .transform(to_lake_rows(columns, batch_id, datetime.now(timezone.utc),
                                        settled=lake_keys is None)))
        rows = faults.inside_tasks(rows, f"{points}_during_write")
        with pg.lake_commit_lock(conn, table.table_id, path):
            if change.widened:
                writes.widen_columns(spark, path, change.widened, table.partition_by,
                                   {"operation": "coldharbor-widen", "run_id": run_id,
                                    "columns": dict(change.widened)})
            writes.append_batch(rows, path, app_id=app_id, batch_id=batch_id, partition_by=table.partition_by,
                              metadata={"app_id": app_id, "batch_id": batch_id, "run_id": run_id, "kind": kind,
                                        "table": table.qualified_name, "commit_token": token,
                                        "snapshot_at": snapshot.taken_at.isoformat(),
                                        "rebase_serial": rebase_serial, "replaces": replace},
                              add_columns=bool(change.added or change.metadata_added),
                              stats_columns=[*table.key_columns, *table.sort_by], replace=replace)


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


def finish_if_committed(spark: SparkSession, conn: psycopg.Connection, table: RegisteredTable, path: str,
                        batch_id: int, kind: str, commit_token: str | None) -> BaseResult | None:
    """Records a base whose Delta commit exists; None (and nothing recorded) when it does not."""
    entry = commits.batch_commit_entry(spark, path, commits.export_app_id(table.table_id), batch_id, commit_token,
                                    table.qualified_name)
    if entry is None:
        return None
    meta = json.loads(entry["user_metadata"])
    snapshot_at = datetime.fromisoformat(meta["snapshot_at"])
    rows = int(entry["metrics"].get("numOutputRows", 0))
    version = entry["version"]
    with conn.transaction():
        conn.execute("""UPDATE coldharbor.export_batches
                           SET state = 'flushed', lake_version = %s, row_count = %s, snapshot_at = %s,
                               finished_at = now()
                         WHERE table_id = %s AND batch_id = %s""", (version, rows, snapshot_at, table.table_id, batch_id))
        conn.execute("""UPDATE coldharbor.tables
                           SET base_version = %(version)s, base_at = %(at)s, base_rows = %(rows)s,
                               load_state = CASE WHEN rebase_serial = %(serial)s THEN 'loaded' ELSE load_state END,
                               loaded_version = CASE WHEN %(load)s THEN %(version)s ELSE loaded_version END,
                               loaded_at = CASE WHEN %(load)s THEN %(at)s ELSE loaded_at END
                         WHERE table_id = %(table)s""",
                     {"version": version, "at": snapshot_at, "rows": rows,
                      "load": starts_lake(kind, version, meta.get("replaces", False)),
                      "table": table.table_id, "serial": meta.get("rebase_serial", 0)})
    log.info("%s: %s landed as Delta version %s: %s rows read in the snapshot of %s", table.qualified_name,
             kind, version, rows, snapshot_at.isoformat())
    return BaseResult(table.qualified_name, kind, batch_id, rows, version)

"""The PostgreSQL half of a report's consistent read: every referenced table's dirty set, in one
snapshot (one REPEATABLE READ READ ONLY transaction on one connection), collected once.

A key is dirty for a report that pinned lake version V when one of its changes is not in lake@V:
still unflushed (`flushed_at IS NULL`), or flushed by a batch committed after V (`lake_version > V`:
the mark records the batch's version on its changes in the transaction that flushes the batch). Its image is the row as the snapshot sees it, or a delete marker.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime

import psycopg
import pyarrow as pa
import pyarrow.compute as pc
from psycopg import sql

from coldharbor.capture import registry
from coldharbor.capture.registry import LakeColumn, RegisteredTable
from coldharbor.export import base_state, batches, hot_reader, image_sql
from coldharbor.lake import commits, lake_values
from coldharbor.lake.lake_rows import DELETED
from coldharbor.runtime.errors import LakeUnavailableError

log = logging.getLogger(__name__)

_ARROW_TYPES = {
    "SHORT": pa.int16(), "INT": pa.int32(), "LONG": pa.int64(), "FLOAT": pa.float32(),
    "DOUBLE": pa.float64(), "BOOLEAN": pa.bool_(), "STRING": pa.string(), "DATE": pa.date32(),
    "TIMESTAMP_NTZ": pa.timestamp("us"), "TIMESTAMP": pa.timestamp("us", tz="UTC"), "BINARY": pa.binary(),
}
HOT_FETCH_ROWS = 50_000


@dataclass(frozen=True)
class HotTable:
    table: RegisteredTable
    columns: tuple[LakeColumn, ...]
    images: pa.Table                   # dirty keys: the columns plus _ch_deleted
    unexported_since: datetime | None  # earliest change not in the pinned lake version
    hot_only: bool = False             # images hold the whole table (the lake was not read)
    load_pending: bool = False         # lake@V lacks the table's initial load or a rebase's base: hot_only,
                                       # or (`reads_evicted_rows`) images hold the whole table
    lake_ahead: str | None = None      # hot_only because the lake is ahead of PostgreSQL: why (`lake_ahead`)
    known_from: datetime | None = None  # the initial load's snapshot time: the lake knows nothing before
    pinned_version: int | None = None   # the lake version the report reads
    rebase_windows: tuple[base_state.RebaseWindow, ...] = ()  # times the lake lacks PostgreSQL's values
    history_from: datetime | None = None  # a compaction's cutoff (sql/migrations/025): older versions may be gone

    @property
    def answerable_from(self) -> datetime | None:
        """The oldest instant an as-of read of the table can be answered for, as far as the registry
        knows (its load, what compaction kept); a span of changes may still hold it."""
        known = [t for t in (self.known_from, self.history_from) if t is not None]
        return max(known) if known else None

    @property
    def reads_evicted_rows(self) -> bool:
        """Pending, yet read with the lake: rows evicted from PostgreSQL live there alone. Every row
        PostgreSQL holds is an image (its key dirty), so lake@V gives only the keys PostgreSQL lacks
        and no unexported change touched: the evicted rows (`_evicted_rows_in_lake`)."""
        return self.load_pending and not self.hot_only

    @property
    def postgres_alone(self) -> bool:
        """Served from PostgreSQL alone while the lake could be read (`served_from_postgres`)."""
        return self.lake_ahead is not None or (self.load_pending and self.hot_only)

    @property
    def open_window(self) -> base_state.RebaseWindow | None:
        """The rebase no base has answered yet (the table is pending for it), if any."""
        return next((w for w in self.rebase_windows if w.settled_at is None), None)

    def hiding_window(self, instant: datetime) -> base_state.RebaseWindow | None:
        """The rebase window for which lake@pinned_version, read as of `instant`, misses values: one
        that holds the instant before one it hides only because its base is not in that version."""
        hiding = [w for w in self.rebase_windows if w.hides(instant, self.pinned_version, self.known_from)]
        return next((w for w in hiding if w.settled_at is None or instant < w.settled_at), next(iter(hiding), None))


@dataclass(frozen=True)
class HotSnapshot:
    taken_at: datetime
    tables: Mapping[int, HotTable]


def arrow_type(lake_type: str) -> pa.DataType:
    if lake_type.startswith("DECIMAL("):
        precision, scale = lake_type[len("DECIMAL("):-1].split(",")
        return pa.decimal128(int(precision), int(scale))
    return _ARROW_TYPES[lake_type]


def dirty_images_query(table: RegisteredTable, columns: Sequence[LakeColumn], pinned_version: int,
                       relation: sql.Composable | None = None) -> sql.Composed:
    """The dirty keys of lake@pinned_version and their images, as the export defines them
    (`hot_reader.dirty_images_query`), read through psycopg."""
    return hot_reader.dirty_images_query(table, columns, since_version=pinned_version, changed_at=None,
                                         relation=relation, through_jdbc=False)


def deleted_keys_query(table: RegisteredTable, columns: Sequence[LakeColumn], pinned_version: int,
                       relation: sql.Composable | None = None) -> sql.Composed:
    """The dirty keys PostgreSQL no longer holds, as delete markers (`dirty_images_query`'s deleted rows)."""
    return sql.SQL("SELECT * FROM ({images}) images WHERE {deleted}").format(
        images=dirty_images_query(table, columns, pinned_version, relation), deleted=sql.Identifier(DELETED))


def whole_table_query(table: RegisteredTable, columns: Sequence[LakeColumn]) -> sql.Composed:
    """Best effort without the lake: the rows the hot tier still holds."""
    def value_of(c: LakeColumn) -> sql.Composable:
        return sql.SQL("t.{}").format(sql.Identifier(c.name))

    return sql.SQL("SELECT {columns}, false AS {deleted} FROM {table} t").format(
        columns=image_sql.checked_select(columns, value_of, through_jdbc=False), deleted=sql.Identifier(DELETED),
        table=table.identifier)


def _unexported_since(conn: psycopg.Connection, table: RegisteredTable, pinned_version: int) -> datetime | None:
    """Earliest time of a change lake@pinned_version lacks: a bound for as-of reads."""
    flushed_after = conn.execute(
        "SELECT min(oldest_change_at) FROM coldharbor.export_batches "
        "WHERE table_id = %s AND state = 'flushed' AND lake_version > %s",
        (table.table_id, pinned_version)).fetchone()[0]
    dirty = hot_reader.oldest_dirty_change(conn, table.table_id)
    return min((t for t in (dirty, flushed_after) if t is not None), default=None)


def _fetch_arrow(conn: psycopg.Connection, query: sql.Composed, table: RegisteredTable,
                 columns: Sequence[LakeColumn]) -> pa.Table:
    """The rows of `query` (the columns, `lake_values.PROBLEM`, _ch_deleted), checked by `_refuse_unheld`."""
    schema = pa.schema([pa.field(c.name, arrow_type(c.lake_type)) for c in columns]
                       + [pa.field(lake_values.PROBLEM, pa.string()), pa.field(DELETED, pa.bool_())])
    batches = []
    with conn.cursor(name="coldharbor_hot_images") as cur:  # server-side: bounded client memory
        cur.itersize = HOT_FETCH_ROWS
        cur.execute(query)
        while rows := cur.fetchmany(HOT_FETCH_ROWS):
            batches.append(pa.record_batch([pa.array(col, type=f.type) for col, f in zip(zip(*rows), schema)],
                                           schema=schema))
    return _refuse_unheld(pa.Table.from_batches(batches, schema=schema), table)


REPORT_REFUSED = "the report was not run and nothing was written; change the value (the table's export waits for it too)"


def _refuse_unheld(images: pa.Table, table: RegisteredTable) -> pa.Table:
    """The images without `lake_values.PROBLEM`; UnrepresentableValueError, naming the first, when a
    row holds a value a report cannot hold. A deleted key holding such a value is no dirty key:
    the lake, which a dirty key hides rows of, never held it."""
    problem = images[lake_values.PROBLEM]
    found = pc.filter(problem, pc.and_(pc.is_valid(problem), pc.invert(images[DELETED])))
    if len(found):
        raise lake_values.refusal(table.qualified_name, found[0].as_py(), REPORT_REFUSED, through_jdbc=False)
    return images.filter(pc.is_null(problem)).drop_columns([lake_values.PROBLEM])


def _flushed_before(conn: psycopg.Connection, table: RegisteredTable) -> bool:
    """Whether a batch of changes was flushed to the lake (then rows may have been evicted since, and
    PostgreSQL alone no longer holds the table)."""
    return conn.execute("SELECT EXISTS (SELECT 1 FROM coldharbor.export_batches "
                        "WHERE table_id = %s AND state = 'flushed' AND kind = 'changes')",
                        (table.table_id,)).fetchone()[0]


def _evicted_rows_in_lake(conn: psycopg.Connection, table: RegisteredTable, version: int | None) -> bool:
    """Whether lake@version holds rows evicted from PostgreSQL (`coldharbor.tables.evicted_at`), which
    live there alone: then even a pending table is not PostgreSQL alone. Registering another relation
    under the name (sql/migrations/017) clears it: its base marks the old relation's keys deleted, and until it
    lands the lake's keys are the old relation's."""
    return version is not None and base_state.has_evicted_rows(conn, table.table_id)


def _pending_with_evicted_rows(conn: psycopg.Connection, table: RegisteredTable, columns: tuple[LakeColumn, ...],
                               version: int, relation: sql.Composable) -> pa.Table:
    """A pending table's images when rows evicted from it live in lake@version alone: every row
    PostgreSQL holds (lake@V lacks the base that carries what DDL did to them), and a delete marker
    for every key an unexported change deleted (its lake row must not come back). The unified view
    then adds the lake's rows of the other keys: the evicted ones, as the lake holds them."""
    whole = _fetch_arrow(conn, whole_table_query(table, columns), table, columns)
    deleted = _fetch_arrow(conn, deleted_keys_query(table, columns, version, relation), table, columns)
    return pa.concat_tables([whole, deleted])


def _load_not_in(load: base_state.LoadState, version: int | None,
                 windows: Sequence[base_state.RebaseWindow] = ()) -> bool:
    """Whether lake@version lacks the table's initial load or the base of a rebase (still pending,
    or landed after V: the rows DDL changed are then in neither lake@V nor the dirty set)."""
    if load.pending or any(w.lacks_base(version, load.loaded_at) for w in windows):
        return True
    return load.loaded_version is not None and (version is None or version < load.loaded_version)


def _missing_base(load: base_state.LoadState, version: int | None,
                  windows: Sequence[base_state.RebaseWindow]) -> str:
    """What lake@version lacks, for `_load_not_in`'s log line: the initial load, or the new base of a
    rebase (naming why it was asked for)."""
    window = next((w for w in windows if w.settled_at is None or w.lacks_base(version, load.loaded_at)), None)
    if window is not None:
        return f"the new base of a rebase ({window.reason})"
    return "its initial load"


def lake_ahead(conn: psycopg.Connection, table: RegisteredTable, lake_batch_id: int | None,
               version: int | None = None) -> str | None:
    """The export's refusal (`commits.check_batch_id`) when the lake holds a batch id this snapshot of
    PostgreSQL never used (it was restored from a backup), else None. `lake_batch_id` is the lake's
    `committed_txn_version`, read before the snapshot. The lake is then not PostgreSQL's past, and
    PostgreSQL alone is the table, unless it is tiered: its evicted rows live in the lake alone, and
    the report is refused.

    A lake table at pinned `version` in which the registration never committed (`commits.foreign_lake`:
    another registration's) is not the table's past either; the export refuses to write there, so
    none of the table's rows ever left PostgreSQL, which alone is the table, tiered or not."""
    if version is not None and lake_batch_id is None:
        return (f"the lake table of {table.quoted_name} was not written by its registration (an earlier "
                "registration's, or another table's; the export refuses to write there and names the folder)")
    try:
        commits.check_batch_id(lake_batch_id, batches.next_batch_id(conn, table.table_id), table.qualified_name)
    except commits.LakeAheadError as exc:
        if base_state.keeps_lake_only_rows(conn, table):
            raise commits.LakeAheadError(table.qualified_name, exc.batch_id, f"{exc.detail}; rows evicted from "
                                      "PostgreSQL live in the lake alone, so no report can read the table") from None
        return str(exc)
    return None


def read(conn: psycopg.Connection, pinned: Mapping[int, int | None], tables: Sequence[RegisteredTable],
         hot_only: bool = False, lake_batches: Mapping[int, int | None] | None = None) -> HotSnapshot:
    """Every table's dirty set against its pinned lake version (None: no lake table yet), in one
    snapshot. With `hot_only` the lake is not read and each table comes whole from PostgreSQL. With
    `lake_batches` (each table's `commits.committed_txn_version`, read after the pins) a table whose lake
    is ahead of PostgreSQL comes whole from PostgreSQL too (`lake_ahead`)."""
    with conn.transaction():
        conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
        for table in tables:
            registry.guard_read(conn, table)  # before the snapshot
        return read_in_transaction(conn, pinned, tables, hot_only, lake_batches)


def read_in_transaction(conn: psycopg.Connection, pinned: Mapping[int, int | None],
                        tables: Sequence[RegisteredTable], hot_only: bool = False,
                        lake_batches: Mapping[int, int | None] | None = None) -> HotSnapshot:
    """`read`, inside a REPEATABLE READ transaction the caller opened (and may have exported)."""
    taken_at = conn.execute("SELECT statement_timestamp()").fetchone()[0]  # takes the snapshot
    result: dict[int, HotTable] = {}
    for table in tables:
        columns = tuple(registry.lake_columns(conn, table))
        version = None if hot_only else pinned[table.table_id]
        load = base_state.load_state(conn, table.table_id)
        windows = base_state.rebase_windows(conn, table.table_id)
        kept = base_state.history_kept_from(conn, table.table_id)
        if not hot_only and version is None and _flushed_before(conn, table):
            raise LakeUnavailableError(f"the lake table of {table.qualified_name} is missing, but changes of it "
                                       "were flushed there; the lake location is wrong or was removed")
        ahead = (None if hot_only or lake_batches is None
                 else lake_ahead(conn, table, lake_batches[table.table_id], version))
        pending = not (hot_only or ahead) and _load_not_in(load, version, windows)
        if pending and _evicted_rows_in_lake(conn, table, version):
            images = _pending_with_evicted_rows(conn, table, columns, version,
                                                hot_reader.source_relation(conn, table))
            result[table.table_id] = HotTable(table, columns, images, None, load_pending=True,
                                              known_from=load.known_from, pinned_version=version,
                                              rebase_windows=windows, history_from=kept)
            log.info("%s: %s not in lake version %s, whose rows evicted from PostgreSQL live there alone; served "
                     "as PostgreSQL's %s rows plus the lake's rows of the keys PostgreSQL lacks and no unexported "
                     "change touched", table.qualified_name, _missing_base(load, version, windows), version,
                     images.num_rows)
            continue
        if hot_only or ahead or pending:
            # Invariant 12: until the initial load is in lake@V, PostgreSQL alone is the table.
            images = _fetch_arrow(conn, whole_table_query(table, columns), table, columns)
            result[table.table_id] = HotTable(table, columns, images, None, hot_only=True,
                                              load_pending=not (hot_only or ahead), lake_ahead=ahead,
                                              known_from=load.known_from, pinned_version=version,
                                              rebase_windows=windows, history_from=kept)
            if ahead:
                log.warning("%s; served from PostgreSQL alone (%s rows) until then", ahead, images.num_rows)
            elif not hot_only:
                log.info("%s: %s not in lake version %s; served from PostgreSQL alone (%s rows)",
                         table.qualified_name, _missing_base(load, version, windows), version, images.num_rows)
            continue
        since = -1 if version is None else version
        images = _fetch_arrow(conn, dirty_images_query(table, columns, since, hot_reader.source_relation(conn, table)),
                              table, columns)
        result[table.table_id] = HotTable(table, columns, images, _unexported_since(conn, table, since),
                                          known_from=load.known_from, pinned_version=version, rebase_windows=windows, history_from=kept)
        log.info("%s: %s dirty keys against lake version %s", table.qualified_name, images.num_rows, version)
    return HotSnapshot(taken_at, result)

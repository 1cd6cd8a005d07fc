"""Incremental refresh of a report (`-- refresh: incremental`, issue 23 part 2).

A report of the shape `coldharbor.serve.incremental_shape` takes is a sum over rows: each group's row
count, and per aggregate its count of values, their sum, their extreme. So the report after some
changes is the report before them plus each change's own contribution, the row it removed counted
negative and the row it left positive. Those rows come from PostgreSQL's change log, not the lake:
a table with exact history logs the row each insert and update leaves (sql/migrations/021) and, once a report
refreshes incrementally over it, the row each update and delete removes (sql/migrations/028). A key's changes
since the last refresh contribute minus its first change's old row and plus its last change's new
row; that holds only when they chain (each one's row before is the row the one before it left,
`image_sql._chained`, as the export checks), and a trail through the same changes that chains
starts and ends where the true order does (or, for a key that came back to where it was, adds
nothing either way).

State, per report target, in the lake (`<root>/_coldharbor/incremental/<target>`, a Delta table of
one row per group with its partial aggregates): the report over the lake's rows up to a lake
version V (the *cold* part), and V, the batch that wrote it, a fingerprint of the report and when
the state was built (the commit's user metadata). A refresh, one run per target at a time:

  1. pin the lake version P and read its newest committed batch id, then take one PostgreSQL
     snapshot, as a report does; every batch committed in lake@P must be marked there (else an
     export is between its commit and its mark: a full refresh this time);
  2. the window (V, P] must hold every change (no batch pruned), no base (initial load, resync, a
     rebase after DDL) and no purge; else, or with no state, or another fingerprint, the cold part
     is rebuilt from lake@P (a purge's commit included);
  3. the changes after V give signed rows: the ones in lake@P move the cold part to P, the later
     ones (dirty, or flushed after P) are applied on top for the report now;
  4. the report (one atomic write, as a full refresh's), then the new state, are written.

A MIN or MAX whose extreme a change removed cannot be updated from the changes: the cold part is
then rebuilt from the lake; if it is the changes not in lake@P that removed it, this run is a full
refresh. Exported changes that cannot be applied (a key whose changes do not chain, a row missing)
rebuild the cold part; dirty ones make the run a full refresh, saying why, as do an AVG of
integers past 2^53 (Spark adds them in doubles) and SUM/AVG of floating-point values.
"""

from __future__ import annotations

import contextlib
import logging
import time
import zlib
from collections.abc import Sequence
from dataclasses import dataclass

import psycopg
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from coldharbor.capture import registry
from coldharbor.capture.registry import LakeColumn, RegisteredTable
from coldharbor.export.base_state import keeps_lake_only_rows
from coldharbor.lake import commits, delta, lake_values
from coldharbor.lake.lake_rows import column
from coldharbor.lake.unified import cold_live
from coldharbor.runtime import pg
from coldharbor.runtime.spark import local_checkpoint
from coldharbor.serve import sql_guard
from coldharbor.serve.incremental_changes import COLD, HOT, SIGN, VALID, Window, read_window
from coldharbor.serve.incremental_merge import (
    aggregate,
    base_state,
    merge,
    project,
    refuse_inexact_sums,
    refuse_order_dependent_averages,
    state_query,
)
from coldharbor.serve.incremental_shape import IncrementalShape, NotIncremental, incremental_shape
from coldharbor.serve.incremental_state import Frontier, fingerprint, read_state, state_path, write_state
from coldharbor.serve.report_spec import ParamValues

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Outcome:
    rows: int               # report rows written
    detail: str             # how it was refreshed, for the run's record
    version: int            # the lake version the cold part now holds
    hot_rows: int           # signed rows of changes not in it (still dirty)


@contextlib.contextmanager
def _stage(what: str):
    """Logs how long a stage of the refresh took (where an incremental refresh spends its time)."""
    start = time.perf_counter()
    yield
    log.info("incremental refresh: %s took %.2f s", what, time.perf_counter() - start)


def eligible_table(conn: psycopg.Connection, table: RegisteredTable, columns: Sequence[LakeColumn]) -> None:
    """NotIncremental unless the table's changes carry the rows they remove and leave, and
    PostgreSQL holds every row of it (a key the lake alone holds could be inserted again)."""
    if table.source_kind != "table":
        raise NotIncremental(f"{table.qualified_name} is an entity schema")
    if table.history != "exact":
        raise NotIncremental(f"{table.qualified_name} does not keep exact history, whose logged rows incremental "
                             f"refresh applies: register it with p_history => 'exact'")
    if table.mode != "mirror" or keeps_lake_only_rows(conn, table):
        raise NotIncremental(f"{table.qualified_name} has rows in the lake alone (lake-first, tiered or evicted), "
                             "which an insert of their key can replace without a logged row to subtract")
    json_columns = [c.name for c in columns if c.pg_type == "json"]
    if json_columns:
        raise NotIncremental(f"{table.qualified_name} has a json column ({json_columns[0]}), whose logged rows "
                             "cannot be read back exactly")


def keep_old_images(conn: psycopg.Connection, table: RegisteredTable) -> bool:
    """Turns on old images for the table (sql/migrations/028); whether they were on before this call."""
    with conn.transaction():
        return conn.execute("SELECT coldharbor.keep_old_images(%s)", (table.table_id,)).fetchone()[0]


# ----------------------------------------------------------------------------------------- state


# -------------------------------------------------------------------------- the PostgreSQL side


# ------------------------------------------------------------------------------- the Spark side


# ------------------------------------------------------------------------------------- the run

def refresh(spark: SparkSession, conn: psycopg.Connection, report_sql: str, params: ParamValues,
            table: RegisteredTable, lake_root: str, target: str, write) -> Outcome:
    """The incremental refresh; `write(result)` writes the report atomically and returns its rows.
    NotIncremental: it cannot be done this time (the caller refreshes in full), saying why. One run
    of a target at a time moves its state (a session lock on the target's name); another run of it
    meanwhile is a full refresh."""
    parsed = sql_guard.parse_query(report_sql)
    shape = incremental_shape(parsed)
    columns = tuple(registry.lake_columns(conn, table))
    eligible_table(conn, table, columns)
    with pg.advisory_lock(conn, "incremental_state", zlib.crc32(target.encode()) & 0x7FFFFFFF) as acquired:
        if not acquired:
            raise NotIncremental("another run of it is refreshing its state")
        return _refresh(spark, conn, parsed, shape, columns, report_sql, params, table, lake_root, target, write)


def _refresh(spark: SparkSession, conn: psycopg.Connection, parsed: sql_guard.ParsedQuery, shape: IncrementalShape,
             columns: Sequence[LakeColumn], report_sql: str, params: ParamValues, table: RegisteredTable,
             lake_root: str, target: str, write) -> Outcome:
    if not keep_old_images(conn, table):
        log.info("%s: its changes log the rows they remove from now on (sql/migrations/028)", table.qualified_name)
    path = state_path(lake_root, target)
    prints = fingerprint(report_sql, params, table, columns)
    stored, why_none = _stored_state(spark, path, prints)
    lake_path = table.lake_path(lake_root)
    # As a report pins its versions: the lake first, then PostgreSQL's snapshot.
    pinned = delta.pin_version(spark, lake_path)
    committed = commits.committed_txn_version(spark, lake_path, commits.export_app_id(table.table_id))
    window = _changes_since(conn, table, columns, stored, pinned, committed, why_none)
    changes = window.changes
    contract = [c.name for c in columns]
    query = state_query(parsed, shape, table)
    with _stage("planning"):
        signed = _frame(spark, changes.drop_columns([lake_values.PROBLEM, VALID]))
        report_schema = aggregate(spark, signed.select(*map(column, contract)), table,
                                  sql_guard.resolve(parsed, [table]), params).schema
        refuse_inexact_sums(shape, aggregate(spark, signed.drop(COLD, HOT).limit(0), table, query, params).schema)

    def rebuild() -> DataFrame:
        rows = delta.read_version(spark, lake_path, window.version).transform(
            cold_live(columns, split=delta.settled_split(lake_path, window.version)))
        # Pinned now: the view it reads is registered again for the next aggregate, and a Spark
        # Connect DataFrame is analysed again each time it runs.
        return local_checkpoint(base_state(shape, aggregate(spark, rows.withColumn(SIGN, F.lit(1)), table, query,
                                                            params)), eager=True)

    if window.cold_valid is None:
        state, frontier = stored
        with _stage("applying the exported changes"):
            cold, stale = merge(shape, state, aggregate(spark, signed.filter(column(COLD)), table, query, params))
        how = (f"incrementally: {len(changes)} signed rows of changes since lake version {frontier.version} "
               f"(now {window.version})")
        if stale:
            how = f"from the lake at version {window.version} (a change removed a MIN or MAX)"
            with _stage("rebuilding from the lake"):
                cold = rebuild()
    else:
        log.info("report %s: the state is rebuilt from the lake at version %s: %s", target, window.version,
                 window.cold_valid)
        with _stage("rebuilding from the lake"):
            cold = rebuild()
        how = f"from the lake at version {window.version} and the changes since ({window.cold_valid})"
    with _stage("applying the changes not exported yet"):
        now, stale = merge(shape, cold, aggregate(spark, signed.filter(column(HOT)), table, query, params))
    if stale:
        raise NotIncremental("a change not in the lake yet removed a group's MIN or MAX")
    refuse_order_dependent_averages(shape, report_schema, now)
    with _stage("writing the report"):
        written = write(project(spark, shape, now, report_schema))
    with _stage("writing the state"):
        write_state(cold, path, Frontier(window.version, window.batch_id, prints, window.now))
    hot = sum(1 for c in changes[COLD].to_pylist() if not c)
    return Outcome(written, f"refreshed {how}", window.version, hot)


def _stored_state(spark: SparkSession, path: str, prints: str):
    """The report's stored state and frontier, or None and why there is none to use (none yet, or
    one kept for another SQL, other parameters or other columns)."""
    with _stage("reading the state"):
        stored = read_state(spark, path)
    if stored is not None and stored[1].fingerprint != prints:
        return None, "the report's SQL, its parameters or the table's columns changed"
    return stored, "no state yet"


def _changes_since(conn: psycopg.Connection, table: RegisteredTable, columns: Sequence[LakeColumn], stored,
                   pinned: int | None, committed: int | None, why_none: str) -> Window:
    """The table's signed changes since the stored frontier (all of them from the lake at `pinned`
    when there is no frontier), read in one PostgreSQL snapshot; NotIncremental when they cannot be
    applied to the state."""
    with _stage("reading the changes from PostgreSQL"):
        window = read_window(conn, table, columns, stored[1] if stored else None, pinned, committed, why_none)
        if isinstance(window, Window) and window.cold_valid is None and _invalid_keys(window.changes):
            # Keys whose exported changes cannot be applied: the lake holds their rows at P.
            window = read_window(conn, table, columns, None, pinned, committed,
                                 f"{_invalid_keys(window.changes)} key(s) changed since the last refresh have "
                                 "exported changes whose rows cannot be applied")
    if isinstance(window, str):
        raise NotIncremental(window)
    changes = window.changes
    invalid = _invalid_keys(changes)
    if invalid:
        raise NotIncremental(f"{invalid} key(s) changed since the last export have changes whose rows cannot be "
                             "applied (out of order in their transaction, or a row missing or not held by the lake)")
    problems = changes[lake_values.PROBLEM].drop_null()
    if len(problems):
        raise NotIncremental(f"a changed row holds a value the lake does not: {problems[0].as_py()}")
    return window


def _invalid_keys(changes: pa.Table) -> int:
    return len(changes) - pc.sum(changes[VALID].cast(pa.int64())).as_py() if len(changes) else 0


def _frame(spark: SparkSession, rows: pa.Table) -> DataFrame:
    if rows.num_rows == 0:
        from pyspark.sql.pandas.types import from_arrow_schema

        return spark.createDataFrame([], from_arrow_schema(rows.schema))
    return local_checkpoint(spark.createDataFrame(rows), eager=False)

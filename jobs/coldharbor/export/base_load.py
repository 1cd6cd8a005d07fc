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
from coldharbor.export.base_sequences import advance_change_sequence, lake_sequences
from coldharbor.export.base_state import (
    answers_new_relation,
    keeps_lake_only_rows,
    load_state,
    replaces_lake,
    starts_lake,
)
from coldharbor.lake import commits, lake_values, writes
from coldharbor.lake.lake_rows import CHANGED_AT, DELETED, FIRST_CHANGED_AT, SEQ, column, to_lake_rows
from coldharbor.lake.unified import table_contract
from coldharbor.runtime import faults, pg
from coldharbor.runtime.errors import ConfigError, LakeUnavailableError, TableBusyError
from coldharbor.runtime.spark_parallelism import base_parallelism

log = logging.getLogger(__name__)

KINDS = ("load", "resync")
LOAD_REFUSED = "nothing of the table was written. Change such values; the next run reads the table again"


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

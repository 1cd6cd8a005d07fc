"""Reads the dirty set of one table from PostgreSQL: the current row images and the change ids.

`dirty_images_query` is the one definition of "the dirty keys of a table and their images in one
snapshot": the export reads it for the unflushed changes, a report (serve/hot_snapshot) for the
changes its pinned lake version lacks (invariant 6).

For the export, everything comes from ONE snapshot: the export's transaction exports it, its JDBC readers import it
and its intent (the batch's change ids) is read in it. So a change either is in the batch with the
image that includes it, or it is not in the batch at all (invariant 1).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

import psycopg
from psycopg import sql
from pyspark.sql import DataFrame, SparkSession

from coldharbor.capture.registry import LakeColumn, RegisteredTable
from coldharbor.export.image_sql import (
    _chained,
    _image_hash,
    _image_readable,
    _image_usable,
    checked_select,
    dirty_changes,
    exact_images_query,
    key_column,
)
from coldharbor.lake import lake_values
from coldharbor.lake.lake_rows import CHANGED_AT, DELETED, FIRST_CHANGED_AT, SEQ, column
from coldharbor.runtime import faults, pg
from coldharbor.runtime.errors import ReportError
from coldharbor.runtime.pg import JdbcTarget
from coldharbor.runtime.spark import local_checkpoint
from coldharbor.runtime.spark_parallelism import parallelism as spark_parallelism

JDBC_FETCH_SIZE = 20_000
# The dirty-set aggregate spills to disk with PostgreSQL's default 4MB; one export session may use more.
EXPORT_WORK_MEM = "256MB"
# A dirty set of at most this many changes is read by one JDBC reader: each more reader is a Spark
# task in the read, the checkpoint, the count and the write (and a file more in the lake), which on a
# per-minute cycle of many small tables costs more than the rows take to read (bench.engine).
ONE_READER_CHANGES = 50_000


def commit_times_tracked(conn: psycopg.Connection) -> bool:
    """Whether the server runs with track_commit_timestamp = on."""
    return conn.execute("SELECT current_setting('track_commit_timestamp')::bool").fetchone()[0]


def change_time(conn: psycopg.Connection) -> sql.Composable:
    """When a change_log row's change happened: its commit time when the server tracks commit
    timestamps (as-of reports need it), else the start of its transaction."""
    if commit_times_tracked(conn):
        return sql.SQL("coalesce(pg_xact_commit_timestamp(xmin), created_at)")
    return sql.SQL("created_at")


def oldest_dirty_change(conn: psycopg.Connection, table_id: int, up_to: datetime | None = None) -> datetime | None:
    """When the table's oldest change not yet in the lake happened (`change_time`), among those that
    can have happened by `up_to` (a change commits after its transaction starts: `created_at`)."""
    bound = sql.SQL("") if up_to is None else sql.SQL(" AND created_at <= {}").format(sql.Literal(up_to))
    return conn.execute(sql.SQL("SELECT min({change_time}) FROM coldharbor.change_log "
                                "WHERE table_id = {table_id} AND flushed_at IS NULL{bound}").format(
        change_time=change_time(conn), table_id=sql.Literal(table_id), bound=bound)).fetchone()[0]


def require_commit_times(conn: psycopg.Connection) -> None:
    """As-of reads place each change at its commit: without commit timestamps a change's time is
    its transaction's start, and a transaction that committed after the instant would be counted."""
    if not commit_times_tracked(conn):
        raise ReportError("as-of reports need PostgreSQL's track_commit_timestamp = on, and it is off (change "
                          "times would be transaction starts: a transaction committed after the instant could be "
                          "counted in); set track_commit_timestamp = on in postgresql.conf (or start the server "
                          "with -c track_commit_timestamp=on) and restart PostgreSQL; nothing was written")


def source_relation(conn: psycopg.Connection, table: RegisteredTable,
                    dirty_row_ids: str = "SELECT dk._ch_k0 FROM dirty dk") -> sql.Composable:
    """What the dirty keys are joined to: the table itself, or for an entity schema the
    flattening of just the dirty records (one grouped pass over their eav_data rows instead of
    the view's aggregate per record). `dirty_row_ids` selects those records from the CTE `dirty`
    of `dirty_images_query` (its first typed key, the row_id)."""
    if table.source_kind != "entity":
        return table.identifier
    flatten = conn.execute("SELECT coldharbor.entity_flatten_sql(%s, %s)",
                           (table.table_name, dirty_row_ids)).fetchone()[0]
    return sql.SQL("({})").format(sql.SQL(flatten))


def _changes_not_in(table: RegisteredTable, since_version: int | None) -> sql.Composed:
    """FROM and WHERE of the change rows `c` that lake@since_version does not hold: the unflushed
    ones, and with a version those a later batch flushed (invariant 6). The two kinds are read apart
    and appended (not one OR): each then keeps its index, the dirty rows' partial one and the lake
    version's BRIN (20,000 dirty keys among 3.5M logged changes: 0.1 s, against 1.1 s for the OR's
    sequential scan). None: the unflushed rows alone, read straight from the log."""
    if since_version is None:
        return sql.SQL("coldharbor.change_log c WHERE {}").format(dirty_changes(table))
    return sql.SQL("""(SELECT key, id, created_at FROM coldharbor.change_log
                  WHERE table_id = {table_id} AND flushed_at IS NULL
                 UNION ALL
                 SELECT key, id, created_at FROM coldharbor.change_log
                  WHERE table_id = {table_id} AND lake_version > {version}) c WHERE true""").format(
        table_id=sql.Literal(table.table_id), version=sql.Literal(since_version))


def dirty_images_query(table: RegisteredTable, columns: Sequence[LakeColumn], *, since_version: int | None = None,
                       changed_at: sql.Composable | None = sql.SQL("created_at"),
                       relation: sql.Composable | None = None, part: int = 0, parts: int = 1,
                       through_jdbc: bool = True) -> sql.Composed:
    """The one definition of "the dirty keys of a table and their images in one snapshot", which
    the export and the read path share: one row per key with a change lake@since_version lacks
    (`_changes_not_in`), its row in `relation` now (the table, or an entity's flattening) or a delete
    marker (`_ch_deleted`, the key columns from the change log), and its `lake_values.PROBLEM`.

    The changes are grouped by the typed key values (cheaper than by the jsonb key; key identity is
    canonical, invariant 15). With `changed_at` (the export) each row also carries its newest
    change id and time and its first change's time, both ordered aggregates in one order so
    PostgreSQL sorts once; a report needs only the images (`changed_at` None). With `parts` > 1
    this reads the share `part` of the dirty keys (by a hash of the key, so all changes of a key are
    together). The export of a table with exact history reads every change's image instead
    (`exact_images_query`).
    """
    keys = [c for c in columns if c.is_key]
    share = _share(part, parts)
    if table.history == "exact" and since_version is None:
        return exact_images_query(table, columns, changed_at, relation, share)

    def value_of(c: LakeColumn) -> sql.Composable:
        return (sql.SQL("d.{}").format(key_column(keys.index(c))) if c.is_key
                else sql.SQL("t.{}").format(sql.Identifier(c.name)))

    if changed_at is None:
        aggregates = outputs = sql.SQL("")
    else:
        aggregates = sql.SQL(""",
                   max(c.id) AS change_seq,
                   (array_agg({change_time} ORDER BY c.id DESC))[1] AS changed_at,
                   min({change_time}) AS first_changed_at""").format(change_time=changed_at)
        outputs = sql.SQL(""",
               d.change_seq AS {seq},
               d.changed_at AS {changed_at},
               d.first_changed_at AS {first_changed_at}""").format(
            seq=sql.Identifier(SEQ), changed_at=sql.Identifier(CHANGED_AT),
            first_changed_at=sql.Identifier(FIRST_CHANGED_AT))
    return sql.SQL("""
        WITH dirty AS (
            SELECT {typed_keys}{aggregates}
            FROM {changes}{share}
            GROUP BY {group_by})
        SELECT {columns},
               t.{first_key} IS NULL AS {deleted}{outputs}
        FROM dirty d LEFT JOIN {table} t ON {key_match}""").format(
        typed_keys=sql.SQL(", ").join(
            sql.SQL("(c.key ->> {})::{} AS {}").format(sql.Literal(c.name), sql.SQL(c.pg_type), key_column(i))
            for i, c in enumerate(keys)),
        aggregates=aggregates, outputs=outputs, changes=_changes_not_in(table, since_version), share=share,
        group_by=sql.SQL(", ").join(sql.SQL(str(i + 1)) for i in range(len(keys))),
        columns=checked_select(columns, value_of, through_jdbc=through_jdbc),
        first_key=sql.Identifier(keys[0].name), deleted=sql.Identifier(DELETED),
        table=relation or table.identifier,
        key_match=sql.SQL(" AND ").join(sql.SQL("t.{} = d.{}").format(sql.Identifier(c.name), key_column(i))
                                        for i, c in enumerate(keys)))


def _share(part: int, parts: int) -> sql.Composable:
    """The change rows of the share `part` of `parts` of the dirty keys (all changes of a key together)."""
    if parts == 1:
        return sql.SQL("")
    return sql.SQL(" AND (jsonb_hash(c.key) & 2147483647) % {} = {}").format(sql.Literal(parts), sql.Literal(part))


def intent_query(table: RegisteredTable) -> sql.Composed:
    """The batch's change ids, their count and the oldest change time: the dirty set the
    readers of the same snapshot see (`dirty_changes`), in one pass."""
    return sql.SQL("SELECT coalesce(array_agg(c.id), '{{}}'), count(*), min(c.created_at) "
                   "FROM coldharbor.change_log c WHERE {}").format(dirty_changes(table))


def read_dirty_images(spark: SparkSession, conn: psycopg.Connection, jdbc: JdbcTarget, snapshot_id: str,
                      table: RegisteredTable, columns: Sequence[LakeColumn]) -> DataFrame:
    """The dirty images as of the exported snapshot `snapshot_id`, read once and pinned in Spark;
    UnrepresentableValueError when one holds a value the lake does not (`refuse_unheld`).

    One JDBC read per core (one for a dirty set of at most ONE_READER_CHANGES changes), each
    importing the same snapshot (so together they are one consistent read of disjoint key shares),
    then an eager local checkpoint: a JDBC DataFrame re-runs its query on every action, and the rows
    written to the lake must come from this single read. `conn` is in the exported snapshot.
    """
    parts = 1 if dirty_changes_at_most(conn, table, ONE_READER_CHANGES) else spark_parallelism(spark)
    relation = source_relation(conn, table)
    images = None
    for part in range(parts):
        query = dirty_images_query(table, columns, changed_at=change_time(conn), relation=relation, part=part,
                                   parts=parts).as_string(conn)
        share = snapshot_read(spark, jdbc, query, snapshot_id, f"SET work_mem = '{EXPORT_WORK_MEM}'; ")
        images = share if images is None else images.union(share)
    faults.from_environment("before_jdbc_read")  # the readers connect in the checkpoint's tasks
    images = local_checkpoint(images, eager=True)
    if not lake_values.has_limits(columns, through_jdbc=True):
        return images.drop(lake_values.PROBLEM)
    return refuse_unheld(images, table)


EXPORT_REFUSED = ("the table's changes were not exported (nothing was written or marked flushed; the other tables "
                  "still export) and wait until the value is changed: the next export carries them")

# A lake-first table refuses the UPDATE or DELETE that would change the value (sql/migrations/027).
LAKE_FIRST_WAY_OUT = ("; it is lake-first, which refuses updates and deletes: register it with "
                      "coldharbor.register_table({table}, p_mode => 'mirror'), change or delete the row, and register "
                      "it again with p_mode => 'lake_first'")


def refuse_unheld(images: DataFrame, table: RegisteredTable) -> DataFrame:
    """The images without `lake_values.PROBLEM`; UnrepresentableValueError, naming the first, when
    a row holds a value the lake does not. A delete marker of a key holding such a value is left
    out of the batch (its change is still marked): the lake never held that key."""
    problem = column(lake_values.PROBLEM)
    found = images.filter(problem.isNotNull() & ~column(DELETED)).select(problem).first()
    if found is not None:
        raise lake_values.refusal(table.qualified_name, found[0], EXPORT_REFUSED + (
            LAKE_FIRST_WAY_OUT.format(table=table.name_literal) if table.mode == "lake_first" else ""))
    return images.filter(problem.isNull()).drop(lake_values.PROBLEM)


def snapshot_read(spark: SparkSession, jdbc: JdbcTarget, query: str, snapshot_id: str, settings: str = "",
                  lock_timeout: str | None = None) -> DataFrame:
    """One JDBC reader of `query` inside the exported snapshot `snapshot_id` (lazy: each action
    re-reads, importing the snapshot again; its exporter must still be open). A `lock_timeout` is a
    startup option of every connection, so it bounds Spark's schema query too, which runs before
    (and without) the init statement."""
    init = (f"{pg.session_settings_sql()}{settings}"
            f"BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY; SET TRANSACTION SNAPSHOT '{snapshot_id}'")
    options = jdbc.options()
    if lock_timeout:
        options["options"] = f"{options.get('options', '')} -c lock_timeout={lock_timeout}".strip()
    return (spark.read.format("jdbc").options(**options)
            .option("query", query)
            .option("fetchsize", JDBC_FETCH_SIZE)
            .option("preferTimestampNTZ", "true")  # timestamp (no zone) stays zone-free
            .option("sessionInitStatement", init)
            .option("prepareThreshold", "-1")  # binary rows from the first execution
            .load())


def dirty_changes_at_most(conn: psycopg.Connection, table: RegisteredTable, limit: int) -> bool:
    """Whether the table has at most `limit` dirty changes (reads no more than limit + 1 of them)."""
    return conn.execute(sql.SQL("SELECT count(*) <= %s FROM (SELECT 1 FROM coldharbor.change_log c WHERE {} "
                                "LIMIT %s) d").format(dirty_changes(table)), (limit, limit + 1)).fetchone()[0]


def has_dirty(conn: psycopg.Connection, table_id: int) -> bool:
    """Cheap probe of the partial dirty index."""
    return conn.execute("SELECT EXISTS (SELECT 1 FROM coldharbor.change_log "
                        "WHERE table_id = %s AND flushed_at IS NULL)", (table_id,)).fetchone()[0]


# For incremental reports (coldharbor.serve.incremental), which read the same logged rows.
image_readable, image_usable, image_hash, chained = _image_readable, _image_usable, _image_hash, _chained

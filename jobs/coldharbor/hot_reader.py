"""Reads the dirty set of one table from PostgreSQL: keys, change ids and current row images.

Everything comes from ONE statement, so it is one snapshot: a change either is in the result with
the image that includes it, or it is not in the result at all (invariant 1).
"""

from __future__ import annotations

from collections.abc import Sequence

import psycopg
from psycopg import sql
from pyspark.sql import DataFrame, SparkSession

from coldharbor.lake_rows import CHANGE_IDS, CHANGED_AT, DELETED, FIRST_CHANGED_AT, OLDEST_CHANGE_AT, SEQ
from coldharbor.pg import JdbcTarget
from coldharbor.registry import LakeColumn, RegisteredTable

# PostgreSQL types the JDBC driver would not hand over as the lake type: cast to text in SQL.
AS_TEXT = {"uuid", "json", "jsonb"}
JDBC_FETCH_SIZE = 20_000
# The dirty-set aggregate spills to disk with PostgreSQL's default 4MB; one export session may use more.
EXPORT_WORK_MEM = "256MB"


def column_expr(column: LakeColumn) -> sql.Composable:
    if column.is_key:
        # Deleted keys have no row left to join: their key values come from the change log.
        expr = sql.SQL("(d.key ->> {})::{}").format(sql.Literal(column.name), sql.SQL(column.pg_type))
    else:
        expr = sql.SQL("t.{}").format(sql.Identifier(column.name))
    if column.pg_type in AS_TEXT:
        expr = sql.SQL("({})::text").format(expr)
    return sql.SQL("{} AS {}").format(expr, sql.Identifier(column.name))


def change_time(conn: psycopg.Connection) -> sql.Composable:
    """When a change_log row's change happened: its commit time when the server tracks commit
    timestamps (as-of reports need it), else the start of its transaction."""
    tracked = conn.execute("SELECT current_setting('track_commit_timestamp')::bool").fetchone()[0]
    if tracked:
        return sql.SQL("coalesce(pg_xact_commit_timestamp(xmin), created_at)")
    return sql.SQL("created_at")


def key_match(columns: Sequence[LakeColumn]) -> sql.Composable:
    """The table row `t` whose key is the change_log key `d.key`."""
    return sql.SQL(" AND ").join(
        sql.SQL("t.{} = (d.key ->> {})::{}").format(sql.Identifier(c.name), sql.Literal(c.name), sql.SQL(c.pg_type))
        for c in columns if c.is_key)


def row_missing(columns: Sequence[LakeColumn]) -> sql.Composable:
    """True when the dirty key has no row left in `t`: key columns are never NULL in a row
    (a primary key's, or an entity view's row_id), so a NULL one means the LEFT JOIN found none."""
    first = next(c for c in columns if c.is_key)
    return sql.SQL("t.{} IS NULL").format(sql.Identifier(first.name))


def source_relation(conn: psycopg.Connection, table: RegisteredTable) -> sql.Composable:
    """What the dirty keys are joined to: the table itself, or for an entity schema the
    flattening of just the dirty records (one grouped pass over their eav_data rows instead of
    the view's aggregate per record). Both read the CTE `dirty` of the query they sit in."""
    if table.source_kind != "entity":
        return table.identifier
    flatten = conn.execute("SELECT coldharbor.entity_flatten_sql(%s, %s)",
                           (table.table_name, "SELECT (dk.key ->> 'row_id')::uuid FROM dirty dk")).fetchone()[0]
    return sql.SQL("({})").format(sql.SQL(flatten))


def dirty_images_query(table: RegisteredTable, columns: Sequence[LakeColumn],
                       changed_at: sql.Composable = sql.SQL("created_at"),
                       relation: sql.Composable | None = None) -> sql.Composed:
    """One row per dirty key: its image now (or a delete marker), newest change id, all change ids."""
    return sql.SQL("""
        WITH dirty AS (
            SELECT key,
                   array_agg(id ORDER BY id) AS change_ids,
                   max(id) AS change_seq,
                   (array_agg({change_time} ORDER BY id DESC))[1] AS changed_at,
                   min({change_time}) AS first_changed_at,
                   min(created_at) AS oldest_change_at
            FROM coldharbor.change_log
            WHERE table_id = {table_id} AND flushed_at IS NULL
            GROUP BY key)
        SELECT {columns},
               {missing} AS {deleted},
               d.change_seq AS {seq},
               d.changed_at AS {changed_at},
               d.first_changed_at AS {first_changed_at},
               d.oldest_change_at AS {oldest},
               d.change_ids AS {change_ids}
        FROM dirty d LEFT JOIN {table} t ON {key_match}""").format(
        table_id=sql.Literal(table.table_id),
        columns=sql.SQL(", ").join(column_expr(c) for c in columns),
        deleted=sql.Identifier(DELETED), seq=sql.Identifier(SEQ), changed_at=sql.Identifier(CHANGED_AT),
        first_changed_at=sql.Identifier(FIRST_CHANGED_AT),
        oldest=sql.Identifier(OLDEST_CHANGE_AT), change_ids=sql.Identifier(CHANGE_IDS),
        table=relation or table.identifier, key_match=key_match(columns), change_time=changed_at,
        missing=row_missing(columns))


def read_dirty_images(spark: SparkSession, conn: psycopg.Connection, jdbc: JdbcTarget,
                      table: RegisteredTable, columns: Sequence[LakeColumn]) -> DataFrame:
    """The dirty images, read once through JDBC and pinned in Spark.

    A JDBC DataFrame re-runs its query on every action; the eager local checkpoint makes the
    rows written to the lake and the change ids marked flushed come from the same single read.
    """
    query = dirty_images_query(table, columns, change_time(conn), source_relation(conn, table)).as_string(conn)
    images = (spark.read.format("jdbc").options(**jdbc.options())
              .option("query", query)
              .option("fetchsize", JDBC_FETCH_SIZE)
              .option("preferTimestampNTZ", "true")  # timestamp (no zone) stays zone-free
              .option("sessionInitStatement", f"SET work_mem = '{EXPORT_WORK_MEM}'")
              .load())
    # The read is one partition (one statement, one snapshot); spread it for the Delta write.
    parallelism = spark.sparkContext.defaultParallelism
    return images.repartition(parallelism).localCheckpoint(eager=True)


def has_dirty(conn: psycopg.Connection, table_id: int) -> bool:
    """Cheap probe of the partial dirty index."""
    return conn.execute("SELECT EXISTS (SELECT 1 FROM coldharbor.change_log "
                        "WHERE table_id = %s AND flushed_at IS NULL)", (table_id,)).fetchone()[0]

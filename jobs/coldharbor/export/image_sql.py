"""The SQL of a dirty key's image, as the export and the reports read it: a column as the lake
holds it (`checked_select`, `as_output`), the unflushed changes of a table, and for a table with
exact history (sql/migrations/021, 024) every change's logged image, read back through the column's
type and kept only where a key's changes chain (`exact_images_query`). `hot_reader` builds the one
dirty-set query from these."""

from __future__ import annotations

from collections.abc import Sequence

from psycopg import sql

from coldharbor.capture.registry import LakeColumn, RegisteredTable
from coldharbor.lake import lake_values
from coldharbor.lake.lake_rows import CHANGED_AT, DELETED, FIRST_CHANGED_AT, SEQ

# PostgreSQL types the JDBC driver would not hand over as the lake type: cast to text in SQL.
AS_TEXT = {"uuid", "json", "jsonb"}


def as_output(column: LakeColumn, expr: sql.Composable) -> sql.Composable:
    """`expr` selected as the column, typed for the lake (uuid and json as text)."""
    if column.pg_type in AS_TEXT:
        expr = sql.SQL("({})::text").format(expr)
    return sql.SQL("{} AS {}").format(expr, sql.Identifier(column.name))


def checked_select(columns: Sequence[LakeColumn], value_of: lake_values.ValueOf, through_jdbc: bool) -> sql.Composable:
    """The select list of a reader of rows: each column typed for the lake, NULL where the lake does
    not hold its value, then the row's `lake_values.PROBLEM` naming the first such value."""
    values, problem = lake_values.checked_values(columns, value_of, through_jdbc)
    return sql.SQL(", ").join([*(as_output(c, v) for c, v in zip(columns, values)),
                               sql.SQL("{} AS {}").format(problem, sql.Identifier(lake_values.PROBLEM))])


def dirty_changes(table: RegisteredTable) -> sql.Composed:
    """The unflushed change rows `c` of one table: what the export reads, marks and records as its
    intent."""
    return sql.SQL("c.table_id = {} AND c.flushed_at IS NULL").format(sql.Literal(table.table_id))


def key_column(position: int) -> sql.Identifier:
    return sql.Identifier(f"_ch_k{position}")


def logged_image_value(column: LakeColumn, image: str) -> sql.Composable:
    """A column of a change's logged row image (`change_log.image`, row_to_json of the row: sql/migrations/021),
    read back through the column type's input function; NULL when the image has no such key (the
    column was added since). json and jsonb values are taken as JSON text, the others as their text."""
    operator = "->" if column.pg_type in ("json", "jsonb") else "->>"
    return sql.SQL("({} {} {})::{}").format(sql.SQL(image), sql.SQL(operator), sql.Literal(column.name),
                                           sql.SQL(column.pg_type))


def _image_readable(table: RegisteredTable, columns: Sequence[LakeColumn], image: str = "c.image") -> sql.Composable:
    """True for a logged image in the table's shape now: one was logged, after the table's last
    rebase request (before it, the image holds the old shape or old values). None is while the table
    has a column registration refuses for exact history (sql/migrations/021), added since: a json column (an
    image loses the spaces around its value) or a virtual generated one (an image holds NULL there)."""
    if any(c.pg_type == "json" for c in columns):
        return sql.SQL("false")
    return sql.SQL(" AND ").join([
        sql.SQL("{} IS NOT NULL").format(sql.SQL(image)),
        sql.SQL("c.created_at > (SELECT coalesce(max(r.requested_at), '-infinity') FROM coldharbor.rebases r "
                "WHERE r.table_id = {})").format(sql.Literal(table.table_id)),
        sql.SQL("NOT EXISTS (SELECT 1 FROM pg_catalog.pg_attribute a WHERE a.attrelid = (SELECT relid FROM "
                "coldharbor.tables WHERE table_id = {}) AND a.attnum > 0 AND NOT a.attisdropped "
                "AND a.attgenerated = 'v')").format(sql.Literal(table.table_id))])


def _image_usable(table: RegisteredTable, columns: Sequence[LakeColumn], image: str = "c.image") -> sql.Composable:
    """True for a logged image an export can write as the row after its change: a readable one
    (`_image_readable`) with no json null in a jsonb column (it cannot tell SQL NULL from JSON null)
    and every value one the lake holds (a value of the past cannot be changed to one it does; the
    change's span then stays one image, as without exact history)."""
    if any(c.pg_type == "json" for c in columns):
        return sql.SQL("false")
    logged = image
    image = sql.SQL(logged)
    tests = [_image_readable(table, columns, logged)]
    for c in columns:
        if c.is_key:
            continue
        if c.pg_type in ("json", "jsonb"):
            tests.append(sql.SQL("coalesce(json_typeof({} -> {}) <> 'null', true)").format(image, sql.Literal(c.name)))
        check = lake_values.held(c, logged_image_value(c, logged), through_jdbc=True)
        if check is not None:
            tests.append(sql.SQL("coalesce({}, true)").format(check))
    return sql.SQL(" AND ").join(tests)


def _image_hash(columns: Sequence[LakeColumn]) -> sql.Composable:
    """A logged image's hash as capture hashes the row before a change (sql/migrations/024:
    hash_record_extended of the row; a record's hash is its columns' hashes, dropped ones skipped),
    each value read back through its type's input function."""
    values = sql.SQL(", ").join(logged_image_value(c, "c.image") for c in columns)
    return sql.SQL("hash_record_extended(ROW({}), 0)").format(values)


def _chained(typed_keys: sql.Composable) -> sql.Composable:
    """True for a change that the key's next logged change follows: the next one is an insert and
    this one a delete, or the next one updates or deletes the very row this one left (its hash
    before equals this one's image hash). A key's newest change has no next one. A change whose
    image is unreadable (`_image_readable`; ATTACH PARTITION logs none) or that was logged before
    capture hashed rows does not chain: what its transaction left cannot be shown."""
    after = sql.SQL("OVER (PARTITION BY {} ORDER BY id)").format(typed_keys)
    return sql.SQL("""CASE WHEN lead(id) {after} IS NULL THEN true
                WHEN lead(op) {after} = 'I' THEN op = 'D'
                ELSE op <> 'D' AND new_hash IS NOT NULL AND new_hash = lead(old_hash) {after} END""").format(
        after=after)


# Exact history's rows of a batch (`exact_images_query`): each logged change of a dirty key with
# its image and hashes (`logged`), whether it is the key's newest and whether its key's changes
# chain (`changes`), which earlier changes become rows of their own (`rows_of`), the span of changes
# each row stands for (`numbered`, `spans`); then the newest row of each key read from the table,
# and one row per earlier change from its logged image.
_EXACT_IMAGES = """
        WITH logged AS (
            SELECT {key_values}, c.id, {change_time} AS change_at, c.op,
                   CASE WHEN c.op <> 'D' AND {usable} THEN c.image END AS image,
                   CASE WHEN c.op <> 'D' AND {readable} THEN {image_hash} END AS new_hash, c.old_hash
            FROM coldharbor.change_log c
            WHERE {dirty}{share}),
        changes AS (
            SELECT *, row_number() OVER (PARTITION BY {typed_keys} ORDER BY id DESC) = 1 AS newest,
                   {chained} AS chained
            FROM logged),
        rows_of AS (
            SELECT *, NOT newest AND (op = 'D' OR image IS NOT NULL)
                      AND bool_and(chained) OVER (PARTITION BY {typed_keys}) AS history
            FROM changes),
        numbered AS (
            SELECT *, count(*) FILTER (WHERE history) OVER (PARTITION BY {typed_keys} ORDER BY id
                                                            ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS span
            FROM rows_of),
        spans AS (
            SELECT *, min(change_at) OVER (PARTITION BY {typed_keys}, span) AS first_at FROM numbered)
        SELECT {final_columns}, t.{first_key} IS NULL AS {deleted}, d.id AS {seq}, d.change_at AS {changed_at},
               d.first_at AS {first_changed_at}
        FROM spans d LEFT JOIN {table} t ON {key_match}
        WHERE d.newest
        UNION ALL
        SELECT {history_columns}, h.op = 'D' AS {deleted}, h.id AS {seq}, h.change_at AS {changed_at},
               h.first_at AS {first_changed_at}
        FROM spans h
        WHERE h.history"""


def exact_images_query(table: RegisteredTable, columns: Sequence[LakeColumn], changed_at: sql.Composable,
                       relation: sql.Composable | None, share: sql.Composable) -> sql.Composed:
    """`dirty_images_query` for a table with exact history (sql/migrations/021): besides one row per dirty key
    (its image now, as for any table), one row per earlier change of the key in the batch, the row
    as that change left it (its logged image; a delete marker for a delete), with the change's own
    sequence and time. Each row's `_ch_first_changed_at` is the first change since the key's
    previous row in the batch: a change with no usable image (`_image_usable`) joins the span of
    the row after it, which an as-of report then refuses inside, as it does for every table.

    A key's images stand only when its logged changes chain (`_chained`): capture logs in the order
    statements finish, and a nested write (an application's trigger, a volatile function) can log
    an older image after a newer one (sql/migrations/024). A key whose chain breaks writes only its newest
    row, read from the table, spanning all of its changes in the batch."""
    keys = [c for c in columns if c.is_key]
    typed_keys = sql.SQL(", ").join(key_column(i) for i in range(len(keys)))

    def final_value(c: LakeColumn) -> sql.Composable:
        return (sql.SQL("d.{}").format(key_column(keys.index(c))) if c.is_key
                else sql.SQL("t.{}").format(sql.Identifier(c.name)))

    def history_value(c: LakeColumn) -> sql.Composable:
        return (sql.SQL("h.{}").format(key_column(keys.index(c))) if c.is_key else logged_image_value(c, "h.image"))

    return sql.SQL(_EXACT_IMAGES).format(
        key_values=sql.SQL(", ").join(
            sql.SQL("(c.key ->> {})::{} AS {}").format(sql.Literal(c.name), sql.SQL(c.pg_type), key_column(i))
            for i, c in enumerate(keys)),
        change_time=changed_at, usable=_image_usable(table, columns), typed_keys=typed_keys,
        readable=_image_readable(table, columns), image_hash=_image_hash(columns), chained=_chained(typed_keys),
        dirty=dirty_changes(table), share=share,
        final_columns=checked_select(columns, final_value, through_jdbc=True),
        history_columns=checked_select(columns, history_value, through_jdbc=True),
        first_key=sql.Identifier(keys[0].name), deleted=sql.Identifier(DELETED), seq=sql.Identifier(SEQ),
        changed_at=sql.Identifier(CHANGED_AT), first_changed_at=sql.Identifier(FIRST_CHANGED_AT),
        table=relation or table.identifier,
        key_match=sql.SQL(" AND ").join(sql.SQL("t.{} = d.{}").format(sql.Identifier(c.name), key_column(i))
                                        for i, c in enumerate(keys)))

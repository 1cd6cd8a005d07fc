"""The values the lake holds exactly: the one definition the load, the export, verify and reports check.

A value reaches a report unchanged only if every hop on its way holds it. Spark's (and Python's)
dates and timestamps run from 0001-01-01 to 9999-12-31 in the proleptic Gregorian calendar, where
PostgreSQL's reach 294276 AD, BC and +-infinity; Spark's decimals have no NaN, which PostgreSQL's
numeric has. And the JDBC reader of the load, the export and verify moves a date in 1582-10-05..14
(days its Julian/Gregorian calendar lacks) ten days on; psycopg, which reports read with, does not.
A partition column's value is a Delta partition value, which Spark writes through a folder name:
an empty string, and the text of its NULL folder `__HIVE_DEFAULT_PARTITION__`, come back as NULL
(the key changed: a report would keep the stale lake row beside the dirty one), and bytes are
decoded as UTF-8 (invalid ones become U+FFFD: two keys, one lake key). So a text partition value
must be non-empty and not that marker, and a bytea one printable ASCII (0x20-0x7E), not the marker.

The checks are SQL, judged in PostgreSQL where the value is still exact, before any reader converts
it. Values pass by the range known to be held, never by a list of what is not. A row whose value
fails is refused with one line naming the table, the column, the value and the key; a reader of
rows gets the value masked to NULL plus the row's finding in `PROBLEM`, so that it never meets a
value it cannot convert and can refuse cleanly once it has read.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence

import psycopg
from psycopg import sql

from coldharbor.capture.registry import LakeColumn, RegisteredTable
from coldharbor.runtime.errors import UnrepresentableValueError

DATE_RANGE = ("0001-01-01", "9999-12-31 23:59:59.999999")
CALENDAR_GAP = ("1582-10-05", "1582-10-14")
GAP_END = "1582-10-15"  # the first day after the gap
DATE_TYPES = frozenset({"DATE", "TIMESTAMP_NTZ", "TIMESTAMP"})  # lake types; TIMESTAMP is timestamptz
# A registered numeric(p,s) has p <= 38: every number it holds lies inside; NaN sorts above every
# number and both infinities lie outside.
DECIMAL_RANGE = ("-1e38", "1e38")
NULL_PARTITION = "__HIVE_DEFAULT_PARTITION__"  # the folder Spark writes a NULL partition value to
PRINTABLE_ASCII_HEX = "^([2-6][0-9a-f]|7[0-9a-e])+$"  # hex pairs 20..7e, at least one
PROBLEM = "_ch_unrepresentable"  # text: NULL, or the JSON array [column, value, key] of the row's first unheld value

ValueOf = Callable[[LakeColumn], sql.Composable]


def held(column: LakeColumn, value: sql.Composable, through_jdbc: bool) -> sql.Composable | None:
    """SQL that is true when `value` (of `column`'s type) is held exactly, NULL when it is NULL; None
    when the type holds every value. `through_jdbc`: the rows go through the JDBC reader (its gap).

    Comparisons with constants of the column's own type only: a timestamptz is judged in UTC by
    bounds written with +00, not converted (AT TIME ZONE per row doubled the cost of verify's scan)."""
    if column.lake_type in DATE_TYPES:
        zone = "+00" if column.lake_type == "TIMESTAMP" else ""  # TIMESTAMP is timestamptz: the lake holds it in UTC
        check = sql.SQL("{v} BETWEEN {lo} AND {hi}").format(v=value, lo=sql.Literal(DATE_RANGE[0] + zone),
                                                            hi=sql.Literal(DATE_RANGE[1] + zone))
        if through_jdbc:
            check = sql.SQL("{} AND NOT ({v} >= {start} AND {v} < {end})").format(
                check, v=value, start=sql.Literal(CALENDAR_GAP[0] + zone), end=sql.Literal(GAP_END + zone))
        return sql.SQL("({})").format(check)
    if column.lake_type.startswith("DECIMAL("):
        return sql.SQL("({} BETWEEN {} AND {})").format(value, sql.SQL(DECIMAL_RANGE[0]), sql.SQL(DECIMAL_RANGE[1]))
    if column.partition and column.lake_type == "STRING":
        not_marker = sql.SQL("({})::text <> {}").format(value, sql.Literal(NULL_PARTITION))
        if _blank_padded(column.pg_type):
            return sql.SQL("({})").format(not_marker)
        return sql.SQL("(octet_length(({})::text) > 0 AND {})").format(value, not_marker)
    if column.partition and column.lake_type == "BINARY":
        return sql.SQL("(encode({v}, 'hex') ~ {ascii} AND {v} <> convert_to({marker}, 'UTF8'))").format(
            v=value, ascii=sql.Literal(PRINTABLE_ASCII_HEX), marker=sql.Literal(NULL_PARTITION))
    return None


def _blank_padded(pg_type: str) -> bool:
    """character(n): never empty (an empty value is n spaces, which the lake holds as such)."""
    return pg_type == "bpchar" or pg_type.startswith(("character(", "char("))


def has_limits(columns: Sequence[LakeColumn], through_jdbc: bool) -> bool:
    """Whether a column's type can hold a value the lake does not (else there is nothing to check)."""
    return any(held(c, sql.SQL("v"), through_jdbc) is not None for c in columns)


def key_text(columns: Sequence[LakeColumn], value_of: ValueOf) -> sql.Composable:
    """SQL text naming the row's key: 'a=1, b=x'."""
    return sql.SQL("concat_ws(', ', {})").format(sql.SQL(", ").join(
        sql.SQL("{} || ({})::text").format(sql.Literal(f"{c.name}="), value_of(c)) for c in columns if c.is_key))


def checked_values(columns: Sequence[LakeColumn], value_of: ValueOf,
                   through_jdbc: bool) -> tuple[list[sql.Composable], sql.Composable]:
    """Per column its value where held, else NULL; and the row's `PROBLEM` (NULL text when every
    value is held): what a reader selects, in the columns' order, so it never converts a value it
    cannot and still learns which one it was."""
    values, whens = [], []
    for c in columns:
        check = held(c, value_of(c), through_jdbc)
        if check is None:
            values.append(value_of(c))
            continue
        # CASE drops the type modifier; without it the JDBC reader takes a numeric(38,30) for decimal(38,18).
        values.append(sql.SQL("(CASE WHEN {} THEN {} END)::{}").format(check, value_of(c), sql.SQL(c.pg_type)))
        whens.append(sql.SQL("WHEN NOT {} THEN jsonb_build_array({}, ({})::text, {})::text").format(
            check, sql.Literal(c.name), value_of(c), key_text(columns, value_of)))
    problem = sql.SQL("CASE {} END").format(sql.SQL(" ").join(whens)) if whens else sql.SQL("NULL::text")
    return values, problem


def refusal(table: str, problem: str, outcome: str, through_jdbc: bool = True) -> UnrepresentableValueError:
    """The one line for a row's `PROBLEM`: table, column, value, key, what is held, and `outcome`."""
    column, value, key = json.loads(problem)
    gap = f" and outside {CALENDAR_GAP[0]}..{CALENDAR_GAP[1]}" if through_jdbc else ""
    return UnrepresentableValueError(
        f"{table}: column {column} holds {value!r} (row {key}), which the lake cannot hold exactly: dates and "
        f"timestamps must lie from {DATE_RANGE[0]} to 9999-12-31 (no infinity, no BC){gap}, numbers must be "
        f"finite (no NaN), and a partition value must be non-empty text other than {NULL_PARTITION} (bytes: "
        f"printable ASCII), as Spark writes it through a folder name; {outcome}")


def refuse_in_table(conn: psycopg.Connection, table: RegisteredTable, columns: Sequence[LakeColumn],
                    outcome: str) -> None:
    """Raises `refusal` for the first row of the table (in the caller's snapshot) holding a value the
    JDBC reader and the lake do not carry exactly. One scan, stopped at the first; none when no
    column's type has a limit."""
    def value_of(c: LakeColumn) -> sql.Composable:
        return sql.SQL("t.{}").format(sql.Identifier(c.name))

    if not has_limits(columns, through_jdbc=True):
        return
    _, problem = checked_values(columns, value_of, through_jdbc=True)
    found = conn.execute(sql.SQL("SELECT p FROM (SELECT {} AS p FROM {} t) r WHERE p IS NOT NULL LIMIT 1").format(
        problem, table.identifier)).fetchone()
    if found is not None:
        raise refusal(table.qualified_name, found[0], outcome)

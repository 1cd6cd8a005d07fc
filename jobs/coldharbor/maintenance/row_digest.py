"""One digest of a row that PostgreSQL and Spark compute alike: what verify compares, chunk by chunk.

Verify digests PostgreSQL's rows where they are, in SQL, and the lake's rows in Spark; the two sides
agree only if both spell every value the same way before hashing. This module is that spelling, per
lake type, once for each engine (tests/integration/maintenance/test_row_digest.py proves them equal over every
accepted type and hostile values):

  SHORT, INT, LONG, DECIMAL(p,s)  decimal text (a numeric(p,s) always shows s digits, like DECIMAL(p,s))
  BOOLEAN                         true | false
  FLOAT, DOUBLE                   the value's IEEE bits as a double, 16 hex digits (-0.0 is not 0.0;
                                  every NaN is the one NaN Java's doubleToLongBits gives)
  DATE                            days since 2000-01-01, 8 hex digits
  TIMESTAMP, TIMESTAMP_NTZ        microseconds since 2000-01-01 (UTC), 16 hex digits
                                  (dates and timestamps in PostgreSQL's own binary form, two's
                                  complement: no text formatting, no session setting, and no
                                  value -- not even infinity -- that fails to spell)
  STRING                          the text the lake holds (a value's text output: char(n) padded,
                                  uuid and json as text), prefixed with its length in characters and ':'
  BINARY                          lower-case hex

NULL is `N`, which no value's spelling is; the columns' spellings are joined by `|`, which only a
text's spelling can hold, and a text says its length first: two different rows never spell alike.
The digest is the first 64 bits of the MD5 of the UTF-8 spelling, as a signed bigint.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from psycopg import sql
from pyspark.sql import Column
from pyspark.sql import functions as F

from coldharbor.capture.registry import LakeColumn
from coldharbor.lake.lake_rows import column

NULL = "N"
SEPARATOR = "|"
INTEGER_TYPES = frozenset({"SHORT", "INT", "LONG"})
TIMESTAMP_TYPES = frozenset({"TIMESTAMP", "TIMESTAMP_NTZ"})
FLOAT_TYPES = frozenset({"FLOAT", "DOUBLE"})
# Java's doubleToLongBits(NaN), which PostgreSQL's float8send spells as 7ff8000000000000 for its own
# NaN but not for a NaN of another sign or payload (Infinity - Infinity is fff8000000000000).
NAN_BITS = "7ff8000000000000"
DAYS_1970_TO_2000 = 10_957
MICROS_1970_TO_2000 = DAYS_1970_TO_2000 * 86_400_000_000

ValueOf = Callable[[LakeColumn], sql.Composable]


def _pg_lake_text(column: LakeColumn, value: sql.Composable) -> sql.Composable:
    """The text the lake holds for a STRING column's value: what the JDBC reader hands over."""
    if column.pg_type == "text" or column.pg_type.startswith("character varying"):
        return value
    if column.pg_type in ("uuid", "json", "jsonb"):
        return sql.SQL("({})::text").format(value)
    # char(n): its text output, padded (::text trims it); concat() calls it, but makes NULL empty.
    return sql.SQL("(CASE WHEN {v} IS NOT NULL THEN concat({v}) END)").format(v=value)


def pg_spelling(column: LakeColumn, value: sql.Composable) -> sql.Composable:
    """SQL text spelling `value` (of `column`'s type) as `spark_spelling` does; NULL when it is NULL."""
    kind = column.lake_type
    if kind in INTEGER_TYPES or kind == "BOOLEAN" or kind.startswith("DECIMAL("):
        return sql.SQL("({})::text").format(value)
    if kind in FLOAT_TYPES:
        return sql.SQL("CASE WHEN {v} = 'NaN' THEN {nan} ELSE encode(float8send(({v})::float8), 'hex') END").format(
            v=value, nan=sql.Literal(NAN_BITS))
    if kind == "DATE":
        return sql.SQL("encode(date_send({}), 'hex')").format(value)
    if kind == "TIMESTAMP":
        return sql.SQL("encode(timestamptz_send({}), 'hex')").format(value)
    if kind == "TIMESTAMP_NTZ":
        return sql.SQL("encode(timestamp_send({}), 'hex')").format(value)
    if kind == "STRING":
        text = _pg_lake_text(column, value)
        return sql.SQL("(length({t})::text || ':' || {t})").format(t=text)
    if kind == "BINARY":
        return sql.SQL("encode({}, 'hex')").format(value)
    raise ValueError(f"no spelling for lake type {kind} (column {column.name})")


def spark_spelling(column: LakeColumn, value: Column) -> Column:
    """`value` (typed as `column.lake_type`) spelled as `pg_spelling` spells it; NULL when it is NULL."""
    kind = column.lake_type
    if kind in INTEGER_TYPES or kind == "BOOLEAN" or kind.startswith("DECIMAL("):
        return value.cast("string")
    if kind in FLOAT_TYPES:
        bits = F.reflect(F.lit("java.lang.Double"), F.lit("doubleToLongBits"), value.cast("double"))
        return F.when(value.isNotNull(), _hex64(bits.cast("long")))
    if kind == "DATE":
        days = (F.unix_date(value) - F.lit(DAYS_1970_TO_2000)).cast("long").bitwiseAND(F.lit(0xFFFFFFFF))
        return F.lpad(F.lower(F.hex(days)), 8, "0")
    if kind in TIMESTAMP_TYPES:  # a TIMESTAMP_NTZ is read as UTC: the jobs' session zone
        return _hex64(F.unix_micros(value.cast("timestamp")) - F.lit(MICROS_1970_TO_2000))
    if kind == "STRING":
        return F.concat(F.length(value).cast("string"), F.lit(":"), value)
    if kind == "BINARY":
        return F.lower(F.hex(value))
    raise ValueError(f"no spelling for lake type {kind} (column {column.name})")


def _hex64(value: Column) -> Column:
    """A bigint as PostgreSQL's send format spells it in hex: 16 digits, two's complement."""
    return F.lpad(F.lower(F.hex(value)), 16, "0")


def pg_digest(columns: Sequence[LakeColumn], value_of: ValueOf, utf8: bool = True) -> sql.Composable:
    """SQL bigint: the digest of the row whose values `value_of` gives. `utf8`: the server encoding is
    UTF8 (else the spelling is converted first: Spark hashes UTF-8)."""
    spelled = sql.SQL("concat_ws({sep}, {parts})").format(sep=sql.Literal(SEPARATOR), parts=sql.SQL(", ").join(
        sql.SQL("coalesce({}, {})").format(pg_spelling(c, value_of(c)), sql.Literal(NULL)) for c in columns))
    if not utf8:
        spelled = sql.SQL("convert_to({}, 'UTF8')").format(spelled)
    return sql.SQL("('x' || left(md5({}), 16))::bit(64)::bigint").format(spelled)


def spark_digest(columns: Sequence[LakeColumn], value_of: Callable[[LakeColumn], Column] | None = None) -> Column:
    """Spark bigint: the digest `pg_digest` computes, of rows typed as the lake types them."""
    value_of = value_of or (lambda c: column(c.name))
    spelled = F.concat_ws(SEPARATOR, *[F.coalesce(spark_spelling(c, value_of(c)), F.lit(NULL)) for c in columns])
    return F.conv(F.substring(F.md5(spelled), 1, 16), 16, -10).cast("long")

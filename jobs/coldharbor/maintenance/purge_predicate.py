"""The row predicate of a purge: parsed with sqlglot into a typed form that means the same in
PostgreSQL and Spark, and rendered for each of them from the checked tree, never from the user's text.

The form is AND/OR/NOT over comparisons of one column with literals. Each column's kind (from its
PostgreSQL and lake types) has an allow-list of comparisons and of literals:

- numbers (smallint, integer, bigint, numeric, double precision): = <> < <= > >= BETWEEN IN;
- text and varchar: the same and LIKE, compared byte by byte in both tiers (PostgreSQL gets
  `COLLATE "C"`, Spark compares UTF-8 binary): a column's own collation (case-insensitive, or an
  order Spark does not know) would otherwise make the tiers disagree. A backslash in a string
  literal is refused: the two parsers read it differently;
- uuid: = <> IN with a valid uuid (compared as the lake holds it, lower-case text);
- boolean: = <> with TRUE or FALSE;
- date: comparisons with 'YYYY-MM-DD';
- timestamptz: comparisons with a literal that names its zone ('2026-01-31 12:00:00+01:00' or
  '...Z'), rendered in UTC; a literal without a zone would be read in each session's zone;
- timestamp (without zone): comparisons with a literal without a zone, compared zone-free in both.

Any column may be tested with IS [NOT] NULL. Every other type (char(n), whose blank padding the
tiers compare differently, real, json, jsonb, bytea) and every other construct is refused with one
line naming it.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import date, datetime, timezone
from uuid import UUID

import sqlglot
from sqlglot import exp
from sqlglot.errors import ParseError

from coldharbor.capture.registry import LakeColumn
from coldharbor.runtime.errors import ConfigError, one_line

ORDERED = (exp.EQ, exp.NEQ, exp.GT, exp.GTE, exp.LT, exp.LTE, exp.Between, exp.In)
EQUALITY = (exp.EQ, exp.NEQ, exp.In)
COMPARISONS = (*ORDERED, exp.Like, exp.Is)
CONNECTIVES = (exp.And, exp.Or, exp.Not, exp.Paren)
COLUMN_FIRST = (exp.Like, exp.Between, exp.In, exp.Is)  # the column is the left operand


@dataclass(frozen=True)
class Predicate:
    text: str
    postgres: str
    spark: str
    columns: frozenset[str]


@dataclass(frozen=True)
class Kind:
    """What a purge predicate may do with a column of one kind."""

    name: str
    operators: tuple[type, ...]
    literal: Callable[[exp.Expression], exp.Expression]  # checked literal -> typed literal; ValueError if not
    bytewise: bool = False  # text: PostgreSQL compares it with COLLATE "C"


# A number literal is plain decimal digits with at most 38 of them: PostgreSQL reads it as an exact
# numeric and Spark as an exact decimal (bigint or wider), so both compare exactly. An exponent
# ('9223372036854775807e0') is a double in Spark but exact in PostgreSQL, and more than 38 digits
# exceed Spark's decimals: both are refused.
PLAIN_NUMBER = re.compile(r"[0-9]+(?:\.[0-9]+)?")
MAX_DIGITS = 38


def _digits(literal: str) -> int:
    """The precision of the decimal Spark reads: integer digits (no leading zeros) plus fraction digits."""
    whole, _, fraction = literal.partition(".")
    return len(whole.lstrip("0")) + len(fraction)


def _number(node: exp.Expression) -> exp.Expression:
    inner = node.this if isinstance(node, exp.Neg) else node
    if not (isinstance(inner, exp.Literal) and inner.is_number and PLAIN_NUMBER.fullmatch(inner.this)
            and _digits(inner.this) <= MAX_DIGITS):
        raise ValueError(f"a number written with digits and at most one decimal point, without an exponent, "
                         f"of at most {MAX_DIGITS} digits")
    return node


def _string(node: exp.Expression) -> str:
    if not (isinstance(node, exp.Literal) and node.is_string):
        raise ValueError("a string literal")
    return node.this


def _text(node: exp.Expression) -> exp.Expression:
    if "\\" in _string(node):
        raise ValueError("a string without a backslash (PostgreSQL and Spark read backslashes differently)")
    return node


def _uuid(node: exp.Expression) -> exp.Expression:
    try:
        return exp.Literal.string(str(UUID(_string(node))))
    except ValueError:
        raise ValueError("a uuid such as '6f1c0e1a-0000-4000-8000-000000000001'") from None


def _boolean(node: exp.Expression) -> exp.Expression:
    if not isinstance(node, exp.Boolean):
        raise ValueError("TRUE or FALSE")
    return node


def _date(node: exp.Expression) -> exp.Expression:
    try:
        value = date.fromisoformat(_string(node))
    except ValueError:
        raise ValueError("a date 'YYYY-MM-DD'") from None
    return exp.Cast(this=exp.Literal.string(value.isoformat()), to=exp.DataType.build("date"))


def _timestamp(zoned: bool) -> Callable[[exp.Expression], exp.Expression]:
    def typed(node: exp.Expression) -> exp.Expression:
        try:
            value = datetime.fromisoformat(_string(node))
        except ValueError:
            raise ValueError("a timestamp 'YYYY-MM-DD HH:MM:SS'" + ("+HH:MM (or Z)" if zoned else "")) from None
        if zoned and value.tzinfo is None:
            raise ValueError("a timestamp with an explicit zone, e.g. '2026-01-31 12:00:00+00:00' (without one, "
                             "PostgreSQL and Spark would each read it in their session's zone)")
        if not zoned and value.tzinfo is not None:
            raise ValueError("a timestamp without a zone (the column has none)")
        if zoned:
            try:
                value = value.astimezone(timezone.utc)
            except OverflowError:
                raise ValueError("a timestamp whose UTC time is between years 1 and 9999") from None
            text, to = value.isoformat(sep=" "), exp.DataType.build("timestamptz")
        else:
            text, to = value.isoformat(sep=" "), exp.DataType.build("timestamp_ntz", dialect="spark")
        return exp.Cast(this=exp.Literal.string(text), to=to)
    return typed


NUMBER = Kind("a number", ORDERED, _number)
# Long enough for an IN list of thousands of keys, short enough to check and render quickly.
MAX_PREDICATE_CHARS = 100_000
KINDS = {
    "text": Kind("text", (*ORDERED, exp.Like), _text, bytewise=True),
    "uuid": Kind("a uuid", EQUALITY, _uuid),
    "boolean": Kind("a boolean", (exp.EQ, exp.NEQ), _boolean),
    "date": Kind("a date", ORDERED, _date),
    "timestamp with time zone": Kind("a timestamptz", ORDERED, _timestamp(zoned=True)),
    "timestamp without time zone": Kind("a timestamp", ORDERED, _timestamp(zoned=False)),
}
NUMBER_LAKE_TYPES = ("SHORT", "INT", "LONG", "DOUBLE", "DECIMAL(")


def column_kind(column: LakeColumn) -> Kind | None:
    """The column's kind, or None when a purge predicate may only test it with IS [NOT] NULL."""
    if column.lake_type.startswith(NUMBER_LAKE_TYPES):
        return NUMBER
    base = column.pg_type.split("(")[0]
    return KINDS["text" if base == "character varying" else base] if base in (*KINDS, "character varying") else None


def parse(text: str, columns: Sequence[LakeColumn]) -> Predicate:
    if not text or not text.strip():
        raise ConfigError("the purge predicate is empty; name the rows to purge, e.g. --where \"customer = 'c-17'\"")
    if len(text) > MAX_PREDICATE_CHARS:
        raise ConfigError(f"the purge predicate is {len(text):,} characters long; at most {MAX_PREDICATE_CHARS:,} "
                          "are accepted (purge in several runs)")
    if "\x00" in text:
        raise ConfigError("the purge predicate contains a NUL character, which PostgreSQL cannot take")
    try:
        return _parse(text, columns)
    except RecursionError:
        raise ConfigError("the purge predicate is nested too deeply to check; write it with fewer parentheses "
                          "and NOTs, or purge in several runs") from None


def _parse(text: str, columns: Sequence[LakeColumn]) -> Predicate:
    try:
        statements = sqlglot.parse(f"SELECT 1 FROM t WHERE {text}", read="postgres")
    except ParseError as exc:
        raise ConfigError(f"the purge predicate does not parse: {str(exc).splitlines()[0]}") from None
    if len(statements) != 1 or statements[0] is None or statements[0].args.get("where") is None:
        raise ConfigError(f"the purge predicate must be one condition, got {text!r}")
    select = statements[0]
    if any(value for key, value in select.args.items() if key not in ("expressions", "from", "from_", "where")):
        raise ConfigError(f"the purge predicate must be one condition, got {text!r}")
    spark_tree = select.args["where"].this.copy()
    by_name = {c.name: c for c in columns}
    used: set[str] = set()
    _check(spark_tree, by_name, used)
    postgres_tree = spark_tree.copy()
    for node in list(postgres_tree.find_all(exp.Column)):
        if getattr(column_kind(by_name[node.name]), "bytewise", False):
            node.replace(exp.Collate(this=node.copy(), expression=exp.Identifier(this="C", quoted=True)))
    return Predicate(text=text, postgres=postgres_tree.sql(dialect="postgres", identify=True),
                     spark=spark_tree.sql(dialect="spark", identify=True), columns=frozenset(used))


# The parts a node of the predicate may have (sqlglot's argument names; `negate` is NOT LIKE's and
# IS NOT's flag); any other part (IN's subquery or UNNEST, ...) is refused, whatever it is.
KNOWN_PARTS = {exp.In: {"this", "expressions", "negate"}, exp.Between: {"this", "low", "high", "negate"},
               exp.Not: {"this"}, exp.Paren: {"this"}}
BINARY_PARTS = {"this", "expression", "negate"}


def _only_known_parts(node: exp.Expression) -> None:
    extra = [key for key, value in node.args.items()
             if value is not None and value is not False and value != [] and
             key not in KNOWN_PARTS.get(type(node), BINARY_PARTS)]
    if extra:
        raise ConfigError(f"each comparison in the purge predicate must compare one column with literals "
                          f"(no subquery or other part): {one_line(node.sql())!r}")


def _check(node: exp.Expression, columns: dict[str, LakeColumn], used: set[str]) -> None:
    """Checks the condition in place, replacing each literal by its typed form."""
    _only_known_parts(node)
    if isinstance(node, CONNECTIVES):
        for child in (node.this, node.args.get("expression")):
            if child is not None:
                _check(child, columns, used)
        return
    if not isinstance(node, COMPARISONS):
        raise ConfigError(f"the purge predicate may combine comparisons of a column with literals (=, <>, <, <=, "
                          f">, >=, BETWEEN, IN, LIKE, IS NULL) with AND/OR/NOT only; it has "
                          f"{node.key.upper()}: {node.sql()!r}")
    operands = [node.this] + ([node.expression] if node.args.get("expression") is not None else []) + \
        [node.args[k] for k in ("low", "high") if node.args.get(k) is not None] + list(node.expressions)
    named = [o for o in operands if isinstance(o, exp.Column)]
    if len(named) != 1 or (isinstance(node, COLUMN_FIRST) and named[0] is not node.this):
        raise ConfigError(f"each comparison in the purge predicate must compare one column with literals: "
                          f"{node.sql()!r}")
    column = _column(named[0], columns)
    used.add(column.name)
    if isinstance(node, exp.Is):
        if not isinstance(node.expression, exp.Null):
            raise ConfigError(f"the purge predicate may use IS only as IS [NOT] NULL: {node.sql()!r}")
        return
    kind = column_kind(column)
    if kind is None or not isinstance(node, kind.operators):
        allowed = "IS [NOT] NULL" if kind is None else \
            " ".join(_OPERATOR_NAMES[o] for o in kind.operators) + " and IS [NOT] NULL"
        raise ConfigError(f"the purge predicate cannot use {_OPERATOR_NAMES.get(type(node), node.key.upper())} on "
                          f"column {column.name!r} ({column.pg_type}): PostgreSQL and Spark compare it alike only "
                          f"with {allowed}{_WHY.get(column.pg_type.split('(')[0], '')}")
    for operand in operands:
        if operand is named[0]:
            continue
        try:
            operand.replace(kind.literal(operand))
        except ValueError as exc:
            raise ConfigError(f"the purge predicate compares {column.name!r} ({column.pg_type}) with "
                              f"{operand.sql()!r}; it takes {exc}") from None


def _column(node: exp.Column, columns: dict[str, LakeColumn]) -> LakeColumn:
    if node.table:
        raise ConfigError(f"name columns without a table in the purge predicate: {node.sql()!r}")
    if node.name not in columns:
        raise ConfigError(f"the purge predicate names column {node.name!r}, which the table does not have "
                          f"(columns: {', '.join(sorted(columns))})")
    return columns[node.name]


_WHY = {"character": " (char(n) pads with blanks, which the two compare differently)",
        "real": " (a real's decimal literals round differently in the two)"}
_OPERATOR_NAMES = {exp.EQ: "=", exp.NEQ: "<>", exp.GT: ">", exp.GTE: ">=", exp.LT: "<", exp.LTE: "<=",
                   exp.Between: "BETWEEN", exp.In: "IN", exp.Like: "LIKE"}

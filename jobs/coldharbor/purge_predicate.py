"""The row predicate of a purge: parsed with sqlglot, restricted to what PostgreSQL and Spark read
alike (columns of the table, literals, comparisons, AND/OR/NOT, IN, BETWEEN, IS NULL, LIKE), and
rendered for each of them from the checked tree, never from the user's text.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import sqlglot
from sqlglot import exp
from sqlglot.errors import ParseError

from coldharbor.errors import ConfigError
from coldharbor.registry import LakeColumn

ALLOWED = (exp.And, exp.Or, exp.Not, exp.Paren, exp.EQ, exp.NEQ, exp.GT, exp.GTE, exp.LT, exp.LTE, exp.Is,
           exp.In, exp.Between, exp.Like, exp.Column, exp.Identifier, exp.Literal, exp.Boolean, exp.Null, exp.Neg,
           exp.Tuple)


@dataclass(frozen=True)
class Predicate:
    text: str
    postgres: str
    spark: str
    columns: frozenset[str]


def parse(text: str, columns: Sequence[LakeColumn]) -> Predicate:
    if not text or not text.strip():
        raise ConfigError("the purge predicate is empty; name the rows to purge, e.g. --where \"customer = 'c-17'\"")
    try:
        statements = sqlglot.parse(f"SELECT 1 FROM t WHERE {text}", read="postgres")
    except ParseError as exc:
        raise ConfigError(f"the purge predicate does not parse: {str(exc).splitlines()[0]}") from None
    if len(statements) != 1 or statements[0] is None or statements[0].args.get("where") is None:
        raise ConfigError(f"the purge predicate must be one condition, got {text!r}")
    select = statements[0]
    if any(value for key, value in select.args.items() if key not in ("expressions", "from", "from_", "where")):
        raise ConfigError(f"the purge predicate must be one condition, got {text!r}")
    condition = select.args["where"].this
    known = {c.name for c in columns}
    used = set()
    for node in condition.walk():
        if not isinstance(node, ALLOWED):
            raise ConfigError(f"the purge predicate may use columns, literals, comparisons, AND/OR/NOT, IN, "
                              f"BETWEEN, IS NULL and LIKE only; it has {node.key.upper()}: {node.sql()!r}")
        if isinstance(node, exp.Column):
            if node.table:
                raise ConfigError(f"name columns without a table in the purge predicate: {node.sql()!r}")
            if node.name not in known:
                raise ConfigError(f"the purge predicate names column {node.name!r}, which the table does not have "
                                  f"(columns: {', '.join(sorted(known))})")
            used.add(node.name)
    if not used:
        raise ConfigError(f"the purge predicate {text!r} names no column: it would purge all rows or none")
    return Predicate(text=text, postgres=condition.sql(dialect="postgres", identify=True),
                     spark=condition.sql(dialect="spark", identify=True), columns=frozenset(used))

"""Change feeds in a report's SQL: `changes(table, from, to)` where a table may stand.

The SQL guard takes each call out of the tree before the allow-list walks it (a table-valued
function is otherwise refused) and puts the name of a view in its place, which the serve job
fills with the table's feed (jobs/coldharbor/serve/changes.py). Only a name and two points as written
pass: a point is never an expression, so the window is known before Spark runs anything.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlglot import exp

from coldharbor.runtime.errors import ReportError
from coldharbor.serve.sql_check import ASCII_NAME, snippet

FEED_PREFIX = "_ch_feed_"
FEED_FUNCTION = "changes"


@dataclass(frozen=True)
class FeedPoint:
    """Where a change feed's window starts or ends, as the report wrote it: a text ('now', an
    ISO-8601 time), a lake version (a whole number), or the value of a :parameter."""

    kind: str                                  # "text" | "version" | "param"
    value: str | int


@dataclass(frozen=True)
class FeedCall:
    """`changes(table, from, to)` where a table may stand: the table's change feed over the window
    (from, to], rows as jobs/changes.py writes them. The table is a name (bare or schema.table,
    as an identifier or a string); each point a string literal, a whole number or a :parameter,
    never an expression. In the SQL Spark runs, the call is the view `view`."""

    view: str
    name: tuple[str, ...]                      # the table's name as written: (table,) or (schema, table)
    start: FeedPoint
    end: FeedPoint


def take_feeds(tree: exp.Query) -> tuple[FeedCall, ...]:
    """Each `changes(...)` standing as a table, checked and replaced in the tree by its view's name
    (which no report may write itself)."""
    feeds: list[FeedCall] = []
    for table in list(tree.find_all(exp.Table)):
        if isinstance(table.this, exp.Identifier) and table.name.lower().startswith(FEED_PREFIX):
            raise ReportError(f"table name {table.name} is not allowed: the prefix {FEED_PREFIX} is reserved")
        call = table.this
        if not (isinstance(call, exp.Anonymous) and call.name.lower() == FEED_FUNCTION):
            continue
        view = f"{FEED_PREFIX}{len(feeds)}"
        if len(call.expressions) != 3:
            raise ReportError(f"{FEED_FUNCTION}() takes three arguments, a table, from and to "
                              f"({len(call.expressions)} given): {snippet(table)}")
        target, start, end = call.expressions
        feeds.append(FeedCall(view, _feed_table(target, table), _feed_point(start, "from", table),
                              _feed_point(end, "to", table)))
        table.set("this", exp.to_identifier(view))
        if not table.alias:
            table.set("alias", exp.TableAlias(this=exp.to_identifier(FEED_FUNCTION)))
    return tuple(feeds)


def _feed_table(node: exp.Expression, call: exp.Table) -> tuple[str, ...]:
    if isinstance(node, exp.Column) and isinstance(node.this, exp.Identifier) and not node.args.get("db") \
            and not node.args.get("catalog") and (node.args.get("table") is None
                                                  or isinstance(node.args["table"], exp.Identifier)):
        return tuple(p for p in (node.table, node.name) if p)
    if isinstance(node, exp.Literal) and node.is_string and 0 < node.this.count(".") + 1 <= 2 \
            and all(node.this.split(".")):
        return tuple(node.this.split("."))
    raise ReportError(f"the first argument of {FEED_FUNCTION}() is a registered table's name (table or "
                      f"schema.table), not {snippet(node)}: {snippet(call)}")


def _feed_point(node: exp.Expression, which: str, call: exp.Table) -> FeedPoint:
    if isinstance(node, exp.Literal) and node.is_string:
        return FeedPoint("text", node.this)
    if isinstance(node, exp.Literal) and node.this.isdigit() and node.this.isascii():
        return FeedPoint("version", int(node.this))
    if isinstance(node, exp.Placeholder) and isinstance(node.this, str) and ASCII_NAME.fullmatch(node.this):
        return FeedPoint("param", node.this)
    raise ReportError(f"the {which} point of {FEED_FUNCTION}() is a string ('2026-11-22T06:00:00Z' or 'now'), "
                      f"a lake version (a whole number) or a :parameter, not {snippet(node)}: {snippet(call)}")

"""Validates a report's SQL by allow-list (invariant 13) before anything runs, and writes the SQL
Spark runs.

A report is exactly one SELECT (WITH, joins, subqueries, set operations, window functions,
VALUES) over registered tables (by `name` or `schema.name`), their change feeds
(`changes(table, from, to)` where a table may stand: coldharbor.serve.sql_feeds) and its own CTEs.
Every node and every function must be on coldharbor.serve.sql_allowlist; the first one that is not is
refused, named.
Spark never sees the text as written: it runs the SQL generated from the checked tree, with each
registered table replaced by its unified view, every identifier quoted and no comments, and that
SQL must parse back to a tree that passes the same checks and generates the same text. So a
place where sqlglot and Spark would read the original text differently cannot smuggle anything.

    parse_query(text)                  parse + allow-list; needs no registry (and no JVM)
    resolve(parsed, registered)        tables against the registry, rewrite, regenerate, re-check
    check_query(text, registered)      both
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass

import sqlglot
from sqlglot import exp
from sqlglot.errors import ParseError, SqlglotError, TokenError

from coldharbor.capture.registry import RegisteredTable
from coldharbor.runtime.errors import ReportError
from coldharbor.serve.sql_check import DIALECT, check_tree, snippet
from coldharbor.serve.sql_feeds import FeedCall, FeedPoint, take_feeds
from coldharbor.serve.sql_names import check_cte_names, lookup, table_node, table_references, tables_by_name

# sqlglot warns on stdout-bound logs when it falls back to a Command; the check reports it itself.
logging.getLogger("sqlglot").setLevel(logging.ERROR)

VIEW_PREFIX = "_ch_view_"
_TOO_DEEP = "the report's SQL is nested too deeply to be checked: simplify it"


@dataclass(frozen=True)
class ParsedQuery:
    """One SELECT that passed the allow-list; its table references are not resolved yet."""

    tree: exp.Query
    parameters: frozenset[str]                 # the :name markers it uses (change feeds' points too)
    feeds: tuple[FeedCall, ...] = ()


@dataclass(frozen=True)
class ResolvedFeed:
    view: str
    table: RegisteredTable
    start: FeedPoint
    end: FeedPoint


@dataclass(frozen=True)
class CheckedQuery:
    sql: str                                   # what Spark runs: registered tables read their views
    tables: tuple[RegisteredTable, ...]        # registered tables it reads, in first-use order
    parameters: frozenset[str]                 # the :name markers it uses
    feeds: tuple[ResolvedFeed, ...] = ()       # change feeds it reads

    @property
    def read_tables(self) -> tuple[RegisteredTable, ...]:
        """Every registered table the report reads, directly or through its change feed."""
        seen = {t.table_id: t for t in self.tables}
        for feed in self.feeds:
            seen.setdefault(feed.table.table_id, feed.table)
        return tuple(seen.values())


def view_name(table: RegisteredTable) -> str:
    return f"{VIEW_PREFIX}{table.table_id}"


def check_query(text: str, registered: Iterable[RegisteredTable]) -> CheckedQuery:
    """The validated, rewritten query, or ReportError saying what is wrong with it."""
    return resolve(parse_query(text), registered)


def usable_marker(name: str) -> bool:
    """Whether `:name` reads as a parameter marker where a value stands (`:from` does not)."""
    try:
        tree = sqlglot.parse_one(f"SELECT 1 AS x WHERE 1 = :{name}", read=DIALECT)
    except SqlglotError:
        return False
    return any(marker.this == name for marker in tree.find_all(exp.Placeholder))


def parse_query(text: str) -> ParsedQuery:
    """The report's one SELECT, checked against the allow-list; ReportError naming what is not."""
    try:
        tree = _parse_one(text)
        feeds = take_feeds(tree)
        check_tree(tree)
        check_cte_names(tree)
        _check_parameter_columns(tree)
    except RecursionError:
        raise ReportError(_TOO_DEEP) from None
    parameters = {p.name for p in tree.find_all(exp.Placeholder)}
    parameters.update(str(point.value) for feed in feeds for point in (feed.start, feed.end) if point.kind == "param")
    return ParsedQuery(tree, frozenset(parameters), feeds)


def _check_parameter_columns(tree: exp.Query) -> None:
    """A select-list item that uses a parameter has a name of its own (AS): Spark would name it
    after the bound value, so the report's columns would change with the values it is run with.
    So does one that builds a text with repeat, space, lpad or rpad: Spark would name it after the
    bound the guard adds (_bound_sizes)."""
    for select in tree.find_all(exp.Select):
        for item in select.expressions:
            if isinstance(item, exp.Alias):
                continue
            marker = item.find(exp.Placeholder)
            if marker is not None:
                raise ReportError(f"name the column that uses parameter :{marker.name} ({snippet(item)}): "
                                  f"write it with AS, e.g. {snippet(item)} AS {marker.name}")
            if any(call.name.lower() in BOUNDED_CALLS for call in item.find_all(exp.Anonymous)):
                raise ReportError(f"name the column {snippet(item)}: write it with AS (a text built with repeat, "
                                  "space, lpad or rpad is bounded in the SQL Spark runs, which would name it)")


def resolve(parsed: ParsedQuery, registered: Iterable[RegisteredTable]) -> CheckedQuery:
    """Table references resolved against the registry and rewritten to the views; the SQL Spark runs."""
    try:
        return _resolve(parsed, registered)
    except RecursionError:
        raise ReportError(_TOO_DEEP) from None


def _resolve(parsed: ParsedQuery, registered: Iterable[RegisteredTable]) -> CheckedQuery:
    tree = parsed.tree.copy()
    by_name = tables_by_name(registered)
    for cte in tree.find_all(exp.CTE):
        if cte.alias_or_name.lower() in by_name:
            raise ReportError(f"CTE {cte.alias_or_name} has the name of a registered table: rename it")
    feeds = tuple(ResolvedFeed(f.view, lookup(table_node(f.name), by_name), f.start, f.end) for f in parsed.feeds)
    feed_views = {f.view for f in feeds}
    used: dict[int, RegisteredTable] = {}
    for table in table_references(tree):
        if not (table.db or table.catalog) and table.name in feed_views:
            continue
        match = lookup(table, by_name)
        used.setdefault(match.table_id, match)
        # In place, so that what hangs off the reference (its alias, alias columns) stays.
        if not table.alias:
            table.set("alias", exp.TableAlias(this=exp.to_identifier(table.name)))
        table.set("this", exp.to_identifier(view_name(match)))
        table.set("db", None)
        table.set("catalog", None)
    if not used and not feeds:
        raise ReportError("the report reads no registered table")
    _bound_sizes(tree)
    return CheckedQuery(_regenerate(tree, {view_name(t) for t in used.values()} | feed_views), tuple(used.values()),
                        parsed.parameters, feeds)


# The longest text a report may build out of a short one with repeat, space, lpad or rpad: one
# value past it could exhaust the memory of the Spark engine every report shares (found by a cold
# attack: repeat(x, 1000000000) stopped the warm engine). Beyond it the run fails in one line.
MAX_BUILT_TEXT = 1_000_000
BOUNDED_CALLS = frozenset({"repeat", "space", "lpad", "rpad"})
_TOO_LONG = f"a report may not build a text longer than {MAX_BUILT_TEXT:,} characters with repeat, space, lpad or rpad"


def _bound_sizes(tree: exp.Query) -> None:
    """Each size repeat, space, lpad and rpad are given checked where it is computed: above
    MAX_BUILT_TEXT the query raises an error instead of building the text (a NULL stays NULL)."""
    def guarded(size: exp.Expression, length: exp.Expression) -> exp.Expression:
        return exp.If(this=exp.GT(this=length, expression=exp.Literal.number(MAX_BUILT_TEXT)),
                      true=exp.Anonymous(this="raise_error", expressions=[exp.Literal.string(_TOO_LONG)]),
                      false=size)

    # Innermost calls first: a call in another one's arguments is bounded before they are copied.
    for node in reversed(list(tree.find_all(exp.Anonymous, bfs=False))):
        name, args = node.name.lower(), node.expressions
        if name == "repeat" and len(args) == 2:  # its length: times * length(text), in 64 bits
            total = exp.Mul(this=exp.Cast(this=args[1].copy(), to=exp.DataType.build("BIGINT")),
                            expression=exp.Anonymous(this="length", expressions=[args[0].copy()]))
            args[1].replace(guarded(args[1].copy(), total))
        elif name == "space" and len(args) == 1:
            args[0].replace(guarded(args[0].copy(), args[0].copy()))
        elif name in ("lpad", "rpad") and len(args) in (2, 3):
            args[1].replace(guarded(args[1].copy(), args[1].copy()))


def _parse_one(text: str) -> exp.Query:
    if not text or not text.strip():
        raise ReportError("the report has no SQL")
    if "${" in text:
        # Spark substitutes ${...} (variables, system properties, the environment) in the SQL text
        # before it parses it, so what it runs would not be what was checked.
        raise ReportError("the report uses ${...}, Spark's variable substitution, which is not allowed "
                          "(it would read settings or the environment, or change the SQL after the check)")
    try:
        statements = [s for s in sqlglot.parse(text, read=DIALECT) if s is not None]
    except (ParseError, TokenError) as exc:
        raise ReportError(f"the report's SQL does not parse: {_first_line(exc)}") from exc
    except SqlglotError as exc:
        raise ReportError(f"the report's SQL cannot be checked: {_first_line(exc)}") from exc
    if len(statements) != 1:
        raise ReportError(f"a report is exactly one SELECT; this SQL holds {len(statements)} statements")
    [tree] = statements
    if not isinstance(tree, exp.Query):
        raise ReportError(f"a report is a read-only SELECT; this SQL is a {_statement_kind(tree)} statement")
    return tree


def _statement_kind(tree: exp.Expression) -> str:
    if isinstance(tree, exp.Command):  # a statement sqlglot does not model: name its leading keywords
        words = str(tree.this).split()
        rest = tree.expression.name.split() if isinstance(tree.expression, exp.Literal) else []
        if len(words) == 1 and rest and rest[0].isalpha():
            words.append(rest[0])
        return " ".join(words).upper()
    if isinstance(tree, (exp.Alias, exp.Condition)):  # a keyword sqlglot read as a name (CLEAR CACHE, LIST FILE)
        words = [w for w in tree.sql(dialect=DIALECT).split()[:3] if w.isalpha() and w.upper() != "AS"]
        return " ".join(words[:2]).upper() or tree.key.upper()
    return tree.key.upper()


def _regenerate(tree: exp.Query, views: set[str]) -> str:
    """The SQL Spark runs, generated from the checked tree; it must parse back to a tree that
    passes the same checks, reads only these views, and generates the same text."""
    try:
        sql = tree.sql(dialect=DIALECT, identify=True, comments=False)
    except (SqlglotError, ValueError) as exc:
        raise ReportError(f"the report's SQL cannot be written back for Spark: {_first_line(exc)}") from exc
    again = _parse_one(sql)
    check_tree(again, guard_calls=True)
    check_cte_names(again)
    for table in table_references(again):
        if table.db or table.catalog or table.name not in views:
            raise ReportError(f"the report's SQL does not survive its own rewrite: {snippet(table)}")
    if spark_sql_of(again) != sql:
        raise ReportError("the report's SQL does not read back the same after its rewrite "
                          "(a construct the checker cannot pass to Spark unchanged); simplify it")
    return sql


def spark_sql_of(tree: exp.Expression) -> str | None:
    try:
        return tree.sql(dialect=DIALECT, identify=True, comments=False)
    except (SqlglotError, ValueError):
        return None


def _first_line(exc: Exception) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]

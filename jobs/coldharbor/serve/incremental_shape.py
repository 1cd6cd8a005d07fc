"""Which reports can be refreshed incrementally (`-- refresh: incremental`), and their parts.

The shape (issue 23, part 2) is

    SELECT <keys>, <aggregates> FROM <one registered table> [WHERE <row predicate>] GROUP BY <keys>

with each aggregate COUNT(*), COUNT(x), SUM(x), AVG(x), MIN(x) or MAX(x) selected on its own (no
DISTINCT, no FILTER), and the keys, the predicate and the aggregates' arguments made of row
functions only (sql_allowlist.ROW_FUNCTIONS: one value out of one row's values). Such a report is
a sum over rows, so a change of rows changes it by the change's own contribution: the rows a
change removed counted negative, the rows it added positive. Anything else is refused for
incremental refresh, saying why, and the report is refreshed in full as before. An allow-list, as
the sandbox is: every node must be one this module knows the meaning of.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlglot import exp

from coldharbor.serve.sql_allowlist import ALLOWED_NODES, ROW_FUNCTIONS
from coldharbor.serve.sql_check import function_name, snippet
from coldharbor.serve.sql_guard import ParsedQuery

AGGREGATES = {"count": "count", "sum": "sum", "avg": "avg", "mean": "avg", "min": "min", "max": "max"}
SHAPE = ("SELECT keys, COUNT/SUM/AVG/MIN/MAX(...) FROM one table [WHERE row predicate] GROUP BY keys")
_SELECT_ARGS = {"expressions", "from_", "where", "group"}
_CLAUSES = {"with_": "a WITH clause", "joins": "a join (it reads more than one table)",
            "laterals": "a LATERAL VIEW", "distinct": "SELECT DISTINCT", "having": "HAVING",
            "windows": "a WINDOW clause", "order": "ORDER BY", "limit": "LIMIT", "offset": "OFFSET"}


class NotIncremental(Exception):
    """Why a report cannot be refreshed incrementally (it is refreshed in full)."""


@dataclass(frozen=True)
class Aggregate:
    kind: str                           # count | sum | avg | min | max
    argument: exp.Expression | None     # None: COUNT(*)


@dataclass(frozen=True)
class Output:
    """One column of the report: a grouping key's value or an aggregate's (by index)."""

    group: int | None = None
    aggregate: int | None = None


@dataclass(frozen=True)
class IncrementalShape:
    table: exp.Table                    # as written (resolved against the registry by the caller)
    where: exp.Expression | None
    groups: tuple[exp.Expression, ...]
    aggregates: tuple[Aggregate, ...]
    outputs: tuple[Output, ...]


def incremental_shape(parsed: ParsedQuery) -> IncrementalShape:
    """The report's parts, or NotIncremental saying (in a clause after "because") why not."""
    tree = parsed.tree
    if not isinstance(tree, exp.Select):
        raise NotIncremental(f"it is a {tree.key.upper()} of queries, not one SELECT")
    if parsed.feeds:
        raise NotIncremental("it reads a change feed (changes())")
    for key, value in tree.args.items():
        if key not in _SELECT_ARGS and value not in (None, False, []):
            raise NotIncremental(f"it has {_CLAUSES.get(key, key.rstrip('_').upper())}")
    source = tree.args["from_"].this
    if not isinstance(source, exp.Table):
        raise NotIncremental(f"it reads {snippet(source)}, not a table")
    group = tree.args.get("group")
    if group is None or not group.expressions:
        raise NotIncremental("it has no GROUP BY")
    extra = [k for k, v in group.args.items() if k != "expressions" and v not in (None, False, [])]
    if extra:
        raise NotIncremental(f"it groups by {extra[0].upper().replace('_', ' ')}")
    items = list(tree.expressions)
    aliases = {i.alias.lower(): i.this for i in items if isinstance(i, exp.Alias)}
    groups = tuple(_grouping_key(g, items, aliases) for g in group.expressions)
    where = tree.args.get("where")
    if where is not None:
        _require_row_level(where.this, "WHERE")
    aggregates: list[Aggregate] = []
    outputs: list[Output] = []
    texts = [snippet(g, 10_000) for g in groups]
    for item in items:
        value = item.this if isinstance(item, exp.Alias) else item
        if snippet(value, 10_000) in texts:
            outputs.append(Output(group=texts.index(snippet(value, 10_000))))
            continue
        aggregates.append(_aggregate(value))
        outputs.append(Output(aggregate=len(aggregates) - 1))
    return IncrementalShape(source, where.this if where is not None else None, groups, tuple(aggregates),
                            tuple(outputs))


def _grouping_key(node: exp.Expression, items: list[exp.Expression],
                  aliases: dict[str, exp.Expression]) -> exp.Expression:
    if isinstance(node, (exp.Rollup, exp.Cube, exp.GroupingSets)):
        raise NotIncremental(f"it groups by {snippet(node)}")
    if isinstance(node, exp.Literal) and not node.is_string:   # GROUP BY 1: the first select item
        position = int(node.name)
        if not 1 <= position <= len(items):
            raise NotIncremental(f"GROUP BY {position} names no select item")
        item = items[position - 1]
        node = item.this if isinstance(item, exp.Alias) else item
    elif isinstance(node, exp.Column) and not node.table and node.name.lower() in aliases:
        raise NotIncremental(f"GROUP BY {node.name} may name a select alias or a column; group by the "
                             "expression itself")
    _require_row_level(node, "GROUP BY")
    return node


def _aggregate(node: exp.Expression) -> Aggregate:
    if isinstance(node, exp.Filter):
        raise NotIncremental(f"{snippet(node)} has a FILTER clause; put the condition in WHERE or in a CASE")
    name = function_name(node) if isinstance(node, exp.Func) else None
    kind = AGGREGATES.get((name or "").lower())
    if kind is None:
        if any(isinstance(n, exp.Func) and (function_name(n) or "").lower() in AGGREGATES for n in node.walk()):
            raise NotIncremental(f"select item {snippet(node)} computes with an aggregate; select each "
                                 "aggregate on its own (a report over this one can combine them)")
        raise NotIncremental(f"select item {snippet(node)} is neither a GROUP BY expression nor an aggregate "
                             "of COUNT, SUM, AVG, MIN, MAX")
    arguments = list(node.expressions) if isinstance(node, exp.Anonymous) else [
        v for v in node.args.values() if isinstance(v, exp.Expression)]
    if len(arguments) != 1:
        raise NotIncremental(f"{snippet(node)} takes {len(arguments)} arguments; incremental refresh takes one")
    [argument] = arguments
    if isinstance(argument, exp.Distinct):
        raise NotIncremental(f"{snippet(node)} counts distinct values, which a change of one row cannot update")
    if isinstance(argument, exp.Star):
        if kind != "count":
            raise NotIncremental(f"{snippet(node)} takes * as its argument")
        return Aggregate("count", None)
    _require_row_level(argument, f"the argument of {kind.upper()}")
    return Aggregate(kind, argument)


def _require_row_level(node: exp.Expression, where: str) -> None:
    """NotIncremental unless every node of `node` computes one value out of one row's values."""
    for part in node.walk():
        if isinstance(part, exp.Window):
            raise NotIncremental(f"{where} holds a window function ({snippet(part)})")
        if isinstance(part, (exp.Subquery, exp.Select, exp.Exists)) or (
                isinstance(part, exp.In) and part.args.get("query") is not None):
            raise NotIncremental(f"{where} holds a subquery ({snippet(part)})")
        if isinstance(part, exp.Star):
            raise NotIncremental(f"{where} holds * ({snippet(part)})")
        if isinstance(part, exp.Func) and (type(part) not in ALLOWED_NODES or isinstance(part, exp.Anonymous)):
            name = (function_name(part) or part.key).lower()
            if name not in ROW_FUNCTIONS:
                raise NotIncremental(f"{where} calls {name}, which is not a function of one row's values")

"""The names in a report's checked tree: which references are tables (not a CTE in scope), the
registered table each one means (by `name` or `schema.name`, refused when it means none or
several), and the CTE names a report may not take (the views' and the lake's own prefix)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping

from sqlglot import exp

from coldharbor.capture.registry import RegisteredTable
from coldharbor.runtime.errors import ReportError, one_line
from coldharbor.serve.sql_check import ASCII_NAME

RESERVED_PREFIX = "_ch_"  # the views' and the lake's own names: no CTE may take one


def table_node(parts: tuple[str, ...]) -> exp.Table:
    return exp.Table(this=exp.to_identifier(parts[-1]), db=exp.to_identifier(parts[0]) if len(parts) == 2 else None)


def table_references(tree: exp.Expression) -> Iterator[exp.Table]:
    """Every table reference that is not a CTE in scope where it stands (Spark's scoping: a CTE is
    seen by the query it belongs to and by the CTEs after it in the same WITH)."""
    for table in list(tree.find_all(exp.Table)):
        if not (table.db or table.catalog) and cte_in_scope(table):
            continue
        yield table


def check_cte_names(tree: exp.Expression) -> None:
    seen: set[str] = set()
    for cte in tree.find_all(exp.CTE):
        name = cte.alias_or_name
        if not ASCII_NAME.fullmatch(name):
            raise ReportError(f"CTE name {name!r} is not allowed: use letters, digits and _")
        if name.lower().startswith(RESERVED_PREFIX):
            raise ReportError(f"CTE name {name} is not allowed: the prefix {RESERVED_PREFIX} is reserved")
        if name.lower() in seen:
            raise ReportError(f"CTE name {name} is defined twice: give each CTE its own name")
        seen.add(name.lower())


def cte_in_scope(table: exp.Table) -> bool:
    name = table.name.lower()
    child, node = table, table.parent
    while node is not None:
        if isinstance(node, exp.With) and isinstance(child, exp.CTE):
            earlier = node.expressions[: node.expressions.index(child)]
            if name in {c.alias_or_name.lower() for c in earlier}:
                return True
        elif isinstance(node.args.get("with_"), exp.With) and child is not node.args["with_"]:
            if name in {c.alias_or_name.lower() for c in node.args["with_"].expressions}:
                return True
        child, node = node, node.parent
    return False


def lookup(table: exp.Table, by_name: Mapping[str, list[RegisteredTable]]) -> RegisteredTable:
    """The registered table a reference names. Spark folds the case of names, so a reference matches
    every table whose name differs only in case; among several, the one spelled exactly as written
    (`public.CaseT` is "CaseT", `public.caset` is caset), else it is refused."""
    written = [p for p in (table.catalog, table.db, table.name) if p]
    key = ".".join(written).lower()
    candidates = by_name.get(key, [])
    if not candidates:
        raise ReportError(f"table {one_line(key)} is not a registered table (registered: {some_names(by_name)})")
    if len(candidates) > 1:
        exact = [t for t in candidates
                 if [t.schema_name, t.table_name][-len(written):] == written]
        if len(exact) != 1:
            spellings = " and ".join(one_line(t.qualified_name) for t in candidates)
            if len({t.table_name for t in candidates}) < len(candidates):
                raise ReportError(f"table name {one_line(key)} is ambiguous ({spellings}): qualify it")
            raise ReportError(f"table name {one_line('.'.join(written))} is ambiguous: registered tables {spellings} "
                              "differ only in case; write the name in its exact case")
        return exact[0]
    return candidates[0]


def some_names(by_name: Mapping[str, list[RegisteredTable]], shown: int = 10) -> str:
    """The first registered names, on one line (a name may hold a newline), and how many more."""
    names = sorted(one_line(n) for n in by_name if "." in n)
    if not names:
        return "none"
    return ", ".join(names[:shown]) + (f" and {len(names) - shown} more" if len(names) > shown else "")


def tables_by_name(registered: Iterable[RegisteredTable]) -> Mapping[str, list[RegisteredTable]]:
    """The tables each lower-case name may mean: schema.table, and the bare table name."""
    names: dict[str, list[RegisteredTable]] = {}
    for table in registered:
        names.setdefault(table.qualified_name.lower(), []).append(table)
        names.setdefault(table.table_name.lower(), []).append(table)
    return names

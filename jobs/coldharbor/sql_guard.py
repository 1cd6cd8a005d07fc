"""Validates a report's SQL with a real parser (sqlglot, Spark dialect) before anything runs.

Accepted: exactly one read-only query (SELECT, set operations, CTEs) whose table references are
registered tables (by `name` or `schema.name`) or its own CTEs, and whose functions are not on
the deny list. The query is then rewritten so each registered table reads its unified view.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import sqlglot
from sqlglot import exp
from sqlglot.errors import ParseError, TokenError

from coldharbor.errors import ReportError
from coldharbor.registry import RegisteredTable

# sqlglot warns on stdout-bound logs when it falls back to a Command; the check reports it itself.
logging.getLogger("sqlglot").setLevel(logging.ERROR)

# Functions that reach outside the query: JVM reflection, files, the session, the network.
DENIED_FUNCTIONS = frozenset({
    "reflect", "java_method", "try_reflect", "input_file_name", "input_file_block_start",
    "input_file_block_length", "read_files", "current_user", "session_user", "user",
    "url_decode", "url_encode", "parse_url", "from_avro", "from_protobuf", "schema_of_avro",
})
# Nodes that write, define or change anything, wherever they appear in the tree.
_FORBIDDEN_NODES = (exp.DML, exp.DDL, exp.Command, exp.Set, exp.Use, exp.Transaction, exp.Commit,
                    exp.Rollback, exp.Cache, exp.Uncache, exp.Refresh, exp.Pragma, exp.Into, exp.LoadData)


@dataclass(frozen=True)
class CheckedQuery:
    sql: str                                   # rewritten: registered tables read their views
    tables: tuple[RegisteredTable, ...]        # registered tables it reads, in first-use order
    parameters: frozenset[str]                 # the :name markers it uses


def view_name(table: RegisteredTable) -> str:
    return f"_ch_view_{table.table_id}"


def check_query(text: str, registered: Iterable[RegisteredTable]) -> CheckedQuery:
    """The validated, rewritten query, or ReportError saying what is wrong with it."""
    if not text or not text.strip():
        raise ReportError("the report has no SQL")
    try:
        statements = [s for s in sqlglot.parse(text, read="spark") if s is not None]
    except (ParseError, TokenError) as exc:
        raise ReportError(f"the report's SQL does not parse: {_first_line(exc)}") from exc
    if len(statements) != 1:
        raise ReportError(f"a report is exactly one SELECT; this SQL holds {len(statements)} statements")
    [tree] = statements
    if not isinstance(tree, exp.Query):
        raise ReportError(f"a report is a read-only SELECT; this SQL is a {tree.key.upper()} statement")
    for node in tree.walk():
        if isinstance(node, _FORBIDDEN_NODES):
            raise ReportError(f"a report is read-only; it may not contain {node.key.upper()}")
        if isinstance(node, exp.Func):
            name = (node.name if isinstance(node, exp.Anonymous) else node.sql_name()).lower()
            if name in DENIED_FUNCTIONS:
                raise ReportError(f"function {name} is not allowed in a report")
        if isinstance(node, exp.Hint):
            raise ReportError("query hints are not allowed in a report")
    return _resolve_tables(tree, registered)


def _resolve_tables(tree: exp.Query, registered: Iterable[RegisteredTable]) -> CheckedQuery:
    by_name = _names(registered)
    cte_names = {cte.alias_or_name.lower() for cte in tree.find_all(exp.CTE)}
    used: dict[int, RegisteredTable] = {}
    for table in list(tree.find_all(exp.Table)):
        if not isinstance(table.this, exp.Identifier):
            raise ReportError(f"a report reads registered tables only, not {table.sql(dialect='spark')}")
        parts = [p.lower() for p in (table.catalog, table.db, table.name) if p]
        key = ".".join(parts)
        if len(parts) == 1 and key in cte_names:
            continue
        match = by_name.get(key)
        if match is None:
            raise ReportError(f"table {key} is not a registered table "
                              f"(registered: {', '.join(sorted(n for n in by_name if '.' in n)) or 'none'})")
        if isinstance(match, str):
            raise ReportError(match)
        used.setdefault(match.table_id, match)
        # In place, so that what hangs off the reference (sample, pivot, alias columns) stays.
        if not table.alias:
            table.set("alias", exp.TableAlias(this=exp.to_identifier(table.name)))
        table.set("this", exp.to_identifier(view_name(match)))
        table.set("db", None)
        table.set("catalog", None)
    if not used:
        raise ReportError("the report reads no registered table")
    parameters = frozenset(p.name for p in tree.find_all(exp.Placeholder) if p.name)
    return CheckedQuery(tree.sql(dialect="spark"), tuple(used.values()), parameters)


def _names(registered: Iterable[RegisteredTable]) -> Mapping[str, RegisteredTable | str]:
    """schema.table always; the bare table name too when only one schema has it."""
    names: dict[str, RegisteredTable | str] = {}
    for table in registered:
        names[table.qualified_name.lower()] = table
        bare = table.table_name.lower()
        if bare in names:
            other = names[bare]
            first = other.qualified_name if isinstance(other, RegisteredTable) else "several schemas"
            names[bare] = f"table name {bare} is ambiguous ({first} and {table.qualified_name}): qualify it"
        else:
            names[bare] = table
    return names


def _first_line(exc: Exception) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]

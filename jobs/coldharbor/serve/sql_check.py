"""Walks a parsed report against the allow-list (coldharbor.serve.sql_allowlist) and names what is refused.

Every node of the tree is either a class on ALLOWED_NODES, carrying only the arguments listed for
it, or a function call whose Spark name is on ALLOWED_FUNCTIONS. Table references are checked by
coldharbor.serve.sql_guard, which knows the registry.
"""

from __future__ import annotations

import re
import unicodedata

from sqlglot import exp
from sqlglot.dialects.spark import Spark
from sqlglot.errors import SqlglotError

from coldharbor.runtime.errors import ReportError
from coldharbor.serve.sql_allowlist import (
    ALLOWED_FUNCTIONS,
    ALLOWED_NODES,
    GUARD_FUNCTIONS,
    NAME_ARGS,
    SPARK_PARENTHESIS_FREE_FUNCTIONS,
    TIME_UNITS,
)

# ASCII only: Spark lower-cases names in Java, where some non-ASCII letters fold onto ASCII ones.
ASCII_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")  # use fullmatch: a "$" also takes a trailing newline
# How a function call starts in the generated SQL: NAME( or `NAME`(, or NAME alone (CURRENT_DATE).
_CALL = re.compile(r"^(?:`([^`]*)`|([A-Za-z_][A-Za-z0-9_]*))(?:\(|$)")
_NOT_LISTED = object()


# Calls sqlglot keeps typed: Spark's own syntax takes a unit keyword there (DATEADD(DAY, 1, d)).
_TYPED_CALLS = frozenset({"DATE_ADD", "DATEADD", "TIMESTAMPADD", "TIMESTAMPDIFF", "DATEDIFF", "DATE_DIFF"})


class SparkReportSql(Spark):
    """Spark's dialect, read and written without translation, so that Spark runs what was checked.

    '' inside a string literal is one quote, as Spark 4 reads it (sqlglot's Spark dialect reads
    'it''s' as two adjacent literals). Function calls stay as written, name and arguments
    (sqlglot would otherwise rewrite some: a JSON path or a date format string it re-spells, a
    percentile_cont it runs as percentile_approx), except the few whose Spark syntax takes a unit.
    """

    class Tokenizer(Spark.Tokenizer):
        STRING_ESCAPES = ["\\", "'"]

    class Parser(Spark.Parser):
        FUNCTIONS = {name: build for name, build in Spark.Parser.FUNCTIONS.items() if name in _TYPED_CALLS}


DIALECT = SparkReportSql


def spark_sql(node: exp.Expression) -> str | None:
    """The node as the Spark SQL the job would run; None if sqlglot cannot write it."""
    try:
        return node.sql(dialect=DIALECT, comments=False)
    except (SqlglotError, ValueError, RecursionError):
        return None


def snippet(node: exp.Expression, limit: int = 80) -> str:
    """The node as Spark SQL on one line, shortened: how a refusal shows the construct."""
    text = " ".join((spark_sql(node) or node.key.upper()).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def check_tree(tree: exp.Expression, guard_calls: bool = False) -> None:
    """ReportError naming the first node (breadth first) that the allow-list does not admit;
    `guard_calls`: the tree is the guard's own rewrite, whose GUARD_FUNCTIONS calls are admitted."""
    for node in tree.walk():
        allowed_args = ALLOWED_NODES.get(type(node), _NOT_LISTED)
        if allowed_args is _NOT_LISTED:
            if not isinstance(node, exp.Func):
                raise ReportError(f"a report may not contain {node.key.upper()}: {snippet(node)} "
                                  "(not on the report allow-list)")
            if not (guard_calls and isinstance(node, exp.Anonymous) and node.name.lower() in GUARD_FUNCTIONS):
                check_function(node)
            continue
        if allowed_args is not None:
            extra = [key for key, value in node.args.items() if key not in allowed_args and value not in (None, False, [])]
            if extra:
                raise ReportError(f"a report may not contain {extra[0].rstrip('_').upper()} in "
                                  f"{node.key.upper()}: {snippet(node)} (not on the report allow-list)")
        _check_names(node)
        _check_values(node)


def function_name(node: exp.Func) -> str | None:
    """The name Spark resolves for this call: as written for an unknown function, else the name the
    generated SQL calls. None when the generated SQL is no plain call (an operator or clause)."""
    if isinstance(node, exp.Anonymous):
        return node.name
    match = _CALL.match(spark_sql(node) or "")
    return (match[1] or match[2]) if match else None


def check_function(node: exp.Func) -> str:
    """The call's lower-case Spark name if the allow-list has it; otherwise ReportError naming it."""
    name = function_name(node)
    if name is None:
        raise ReportError(f"a report may not contain {node.key.upper()}: {snippet(node)} "
                          "(not on the report allow-list)")
    shown = name.lower() if ASCII_NAME.fullmatch(name) else name
    if shown not in ALLOWED_FUNCTIONS:
        raise ReportError(f"function {shown} is not allowed in a report: it is not on the report "
                          f"allow-list ({snippet(node)})")
    return shown


def _check_names(node: exp.Expression) -> None:
    """What names a thing (an alias, a table or column qualifier, a lambda's variables) is an identifier."""
    for key in NAME_ARGS.get(type(node), ()):
        value = node.args.get(key)
        for part in value if isinstance(value, list) else [value]:
            if part is None or isinstance(part, exp.Identifier):
                continue
            if isinstance(node, exp.Dot) and isinstance(part, exp.Func):
                raise ReportError(f"function {function_name(part) or part.key} is not allowed in a report with a "
                                  f"qualified name ({snippet(node)}): call built-in functions by their bare name")
            raise ReportError(f"a report may not contain {part.key.upper()} where {node.key.upper()} takes a name: "
                              f"{snippet(node)} (not on the report allow-list)")


def _check_values(node: exp.Expression) -> None:
    """The checks an allowed class needs on its values, not only on its shape."""
    if isinstance(node, exp.Column):
        _check_bare_column(node)
    elif isinstance(node, exp.Table) and not isinstance(node.this, exp.Identifier):
        _refuse_table_function(node)
    elif isinstance(node, exp.Lateral) and node.args.get("view") and not ASCII_NAME.fullmatch(node.alias):
        # sqlglot writes a LATERAL VIEW's table name unquoted: it must need no quotes
        raise ReportError(f"LATERAL VIEW name {node.alias!r} is not allowed in a report: use letters, digits and _")
    elif isinstance(node, exp.Placeholder):
        if not isinstance(node.this, str) or not ASCII_NAME.fullmatch(node.this):
            raise ReportError(f"parameter marker {snippet(node)} is not allowed in a report: "
                              "name every parameter (:name) and declare it in the header")
    elif isinstance(node, exp.Var) and node.name.lower() not in TIME_UNITS:
        raise ReportError(f"a report may not contain the keyword {node.name}: only time units stand bare "
                          "(not on the report allow-list)")


def _refuse_table_function(table: exp.Table) -> None:
    if isinstance(table.this, exp.Func):
        name = (function_name(table.this) or table.this.key).lower()
        raise ReportError(f"function {name} is not allowed in a report as a table: a report reads registered "
                          f"tables only, not table-valued functions ({snippet(table)})")
    raise ReportError(f"a report reads registered tables only, not {snippet(table)}")


def _check_bare_column(column: exp.Column) -> None:
    """A one-part column Spark would answer with a function (`user`, `current_date`) is that call."""
    if column.table or not isinstance(column.this, exp.Identifier):
        return
    for function in SPARK_PARENTHESIS_FREE_FUNCTIONS - ALLOWED_FUNCTIONS:
        if could_fold_to(column.name, function):
            raise ReportError(f"column {column.name} is not allowed in a report: Spark reads a bare "
                              f"{function} as the function {function}(), which is not on the report "
                              "allow-list; qualify the column with its table (t.column) if it has one")


def could_fold_to(name: str, target: str) -> bool:
    """Whether Java's case-insensitive comparison could find `name` equal to the ASCII `target`:
    each character is compared with its upper, lower, case-folded and decomposed forms, so that
    `uſer` (with a long s) counts as `user`, as it does in Spark's name resolution."""
    if len(name) != len(target):
        return False
    for char, wanted in zip(name, target):
        forms = {char, char.lower(), char.upper(), char.casefold(), unicodedata.normalize("NFKD", char)[:1]}
        if wanted not in {form.lower() for form in forms if len(form) == 1}:
            return False
    return True

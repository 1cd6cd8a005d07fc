"""JSON-schema string patterns for DAG Params that must match a whole value.

Airflow checks a Param's `pattern` with jsonschema, which runs Python's `re.search`: there `$`
also matches before a final newline, so `^...$` accepts "public.orders\n" and the newline reaches
the job's command line. `(?![\\s\\S])` (nothing follows) ends the value in Python and in the
ECMA-262 regexes of the trigger form alike.
"""

from __future__ import annotations


def whole(pattern: str) -> str:
    """A pattern that matches only a value it matches from its first to its last character."""
    return rf"^(?:{pattern})(?![\s\S])"

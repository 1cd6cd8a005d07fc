"""Domain errors: each one is a clear, single-line message and a non-zero exit for the jobs."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol


class ColdharborError(Exception):
    """Base class: a problem the user can fix; the job prints it without a traceback."""


class ConfigError(ColdharborError, ValueError):
    """A setting is missing or malformed."""


class UnknownTableError(ColdharborError, LookupError):
    """A table name that is not registered with Coldharbor."""


class PostgresUnavailableError(ColdharborError):
    """The hot tier cannot be reached."""


class LakeUnavailableError(ColdharborError):
    """The lake location cannot be read or written."""


class ReportError(ColdharborError, ValueError):
    """A report definition, its SQL, a parameter or its target is not acceptable."""


class TableBusyError(ColdharborError):
    """Another job holds a lock the operation needs; nothing was changed."""


class PrivilegeError(ColdharborError):
    """A role lacks a PostgreSQL privilege the job needs; nothing was changed."""


class UnrepresentableValueError(ColdharborError):
    """A row holds a value the lake cannot hold exactly; nothing of the table was written."""


class SparkUnavailableError(ColdharborError):
    """The Spark Connect server the jobs use cannot be reached (or was restarted mid-job)."""


class TablesFailed(ColdharborError):
    """A run over several tables left some out, each named with its reason; the others were done."""


class _TableOutcome(Protocol):
    table: str
    status: str
    error: str | None


def raise_if_tables_failed(results: Sequence[_TableOutcome], verb: str) -> None:
    """TablesFailed naming each `failed` table of a run and why (the one table's own reason alone
    when the run had just that one), after the others were done."""
    failed = [r for r in results if r.status == "failed"]
    if len(results) == 1 and failed:
        raise TablesFailed(failed[0].error)
    if failed:
        raise TablesFailed(f"{len(failed)} of {len(results)} tables not {verb} (the other "
                           f"{len(results) - len(failed)} were): "
                           + "; ".join(f"{r.table}: {r.error}" for r in failed))


def one_line(text: str) -> str:
    """`text` with control characters (a newline in a table or column name) escaped: a message
    holding it stays one line."""
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text)


def jvm_message(exc: Exception) -> str:
    text = str(exc).strip().splitlines()
    for line in text:  # the first JVM exception line names the cause
        if "Exception:" in line or "Error:" in line:
            return line.strip()[:500]
    return (text[0] if text else type(exc).__name__)[:500]

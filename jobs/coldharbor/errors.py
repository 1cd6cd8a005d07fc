"""Domain errors: each one is a clear, single-line message and a non-zero exit for the jobs."""

from __future__ import annotations


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

"""What a Spark failure means to the user, in one line: a Spark Connect server gone or restarted
(`lost_spark`), or a value the query could not compute (`data_error`: the report's data, not the
pipeline). Imports neither pyspark nor grpc until it is asked, so a job's error path stays cheap."""

from __future__ import annotations

import os
import re

from coldharbor.runtime import settings
from coldharbor.runtime.errors import ColdharborError, SparkUnavailableError

# What the Connect client says when the server is gone: its gRPC status (retried until the budget
# ran out), or a server restarted since the session was opened (it knows the session no longer).
_LOST_SERVER_MARKERS = ("StatusCode.UNAVAILABLE", "RETRIES_EXCEEDED", "INVALID_HANDLE.SESSION_NOT_FOUND",
                        "INVALID_HANDLE.SESSION_CHANGED")


_TLS_FAILURES = ("tsi_protocol_failure", "handshake failed")  # matched in lower case


def lost_spark(exc: BaseException) -> ColdharborError | None:
    """The one-line error for a job whose Spark Connect server is unreachable or was restarted,
    or None when the failure is something else (a classic session never has this cause)."""
    url = os.environ.get(settings.SPARK_REMOTE_ENV)
    if not url:
        return None
    chain = _causes(exc)
    if any(isinstance(e, SparkUnavailableError) for e in chain):
        return next(e for e in chain if isinstance(e, SparkUnavailableError))
    if not any(marker in f"{e!r} {e}" for e in chain for marker in _LOST_SERVER_MARKERS):
        return None
    import grpc

    details = [str(e.details()) for e in chain
               if isinstance(e, grpc.RpcError) and callable(getattr(e, "details", None))]
    why = details[0] if details else first_line(exc)
    shown = settings.shown_remote(url)
    if any(marker in f"{e!r} {e}".lower() for e in chain for marker in _TLS_FAILURES):
        return SparkUnavailableError(f"the Spark Connect server at {shown} does not speak TLS, which a token or "
                                     f"use_ssl=true in the URL asks for ({why[:300]}); fix the URL or the server")
    return SparkUnavailableError(f"the Spark Connect server at {shown} is unreachable or was restarted ({why[:300]}); "
                                 "start it (`make run`) and run the job again")


DATA_EXCEPTION = "22"  # the SQLSTATE class of errors in the data: division by zero, overflow, a bad cast...


RAISED = "P0"  # raise_error(...): the report's own (or sql_guard's bound on the texts it builds)


# Spark's advice to turn ANSI mode off, a setting a report cannot change: the sentence goes.
_NOT_FOR_USERS = re.compile(r"\s*If necessary set \S+ to \S+ to bypass this error[^.]*\.", re.IGNORECASE)


# The same error as text, where Spark wrapped it (a task's failure inside a write's, as the JVM tells it).
_DATA_EXCEPTION_TEXT = re.compile(r"\[[A-Z][A-Z0-9_.]*\] [^\n]*?SQLSTATE: (?:22|P0)[0-9A-Z]{3}")


# Java's own errors for a value a function was given (no SQLSTATE): a regular expression that does
# not compile, a format string its arguments do not fit.
# (Not NumberFormatException or ArithmeticException: a setting or a library deep in a write's stack
# throws those too, and a lake or a bug must not pass for the report's data.)
_VALUE_ERROR_TEXT = re.compile(r"java\.util\.(?:regex\.PatternSyntaxException|[A-Za-z]*Format[A-Za-z]*Exception): [^\n]*")


def data_error(exc: BaseException) -> str | None:
    """Spark's one line for a value it could not compute while running a query, without its advice
    to turn ANSI mode off: a SQLSTATE of class 22 (a data exception: a division by zero, an
    overflow, a cast of text that is no number, an index out of range), or Java's error for a value
    a function was given (a regular expression that does not compile, a format string its
    arguments do not fit). None for any other failure."""
    from pyspark.errors import PySparkException

    chain = _causes(exc)
    for cause in chain:
        if isinstance(cause, PySparkException) and (cause.getSqlState() or "")[:2] in (DATA_EXCEPTION, RAISED):
            return _shown(cause.getMessage() if hasattr(cause, "getMessage") else str(cause))
    for pattern in (_DATA_EXCEPTION_TEXT, _VALUE_ERROR_TEXT):
        for cause in chain:
            found = pattern.search(str(cause))
            if found:
                return _shown(found.group(0))
    return None


def _shown(text: str) -> str:
    return " ".join(_NOT_FOR_USERS.sub("", text.strip().splitlines()[0]).split())[:500]


def _causes(exc: BaseException) -> list[BaseException]:
    chain: list[BaseException] = []
    seen: BaseException | None = exc
    while seen is not None and len(chain) < 10:
        chain.append(seen)
        seen = seen.__cause__ or seen.__context__
    return chain


def first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return (lines[0] if lines else type(exc).__name__)[:300]

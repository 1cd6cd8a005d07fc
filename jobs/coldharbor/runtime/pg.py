"""PostgreSQL connections, advisory locks and the JDBC view of the same server."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from urllib.parse import quote

import psycopg
from psycopg.conninfo import conninfo_to_dict

from coldharbor.runtime import settings
from coldharbor.runtime.errors import ConfigError, PostgresUnavailableError

log = logging.getLogger(__name__)

CONNECT_TIMEOUT_S = 10
APPLICATION_NAME = "coldharbor"

# The DSN parameters Coldharbor passes on, and their name among the PostgreSQL JDBC driver's
# connection properties: the same server, TLS checks, session options and name for psycopg and
# for Spark's JDBC readers and writers. Anything else is refused rather than honoured by one side
# only (sslkey, for one, is PEM for libpq but PKCS-8 DER for the JDBC driver).
JDBC_PROPERTIES = {"sslmode": "sslmode", "sslrootcert": "sslrootcert", "options": "options",
                   "application_name": "ApplicationName", "connect_timeout": "connectTimeout"}
ADDRESS_PARAMETERS = ("host", "port", "dbname", "user", "password")
# libpq's parse errors quote the offending text, which may be the password: they are not repeated.
UNPARSABLE_DSN = ("the PostgreSQL DSN does not parse (libpq's message is withheld: it may quote the password); "
                  "check its quoting, or percent-encode special characters in a URL")
# Values libpq and the JDBC driver both accept for the parameters checked before anything connects
# (libpq would report a bad one as a connection failure, psycopg a bad timeout with a traceback).
SSL_MODES = ("disable", "allow", "prefer", "require", "verify-ca", "verify-full")

# First key of the two-key advisory lock: one namespace per job kind, the table id is the second.
LOCK_NAMESPACES = {"export": 0x43480001, "compact": 0x43480002, "cleanup": 0x43480003,
                   "lake_commit": 0x43480004,
                   # Not per table: a report run's lease (by lease id), a report table's swap (by name).
                   "report_run": 0x43480005, "report_table": 0x43480006,
                   # An incremental report's state (by a hash of its target's name).
                   "incremental_state": 0x43480008}
# Every job session, psycopg and JDBC, runs with these, whatever the server's or the DSN's defaults
# (timestamps read back in UTC, binary in hex, floats exact). Key identity does not rely on them
# (coldharbor.key_sql builds keys no setting changes); the values the jobs read and write do.
SESSION_SETTINGS = {"TimeZone": "UTC", "DateStyle": "ISO", "IntervalStyle": "postgres",
                    "bytea_output": "hex", "extra_float_digits": "3"}


def pinned_options(options: str | None) -> str:
    """The DSN's `options` with SESSION_SETTINGS appended (later -c switches win)."""
    pinned = " ".join(f"-c {name}={value}" for name, value in SESSION_SETTINGS.items())
    return f"{options} {pinned}" if options else pinned


def session_settings_sql() -> str:
    """SESSION_SETTINGS as SET statements: for JDBC sessions, whose driver sends its own TimeZone
    after the options (the JVM's zone) at connection start."""
    return "".join(f"SET {name} = '{value}'; " for name, value in SESSION_SETTINGS.items())


def connect(dsn: str, *, autocommit: bool = True) -> psycopg.Connection:
    """A connection to the hot tier, or PostgresUnavailableError saying where it failed.

    The DSN's own parameters (sslmode, options, application_name, ...) apply as given; without an
    application_name the session is named "coldharbor"; SESSION_SETTINGS are added to its options."""
    params = dsn_params(dsn)
    try:
        return psycopg.connect(dsn, autocommit=autocommit, connect_timeout=params.get("connect_timeout")
                               or CONNECT_TIMEOUT_S, application_name=params.get("application_name")
                               or APPLICATION_NAME, options=pinned_options(params.get("options")))
    except psycopg.ProgrammingError:  # a value libpq refuses: its message may quote the DSN
        raise ConfigError("the PostgreSQL DSN is malformed (a parameter has a value libpq refuses; "
                          "libpq's message is withheld: it may quote the password)") from None
    except psycopg.OperationalError as exc:
        target = describe(dsn)
        first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise PostgresUnavailableError(f"PostgreSQL at {target} is unreachable: {first_line}") from exc


# What a Spark JDBC reader or writer reports when PostgreSQL went away under it: SQLSTATE class 08
# (connection exception), 57P01-57P03 (shutdown, crash, not accepting connections yet), and an
# exported snapshot whose exporting session ended with the server (SQLSTATE 22023, by message).
_LOST_STATE_CLASS = "08"
_LOST_STATES = ("57P01", "57P02", "57P03")
_LOST_MARKERS = ("Connection to ", "An I/O error occurred while sending to the backend",
                 "This connection has been closed", "terminating connection due to",
                 "the database system is shutting down", "the database system is starting up",
                 "invalid snapshot identifier")
_PSQL_EXCEPTION = "org.postgresql.util.PSQLException"


def lost_postgres(exc: BaseException) -> PostgresUnavailableError | None:
    """The one-line error for a Spark job (JDBC read or write) that failed because PostgreSQL was
    lost, or None when the failure is something else (a bug keeps its traceback)."""
    psql = _psql_exception(getattr(exc, "java_exception", None) or getattr(exc, "_origin", None))
    if psql is not None:
        state, message = str(psql.getSQLState() or ""), str(psql.getMessage() or "")
        lost = state.startswith(_LOST_STATE_CLASS) or state in _LOST_STATES or _LOST_MARKERS[-1] in message
    else:  # no JVM object at hand (Spark Connect): the text Spark relays
        _, found, message = str(exc).partition(f"{_PSQL_EXCEPTION}: ")
        lost = bool(found) and any(marker in message.split("\n", 1)[0] for marker in _LOST_MARKERS)
    if not lost:
        return None
    first_line = (message.strip().splitlines() or ["the connection was lost"])[0][:300]
    return PostgresUnavailableError(f"lost PostgreSQL during a Spark JDBC read or write: {first_line}")


def lock_timed_out(exc: BaseException) -> bool:
    """Whether a Spark job failed because a JDBC reader's lock_timeout ran out (SQLSTATE 55P03)."""
    psql = _psql_exception(getattr(exc, "java_exception", None) or getattr(exc, "_origin", None))
    if psql is not None:
        return str(psql.getSQLState() or "") == "55P03"
    return f"{_PSQL_EXCEPTION}: ERROR: canceling statement due to lock timeout" in str(exc)


def _psql_exception(java_exc):
    """The PostgreSQL driver's exception in a JVM exception's cause chain, or None."""
    seen = 0
    while java_exc is not None and seen < 20:
        try:
            if java_exc.getClass().getName() == _PSQL_EXCEPTION:
                return java_exc
            java_exc = java_exc.getCause()
        except Exception:  # not a py4j object (or the gateway is gone)
            return None
        seen += 1
    return None


def describe(dsn: str) -> str:
    """host:port/dbname of a DSN, without credentials, for messages and logs."""
    try:
        params = conninfo_to_dict(dsn)
    except psycopg.ProgrammingError:
        raise ConfigError(UNPARSABLE_DSN) from None
    return f"{params.get('host', 'localhost')}:{params.get('port', 5432)}/{params.get('dbname', '')}"


@contextmanager
def advisory_lock(conn: psycopg.Connection, kind: str, table_id: int) -> Iterator[bool]:
    """Try the session-level lock of one job kind on one table; yields whether it was taken.

    Session-level on a pinned connection: it holds across the transactions of the job and is
    released when the job ends or its connection dies.
    """
    namespace = LOCK_NAMESPACES[kind]
    acquired = conn.execute("SELECT pg_try_advisory_lock(%s, %s)", (namespace, table_id)).fetchone()[0]
    try:
        yield bool(acquired)
    finally:
        if acquired and not conn.closed:
            conn.execute("SELECT pg_advisory_unlock(%s, %s)", (namespace, table_id))


@contextmanager
def lake_commit_lock(conn: psycopg.Connection, table_id: int, path: str) -> Iterator[None]:
    """Holds the table's lake commit lock (blocking) around one Delta write, where the store needs it.

    Delta commits version N by creating `_delta_log/N.json` only if it is absent. A local disk or
    HDFS does that atomically; S3 through s3a does not across processes (Delta's S3 log store
    excludes writers of one JVM only), so two jobs committing to one table at once could both write
    version N and one commit would be lost. Export, compaction, purge and VACUUM therefore commit
    to an S3 table one at a time under this session lock, released when the job's connection dies.
    """
    if not settings.lake_commit_lock_needed(path):
        yield
        return
    key = (LOCK_NAMESPACES["lake_commit"], table_id)
    if not conn.execute("SELECT pg_try_advisory_lock(%s, %s)", key).fetchone()[0]:
        log.info("waiting for the lake commit lock of table %s (another job is committing to %s)", table_id, path)
        conn.execute("SELECT pg_advisory_lock(%s, %s)", key)
    try:
        yield
    finally:
        if not conn.closed:
            conn.execute("SELECT pg_advisory_unlock(%s, %s)", key)


def dsn_params(dsn: str) -> dict[str, str]:
    """The DSN's parameters, or a ConfigError naming the first one Coldharbor does not pass on."""
    try:
        params = conninfo_to_dict(dsn)
    except psycopg.ProgrammingError:
        raise ConfigError(UNPARSABLE_DSN) from None
    unknown = sorted(set(params) - set(ADDRESS_PARAMETERS) - set(JDBC_PROPERTIES))
    if unknown:
        raise ConfigError(f"the PostgreSQL DSN parameter {unknown[0]!r} is not supported: Coldharbor passes "
                          f"{', '.join((*ADDRESS_PARAMETERS, *JDBC_PROPERTIES))} to both psycopg and Spark's "
                          "JDBC driver, and nothing else")
    params = {k: str(v) for k, v in params.items()}
    _check_values(params)
    return params


def _check_values(params: dict[str, str]) -> None:
    """A port, timeout or sslmode both drivers accept; these values are never secret, so named."""
    for port in filter(None, params.get("port", "").split(",")):
        if not (port.isascii() and port.isdigit() and 0 < int(port) < 65536):
            raise ConfigError(f"the PostgreSQL DSN's port {port!r} is not a port number (1-65535)")
    timeout = params.get("connect_timeout")
    if timeout is not None and not (timeout.isascii() and timeout.isdigit()):
        raise ConfigError(f"the PostgreSQL DSN's connect_timeout {timeout!r} is not a whole number of seconds")
    sslmode = params.get("sslmode")
    if sslmode is not None and sslmode not in SSL_MODES:
        raise ConfigError(f"the PostgreSQL DSN's sslmode {sslmode!r} is not one of {', '.join(SSL_MODES)}")


@dataclass(frozen=True)
class JdbcTarget:
    """The same server as a DSN, addressed the way Spark's JDBC source wants it."""

    url: str
    user: str
    password: str | None
    properties: dict[str, str] = field(default_factory=dict)

    @classmethod
    def from_dsn(cls, dsn: str) -> JdbcTarget:
        """The URL names only host, port and database; the DSN's TLS settings, session options and
        application name become JDBC properties, unchanged (application_name defaults to
        "coldharbor", as for psycopg); the password is a property too, never part of the URL."""
        params = dsn_params(dsn)
        host = params.get("host") or "127.0.0.1"
        if host.startswith("/"):
            raise ConfigError("Spark's JDBC needs TCP: the PostgreSQL DSN names a Unix socket; "
                              "use host=127.0.0.1 (or the server's address) and a port")
        if "," in host:
            raise ConfigError("the PostgreSQL DSN names several hosts; Coldharbor's JDBC readers need one")
        port = params.get("port") or "5432"
        dbname = params.get("dbname") or params.get("user") or "postgres"
        properties = {JDBC_PROPERTIES[k]: v for k, v in params.items() if k in JDBC_PROPERTIES}
        properties.setdefault("ApplicationName", APPLICATION_NAME)
        properties["options"] = pinned_options(properties.get("options"))
        return cls(url=f"jdbc:postgresql://{_url_host(host)}:{port}/{quote(dbname, safe='')}",
                   user=params.get("user") or "postgres", password=params.get("password"), properties=properties)

    def options(self) -> dict[str, str]:
        """Reader and writer options; the password travels as an option (Spark redacts it in plans
        and its UI), never inside the URL."""
        opts = {"url": self.url, "user": self.user, "driver": "org.postgresql.Driver", **self.properties}
        if self.password:
            opts["password"] = self.password
        return opts


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host and not host.startswith("[") else host  # an IPv6 address

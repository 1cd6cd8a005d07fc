"""The PostgreSQL roles of sql/migrations/009_roles.sql, as set-up uses them: login passwords and DSNs.

    coldharbor_owner     owns the schema; capture, registration, eviction and purge run as it
    coldharbor_pipeline  the jobs' login (COLDHARBOR_PG_DSN)
    coldharbor_app       what applications that register tables or write entities are granted
"""

from __future__ import annotations

import logging
from urllib.parse import quote

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict

log = logging.getLogger(__name__)

OWNER = "coldharbor_owner"
PIPELINE = "coldharbor_pipeline"
APP = "coldharbor_app"


def set_password(conn: psycopg.Connection, role: str, password: str) -> None:
    """Sets a login role's password. The server receives a SCRAM verifier computed here, never the
    password itself, so no statement log or error message can show it."""
    verifier = conn.pgconn.encrypt_password(password.encode(), role.encode(), b"scram-sha-256").decode()
    conn.execute(sql.SQL("ALTER ROLE {} PASSWORD {}").format(sql.Identifier(role), sql.Literal(verifier)))


def ensure_app_login(conn: psycopg.Connection, role: str, password: str) -> None:
    """An application's login role (created if missing), a member of coldharbor_app, with this password."""
    exists = conn.execute("SELECT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = %s)", (role,)).fetchone()[0]
    if not exists:
        conn.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(role)))
        log.info("created the application role %s", role)
    conn.execute(sql.SQL("GRANT {} TO {}").format(sql.Identifier(APP), sql.Identifier(role)))
    set_password(conn, role, password)


def login_dsn(dsn: str, role: str, password: str) -> str:
    """The same server and database as `dsn`, logging in as `role` (a URL: the env files are sourced
    by a shell)."""
    params = conninfo_to_dict(dsn)
    host = params.get("host") or "127.0.0.1"
    port = params.get("port") or "5432"
    dbname = params.get("dbname") or params.get("user") or "postgres"
    return f"postgresql://{quote(role, safe='')}:{quote(password, safe='')}@{host}:{port}/{quote(dbname, safe='')}"


def dsn_user(dsn: str) -> str | None:
    return conninfo_to_dict(dsn).get("user")

"""Moving a staged report result into its PostgreSQL report table without replacing the table.

A report table is something readers build on: roles are granted SELECT on it, views read it, it
may belong to another role. Dropping it and renaming the staged table in its place loses the
grants, fails when a view depends on it, and hands the table to the job's role. So, in one
transaction:

- same columns (names and types, in order): DELETE every row, INSERT the staged rows, drop the
  stage. The table keeps its identity (grants, owner, views, indexes). A reader sees the old rows
  until the commit and the new rows after it, under any isolation level (a REPEATABLE READ reader
  keeps its snapshot's rows: DELETE is MVCC-safe, TRUNCATE is not), and is never blocked: nothing
  stronger than ROW EXCLUSIVE is taken on the table.
- other columns (the report's SELECT changed): the staged table replaces it (drop + rename) and
  receives its table grants and its owner; when views or other objects depend on it the run is
  refused naming them, and nothing changes.
- no table yet: the staged table is renamed to it.

Two runs writing one target take a transaction-level advisory lock on its name first: without it
both DELETEs could see only the rows before either commit, and the table would hold both results.
"""

from __future__ import annotations

import logging

import psycopg
from psycopg import sql

from coldharbor.runtime.errors import ReportError
from coldharbor.runtime.pg import LOCK_NAMESPACES
from coldharbor.serve.report_spec import REPORTS_SCHEMA

log = logging.getLogger(__name__)


def swap_in(conn: psycopg.Connection, stage: str, target: str) -> int:
    """Makes the rows of reports.<stage> the rows of reports.<target> in one transaction and drops
    the stage; returns the row count. ReportError (nothing changed) when the columns changed and
    other objects depend on the target."""
    staged, table = sql.Identifier(REPORTS_SCHEMA, stage), sql.Identifier(REPORTS_SCHEMA, target)
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(%s, hashtext(%s))",
                     (LOCK_NAMESPACES["report_table"], f"{REPORTS_SCHEMA}.{target}"))
        current = _columns(conn, table)
        if not current:
            rows = _count(conn, staged)
            conn.execute(sql.SQL("ALTER TABLE {} RENAME TO {}").format(staged, sql.Identifier(target)))
        elif current == _columns(conn, staged):
            _require(conn, target, "the new result is written into it in place", "SELECT, INSERT, DELETE")
            conn.execute(sql.SQL("DELETE FROM {}").format(table))
            names = sql.SQL(", ").join(sql.Identifier(name) for name, _ in current)
            rows = conn.execute(sql.SQL("INSERT INTO {} ({}) SELECT {} FROM {}").format(
                table, names, names, staged)).rowcount
            conn.execute(sql.SQL("DROP TABLE {}").format(staged))
        else:
            rows = _count(conn, staged)
            _replace(conn, stage, target, current)
    return rows


def _columns(conn: psycopg.Connection, table: sql.Identifier) -> list[tuple[str, str]]:
    """(name, type) of each column in order; [] when there is no such table."""
    return conn.execute("""SELECT a.attname, format_type(a.atttypid, a.atttypmod)
                             FROM pg_catalog.pg_attribute a
                            WHERE a.attrelid = to_regclass(%s) AND a.attnum > 0 AND NOT a.attisdropped
                            ORDER BY a.attnum""", (table.as_string(conn),)).fetchall()


def _count(conn: psycopg.Connection, table: sql.Identifier) -> int:
    return conn.execute(sql.SQL("SELECT count(*) FROM {}").format(table)).fetchone()[0]


def _replace(conn: psycopg.Connection, stage: str, target: str, old_columns: list[tuple[str, str]]) -> None:
    """The staged table takes the place of a report table whose columns differ, with its grants
    and owner; refused (ReportError) when other objects depend on the old table."""
    staged, table = sql.Identifier(REPORTS_SCHEMA, stage), sql.Identifier(REPORTS_SCHEMA, target)
    owner, grants = _owner_and_grants(conn, table)
    new_columns = _columns(conn, staged)
    _require(conn, target, f"the report's columns changed ({_describe(old_columns)} -> {_describe(new_columns)}) "
                          "and a table is replaced by its owner", None)
    try:
        conn.execute(sql.SQL("DROP TABLE {}").format(table))
    except psycopg.errors.DependentObjectsStillExist as exc:
        dependants = "; ".join((exc.diag.message_detail or "").splitlines()) or "other objects"
        raise ReportError(f"the report's columns changed ({_describe(old_columns)} -> "
                          f"{_describe(new_columns)}) and {REPORTS_SCHEMA}.{target} cannot be "
                          f"replaced: {dependants}; drop or change those first, then run the report again; "
                          "nothing was written") from None
    conn.execute(sql.SQL("ALTER TABLE {} RENAME TO {}").format(staged, sql.Identifier(target)))
    for privilege, grantee, grantable in grants:
        conn.execute(sql.SQL("GRANT {} ON {} TO {}{}").format(
            sql.SQL(privilege), table, sql.SQL("PUBLIC") if grantee is None else sql.Identifier(grantee),
            sql.SQL(" WITH GRANT OPTION") if grantable else sql.SQL("")))
    if owner != conn.execute("SELECT current_user").fetchone()[0]:
        conn.execute(sql.SQL("ALTER TABLE {} OWNER TO {}").format(table, sql.Identifier(owner)))
    log.warning("%s.%s was replaced: the report's columns changed (its grants and owner were carried over)",
                REPORTS_SCHEMA, target)


def _require(conn: psycopg.Connection, target: str, why: str, privileges: str | None) -> None:
    """Raises ReportError (nothing changed) unless the job's role holds `privileges` on the report
    table, or, with None, may act as its owner: an administrator may have handed the table to
    another role, and the job must say what to grant rather than fail half-way."""
    table, name = sql.Identifier(REPORTS_SCHEMA, target), f"{REPORTS_SCHEMA}.{target}"
    owner, allowed = conn.execute(
        """SELECT pg_get_userbyid(c.relowner),
                  CASE WHEN %(privileges)s::text IS NULL THEN pg_has_role(current_user, c.relowner, 'USAGE')
                       ELSE has_table_privilege(current_user, c.oid, 'SELECT')
                        AND has_table_privilege(current_user, c.oid, 'INSERT')
                        AND has_table_privilege(current_user, c.oid, 'DELETE') END
             FROM pg_catalog.pg_class c WHERE c.oid = to_regclass(%(table)s)""",
        {"privileges": privileges, "table": table.as_string(conn)}).fetchone()
    if allowed:
        return
    role = conn.execute("SELECT current_user").fetchone()[0]
    grant = (f"GRANT {privileges} ON {name} TO {role}" if privileges is not None
             else f"ALTER TABLE {name} OWNER TO {role}, or drop it")
    raise ReportError(f"{name} belongs to {owner} and {why}, which the job's role {role} may not do: as its owner, "
                      f"{grant}; nothing was written")


def _owner_and_grants(conn: psycopg.Connection, table: sql.Identifier) -> tuple[str, list[tuple[str, str | None, bool]]]:
    """The table's owner and its table privileges granted to others (grantee None: PUBLIC)."""
    owner = conn.execute("SELECT pg_get_userbyid(relowner) FROM pg_catalog.pg_class WHERE oid = to_regclass(%s)",
                         (table.as_string(conn),)).fetchone()[0]
    grants = conn.execute("""SELECT a.privilege_type, CASE WHEN a.grantee = 0 THEN NULL
                                                          ELSE pg_get_userbyid(a.grantee) END, a.is_grantable
                               FROM pg_catalog.pg_class c CROSS JOIN LATERAL aclexplode(c.relacl) a
                              WHERE c.oid = to_regclass(%s) AND a.grantee <> c.relowner""",
                          (table.as_string(conn),)).fetchall()
    return owner, grants


def _describe(columns: list[tuple[str, str]]) -> str:
    return ", ".join(f"{name} {type_}" for name, type_ in columns) or "none"

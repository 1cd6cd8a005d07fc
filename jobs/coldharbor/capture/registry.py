"""The registry of captured tables, as the jobs read it from `coldharbor.tables`."""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta

import psycopg
from psycopg import sql

from coldharbor.capture import roles
from coldharbor.capture.table_names import lake_path, name_candidates, quote_ident, sql_name
from coldharbor.runtime.errors import ConfigError, PrivilegeError, UnknownTableError, one_line


class MissingTableError(UnknownTableError):
    """A registered table PostgreSQL no longer has (it, or its schema, was dropped)."""


@dataclass(frozen=True)
class LakeColumn:
    """One column: its PostgreSQL type, its lake (Spark SQL) type, and its place in the key."""

    name: str
    pg_type: str
    lake_type: str
    key_position: int | None
    partition: bool = False  # a partition column of the lake table (a key column too)

    @property
    def is_key(self) -> bool:
        return self.key_position is not None


@dataclass(frozen=True)
class RegisteredTable:
    table_id: int
    schema_name: str
    table_name: str
    key_columns: tuple[str, ...]
    lake_location: str | None
    partition_by: tuple[str, ...]
    sort_by: tuple[str, ...]
    hot_retention: timedelta | None = None   # None: rows are never evicted from the hot tier
    source_kind: str = "table"               # table | entity (an entity schema read through its view)
    present: bool = True                     # False: registered, but the relation is gone from PostgreSQL
    replaced: bool = False                   # the name now resolves to another relation than the one registered
    history: str = "latest"                  # latest (a key's newest image per export) | exact (every change's, sql/migrations/021)
    mode: str = "mirror"                     # mirror (PostgreSQL holds every row) | lake_first (its landing zone, sql/migrations/027)

    @property
    def qualified_name(self) -> str:
        return f"{self.schema_name}.{self.table_name}"

    @property
    def quoted_name(self) -> str:
        """schema.table as SQL writes it: each part double-quoted unless plain, control characters
        escaped, so a message naming it stays one line and says which table exactly."""
        return f"{quote_ident(self.schema_name)}.{quote_ident(self.table_name)}"

    @property
    def cli_name(self) -> str:
        """schema.table as a shell word for the jobs' --table (quoted for the shell where needed)."""
        return one_line(shlex.quote(self.qualified_name))

    @property
    def name_literal(self) -> str:
        """The table's name as an SQL string literal ('schema.table', quoted parts as SQL writes them)."""
        return "'" + self.quoted_name.replace("'", "''") + "'"

    @property
    def register_again(self) -> str:
        """The statement that registers the table again (its name as a string literal)."""
        return f"SELECT coldharbor.register_table({self.name_literal})"

    @property
    def identifier(self) -> sql.Identifier:
        return sql.Identifier(self.schema_name, self.table_name)

    def lake_path(self, lake_root: str) -> str:
        """The registration's lake_location (an administrator's), else <root>/<schema>/<table>;
        ConfigError when a name is not a safe folder name (`lake_folder_problem`)."""
        return lake_path(self.schema_name, self.table_name, self.lake_location, lake_root)


_SELECT = """SELECT table_id, schema_name, table_name, key_columns, lake_location, partition_by, sort_by,
                    hot_retention, source_kind, rel IS NOT NULL AS present,
                    source_kind = 'table' AND rel IS NOT NULL
                        AND (dropped_at IS NOT NULL OR (relid IS NOT NULL AND relid <> rel))
                        AND (SELECT relkind IN ('r', 'p') FROM pg_class WHERE oid = rel) AS replaced,
                    history, mode
             FROM coldharbor.tables,
                  LATERAL (SELECT to_regclass(quote_ident(schema_name) || '.' || quote_ident(table_name))::oid) r(rel)"""


def load(conn: psycopg.Connection, name: str | None = None) -> list[RegisteredTable]:
    """Every registered table, or the one named (either spelling, `name_candidates`);
    UnknownTableError if it is not registered."""
    if name is None:
        rows = conn.execute(_SELECT + " ORDER BY table_id").fetchall()
    else:
        candidates = name_candidates(name)
        rows = conn.execute(_SELECT + " WHERE (schema_name, table_name) IN ("
                            + ", ".join(["(%s, %s)"] * len(candidates)) + ") ORDER BY table_id",
                            [part for candidate in candidates for part in candidate]).fetchall()
        if not rows:
            if '"' in name and sql_name(name) is None:
                raise UnknownTableError(f"table {one_line(name)} is not registered with coldharbor, and its "
                                        "double quotes do not make an SQL name: write app.\"Weird Tbl\" (a quote "
                                        "inside doubled) or app.Weird Tbl")
            raise UnknownTableError(f"table {one_line(name)} is not registered with coldharbor "
                                    "(register it with SELECT coldharbor.register_table(...))")
    tables = [RegisteredTable(r[0], r[1], r[2], tuple(r[3]), r[4], tuple(r[5]), tuple(r[6]), r[7], r[8], r[9], r[10], r[11], r[12])
              for r in rows]
    if name is not None and len(tables) > 1:
        raise ConfigError(f"table name {one_line(name)} names {len(tables)} registered tables: "
                          f"{' and '.join(t.quoted_name for t in tables)}; give one of these spellings")
    return tables


def missing_message(names: Sequence[str]) -> str:
    return (f"{', '.join(names)} {'is' if len(names) == 1 else 'are'} registered with coldharbor but PostgreSQL has "
            "no such table any more (it or its schema was dropped): recreate it, or remove its registration "
            "(its row in coldharbor.tables); nothing was done")


def replaced_message(table: RegisteredTable) -> str:
    return (f"{table.quoted_name} was dropped and created again since it was registered with coldharbor: the "
            "table under that name now is not the one registered, has no capture triggers and its writes are not "
            f"captured; register it again ({table.register_again}), and the next export rebuilds its lake from "
            "PostgreSQL; nothing was done")


class ReplacedTableError(UnknownTableError):
    """A registered table whose name now resolves to another relation (dropped and created again)."""


def require_present(tables: Sequence[RegisteredTable]) -> None:
    """Refuses, before anything runs, a job over a registered table whose relation is gone or is
    another relation than the one registered."""
    missing = [t.qualified_name for t in tables if not t.present]
    if missing:
        raise MissingTableError(missing_message(missing))
    for table in tables:
        if table.replaced:
            raise ReplacedTableError(replaced_message(table))


def refusal(table: RegisteredTable) -> str | None:
    """Why a job over every registered table must leave this one out (gone, or dropped and created
    again), as require_present would say it; None for a table the job may work on."""
    if not table.present:
        return missing_message([table.qualified_name])
    if table.replaced:
        return replaced_message(table)
    return None


def left_out(tables: Sequence[RegisteredTable]) -> tuple[list[tuple[RegisteredTable, str]], list[RegisteredTable]]:
    """A job over every table: the tables it leaves out with why (`refusal`), and the others."""
    refused = [(t, why) for t in tables if (why := refusal(t))]
    return refused, [t for t in tables if not refusal(t)]


def lake_columns(conn: psycopg.Connection, table: RegisteredTable) -> list[LakeColumn]:
    """The table's columns as the catalog has them now; raises if a type no longer round-trips."""
    try:
        rows = conn.execute("SELECT column_name, pg_type, lake_type, key_position "
                            "FROM coldharbor.lake_columns(%s::regclass)",
                            (table.identifier.as_string(conn),)).fetchall()
    except (psycopg.errors.UndefinedTable, psycopg.errors.InvalidSchemaName):
        raise MissingTableError(missing_message([table.qualified_name])) from None
    except (psycopg.errors.FeatureNotSupported, psycopg.errors.InvalidName) as exc:
        raise ConfigError(f"{table.qualified_name}: {exc.diag.message_primary}") from exc
    columns = [LakeColumn(*row, partition=row[0] in table.partition_by) for row in rows]
    if table.source_kind == "entity":
        # An entity view has no primary key in the catalog; its records are keyed by row_id.
        columns = [LakeColumn(c.name, c.pg_type, c.lake_type, 1 if c.name == "row_id" else None, c.partition)
                   for c in columns]
    keys = tuple(c.name for c in sorted((c for c in columns if c.is_key), key=lambda c: c.key_position))
    if keys != table.key_columns:
        raise ConfigError(f"{table.qualified_name}: its primary key is now ({', '.join(keys)}) "
                          f"but was registered as ({', '.join(table.key_columns)}); register it again")
    return columns


def require_privileges(conn: psycopg.Connection, table: RegisteredTable, *, deletes: bool = False) -> None:
    """Raises PrivilegeError, naming each missing privilege, unless the job's role may read the table
    and, with `deletes` (eviction, purge), the schema owner that deletes for it may lock and delete
    its rows, and no trigger, rule or policy of the table would run its code as that owner.
    Registration grants all of them; a table registered before the roles existed, or a grant revoked
    since, lacks them. (A table that no longer exists is left to lake_columns.)"""
    needed = [(None, "SELECT")] + ([(roles.OWNER, "SELECT"), (roles.OWNER, "DELETE"), (roles.OWNER, "UPDATE")]
                                   if deletes else [])
    missing = []
    for role, privilege in needed:
        # UPDATE of any one column is what SELECT ... FOR UPDATE needs (eviction's row locks).
        check = sql.SQL("has_any_column_privilege" if privilege == "UPDATE" else "has_table_privilege")
        who = sql.SQL("current_user") if role is None else sql.Literal(role)
        held, name = conn.execute(sql.SQL(
            "SELECT to_regclass({rel}) IS NULL OR {check}({who}, to_regclass({rel}), {privilege}), {who}::text").format(
            rel=sql.Literal(table.identifier.as_string(conn)), check=check, who=who,
            privilege=sql.Literal(privilege))).fetchone()
        if not held:
            missing.append(f"role {name} lacks {privilege}")
    if missing:
        again = ("an administrator registers it again with SELECT "
                 f"coldharbor.register_entity_schema('{table.table_name}')" if table.source_kind == "entity" else
                 f"its owner registers it again with SELECT coldharbor.register_table('{table.qualified_name}')")
        raise PrivilegeError(
            f"{table.qualified_name}: {'; '.join(missing)} on it, so nothing was done. Registration grants "
            f"these; a table registered before the roles existed, or a grant revoked since, lacks them: {again}")
    if table.source_kind == "table":
        refusal = conn.execute("SELECT coldharbor.read_refusal(to_regclass(%s))",
                               (table.identifier.as_string(conn),)).fetchone()[0]
        if refusal:
            raise _cannot_read(table, refusal)
    if deletes and table.source_kind == "table":
        refusal = conn.execute("SELECT coldharbor.owner_delete_refusal(to_regclass(%s))",
                               (table.identifier.as_string(conn),)).fetchone()[0]
        if refusal:
            raise PrivilegeError(
                f"cannot evict from or purge {table.qualified_name}: {refusal}, and eviction and purge delete as the "
                "schema owner, whose privileges that code would run with; nothing was done. Drop it, or give the "
                "table no hot retention and purge it by hand as its owner")


def guard_read(conn: psycopg.Connection, table: RegisteredTable) -> None:
    """Locks a registered table for the caller's transaction (ACCESS SHARE) and raises PrivilegeError
    unless reading it runs no code of its owner's as the job's role: it must still be a table (a view
    runs its functions as whoever reads it) without row-level security (policies too). Call it first
    in the transaction that reads the table; the lock keeps the answer true until it ends. A table
    dropped since it was registered raises MissingTableError."""
    if table.source_kind != "table":
        return  # entity views and tables are the schema owner's
    try:
        conn.execute(sql.SQL("LOCK TABLE {} IN ACCESS SHARE MODE").format(table.identifier))
    except (psycopg.errors.UndefinedTable, psycopg.errors.InvalidSchemaName):
        raise MissingTableError(missing_message([table.qualified_name])) from None
    refuse_replaced(conn, table)  # under the lock: the relation read is the one registered
    refusal = conn.execute("SELECT coldharbor.read_refusal(%s::regclass)",
                           (table.identifier.as_string(conn),)).fetchone()[0]
    if refusal:
        raise _cannot_read(table, refusal)


def refuse_replaced(conn: psycopg.Connection, table: RegisteredTable) -> None:
    """ReplacedTableError when the table's name resolves, now, to another table than the one
    registered (or its registered relation was dropped since). A name that resolves to nothing, or
    to something other than a table (a view put in its place), is left to the callers' own refusals
    (a missing table; a relation whose reading would run its owner's code)."""
    if table.source_kind != "table":
        return
    name = table.identifier.as_string(conn)
    replaced = conn.execute(
        "SELECT dropped_at IS NOT NULL OR (relid IS NOT NULL AND relid <> to_regclass(%s)::oid) "
        "FROM coldharbor.tables WHERE table_id = %s "
        "AND (SELECT relkind IN ('r', 'p') FROM pg_class WHERE oid = to_regclass(%s)::oid)",
        (name, table.table_id, name)).fetchone()
    if replaced is not None and replaced[0]:
        raise ReplacedTableError(replaced_message(table))


def _cannot_read(table: RegisteredTable, refusal: str) -> PrivilegeError:
    return PrivilegeError(f"cannot read {table.qualified_name}: {refusal}, whose code would run as the job's role; "
                          "nothing was done. A registered table must stay a plain table: no row-level security, rules or "
                          "inheritance children")

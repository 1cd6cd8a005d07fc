"""Brings the coldharbor schema up to date from sql/, in two kinds of file (sql/README.md):

- migrations (sql/migrations/NNN_*.sql: schemas, tables, indexes, roles, data changes), each applied
  once, in its own transaction, recorded with its checksum and never edited afterwards;
- definitions (sql/definitions/NNN_*.sql: every function, trigger and grant, each in one file, as
  CREATE OR REPLACE), applied after the migrations, all of them, in their order, in one transaction,
  whenever one of them differs from what was applied last (their checksums are recorded too).

A database migrated by the single-directory layout (every file directly in sql/, functions included)
is recognised by its recorded checksums and upgraded in place.

Usage: python -m coldharbor.capture.migrate   (reads COLDHARBOR_ADMIN_PG_DSN: a superuser, or an admin who may
create roles; with COLDHARBOR_PIPELINE_PASSWORD set it also sets the jobs' login password)

Set-up alone runs this: the jobs connect as coldharbor_pipeline, which cannot migrate.
"""

from __future__ import annotations

import hashlib
import logging
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import psycopg
import psycopg.errors

from coldharbor.capture import legacy_layout, roles
from coldharbor.runtime import pg, settings
from coldharbor.runtime.errors import ColdharborError
from coldharbor.runtime.job_main import run_job

log = logging.getLogger(__name__)

SQL_DIR = settings.PROJECT_DIR / "sql"
MIGRATE_LOCK = (0x43480000, 0)
SHIPPED = "shipped.sha256"   # in sql/definitions: "checksum  name" of every version ever shipped
DEFINITIONS_LOCK_TIMEOUT_S = 10


class MigrationChangedError(ColdharborError):
    """An applied migration file was edited afterwards."""


class MigrationFailedError(ColdharborError):
    """PostgreSQL refused a migration (it rolled back whole; the ones before it stay applied), or the
    definitions (all of them rolled back)."""


class LayoutUpgradeError(ColdharborError):
    """A database the single-directory layout migrated only part of the way."""


@dataclass(frozen=True)
class Migration:
    """One SQL file: a migration or a definition."""

    name: str
    sql: str

    @property
    def checksum(self) -> str:
        return hashlib.sha256(self.sql.encode()).hexdigest()


@dataclass(frozen=True)
class Layout:
    migrations: tuple[Migration, ...]
    definitions: tuple[Migration, ...] = ()
    # (name, checksum) of every definitions file any release up to these files shipped
    # (sql/definitions/shipped.sha256, append-only): a recorded one outside it is a newer release's.
    shipped: frozenset[tuple[str, str]] = frozenset()


@dataclass
class Applied:
    migrations: list[str] = field(default_factory=list)
    definitions: list[str] = field(default_factory=list)   # the files that differed (all were applied again)
    adopted: bool = False                                    # upgraded from the single-directory layout


def _files(folder: Path) -> tuple[Migration, ...]:
    return tuple(Migration(p.name, p.read_text()) for p in sorted(folder.glob("[0-9][0-9][0-9]_*.sql")))


def discover(sql_dir: Path = SQL_DIR) -> Layout:
    """The migrations and the definitions under sql_dir, each in order, and the definitions shipped."""
    shipped = sql_dir / "definitions" / SHIPPED
    lines = shipped.read_text().splitlines() if shipped.exists() else []
    return Layout(_files(sql_dir / "migrations"), _files(sql_dir / "definitions"),
                  frozenset((name, checksum) for checksum, name in (line.split() for line in lines if line.strip())))


def apply(conn: psycopg.Connection, layout: Layout) -> Applied:
    """Applies the migrations not yet recorded, then the definitions if they differ from the recorded ones."""
    conn.add_notice_handler(_warn)
    conn.execute("SELECT pg_advisory_lock(%s, %s)", MIGRATE_LOCK)
    try:
        conn.execute("CREATE SCHEMA IF NOT EXISTS coldharbor")
        for kind in ("migrations", "definitions"):
            conn.execute(f"""CREATE TABLE IF NOT EXISTS coldharbor.schema_{kind} (
                                 name text PRIMARY KEY, checksum text NOT NULL,
                                 applied_at timestamptz NOT NULL DEFAULT now())""")
        done = Applied(adopted=adopt_single_directory_layout(conn, layout.migrations))
        applied = dict(conn.execute("SELECT name, checksum FROM coldharbor.schema_migrations").fetchall())
        if unknown := sorted(set(applied) - {m.name for m in layout.migrations}):
            raise MigrationChangedError(
                f"migration {unknown[-1]} is recorded as applied but is not among these files: a newer release "
                "migrated this database; nothing was applied (its definitions would be older than its tables)")
        for migration in layout.migrations:
            if migration.name in applied:
                if applied[migration.name] != migration.checksum:
                    raise MigrationChangedError(
                        f"migration {migration.name} changed after it was applied; add a new file instead")
                continue
            with _refused_as(conn, f"migration {migration.name} failed and was rolled back"), conn.transaction():
                conn.execute(migration.sql)
                conn.execute("INSERT INTO coldharbor.schema_migrations (name, checksum) VALUES (%s, %s)",
                             (migration.name, migration.checksum))
                apply_privileges(conn)
            log.info("applied migration %s", migration.name)
            done.migrations.append(migration.name)
        done.definitions = apply_definitions(conn, layout.definitions, layout.shipped)
        return done
    finally:
        if not (conn.closed or conn.broken):
            conn.execute("SELECT pg_advisory_unlock(%s, %s)", MIGRATE_LOCK)
        conn.remove_notice_handler(_warn)


def _warn(diagnostic: psycopg.errors.Diagnostic) -> None:
    """A WARNING the SQL raised (a superuser's step skipped, a table whose capture stays as it was)
    reaches whoever migrates; NOTICEs (a table that exists already) do not."""
    if diagnostic.severity_nonlocalized == "WARNING":
        log.warning("PostgreSQL: %s", " ".join(str(diagnostic.message_primary).split()))


def apply_definitions(conn: psycopg.Connection, definitions: tuple[Migration, ...],
                      shipped: frozenset[tuple[str, str]] = frozenset()) -> list[str]:
    """Every definition, in order, in one transaction, when any differs from the ones recorded (or
    one was added or removed); the names that differed ("NNN_name.sql (removed)" for one removed), or
    [] when nothing was done. A recorded definition these files never shipped (`shipped`) was a newer
    release's: refused, nothing applied (older functions over it would silently undo it)."""
    recorded = dict(conn.execute("SELECT name, checksum FROM coldharbor.schema_definitions").fetchall())
    current = {d.name: d.checksum for d in definitions}
    if recorded == current:
        return []
    if newer := sorted(n for n, c in recorded.items() if current.get(n) != c and (n, c) not in shipped):
        raise MigrationChangedError(
            f"definitions {newer[0]} were applied from a version these files never shipped (a newer release's, "
            "or a file edited without its line in sql/definitions/shipped.sha256); nothing was applied")
    with conn.transaction():
        # The capture of every registered table is made again (090): waiting behind a long
        # transaction on one table would hold up the writes to the tables already done.
        conn.execute(f"SET LOCAL lock_timeout = '{DEFINITIONS_LOCK_TIMEOUT_S}s'")
        for definition in definitions:
            with _refused_as(conn, f"definitions {definition.name} failed, and every definition was rolled back",
                             lock_timeout=True):
                conn.execute(definition.sql)
        conn.execute("DELETE FROM coldharbor.schema_definitions")
        with conn.cursor() as cur:
            cur.executemany("INSERT INTO coldharbor.schema_definitions (name, checksum) VALUES (%s, %s)",
                            list(current.items()))
        apply_privileges(conn)
    changed = sorted({n for n in current if recorded.get(n) != current[n]}
                     | {f"{n} (removed)" for n in recorded if n not in current})
    log.info("applied the definitions (%s differed)", ", ".join(changed))
    return changed


def adopt_single_directory_layout(conn: psycopg.Connection, migrations: tuple[Migration, ...]) -> bool:
    """Records a database the single-directory layout migrated all the way as migrated by these files
    (they hold its tables, and the definitions its functions, as that layout left them): its rows of
    schema_migrations are replaced by these files' in one transaction; the definitions are applied
    next, as on a new database. Whether the database was one."""
    old = legacy_layout.SINGLE_DIRECTORY_LAYOUT
    files = {m.name: m.checksum for m in migrations}
    recorded = dict(conn.execute("SELECT name, checksum FROM coldharbor.schema_migrations").fetchall())
    legacy = {n for n, c in recorded.items() if old.get(n) == c}
    if all(files.get(n) == recorded[n] for n in legacy):
        return False        # no file of that layout that these files changed is recorded: not such a database
    if tampered := sorted(n for n in old if n in recorded and n not in legacy and files.get(n) != recorded[n]):
        raise MigrationChangedError(f"migration {tampered[0]}'s recorded checksum is neither the single-directory "
                                    "layout's nor these files'; nothing was applied")
    if legacy != set(old):
        raise LayoutUpgradeError(
            f"this database was migrated by the single-directory layout of sql/ up to {max(legacy)} only; "
            f"migrate it with the files of commit {legacy_layout.LAST_COMMIT} first, then with these")
    with conn.transaction():
        conn.execute("DELETE FROM coldharbor.schema_migrations WHERE name = ANY(%s)", (sorted(legacy),))
        with conn.cursor() as cur:
            cur.executemany("INSERT INTO coldharbor.schema_migrations (name, checksum) VALUES (%s, %s)",
                            [(n, c) for n, c in files.items() if n in legacy])
        conn.execute("DELETE FROM coldharbor.schema_definitions")
    log.info("adopted a database migrated by the single-directory layout of sql/ (%d files)", len(legacy))
    return True


@contextmanager
def _refused_as(conn: psycopg.Connection, prefix: str, lock_timeout: bool = False) -> Iterator[None]:
    """Turns PostgreSQL's refusal of the statements inside into MigrationFailedError(prefix: message);
    a lost server stays what it is."""
    try:
        yield
    except psycopg.Error as exc:
        if conn.broken:
            raise
        why = exc.diag.message_primary or str(exc)
        if lock_timeout and isinstance(exc, psycopg.errors.LockNotAvailable):
            why += (f" (a transaction held a lock it needed for more than {DEFINITIONS_LOCK_TIMEOUT_S} s; "
                    "run migrate again when it is done)")
        raise MigrationFailedError(f"{prefix}: {why}") from exc


def apply_privileges(conn: psycopg.Connection) -> None:
    """Ownership and privileges of everything in the schema (sql/definitions/080_privileges.sql), once
    it is defined: whatever a migration created is then owned by coldharbor_owner, with no PUBLIC EXECUTE."""
    if conn.execute("SELECT to_regprocedure('coldharbor.apply_privileges()') IS NOT NULL").fetchone()[0]:
        conn.execute("SELECT coldharbor.apply_privileges()")


def main(argv: list[str] | None = None) -> int:
    def body() -> int:
        with pg.connect(settings.admin_pg_dsn()) as conn:
            done = apply(conn, discover())
            password = os.environ.get(settings.PIPELINE_PASSWORD_ENV)
            if password:
                roles.set_password(conn, roles.PIPELINE, password)
                log.info("set the password of %s from %s", roles.PIPELINE, settings.PIPELINE_PASSWORD_ENV)
        if done.adopted:
            print("adopted a database migrated by the single-directory layout of sql/")
        print(f"migrations applied: {len(done.migrations)}"
              + (f" ({', '.join(done.migrations)})" if done.migrations else " (up to date)"))
        print("definitions " + (f"applied ({', '.join(done.definitions)} changed)" if done.definitions
                                else "up to date"))
        return 0

    return run_job("migrate", body)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

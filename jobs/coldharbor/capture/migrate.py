"""Applies the ordered migrations in sql/ once each, recording what was applied.

Usage: python -m coldharbor.capture.migrate   (reads COLDHARBOR_ADMIN_PG_DSN: a superuser, or an admin who may
create roles; with COLDHARBOR_PIPELINE_PASSWORD set it also sets the jobs' login password)

Set-up alone runs this: the jobs connect as coldharbor_pipeline, which cannot migrate.
"""

from __future__ import annotations

import hashlib
import logging
import os
import sys
from dataclasses import dataclass
from pathlib import Path

import psycopg

from coldharbor.capture import roles
from coldharbor.runtime import pg, settings
from coldharbor.runtime.errors import ColdharborError
from coldharbor.runtime.job_main import run_job

log = logging.getLogger(__name__)

SQL_DIR = settings.PROJECT_DIR / "sql"
MIGRATE_LOCK = (0x43480000, 0)


class MigrationChangedError(ColdharborError):
    """An applied migration file was edited afterwards."""


class MigrationFailedError(ColdharborError):
    """PostgreSQL refused a migration (it rolled back whole; the ones before it stay applied)."""


@dataclass(frozen=True)
class Migration:
    name: str
    sql: str

    @property
    def checksum(self) -> str:
        return hashlib.sha256(self.sql.encode()).hexdigest()


def discover(sql_dir: Path = SQL_DIR) -> list[Migration]:
    """The migration files (NNN_name.sql directly in sql/), in order."""
    return [Migration(p.name, p.read_text()) for p in sorted(sql_dir.glob("[0-9][0-9][0-9]_*.sql"))]


def apply(conn: psycopg.Connection, migrations: list[Migration]) -> list[str]:
    """Applies the migrations not yet recorded, each in its own transaction; returns their names."""
    conn.execute("SELECT pg_advisory_lock(%s, %s)", MIGRATE_LOCK)
    try:
        conn.execute("CREATE SCHEMA IF NOT EXISTS coldharbor")
        conn.execute("""CREATE TABLE IF NOT EXISTS coldharbor.schema_migrations (
                            name text PRIMARY KEY, checksum text NOT NULL,
                            applied_at timestamptz NOT NULL DEFAULT now())""")
        applied = dict(conn.execute("SELECT name, checksum FROM coldharbor.schema_migrations").fetchall())
        done = []
        for migration in migrations:
            if migration.name in applied:
                if applied[migration.name] != migration.checksum:
                    raise MigrationChangedError(
                        f"migration {migration.name} changed after it was applied; add a new file instead")
                continue
            try:
                with conn.transaction():
                    _apply_one(conn, migration)
            except psycopg.Error as exc:
                if conn.broken:
                    raise  # PostgreSQL lost: said so as such
                raise MigrationFailedError(f"migration {migration.name} failed and was rolled back: "
                                           f"{exc.diag.message_primary or exc}") from exc
            log.info("applied migration %s", migration.name)
            done.append(migration.name)
        return done
    finally:
        conn.execute("SELECT pg_advisory_unlock(%s, %s)", MIGRATE_LOCK)


def _apply_one(conn: psycopg.Connection, migration: Migration) -> None:
    conn.execute(migration.sql)
    conn.execute("INSERT INTO coldharbor.schema_migrations (name, checksum) VALUES (%s, %s)",
                 (migration.name, migration.checksum))
    apply_privileges(conn)


def apply_privileges(conn: psycopg.Connection) -> None:
    """Ownership and privileges of everything in the schema (sql/009_roles.sql), once it defines
    them: whatever a migration created is then owned by coldharbor_owner, with no PUBLIC EXECUTE."""
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
        print(f"migrations applied: {len(done)}" + (f" ({', '.join(done)})" if done else " (up to date)"))
        return 0

    return run_job("migrate", body)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

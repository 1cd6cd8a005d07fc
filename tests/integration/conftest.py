"""Fixtures of the integration tests."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pytest
from coldharbor.runtime import pg

from tests.entities import HOT, SCHEMA, define
from tests.helpers import app_login, export
from tests.report_corpus import CUSTOMERS, ITEMS, ORDERS, change_after_export, create_tables, table_counts


@pytest.fixture()
def entity(pg_conn) -> str:
    """A defined and registered entity schema of its own for each test."""
    name = f"e_{uuid.uuid4().hex[:10]}"
    define(pg_conn, name, SCHEMA, HOT)
    pg_conn.execute("SELECT coldharbor.register_entity_schema(%s)", (name,))
    return name


@dataclass(frozen=True)
class Sandbox:
    lake_root: str
    counts: dict[str, int]   # rows of each corpus table: a refused report must leave them so


@pytest.fixture(scope="session")
def sandbox(spark, pg_dsn, admin_dsn, tmp_path_factory) -> Sandbox:
    """The report corpus's three tables, registered, exported, then changed: their views mix lake
    rows and hot images."""
    lake_root = str(tmp_path_factory.mktemp("sandbox") / "lake")
    with pg.connect(admin_dsn) as conn:
        create_tables(conn)
    for name in (ORDERS, CUSTOMERS, ITEMS):
        export(spark, pg_dsn, name, lake_root)
    with pg.connect(admin_dsn) as conn:
        change_after_export(conn)
        return Sandbox(lake_root, table_counts(conn))


@pytest.fixture()
def app_logins(admin_dsn) -> Iterator[Callable[[], tuple[str, str]]]:
    """Makes application logins, each with a schema of its own: (name, DSN). At the end of the test
    the schemas go with their tables, registrations and change rows, so no later job over every
    registered table meets them."""
    made: list[str] = []

    def make() -> tuple[str, str]:
        name, dsn = app_login(admin_dsn)
        made.append(name)
        return name, dsn

    yield make
    with pg.connect(admin_dsn) as admin:
        for name in made:
            admin.execute("""DELETE FROM coldharbor.change_log WHERE table_id IN
                             (SELECT table_id FROM coldharbor.tables WHERE schema_name = %s)""", (name,))
            admin.execute("DELETE FROM coldharbor.tables WHERE schema_name = %s", (name,))
            admin.execute(f"DROP SCHEMA {name} CASCADE")

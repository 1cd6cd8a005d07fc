"""Fixtures of the integration tests."""

from __future__ import annotations

import uuid
from dataclasses import dataclass

import pytest

from coldharbor import pg
from tests.entities import HOT, SCHEMA, define
from tests.helpers import export
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
def sandbox(spark, pg_dsn, tmp_path_factory) -> Sandbox:
    """The report corpus's three tables, registered, exported, then changed: their views mix lake
    rows and hot images."""
    lake_root = str(tmp_path_factory.mktemp("sandbox") / "lake")
    with pg.connect(pg_dsn) as conn:
        create_tables(conn)
    for name in (ORDERS, CUSTOMERS, ITEMS):
        export(spark, pg_dsn, name, lake_root)
    with pg.connect(pg_dsn) as conn:
        change_after_export(conn)
        return Sandbox(lake_root, table_counts(conn))

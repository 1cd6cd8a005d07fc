"""Fixtures: one real PostgreSQL and one real Spark + Delta session for the whole run."""

from __future__ import annotations

import os
import socket
import time
import uuid
from collections.abc import Iterator

import psycopg
import pytest

os.environ["TZ"] = "UTC"
time.tzset()
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")

from coldharbor import migrate, pg  # noqa: E402
from coldharbor.embedded_pg import EmbeddedPostgres, new_password  # noqa: E402


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def pg_dsn(tmp_path_factory) -> Iterator[str]:
    """A fresh embedded PostgreSQL 18 on 127.0.0.1 with the coldharbor schema migrated."""
    server = EmbeddedPostgres(tmp_path_factory.mktemp("pg") / "pgdata", free_port())
    password = new_password()
    server.init(password)
    server.start()
    dsn = server.dsn(password)
    with pg.connect(dsn) as conn:
        migrate.apply(conn, migrate.discover())
    try:
        yield dsn
    finally:
        server.stop()


@pytest.fixture()
def pg_conn(pg_dsn) -> Iterator[psycopg.Connection]:
    with pg.connect(pg_dsn) as conn:
        yield conn


@pytest.fixture(scope="session")
def spark():
    os.environ.setdefault("COLDHARBOR_SPARK_MASTER", "local[2]")
    from coldharbor.spark import get_session

    session = get_session("coldharbor-tests")
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


@pytest.fixture()
def table_name() -> str:
    """A table name of its own for each test, in the public schema."""
    return f"t_{uuid.uuid4().hex[:10]}"


@pytest.fixture()
def lake_root(tmp_path) -> str:
    return str(tmp_path / "lake")

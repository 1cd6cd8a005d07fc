"""Fixtures: one real PostgreSQL and one real Spark + Delta session for the whole run."""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Iterator

import psycopg
import pytest

os.environ["TZ"] = "UTC"
time.tzset()
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")

from coldharbor import pg  # noqa: E402
from coldharbor.stack import throwaway_server  # noqa: E402


@pytest.fixture(scope="session")
def pg_dsn(tmp_path_factory) -> Iterator[str]:
    """A fresh embedded PostgreSQL 18 on 127.0.0.1 with the coldharbor schema migrated."""
    with throwaway_server(tmp_path_factory.mktemp("pg")) as dsn:
        yield dsn


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

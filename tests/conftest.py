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
from coldharbor.stack import Logins, throwaway_server  # noqa: E402


@pytest.fixture(scope="session")
def pg_logins(tmp_path_factory) -> Iterator[Logins]:
    """A fresh embedded PostgreSQL 18 on 127.0.0.1 with the coldharbor schema migrated."""
    with throwaway_server(tmp_path_factory.mktemp("pg")) as logins:
        yield logins


@pytest.fixture(scope="session")
def pg_dsn(pg_logins) -> str:
    """The jobs' DSN (coldharbor_pipeline, no superuser): what a test running a job gives it."""
    return pg_logins.pipeline


@pytest.fixture(scope="session")
def admin_dsn(pg_logins) -> str:
    """Set-up's DSN (the superuser): creating tables, registering them, writing as the application."""
    return pg_logins.admin


@pytest.fixture()
def pg_conn(admin_dsn) -> Iterator[psycopg.Connection]:
    """A set-up connection (the superuser): tables, registration, the application's writes, checks."""
    with pg.connect(admin_dsn) as conn:
        yield conn


@pytest.fixture(scope="session")
def spark():
    os.environ.setdefault("COLDHARBOR_SPARK_MASTER", "local[2]")
    from coldharbor.spark import get_session

    session = get_session("coldharbor-tests")
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


@pytest.fixture(scope="session")
def connect_url(connect_server) -> str:
    """The sc:// URL of the run's Spark Connect server."""
    return connect_server.url


@pytest.fixture()
def table_name() -> str:
    """A table name of its own for each test, in the public schema."""
    return f"t_{uuid.uuid4().hex[:10]}"


@pytest.fixture()
def lake_root(tmp_path) -> str:
    return str(tmp_path / "lake")


@pytest.fixture(scope="session")
def connect_server(tmp_path_factory):
    """A real Spark Connect server for the whole run, started as `make run` starts it (log:
    <basetemp>/connect*/server.log), stopped with its process group at the end."""
    from tests.connect_server import running_server

    with running_server(tmp_path_factory.mktemp("connect")) as server:
        yield server


@pytest.fixture()
def on_connect(connect_server, monkeypatch) -> Iterator[str]:
    """For one test, get_session in this process opens sessions on the test's Connect server (the
    URL is yielded); they are released at the end, and PySpark's process-wide Connect mode (its
    functions build Connect columns) is switched off again for the classic tests after it."""
    from coldharbor.spark import REMOTE_ENV, release_sessions

    monkeypatch.setenv(REMOTE_ENV, connect_server.url)
    monkeypatch.setenv("SPARK_CONNECT_MODE_ENABLED", "1")
    yield connect_server.url
    release_sessions()

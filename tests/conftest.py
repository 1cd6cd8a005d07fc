"""Fixtures: one real PostgreSQL and one real Spark + Delta session for the whole run."""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Callable, Iterator

import psycopg
import pytest

os.environ["TZ"] = "UTC"
time.tzset()
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
# The test JVM and the run's Connect server live for the whole run (over 1,000 tests, an hour): with
# a job's default 2g driver, late in a run a report's broadcast join failed "Not enough memory to
# build and broadcast the table" in two whole runs (a change-feed test, then a verify/resync report
# test; each passes alone). The jobs the tests start inherit the 3g too (a maximum, not an
# allocation). What holds the memory late in a run is not found yet.
os.environ.setdefault("COLDHARBOR_DRIVER_MEMORY", "3g")
# Delta rebuilds a table's state from its log in this many tasks, each generating the code of the
# log's encoders again (a JFR of the test JVM found a third of its samples generating projections'
# code, much of it for them). The suite's logs are a few commits long: one task reads them. 14
# in-process tests took 218 s against 232 s with the default of 2 (2026-11-28); jobs and the Connect
# server inherit it. No result depends on it.
os.environ.setdefault("COLDHARBOR_DELTA_SNAPSHOT_PARTITIONS", "1")

# The JVMs the tests start for seconds (each job's spark-submit, Airflow's, a Connect server started
# for one test) compile with C1 only: on 2 cores C2's compiler threads took half of a short JVM's CPU
# (one spark-submit of a 10-row count: 30.4 CPU-s, 15.5 with C1 only). The two JVMs that live for the
# whole run, this process's own and the run's Connect server, keep the full JIT: once warm, C2's code
# ran the same 19 in-process tests in 310 s against 400 s with C1 only (2026-11-28), and a whole run
# with C1 only everywhere was far slower. The JIT tier changes no result.
#
# Every JVM of the run evaluates expressions interpreted instead of generating a class for each
# projection, predicate and ordering (spark.sql.codegen.factoryMode=NO_CODEGEN; whole-stage code
# generation stays on). A JFR of the warm test JVM found a third of its samples formatting generated
# code, much of it the projections of Delta's log replay, done again for every snapshot of every tiny
# table. Two whole runs of the suite, same tests (2026-11-28): test_key_identity 202 s against 132 s,
# test_lake_values 171 s against 93 s, the suite 65 minutes. Spark's own tests run both modes: no
# result depends on it.
LONG_LIVED_SUBMIT_OPTS = " ".join(filter(None, [os.environ.get("SPARK_SUBMIT_OPTS", ""),
                                                "-Dspark.sql.codegen.factoryMode=NO_CODEGEN"]))
os.environ["SPARK_SUBMIT_OPTS"] = " ".join(filter(None, [LONG_LIVED_SUBMIT_OPTS, "-XX:TieredStopAtLevel=1"]))

from coldharbor.capture import migrate  # noqa: E402
from coldharbor.embedded.stack import Logins, throwaway_server  # noqa: E402
from coldharbor.runtime import pg

_class_archive = None  # tests/class_archive.py: written while the first tests run


def pytest_collection_finish(session):
    global _class_archive
    if os.environ.get("COLDHARBOR_TEST_CLASS_ARCHIVE", "1") == "1" and any(
            not item.nodeid.startswith("tests/unit/") for item in session.items):
        from tests.class_archive import Archive

        _class_archive = Archive(os.environ["SPARK_SUBMIT_OPTS"])


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    """Short-lived JVMs started from now on map the class archive in, once it is written."""
    global _class_archive
    if _class_archive is not None and (option := _class_archive.ready_option()) is not None:
        os.environ["SPARK_SUBMIT_OPTS"] = f"{os.environ['SPARK_SUBMIT_OPTS']} {option}"
        _class_archive = None


def pytest_sessionfinish(session, exitstatus):
    if _class_archive is not None:
        _class_archive.stop()


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item, nextitem):
    """The run stops at the first test after which this process's Spark JVM is gone or does not
    answer (see tests/jvm_watch.py): every later test would only fail on it, slowly."""
    from tests import jvm_watch

    status = jvm_watch.exit_status()
    why = jvm_watch.unanswered() if status is None else None
    if status is not None or why is not None:
        pytest.exit(f"stopped after {item.nodeid}: {jvm_watch.report(status, why)}", returncode=3)


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
    forget_registrations_of_dropped_tables(admin_dsn)


@pytest.fixture()
def new_database(admin_dsn) -> Iterator[Callable[[], str]]:
    """Makes databases of their own on the test server (the roles are the cluster's, already there),
    not migrated, dropped when the test ends; each call returns one's set-up DSN."""
    made = []

    def make() -> str:
        name = f"db_{uuid.uuid4().hex[:8]}"
        with pg.connect(admin_dsn) as admin:
            admin.execute(f"CREATE DATABASE {name}")
        made.append(name)
        return admin_dsn.rsplit("/", 1)[0] + "/" + name

    yield make
    with pg.connect(admin_dsn) as admin:
        for name in made:
            admin.execute(f"DROP DATABASE {name} WITH (FORCE)")


@pytest.fixture()
def other_database(new_database) -> str:
    """A database of its own on the test server, not migrated; its set-up DSN."""
    return new_database()


@pytest.fixture()
def own_database(other_database, pg_dsn) -> tuple[str, str]:
    """A migrated database of its own, for a test that runs a job over every registered table: the
    run meets this test's tables alone, not every earlier test's (a run over the shared database's
    hundreds of tables takes minutes). Its (set-up DSN, jobs' DSN)."""
    with pg.connect(other_database) as conn:
        migrate.apply(conn, migrate.discover())
    return other_database, pg_dsn.rsplit("/", 1)[0] + "/" + other_database.rsplit("/", 1)[1]


def forget_registrations_of_dropped_tables(admin_dsn: str) -> None:
    """A test that dropped a registered table (or dropped it and created it again) leaves a
    registration every later job over all registered tables rightly refuses; the tests share one
    server, so its registration and change rows go when the test ends."""
    with pg.connect(admin_dsn) as admin:
        gone = [r[0] for r in admin.execute(
            """SELECT table_id FROM coldharbor.tables,
                      LATERAL (SELECT to_regclass(quote_ident(schema_name) || '.' || quote_ident(table_name))::oid) r(rel)
                WHERE source_kind = 'table' AND (rel IS NULL OR dropped_at IS NOT NULL OR relid <> rel)""")]
        if gone:
            admin.execute("DELETE FROM coldharbor.change_log WHERE table_id = ANY(%s)", (gone,))
            admin.execute("DELETE FROM coldharbor.tables WHERE table_id = ANY(%s)", (gone,))


@pytest.fixture(scope="session")
def spark():
    os.environ.setdefault("COLDHARBOR_SPARK_MASTER", "local[2]")
    from coldharbor.runtime.spark import get_session

    short_lived = os.environ["SPARK_SUBMIT_OPTS"]
    os.environ["SPARK_SUBMIT_OPTS"] = LONG_LIVED_SUBMIT_OPTS  # this JVM lives for the whole run
    try:
        session = get_session("coldharbor-tests")
    finally:
        os.environ["SPARK_SUBMIT_OPTS"] = short_lived
    session.sparkContext.setLogLevel("ERROR")
    yield session
    from tests import jvm_watch

    if jvm_watch.exit_status() is None and jvm_watch.unanswered() is None:  # else reported already
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

    folder = tmp_path_factory.mktemp("connect")
    with running_server(folder, env={"SPARK_SUBMIT_OPTS": LONG_LIVED_SUBMIT_OPTS}) as server:  # lives for the run
        yield server


@pytest.fixture()
def on_connect(connect_server, monkeypatch) -> Iterator[str]:
    """For one test, get_session in this process opens sessions on the test's Connect server (the
    URL is yielded); they are released at the end, and PySpark's process-wide Connect mode (its
    functions build Connect columns) is switched off again for the classic tests after it."""
    from coldharbor.runtime.spark import REMOTE_ENV, release_sessions

    monkeypatch.setenv(REMOTE_ENV, connect_server.url)
    monkeypatch.setenv("SPARK_CONNECT_MODE_ENABLED", "1")
    yield connect_server.url
    release_sessions()

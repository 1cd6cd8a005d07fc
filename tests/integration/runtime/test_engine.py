"""The warm engine as `make run` runs it: a Spark Connect server on 127.0.0.1 under its supervisor,
a process group `make stop` ends. Real servers, real clients, real kills."""

from __future__ import annotations

import json
import os
import signal
import socket
import time
from pathlib import Path

import pytest
from coldharbor.embedded import service
from coldharbor.embedded.stack import free_port
from coldharbor.runtime import engine, pg

from tests.helpers import connect_session

HOSTILE = "it's \"quoted\"; DROP TABLE x; -- ünïcødé \u2028 ${env:HOME}"


def wait_for_server(state_file: Path, port: int, log_file: Path, not_pid: int | None = None,
                    timeout_s: float = 600) -> int:
    """The pid of a server that accepts connections on `port` (a new one when `not_pid` is given)."""
    deadline = time.monotonic() + timeout_s
    while True:
        pid = engine.server_pid(state_file)
        if pid is not None and pid != not_pid and engine.accepts(engine.LOOPBACK, port):
            return pid
        assert time.monotonic() < deadline, f"no Spark Connect server on port {port}: see {log_file}"
        time.sleep(0.5)


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False


def test_the_supervised_server_serves_clients_comes_back_after_kill_9_and_stops_with_its_group(
        tmp_path, monkeypatch, pg_dsn):
    port = free_port()
    monkeypatch.setenv(engine.PORT_ENV, str(port))
    monkeypatch.setenv(engine.MASTER_ENV, "local[1]")
    monkeypatch.setattr(service, "LOG_DIR", tmp_path / "logs")
    state_file = tmp_path / "spark-connect.json"
    log_file = tmp_path / "logs" / "spark-connect.log"
    url = f"sc://127.0.0.1:{port}"
    lake = str(tmp_path / "lake" / "probe")
    pgid = service.start_engine(state_file)
    try:
        first = wait_for_server(state_file, port, log_file)
        assert json.loads(state_file.read_text())["supervisor"] == pgid

        spark = connect_session(url)
        assert spark.sql("SELECT 1 + 1 AS two").first()["two"] == 2
        spark.createDataFrame([(1, HOSTILE), (2, None)], "id long, v string").write.format("delta").save(lake)
        # A JDBC read with the jobs' password as an option: the server reads PostgreSQL for the
        # client, and the password reaches none of its log lines.
        options = pg.JdbcTarget.from_dsn(pg_dsn).options()
        current = spark.read.format("jdbc").options(**options).option("query", "SELECT current_user AS u").load()
        assert current.first()["u"] == "coldharbor_pipeline"
        spark.stop()

        os.kill(first, signal.SIGKILL)
        second = wait_for_server(state_file, port, log_file, not_pid=first)
        spark = connect_session(url)
        rows = {r["id"]: r["v"] for r in spark.read.format("delta").load(lake).collect()}
        assert rows == {1: HOSTILE, 2: None}, "a restarted server reads what the first one wrote"
        spark.stop()
        assert group_alive(pgid) and second != first

        service.end_group("spark-connect", pgid)
        assert not group_alive(pgid), "a process of the server's group outlived `make stop`"
        assert not engine.accepts(engine.LOOPBACK, port)
        assert not state_file.exists()
        assert options["password"] not in log_file.read_text(errors="replace")
    finally:
        if group_alive(pgid):
            os.killpg(pgid, signal.SIGKILL)


def test_a_taken_port_is_refused_before_a_server_starts(tmp_path, monkeypatch):
    monkeypatch.setattr(service, "LOG_DIR", tmp_path / "logs")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        monkeypatch.setenv(engine.PORT_ENV, str(port))
        with pytest.raises(SystemExit, match=f"something already listens on 127.0.0.1:{port}"):
            service.start_engine(tmp_path / "spark-connect.json")
    assert not (tmp_path / "logs").exists(), "nothing was started"


def test_the_servers_log_never_holds_a_jobs_jdbc_password(connect_server, pg_dsn):
    """A job's JDBC reads carry the password as an option of the plan it sends. A session closed
    while one of its executions is still held (a job that ended, or was killed, mid-read) makes
    the Connect service log that execution, plan and options included; the server's log must not
    show the password, however the job ends."""
    options = pg.JdbcTarget.from_dsn(pg_dsn).options()
    spark = connect_session(connect_server.url)
    rows = spark.read.format("jdbc").options(**options).option("query", "SELECT g FROM generate_series(1, 5000) g") \
        .load().toLocalIterator()
    assert next(rows)["g"] == 1
    spark.stop()  # the execution is still held: the session's close removes it
    time.sleep(2)  # the server writes its log lines after answering
    assert options["password"] not in connect_server.log.read_text(errors="replace")

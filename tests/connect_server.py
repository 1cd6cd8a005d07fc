"""A real Spark Connect server for the tests, started as docker-compose starts its engine
(`python -m coldharbor.runtime.engine serve`, which runs coldharbor.runtime.spark.connect_server_command), and the
jobs run as its thin clients."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from coldharbor.runtime.spark import REMOTE_ENV

PROJECT = Path(__file__).resolve().parents[1]
START_TIMEOUT_S = 300


@dataclass(frozen=True)
class ConnectServer:
    url: str
    process: subprocess.Popen
    log: Path

    def log_tail(self, chars: int = 4000) -> str:
        return self.log.read_text(errors="replace")[-chars:] if self.log.exists() else ""


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def server_env() -> dict[str, str]:
    """The server's environment: this virtual environment first on PATH (its Python runs the
    server's Python workers), bound to 127.0.0.1, and no remote of its own."""
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
           "PYTHONPATH": str(PROJECT / "jobs")}
    env.pop(REMOTE_ENV, None)
    return env


@contextmanager
def running_server(folder: Path, env: dict[str, str] | None = None) -> Iterator[ConnectServer]:
    """A Spark Connect server on a free port of 127.0.0.1, logging to folder/server.log (`env` added
    to its environment); stopped with its whole process group (spark-submit and its JVM) at the end."""
    port = free_port()
    log = folder / "server.log"
    with open(log, "w") as out:
        process = subprocess.Popen([sys.executable, "-m", "coldharbor.runtime.engine", "serve", "--port", str(port),
                                    "--master", "local[2]"], env={**server_env(), **(env or {})}, stdout=out,
                                   stderr=subprocess.STDOUT, start_new_session=True)
    server = ConnectServer(f"sc://127.0.0.1:{port}", process, log)
    try:
        wait_until_listening(server, port)
        yield server
    finally:
        stop(server)


def wait_until_listening(server: ConnectServer, port: int) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while True:
        if server.process.poll() is not None:
            raise RuntimeError(f"the Spark Connect server exited with {server.process.returncode}:\n"
                               f"{server.log_tail()}")
        with socket.socket() as probe:
            if probe.connect_ex(("127.0.0.1", port)) == 0:
                return
        if time.monotonic() > deadline:
            raise RuntimeError(f"the Spark Connect server did not listen within {START_TIMEOUT_S} s:\n"
                               f"{server.log_tail()}")
        time.sleep(0.5)


def stop(server: ConnectServer, sig: int = signal.SIGTERM) -> None:
    """Ends the server's process group (the test started it: spark-submit's shell and the JVM)."""
    if server.process.poll() is None:
        try:
            os.killpg(server.process.pid, sig)
            server.process.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(server.process.pid, signal.SIGKILL)
            server.process.wait(60)
        except ProcessLookupError:
            pass


def job_command(job: str, url: str, dsn: str, lake_root: str, *args: str,
                env: dict[str, str] | None = None) -> tuple[list[str], dict[str, str]]:
    """(argv, environment) of `python jobs/<job>` as a thin client of the server at `url`: no
    spark-submit, and no Java at hand (JAVA_HOME points nowhere), so a job that tried to start a JVM
    of its own would fail."""
    full_env = {**os.environ, "COLDHARBOR_PG_DSN": dsn, REMOTE_ENV: url, "PYTHONPATH": str(PROJECT / "jobs"),
                "JAVA_HOME": "/nonexistent-java", "PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin",
                **(env or {})}
    return [sys.executable, str(PROJECT / "jobs" / job), "--lake-root", lake_root, *args], full_env


def run_job(job: str, url: str, dsn: str, lake_root: str, *args: str, env: dict[str, str] | None = None,
            timeout: float = 600) -> subprocess.CompletedProcess:
    """The job run to its end; its stdout and stderr apart."""
    argv, full_env = job_command(job, url, dsn, lake_root, *args, env=env)
    return subprocess.run(argv, env=full_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          timeout=timeout)


def start_job(job: str, url: str, dsn: str, lake_root: str, *args: str, log: Path,
              env: dict[str, str] | None = None) -> subprocess.Popen:
    """The job in the background, both streams to `log`."""
    argv, full_env = job_command(job, url, dsn, lake_root, *args, env=env)
    with open(log, "w") as out:
        return subprocess.Popen(argv, env=full_env, stdout=out, stderr=subprocess.STDOUT)

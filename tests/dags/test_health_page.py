"""The "Lakehouse health" page in a real headless browser (Debian's Chromium) against a running
Airflow API server, after a real export of a real table."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from tests.helpers import PROJECT, export

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture()
def api_server(airflow_home, tmp_path, monkeypatch):
    port = free_port()
    lake_root = str(tmp_path / "lake")
    monkeypatch.setenv("COLDHARBOR_LAKE_ROOT", lake_root)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(PROJECT / "plugins"), str(PROJECT / "jobs")]),
           "AIRFLOW__CORE__LAZY_LOAD_PLUGINS": "False"}
    log = open(tmp_path / "api-server.log", "w")
    server = subprocess.Popen([str(Path(sys.executable).parent / "airflow"), "api-server", "--host", "127.0.0.1",
                               "--port", str(port), "--workers", "1"], env=env, stdout=log, stderr=subprocess.STDOUT,
                              start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 180
    while True:
        try:
            urllib.request.urlopen(f"{base}/api/v2/monitor/health", timeout=5)
            break
        except OSError:
            if server.poll() is not None or time.monotonic() > deadline:
                log.close()
                raise AssertionError(f"the API server did not come up:\n{(tmp_path / 'api-server.log').read_text()[-3000:]}")
            time.sleep(1)
    yield base, lake_root
    os.killpg(server.pid, signal.SIGTERM)
    try:
        server.wait(30)
    except subprocess.TimeoutExpired:
        os.killpg(server.pid, signal.SIGKILL)
    log.close()


def browse(url: str, tmp_path: Path) -> str:
    """The page as Chromium renders it (the DOM after load)."""
    assert CHROMIUM, "Chromium is not installed: `make test` installs Debian's chromium package (needs root)"
    out = subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                          "--disable-background-networking", "--disable-component-update", "--disable-sync",
                          f"--user-data-dir={tmp_path / 'chromium'}", "--dump-dom", url],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout


def test_the_health_page_shows_an_exported_table(api_server, spark, pg_dsn, pg_conn, table_name, tmp_path):
    base, lake_root = api_server
    pg_conn.execute(f"CREATE TABLE {table_name} (id bigint PRIMARY KEY, v text)")
    pg_conn.execute("SELECT coldharbor.register_table(%s)", (table_name,))
    pg_conn.execute(f"INSERT INTO {table_name} SELECT g, 'v' FROM generate_series(1, 30) g")
    result = export(spark, pg_dsn, table_name, lake_root)
    pg_conn.execute(f"UPDATE {table_name} SET v = 'w' WHERE id <= 4")  # four dirty rows

    page = browse(f"{base}/coldharbor/health", tmp_path)
    assert "<h1>Lakehouse health</h1>" in page
    row = next(line for line in page.split("<tr>") if f"public.{table_name}" in line)
    cells = [c.split("</td>")[0] for c in row.split("<td>")[1:]]
    assert cells[1] == "4"                                   # dirty rows
    assert float(cells[2].split(">")[1].split("<")[0]) >= 0  # freshness lag, seconds
    assert cells[3] == str(result.batch_id) and cells[5] == str(result.lake_version)
    assert int(cells[6]) >= 1                                # files in the Delta table
    assert 'id="report-runs"' in page

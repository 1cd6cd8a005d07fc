"""An export run through the operator as Airflow runs it (spark-submit on a local master), paused
after its JDBC read: the password is in no process's command line (`ps -ef`), in no page of the
Spark UI's REST API (environment, SQL plans), and not in the task log; the DSN file it read is
private to the job's user while the run lasts and gone afterwards."""

from __future__ import annotations

import json
import socket
import stat
import subprocess
import threading
import time
from pathlib import Path

import httpx
from psycopg.conninfo import conninfo_to_dict

from tests.helpers import dirty_ids

PAUSE_POINT = "after_read"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(path: Path, thread: threading.Thread, timeout_s: float = 300) -> None:
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        assert thread.is_alive(), "the export ended before reaching its pause point"
        assert time.monotonic() < deadline, f"the export did not reach {path.name}"
        time.sleep(0.2)


def spark_ui_pages(ui: str) -> dict[str, str]:
    """The application's environment and SQL pages of the Spark UI's REST API."""
    app_id = httpx.get(f"{ui}/api/v1/applications", timeout=30).json()[0]["id"]
    pages = {name: httpx.get(f"{ui}/api/v1/applications/{app_id}/{path}", timeout=30).text for name, path in {
        "environment": "environment", "sql": "sql?details=true&planDescription=true", "jobs": "jobs",
        "stages": "stages?details=true"}.items()}
    pages["environment-page"] = httpx.get(f"{ui}/environment/", timeout=30).text
    return pages


def test_the_password_is_nowhere_a_person_can_look_while_an_export_runs(airflow_home, pg_dsn, pg_conn, table_name,
                                                                         tmp_path, monkeypatch, caplog, capsys):
    from coldharbor_airflow.operators import ColdharborSparkJobOperator

    password = conninfo_to_dict(pg_dsn)["password"]
    pg_conn.execute(f"CREATE TABLE {table_name} (id bigint PRIMARY KEY, v text)")
    pg_conn.execute("SELECT coldharbor.register_table(%s)", (table_name,))
    pg_conn.execute(f"INSERT INTO {table_name} SELECT g, 'v' FROM generate_series(1, 20) g")
    monkeypatch.setenv("COLDHARBOR_LAKE_ROOT", str(tmp_path / "lake"))
    monkeypatch.setenv("COLDHARBOR_PAUSE_AT", PAUSE_POINT)
    monkeypatch.setenv("COLDHARBOR_PAUSE_DIR", str(tmp_path))
    ui_port = free_port()
    operator = ColdharborSparkJobOperator(task_id="export", job="cdc_export.py", job_args=["--table", table_name],
                                          conf={"spark.ui.enabled": "true", "spark.ui.port": str(ui_port)})
    caplog.set_level("INFO")
    outcome: list[BaseException | None] = []

    def run() -> None:
        try:
            operator.execute({})
            outcome.append(None)
        except BaseException as exc:  # handed to the test thread
            outcome.append(exc)

    export = threading.Thread(target=run)
    export.start()
    try:
        wait_for(tmp_path / f"{PAUSE_POINT}.reached", export)
        driver_pid = int((tmp_path / f"{PAUSE_POINT}.reached").read_text())
        processes = subprocess.run(["ps", "-ef", "--width", "100000"], capture_output=True, text=True).stdout
        environ = dict(item.split("=", 1) for item in
                       Path(f"/proc/{driver_pid}/environ").read_text().split("\0") if "=" in item)
        dsn_file = Path(environ["COLDHARBOR_PG_DSN_FILE"])
        mode, owner = stat.S_IMODE(dsn_file.stat().st_mode), dsn_file.stat().st_uid
        ui_pages = spark_ui_pages(f"http://127.0.0.1:{ui_port}")
    finally:
        (tmp_path / f"{PAUSE_POINT}.resume").write_text("")
        export.join(600)
    assert outcome == [None], outcome

    assert "cdc_export.py" in processes and password not in processes
    assert (mode, owner) == (0o600, Path(tmp_path).stat().st_uid) and not dsn_file.exists()
    assert "COLDHARBOR_PG_DSN" not in environ
    assert ["spark.ui.port", str(ui_port)] in json.loads(ui_pages["environment"])["sparkProperties"]  # this run's
    assert "Scan JDBCRelation" in ui_pages["sql"]  # the JDBC read's plan is there to look at
    assert {name: password in text for name, text in ui_pages.items()} == dict.fromkeys(ui_pages, False)
    log = caplog.text + capsys.readouterr().out  # the task log: the provider relays spark-submit's output
    assert "Spark-Submit cmd" in log and password not in log
    assert dirty_ids(pg_conn, table_name) == []  # and the export itself went through

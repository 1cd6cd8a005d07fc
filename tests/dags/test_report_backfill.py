"""A backfill of a report DAG over a busy table with exact history (issue 26, part 3), run by a
real Airflow: `airflow standalone` (scheduler, DAG processor, API server, LocalExecutor, the Task
SDK) and `airflow backfill create`, with the jobs on the test's Spark Connect server.

The table is written about 25 times a second while it is exported every few seconds, so keys
change several times between two exports around every interval end (the instants a table with
the default history refuses). Each run writes one version of a Delta report table, which names the
instant it answers for; every version must equal PostgreSQL at that instant, as the recorded
history (the consistency suite's model: the state after every commit, on PostgreSQL's clock)
holds it."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta, timezone
from pathlib import Path

import httpx
import psycopg
from coldharbor.runtime import pg

from tests.consistency.model import Model
from tests.dags.airflow_api import free_port, stop_group
from tests.dags.test_connect_jobs import CONNECT_CONN
from tests.helpers import PROJECT, export

AIRFLOW = str(Path(sys.executable).parent / "airflow")
KEYS = range(1, 41)
WRITES_PER_S = 25
EXPORT_EVERY_S = 4.0
QUIET_S = 0.25  # no commit this close to an interval end: the recorded state at it is unambiguous

REPORT = """-- report: {name}
-- target: reports.{name}
-- sink: delta
-- schedule: * * * * *
SELECT id, v FROM {table}
"""


def next_minute(at: datetime) -> datetime:
    return at.replace(second=0, microsecond=0) + timedelta(minutes=1)


class BusyWriter(threading.Thread):
    """The application: single-key and two-key transactions on 40 keys, WRITES_PER_S a second, each
    commit recorded in the model at PostgreSQL's clock; quiet for QUIET_S around every `pauses`."""

    def __init__(self, dsn: str, table: str, model: Model, until: datetime, pauses: list[datetime]):
        super().__init__(daemon=True)
        self.dsn, self.table, self.model, self.until, self.pauses = dsn, table, model, until, pauses
        self.rng = random.Random(26)
        self.writes: list[tuple[datetime, int]] = []  # (recorded after the commit, key)
        self.error: BaseException | None = None
        self.counter = 0

    def run(self) -> None:
        try:
            with pg.connect(self.dsn, autocommit=True) as conn:
                while (now := datetime.now(timezone.utc)) < self.until:
                    for pause in self.pauses:
                        if pause - timedelta(seconds=QUIET_S) <= now <= pause + timedelta(seconds=QUIET_S / 5):
                            time.sleep((pause - now).total_seconds() + QUIET_S / 5)
                    self.write(conn)
                    time.sleep(1 / WRITES_PER_S)
        except BaseException as exc:  # the test fails with it, in its own thread
            self.error = exc

    def write(self, conn: psycopg.Connection) -> None:
        writes = []
        with conn.transaction():
            for key in self.rng.sample(KEYS, self.rng.choice((1, 1, 1, 2))):
                present = key in self.model.rows or any(k == key and kind == "put" for kind, k, _ in writes)
                if present and self.rng.random() < 0.15:
                    conn.execute(f"DELETE FROM {self.table} WHERE id = %s", (key,))
                    writes.append(("del", key, None))
                    continue
                self.counter += 1
                value = f"w{self.counter} it's \"busy\""
                conn.execute(f"INSERT INTO {self.table} VALUES (%s, %s) ON CONFLICT (id) DO UPDATE SET v = EXCLUDED.v",
                             (key, value))
                writes.append(("put", key, value))
        at = conn.execute("SELECT clock_timestamp()", binary=True).fetchone()[0]
        self.model.apply(writes)
        self.model.stamp(at)
        self.writes.extend((at, key) for _, key, _ in writes)


@contextmanager
def standalone(home: Path, env: dict[str, str]) -> Iterator[str]:
    """`airflow standalone` in a process group of its own until the block ends; yields the API's URL."""
    port = free_port()
    env.update({"AIRFLOW_HOME": str(home), "AIRFLOW__API__HOST": "127.0.0.1", "AIRFLOW__API__PORT": str(port),
                "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"http://127.0.0.1:{port}/execution/"})
    base = f"http://127.0.0.1:{port}"
    log_path = home / "standalone.log"
    home.mkdir(parents=True, exist_ok=True)
    with open(log_path, "w") as log:
        process = subprocess.Popen([AIRFLOW, "standalone"], env=env, stdout=log, stderr=subprocess.STDOUT,
                                   start_new_session=True)
    try:
        yield base
    finally:
        stop_group(process, grace_s=60)


class Api:
    """Airflow's REST API as a client uses it: a token from /auth/token, then /api/v2."""

    def __init__(self, base: str, home: Path):
        self.base, self.home, self.token = base, home, None

    def get(self, path: str) -> dict | None:
        """The answer's JSON; None for 404 (not there yet)."""
        if self.token is None:
            password = json.loads((self.home / "simple_auth_manager_passwords.json.generated").read_text())["admin"]
            answer = httpx.post(f"{self.base}/auth/token", json={"username": "admin", "password": password}, timeout=30)
            assert answer.status_code == 201, answer.text
            self.token = answer.json()["access_token"]
        answer = httpx.get(f"{self.base}/api/v2{path}", headers={"Authorization": f"Bearer {self.token}"}, timeout=30)
        if answer.status_code == 404:
            return None
        assert answer.status_code == 200, answer.text
        return answer.json()


def wait_for(what: str, check, timeout_s: float, log_path: Path):
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            value = check()
            if value:
                return value
        except (OSError, httpx.HTTPError, FileNotFoundError, KeyError):
            pass
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} did not happen within {timeout_s:.0f}s; the log ends:\n"
                                 f"{log_path.read_text()[-4000:] if log_path.exists() else '(no log)'}")
        time.sleep(2)


def airflow(env: dict[str, str], *args: str) -> str:
    done = subprocess.run([AIRFLOW, *args], env=env, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, f"airflow {' '.join(args)}:\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}"
    return done.stdout


def test_a_backfill_over_a_busy_exact_table_serves_each_interval_as_postgres_held_it(
        airflow_home, spark, connect_url, pg_dsn, admin_dsn, pg_conn, table_name, tmp_path):
    name = f"r_{table_name}"
    dag_id = f"coldharbor_report_{name}"
    lake_root = str(tmp_path / "lake")
    reports = tmp_path / "reports"
    reports.mkdir()
    (reports / f"{name}.sql").write_text(REPORT.format(name=name, table=table_name))

    # A table that holds rows when it is registered, with exact history; its initial load.
    model = Model()
    pg_conn.execute(f"CREATE TABLE {table_name} (id int PRIMARY KEY, v text)")
    pg_conn.execute(f"INSERT INTO {table_name} SELECT g, 'before ' || g FROM generate_series(1, 30) g")
    model.apply([("put", k, f"before {k}") for k in range(1, 31)])
    pg_conn.execute("SELECT coldharbor.register_table(%s, p_history => 'exact')", (table_name,))
    model.stamp(pg_conn.execute("SELECT clock_timestamp()", binary=True).fetchone()[0])
    export(spark, pg_dsn, table_name, lake_root)

    host, port = connect_url.removeprefix("sc://").rsplit(":", 1)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(PROJECT / "plugins"), str(PROJECT / "jobs")]),
           "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]),
           "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "True", "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
           "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "5",
           "COLDHARBOR_REPORTS_DIR": str(reports), "COLDHARBOR_LAKE_ROOT": lake_root,
           "COLDHARBOR_AS_OF_WAIT_S": "120",
           f"AIRFLOW_CONN_{CONNECT_CONN.upper()}": json.dumps({"conn_type": "spark_connect", "host": host,
                                                              "port": int(port)}),
           "AIRFLOW_VAR_COLDHARBOR_SPARK_CONN_ID": CONNECT_CONN}
    env.pop("AIRFLOW__DATABASE__SQL_ALCHEMY_CONN", None)  # its own metadata database, in its own home
    home = tmp_path / "airflow"
    with standalone(home, env) as base:   # starts while the application writes
        started = datetime.now(timezone.utc)
        first = next_minute(started + timedelta(seconds=10))
        ends = [first, first + timedelta(minutes=1)]
        writer = BusyWriter(admin_dsn, table_name, model, until=ends[-1] + timedelta(seconds=2 * EXPORT_EVERY_S), pauses=ends)
        writer.start()
        exports: list[tuple[datetime, datetime]] = []
        while writer.is_alive():
            began = datetime.now(timezone.utc)
            export(spark, pg_dsn, table_name, lake_root)
            exports.append((began, datetime.now(timezone.utc)))
            time.sleep(max(0.0, EXPORT_EVERY_S - (exports[-1][1] - began).total_seconds()))
        writer.join()
        assert writer.error is None, writer.error
        began = datetime.now(timezone.utc)
        export(spark, pg_dsn, table_name, lake_root)
        exports.append((began, datetime.now(timezone.utc)))

        # The premise: around every interval end, keys changed more than once in one export's batch
        # (committed after one export ended and before the next began).
        for end in ends:
            before = max(e for _, e in exports if e < end)
            after = min(b for b, _ in exports if b > end)
            keys = [k for at, k in writer.writes if before < at < after]
            assert len(keys) > len(set(keys)), f"no key changed twice between the exports around {end}"

        log_path = home / "standalone.log"
        api = Api(base, home)
        wait_for("the API server", lambda: httpx.get(f"{base}/api/v2/monitor/health", timeout=5).is_success,
                 300, log_path)
        airflow(env, "pools", "set", "coldharbor_spark", "1", "Coldharbor Spark jobs")
        wait_for(f"{dag_id} to be parsed", lambda: api.get(f"/dags/{dag_id}"), 300, log_path)
        # Created while the DAG is paused, so no scheduled run has taken an interval of the range yet.
        airflow(env, "backfill", "create", "--dag-id", dag_id, "--from-date", ends[0].isoformat(),
                "--to-date", ends[-1].isoformat(), "--max-active-runs", "1")
        airflow(env, "dags", "unpause", dag_id)

        def backfill_done():
            runs = [r for r in api.get(f"/dags/{dag_id}/dagRuns?limit=100")["dag_runs"] if r["run_type"] == "backfill"]
            return runs if runs and all(r["state"] in ("success", "failed") for r in runs) else None

        runs = wait_for("the backfill's runs to finish", backfill_done, 600, log_path)

    assert sorted((datetime.fromisoformat(r["logical_date"]), r["state"]) for r in runs) == \
        [(end, "success") for end in ends], runs
    # One version of the report table per run, each naming its instant and equal to PostgreSQL then.
    from delta.tables import DeltaTable

    path = f"{lake_root}/reports/{name}"
    answered = {}
    for version in DeltaTable.forPath(spark, path).history().collect():
        as_of = datetime.fromisoformat(json.loads(version["userMetadata"])["as_of"])
        rows = spark.read.format("delta").option("versionAsOf", version["version"]).load(path).collect()
        assert {r["id"]: r["v"] for r in rows} == model.as_of(as_of), f"the report as of {as_of}"
        answered[as_of] = version["version"]
    assert set(ends) <= set(answered), answered
    assert all(model.as_of(end) != model.as_of(end - timedelta(minutes=1)) for end in ends)

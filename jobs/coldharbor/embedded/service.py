"""The service on its embedded defaults, on one machine:

    python -m coldharbor.embedded.service start    PostgreSQL, sql/, a demo table fed by a live workload, the
                                         Spark Connect server (127.0.0.1, supervised: started again
                                         if it dies) and Airflow standalone (LocalExecutor, API on
                                         127.0.0.1) with the DAGs unpaused, its jobs Connect clients;
                                         prints the URL and where the login is
    python -m coldharbor.embedded.service stop     ends every process `start` began, by process group
    python -m coldharbor.embedded.service workload (internal) the demo workload: a few writes every seconds, as the
                                         demo application's role (COLDHARBOR_PG_DSN)

Everything lives under data/: PostgreSQL in data/pg, the lake in data/lake, Airflow in
data/airflow, the process groups in data/service.json, the Spark Connect server's pids in
data/spark-connect.json, the logs in data/logs.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import random
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from coldharbor.embedded import stack
from coldharbor.runtime import engine, pg, settings

log = logging.getLogger(__name__)

AIRFLOW_HOME = settings.DATA_DIR / "airflow"
STATE_FILE = settings.DATA_DIR / "service.json"
ENGINE_STATE_FILE = settings.DATA_DIR / "spark-connect.json"
LOG_DIR = settings.DATA_DIR / "logs"
API_PORT = int(os.environ.get("COLDHARBOR_AIRFLOW_PORT", "8080"))
BIN = Path(sys.executable).parent
START_TIMEOUT_S = 300


# Set-up's secrets: they never reach Airflow, its workers or a job, even when the caller's shell has them.
SETUP_ONLY = (settings.ADMIN_PG_DSN_ENV, settings.PIPELINE_PASSWORD_ENV, stack.DEMO_PASSWORD_ENV, stack.DEMO_PG_DSN_ENV)
# The Airflow connection the embedded stack's jobs run through: the Spark Connect server.
SPARK_CONNECT_CONN_ID = "coldharbor_spark_connect"


def airflow_env(dsn: str) -> dict[str, str]:
    """Airflow's settings for the embedded service; the connections carry the credentials (`dsn`: the
    jobs' login, coldharbor_pipeline)."""
    from psycopg.conninfo import conninfo_to_dict

    params = conninfo_to_dict(dsn)
    project = settings.PROJECT_DIR
    return {
        **{key: value for key, value in os.environ.items() if key not in SETUP_ONLY},
        "AIRFLOW_HOME": str(AIRFLOW_HOME),
        "AIRFLOW__CORE__DAGS_FOLDER": str(project / "dags"),
        "AIRFLOW__CORE__PLUGINS_FOLDER": str(project / "plugins"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "False",
        "AIRFLOW__CORE__PARALLELISM": "4",
        # OpenLineage (when a transport is configured) emits from a thread: a forked emitter never
        # finished here after a job on Spark Connect (its gRPC threads, likely) and the event was lost.
        "AIRFLOW__OPENLINEAGE__EXECUTE_IN_THREAD": "True",
        "AIRFLOW__API__HOST": "127.0.0.1",
        "AIRFLOW__API__PORT": str(API_PORT),
        # Where tasks report to; Airflow's default names port 8080 whatever the API listens on.
        "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"http://127.0.0.1:{API_PORT}/execution/",
        "AIRFLOW_CONN_COLDHARBOR_PG": json.dumps({
            "conn_type": "postgres", "host": params.get("host"), "port": int(params.get("port", 5432)),
            "login": params.get("user"), "password": params.get("password"), "schema": params.get("dbname")}),
        "AIRFLOW_CONN_SPARK_DEFAULT": json.dumps({"conn_type": "spark", "host": "local[2]",
                                                  "extra": {"deploy-mode": "client"}}),
        f"AIRFLOW_CONN_{SPARK_CONNECT_CONN_ID.upper()}": json.dumps({
            "conn_type": "spark_connect", "host": engine.LOOPBACK, "port": engine.configured_port()}),
        "AIRFLOW_VAR_COLDHARBOR_SPARK_CONN_ID": SPARK_CONNECT_CONN_ID,
        settings.LAKE_ROOT_ENV: str(settings.DATA_DIR / "lake"),
        "PYTHONPATH": os.pathsep.join([str(project / "plugins"), str(project / "jobs")]),
        "PATH": os.pathsep.join([str(BIN), os.environ.get("PATH", "")]),
        "SPARK_LOCAL_IP": "127.0.0.1",
    }


def engine_env() -> dict[str, str]:
    """The Spark Connect server's environment: no PostgreSQL credential of any kind (the jobs hand
    their JDBC settings to it per read), this environment's bin first."""
    hidden = (*SETUP_ONLY, settings.PG_DSN_ENV, settings.PG_DSN_FILE_ENV)
    return {**{key: value for key, value in os.environ.items() if key not in hidden and not key.startswith("AIRFLOW_")},
            "PATH": os.pathsep.join([str(BIN), os.environ.get("PATH", "")]), "SPARK_LOCAL_IP": engine.LOOPBACK}


def start_engine(state_file: Path = ENGINE_STATE_FILE) -> int:
    """The Spark Connect server on 127.0.0.1 under its supervisor, in a process group of its own
    (returned); refused when something already listens on its port."""
    port = engine.configured_port()
    if engine.accepts(engine.LOOPBACK, port):
        raise SystemExit(f"something already listens on 127.0.0.1:{port} (another Spark Connect server?): stop it, "
                         f"or set {engine.PORT_ENV} to a free port")
    return spawn("spark-connect", [sys.executable, "-m", "coldharbor.runtime.engine", "supervise", "--port", str(port),
                                   "--bind", engine.LOOPBACK, "--state-file", str(state_file)], engine_env())


def wait_for_engine(deadline: float) -> None:
    port = engine.configured_port()
    if not engine.wait_until_ready(engine.LOOPBACK, port, max(0.0, deadline - time.monotonic())):
        raise SystemExit(f"the Spark Connect server did not answer on 127.0.0.1:{port} within {START_TIMEOUT_S}s; "
                         f"see {LOG_DIR / 'spark-connect.log'}")


def spawn(name: str, command: list[str], env: dict[str, str]) -> int:
    """`command` in a session (and process group) of its own, its output appended to data/logs/<name>.log."""
    LOG_DIR.mkdir(parents=True, exist_ok=True)
    with open(LOG_DIR / f"{name}.log", "a") as out:
        process = subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    return process.pid  # its own session: the pid is the process group


def _wait_for_api(deadline: float) -> None:
    url = f"http://127.0.0.1:{API_PORT}/api/v2/monitor/health"
    while True:
        try:
            urllib.request.urlopen(url, timeout=5)
            return
        except OSError:
            if time.monotonic() > deadline:
                raise SystemExit(f"Airflow did not answer on {url} within {START_TIMEOUT_S}s; see "
                                 f"{LOG_DIR / 'airflow.log'}") from None
            time.sleep(2)


def start() -> None:
    if STATE_FILE.exists():
        stop()  # a previous start's processes: never two of each
    logins = stack.up()
    groups = {"spark-connect": start_engine()}  # warms up while the rest starts
    STATE_FILE.write_text(json.dumps(groups))
    demo_dsn = stack.demo(logins.admin, stack.demo_password(), rows=200)
    env = airflow_env(logins.pipeline)
    AIRFLOW_HOME.mkdir(parents=True, exist_ok=True)
    subprocess.run([str(BIN / "airflow"), "db", "migrate"], env=env, check=True, stdout=subprocess.DEVNULL)
    subprocess.run([str(BIN / "airflow"), "pools", "set", "coldharbor_spark", "1", "Coldharbor Spark jobs"],
                   env=env, check=True, stdout=subprocess.DEVNULL)
    groups["workload"] = spawn("workload", [sys.executable, "-m", "coldharbor.embedded.service", "workload"],
                               {**env, settings.PG_DSN_ENV: demo_dsn})  # the application's own login
    groups["airflow"] = spawn("airflow", [str(BIN / "airflow"), "standalone"], env)
    STATE_FILE.write_text(json.dumps(groups))
    deadline = time.monotonic() + START_TIMEOUT_S
    _wait_for_api(deadline)
    wait_for_engine(deadline)
    print(f"Coldharbor is running: Airflow at http://127.0.0.1:{API_PORT} "
          f"(health page: http://127.0.0.1:{API_PORT}/coldharbor/health)")
    print(f"Spark Connect server at sc://127.0.0.1:{engine.configured_port()} (loopback only: it has no "
          f"authentication); Airflow's jobs reach it through the connection {SPARK_CONNECT_CONN_ID!r}")
    print(f"login: user 'admin', password in {AIRFLOW_HOME / 'simple_auth_manager_passwords.json.generated'}")
    print(f"PostgreSQL: the jobs' settings in {stack.ENV_FILE}, set-up's (superuser) in {stack.SETUP_ENV_FILE}; "
          f"logs in {LOG_DIR}; stop with 'make stop'")


def stop() -> None:
    groups = json.loads(STATE_FILE.read_text()) if STATE_FILE.exists() else {}
    for name, pgid in groups.items():
        end_group(name, pgid)
    STATE_FILE.unlink(missing_ok=True)
    stack.server().stop()


def end_group(name: str, pgid: int, grace_s: float = 30.0) -> None:
    """SIGTERM to the process group, SIGKILL if anything of it is left after `grace_s`."""
    try:
        os.killpg(pgid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        _reap(pgid)
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            log.info("stopped %s (process group %s)", name, pgid)
            return
        time.sleep(0.5)
    os.killpg(pgid, signal.SIGKILL)
    log.warning("%s (process group %s) ignored SIGTERM for %ss: killed", name, pgid, grace_s)


def _reap(pid: int) -> None:
    """Collects the group leader's exit if it is this process's child (a zombie still counts as a
    member of its group)."""
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass


def workload(dsn: str, every_s: float = 3.0) -> None:
    """A few inserts, updates and deletes on the demo table every few seconds, and a few demo
    customers created, replaced or deleted every few minutes, until stopped."""
    entities_written_at = time.monotonic()
    with pg.connect(dsn) as conn:
        while True:
            top = conn.execute("SELECT coalesce(max(order_id), 0) FROM public.demo_orders").fetchone()[0]
            with conn.transaction():
                conn.execute("""INSERT INTO public.demo_orders (order_id, customer, amount, status)
                                SELECT %s + g, 'customer-' || (g %% 50), round((random() * 500)::numeric, 2), 'new'
                                  FROM generate_series(1, 5) g""", (top,))
                conn.execute("UPDATE public.demo_orders SET status = 'paid', updated_at = now() "
                             "WHERE order_id = %s", (random.randint(1, top + 5),))
                conn.execute("DELETE FROM public.demo_orders WHERE order_id = %s", (random.randint(1, top + 5),))
            if time.monotonic() - entities_written_at >= ENTITY_EVERY_S:
                entities_written_at = time.monotonic()
                _touch_demo_customers(conn)
            time.sleep(every_s)


# Demo customers change every few minutes, not every cycle: the demo shows both a table dirty
# every cycle and an entity schema that is mostly clean (a cycle skips a clean source without Spark).
ENTITY_EVERY_S = 300.0


def _touch_demo_customers(conn) -> None:
    """One new demo customer, one replaced, and now and then one deleted, in one transaction."""
    with conn.transaction():
        stack.put_demo_customer(conn)
        picked = conn.execute("SELECT row_id FROM entities.demo_customer ORDER BY random() LIMIT 2").fetchall()
        if picked:
            stack.put_demo_customer(conn, picked[0][0])
        if len(picked) > 1 and random.random() < 0.3:
            conn.execute("SELECT coldharbor.delete_entity(%s)", (picked[1][0],))


def main(argv: list[str]) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    parser = argparse.ArgumentParser(prog="python -m coldharbor.embedded.service", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", choices=["start", "stop", "workload"])
    args = parser.parse_args(argv)
    if args.command == "start":
        start()
    elif args.command == "stop":
        stop()
    else:
        workload(settings.pg_dsn())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

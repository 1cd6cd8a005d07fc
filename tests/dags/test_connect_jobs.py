"""Jobs as Spark Connect clients: the configured Spark connection's type decides how the same DAGs
run their jobs (in the worker as clients of a real Connect server, or under spark-submit)."""

from __future__ import annotations

import json
import os
import stat
import threading
from pathlib import Path

import pytest
from coldharbor.embedded.stack import free_port, throwaway_server
from coldharbor.runtime import pg

from tests.helpers import PROJECT, connect_session, dirty_ids, lake_live, pg_rows

HOSTILE = "it's \"quoted\"; DROP TABLE x; -- ünïcødé ${env:HOME} {{ params }}"
CONNECT_CONN = "coldharbor_spark_connect"


def use_connect(monkeypatch, url: str) -> None:
    """The configured Spark connection: a spark_connect one at `url`, as `make run` sets it."""
    host_port = url.removeprefix("sc://")
    host, port = host_port.rsplit(":", 1)
    monkeypatch.setenv(f"AIRFLOW_CONN_{CONNECT_CONN.upper()}", json.dumps(
        {"conn_type": "spark_connect", "host": host, "port": int(port)}))
    monkeypatch.setenv("AIRFLOW_VAR_COLDHARBOR_SPARK_CONN_ID", CONNECT_CONN)


def test_the_spark_connections_type_decides_how_the_export_is_mapped(airflow_home, monkeypatch):
    from coldharbor_airflow.connect_run import resolve_spark_conn_id
    from coldharbor_airflow.operators import export_job_args

    monkeypatch.delenv("AIRFLOW_VAR_COLDHARBOR_SPARK_CONN_ID", raising=False)
    tables = ["public.orders", "shop.o'brien"]
    assert resolve_spark_conn_id() == "spark_default"
    assert export_job_args(tables) == [["--table", "public.orders"], ["--table", "shop.o'brien"]]
    use_connect(monkeypatch, "sc://127.0.0.1:15002")
    assert resolve_spark_conn_id() == CONNECT_CONN
    assert export_job_args(tables) == [[]], "one task, one session, every dirty table"
    assert export_job_args([]) == [], "a clean cycle maps nothing, on Connect too"
    assert export_job_args(tables, spark_conn_id="spark_default") == [["--table", "public.orders"],
                                                                     ["--table", "shop.o'brien"]]


def test_a_jobs_main_runs_here_as_a_client_of_the_server_and_leaves_nothing_behind(airflow_home, connect_url,
                                                                                   pg_dsn, tmp_path):
    from coldharbor.runtime import settings
    from coldharbor_airflow.connect_run import run_as_connect_client

    lake = str(tmp_path / "probe")
    seen = {}

    def main(argv: list[str]) -> int:
        spark = connect_session(os.environ["COLDHARBOR_SPARK_REMOTE"])
        seen.update(session=spark, dsn=settings.pg_dsn(), dsn_file=Path(os.environ["COLDHARBOR_PG_DSN_FILE"]))
        seen["mode"] = stat.S_IMODE(seen["dsn_file"].stat().st_mode)
        spark.createDataFrame([(1, HOSTILE), (2, None)], "id long, v string").write.format("delta").save(argv[0])
        return 0

    before = dict(os.environ)
    assert run_as_connect_client(main, [lake], connect_url, pg_dsn) == 0
    assert dict(os.environ) == before, "the job's settings (and PySpark's markers) do not outlive it"
    assert seen["dsn"] == pg_dsn and seen["mode"] == 0o600 and not seen["dsn_file"].exists()
    assert seen["session"].is_stopped, "the job's session is released on the server"
    reader = connect_session(connect_url)
    try:
        assert {r["id"]: r["v"] for r in reader.read.format("delta").load(lake).collect()} == {1: HOSTILE, 2: None}
    finally:
        reader.stop()

    def refusing(argv: list[str]) -> int:
        connect_session(os.environ["COLDHARBOR_SPARK_REMOTE"])
        raise SystemExit(int(argv[0]))

    assert run_as_connect_client(refusing, ["4"], connect_url, pg_dsn) == 4
    assert run_as_connect_client(lambda argv: 2, [], connect_url, pg_dsn) == 2

    def crashing(argv: list[str]) -> int:
        seen["crashed"] = connect_session(os.environ["COLDHARBOR_SPARK_REMOTE"])
        raise RuntimeError("a bug")

    with pytest.raises(RuntimeError, match="a bug"):
        run_as_connect_client(crashing, [], connect_url, pg_dsn)
    assert dict(os.environ) == before and seen["crashed"].is_stopped


def test_the_session_a_job_made_on_a_worker_thread_is_released_and_the_callers_own_is_not(airflow_home, connect_url,
                                                                                         pg_dsn):
    from coldharbor_airflow.connect_run import run_as_connect_client

    made = {}

    def threaded(argv: list[str]) -> int:
        def work() -> None:
            made["session"] = connect_session(os.environ["COLDHARBOR_SPARK_REMOTE"])
            made["session"].sql("SELECT 1").collect()

        worker = threading.Thread(target=work)
        worker.start()
        worker.join()
        return 0

    assert run_as_connect_client(threaded, [], connect_url, pg_dsn) == 0
    assert made["session"].is_stopped

    callers = connect_session(connect_url)  # open across a job's run that made none (a refusal before Spark)
    try:
        assert run_as_connect_client(lambda argv: 2, [], connect_url, pg_dsn) == 2
        assert not callers.is_stopped
        assert callers.sql("SELECT 2 AS two").first()["two"] == 2
    finally:
        callers.stop()


def test_over_connect_the_operator_runs_the_jobs_main_in_the_worker(airflow_home, connect_url, pg_conn, table_name,
                                                                    tmp_path, monkeypatch):
    """The job's own refusals come back as its exit code, said in words, without spark-submit."""
    from airflow.sdk.exceptions import AirflowException
    from coldharbor_airflow.operators import ColdharborSparkJobOperator

    use_connect(monkeypatch, connect_url)
    monkeypatch.setenv("COLDHARBOR_LAKE_ROOT", str(tmp_path / "lake"))
    for args, said in ((["--table", "public.not_registered_anywhere"], "exited with code 2: refused"),
                       (["--no-such-option"], "exited with code 2: refused")):
        operator = ColdharborSparkJobOperator(task_id="export", job="cdc_export.py", job_args=args)
        with pytest.raises(AirflowException, match=f"cdc_export.py {said}"):
            operator.execute({})
        assert operator.on_connect


def test_an_unreachable_connect_server_is_named_and_nothing_runs(airflow_home, pg_conn, table_name, tmp_path,
                                                                 monkeypatch):
    from airflow.sdk.exceptions import AirflowException
    from coldharbor_airflow.operators import ColdharborSparkJobOperator

    port = free_port()  # bound, then released: nothing listens there
    use_connect(monkeypatch, f"sc://127.0.0.1:{port}")
    monkeypatch.setenv("COLDHARBOR_LAKE_ROOT", str(tmp_path / "lake"))
    pg_conn.execute(f"CREATE TABLE {table_name} (id bigint PRIMARY KEY, v text)")
    pg_conn.execute("SELECT coldharbor.register_table(%s)", (table_name,))
    pg_conn.execute(f"INSERT INTO {table_name} VALUES (1, 'a')")
    operator = ColdharborSparkJobOperator(task_id="export", job="cdc_export.py", job_args=["--table", table_name])
    with pytest.raises(AirflowException, match=f"the Spark Connect server sc://127.0.0.1:{port} is unreachable"):
        operator.execute({})
    assert len(dirty_ids(pg_conn, table_name)) == 1
    assert not (tmp_path / "lake").exists()


def make_tables(admin_dsn: str) -> dict[str, list[str]]:
    """Two registered tables of other key types that held rows before registration, then changed:
    {name: key columns}."""
    with pg.connect(admin_dsn) as conn:
        conn.execute("CREATE TABLE public.orders (id bigint PRIMARY KEY, note text, amount numeric(12,2))")
        conn.execute("INSERT INTO public.orders SELECT g, 'before ' || g, g * 1.5 FROM generate_series(1, 40) g")
        conn.execute("CREATE TABLE public.tags (name text, scope text, seen timestamptz, PRIMARY KEY (name, scope))")
        conn.execute("INSERT INTO public.tags VALUES (%s, 'a', now()), ('plain', 'b', now())", (HOSTILE,))
        for name in ("public.orders", "public.tags"):
            conn.execute("SELECT coldharbor.register_table(%s)", (name,))
        conn.execute("UPDATE public.orders SET note = %s WHERE id <= 5", (HOSTILE,))
        conn.execute("DELETE FROM public.orders WHERE id > 35")
        conn.execute("INSERT INTO public.tags VALUES ('new', %s, now())", (HOSTILE,))
    return {"public.orders": ["id"], "public.tags": ["name", "scope"]}


def export_states(run) -> list[tuple[int, str, str | None]]:
    return sorted((ti.map_index, ti.state, ti.rendered_map_index) for ti in run.get_task_instances()
                  if ti.task_id == "export")


def assert_lake_equals_postgres(spark, conn, lake_root: str, tables: dict[str, list[str]]) -> None:
    for name, keys in tables.items():
        assert dirty_ids(conn, name) == [], name
        assert lake_live(spark, lake_root, name, keys) == pg_rows(conn, f"SELECT * FROM {name}", keys), name


def test_the_export_dag_on_connect_exports_every_dirty_table_in_one_task_and_on_a_master_one_per_table(
        airflow_home, connect_url, spark, tmp_path, monkeypatch):
    from airflow.dag_processing.dagbag import DagBag
    from coldharbor_airflow.hooks import ColdharborHook

    lake_root = str(tmp_path / "lake")
    monkeypatch.setenv("COLDHARBOR_LAKE_ROOT", lake_root)
    with throwaway_server(tmp_path / "pg") as logins:  # only this test's tables are registered there
        params = pg.dsn_params(logins.pipeline)
        monkeypatch.setenv("AIRFLOW_CONN_COLDHARBOR_PG", json.dumps({
            "conn_type": "postgres", "host": params["host"], "port": int(params["port"]),
            "login": params["user"], "password": params["password"], "schema": params["dbname"]}))
        tables = make_tables(logins.admin)
        use_connect(monkeypatch, connect_url)
        dag = DagBag(dag_folder=str(PROJECT / "dags")).dags["coldharbor_cdc"]

        run = dag.test()
        assert run.state == "success", run
        assert export_states(run) == [(0, "success", "every dirty table")]
        with pg.connect(logins.admin) as conn:
            assert_lake_equals_postgres(spark, conn, lake_root, tables)
        # What the health page shows comes from PostgreSQL: each table's own export is recorded.
        health = {t["name"]: t for t in ColdharborHook().health()["tables"]}
        for name in tables:
            assert health[name]["dirty_rows"] == 0 and health[name]["last_export_version"] is not None, name

        clean = dag.test()
        assert {ti.task_id: ti.state for ti in clean.get_task_instances()}["export"] == "skipped"

        # The same DAG with a classic master: one spark-submit per dirty table.
        monkeypatch.setenv("AIRFLOW_VAR_COLDHARBOR_SPARK_CONN_ID", "spark_default")
        with pg.connect(logins.admin) as conn:
            conn.execute("UPDATE public.tags SET seen = seen + interval '1 day' WHERE scope = 'b'")
        submitted = dag.test()
        assert submitted.state == "success", submitted
        assert export_states(submitted) == [(0, "success", "public.tags")]
        with pg.connect(logins.admin) as conn:
            assert_lake_equals_postgres(spark, conn, lake_root, tables)

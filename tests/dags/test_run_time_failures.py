"""Bad input at run time: a missing connection or variable, PostgreSQL or Spark down. Each is one
clear message naming the problem, the task fails (and is retried), and nothing is half-written."""

from __future__ import annotations

import json
import socket
from datetime import timedelta

import pytest
from delta.tables import DeltaTable

from tests.dags.statsd_socket import received, statsd_listener, stop_sending
from tests.helpers import PROJECT, dirty_ids


def closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def export_operator(table: str):
    from coldharbor_airflow.operators import ColdharborSparkJobOperator

    return ColdharborSparkJobOperator(task_id="export", job="cdc_export.py", job_args=["--table", table])


@pytest.fixture()
def dirty_table(pg_conn, table_name, tmp_path, monkeypatch):
    monkeypatch.setenv("COLDHARBOR_LAKE_ROOT", str(tmp_path / "lake"))
    monkeypatch.delenv("AIRFLOW_VAR_COLDHARBOR_LAKE_ROOT", raising=False)
    pg_conn.execute(f"CREATE TABLE {table_name} (id bigint PRIMARY KEY, v text)")
    pg_conn.execute("SELECT coldharbor.register_table(%s)", (table_name,))
    pg_conn.execute(f"INSERT INTO {table_name} VALUES (1, 'a'), (2, 'b')")
    return table_name


def assert_nothing_happened(spark, pg_conn, table: str, tmp_path) -> None:
    assert len(dirty_ids(pg_conn, table)) == 2
    assert not DeltaTable.isDeltaTable(spark, str(tmp_path / "lake" / "public" / table))


def test_missing_postgres_connection_is_named(airflow_home, spark, pg_conn, dirty_table, tmp_path, monkeypatch):
    from airflow.sdk.exceptions import AirflowException

    monkeypatch.delenv("AIRFLOW_CONN_COLDHARBOR_PG")
    with pytest.raises(AirflowException, match="the PostgreSQL connection 'coldharbor_pg' is not defined"):
        export_operator(dirty_table).execute({})
    assert_nothing_happened(spark, pg_conn, dirty_table, tmp_path)


def test_missing_spark_connection_is_named_instead_of_submitting_to_yarn(airflow_home, spark, pg_conn, dirty_table,
                                                                       tmp_path, monkeypatch):
    from airflow.sdk.exceptions import AirflowException

    monkeypatch.delenv("AIRFLOW_CONN_SPARK_DEFAULT")
    with pytest.raises(AirflowException, match="the Spark connection 'spark_default' is not defined"):
        export_operator(dirty_table).execute({})
    assert_nothing_happened(spark, pg_conn, dirty_table, tmp_path)


def test_missing_lake_root_names_the_variable(airflow_home, spark, pg_conn, dirty_table, tmp_path, monkeypatch):
    from airflow.sdk.exceptions import AirflowException

    monkeypatch.delenv("COLDHARBOR_LAKE_ROOT")
    with pytest.raises(AirflowException, match="no lake root: set the Airflow Variable 'coldharbor_lake_root'"):
        export_operator(dirty_table).execute({})
    assert_nothing_happened(spark, pg_conn, dirty_table, tmp_path)


def test_lake_root_comes_from_the_airflow_variable(airflow_home, monkeypatch):
    from coldharbor_airflow.submit_settings import resolve_lake_root

    monkeypatch.delenv("COLDHARBOR_LAKE_ROOT", raising=False)
    monkeypatch.setenv("AIRFLOW_VAR_COLDHARBOR_LAKE_ROOT", "s3a://lake-bucket/lake")
    assert resolve_lake_root(None) == "s3a://lake-bucket/lake"
    assert resolve_lake_root("/explicit") == "/explicit"


def test_spark_master_down_is_named_before_anything_is_submitted(airflow_home, spark, pg_conn, dirty_table,
                                                                 tmp_path, monkeypatch):
    from airflow.sdk.exceptions import AirflowException

    port = closed_port()
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_DEFAULT", json.dumps(
        {"conn_type": "spark", "host": f"spark://127.0.0.1:{port}", "extra": {"deploy-mode": "client"}}))
    with pytest.raises(AirflowException, match=f"the Spark master spark://127.0.0.1:{port} is unreachable"):
        export_operator(dirty_table).execute({})
    assert_nothing_happened(spark, pg_conn, dirty_table, tmp_path)


def test_spark_conf_comes_from_the_connection_extra(airflow_home, monkeypatch):
    from airflow.sdk import BaseHook
    from airflow.sdk.exceptions import AirflowException
    from coldharbor_airflow.submit_settings import connection_conf

    monkeypatch.setenv("AIRFLOW_CONN_SPARK_S3", json.dumps({
        "conn_type": "spark", "host": "local[1]",
        "extra": {"conf": {"spark.hadoop.fs.s3a.endpoint": "http://minio:9000", "spark.executor.cores": 2}}}))
    assert connection_conf(BaseHook.get_connection("spark_s3")) == {
        "spark.hadoop.fs.s3a.endpoint": "http://minio:9000", "spark.executor.cores": "2"}
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_BAD", json.dumps({"conn_type": "spark", "host": "local[1]",
                                                             "extra": {"conf": ["spark.x=1"]}}))
    with pytest.raises(AirflowException, match="extra 'conf' of connection 'spark_bad' must be a JSON object"):
        connection_conf(BaseHook.get_connection("spark_bad"))


def test_postgres_down_when_the_job_runs_fails_the_task_with_the_jobs_message(airflow_home, spark, pg_conn,
                                                                             dirty_table, tmp_path, monkeypatch,
                                                                             caplog, capsys):
    """The connection exists but nothing listens there: spark-submit starts, the job cannot reach
    PostgreSQL, exits 2 with a message naming the server, and the task fails saying what 2 means."""
    from airflow.sdk.exceptions import AirflowException

    port = closed_port()
    monkeypatch.setenv("AIRFLOW_CONN_COLDHARBOR_PG", json.dumps(
        {"conn_type": "postgres", "host": "127.0.0.1", "port": port, "login": "app", "password": "s3cret-pw",
         "schema": "app"}))
    caplog.set_level("INFO")
    with pytest.raises(AirflowException, match="cdc_export.py exited with code 2: refused or a tier was unreachable"):
        export_operator(dirty_table).execute({})
    log = caplog.text + capsys.readouterr().out  # the task logger writes through structlog to stdout
    assert f"PostgreSQL at 127.0.0.1:{port}/app is unreachable" in log
    assert "s3cret-pw" not in log
    assert_nothing_happened(spark, pg_conn, dirty_table, tmp_path)


def test_postgres_down_fails_the_cdc_dag_first_task_and_it_is_retried(airflow_home, monkeypatch):
    """The probe task of coldharbor_cdc meets an unreachable server: a clear error, and the task is
    put up for retry (retries with back-off) rather than failed outright."""
    from airflow.dag_processing.dagbag import DagBag
    from airflow.sdk.exceptions import AirflowException
    from coldharbor_airflow.hooks import ColdharborHook

    port = closed_port()
    monkeypatch.setenv("AIRFLOW_CONN_COLDHARBOR_PG", json.dumps(
        {"conn_type": "postgres", "host": "127.0.0.1", "port": port, "login": "app", "schema": "app"}))
    with pytest.raises(AirflowException, match=rf"PostgreSQL at 127.0.0.1:{port}/app \(connection 'coldharbor_pg'\) "
                                               "is unreachable"):
        ColdharborHook().tables_needing_export()

    dag = DagBag(dag_folder=str(PROJECT / "dags")).dags["coldharbor_cdc"]
    probe_task = dag.get_task("tables_to_export")
    assert probe_task.retries >= 2 and probe_task.retry_exponential_backoff
    probe_task.retry_delay = timedelta(seconds=1)  # the retries themselves, not their back-off, are tested
    listener = statsd_listener(monkeypatch)
    try:
        run = dag.test()
        sent = received(listener)
    finally:
        stop_sending(listener)
    probe = next(ti for ti in run.get_task_instances() if ti.task_id == "tables_to_export")
    assert (run.state, probe.state) == ("failed", "failed")
    assert probe.try_number == probe_task.retries + 1  # tried, then retried each time it was allowed
    assert "export" not in {ti.task_id for ti in run.get_task_instances() if ti.state == "success"}
    # The StatsD publisher runs beside the probe and says PostgreSQL is down, and nothing else.
    assert {ti.task_id: ti.state for ti in run.get_task_instances()}["publish_metrics"] == "success"
    assert sent == {"airflow.coldharbor.up.postgres": 0}


def test_a_refused_report_fails_the_task_before_spark_submit_starts(airflow_home, pg_conn, table_name, tmp_path,
                                                                    monkeypatch):
    """The sandbox's refusal runs in the worker: no spark-submit (so no JVM), one failed run row,
    and the marker a shell command would have made is not there."""
    from airflow.sdk.exceptions import AirflowFailException
    from coldharbor_airflow.operators import ColdharborSparkJobOperator

    monkeypatch.setenv("COLDHARBOR_LAKE_ROOT", str(tmp_path / "lake"))
    pg_conn.execute(f"CREATE TABLE {table_name} (id bigint PRIMARY KEY, v text)")
    pg_conn.execute("SELECT coldharbor.register_table(%s)", (table_name,))
    marker = tmp_path / "owned"
    submitted = []
    monkeypatch.setattr(ColdharborSparkJobOperator, "prepared_submit", lambda self: submitted.append(1))
    operator = ColdharborSparkJobOperator(
        task_id="serve", job="serve_report.py",
        job_args=["--sql", f"SELECT TRANSFORM(v) USING 'touch {marker}' AS (x) FROM {table_name}",
                  "--target", "adhoc_owned", "--run-id", f"refused-{table_name}"])
    with pytest.raises(AirflowFailException, match="refused the report before Spark started: .*TRANSFORM"):
        operator.execute({})
    assert submitted == [] and not marker.exists()
    assert pg_conn.execute("SELECT state FROM coldharbor.report_runs WHERE run_id = %s",
                           (f"refused-{table_name}",)).fetchone() == ("failed",)

"""What the operator builds for each Spark master the README advertises: the full spark-submit
command line and environment the apache-spark provider's hook would run (its real code, nothing
replaced), and where the DSN went. The password is in none of the arguments, Spark settings,
environment values or log lines, on any master."""

from __future__ import annotations

import json
import os
import socket
import stat
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

PASSWORD = "pw-Zq9x-s3cret"
DSN_FILE_ENV = "COLDHARBOR_PG_DSN_FILE"


@pytest.fixture()
def standalone_master() -> Iterator[str]:
    """A loopback port that accepts connections, standing where a standalone master listens."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        yield f"spark://127.0.0.1:{listener.getsockname()[1]}"


@pytest.fixture()
def job_connections(airflow_home, tmp_path, monkeypatch):
    monkeypatch.setenv("AIRFLOW_CONN_COLDHARBOR_PG", json.dumps({
        "conn_type": "postgres", "host": "db.internal", "port": 6543, "login": "pipeline", "password": PASSWORD,
        "schema": "shop", "extra": {"sslmode": "verify-full", "application_name": "coldharbor-shop"}}))
    monkeypatch.setenv("COLDHARBOR_LAKE_ROOT", str(tmp_path / "lake"))


def use_spark(monkeypatch, master: str, deploy_mode: str, **extra: str) -> None:
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_DEFAULT", json.dumps(
        {"conn_type": "spark", "host": master, "extra": {"deploy-mode": deploy_mode, "namespace": "jobs", **extra}}))


@contextmanager
def built_submit() -> Iterator[tuple[list[str], dict[str, str], dict[str, str]]]:
    """(command line, environment given to spark-submit's process, Spark settings) of an export,
    as the provider's hook builds them for the operator's prepared run."""
    from coldharbor_airflow.operators import ColdharborSparkJobOperator

    operator = ColdharborSparkJobOperator(task_id="export", job="cdc_export.py", job_args=["--table", "public.orders"])
    with operator.prepared_submit():
        hook = operator._get_hook()
        command = hook._build_spark_submit_command(operator.application)
        yield command, dict(hook._env or {}), {str(k): str(v) for k, v in hook._conf.items()}


def confs(command: list[str]) -> dict[str, str]:
    pairs = [command[i + 1].split("=", 1) for i, arg in enumerate(command) if arg == "--conf"]
    return dict(pairs)


def assert_no_password(command, env, conf, log: str) -> None:
    assert PASSWORD not in " ".join(command)
    assert not any(PASSWORD in value for value in [*env.values(), *conf.values()])
    assert PASSWORD not in log


def assert_private_dsn_file(path: Path) -> None:
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and path.stat().st_uid == os.getuid()
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert f"password={PASSWORD}" in path.read_text()


@pytest.mark.parametrize("master, deploy_mode", [
    ("local[2]", "client"), ("standalone", "client"), ("yarn", "client"), ("k8s://https://127.0.0.1:6443", "client")])
def test_a_driver_on_this_machine_reads_a_private_file_of_the_run(job_connections, standalone_master, monkeypatch,
                                                                   caplog, capsys, master, deploy_mode):
    use_spark(monkeypatch, standalone_master if master == "standalone" else master, deploy_mode)
    caplog.set_level("DEBUG")
    with built_submit() as (command, env, conf):
        path = Path(env[DSN_FILE_ENV])  # spark-submit's own process gets it: the driver is that process
        assert path.is_absolute()
        assert_private_dsn_file(path)
    assert not path.exists() and not path.parent.exists()  # removed with the run's folder
    assert_no_password(command, env, conf, caplog.text + capsys.readouterr().out)
    assert "COLDHARBOR_PG_DSN" not in env and not any(k.endswith(".COLDHARBOR_PG_DSN") for k in confs(command))
    if master == "yarn":  # the provider also copies the environment into the application master's settings
        assert confs(command)[f"spark.yarn.appMasterEnv.{DSN_FILE_ENV}"] == str(path)
    if master.startswith("k8s"):
        assert confs(command)[f"spark.kubernetes.driverEnv.{DSN_FILE_ENV}"] == str(path)


def test_a_yarn_cluster_driver_gets_the_file_shipped_into_its_container(job_connections, monkeypatch, caplog, capsys):
    use_spark(monkeypatch, "yarn", "cluster")
    caplog.set_level("DEBUG")
    with built_submit() as (command, env, conf):
        shipped = command[command.index("--files") + 1]
        path, alias = shipped.split("#")
        assert alias == "coldharbor-pg.dsn"
        assert_private_dsn_file(Path(path))
    assert confs(command)[f"spark.yarn.appMasterEnv.{DSN_FILE_ENV}"] == "coldharbor-pg.dsn"  # the container's folder
    assert not Path(path).exists()
    assert_no_password(command, env, conf, caplog.text + capsys.readouterr().out)


def test_a_kubernetes_cluster_driver_reads_a_kubernetes_secret(job_connections, monkeypatch, caplog, capsys):
    use_spark(monkeypatch, "k8s://https://127.0.0.1:6443", "cluster", **{"pg-dsn-secret": "coldharbor-pg:dsn"})
    caplog.set_level("DEBUG")
    with built_submit() as (command, env, conf):
        run_folder = Path(command[command.index("--py-files") + 1]).parent
        assert sorted(p.name for p in run_folder.iterdir()) == ["coldharbor.zip"]  # no DSN file is written
        with zipfile.ZipFile(run_folder / "coldharbor.zip") as shipped:
            names = shipped.namelist()
        assert "coldharbor/export/export_job.py" in names and "coldharbor/runtime/job_main.py" in names
        assert [n for n in names if n.startswith("coldharbor/embedded/")] == []  # the embedded service stays here
    settings = confs(command)
    assert settings["spark.kubernetes.driver.secretKeyRef.COLDHARBOR_PG_DSN"] == "coldharbor-pg:dsn"  # a name
    assert not any(DSN_FILE_ENV in key for key in settings)
    assert_no_password(command, env, conf, caplog.text + capsys.readouterr().out)


@pytest.mark.parametrize("master, deploy_mode, extra, message", [
    ("k8s://https://127.0.0.1:6443", "cluster", {}, "reads the PostgreSQL DSN from a Kubernetes secret"),
    ("k8s://https://127.0.0.1:6443", "cluster", {"pg-dsn-secret": "Bad_Name"}, "must be <secret name>:<key>"),
    ("standalone", "cluster", {}, "deploy mode 'cluster' on the standalone master"),
    ("mesos://127.0.0.1:5050", "client", {}, "is not one Coldharbor submits to"),
])
def test_a_master_the_dsn_cannot_reach_safely_is_refused(job_connections, standalone_master, monkeypatch, tmp_path,
                                                         master, deploy_mode, extra, message):
    from airflow.sdk.exceptions import AirflowException

    use_spark(monkeypatch, standalone_master if master == "standalone" else master, deploy_mode, **extra)
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))  # where the run's folder would be
    with pytest.raises(AirflowException, match=message) as refused:
        with built_submit():
            pytest.fail("nothing may be submitted")
    assert "nothing was submitted" in str(refused.value) and PASSWORD not in str(refused.value)
    assert list(tmp_path.glob("coldharbor-run-*")) == []


def test_a_password_put_into_the_spark_settings_by_hand_is_refused(job_connections, monkeypatch):
    from airflow.sdk.exceptions import AirflowException

    use_spark(monkeypatch, "yarn", "client", conf={"spark.yarn.appMasterEnv.PGPASSWORD": PASSWORD})
    with pytest.raises(AirflowException, match="the PostgreSQL password appears in the job's Spark settings"):
        with built_submit():
            pytest.fail("nothing may be submitted")


def test_the_connections_libpq_settings_reach_the_dsn_and_others_are_refused(job_connections, monkeypatch):
    from airflow.sdk.exceptions import AirflowException
    from coldharbor_airflow.hooks import ColdharborHook
    from psycopg.conninfo import conninfo_to_dict

    monkeypatch.setenv("AIRFLOW_CONN_COLDHARBOR_PG", json.dumps({
        "conn_type": "postgres", "host": "db", "login": "u", "password": "p", "schema": "shop",
        "extra": {"sslmode": "verify-ca", "sslrootcert": "/etc/ssl/db-root.crt", "options": "-c search_path=shop",
                  "application_name": "etl", "connect_timeout": 5, "cursor": "dictcursor"}}))
    params = conninfo_to_dict(ColdharborHook().dsn())
    assert {k: params[k] for k in ("sslmode", "sslrootcert", "options", "application_name", "connect_timeout")} == {
        "sslmode": "verify-ca", "sslrootcert": "/etc/ssl/db-root.crt", "options": "-c search_path=shop",
        "application_name": "etl", "connect_timeout": "5"}
    assert "cursor" not in params  # an Airflow setting, not libpq's
    monkeypatch.setenv("AIRFLOW_CONN_COLDHARBOR_PG", json.dumps({
        "conn_type": "postgres", "host": "db", "login": "u", "schema": "shop", "extra": {"sslkey": "/k.pem"}}))
    with pytest.raises(AirflowException, match="the extra 'sslkey' of connection 'coldharbor_pg' is not supported"):
        ColdharborHook().dsn()

"""The Spark Connect server's command line and where it may listen (no server is started here)."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest
from coldharbor.embedded import service
from coldharbor.runtime import engine, settings, spark
from coldharbor.runtime.errors import ConfigError


def confs(argv: list[str]) -> dict[str, str]:
    return dict(argv[i + 1].split("=", 1) for i, arg in enumerate(argv) if arg == "--conf")


def test_the_server_gets_the_jobs_packages_and_settings_and_listens_on_its_port_only():
    argv = engine.server_command(engine.EngineConfig(port=15123, master="local[1]"))
    assert argv[argv.index("--class") + 1] == spark.CONNECT_SERVER_CLASS
    assert argv[argv.index("--packages") + 1] == ",".join(spark.maven_packages())
    assert argv[argv.index("--master") + 1] == "local[1]" and argv[-1] == "spark-internal"
    conf = confs(argv)
    for key, value in spark.DEFAULT_CONF.items():
        if key != "spark.driver.extraJavaOptions":
            assert conf[key] == value, key
    driver = conf["spark.driver.extraJavaOptions"].split()
    assert spark.DEFAULT_CONF["spark.driver.extraJavaOptions"] in driver
    assert f"-Dlog4j2.configurationFile=file:{engine.LOG_CONFIG}" in driver and engine.LOG_CONFIG.is_file()
    assert conf["spark.jars.ivy"] == spark.ivy_dir()
    assert (conf["spark.connect.grpc.binding.address"], conf["spark.connect.grpc.binding.port"]) == ("127.0.0.1",
                                                                                                      "15123")
    assert conf["spark.connect.grpc.port.maxRetries"] == "0", "a taken port must fail, not move the server"


def test_extra_settings_reach_the_server_but_never_move_its_address():
    argv = engine.server_command(engine.EngineConfig(
        port=15002, master="spark://spark-master:7077", bind="127.0.0.1",
        conf={"spark.hadoop.fs.s3a.endpoint": "http://minio:9000", "spark.connect.grpc.port.maxRetries": "5",
              "spark.connect.grpc.binding.address": "0.0.0.0", "spark.connect.grpc.binding.port": "1"}))
    conf = confs(argv)
    assert conf["spark.hadoop.fs.s3a.endpoint"] == "http://minio:9000"
    assert conf["spark.connect.grpc.port.maxRetries"] == "0"
    assert (conf["spark.connect.grpc.binding.address"], conf["spark.connect.grpc.binding.port"]) == ("127.0.0.1", "15002")
    assert sum(a.startswith("spark.connect.grpc.binding.address=") for a in argv) == 1


@pytest.mark.parametrize("address", ["127.0.0.1", "localhost", "::1", "127.0.0.2"])
def test_loopback_is_allowed_without_asking(address):
    engine.check_bind(address, private_network=False)


@pytest.mark.parametrize("address", ["10.1.2.3", "172.20.0.5", "192.168.1.10", "fd00::5"])
def test_a_private_address_needs_the_private_network_flag(address):
    with pytest.raises(ConfigError, match="not a loopback address"):
        engine.check_bind(address, private_network=False)
    engine.check_bind(address, private_network=True)


@pytest.mark.parametrize("address", ["0.0.0.0", "::", "8.8.8.8", "172.32.0.1", "100.64.0.1", "2001:db8::1"])
def test_a_wildcard_or_public_address_is_refused_even_on_a_private_network(address):
    with pytest.raises(ConfigError, match="not a loopback or private address"):
        engine.check_bind(address, private_network=True)


@pytest.mark.parametrize("args, message", [
    (["serve", "--bind", "0.0.0.0"], "is not a loopback address"),
    (["supervise", "DRIVER_MEMORY=2 GB"], "COLDHARBOR_DRIVER_MEMORY='2 GB' is not a JVM memory size"),
    (["serve", "DRIVER_MEMORY=2"], "COLDHARBOR_DRIVER_MEMORY='2' is not a JVM memory size"),
    (["supervise", "SHUFFLE_PARTITIONS=four"], "COLDHARBOR_SHUFFLE_PARTITIONS='four' is not a number of tasks"),
    (["serve", "LISTING_PARALLELISM=0"], "COLDHARBOR_LISTING_PARALLELISM must be a whole number from 1 to 100000"),
    (["supervise", "--bind", "0.0.0.0", "--private-network"], "not a loopback or private address"),
    (["serve", "--port", "70000"], "is not a TCP port"),
    (["serve", "--conf", "fs.s3a.endpoint"], "expected spark.<name>=<value>"),
    (["serve", "--bind", "no-such-host.invalid", "--private-network"], "cannot resolve it"),
])
def test_bad_arguments_are_one_line_and_exit_2_before_anything_starts(args, message, tmp_path):
    """An argument, or a setting (NAME=value: COLDHARBOR_NAME in the environment) the server's JVM
    would not start with, which `supervise` would start again and again."""
    settings_ = dict(a.split("=", 1) for a in args if "=" in a and not a.startswith("-"))
    args = [a for a in args if not ("=" in a and not a.startswith("-"))]
    done = subprocess.run([sys.executable, "-m", "coldharbor.runtime.engine", *args,
                           "--state-file", str(tmp_path / "state.json")],
                          capture_output=True, text=True, timeout=120,
                          env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(settings.PROJECT_DIR / "jobs"),
                               **{f"COLDHARBOR_{k}": v for k, v in settings_.items()}})
    assert done.returncode == 2, done.stderr
    assert message in done.stderr and "Traceback" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert not (tmp_path / "state.json").exists()


@pytest.mark.parametrize("raw", ["15002x", "²", "٣", "1.5", " 15002", "0", "70000"])
def test_a_bad_port_setting_is_named(raw):
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(engine.PORT_ENV, raw)
        with pytest.raises(ConfigError, match=re.escape(f"COLDHARBOR_SPARK_CONNECT_PORT={raw!r} is not a TCP port")):
            engine.configured_port()


def test_the_server_never_inherits_a_postgres_credential(monkeypatch):
    for name in (*service.SETUP_ONLY, settings.PG_DSN_ENV, settings.PG_DSN_FILE_ENV):
        monkeypatch.setenv(name, "postgresql://postgres:superuser-secret@127.0.0.1:5432/postgres")
    monkeypatch.setenv("AIRFLOW_CONN_COLDHARBOR_PG", '{"password": "superuser-secret"}')
    env = service.engine_env()
    assert "superuser-secret" not in repr(env)
    assert env["SPARK_LOCAL_IP"] == "127.0.0.1"


def test_airflow_of_the_embedded_stack_runs_the_jobs_through_the_connect_server(monkeypatch):
    monkeypatch.setenv(engine.PORT_ENV, "15444")
    env = service.airflow_env("postgresql://coldharbor_pipeline:pipeline-secret@127.0.0.1:54329/postgres")
    connection = json.loads(env["AIRFLOW_CONN_COLDHARBOR_SPARK_CONNECT"])
    assert connection == {"conn_type": "spark_connect", "host": "127.0.0.1", "port": 15444}
    assert env["AIRFLOW_VAR_COLDHARBOR_SPARK_CONN_ID"] == "coldharbor_spark_connect"


def test_the_embedded_airflows_tasks_report_to_the_api_server_on_its_own_port():
    """COLDHARBOR_AIRFLOW_PORT moves the API server; the tasks' execution API must move with it
    (Airflow's default names port 8080, and every task failed to start on another port)."""
    env = service.airflow_env("postgresql://coldharbor_pipeline:pipeline-secret@127.0.0.1:54329/postgres")
    assert env["AIRFLOW__API__PORT"] == str(service.API_PORT)
    assert env["AIRFLOW__CORE__EXECUTION_API_SERVER_URL"] == f"http://127.0.0.1:{service.API_PORT}/execution/"

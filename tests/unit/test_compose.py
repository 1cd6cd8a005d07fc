"""docker-compose.yaml and the Dockerfile, checked with what runs here (no Docker engine): the
compose client's own validation, and the stack agreeing with the pins the tests run against."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from itertools import pairwise
from pathlib import Path

import pytest
import yaml

PROJECT = Path(__file__).resolve().parents[2]
COMPOSE = PROJECT / "docker-compose.yaml"
AIRFLOW_SERVICES = ("airflow-init", "airflow-apiserver", "airflow-scheduler", "airflow-dag-processor",
                    "airflow-triggerer")


@pytest.fixture(scope="module")
def stack() -> dict:
    return yaml.safe_load(COMPOSE.read_text())


def compose_client() -> list[str] | None:
    if shutil.which("docker") and subprocess.run(["docker", "compose", "version"], capture_output=True).returncode == 0:
        return ["docker", "compose"]
    if shutil.which("docker-compose"):
        return ["docker-compose"]
    return None


def required_compose_client() -> list[str]:
    client = compose_client()
    if client is None:
        why = "no docker compose client: `make compose-client` installs Debian's docker-compose"
        if os.environ.get("CI"):  # CI installs it (`make test`): a skip there would prove nothing
            pytest.fail(why)
        pytest.skip(why)
    return client


def resolved_stack() -> dict:
    """The compose client's resolved configuration (anchors merged, variables substituted)."""
    client = required_compose_client()
    done = subprocess.run([*client, "-f", str(COMPOSE), "config"], capture_output=True, text=True, cwd=PROJECT,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    return yaml.safe_load(done.stdout)


def test_the_compose_client_accepts_the_file():
    client = required_compose_client()
    done = subprocess.run([*client, "-f", str(COMPOSE), "config", "--quiet"], capture_output=True, text=True,
                          cwd=PROJECT, timeout=120)
    assert done.returncode == 0, done.stderr


def commit_timestamps_on(command: list[str]) -> bool:
    """Whether a postgres command line turns track_commit_timestamp on (`-c name=on` or `--name=on`)."""
    args = [str(a) for a in command]
    settings = [b for a, b in pairwise(args) if a == "-c"] + [a[2:] for a in args if a.startswith("--")]
    return "track_commit_timestamp=on" in settings


def test_the_hot_tier_tracks_commit_timestamps(stack):
    """As-of reports place each change at its commit; without the setting serve_report refuses
    them. Checked in the file and in the compose client's resolved configuration."""
    postgres = stack["services"]["postgres"]
    assert postgres["command"][0] == "postgres" and commit_timestamps_on(postgres["command"])
    assert commit_timestamps_on(resolved_stack()["services"]["postgres"]["command"])


def test_the_stack_has_every_service_the_design_names(stack):
    services = stack["services"]
    for name in ("postgres", "minio", "minio-init", "spark-master", "spark-worker", "spark-connect", "workload",
                 *AIRFLOW_SERVICES):
        assert name in services, name
    # The bucket exists before anything writes the lake; the Airflow services start after init.
    assert services["airflow-init"]["depends_on"]["minio-init"] == {"condition": "service_completed_successfully"}
    assert "mc mb --ignore-existing lake/coldharbor-lake" in services["minio-init"]["command"][0]
    for name in AIRFLOW_SERVICES[1:]:
        assert services[name]["depends_on"]["airflow-init"] == {"condition": "service_completed_successfully"}
    # One image everywhere: drivers (in the scheduler) and executors (on the worker) share Python and Spark.
    for name in ("spark-master", "spark-worker", "spark-connect", "workload", *AIRFLOW_SERVICES):
        assert services[name]["image"] == "coldharbor:local", name


def test_airflow_runs_the_dags_on_the_cluster_with_the_lake_on_s3a(stack):
    env = stack["services"]["airflow-scheduler"]["environment"]
    assert env["AIRFLOW_VAR_COLDHARBOR_LAKE_ROOT"].startswith("s3a://coldharbor-lake/")
    spark = json.loads(env["AIRFLOW_CONN_SPARK_DEFAULT"])
    assert spark["host"] == "spark://spark-master:7077"
    conf = spark["extra"]["conf"]
    assert conf["spark.hadoop.fs.s3a.endpoint"] == "http://minio:9000"
    assert conf["spark.hadoop.fs.s3a.path.style.access"] == "true"
    assert conf["spark.driver.host"] == stack["services"]["airflow-scheduler"]["hostname"]
    assert not any("secret" in key.lower() or "access.key" in key.lower() for key in conf), \
        "S3 credentials belong in the environment, never on spark-submit's command line"
    pg = json.loads(env["AIRFLOW_CONN_COLDHARBOR_PG"])
    assert (pg["host"], pg["schema"]) == ("postgres", "app")
    worker_env = stack["services"]["spark-worker"]["environment"]
    assert worker_env["AWS_ACCESS_KEY_ID"] == env["AWS_ACCESS_KEY_ID"]


def test_the_superuser_password_reaches_set_up_only(stack):
    """The jobs log in as coldharbor_pipeline; the superuser's password is in PostgreSQL's own service
    and in airflow-init (which migrates), nowhere an Airflow worker, a job or the workload can read it."""
    services = stack["services"]
    for name, service in services.items():
        env = service.get("environment") or {}
        holds = any("COLDHARBOR_PG_PASSWORD" in str(value) for value in env.values())
        assert holds == (name in ("postgres", "airflow-init")), name
        assert ("COLDHARBOR_ADMIN_PG_DSN" in env) == (name == "airflow-init"), name
    pg = json.loads(services["airflow-scheduler"]["environment"]["AIRFLOW_CONN_COLDHARBOR_PG"])
    assert pg["login"] == "coldharbor_pipeline" and "COLDHARBOR_PIPELINE_PASSWORD" in pg["password"]
    assert services["workload"]["environment"]["COLDHARBOR_PG_DSN"].startswith("postgresql://coldharbor_demo:")
    init = services["airflow-init"]["command"][0]
    assert "python -m coldharbor.capture.migrate" in init and "python -m coldharbor.embedded.stack demo" in init


def test_hadoop_aws_matches_the_hadoop_client_pyspark_ships(stack):
    """hadoop-aws must be the exact version of PySpark's hadoop-client jars, or s3a fails at run time."""
    import pyspark

    jars = Path(pyspark.__file__).parent / "jars"
    [client] = [p.name for p in jars.glob("hadoop-client-api-*.jar")]
    hadoop = re.fullmatch(r"hadoop-client-api-(.+)\.jar", client).group(1)
    env = stack["services"]["airflow-scheduler"]["environment"]
    assert env["COLDHARBOR_EXTRA_PACKAGES"] == f"org.apache.hadoop:hadoop-aws:{hadoop}"


def test_the_image_runs_the_pinned_airflow_and_python():
    requirements = (PROJECT / "requirements.txt").read_text()
    airflow = re.search(r"^apache-airflow==(\S+)$", requirements, re.M).group(1)
    base = re.search(r"^FROM (\S+)$", (PROJECT / "Dockerfile").read_text(), re.M).group(1)
    assert base.startswith(f"apache/airflow:{airflow}-python3.")
    for folder in ("dags", "jobs", "plugins", "sql"):
        assert f"COPY --chown=airflow:root {folder} /opt/coldharbor/{folder}" in (PROJECT / "Dockerfile").read_text()


def engine_args(service: dict) -> tuple[dict[str, str], dict[str, str]]:
    """(options, Spark settings) of the spark-connect service's `coldharbor.runtime.engine serve` command."""
    command = [str(arg) for arg in service["command"]]
    assert command[0] == "serve"
    conf = dict(command[i + 1].split("=", 1) for i, arg in enumerate(command) if arg == "--conf")
    options = {arg: command[i + 1] for i, arg in enumerate(command)
               if arg.startswith("--") and arg not in ("--conf", "--private-network")}
    return options, conf


def test_the_warm_engine_runs_on_the_cluster_and_listens_on_the_compose_network_only():
    """spark-connect's driver uses the standalone master (executors on the workers, as many as they
    hold), listens on its own name with no published port, holds no PostgreSQL credential, and the
    Airflow services run every job through it."""
    services = resolved_stack()["services"]
    engine = services["spark-connect"]
    assert engine["entrypoint"] == ["python", "-m", "coldharbor.runtime.engine"]
    options, conf = engine_args(engine)
    assert options["--master"] == "spark://spark-master:7077"
    assert options["--bind"] == engine["hostname"] == "spark-connect"
    assert "--private-network" in engine["command"]
    assert "ports" not in engine, "Spark Connect has no authentication: its port is never published"
    assert "spark.cores.max" not in conf and conf["spark.dynamicAllocation.enabled"] == "true"
    assert conf["spark.driver.host"] == "spark-connect"
    assert engine["restart"] == "unless-stopped"
    assert engine["depends_on"]["spark-master"] == {"condition": "service_healthy"}
    assert engine["depends_on"]["airflow-init"] == {"condition": "service_completed_successfully"}
    env = engine["environment"]
    assert not any("PG" in key or "AIRFLOW" in key for key in env), sorted(env)
    scheduler = services["airflow-scheduler"]["environment"]
    assert env["COLDHARBOR_EXTRA_PACKAGES"] == scheduler["COLDHARBOR_EXTRA_PACKAGES"]
    assert env["COLDHARBOR_IVY_DIR"] == scheduler["COLDHARBOR_IVY_DIR"]
    assert env["AWS_ACCESS_KEY_ID"] == scheduler["AWS_ACCESS_KEY_ID"]
    s3a = {k: v for k, v in json.loads(scheduler["AIRFLOW_CONN_SPARK_DEFAULT"])["extra"]["conf"].items()
           if k.startswith("spark.hadoop.fs.s3a.")}
    assert s3a and {k: conf.get(k) for k in s3a} == s3a, "the engine reaches the lake as spark-submit jobs do"

    connection = json.loads(scheduler["AIRFLOW_CONN_COLDHARBOR_SPARK_CONNECT"])
    assert (connection["conn_type"], connection["host"], str(connection["port"])) == (
        "spark_connect", "spark-connect", options["--port"])
    for name in AIRFLOW_SERVICES:
        assert services[name]["environment"]["AIRFLOW_VAR_COLDHARBOR_SPARK_CONN_ID"] == "coldharbor_spark_connect"

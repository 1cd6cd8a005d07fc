"""Airflow for the DAG tests: a migrated metadata database in a temporary AIRFLOW_HOME, the
project's dags/ and plugins/, and the connections the DAGs use pointing at the test PostgreSQL."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

PROJECT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def airflow_home(tmp_path_factory, pg_dsn):
    home = tmp_path_factory.mktemp("airflow")
    from psycopg.conninfo import conninfo_to_dict

    pg = conninfo_to_dict(pg_dsn)
    env = {
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__DAGS_FOLDER": str(PROJECT / "dags"),
        "AIRFLOW__CORE__PLUGINS_FOLDER": str(PROJECT / "plugins"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__UNIT_TEST_MODE": "False",
        "AIRFLOW_CONN_COLDHARBOR_PG": json.dumps({
            "conn_type": "postgres", "host": pg.get("host"), "port": int(pg.get("port", 5432)),
            "login": pg.get("user"), "password": pg.get("password"), "schema": pg.get("dbname")}),
        "AIRFLOW_CONN_SPARK_DEFAULT": json.dumps({"conn_type": "spark", "host": "local[1]",
                                                  "extra": {"deploy-mode": "client"}}),
    }
    os.environ.update(env)
    for folder in (PROJECT / "plugins", PROJECT / "dags"):
        if str(folder) not in sys.path:
            sys.path.insert(0, str(folder))
    bin_dir = Path(sys.executable).parent
    subprocess.run([str(bin_dir / "airflow"), "db", "migrate"], check=True, capture_output=True,
                   env={**os.environ}, timeout=600)
    subprocess.run([str(bin_dir / "airflow"), "pools", "set", "coldharbor_spark", "1", "Coldharbor Spark jobs"],
                   check=True, capture_output=True, env={**os.environ}, timeout=300)
    return home

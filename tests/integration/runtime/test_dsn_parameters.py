"""A DSN's connection parameters reach psycopg and Spark's JDBC driver alike, against the real
PostgreSQL; and the JDBC password, passed as an option, shows in no Spark plan or UI page."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid

import pytest
from coldharbor.runtime import pg
from coldharbor.runtime.errors import PostgresUnavailableError
from psycopg.conninfo import conninfo_to_dict, make_conninfo

WHO_AND_WHERE = ("SELECT application_name, current_setting('search_path') AS search_path, "
                 "(SELECT v FROM probe) AS probe FROM pg_stat_activity WHERE pid = pg_backend_pid()")


def jdbc_read(spark, dsn: str, query: str):
    return (spark.read.format("jdbc").options(**pg.JdbcTarget.from_dsn(dsn).options())
            .option("query", query).load())


def test_application_name_and_options_reach_psycopg_and_a_spark_jdbc_read(spark, admin_dsn, pg_conn):
    schema = f"ch_{uuid.uuid4().hex[:8]}"
    pg_conn.execute(f"CREATE SCHEMA {schema}")
    pg_conn.execute(f"CREATE TABLE {schema}.probe (v text)")  # found unqualified only through search_path
    pg_conn.execute(f"INSERT INTO {schema}.probe VALUES ('from {schema}')")
    name = f"coldharbor-{schema}"
    # The admin's login: the jobs' role has no USAGE on a schema made here (the parameters are the point).
    dsn = make_conninfo(admin_dsn, application_name=name, options=f"-c search_path={schema},public")

    with pg.connect(dsn) as conn:
        through_psycopg = conn.execute(WHO_AND_WHERE).fetchone()
    through_jdbc = tuple(jdbc_read(spark, dsn, WHO_AND_WHERE).collect()[0])

    expected = (name, f"{schema},public", f"from {schema}")
    assert through_psycopg == expected
    assert through_jdbc == expected


def test_without_an_application_name_both_sides_say_coldharbor(spark, pg_dsn):
    assert "application_name" not in conninfo_to_dict(pg_dsn)
    query = "SELECT application_name FROM pg_stat_activity WHERE pid = pg_backend_pid()"
    with pg.connect(pg_dsn) as conn:
        assert conn.execute(query).fetchone()[0] == "coldharbor"
    assert jdbc_read(spark, pg_dsn, query).collect()[0][0] == "coldharbor"


def test_sslmode_reaches_psycopg_and_the_jdbc_driver(spark, pg_dsn, pg_conn):
    """The test server speaks no TLS: sslmode=require must make both sides refuse to connect."""
    assert pg_conn.execute("SHOW ssl").fetchone()[0] == "off"
    dsn = make_conninfo(pg_dsn, sslmode="require")
    with pytest.raises(PostgresUnavailableError, match="(?i)ssl"):
        pg.connect(dsn)
    with pytest.raises(Exception, match="Couldn't connect to the database") as refused:
        jdbc_read(spark, dsn, "SELECT 1").collect()
    causes, error = [], refused.value
    while error is not None:  # Spark's message, then the JDBC driver's own reason
        causes.append(str(error))
        error = getattr(error, "_cause", None)
    assert "The server does not support SSL" in " | ".join(causes)
    assert conninfo_to_dict(pg_dsn)["password"] not in " | ".join(causes)
    assert jdbc_read(spark, make_conninfo(pg_dsn, sslmode="disable"), "SELECT 1 AS one").collect()[0][0] == 1


# Run as its own process: the test session keeps Spark's UI off.
UI_SCRIPT = """
import json, sys, urllib.request
sys.path.insert(0, sys.argv[3])
from pyspark.sql import SparkSession
from coldharbor.runtime import pg
from coldharbor.runtime.spark import maven_packages, ivy_dir
spark = (SparkSession.builder.master("local[1]").config("spark.ui.enabled", "true").config("spark.ui.port", sys.argv[2])
         .config("spark.jars.packages", ",".join(maven_packages())).config("spark.jars.ivy", ivy_dir()).getOrCreate())
options = pg.JdbcTarget.from_dsn(sys.argv[1]).options()
rows = spark.read.format("jdbc").options(**options).option("query", "SELECT 1 AS one").load()
rows.explain("extended")
rows.write.format("jdbc").options(**options).option("dbtable", "public.ch_redaction_probe").mode("overwrite").save()
base = f"http://127.0.0.1:{sys.argv[2]}/api/v1/applications"
app = json.load(urllib.request.urlopen(base))[0]["id"]
pages = {path: urllib.request.urlopen(f"{base}/{app}/{path}").read().decode()
         for path in ("sql?details=true&planDescription=true", "environment", "jobs", "stages?details=true")}
print("PAGES " + json.dumps(pages))
spark.stop()
"""


def test_the_jdbc_password_is_redacted_in_sparks_plans_and_ui(admin_dsn, tmp_path):
    from tests.helpers import PROJECT

    script = tmp_path / "ui_probe.py"
    script.write_text(UI_SCRIPT)
    with __import__("socket").socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    # The admin's login: the probe writes a table in public, which the jobs' role may not.
    out = subprocess.run([sys.executable, str(script), admin_dsn, str(port), str(PROJECT / "jobs")],
                         capture_output=True, text=True, timeout=600, env={**os.environ, "SPARK_LOCAL_IP": "127.0.0.1"})
    assert out.returncode == 0, out.stderr[-3000:]
    pages = json.loads(out.stdout.split("PAGES ", 1)[1].splitlines()[0])
    sql = pages["sql?details=true&planDescription=true"]
    password = conninfo_to_dict(admin_dsn)["password"]
    assert "SaveIntoDataSourceCommand" in sql and "redacted" in sql  # the write's options are shown, redacted
    assert password not in out.stdout.split("PAGES ", 1)[0]          # the explained plan
    assert {name: password in text for name, text in pages.items()} == dict.fromkeys(pages, False)

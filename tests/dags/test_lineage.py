"""OpenLineage (issue 25, part 4): each job's task names the datasets it read and wrote, PostgreSQL
table -> Delta table -> report table, with schema facets, as Airflow's OpenLineage provider emits
them to a configured transport (here a local file, written by a real `airflow dags test` run)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from psycopg.conninfo import conninfo_to_dict

from tests.dags.test_connect_jobs import CONNECT_CONN
from tests.dags.test_report_dags import use_reports
from tests.helpers import PROJECT, export

HOSTILE = 'Mixed"q\'s'  # a column name with quotes of both kinds and capitals


def names(datasets) -> list[tuple[str, str]]:
    return [(d.namespace, d.name) for d in datasets]


def fields(dataset) -> list[tuple[str, str]]:
    return [(f.name, f.type) for f in dataset.facets["schema"].fields]


def registered_with_report(pg_conn, table_name: str, tmp_path, monkeypatch, sink: str) -> str:
    """A registered table and a report file over it (and its change feed); the report's name."""
    pg_conn.execute(f'CREATE TABLE {table_name} (id bigint PRIMARY KEY, "{HOSTILE.replace(chr(34), chr(34) * 2)}" '
                    "numeric(12,2), at timestamptz)")
    pg_conn.execute(f"INSERT INTO {table_name} VALUES (1, 2.50, now())")
    pg_conn.execute("SELECT coldharbor.register_table(%s)", (table_name,))
    reports = tmp_path / "reports"
    reports.mkdir(exist_ok=True)
    name = f"l_{table_name}"
    (reports / f"{name}.sql").write_text(
        f"-- target: reports.{name}\n-- sink: {sink}\n"
        f"SELECT t.id, count(c.id) AS changes FROM {table_name} t "
        f"LEFT JOIN changes({table_name}, 0, 'now') c ON c.id = t.id GROUP BY t.id\n")
    use_reports(monkeypatch, reports)
    return name


def test_each_job_names_what_it_read_and_wrote(airflow_home, pg_dsn, pg_conn, table_name, tmp_path, monkeypatch):
    from coldharbor_airflow.operators import ColdharborSparkJobOperator

    lake_root = str(tmp_path / "lake")
    monkeypatch.setenv("COLDHARBOR_LAKE_ROOT", lake_root)
    name = registered_with_report(pg_conn, table_name, tmp_path, monkeypatch, "postgres")
    pg = conninfo_to_dict(pg_dsn)
    postgres = (f"postgres://{pg['host']}:{pg['port']}", f"{pg['dbname']}.public.{table_name}")
    lake = ("file", f"{lake_root}/public/{table_name}")

    def lineage(job: str, *args: str):
        return ColdharborSparkJobOperator(task_id=f"t_{job.removesuffix('.py')}", job=job,
                                          job_args=list(args)).get_openlineage_facets_on_complete(None)

    exported = lineage("cdc_export.py", "--table", f"public.{table_name}")
    assert names(exported.inputs) == [postgres] and names(exported.outputs) == [lake]
    assert fields(exported.inputs[0]) == [("id", "bigint"), (HOSTILE, "numeric(12,2)"),
                                          ("at", "timestamp with time zone")]
    assert fields(exported.outputs[0]) == [("id", "long"), (HOSTILE, "decimal(12,2)"), ("at", "timestamp")]  # as Delta names them
    # Every registered table, when the task exports every dirty one: one without a lake folder of its
    # own name (the export refuses it) is left out, not the reason for no lineage at all.
    pg_conn.execute(f'CREATE TABLE "{table_name}☃" (id int PRIMARY KEY)')
    pg_conn.execute("SELECT coldharbor.register_table(%s)", (f'"{table_name}☃"',))
    every = lineage("cdc_export.py")
    assert (postgres, lake) in zip(names(every.inputs), names(every.outputs))
    assert not [n for n in names(every.inputs) + names(every.outputs) if "☃" in n[1]]

    compacted = lineage("compact.py", "--table", table_name)
    assert names(compacted.inputs) == names(compacted.outputs) == [lake]
    purged = lineage("purge.py", "--table", table_name, "--where", "id = 1")
    assert names(purged.inputs) == names(purged.outputs) == [postgres, lake]
    verified = lineage("verify.py", "--table", table_name)
    assert names(verified.inputs) == [postgres, lake] and verified.outputs == []

    served = lineage("serve_report.py", "--report", name, "--as-of", "now")
    assert names(served.inputs) == [postgres, lake]
    assert names(served.outputs) == [(postgres[0], f"{pg['dbname']}.reports.{name}")]
    assert names(lineage("serve_report.py", "--report", name, "--sink", "delta").outputs) == \
        [("file", f"{lake_root}/reports/{name}")]
    feed = lineage("changes.py", "--table", table_name, "--from", "0", "--target", "changes_l")
    assert names(feed.inputs) == [postgres, lake] and names(feed.outputs) == [(postgres[0], f"{pg['dbname']}.reports.changes_l")]
    # A report that would be refused, or a registry that cannot be read, names nothing and fails nothing.
    assert lineage("serve_report.py", "--report", "no_such_report").inputs == []
    monkeypatch.setenv("AIRFLOW_CONN_COLDHARBOR_PG", json.dumps({"conn_type": "postgres", "host": "127.0.0.1",
                                                                 "port": 1, "login": "x", "schema": "x"}))
    assert lineage("cdc_export.py").inputs == []


def test_a_report_dag_run_emits_its_lineage_to_the_configured_transport(
        airflow_home, spark, connect_url, pg_dsn, pg_conn, table_name, tmp_path, monkeypatch):
    lake_root = str(tmp_path / "lake")
    name = registered_with_report(pg_conn, table_name, tmp_path, monkeypatch, "delta")
    export(spark, pg_dsn, table_name, lake_root)
    events = tmp_path / "lineage.jsonl"
    host, port = connect_url.removeprefix("sc://").rsplit(":", 1)
    env = {**os.environ, "COLDHARBOR_LAKE_ROOT": lake_root,
           "PYTHONPATH": os.pathsep.join([str(PROJECT / "plugins"), str(PROJECT / "jobs")]),
           "AIRFLOW__OPENLINEAGE__TRANSPORT": json.dumps({"type": "file", "log_file_path": str(events),
                                                          "append": True}),
           "AIRFLOW__OPENLINEAGE__NAMESPACE": "coldharbor-test",
           # A forked emitter never finished here after a job on Spark Connect (its gRPC threads, likely).
           "AIRFLOW__OPENLINEAGE__EXECUTE_IN_THREAD": "True",
           f"AIRFLOW_CONN_{CONNECT_CONN.upper()}": json.dumps({"conn_type": "spark_connect", "host": host,
                                                              "port": int(port)}),
           "AIRFLOW_VAR_COLDHARBOR_SPARK_CONN_ID": CONNECT_CONN}
    done = subprocess.run([str(Path(sys.executable).parent / "airflow"), "dags", "test", f"coldharbor_report_{name}"],
                          env=env, capture_output=True, text=True, timeout=600, check=False)
    (tmp_path / "dags-test.log").write_text(done.stdout + done.stderr)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    emitted = [json.loads(line) for line in events.read_text().splitlines() if line.strip()]
    completed = [e for e in emitted if e["eventType"] == "COMPLETE" and e["job"]["name"].endswith(".serve")]
    assert len(completed) == 1, (emitted, f"see {tmp_path / 'dags-test.log'}")
    [complete] = completed
    assert complete["job"]["namespace"] == "coldharbor-test"
    pg = conninfo_to_dict(pg_dsn)
    assert [(d["namespace"], d["name"]) for d in complete["inputs"]] == [
        (f"postgres://{pg['host']}:{pg['port']}", f"{pg['dbname']}.public.{table_name}"),
        ("file", f"{lake_root}/public/{table_name}")]
    assert [(d["namespace"], d["name"]) for d in complete["outputs"]] == [("file", f"{lake_root}/reports/{name}")]
    assert [f["name"] for f in complete["inputs"][0]["facets"]["schema"]["fields"]] == ["id", HOSTILE, "at"]



@pytest.mark.parametrize(("dsn", "namespace"), [
    ("host=db1,db2 port=5433,5434 dbname=app user=u", "postgres://db1:5433"),      # failover: the first server
    ("host=::1 port=5432 dbname=app", "postgres://[::1]:5432"),                      # IPv6, bracketed as in a URL
    ("postgresql://u@[2001:db8::7]:6000/app", "postgres://[2001:db8::7]:6000"),
    ("host=/var/run/postgresql dbname=app", "postgres://localhost:5432"),            # a socket folder: this machine
    ("hostaddr=10.0.0.5 dbname=app", "postgres://10.0.0.5:5432"),
])
def test_a_postgres_namespace_names_one_server_as_a_url_does(airflow_home, dsn, namespace):
    """Found by the cold attack of issue 25: a failover list, an IPv6 address or a socket folder made
    namespaces like postgres://db1,db2:5433,5434 or postgres://::1:5432 that no lineage server joins."""
    from coldharbor_airflow.lineage import postgres_dataset

    dataset = postgres_dataset(dsn, "public", "t")
    assert (dataset.namespace, dataset.name) == (namespace, "app.public.t")

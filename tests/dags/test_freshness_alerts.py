"""Freshness promises (issue 25, part 3): `register_table(..., p_freshness => ...)`, the coldharbor_cdc
DAG's check_freshness task failing (the alert, with its callback) once an export held by another
run's lock lets a table fall behind its promise, and the health page showing it red."""

from __future__ import annotations

import re
import time
from datetime import timedelta

import psycopg
import pytest
from coldharbor.runtime import pg

from tests.helpers import PROJECT, export


def promise(conn: psycopg.Connection, name: str) -> timedelta:
    return conn.execute("SELECT freshness FROM coldharbor.tables WHERE relid = %s::regclass", (name,)).fetchone()[0]


def test_a_table_promises_five_minutes_unless_asked_and_keeps_its_promise_when_registered_again(pg_conn, table_name):
    pg_conn.execute(f"CREATE TABLE {table_name} (id int PRIMARY KEY)")
    pg_conn.execute("SELECT coldharbor.register_table(%s)", (table_name,))
    assert promise(pg_conn, table_name) == timedelta(minutes=5)
    pg_conn.execute("SELECT coldharbor.register_table(%s, p_freshness => '90 seconds')", (table_name,))
    assert promise(pg_conn, table_name) == timedelta(seconds=90)
    pg_conn.execute("SELECT coldharbor.register_table(%s, p_history => 'latest')", (table_name,))
    assert promise(pg_conn, table_name) == timedelta(seconds=90)


@pytest.mark.parametrize("value", ["0 seconds", "-5 minutes", "31 days", "1 year", "1 mon -30 days 1 hour", "1 mon"])
def test_a_promise_that_is_no_positive_interval_of_at_most_30_days_is_refused_naming_it(pg_conn, table_name, value):
    pg_conn.execute(f"CREATE TABLE {table_name} (id int PRIMARY KEY)")
    with pytest.raises(psycopg.errors.InvalidParameterValue) as refused:
        pg_conn.execute("SELECT coldharbor.register_table(%s, p_freshness => %s)", (table_name, value))
    assert "p_freshness must be an interval above 0 and at most 30 days, in days, hours, minutes or seconds" \
        in str(refused.value)
    pg_conn.rollback()
    assert pg_conn.execute("SELECT count(*) FROM coldharbor.tables WHERE table_name = %s",
                           (table_name,)).fetchone()[0] == 0, "nothing registered"


def test_an_export_held_past_the_promise_fails_check_freshness_and_turns_the_page_red(
        airflow_home, spark, pg_dsn, admin_dsn, pg_conn, table_name, lake_root, capsys, caplog):
    from airflow.dag_processing.dagbag import DagBag
    from coldharbor_airflow.health_page import render
    from coldharbor_airflow.hooks import ColdharborHook

    pg_conn.execute(f"CREATE TABLE {table_name} (id int PRIMARY KEY, v text)")
    pg_conn.execute("SELECT coldharbor.register_table(%s, p_freshness => '2 seconds')", (table_name,))
    table_id = pg_conn.execute("SELECT table_id FROM coldharbor.tables WHERE table_name = %s",
                               (table_name,)).fetchone()[0]
    check = DagBag(dag_folder=str(PROJECT / "dags")).dags["coldharbor_cdc"].partial_subset(
        task_ids=["check_freshness"], include_upstream=False)
    check.test()  # other tests' tables may be behind their promises; this one has nothing to export
    captured = capsys.readouterr()
    assert f"'public.{table_name}' is " not in captured.out + captured.err

    with pg.connect(admin_dsn) as holder, pg.advisory_lock(holder, "export", table_id) as held:
        assert held
        pg_conn.execute(f"INSERT INTO {table_name} VALUES (1, 'waits')")
        assert export(spark, pg_dsn, table_name, lake_root).status == "skipped"  # another run holds it
        time.sleep(2.5)
        capsys.readouterr()
        caplog.clear()
        run = check.test()
        captured = capsys.readouterr()
        out = captured.out + captured.err + caplog.text  # where the task's log lines go depends on earlier tests
    assert run.state == "failed"
    # The failure callback's line (caught once or more, by each capture; other tests' tables may be in it).
    alerts = [line for line in out.splitlines() if "coldharbor freshness alert: freshness promise broken" in line]
    assert alerts, out[-3000:]
    ours = re.compile(rf"'public\.{table_name}' is [0-9.,]+ (s|min) behind PostgreSQL, promised at most 2 s \(its oldest")
    assert all(ours.search(a) for a in alerts), alerts

    [row] = [t for t in ColdharborHook().health()["tables"] if t["table_name"] == table_name]
    page = render({"tables": [row], "report_runs": []})
    assert '<span class="state lagging">lagging</span>: the oldest unexported change is ' in page
    assert "past the promise of 2.0 s" in page

    export(spark, pg_dsn, table_name, lake_root)  # the lock is free: the table catches up
    assert table_name not in str(ColdharborHook().broken_promises())
    [row] = [t for t in ColdharborHook().health()["tables"] if t["table_name"] == table_name]
    assert '<span class="state ok">ok</span>' in render({"tables": [row], "report_runs": []})


def test_an_initial_load_that_keeps_failing_breaks_the_promise_though_nothing_changes(
        airflow_home, spark, pg_dsn, pg_conn, table_name, lake_root):
    """Found by the cold attack of issue 25: a quiet table whose initial load failed at every export
    (a value the lake cannot hold) had no unexported change, so no lag, no alert and an "ok" page,
    while the lake lacked the whole table. The pending base now counts from its request."""
    from coldharbor_airflow.alerts import describe
    from coldharbor_airflow.health_charts import status
    from coldharbor_airflow.hooks import ColdharborHook

    pg_conn.execute(f"CREATE TABLE {table_name} (id int PRIMARY KEY, d date)")
    pg_conn.execute(f"INSERT INTO {table_name} VALUES (1, '2026-01-01'), (2, 'infinity')")
    pg_conn.execute("SELECT coldharbor.register_table(%s, p_freshness => '1 second')", (table_name,))
    from coldharbor.runtime.errors import UnrepresentableValueError

    with pytest.raises(UnrepresentableValueError, match="infinity"):  # the load is refused, at every export
        export(spark, pg_dsn, table_name, lake_root)
    time.sleep(1.5)
    [broken] = [b for b in ColdharborHook().broken_promises() if b["name"] == f"public.{table_name}"]
    assert broken["pending"] and broken["lag_s"] > 1
    assert "its initial load (or a new base after DDL) has been pending since" in describe(broken)
    [row] = [t for t in ColdharborHook().health()["tables"] if t["table_name"] == table_name]
    assert status(row, [])[0] == "lagging" and "the lake lacks the whole table" in status(row, [])[1]

    pg_conn.execute(f"UPDATE {table_name} SET d = '2026-01-02' WHERE id = 2")
    export(spark, pg_dsn, table_name, lake_root)
    assert f"public.{table_name}" not in [b["name"] for b in ColdharborHook().broken_promises()]

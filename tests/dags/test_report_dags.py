"""Report DAGs: one per report file, backfills answer as of the interval's end; the ad-hoc form
refuses bad input before a run exists."""

from __future__ import annotations

import time
from datetime import datetime, timedelta, timezone

import pytest

from tests.helpers import PROJECT, export, pg_rows

REPORT = """-- report: {name}
-- target: reports.{name}
-- sink: postgres
-- param: floor int = 0
SELECT id, v FROM {table} WHERE id > :floor
"""


def dagbag():
    from airflow.dag_processing.dagbag import DagBag

    return DagBag(dag_folder=str(PROJECT / "dags"))


def use_reports(monkeypatch, folder):
    """Point the DAG file and the jobs at a folder of report files."""
    import coldharbor_airflow.paths as paths
    import coldharbor_airflow.reports as report_module

    monkeypatch.setenv("COLDHARBOR_REPORTS_DIR", str(folder))
    monkeypatch.setattr(paths, "REPORTS_DIR", folder)
    monkeypatch.setattr(report_module, "REPORTS_DIR", folder)


def test_report_dags_follow_their_headers(airflow_home, tmp_path, monkeypatch):
    bag = dagbag()
    status = bag.dags["coldharbor_report_demo_orders_by_status"]
    assert status.schedule == "*/5 * * * *" and status.catchup is False  # no start: forward only
    assert status.params["min_amount"] == "0"
    assert bag.dags["coldharbor_report_demo_top_customers"].schedule == "@hourly"
    (tmp_path / "daily.sql").write_text("-- schedule: @daily\n-- start: 2026-11-20\nSELECT 1 AS x FROM t\n")
    use_reports(monkeypatch, tmp_path)
    daily = dagbag().dags["coldharbor_report_daily"]
    assert daily.catchup is True and daily.start_date.isoformat() == "2026-11-20T00:00:00+00:00"


@pytest.mark.parametrize("conf, message", [
    ({"target": "reports_x"}, "does not match"),
    ({"target": "adhoc_ok", "mode": "fast"}, "is not one of"),
    ({"target": "adhoc_ok", "report": "no_such_report"}, "is not one of"),
    ({"target": "adhoc_ok", "sql": ""}, "should be non-empty"),
    ({"target": "adhoc_ok", "as_of": "yesterday"}, "does not match"),
])
def test_the_adhoc_form_refuses_bad_input_before_a_run_exists(airflow_home, conf, message):
    import copy

    from airflow.models import DagRun
    from airflow.sdk.exceptions import ParamValidationError

    dag = dagbag().dags["coldharbor_adhoc_report"]
    params = copy.deepcopy(dag.params)
    with pytest.raises(ParamValidationError, match=message):
        params.update(conf)
        params.validate()
    with pytest.raises(Exception) as refused:  # the run is created only after the same validation
        dag.test(run_conf=conf)
    assert type(refused.value).__name__ == "ParamValidationError", refused.value

    assert DagRun.find(dag_id="coldharbor_adhoc_report") == []


def report_over_new_table(pg_conn, table_name: str, tmp_path, monkeypatch, value: str) -> tuple[str, str]:
    """A registered table of 10 rows (v = value) and a report file over it; (report name, lake root)."""
    lake_root = str(tmp_path / "lake")
    reports = tmp_path / "reports"
    reports.mkdir()
    name = f"r_{table_name}"
    (reports / f"{name}.sql").write_text(REPORT.format(name=name, table=table_name))
    use_reports(monkeypatch, reports)
    monkeypatch.setenv("COLDHARBOR_LAKE_ROOT", lake_root)
    pg_conn.execute(f"CREATE TABLE {table_name} (id bigint PRIMARY KEY, v text)")
    pg_conn.execute("SELECT coldharbor.register_table(%s)", (table_name,))
    pg_conn.execute(f"INSERT INTO {table_name} SELECT g, %s FROM generate_series(1, 10) g", (value,))
    return name, lake_root


def test_a_backfilled_interval_is_served_as_of_its_end(airflow_home, spark, pg_dsn, pg_conn, table_name,
                                                       tmp_path, monkeypatch):
    name, lake_root = report_over_new_table(pg_conn, table_name, tmp_path, monkeypatch, "before")
    export(spark, pg_dsn, table_name, lake_root)
    time.sleep(1.5)
    interval_end = datetime.now(timezone.utc).replace(microsecond=0)
    expected = pg_rows(pg_conn, f"SELECT id, v FROM {table_name} WHERE id > 3", ["id"])
    time.sleep(1.5)
    pg_conn.execute(f"UPDATE {table_name} SET v = 'after' WHERE id <= 5")
    pg_conn.execute(f"DELETE FROM {table_name} WHERE id = 10")
    pg_conn.execute(f"INSERT INTO {table_name} VALUES (11, 'after')")
    export(spark, pg_dsn, table_name, lake_root)

    dag = dagbag().dags[f"coldharbor_report_{name}"]
    run = dag.test(logical_date=interval_end, run_conf={"floor": 3})
    assert run.state == "success", [(ti.task_id, ti.state) for ti in run.get_task_instances()]
    assert pg_rows(pg_conn, f"SELECT * FROM reports.{name}", ["id"]) == expected
    recorded = pg_conn.execute("SELECT as_of FROM coldharbor.report_runs WHERE report = %s", (name,)).fetchone()[0]
    assert recorded == interval_end
    assert interval_end < datetime.now(timezone.utc) - timedelta(seconds=2)


def test_a_run_triggered_by_hand_serves_the_report_now(airflow_home, spark, pg_dsn, pg_conn, table_name,
                                                        tmp_path, monkeypatch):
    """The UI's Trigger button makes a run without a logical date: no interval, so no as-of."""
    name, lake_root = report_over_new_table(pg_conn, table_name, tmp_path, monkeypatch, "v")
    export(spark, pg_dsn, table_name, lake_root)
    pg_conn.execute(f"UPDATE {table_name} SET v = 'dirty' WHERE id = 7")

    run = dagbag().dags[f"coldharbor_report_{name}"].test(logical_date=None, run_conf={"floor": 3})
    assert run.state == "success", [(ti.task_id, ti.state) for ti in run.get_task_instances()]
    assert pg_rows(pg_conn, f"SELECT * FROM reports.{name}", ["id"]) == pg_rows(
        pg_conn, f"SELECT id, v FROM {table_name} WHERE id > 3", ["id"])
    recorded = pg_conn.execute("SELECT as_of, state FROM coldharbor.report_runs WHERE report = %s",
                               (name,)).fetchone()
    assert recorded == (None, "succeeded")

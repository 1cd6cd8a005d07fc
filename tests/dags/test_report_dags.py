"""Report DAGs: one per report file, backfills answer as of the interval's end; the ad-hoc form
refuses bad input before a run exists."""

from __future__ import annotations

import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

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
    import coldharbor.runtime.settings as job_settings
    import coldharbor_airflow.paths as paths
    import coldharbor_airflow.reports as report_module

    monkeypatch.setenv("COLDHARBOR_REPORTS_DIR", str(folder))
    monkeypatch.setattr(paths, "REPORTS_DIR", folder)
    monkeypatch.setattr(report_module, "REPORTS_DIR", folder)
    # The operator checks a report in the worker (this process) before spark-submit, with the jobs' settings.
    monkeypatch.setattr(job_settings, "REPORTS_DIR", folder)


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
    # jsonschema's `$` also matches before a final newline: the patterns must end the value.
    ({"target": "adhoc_ok\n"}, "does not match"),
    ({"target": "adhoc_ok", "as_of": "2026-01-01T00:00Z\n"}, "does not match"),
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


def changed_before_interval_end(spark, pg_dsn, pg_conn, table_name: str, tmp_path, monkeypatch,
                                wait_s: int) -> tuple[str, str, datetime]:
    """A report over an exported table, rows of which changed just before the interval's end and are
    not exported; the report DAGs wait up to `wait_s` for an export. (report, lake root, interval end)."""
    monkeypatch.setenv("COLDHARBOR_AS_OF_WAIT_S", str(wait_s))
    name, lake_root = report_over_new_table(pg_conn, table_name, tmp_path, monkeypatch, "before")
    export(spark, pg_dsn, table_name, lake_root)
    pg_conn.execute(f"UPDATE {table_name} SET v = 'changed' WHERE id <= 5")
    time.sleep(1.5)
    return name, lake_root, datetime.now(timezone.utc).replace(microsecond=0)


def test_a_run_whose_interval_end_is_not_in_the_lake_waits_for_the_export_that_brings_it(
        airflow_home, spark, pg_dsn, pg_conn, table_name, tmp_path, monkeypatch):
    """Without the wait, the run was refused ("not in the lake yet") and retried a minute later,
    three times, then failed for good if no export had come. Now wait_for_lake holds the run until
    an export covers the interval's end; serve then runs once, exact."""
    import threading

    name, lake_root, interval_end = changed_before_interval_end(spark, pg_dsn, pg_conn, table_name, tmp_path,
                                                                monkeypatch, wait_s=300)
    expected = pg_rows(pg_conn, f"SELECT id, v FROM {table_name} WHERE id > 3", ["id"])
    time.sleep(1.5)
    pg_conn.execute(f"DELETE FROM {table_name} WHERE id = 9")  # after the interval: not in its report

    exported_at = []

    def export_later():
        time.sleep(12)
        export(spark, pg_dsn, table_name, lake_root)
        exported_at.append(datetime.now(timezone.utc))

    exporter = threading.Thread(target=export_later)
    exporter.start()
    try:
        run = dagbag().dags[f"coldharbor_report_{name}"].test(logical_date=interval_end, run_conf={"floor": 3})
    finally:
        exporter.join()
    states = {ti.task_id: (ti.state, ti.try_number) for ti in run.get_task_instances()}
    assert run.state == "success" and states["serve"] == ("success", 1), states
    assert pg_rows(pg_conn, f"SELECT * FROM reports.{name}", ["id"]) == expected
    [(state, started)] = pg_conn.execute("SELECT state, started_at FROM coldharbor.report_runs WHERE report = %s",
                                         (name,)).fetchall()
    flushed = pg_conn.execute("SELECT max(c.flushed_at) FROM coldharbor.change_log c JOIN coldharbor.tables t "
                              "USING (table_id) WHERE t.table_name = %s", (table_name,)).fetchone()[0]
    assert exported_at and state == "succeeded" and started > flushed, "serve started before the export it waited for"


def test_a_run_gives_up_waiting_naming_the_table_and_serves_nothing(
        airflow_home, spark, pg_dsn, pg_conn, table_name, tmp_path, monkeypatch):
    from airflow.sdk.exceptions import AirflowSensorTimeout
    from coldharbor_airflow.sensors import LakeCoversAsOfSensor

    name, lake_root, interval_end = changed_before_interval_end(spark, pg_dsn, pg_conn, table_name, tmp_path,
                                                                monkeypatch, wait_s=4)

    run = dagbag().dags[f"coldharbor_report_{name}"].test(logical_date=interval_end, run_conf={"floor": 3})
    states = {ti.task_id: ti.state for ti in run.get_task_instances()}
    assert run.state == "failed" and states == {"wait_for_lake": "failed", "serve": "upstream_failed"}, states
    assert pg_conn.execute("SELECT count(*) FROM coldharbor.report_runs WHERE report = %s",
                           (name,)).fetchone()[0] == 0
    assert pg_conn.execute("SELECT to_regclass(%s)", (f"reports.{name}",)).fetchone()[0] is None

    sensor = LakeCoversAsOfSensor(task_id="wait", mode="poke", timeout=2, poke_interval=1, lake_root=lake_root,
                                  job_args=["--report", name, "--as-of", interval_end.isoformat()])
    with pytest.raises(AirflowSensorTimeout) as gave_up:
        sensor.execute({})
    assert str(gave_up.value).startswith(
        f"gave up after 0:00:02 of waiting for an export: as-of {interval_end.isoformat()} is not in the lake yet; "
        f"public.{table_name}: changes from "), gave_up.value
    assert "is the coldharbor_cdc DAG running, and does its task for that table succeed" in str(gave_up.value)


@pytest.mark.parametrize("value", ["soon", "0", "-5", "1e9", "nan"])
def test_a_wait_that_is_no_number_of_seconds_is_an_import_error_naming_it(airflow_home, monkeypatch, value):
    monkeypatch.setenv("COLDHARBOR_AS_OF_WAIT_S", value)
    bag = dagbag()
    assert {"coldharbor_report_demo_orders_by_status", "coldharbor_adhoc_report"}.isdisjoint(bag.dags)
    errors = "\n".join(bag.import_errors.values())
    assert f"COLDHARBOR_AS_OF_WAIT_S={value!r} is not a number of seconds between 0 and 86400" in errors, errors


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


def test_a_malformed_report_file_breaks_only_its_own_dag(airflow_home, spark, pg_dsn, pg_conn, table_name,
                                                         tmp_path, monkeypatch):
    """A bad header, a bad cron and a file that is not UTF-8, beside a good report: Airflow shows
    one import error naming each bad file (in a file holding no DAG, since an import error marks
    every DAG of its file stale); every other DAG loads, and the good report still runs."""
    name, lake_root = report_over_new_table(pg_conn, table_name, tmp_path, monkeypatch, "v")
    reports = tmp_path / "reports"
    (reports / "bad_header.sql").write_text("-- colour: red\nSELECT 1 AS x FROM t\n")
    (reports / "bad_cron.sql").write_text("-- schedule: every minute\nSELECT 1 AS x FROM t\n")
    (reports / "not_utf8.sql").write_bytes("-- description: caf\xe9\nSELECT 1 AS x FROM t\n".encode("latin-1"))

    bag = dagbag()
    [(error_file, error)] = bag.import_errors.items()
    assert error_file.endswith("coldharbor_report_files.py")
    assert f"{reports / 'bad_header.sql'}: unknown header 'colour'" in error
    assert f"{reports / 'bad_cron.sql'}: schedule 'every minute' is not a cron expression or preset" in error
    assert f"{reports / 'not_utf8.sql'}: is not UTF-8 text" in error
    assert {f"coldharbor_report_{name}", "coldharbor_adhoc_report", "coldharbor_cdc"} <= set(bag.dags)
    assert not {f"coldharbor_report_{bad}" for bad in ("bad_header", "bad_cron", "not_utf8")} & set(bag.dags)
    assert not {PROJECT / "dags" / Path(dag.fileloc).name for dag in bag.dags.values()} & {
        PROJECT / "dags" / Path(error_file).name}
    assert bag.dags["coldharbor_adhoc_report"].params.get_param("report").schema["enum"] == [None, name]

    export(spark, pg_dsn, table_name, lake_root)
    run = bag.dags[f"coldharbor_report_{name}"].test(logical_date=None, run_conf={"floor": 3})
    assert run.state == "success", [(ti.task_id, ti.state) for ti in run.get_task_instances()]
    assert pg_rows(pg_conn, f"SELECT * FROM reports.{name}", ["id"]) == pg_rows(
        pg_conn, f"SELECT id, v FROM {table_name} WHERE id > 3", ["id"])


def test_the_adhoc_form_runs_a_chosen_report_into_its_adhoc_target(airflow_home, spark, pg_dsn, pg_conn, table_name,
                                                                  tmp_path, monkeypatch):
    name, lake_root = report_over_new_table(pg_conn, table_name, tmp_path, monkeypatch, "v")
    export(spark, pg_dsn, table_name, lake_root)
    target = f"adhoc_{table_name}"
    run = dagbag().dags["coldharbor_adhoc_report"].test(run_conf={"report": name, "target": target})
    assert run.state == "success", [(ti.task_id, ti.state) for ti in run.get_task_instances()]
    assert pg_rows(pg_conn, f"SELECT * FROM reports.{target}", ["id"]) == pg_rows(
        pg_conn, f"SELECT id, v FROM {table_name} WHERE id > 0", ["id"])  # the report, its parameter's default
    assert pg_conn.execute("SELECT to_regclass(%s)", (f"reports.{name}",)).fetchone()[0] is None  # not its table


@pytest.mark.parametrize("given, refusal", [
    ({}, "one of the arguments --report --sql is required"),
    ({"sql": "SELECT 1 AS x FROM {t}", "report": "{r}"}, "argument --sql: not allowed with argument --report"),
], ids=["neither", "both"])
def test_the_adhoc_form_refuses_neither_or_both_before_spark_starts(airflow_home, pg_conn, table_name, tmp_path,
                                                                    monkeypatch, capfd, given, refusal):
    from coldharbor_airflow.operators import ColdharborSparkJobOperator

    name, _ = report_over_new_table(pg_conn, table_name, tmp_path, monkeypatch, "v")
    submitted = []
    monkeypatch.setattr(ColdharborSparkJobOperator, "prepared_submit", lambda self: submitted.append(1))
    conf = {key: value.format(t=table_name, r=name) for key, value in given.items()}
    run = dagbag().dags["coldharbor_adhoc_report"].test(run_conf={**conf, "target": "adhoc_refused"})
    [serve] = [ti for ti in run.get_task_instances() if ti.task_id == "serve"]
    # not retried: a retry would be refused the same way
    assert run.state == "failed" and (serve.state, serve.try_number) == ("failed", 1)
    output = "".join(capfd.readouterr())
    assert refusal in output and "refused the report before Spark started" in output
    assert "TypeError" not in output and submitted == []

"""DAG integrity: every DAG imports cleanly, carries what operations needs, and is cheap to parse."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

PROJECT = Path(__file__).resolve().parents[2]
# The report headers are read with coldharbor.serve.report_spec (pure Python); nothing else of the jobs.
HEAVY = ("pyspark", "psycopg", "pandas", "delta", "pyarrow", "sqlglot")


def load(airflow_home):
    from airflow.dag_processing.dagbag import DagBag

    return DagBag(dag_folder=str(PROJECT / "dags"))


def test_every_dag_imports_without_errors(airflow_home):
    bag = load(airflow_home)
    assert bag.import_errors == {}
    assert {"coldharbor_cdc", "coldharbor_compaction", "coldharbor_cleanup", "coldharbor_adhoc_report", "coldharbor_resync",
            "coldharbor_report_demo_orders_by_status", "coldharbor_report_demo_top_customers"} <= set(bag.dags)
    for stat in bag.dagbag_stats:
        print(f"{stat.file}: DagBag parse {stat.duration.total_seconds():.3f} s")


def test_every_dag_has_tags_an_owner_retries_and_timeouts(airflow_home):
    for dag_id, dag in load(airflow_home).dags.items():
        assert dag.tags, dag_id
        for task in dag.tasks:
            assert task.owner == "coldharbor", (dag_id, task.task_id)
            # check_freshness's failure is the alert it raises: a retry would only delay it.
            assert task.retries >= 1 or (dag_id, task.task_id) == ("coldharbor_cdc", "check_freshness"), \
                (dag_id, task.task_id)
            assert task.execution_timeout is not None, (dag_id, task.task_id)


def test_every_writer_dag_runs_once_at_a_time_and_the_adhoc_form_four(airflow_home):
    """Invariant 9's second half: each DAG that writes a table's lake, hot tier or report table
    declares max_active_runs=1 (Airflow's default is 16 runs at once); only the ad-hoc form,
    whose runs each write their own adhoc_* target, allows four."""
    dags = load(airflow_home).dags
    runs = {dag_id: dag.max_active_runs for dag_id, dag in dags.items()}
    expected = {dag_id: 4 if dag_id == "coldharbor_adhoc_report" else 1 for dag_id in dags}
    assert runs == expected
    assert {"coldharbor_cdc", "coldharbor_compaction", "coldharbor_cleanup", "coldharbor_resync",
            "coldharbor_report_demo_orders_by_status"} <= set(runs)


def test_the_export_dag_runs_every_minute_once_at_a_time_in_the_spark_pool(airflow_home):
    dag = load(airflow_home).dags["coldharbor_cdc"]
    assert dag.catchup is False and dag.max_active_runs == 1
    assert (type(dag.timetable).__name__, dag.timetable.expression) == ("CronDataIntervalTimetable", "* * * * *")
    assert dag.get_task("export").pool == "coldharbor_spark"


def test_parsing_a_dag_file_imports_nothing_heavy(airflow_home):
    """Parse time stays small because DAG files import no Spark, database or job code: checked in a
    fresh interpreter, per file (the timings are printed, not asserted)."""
    for path in sorted((PROJECT / "dags").glob("coldharbor_*.py")):
        probe = (f"import sys, time, runpy; sys.path[:0] = [{str(PROJECT / 'plugins')!r}, {str(path.parent)!r}]\n"
                 f"start = time.perf_counter(); runpy.run_path({str(path)!r}); took = time.perf_counter() - start\n"
                 "import json; print(json.dumps({'took': took, 'loaded': sorted(m.split('.')[0] for m in sys.modules)}))")
        out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300,
                             env={"AIRFLOW_HOME": str(airflow_home), "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
                                  "PATH": "/usr/bin:/bin"})
        assert out.returncode == 0, out.stderr[-2000:]
        report = json.loads(out.stdout.strip().splitlines()[-1])
        print(f"{path.name}: parsed in {report['took']:.3f} s")
        assert not set(HEAVY) & set(report["loaded"]), (path.name, set(HEAVY) & set(report["loaded"]))


def test_the_resync_dag_takes_the_table_as_a_checked_param_and_cleanup_verifies_after_cleaning(airflow_home):
    # Imported here: importing Airflow at collection time, before airflow_home is set, would bind it
    # to a metadata DB without tables for every DAG test of the run.
    from airflow.sdk.exceptions import ParamValidationError

    bag = load(airflow_home)
    resync = bag.dags["coldharbor_resync"]
    [task] = resync.tasks
    assert (task.job, task.job_args) == ("resync.py", ["--table", "{{ params.table }}"])
    table = resync.params.get_param("table")
    table.resolve("public.orders")
    for hostile in ("public.orders; DROP TABLE x", "--help", "a.b.c", "", "public.orders\n--lake-root /tmp",
                    "public.orders\n"):
        with pytest.raises(ParamValidationError):
            table.resolve(hostile)
    cleanup = bag.dags["coldharbor_cleanup"]
    assert cleanup.get_task("verify").upstream_task_ids >= {"cleanup", "tables_to_verify"}


@pytest.mark.parametrize("cadence, summary, timetable", [
    (None, "* * * * *", "CronDataIntervalTimetable"),
    ("minute", "* * * * *", "CronDataIntervalTimetable"),
    ("continuous", "@continuous", "ContinuousTimetable"),
])
def test_the_export_cadence_is_every_minute_or_continuous_and_always_one_run_at_a_time(airflow_home, monkeypatch,
                                                                                       cadence, summary, timetable):
    dag = export_dag(airflow_home, monkeypatch, cadence)
    assert (scheduler_timetable(airflow_home, monkeypatch, cadence).summary, type(dag.timetable).__name__) == \
        (summary, timetable)
    assert dag.max_active_runs == 1 and dag.catchup is False
    assert dag.get_task("export").pool == "coldharbor_spark"


def export_dag(airflow_home, monkeypatch, cadence: str | None):
    """coldharbor_cdc bagged with COLDHARBOR_EXPORT_CADENCE=cadence (None: unset)."""
    if cadence is None:
        monkeypatch.delenv("COLDHARBOR_EXPORT_CADENCE", raising=False)
    else:
        monkeypatch.setenv("COLDHARBOR_EXPORT_CADENCE", cadence)
    bag = load(airflow_home)
    assert bag.import_errors == {}
    return bag.dags["coldharbor_cdc"]


def scheduler_timetable(airflow_home, monkeypatch, cadence: str | None):
    """The export DAG's timetable as the scheduler holds it: bagged, serialized, deserialized."""
    from airflow.serialization.serialized_objects import DagSerialization

    dag = export_dag(airflow_home, monkeypatch, cadence)
    return DagSerialization.deserialize_dag(DagSerialization.serialize_dag(dag)).timetable


@pytest.mark.parametrize("before, after", [("minute", "continuous"), ("continuous", "minute"),
                                           ("continuous", "continuous"), ("minute", "minute")])
def test_changing_the_export_cadence_never_stalls_the_schedule(airflow_home, monkeypatch, before, after):
    """The scheduler creates the next run at the logical date the new timetable gives after the
    last run; one equal to an existing run's is skipped as existing, every second, for good (seen
    going from the minute to continuous with Airflow's zero-length cron intervals: the lake stopped)."""
    import pendulum
    from airflow.timetables.base import TimeRestriction

    old, new = scheduler_timetable(airflow_home, monkeypatch, before), scheduler_timetable(airflow_home, monkeypatch, after)
    restriction = TimeRestriction(earliest=pendulum.datetime(2026, 1, 1, tz="UTC"), latest=None, catchup=False)
    last = old.next_dagrun_info(last_automated_data_interval=None, restriction=restriction)  # the latest, now
    following = new.next_dagrun_info(last_automated_data_interval=last.data_interval, restriction=restriction)
    assert following is not None and following.logical_date != last.logical_date


def test_an_unknown_export_cadence_is_the_export_dags_import_error_naming_the_setting(airflow_home, monkeypatch):
    monkeypatch.setenv("COLDHARBOR_EXPORT_CADENCE", "hourly; rm -rf /")
    bag = load(airflow_home)
    [(path, error)] = bag.import_errors.items()
    assert path.endswith("coldharbor_cdc.py")
    assert "COLDHARBOR_EXPORT_CADENCE='hourly; rm -rf /' is not a cadence: one of minute, continuous" in error
    assert "coldharbor_cdc" not in bag.dags and "coldharbor_compaction" in bag.dags

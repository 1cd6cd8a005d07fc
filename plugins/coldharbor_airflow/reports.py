"""Report definitions as the DAGs see them: the headers of sql/reports/*.sql, read with the jobs'
own parser (pure Python: no Spark, no database), and their parameters as Airflow Params."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any

from coldharbor_airflow.params import whole
from coldharbor_airflow.paths import JOBS_DIR, REPORTS_DIR

# JSON schema of each report parameter type, for the trigger form and for validation before a run.
_SCHEMAS: dict[str, dict[str, Any]] = {
    "string": {"type": "string"},
    "int": {"type": "integer", "minimum": -2**31, "maximum": 2**31 - 1},
    "bigint": {"type": "integer"},
    "double": {"type": "number"},
    "decimal": {"type": "string", "pattern": whole(r"-?\d+(\.\d+)?")},
    "boolean": {"type": "boolean"},
    "date": {"type": "string", "format": "date"},
    "timestamp": {"type": "string", "format": "date-time"},
}


class MalformedReportFiles(Exception):
    """Report files that cannot become a DAG; raised by dags/coldharbor_report_files.py, so Airflow
    shows it as that file's import error while every other report DAG loads."""

    def __init__(self, errors: dict[str, str]) -> None:
        lines = "\n".join(f"  {path}: {error}" for path, error in sorted(errors.items()))
        super().__init__(f"{len(errors)} report file(s) under {REPORTS_DIR} have no DAG until fixed:\n{lines}")


@dataclass(frozen=True)
class ReportCatalog:
    specs: list          # the reports that become DAGs
    errors: dict[str, str]  # report file -> why it cannot (a malformed header, not UTF-8, a bad schedule)


def report_catalog() -> ReportCatalog:
    """Every report file, each checked on its own with the jobs' parser (pure Python: no Spark, no
    database) and its schedule with Airflow's cron rules: a bad file is an error of that file only."""
    if str(JOBS_DIR) not in sys.path:
        sys.path.insert(0, str(JOBS_DIR))
    from coldharbor.serve.report_spec import read_report_files

    files = read_report_files(REPORTS_DIR)
    specs, errors = [], dict(files.errors)
    for spec in files.reports.values():
        problem = schedule_problem(spec.schedule)
        if problem:
            errors[spec.source] = f"schedule {spec.schedule!r} is not a cron expression or preset: {problem}"
        else:
            specs.append(spec)
    return ReportCatalog(specs, errors)


def report_specs() -> list:
    """The reports that become DAGs (a malformed file is left out: see report_catalog)."""
    return report_catalog().specs


def schedule_problem(schedule: str | None) -> str | None:
    """What Airflow would refuse in a report's schedule when it bags the DAG (after every other
    DAG of the file was built), or None."""
    if schedule is None or schedule in ("@once", "@continuous"):
        return None
    from airflow.sdk import CronTriggerTimetable

    try:
        CronTriggerTimetable(schedule, timezone="UTC").validate()
    except Exception as exc:  # AirflowTimetableInvalid, or the cron parser's own error
        return str(exc) or type(exc).__name__
    return None


def param_schema(type_: str) -> dict[str, Any]:
    return dict(_SCHEMAS["decimal" if type_.startswith("decimal") else type_])


def param_default(type_: str, default: str | None) -> Any:
    if default is None:
        return None
    base = "decimal" if type_.startswith("decimal") else type_
    if base in ("int", "bigint"):
        return int(default)
    if base == "double":
        return float(default)
    if base == "boolean":
        return default.strip().lower() in ("true", "t", "1", "yes")
    return default

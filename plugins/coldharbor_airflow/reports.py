"""Report definitions as the DAGs see them: the headers of sql/reports/*.sql, read with the jobs'
own parser (pure Python: no Spark, no database), and their parameters as Airflow Params."""

from __future__ import annotations

import sys
from typing import Any

from coldharbor_airflow.paths import JOBS_DIR, REPORTS_DIR

# JSON schema of each report parameter type, for the trigger form and for validation before a run.
_SCHEMAS: dict[str, dict[str, Any]] = {
    "string": {"type": "string"},
    "int": {"type": "integer", "minimum": -2**31, "maximum": 2**31 - 1},
    "bigint": {"type": "integer"},
    "double": {"type": "number"},
    "decimal": {"type": "string", "pattern": r"^-?\d+(\.\d+)?$"},
    "boolean": {"type": "boolean"},
    "date": {"type": "string", "format": "date"},
    "timestamp": {"type": "string", "format": "date-time"},
}


def report_specs() -> list:
    """Every report file's spec; a malformed header raises (the DAG file shows an import error)."""
    if str(JOBS_DIR) not in sys.path:
        sys.path.insert(0, str(JOBS_DIR))
    from coldharbor.report_spec import load_reports

    return list(load_reports(REPORTS_DIR).values())


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

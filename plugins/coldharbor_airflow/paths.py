"""Where the project's jobs live, seen from the Airflow processes (overridable for a deployment
whose jobs are somewhere else, e.g. a container image)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

PROJECT_DIR = Path(os.environ.get("COLDHARBOR_PROJECT_DIR", Path(__file__).resolve().parents[2]))
JOBS_DIR = PROJECT_DIR / "jobs"
REPORTS_DIR = Path(os.environ.get("COLDHARBOR_REPORTS_DIR", PROJECT_DIR / "sql" / "reports"))


def import_jobs_package() -> None:
    """Makes the jobs' `coldharbor` package importable here (its pinned settings, its DSN rules)."""
    if str(JOBS_DIR) not in sys.path:
        sys.path.insert(0, str(JOBS_DIR))

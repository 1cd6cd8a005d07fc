"""Report files under sql/reports/ that cannot become a DAG: a malformed header, a bad cron
schedule, a file that is not UTF-8, a report name another file took.

Airflow shows them as this file's import error, one line per file naming what is wrong. The
report DAGs come from coldharbor_reports.py, which leaves such files out: one bad file breaks only
its own report, never the other report DAGs or the ad-hoc DAG. This file itself defines no DAG
(an import error marks every DAG of its file stale, so it must not share a file with them).
"""

from __future__ import annotations

from coldharbor_airflow.reports import MalformedReportFiles, report_catalog

_errors = report_catalog().errors
if _errors:
    raise MalformedReportFiles(_errors)

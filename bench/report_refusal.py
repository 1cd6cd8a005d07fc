"""Report-sandbox benchmark (issue 19): how fast a hostile ad-hoc report is refused, against an
accepted small report, and what the allow-list does with the whole corpus.

    python -m bench.report_refusal [--repeats 5]

Both reports run as the command line runs them (`python jobs/serve_report.py --sql ... --target
adhoc_x`, a real PostgreSQL); the refusal also as the DAG's operator runs it (spark-submit, whose
launcher is a JVM). Figures are printed, never asserted.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from coldharbor.runtime import pg, settings
from coldharbor.runtime.errors import ReportError
from coldharbor.runtime.spark import ivy_dir, maven_packages
from coldharbor.serve.report_spec import parse_report
from coldharbor.serve.sql_guard import check_query

from bench.common import Row, median, render, temporary_postgres
from tests.report_corpus import ORDERS, REGISTERED, create_tables, fill, hostile, legitimate

HOSTILE_SQL = f"SELECT TRANSFORM(order_id) USING 'touch {{marker}}' AS (x) FROM {ORDERS}"
ACCEPTED_SQL = f"SELECT status, count(*) AS orders, sum(amount) AS revenue FROM {ORDERS} GROUP BY status"
REFUSAL_TARGET_S = 2.0


def _serve(dsn: str, lake_root: str, sql: str, target: str, spark_submit: bool = False) -> tuple[float, int]:
    """One serve_report.py run: (wall seconds, exit code)."""
    job = [str(settings.PROJECT_DIR / "jobs" / "serve_report.py"), "--lake-root", lake_root, "--sql", sql,
           "--target", target]
    bin_dir = os.path.dirname(sys.executable)
    if spark_submit:
        command = [os.path.join(bin_dir, "spark-submit"), "--master", "local[2]", "--packages",
                   ",".join(maven_packages()), "--conf", f"spark.jars.ivy={ivy_dir()}", "--conf",
                   "spark.ui.enabled=false", *job]
    else:
        command = [sys.executable, *job]
    env = {**os.environ, settings.PG_DSN_ENV: dsn, "PYTHONPATH": str(settings.PROJECT_DIR / "jobs"),
           "SPARK_LOCAL_IP": "127.0.0.1", "PATH": os.pathsep.join([bin_dir, os.environ.get("PATH", "")])}
    start = time.perf_counter()
    done = subprocess.run(command, env=env, capture_output=True, text=True)
    return time.perf_counter() - start, done.returncode


def latency(repeats: int) -> list[Row]:
    """Refused and accepted ad-hoc reports, interleaved, against one server and lake."""
    refused, accepted, submitted = [], [], []
    with temporary_postgres() as dsn, tempfile.TemporaryDirectory(prefix="coldharbor-lake-") as lake_root:
        with pg.connect(dsn) as conn:
            create_tables(conn)
        marker = Path(lake_root) / "marker"
        hostile_sql = HOSTILE_SQL.format(marker=marker)
        for _ in range(repeats):
            refused.append(_serve(dsn, lake_root, hostile_sql, "adhoc_refused"))
            accepted.append(_serve(dsn, lake_root, ACCEPTED_SQL, "adhoc_accepted"))
        for _ in range(max(1, repeats // 2)):
            submitted.append(_serve(dsn, lake_root, hostile_sql, "adhoc_refused", spark_submit=True))
        if marker.exists():
            raise SystemExit("the refused report ran its shell command")
    for label, runs, expected in (("refused", refused + submitted, 2), ("accepted", accepted, 0)):
        if any(code != expected for _, code in runs):
            raise SystemExit(f"a {label} run exited {[code for _, code in runs]}, not {expected}")
    refusal, serve = median([w for w, _ in refused]), median([w for w, _ in accepted])
    return [
        Row("report sandbox", f"hostile ad-hoc report refused, python serve_report.py (median of {repeats}, wall)",
            refusal, "s", f"< {REFUSAL_TARGET_S:g} s", refusal < REFUSAL_TARGET_S),
        Row("report sandbox", f"accepted small report served, python serve_report.py (median of {repeats}, wall)",
            serve, "s", "", None),
        Row("report sandbox", "refusal / accepted report (wall)", refusal / serve, "x", "", None),
        Row("report sandbox", f"hostile report refused under spark-submit, as the DAG runs it (median of "
            f"{len(submitted)}, wall)", median([w for w, _ in submitted]), "s", "", None),
    ]


def corpus() -> list[Row]:
    """The allow-list over the whole corpus, in process: counts and the time one check takes."""
    refused, seconds = 0, []
    for report in hostile():
        start = time.perf_counter()
        try:
            check_query(fill(report.sql), REGISTERED)
        except ReportError as exc:
            if report.refused in str(exc):
                refused += 1
        seconds.append(time.perf_counter() - start)
    passed = 0
    for report in legitimate():
        spec = parse_report(fill(report.report), "adhoc")
        start = time.perf_counter()
        try:
            check_query(spec.sql, REGISTERED)
            passed += 1
        except ReportError:
            pass
        seconds.append(time.perf_counter() - start)
    total_hostile, total_legit = len(hostile()), len(legitimate())
    return [
        Row("report sandbox", f"hostile corpus refused naming the construct (of {total_hostile})", refused,
            "reports", f"{total_hostile}", refused == total_hostile),
        Row("report sandbox", f"legitimate corpus passed (of {total_legit})", passed, "reports", f"{total_legit}",
            passed == total_legit),
        Row("report sandbox", f"allow-list check, one report in process (median of {len(seconds)})",
            median(seconds) * 1000, "ms", "", None),
    ]


def run(repeats: int = 5) -> list[Row]:
    return latency(repeats) + corpus()


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    print(render(run(args.repeats)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

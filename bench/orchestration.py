"""Orchestration benchmark (issue: orchestration): what one per-minute export cycle costs on this
machine, and how fresh the lake stays under the running service.

    python -m bench.orchestration cycle        wall time and CPU of one export cycle as the DAG runs it
                                               (spark-submit jobs/cdc_export.py), nothing dirty and
                                               10,000 dirty rows, side by side
    python -m bench.orchestration freshness --since <ISO time> --until <ISO time>
                                               commit-to-flushed lag of the demo table's changes under
                                               `make run` (the Airflow service), from the change log

Figures are printed, never asserted.
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time

from bench.common import Row, median, render, temporary_postgres
from coldharbor import pg, settings
from coldharbor.spark import ivy_dir, maven_packages


def _spark_submit_export(dsn: str, lake_root: str) -> tuple[float, float]:
    """One export cycle as the DAG's task runs it: (wall seconds, CPU seconds of the whole process tree)."""
    command = [os.path.join(os.path.dirname(sys.executable), "spark-submit"), "--master", "local[2]",
               "--packages", ",".join(maven_packages()), "--conf", f"spark.jars.ivy={ivy_dir()}",
               "--conf", "spark.ui.enabled=false", str(settings.PROJECT_DIR / "jobs" / "cdc_export.py"),
               "--lake-root", lake_root]
    env = {**os.environ, settings.PG_DSN_ENV: dsn, "SPARK_LOCAL_IP": "127.0.0.1",
           "PATH": os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "")]),
           "PYTHONPATH": str(settings.PROJECT_DIR / "jobs")}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run(command, env=env, check=True, capture_output=True)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def cycle(dirty_rows: int = 10_000, repeats: int = 3) -> list[Row]:
    results: dict[str, list[tuple[float, float]]] = {"nothing dirty": [], f"{dirty_rows:,} dirty rows": []}
    with temporary_postgres() as dsn, tempfile.TemporaryDirectory(prefix="coldharbor-lake-") as lake_root:
        with pg.connect(dsn) as conn:
            conn.execute("CREATE TABLE cycle_t (id bigint PRIMARY KEY, v text, n integer)")
            conn.execute("SELECT coldharbor.register_table('cycle_t')")
            conn.execute("INSERT INTO cycle_t SELECT g, 'v', 0 FROM generate_series(1, 100) g")
        _spark_submit_export(dsn, lake_root)  # creates the lake table: not measured
        for r in range(repeats):
            with pg.connect(dsn) as conn:
                conn.execute(f"""INSERT INTO cycle_t SELECT g, 'v', {r} FROM generate_series(1000, {999 + dirty_rows}) g
                                 ON CONFLICT (id) DO UPDATE SET n = EXCLUDED.n""")
            results[f"{dirty_rows:,} dirty rows"].append(_spark_submit_export(dsn, lake_root))
            results["nothing dirty"].append(_spark_submit_export(dsn, lake_root))
    rows = []
    for label, runs in results.items():
        rows.append(Row("orchestration", f"export cycle, {label}: wall (median of {repeats})",
                        median([w for w, _ in runs]), "s", "", None))
        rows.append(Row("orchestration", f"export cycle, {label}: CPU (median of {repeats})",
                        median([c for _, c in runs]), "cpu-s", "", None))
    return rows


def freshness(dsn: str, since: str, until: str, table: str = "demo_orders") -> list[Row]:
    """Lag from a change to its flush, for the changes made since `since`. The change's time is its
    created_at (the start of the writing transaction: the workload's last milliseconds); the
    commit timestamp of the row's xmin is no use once flushed, as the mark rewrote the row."""
    with pg.connect(dsn) as conn:
        lags = [r[0] for r in conn.execute("""
            SELECT extract(epoch FROM c.flushed_at - c.created_at)
              FROM coldharbor.change_log c JOIN coldharbor.tables t USING (table_id)
             WHERE t.table_name = %s AND c.created_at >= %s AND c.created_at < %s AND c.flushed_at IS NOT NULL
             ORDER BY 1""", (table, since, until)).fetchall()]
        pending = conn.execute("""SELECT count(*) FROM coldharbor.change_log c JOIN coldharbor.tables t USING (table_id)
                                   WHERE t.table_name = %s AND c.created_at >= %s AND c.created_at < %s
                                     AND c.flushed_at IS NULL""", (table, since, until)).fetchone()[0]
    if not lags:
        raise SystemExit(f"no flushed change of {table} since {since}: is the service running?")

    def pct(p: float) -> float:
        return float(lags[min(len(lags) - 1, int(p * len(lags)))])
    return [
        Row("orchestration", f"changes made {since} - {until}, flushed (still dirty: {pending})", len(lags),
            "changes", "", None),
        Row("orchestration", "freshness lag, median (commit -> flushed)", pct(0.5), "s", "", None),
        Row("orchestration", "freshness lag, p95 (commit -> flushed)", pct(0.95), "s", "<= 90 s", pct(0.95) <= 90),
        Row("orchestration", "freshness lag, max", float(lags[-1]), "s", "", None),
    ]


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("what", choices=["cycle", "freshness"])
    parser.add_argument("--since", help="freshness: changes made from this time (ISO 8601, UTC)")
    parser.add_argument("--until", help="freshness: ... until this time (ISO 8601, UTC)")
    parser.add_argument("--dirty-rows", type=int, default=10_000)
    args = parser.parse_args(argv)
    if args.what == "cycle":
        print(render(cycle(args.dirty_rows)))
    else:
        print(render(freshness(settings.pg_dsn(), args.since, args.until)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""Orchestration benchmark (issue: orchestration): what one per-minute export cycle costs on this
machine, and how fresh the lake stays under the running service.

    python -m bench.orchestration cycle        wall time and CPU of one export cycle as the DAG runs it
                                               (spark-submit jobs/cdc_export.py), nothing dirty and
                                               10,000 dirty rows, side by side
    python -m bench.orchestration freshness --since <ISO time> --until <ISO time>
                                               commit-to-flushed lag of the demo table's changes under
                                               `make run` (the Airflow service), from the change log
    python -m bench.orchestration dag-runs [--since <ISO time>]
                                               under `make run`: wall time of the coldharbor_cdc DAG's
                                               successful runs (start to end, from Airflow's own record)
    python -m bench.orchestration freshness --tables 10 --minutes 10 [--cadence continuous]
                                               under `make run`: registers 9 more demo tables
                                               (public.bench_fresh_01..09, owned by the demo
                                               application, left registered), writes all of them
                                               every 3 s for 10 minutes next to the service's own
                                               workload, waits for the last change to be flushed and
                                               gives the lag over every change of the 10 tables

Figures are printed, never asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone

from coldharbor.capture import roles
from coldharbor.embedded import stack
from coldharbor.runtime import pg, settings
from coldharbor.runtime.spark import ivy_dir, maven_packages
from psycopg import sql

from bench.common import Row, median, render, temporary_postgres


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


def percentile(ordered: list[float], p: float) -> float:
    """The value at fraction `p` of `ordered` (sorted ascending; nearest rank below)."""
    return float(ordered[min(len(ordered) - 1, int(p * len(ordered)))])


# The p95 commit-to-flushed lag issue 21 asks of each export cadence, with 10 demo tables.
FRESHNESS_GOAL_S = {"minute": 70.0, "continuous": 15.0}
FRESH_TABLES = "bench_fresh_{:02d}"
WRITE_EVERY_S = 3.0


def freshness(dsn: str, since: str, until: str, tables: list[str], cadence: str = "minute") -> list[Row]:
    """Lag from a change to its flush, for the changes of `tables` made in [since, until). The
    change's time is its created_at (the start of the writing transaction: the workload's last
    milliseconds); the commit timestamp of the row's xmin is no use once flushed, as the mark
    rewrote the row."""
    names = [t.split(".")[-1] for t in tables]
    window = """FROM coldharbor.change_log c JOIN coldharbor.tables t USING (table_id)
               WHERE t.table_name = ANY(%s) AND c.created_at >= %s AND c.created_at < %s"""
    with pg.connect(dsn) as conn:
        lags = [r[0] for r in conn.execute(
            f"SELECT extract(epoch FROM c.flushed_at - c.created_at) {window} AND c.flushed_at IS NOT NULL ORDER BY 1",
            (names, since, until)).fetchall()]
        pending = conn.execute(f"SELECT count(*) {window} AND c.flushed_at IS NULL", (names, since, until)).fetchone()[0]
    if not lags:
        raise SystemExit(f"no flushed change of {', '.join(tables)} since {since}: is the service running?")
    goal, p95 = FRESHNESS_GOAL_S[cadence], percentile(lags, 0.95)
    return [
        Row("orchestration", f"changes of {len(tables)} table(s) made {since} - {until}, flushed "
            f"(still dirty: {pending})", len(lags), "changes", "", None),
        Row("orchestration", f"freshness lag, median (commit -> flushed), {cadence} cadence", percentile(lags, 0.5),
            "s", "", None),
        Row("orchestration", f"freshness lag, p95 (commit -> flushed), {cadence} cadence", p95, "s",
            f"<= {goal:.0f} s", p95 <= goal and pending == 0),
        Row("orchestration", "freshness lag, max", float(lags[-1]), "s", "", None),
    ]


def fresh_tables(count: int) -> tuple[str, list[str]]:
    """The demo table and count-1 more like it (created, owned and registered by the demo
    application, as `make run` does its own); returns the demo application's DSN and the tables."""
    admin = stack.admin_dsn()
    demo_dsn = roles.login_dsn(admin, stack.DEMO_ROLE, stack.demo_password())
    extra = [FRESH_TABLES.format(i) for i in range(1, count)]
    with pg.connect(admin) as conn:
        for name in extra:
            conn.execute(sql.SQL("""CREATE TABLE IF NOT EXISTS public.{} (
                                        order_id bigint PRIMARY KEY, customer text NOT NULL,
                                        amount numeric(12,2) NOT NULL, status text NOT NULL,
                                        updated_at timestamptz NOT NULL DEFAULT now())""").format(sql.Identifier(name)))
            conn.execute(sql.SQL("ALTER TABLE public.{} OWNER TO {}").format(sql.Identifier(name),
                                                                              sql.Identifier(stack.DEMO_ROLE)))
    with pg.connect(demo_dsn) as conn:
        for name in extra:
            conn.execute("SELECT coldharbor.register_table(%s)", (f"public.{name}",))
    return demo_dsn, [stack.DEMO_TABLE, *(f"public.{name}" for name in extra)]


def write_for(demo_dsn: str, tables: list[str], seconds: float) -> None:
    """Every WRITE_EVERY_S, on each table but the demo table (the service's workload writes that):
    5 inserts, an update and a delete, one transaction per table, as the service's workload does."""
    deadline = time.monotonic() + seconds
    with pg.connect(demo_dsn) as conn:
        while time.monotonic() < deadline:
            for table in tables[1:]:
                ident = sql.Identifier(*table.split("."))
                with conn.transaction():
                    top = conn.execute(sql.SQL("SELECT coalesce(max(order_id), 0) FROM {}").format(ident)).fetchone()[0]
                    conn.execute(sql.SQL("""INSERT INTO {} (order_id, customer, amount, status)
                                            SELECT %s + g, 'customer-' || (g %% 50), round((random() * 500)::numeric, 2),
                                                   'new' FROM generate_series(1, 5) g""").format(ident), (top,))
                    conn.execute(sql.SQL("UPDATE {} SET status = 'paid', updated_at = now() WHERE order_id = %s")
                                 .format(ident), (max(1, top - 3),))
                    conn.execute(sql.SQL("DELETE FROM {} WHERE order_id = %s").format(ident), (max(1, top - 7),))
            time.sleep(WRITE_EVERY_S)


def wait_flushed(dsn: str, tables: list[str], since: str, until: str, timeout_s: float = 300.0) -> None:
    names = [t.split(".")[-1] for t in tables]
    deadline = time.monotonic() + timeout_s
    with pg.connect(dsn) as conn:
        while time.monotonic() < deadline:
            pending = conn.execute("""SELECT count(*) FROM coldharbor.change_log c JOIN coldharbor.tables t USING (table_id)
                                       WHERE t.table_name = ANY(%s) AND c.created_at >= %s AND c.created_at < %s
                                         AND c.flushed_at IS NULL""", (names, since, until)).fetchone()[0]
            if pending == 0:
                return
            time.sleep(2)


def _now() -> str:
    return datetime.now(timezone.utc).isoformat()


# Issue 21's goal for one coldharbor_cdc run under `make run` (demo workload, warm engine).
DAG_RUN_GOAL_S = 10.0


def dag_runs(dag_id: str = "coldharbor_cdc", since: str | None = None) -> list[Row]:
    """Start-to-end wall time of the DAG's successful runs, as the service's Airflow recorded them
    (`airflow dags list-runs`, run against the service's AIRFLOW_HOME)."""
    env = {**os.environ, "AIRFLOW_HOME": str(settings.DATA_DIR / "airflow"), "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
           "AIRFLOW__CORE__DAGS_FOLDER": str(settings.PROJECT_DIR / "dags")}
    command = [os.path.join(os.path.dirname(sys.executable), "airflow"), "dags", "list-runs", dag_id,
               "--state", "success", "-o", "json", *(["--start-date", since] if since else [])]
    out = subprocess.run(command, env=env, check=True, capture_output=True, text=True).stdout
    runs = json.loads(next(line for line in out.splitlines() if line.startswith("[")))
    walls = sorted((datetime.fromisoformat(r["end_date"]) - datetime.fromisoformat(r["start_date"])).total_seconds()
                   for r in runs if r["start_date"] and r["end_date"])
    if not walls:
        raise SystemExit(f"no successful run of {dag_id}{' since ' + since if since else ''}: is `make run` going?")
    middle = percentile(walls, 0.5)
    return [
        Row("orchestration", f"{dag_id} successful runs{' since ' + since if since else ''}", len(walls), "runs", "", None),
        Row("orchestration", f"{dag_id} run, start to end: median", middle, "s", f"<= {DAG_RUN_GOAL_S:.0f} s",
            middle <= DAG_RUN_GOAL_S),
        Row("orchestration", f"{dag_id} run, start to end: p95", percentile(walls, 0.95), "s", "", None),
        Row("orchestration", f"{dag_id} run, start to end: max", walls[-1], "s", "", None),
    ]


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("what", choices=["cycle", "freshness", "dag-runs"])
    parser.add_argument("--since", help="freshness: changes made from this time; dag-runs: runs whose logical "
                                        "date is from this time (ISO 8601, UTC)")
    parser.add_argument("--until", help="freshness: ... until this time (ISO 8601, UTC)")
    parser.add_argument("--tables", type=int, help="freshness: write this many demo tables for --minutes and "
                                                       "measure them (instead of --since/--until)")
    parser.add_argument("--minutes", type=float, default=10.0, help="freshness --tables: how long to write")
    parser.add_argument("--cadence", choices=sorted(FRESHNESS_GOAL_S), default="minute",
                        help="freshness: the running service's COLDHARBOR_EXPORT_CADENCE (for the target)")
    parser.add_argument("--dirty-rows", type=int, default=10_000)
    args = parser.parse_args(argv)
    if args.what == "cycle":
        print(render(cycle(args.dirty_rows)))
    elif args.what == "dag-runs":
        print(render(dag_runs(since=args.since)))
    elif args.tables:
        if args.tables < 1:
            parser.error("--tables: at least 1")
        demo_dsn, tables = fresh_tables(args.tables)
        since = _now()
        write_for(demo_dsn, tables, args.minutes * 60)
        until = _now()
        wait_flushed(settings.pg_dsn(), tables, since, until)
        print(render(freshness(settings.pg_dsn(), since, until, tables, args.cadence)))
    elif args.since and args.until:
        print(render(freshness(settings.pg_dsn(), args.since, args.until, [stack.DEMO_TABLE], args.cadence)))
    else:
        parser.error("freshness: --tables N, or --since and --until")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""Warm-engine benchmark (issue 21): the figures of the issue's table, each job run the two ways
Coldharbor runs it, side by side in one run on one PostgreSQL and one lake:

- spark-submit: a JVM of its own per run (`spark_default` a classic master), as the DAGs ran
  every job before the Connect engine;
- Connect: the job's `main(argv)` in this process as a thin client of one long-lived Spark Connect
  server (`python -m coldharbor.runtime.engine serve`, as `make run` starts it), the way the Airflow
  operator runs it in the worker; and, for the small figures, the same job as a fresh Python
  process (`python jobs/x.py` with COLDHARBOR_SPARK_REMOTE), which adds the client's imports.

    python -m bench.engine                 every figure (about 25 minutes on 2 cores)
    python -m bench.engine --quick         one repeat each, 20 cycles for the RSS figure, no 1M-row export

The Connect figures are a warm server's: its first three export cycles are printed apart (the JIT
is still compiling: 3-12 s on 2 cores), then 30 cycles (`--warm-up`) run unmeasured before the rest.

Figures are printed, never asserted. The DAG-run and freshness figures need the running service:
`python -m bench.orchestration freshness` under `make run`.
"""

from __future__ import annotations

import argparse
import os
import runpy
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from coldharbor.embedded import service
from coldharbor.embedded.stack import free_port, throwaway_server
from coldharbor.runtime import engine, pg, settings
from coldharbor.runtime.spark import ivy_dir, maven_packages, release_sessions

from bench.common import Row, median, render

JOBS = settings.PROJECT_DIR / "jobs"
BIN = Path(sys.executable).parent


# How a job runs ---------------------------------------------------------------------------------

def job_env(dsn: str, remote: str | None = None) -> dict[str, str]:
    env = {**os.environ, settings.PG_DSN_ENV: dsn, "SPARK_LOCAL_IP": "127.0.0.1", "PYTHONPATH": str(JOBS),
           "PATH": os.pathsep.join([str(BIN), os.environ.get("PATH", "")])}
    env.pop(settings.SPARK_REMOTE_ENV, None)
    if remote:
        env[settings.SPARK_REMOTE_ENV] = remote
    return env


def submit(job: str, argv: list[str], dsn: str) -> float:
    """The job under spark-submit, as the DAG's task ran it: wall seconds."""
    command = [str(BIN / "spark-submit"), "--master", "local[2]", "--packages", ",".join(maven_packages()),
               "--conf", f"spark.jars.ivy={ivy_dir()}", "--conf", "spark.ui.enabled=false", str(JOBS / job), *argv]
    return _timed_process(job, command, job_env(dsn))


def client_process(job: str, argv: list[str], dsn: str, remote: str) -> float:
    """The job as a fresh Python process, a client of the Connect server: wall seconds."""
    return _timed_process(job, [sys.executable, str(JOBS / job), *argv], job_env(dsn, remote))


def _timed_process(job: str, command: list[str], env: dict[str, str]) -> float:
    start = time.perf_counter()
    done = subprocess.run(command, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if done.returncode != 0:
        said = [line for line in (done.stdout + done.stderr).splitlines() if " ERROR " in line or "Traceback" in line]
        raise SystemExit(f"{job} ({command[0]}) exited {done.returncode}: {' / '.join(said) or done.stderr[-2000:]}")
    return wall


_mains: dict[str, Callable[[list[str]], int]] = {}


def in_worker(job: str, argv: list[str], dsn: str, remote: str) -> float:
    """The job's main(argv) in this process, its session on the Connect server, released at the end
    (what coldharbor_airflow.connect_run does in an Airflow worker): wall seconds."""
    if job not in _mains:
        _mains[job] = runpy.run_path(str(JOBS / job), run_name="coldharbor_job")["main"]
    saved = dict(os.environ)
    os.environ.update({settings.PG_DSN_ENV: dsn, settings.SPARK_REMOTE_ENV: remote})
    start = time.perf_counter()
    try:
        code = _mains[job](argv)
    finally:
        release_sessions()
        os.environ.clear()
        os.environ.update(saved)
    wall = time.perf_counter() - start
    if code:
        raise SystemExit(f"{job} (Connect, in process) exited {code}")
    return wall


@contextmanager
def connect_server(log_file: Path) -> Iterator[tuple[str, int]]:
    """A Spark Connect server as `make run` starts one (coldharbor.runtime.engine serve, local[2], loopback),
    on a free port, in a process group of its own; yields its URL and that group's id."""
    port = free_port()
    with open(log_file, "a") as out:
        process = subprocess.Popen([sys.executable, "-m", "coldharbor.runtime.engine", "serve", "--port", str(port),
                                    "--master", "local[2]"], env={**service.engine_env(), "PYTHONPATH": str(JOBS)},
                                   stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        if not engine.wait_until_ready(engine.LOOPBACK, port, 600):
            raise SystemExit(f"the Spark Connect server did not start: see {log_file}")
        yield f"sc://127.0.0.1:{port}", process.pid
    finally:
        service.end_group("spark-connect", process.pid)
        process.wait(timeout=60)


def group_rss_mib(pgid: int) -> float:
    """Resident memory of every process in the server's process group (the driver JVM, and the
    Python workers it started), from /proc."""
    page = os.sysconf("SC_PAGE_SIZE")
    total = 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            fields = stat[stat.rindex(")") + 2:].split()
            if int(fields[2]) == pgid:  # fields after the name: state, ppid, pgrp, ...
                total += int(Path(f"/proc/{entry}/statm").read_text().split()[1]) * page
        except (OSError, ValueError, IndexError):
            continue  # a process that ended meanwhile
    return total / 2**20


@contextmanager
def workers_setting(workers: str | None) -> Iterator[None]:
    """COLDHARBOR_EXPORT_WORKERS for the block (None: unset, the default)."""
    saved = os.environ.pop(settings.EXPORT_WORKERS_ENV, None)
    if workers is not None:
        os.environ[settings.EXPORT_WORKERS_ENV] = workers
    try:
        yield
    finally:
        os.environ.pop(settings.EXPORT_WORKERS_ENV, None)
        if saved is not None:
            os.environ[settings.EXPORT_WORKERS_ENV] = saved


# Workload ---------------------------------------------------------------------------------------

WIDE = ", ".join([f"c{i} text" for i in range(1, 5)] + [f"n{i} bigint" for i in range(1, 5)])


def create_tables(admin: str, names: list[str], rows: int) -> None:
    """Registered tables of 10 columns (id, 4 text, 4 bigint, v) holding `rows` rows each."""
    with pg.connect(admin) as conn:
        for name in names:
            conn.execute(f"CREATE TABLE {name} (id bigint PRIMARY KEY, {WIDE}, v integer NOT NULL DEFAULT 0)")
            conn.execute(f"""INSERT INTO {name} SELECT g, md5(g::text), 'b' || g, 'c', 'd', g, g * 2, g % 7, 0
                               FROM generate_series(1, {rows}) g""")
            conn.execute("SELECT coldharbor.register_table(%s)", (name,))


def dirty(admin: str, names: list[str], rows: int) -> None:
    """`rows` changed rows in each table (updates of existing keys)."""
    with pg.connect(admin) as conn:
        for name in names:
            conn.execute(f"UPDATE {name} SET v = v + 1, c4 = md5(random()::text) WHERE id <= {rows}")


# Figures ----------------------------------------------------------------------------------------

def run(quick: bool, cycles: int, warm_up: int) -> list[Row]:
    repeats = 1 if quick else 3
    rows: list[Row] = []

    def pair(measure: str, submit_s: list[float], connect_s: list[float], target_s: float,
             fresh_s: list[float] | None = None) -> None:
        s, c = median(submit_s), median(connect_s)
        rows.append(Row("engine", f"{measure}: spark-submit", s, "s", "", None))
        rows.append(Row("engine", f"{measure}: Connect (in the worker)", c, "s", f"<= {target_s:g} s", c <= target_s))
        if fresh_s:
            rows.append(Row("engine", f"{measure}: Connect (fresh Python process)", median(fresh_s), "s", "", None))
        rows.append(Row("engine", f"{measure}: spark-submit / Connect", s / c, "x", "", None))

    with tempfile.TemporaryDirectory(prefix="coldharbor-bench-engine-") as folder, \
            throwaway_server(Path(folder)) as logins, connect_server(Path(folder) / "server.log") as (url, server):
        lake = f"{folder}/lake"
        dsn, admin = logins.pipeline, logins.admin
        export = ["--lake-root", lake]

        # One table of 100 rows, loaded: then the per-cycle figures.
        create_tables(admin, ["one_t"], 100)
        in_worker("cdc_export.py", export, dsn, url)  # the initial load (not measured)
        # A server runs for days: its JVM has compiled the export's hot paths long before the cycles
        # that count. Its first cycles are printed apart, then `warm_up` more run unmeasured.
        first = []
        for _ in range(3):
            dirty(admin, ["one_t"], 100)
            first.append(in_worker("cdc_export.py", export, dsn, url))
        rows.append(Row("engine", "export cycle, 100 dirty rows: Connect, first 3 after the server started",
                        median(first), "s", "", None))
        for _ in range(warm_up):
            dirty(admin, ["one_t"], 100)
            in_worker("cdc_export.py", export, dsn, url)
        in_worker("cdc_export.py", export, dsn, url)
        idle = ([], [], [])
        for _ in range(repeats):
            idle[0].append(submit("cdc_export.py", export, dsn))
            idle[1].append(in_worker("cdc_export.py", export, dsn, url))
            idle[2].append(client_process("cdc_export.py", export, dsn, url))
        pair("export cycle, nothing dirty", idle[0], idle[1], 0.5, idle[2])
        for changed, target in [(100, 2.0), (10_000, 3.0)]:
            runs: tuple[list[float], list[float], list[float]] = ([], [], [])
            if changed > 100:
                with pg.connect(admin) as conn:
                    conn.execute(f"""INSERT INTO one_t SELECT g, md5(g::text), 'b', 'c', 'd', g, g, g, 0
                                       FROM generate_series(101, {changed}) g ON CONFLICT DO NOTHING""")
                in_worker("cdc_export.py", export, dsn, url)
            for _ in range(repeats):
                for i, how in enumerate((lambda: submit("cdc_export.py", export, dsn),
                                         lambda: in_worker("cdc_export.py", export, dsn, url),
                                         lambda: client_process("cdc_export.py", export, dsn, url))):
                    dirty(admin, ["one_t"], changed)
                    runs[i].append(how())
            pair(f"export cycle, 1 table, {changed:,} dirty rows", runs[0], runs[1], target, runs[2])

        # A small report: 10,000 rows of one_t, written to reports.<target>.
        report = ["--sql", "SELECT id, c1, n1, v FROM one_t", "--target", "adhoc_bench_small", "--lake-root", lake]
        dirty(admin, ["one_t"], 50)
        small = ([], [], [])
        for _ in range(repeats):
            small[0].append(submit("serve_report.py", report, dsn))
            small[1].append(in_worker("serve_report.py", report, dsn, url))
            small[2].append(client_process("serve_report.py", report, dsn, url))
        pair("small report (10,000 rows) end to end", small[0], small[1], 3.0, small[2])

        # 50 tables with 200 dirty rows each: one cycle. Under spark-submit the DAG mapped one
        # submit per dirty table: measured for 3 tables, times 50.
        many = [f"many_{i:02d}" for i in range(50)]
        create_tables(admin, many, 200)
        in_worker("cdc_export.py", export, dsn, url)  # their initial loads
        # The default (as many tables at once as the server has cores, at most 4) against one table
        # at a time, alternating; each the median of 3 cycles (a 50-table cycle varies by seconds,
        # and every 10th commit of a table writes a Delta checkpoint, here all 50 in one cycle).
        walls: dict[str, list[float]] = {"default": [], "1": []}
        for _ in range(3):
            for workers in walls:
                dirty(admin, many, 200)
                with workers_setting(None if workers == "default" else workers):
                    walls[workers].append(in_worker("cdc_export.py", export, dsn, url))
        connect_wall, one_at_a_time = median(walls["default"]), median(walls["1"])
        dirty(admin, many, 200)
        per_table = median([submit("cdc_export.py", [*export, "--table", f"public.{name}"], dsn) for name in many[:3]])
        submit("cdc_export.py", export, dsn)  # the rest, so every table is clean again (not measured)
        dirty(admin, many, 200)
        one_submit = submit("cdc_export.py", export, dsn)
        rows.append(Row("engine", "50 tables x 200 dirty rows: spark-submit per table (3 measured, x 50)",
                        per_table * 50, "s", "", None))
        rows.append(Row("engine", "50 tables x 200 dirty rows: one spark-submit, every table", one_submit, "s", "", None))
        rows.append(Row("engine", "50 tables x 200 dirty rows: Connect, one cycle, one table at a time", one_at_a_time,
                        "s", "", None))
        rows.append(Row("engine", "50 tables x 200 dirty rows: Connect, one cycle", connect_wall, "s", "<= 30 s",
                        connect_wall <= 30))
        rows.append(Row("engine", "50 tables: spark-submit per table / Connect", per_table * 50 / connect_wall, "x",
                        "", None))

        if not quick:
            rows += big_export(admin, dsn, url, export, repeats)

        # The server's memory over many cycles, each with a few dirty rows in one table.
        rss = {}
        for cycle in range(1, cycles + 1):
            dirty(admin, ["one_t"], 20)
            in_worker("cdc_export.py", [*export, "--table", "public.one_t"], dsn, url)
            if cycle in (10, cycles):
                rss[cycle] = group_rss_mib(server)
        rows.append(Row("engine", "server RSS after 10 cycles", rss[10], "MiB", "", None))
        rows.append(Row("engine", f"server RSS after {cycles} cycles", rss[cycles], "MiB", "", None))
        rows.append(Row("engine", f"server RSS, {cycles} cycles / 10", rss[cycles] / rss[10], "x", "<= 1.2x",
                        rss[cycles] / rss[10] <= 1.2))
    return rows


def big_export(admin: str, dsn: str, url: str, export: list[str], repeats: int) -> list[Row]:
    """1,000,000 changed rows of a 10-column table exported in one cycle: spark-submit once, then
    Connect `repeats` times (their median), each after the whole table was changed again."""
    create_tables(admin, ["big_t"], 1_000_000)
    big = [*export, "--table", "public.big_t"]
    in_worker("cdc_export.py", big, dsn, url)  # its initial load
    dirty(admin, ["big_t"], 1_000_000)
    big_submit = submit("cdc_export.py", big, dsn)
    connect = []
    for _ in range(repeats):
        dirty(admin, ["big_t"], 1_000_000)
        connect.append(in_worker("cdc_export.py", big, dsn, url))
    big_connect = median(connect)
    return [Row("engine", "export of 1,000,000 changed rows, 10 columns: spark-submit", 1_000_000 / big_submit,
                "rows/s", "", None),
            Row("engine", "export of 1,000,000 changed rows, 10 columns: Connect", 1_000_000 / big_connect,
                "rows/s", ">= 100,000 rows/s", 1_000_000 / big_connect >= 100_000),
            Row("engine", "export of 1,000,000 changed rows: Connect / spark-submit", big_submit / big_connect, "x",
                "", None)]


def run_big(repeats: int) -> list[Row]:
    with tempfile.TemporaryDirectory(prefix="coldharbor-bench-engine-") as folder, \
            throwaway_server(Path(folder)) as logins, connect_server(Path(folder) / "server.log") as (url, _):
        return big_export(logins.admin, logins.pipeline, url, ["--lake-root", f"{folder}/lake"], repeats)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="one repeat each, 20 cycles, no 1M-row export")
    parser.add_argument("--big-only", action="store_true",
                        help="only the 1,000,000-row export (spark-submit once, Connect 3 times)")
    parser.add_argument("--cycles", type=int, help="export cycles for the RSS figure (default 500; --quick 20)")
    parser.add_argument("--warm-up", type=int, default=30,
                        help="unmeasured export cycles before the per-cycle figures (default 30)")
    args = parser.parse_args(argv)
    cycles = args.cycles or (20 if args.quick else 500)
    if cycles < 10:
        parser.error("--cycles must be at least 10")
    if args.warm_up < 0:
        parser.error("--warm-up must not be negative")
    print(render(run_big(3) if args.big_only else run(args.quick, cycles, args.warm_up)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""The consistency suite's long profile: many seeds, every crash point, one summary line.

    python -m tests.consistency.long_run --seeds 20 --steps 40     (or: make consistency)
    python -m tests.consistency.long_run --engine connect          (or: make consistency ENGINE=connect)

Each seed runs `--steps` random steps with two crash points (taken in turn, so every point is
exercised once every three seeds) against a fresh embedded PostgreSQL and one Spark session, and
prints its figures. With `--engine connect` the run starts a Spark Connect server of its own and
every job is its client (the crashed ones killed as clients; see harness.py). The last line reads
`N operations × M seeds × K crash points: V violations`.
A failing seed is appended to tests/consistency/regressions.json, which the normal test run
replays (test_regressions.py), and the run exits 1.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
import traceback
from contextlib import ExitStack
from pathlib import Path

REGRESSIONS = Path(__file__).resolve().parent / "regressions.json"


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.consistency.long_run", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, default=20, help="how many seeds (default 20)")
    parser.add_argument("--first-seed", type=int, default=1000, help="the first seed (default 1000)")
    parser.add_argument("--steps", type=int, default=40, help="random steps per seed (default 40)")
    parser.add_argument("--engine", choices=["spark-submit", "connect"], default="spark-submit",
                        help="how the jobs run: spark-submit and an in-process session (default), or as "
                             "clients of a Spark Connect server the run starts")
    args = parser.parse_args(argv)

    os.environ["TZ"] = "UTC"
    time.tzset()
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("COLDHARBOR_SPARK_MASTER", "local[2]")
    from coldharbor.embedded.stack import throwaway_server

    from tests.consistency.harness import (
        CRASH_POINTS,
        LOAD_POINTS,
        CrashPointNotReached,
        OrphanNotSettled,
        run_sequence,
    )

    # Two crash points per seed, and every other seed also kills its table's initial load.
    points = sorted(p for p in CRASH_POINTS if p not in LOAD_POINTS)
    operations, violations, exercised = 0, 0, set()
    with tempfile.TemporaryDirectory(prefix="coldharbor-consistency-") as folder, ExitStack() as stack:
        logins = stack.enter_context(throwaway_server(Path(folder) / "pg"))
        dsn = logins.pipeline
        os.environ["COLDHARBOR_PG_DSN"] = dsn
        spark, connect_url = _session(args.engine, Path(folder), stack)
        for n, seed in enumerate(range(args.first_seed, args.first_seed + args.seeds)):
            crash_points = [points[(2 * n) % len(points)], points[(2 * n + 1) % len(points)]]
            if n % 2 == 0:
                crash_points.append(LOAD_POINTS[(n // 2) % len(LOAD_POINTS)])
            workdir = Path(folder) / f"seed-{seed}"
            workdir.mkdir()
            started = time.monotonic()
            try:
                outcome = run_sequence(seed, args.steps, crash_points, spark=spark, dsn=dsn, admin_dsn=logins.admin,
                                       workdir=workdir, connect_url=connect_url)
            except (CrashPointNotReached, OrphanNotSettled):
                raise  # a harness error, not a finding: stop and show it
            except AssertionError as exc:
                violations += 1
                print(f"seed {seed}: VIOLATION\n{exc}", flush=True)
                _keep(seed, args.steps, crash_points, args.engine, str(exc).splitlines()[0])
                continue
            except Exception:
                violations += 1
                print(f"seed {seed}: ERROR\n{traceback.format_exc()}", flush=True)
                _keep(seed, args.steps, crash_points, args.engine, traceback.format_exc().splitlines()[-1])
                continue
            operations += outcome.steps
            exercised |= set(outcome.crashes)
            print(f"seed {seed}: {outcome.steps} steps, {outcome.reports} reports checked, crashes at "
                  f"{', '.join(outcome.crashes)}: ok ({time.monotonic() - started:.0f} s)", flush=True)
    print(f"{operations} operations × {args.seeds} seeds × {len(exercised)} crash points: {violations} violations"
          f"{' (jobs as Spark Connect clients)' if connect_url else ''}")
    return 1 if violations else 0


def _session(engine: str, folder: Path, stack: ExitStack):
    """(the harness's Spark session, the Connect server's URL or None): a classic session, or a
    Spark Connect server started for the run (stopped at its end) and a session on it."""
    from coldharbor.runtime.spark import REMOTE_ENV, connect_session, get_session

    if engine == "spark-submit":
        spark = get_session("coldharbor-consistency")
        spark.sparkContext.setLogLevel("ERROR")
        stack.callback(spark.stop)
        return spark, None
    from tests.connect_server import running_server

    server_folder = folder / "connect"
    server_folder.mkdir()
    server = stack.enter_context(running_server(server_folder))
    os.environ[REMOTE_ENV] = server.url  # the reports the harness serves in this process
    spark = connect_session(server.url, "coldharbor-consistency")
    stack.callback(spark.stop)
    return spark, server.url


def _keep(seed: int, steps: int, crash_points: list[str], engine: str, message: str) -> None:
    kept = json.loads(REGRESSIONS.read_text()) if REGRESSIONS.exists() else []
    case = {"seed": seed, "steps": steps, "crash_points": crash_points, "found": message}
    if engine != "spark-submit":
        case["engine"] = engine
    kept.append(case)
    REGRESSIONS.write_text(json.dumps(kept, indent=2) + "\n")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""The consistency suite's long profile: many seeds, every crash point, one summary line.

    python -m tests.consistency.long_run --seeds 20 --steps 40     (or: make consistency)

Each seed runs `--steps` random steps with two crash points (taken in turn, so every point is
exercised once every three seeds) against a fresh embedded PostgreSQL and one Spark session, and
prints its figures. The last line reads `N operations × M seeds × K crash points: V violations`.
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
from pathlib import Path

REGRESSIONS = Path(__file__).resolve().parent / "regressions.json"


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.consistency.long_run", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, default=20, help="how many seeds (default 20)")
    parser.add_argument("--first-seed", type=int, default=1000, help="the first seed (default 1000)")
    parser.add_argument("--steps", type=int, default=40, help="random steps per seed (default 40)")
    args = parser.parse_args(argv)

    os.environ["TZ"] = "UTC"
    time.tzset()
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("COLDHARBOR_SPARK_MASTER", "local[2]")
    from coldharbor.spark import get_session
    from coldharbor.stack import throwaway_server
    from tests.consistency.harness import CRASH_POINTS, LOAD_POINTS, CrashPointNotReached, run_sequence

    # Two crash points per seed, and every other seed also kills its table's initial load.
    points = sorted(p for p in CRASH_POINTS if p not in LOAD_POINTS)
    operations, violations, exercised = 0, 0, set()
    with tempfile.TemporaryDirectory(prefix="coldharbor-consistency-") as folder, \
            throwaway_server(Path(folder) / "pg") as logins:
        dsn = logins.pipeline
        os.environ["COLDHARBOR_PG_DSN"] = dsn
        spark = get_session("coldharbor-consistency")
        spark.sparkContext.setLogLevel("ERROR")
        for n, seed in enumerate(range(args.first_seed, args.first_seed + args.seeds)):
            crash_points = [points[(2 * n) % len(points)], points[(2 * n + 1) % len(points)]]
            if n % 2 == 0:
                crash_points.append(LOAD_POINTS[(n // 2) % len(LOAD_POINTS)])
            workdir = Path(folder) / f"seed-{seed}"
            workdir.mkdir()
            started = time.monotonic()
            try:
                outcome = run_sequence(seed, args.steps, crash_points, spark=spark, dsn=dsn, admin_dsn=logins.admin,
                                       workdir=workdir)
            except CrashPointNotReached:
                raise  # a harness error, not a finding: stop and show it
            except AssertionError as exc:
                violations += 1
                print(f"seed {seed}: VIOLATION\n{exc}", flush=True)
                _keep(seed, args.steps, crash_points, str(exc).splitlines()[0])
                continue
            except Exception:
                violations += 1
                print(f"seed {seed}: ERROR\n{traceback.format_exc()}", flush=True)
                _keep(seed, args.steps, crash_points, traceback.format_exc().splitlines()[-1])
                continue
            operations += outcome.steps
            exercised |= set(outcome.crashes)
            print(f"seed {seed}: {outcome.steps} steps, {outcome.reports} reports checked, crashes at "
                  f"{', '.join(outcome.crashes)}: ok ({time.monotonic() - started:.0f} s)", flush=True)
        spark.stop()
    print(f"{operations} operations × {args.seeds} seeds × {len(exercised)} crash points: {violations} violations")
    return 1 if violations else 0


def _keep(seed: int, steps: int, crash_points: list[str], message: str) -> None:
    kept = json.loads(REGRESSIONS.read_text()) if REGRESSIONS.exists() else []
    kept.append({"seed": seed, "steps": steps, "crash_points": crash_points, "found": message})
    REGRESSIONS.write_text(json.dumps(kept, indent=2) + "\n")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

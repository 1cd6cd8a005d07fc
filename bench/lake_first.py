"""A lake-first table under a steady insert workload: what it ingests, what the export moves, and how
big PostgreSQL's landing table stays.

    python -m bench.lake_first [--minutes 60] [--rate 500] [--cycle 60] [--initial 100000]

A table registered with `--initial` rows already in it (`p_mode => 'lake_first'`) takes `--rate`
inserts a second, in statements of a tenth of a second's worth, for `--minutes`, while the CDC
export job (its main(), as the DAG runs it, in this process on local[2]) runs every `--cycle`
seconds, start to start, as the per-minute schedule does. Every second the landing table's rows
are counted. Measured in one run:
- the insert rate PostgreSQL kept up (the writer falls behind rather than queue),
- rows exported per second of export run, and the time each run took (median and highest),
- the landing table's size: highest while the workload ran, against one cycle's worth of rows
  (`--rate` x `--cycle`): the goal is that it stays bounded by one export cycle's rows (the rows
  an export's snapshot missed wait one more cycle, so the target allows a quarter more), and that
  the last ten minutes peak no higher than the first ten (it does not grow),
- at the end, after a last export: every row in the lake exactly once, none left in PostgreSQL.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import threading
import time

import psycopg

from bench.common import Row, median, render, temporary_postgres

TABLE = "public.bench_events"
COLUMNS = """id bigint PRIMARY KEY, at timestamptz NOT NULL DEFAULT now(), kind text NOT NULL,
             payload text NOT NULL, amount numeric(12,2) NOT NULL"""
INSERT = """INSERT INTO bench_events (id, kind, payload, amount)
            SELECT g, 'kind-' || (g %% 17), repeat(md5(g::text), 3), (g %% 100000) / 100.0
              FROM generate_series(%s::bigint, %s::bigint) g"""


def writer(dsn: str, rate: int, first_id: int, stop: threading.Event, inserted: list[int]) -> None:
    """Inserts `rate` rows a second in ten statements a second until `stop`; never catches up on
    time lost (a slow statement lowers the rate, as an application would see it)."""
    per_tick = max(1, rate // 10)
    next_id = first_id
    with psycopg.connect(dsn, autocommit=True) as conn:
        tick = time.monotonic()
        while not stop.is_set():
            conn.execute(INSERT, (next_id, next_id + per_tick - 1))
            next_id += per_tick
            inserted[0] += per_tick
            tick += 0.1
            delay = tick - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            else:
                tick = time.monotonic()


def sampler(dsn: str, stop: threading.Event, sizes: list[tuple[float, int]]) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        start = time.monotonic()
        while not stop.is_set():
            sizes.append((time.monotonic() - start, conn.execute("SELECT count(*) FROM bench_events").fetchone()[0]))
            stop.wait(1.0)


def run(minutes: float = 60, rate: int = 500, cycle: float = 60, initial: int = 100_000) -> list[Row]:
    from coldharbor.export import export_job as export_job
    from coldharbor.runtime.spark import get_session

    spark = get_session("coldharbor-bench-lake-first")
    with temporary_postgres() as dsn, tempfile.TemporaryDirectory(prefix="coldharbor-bench-lake-") as lake_root:
        os.environ["COLDHARBOR_PG_DSN"] = dsn
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(f"CREATE TABLE bench_events ({COLUMNS})")
            conn.execute(INSERT, (1, initial))
            conn.execute("SELECT coldharbor.register_table(%s, p_mode => 'lake_first')", (TABLE,))
        args = ["--table", TABLE, "--lake-root", lake_root]
        load_start = time.perf_counter()
        assert export_job.main(args) == 0
        load_s = time.perf_counter() - load_start

        stop, inserted, sizes = threading.Event(), [0], []
        threads = [threading.Thread(target=writer, args=(dsn, rate, initial + 1, stop, inserted)),
                   threading.Thread(target=sampler, args=(dsn, stop, sizes))]
        for thread in threads:
            thread.start()
        runs: list[tuple[float, int]] = []   # (seconds, rows exported)
        began = time.monotonic()
        next_run = began + cycle
        try:
            while time.monotonic() - began < minutes * 60:
                time.sleep(max(0.0, next_run - time.monotonic()))
                next_run += cycle
                with psycopg.connect(dsn, autocommit=True) as conn:
                    flushed_before = conn.execute("SELECT count(*) FROM coldharbor.change_log "
                                                  "WHERE flushed_at IS NOT NULL").fetchone()[0]
                started = time.perf_counter()
                assert export_job.main(args) == 0
                seconds = time.perf_counter() - started
                with psycopg.connect(dsn, autocommit=True) as conn:
                    flushed = conn.execute("SELECT count(*) FROM coldharbor.change_log "
                                           "WHERE flushed_at IS NOT NULL").fetchone()[0] - flushed_before
                runs.append((seconds, flushed))
                print(f"export {len(runs)}: {flushed:,} rows in {seconds:.1f} s; landing table "
                      f"{sizes[-1][1] if sizes else 0:,} rows", flush=True)
        finally:
            stop.set()
            for thread in threads:
                thread.join()
        elapsed = time.monotonic() - began
        assert export_job.main(args) == 0
        with psycopg.connect(dsn, autocommit=True) as conn:
            left = conn.execute("SELECT count(*) FROM bench_events").fetchone()[0]
        lake = spark.read.format("delta").load(f"{lake_root}/public/bench_events")
        in_lake, distinct = lake.count(), lake.select("id").distinct().count()
    spark.stop()

    total = initial + inserted[0]
    per_cycle = rate * cycle
    during = [n for at, n in sizes if at >= cycle]   # after the first export of the workload
    first = [n for at, n in sizes if cycle <= at < cycle + 600]
    last = [n for at, n in sizes if at >= elapsed - 600]
    peak = max(during) if during else 0
    exported = sum(n for _, n in runs)
    export_s = sum(s for s, _ in runs)
    exact = in_lake == distinct == total and left == 0
    return [
        Row("lake-first", f"initial load of {initial:,} rows, then removed", initial / load_s, "rows/s", "-", None),
        Row("lake-first", f"inserts kept up, offered {rate:,}/s for {elapsed / 60:.0f} min", inserted[0] / elapsed,
            "rows/s", "-", None),
        Row("lake-first", f"exported per second of export run ({len(runs)} runs)", exported / export_s,
            "rows/s", "-", None),
        Row("lake-first", "export run, median", median([s for s, _ in runs]), "s", "-", None),
        Row("lake-first", "export run, highest", max(s for s, _ in runs), "s", f"< {cycle:.0f} s",
            max(s for s, _ in runs) < cycle),
        Row("lake-first", f"landing table, highest ({per_cycle:,.0f} rows a cycle)", peak, "rows", "-", None),
        Row("lake-first", "landing table highest / one cycle's rows", peak / per_cycle, "x", "<= 1.25x",
            peak / per_cycle <= 1.25),
        Row("lake-first", "highest in the last 10 min / first 10 min", max(last) / max(first) if first and last else 0,
            "x", "<= 1.10x", bool(first and last) and max(last) <= 1.10 * max(first)),
        Row("lake-first", f"rows in the lake at the end ({total:,} inserted), left in PostgreSQL: {left}",
            in_lake, "rows", "all, once", exact),
    ]


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.lake_first", description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=60)
    parser.add_argument("--rate", type=int, default=500, help="inserts a second")
    parser.add_argument("--cycle", type=float, default=60, help="seconds between export runs, start to start")
    parser.add_argument("--initial", type=int, default=100_000, help="rows in the table when it is registered")
    args = parser.parse_args(argv)
    print(render(run(args.minutes, args.rate, args.cycle, args.initial)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

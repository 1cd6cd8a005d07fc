"""Exact history (issue 26): what keeping every change's image costs, and what it answers.

    python -m bench.exact_history [--keys 100000] [--changes-per-key 5] [--minutes 6] [--rounds 3]
                                  [--parts capture,export,as-of]

Side by side in one run:
- capture: single-row and bulk writes (bench.write_path's workload) on a table without capture,
  one registered with the default history ('latest') and one with p_history => 'exact' (its
  image, and since sql/migrations/024 the hash of the row before each update and delete); rounds
  interleaved, medians. The issue's goal: images add at most 15 points to the trigger's cost.
- export: `--keys` keys changed `--changes-per-key` times each, exported in one batch from a
  'latest' table (one lake row per key) and an 'exact' one (one row per change), in-process on
  warm Spark: changes per second and lake rows per second.
- as-of: two tables, one of each history, written 25 times a second for `--minutes` minutes (each
  transaction updates a random key of 50 in both, so a key changes every two seconds), exported
  every minute meanwhile; then as-of reports for 20 instants spread from one minute old to the
  oldest written, on both tables: the share answered, and each answer checked against the table as
  PostgreSQL held it at that instant (recorded each second by the writer, as of the instant). The
  issue asks for instants 1-60 minutes old; an hour of writing is `--minutes 61`.
Timings are printed, never asserted.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import tempfile
import threading
import time
from datetime import timedelta

from coldharbor.runtime import pg

from bench.common import Row, median, render, temporary_postgres, timed
from bench.write_path import FILL, TEN_COLUMNS, _bulk_rate, _single_row_rate

HISTORIES = ("latest", "exact")


def capture_overhead(dsn: str, single_n: int, bulk_n: int, rounds: int) -> list[Row]:
    names = {"none": "plain_t", "latest": "latest_t", "exact": "exact_t"}
    with pg.connect(dsn) as conn:
        for name in names.values():
            conn.execute(f"CREATE TABLE {name} ({TEN_COLUMNS})")
        for history in HISTORIES:
            conn.execute("SELECT coldharbor.register_table(%s, p_history => %s)", (names[history], history))
        single: dict[str, list[float]] = {k: [] for k in names}
        bulk: dict[str, list[float]] = {k: [] for k in names}
        for r in range(rounds):
            order = list(names)[r % 3:] + list(names)[:r % 3]
            for kind in order:
                single[kind].append(_single_row_rate(conn, names[kind], single_n, 10_000_000 + r * single_n))
                bulk[kind].append(_bulk_rate(conn, names[kind], bulk_n, 20_000_000 + r * bulk_n))
    rows = []
    for label, rates in (("single-row", single), ("bulk", bulk)):
        plain = median(rates["none"])
        cost = {h: (1 - median(rates[h]) / plain) * 100 for h in HISTORIES}
        rows += [Row("exact history", f"capture, {label}: writes without capture", plain, "rows/s", "", None)]
        rows += [Row("exact history", f"capture, {label}: trigger cost, history '{h}'", cost[h], "%", "", None)
                 for h in HISTORIES]
        added = cost["exact"] - cost["latest"]
        rows.append(Row("exact history", f"capture, {label}: points images add", added, "points", "<= 15",
                        added <= 15))
    return rows


def export_throughput(dsn: str, lake_root: str, keys: int, per_key: int) -> list[Row]:
    from coldharbor.capture.registry import load
    from coldharbor.export import export_job as export_job
    from coldharbor.export.table_export import ExportConfig, export_table
    from coldharbor.runtime.spark import get_session

    os.environ["COLDHARBOR_PG_DSN"] = dsn
    spark = get_session("coldharbor-bench-exact-history")
    rows: list[Row] = []
    seconds = {}
    with pg.connect(dsn) as conn:
        for history in HISTORIES:  # each path once on a small table first: the JIT warms up on both
            name = f"warm_{history}"
            conn.execute(f"CREATE TABLE {name} ({TEN_COLUMNS})")
            conn.execute("SELECT coldharbor.register_table(%s, p_history => %s)", (name, history))
            conn.execute(FILL.format(t=name, start=1, stop=5_000))
            conn.execute(f"UPDATE {name} SET qty = qty + 1")
            assert export_job.main(["--table", name, "--lake-root", lake_root]) == 0
        for history in HISTORIES:
            name = f"export_{history}"
            conn.execute(f"CREATE TABLE {name} ({TEN_COLUMNS})")
            conn.execute("SELECT coldharbor.register_table(%s, p_history => %s)", (name, history))
            assert export_job.main(["--table", name, "--lake-root", lake_root]) == 0  # creates nothing: empty
            conn.execute(FILL.format(t=name, start=1, stop=keys))
            for _ in range(per_key - 1):
                conn.execute(f"UPDATE {name} SET qty = qty + 1, updated_at = now()")
            conn.execute(f"VACUUM ANALYZE {name}")
        conn.execute("VACUUM ANALYZE coldharbor.change_log")
        image_bytes = conn.execute(
            "SELECT avg(coalesce(pg_column_size(c.image), 0)), avg(pg_column_size(c.*)) FROM coldharbor.change_log c "
            "JOIN coldharbor.tables t USING (table_id) WHERE t.table_name = 'export_exact'").fetchone()
        rows += [Row("exact history", "change_log: bytes of a 10-column row image", float(image_bytes[0]), "bytes",
                     "", None),
                 Row("exact history", "change_log: bytes of a change row with its image", float(image_bytes[1]),
                     "bytes", "", None)]
        for history in HISTORIES:
            name = f"public.export_{history}"
            [table] = load(conn, name)
            config = ExportConfig(table=name, lake_root=lake_root, run_id=f"bench-{history}")
            result = {}
            seconds[history] = timed(lambda result=result, table=table, config=config: result.update(
                r=export_table(spark, conn, pg.JdbcTarget.from_dsn(dsn), table, config)))
            written = result["r"]
            expected = keys * per_key if history == "exact" else keys
            assert (written.changes, written.rows) == (keys * per_key, expected), written
            rows += [Row("exact history", f"export, history '{history}': {keys * per_key:,} changes of {keys:,} keys",
                         seconds[history], "s", "", None),
                     Row("exact history", f"export, history '{history}': changes per second",
                         keys * per_key / seconds[history], "changes/s", "", None),
                     Row("exact history", f"export, history '{history}': lake rows per second",
                         expected / seconds[history], "rows/s", "", None)]
    rows.append(Row("exact history", "export: 'exact' / 'latest' time", seconds["exact"] / seconds["latest"], "x",
                    "", None))
    return rows


class BusyWriter(threading.Thread):
    """25 transactions a second, each updating one random key of 50 in both tables; every second
    the tables' contents are recorded with the instant they held (read in one snapshot)."""

    def __init__(self, dsn: str, minutes: float):
        super().__init__(daemon=True)
        self.dsn, self.until = dsn, time.monotonic() + minutes * 60
        self.states: list[tuple] = []     # (instant, {history: {id: v}})
        self.error: Exception | None = None

    def run(self) -> None:
        try:
            rng = random.Random(26)
            with pg.connect(self.dsn) as conn:
                next_record, n = 0.0, 0
                while time.monotonic() < self.until:
                    started = time.monotonic()
                    key, n = rng.randint(1, 50), n + 1
                    with conn.transaction():
                        for history in HISTORIES:
                            conn.execute(f"UPDATE busy_{history} SET v = %s WHERE id = %s", (f"w{n}", key))
                    if started >= next_record:
                        self.record(conn)
                        next_record = started + 1
                    time.sleep(max(0.0, 0.04 - (time.monotonic() - started)))
        except Exception as exc:  # noqa: BLE001 - the caller raises it
            self.error = exc

    def record(self, conn) -> None:
        with conn.transaction():
            conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
            at = conn.execute("SELECT clock_timestamp()").fetchone()[0]
            # Commit timestamps up to `at` are in the snapshot taken by the first query after it.
            state = {h: dict(conn.execute(f"SELECT id, v FROM busy_{h}").fetchall()) for h in HISTORIES}
        self.states.append((at, state))


def as_of_share(dsn: str, lake_root: str, minutes: float, instants: int = 20) -> list[Row]:
    from coldharbor.export import export_job as export_job
    from coldharbor.serve import serve_cli

    os.environ["COLDHARBOR_PG_DSN"] = dsn
    os.environ["COLDHARBOR_HISTORY_WINDOW_HOURS"] = str(max(2, int(minutes / 60) + 2))
    with pg.connect(dsn) as conn:
        for history in HISTORIES:
            conn.execute(f"CREATE TABLE busy_{history} (id int PRIMARY KEY, v text NOT NULL)")
            conn.execute(f"INSERT INTO busy_{history} SELECT g, 'w0' FROM generate_series(1, 50) g")
            conn.execute("SELECT coldharbor.register_table(%s, p_history => %s)", (f"busy_{history}", history))
            assert export_job.main(["--table", f"busy_{history}", "--lake-root", lake_root]) == 0
        writer = BusyWriter(dsn, minutes)
        writer.start()
        while writer.is_alive():
            writer.join(timeout=60)
            for history in HISTORIES:
                assert export_job.main(["--table", f"busy_{history}", "--lake-root", lake_root]) == 0
        if writer.error is not None:
            raise writer.error
        for history in HISTORIES:
            assert export_job.main(["--table", f"busy_{history}", "--lake-root", lake_root]) == 0
        now = conn.execute("SELECT clock_timestamp()").fetchone()[0]
        candidates = [s for s in writer.states if s[0] <= now - timedelta(minutes=1)]
        step = max(1, len(candidates) // instants)
        chosen = candidates[::step][:instants]
        answered = {h: 0 for h in HISTORIES}
        for at, state in chosen:
            for history in HISTORIES:
                code = serve_cli.main(["--lake-root", lake_root, "--sql", f"SELECT * FROM busy_{history}",
                                       "--target", f"adhoc_busy_{history}", "--as-of", at.isoformat()])
                if code == 0:
                    served = dict(conn.execute(f"SELECT id, v FROM reports.adhoc_busy_{history}").fetchall())
                    if served != state[history]:
                        raise AssertionError(f"as-of {at.isoformat()} on busy_{history}: a wrong answer")
                    answered[history] += 1
    oldest = (now - chosen[0][0]).total_seconds() / 60 if chosen else 0
    rows = [Row("exact history", f"as-of, 25 writes/s, {len(chosen)} instants 1-{oldest:.0f} min old: "
                f"answered, history '{h}'", answered[h] / max(1, len(chosen)) * 100, "%",
                "100 %" if h == "exact" else "", (answered[h] == len(chosen)) if h == "exact" else None)
            for h in HISTORIES]
    return rows


PARTS = ("capture", "export", "as-of")


def run(keys: int = 100_000, per_key: int = 5, minutes: float = 6, rounds: int = 3,
        single_n: int = 2_000, bulk_n: int = 100_000, parts: tuple[str, ...] = PARTS) -> list[Row]:
    results: list[Row] = []
    with temporary_postgres() as dsn, tempfile.TemporaryDirectory(prefix="coldharbor-lake-") as lake_root:
        if "capture" in parts:
            results += capture_overhead(dsn, single_n, bulk_n, rounds)
        if "export" in parts:
            results += export_throughput(dsn, lake_root, keys, per_key)
        if "as-of" in parts:
            results += as_of_share(dsn, lake_root, minutes)
    return results


def _parts(text: str) -> tuple[str, ...]:
    parts = tuple(p.strip() for p in text.split(","))
    unknown = [p for p in parts if p not in PARTS]
    if unknown or not parts:
        raise argparse.ArgumentTypeError(f"unknown part(s) {', '.join(map(repr, unknown))}; "
                                         f"choose from {', '.join(PARTS)}")
    return parts


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--keys", type=int, default=100_000)
    parser.add_argument("--changes-per-key", type=int, default=5)
    parser.add_argument("--minutes", type=float, default=6)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--parts", type=_parts, default=PARTS, help="comma-separated: " + ", ".join(PARTS))
    args = parser.parse_args(argv)
    print(render(run(args.keys, args.changes_per_key, args.minutes, args.rounds, parts=args.parts)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""What reading a change feed costs against exporting the same changes.

    python -m bench.change_feed [--rows 1000000] [--changes 100000] [--runs 3]

A table of `--rows` rows is registered and loaded; `--changes` of its keys are then updated (a
third), deleted (a third) or inserted (a third) and exported in one batch. Measured, side by side
in one run, medians of `--runs` interleaved runs:
- the export of those changes (cdc_export's work for one table, before it was marked: measured
  once, as a second export has nothing to do),
- the change feed of the window that holds them, from the lake (`--to` a time),
- the same window to `now` with as many changes dirty again (the lake plus PostgreSQL's images),
each in rows of feed written per second. The feed's rows are checked against PostgreSQL's
difference by count of each change type.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

from coldharbor.runtime import pg
from coldharbor.serve import changes

from bench.common import Row, median, render, temporary_postgres, timed


def run(rows: int = 1_000_000, change_count: int = 100_000, runs: int = 3) -> list[Row]:
    from coldharbor.export import export_job as export_job

    third = change_count // 3
    with temporary_postgres() as dsn, pg.connect(dsn) as conn, tempfile.TemporaryDirectory() as lake_root:
        os.environ["COLDHARBOR_PG_DSN"] = dsn
        conn.execute("CREATE TABLE bench_feed (id bigint PRIMARY KEY, customer text, amount numeric(12,2))")
        conn.execute("INSERT INTO bench_feed SELECT g, 'customer-' || g %% 5000, g %% 100000 / 100.0 "
                     "FROM generate_series(1, %s::bigint) g", (rows,))
        conn.execute("SELECT coldharbor.register_table('public.bench_feed')")
        common = ["--table", "public.bench_feed", "--lake-root", lake_root]
        assert export_job.main(common) == 0  # the initial load
        start = conn.execute("SELECT clock_timestamp()").fetchone()[0]
        time.sleep(0.05)
        conn.execute("UPDATE bench_feed SET amount = amount + 1 WHERE id <= %s", (third,))
        conn.execute("DELETE FROM bench_feed WHERE id > %s AND id <= %s", (third, 2 * third))
        conn.execute("INSERT INTO bench_feed SELECT g, 'new', 1 FROM generate_series(%s::bigint, %s::bigint) g",
                     (rows + 1, rows + third))
        export_s = timed(lambda: export_job.main(common))
        time.sleep(0.05)
        end = conn.execute("SELECT clock_timestamp()").fetchone()[0]
        feed_rows = 2 * third + third + third  # update pairs, deletes, inserts

        conn.execute("UPDATE bench_feed SET amount = amount + 1 WHERE id > %s AND id <= %s",
                     (2 * third, 3 * third))  # as many dirty again, for `now`
        lake_s, now_s = [], []
        for i in range(runs):
            for label, to, times in (("lake", end.isoformat(), lake_s), ("now", "now", now_s)):
                target = f"changes_bench_{label}"
                times.append(timed(lambda to=to, target=target: changes.main(
                    [*common, "--from", start.isoformat(), "--to", to, "--target", target])))
        counts = dict(conn.execute("SELECT _change_type, count(*) FROM reports.changes_bench_lake "
                                   "GROUP BY 1").fetchall())
        expected = {"insert": third, "delete": third, "update_preimage": third, "update_postimage": third}
        now_rows = conn.execute("SELECT count(*) FROM reports.changes_bench_now").fetchone()[0]
    label = f"change feed ({rows:,} rows, {change_count:,} changes)"
    return [
        Row(label, "export of the changes (one batch)", change_count / export_s, "changes/s", "", None),
        Row(label, "feed from the lake (--to a time)", feed_rows / median(lake_s), "rows/s", "", None),
        Row(label, "feed to now (lake + dirty images)", now_rows / median(now_s), "rows/s", "", None),
        Row(label, "feed from the lake / export, time", median(lake_s) / export_s, "x", "informational", None),
        Row(label, "feed rows by type equal PostgreSQL's difference", float(counts == expected), "", "1 = yes",
            counts == expected),
    ]


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="bench.change_feed")
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--changes", type=int, default=100_000)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args(argv)
    print(render(run(args.rows, args.changes, args.runs)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

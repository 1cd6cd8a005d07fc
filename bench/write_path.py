"""Write-path benchmark (issue: foundation): export throughput, idle export cost, capture overhead.

    python -m bench.write_path [--rows 1000000]

Every ratio is measured side by side in this one run; targets are printed, never asserted.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile

import psycopg
from coldharbor.capture import registry
from coldharbor.export.table_export import ExportConfig, export_table
from coldharbor.runtime import pg
from coldharbor.runtime.settings import PROJECT_DIR

from bench.common import Row, median, render, temporary_postgres, timed

TEN_COLUMNS = """id bigint PRIMARY KEY, customer text, amount numeric(12,2), qty integer, price double precision,
    status varchar(16), paid boolean, created date, updated_at timestamptz, note text"""
FILL = """INSERT INTO {t} SELECT g, 'customer-' || (g % 1000), (g % 10000) / 100.0, g % 17, g * 0.5,
    'status-' || (g % 5), g % 2 = 0, date '2026-01-01' + (g % 300), now(), md5(g::text)
    FROM generate_series({start}, {stop}) g"""


def export_throughput(spark, dsn: str, rows: int, lake_root: str) -> list[Row]:
    with pg.connect(dsn) as conn:
        conn.execute(f"CREATE TABLE bench_orders ({TEN_COLUMNS})")
        conn.execute("SELECT coldharbor.register_table('bench_orders')")
        conn.execute(FILL.format(t="bench_orders", start=1, stop=rows))
        conn.execute("VACUUM ANALYZE bench_orders")
        conn.execute("VACUUM ANALYZE coldharbor.change_log")
        [table] = registry.load(conn, "public.bench_orders")
        config = ExportConfig(table="public.bench_orders", lake_root=lake_root, run_id="bench")
        result = {}
        seconds = timed(lambda: result.update(r=export_table(spark, conn, pg.JdbcTarget.from_dsn(dsn), table, config)))
    assert result["r"].rows == rows, result
    rate = rows / seconds
    return [Row("write path", f"export {rows:,} changed rows (10 columns), warm Spark", seconds, "s", "", None),
            Row("write path", "export throughput end to end", rate, "rows/s", ">= 100,000 rows/s", rate >= 100_000)]


def idle_export_cost(dsn: str, lake_root: str) -> list[Row]:
    env = {**os.environ, "COLDHARBOR_PG_DSN": dsn, "PYTHONPATH": str(PROJECT_DIR / "jobs")}
    command = [sys.executable, str(PROJECT_DIR / "jobs" / "cdc_export.py"), "--lake-root", lake_root]
    walls = []
    for _ in range(5):
        walls.append(timed(lambda: subprocess.run(command, env=env, check=True, capture_output=True)))
    wall = median(walls)
    return [Row("write path", "export run with nothing dirty (median of 5, wall)", wall, "s", "<= 3 s", wall <= 3.0)]


def _single_row_rate(conn: psycopg.Connection, table: str, n: int, start: int) -> float:
    """Single-row autocommit INSERTs then UPDATEs, as an application does them: rows per second."""
    def work() -> None:
        for i in range(start, start + n):
            conn.execute(f"INSERT INTO {table} VALUES (%s, 'c', 1.00, 1, 1.0, 's', true, '2026-01-01', now(), 'n')",
                         (i,))
        for i in range(start, start + n):
            conn.execute(f"UPDATE {table} SET qty = qty + 1 WHERE id = %s", (i,))
    return 2 * n / timed(work)


def _bulk_rate(conn: psycopg.Connection, table: str, n: int, start: int) -> float:
    """One INSERT ... SELECT, one UPDATE and one DELETE of n rows each: rows per second."""
    def work() -> None:
        conn.execute(FILL.format(t=table, start=start, stop=start + n - 1))
        conn.execute(f"UPDATE {table} SET qty = qty + 1 WHERE id >= %s", (start,))
        conn.execute(f"DELETE FROM {table} WHERE id >= %s", (start,))
    return 3 * n / timed(work)


def capture_overhead(dsn: str, single_n: int, bulk_n: int, rounds: int) -> list[Row]:
    """Interleaves captured and plain tables round by round so machine noise hits both alike."""
    with pg.connect(dsn) as conn:
        for name in ("plain_t", "captured_t"):
            conn.execute(f"CREATE TABLE {name} ({TEN_COLUMNS})")
        conn.execute("SELECT coldharbor.register_table('captured_t')")
        single = {"plain_t": [], "captured_t": []}
        bulk = {"plain_t": [], "captured_t": []}
        for r in range(rounds):
            for name in ("plain_t", "captured_t") if r % 2 == 0 else ("captured_t", "plain_t"):
                single[name].append(_single_row_rate(conn, name, single_n, 10_000_000 + r * single_n))
                bulk[name].append(_bulk_rate(conn, name, bulk_n, 20_000_000 + r * bulk_n))
    rows = []
    for label, rates, limit in (("single-row", single, 0.30), ("bulk", bulk, 0.50)):
        plain, captured = median(rates["plain_t"]), median(rates["captured_t"])
        cost = 1 - captured / plain
        rows += [Row("capture", f"{label} writes without triggers", plain, "rows/s", "", None),
                 Row("capture", f"{label} writes with triggers", captured, "rows/s", "", None),
                 Row("capture", f"{label} trigger cost (1 - with/without)", cost * 100, "%",
                     f"<= {limit:.0%}", cost <= limit)]
    return rows


def run(rows: int = 1_000_000, single_n: int = 2_000, bulk_n: int = 100_000, rounds: int = 3) -> list[Row]:
    from coldharbor.runtime.spark import get_session

    results: list[Row] = []
    with temporary_postgres() as dsn, tempfile.TemporaryDirectory(prefix="coldharbor-lake-") as lake_root:
        results += capture_overhead(dsn, single_n, bulk_n, rounds)
        results += idle_export_cost(dsn, lake_root)
        spark = get_session("coldharbor-bench-write-path")
        spark.sparkContext.setLogLevel("ERROR")
        results += export_throughput(spark, dsn, rows, lake_root)
    return results


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=1_000_000)
    args = parser.parse_args(argv)
    print(render(run(rows=args.rows)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""The health page (issue 25, part 1): its server time with many tables and a day of samples, and
what writing an export cycle's health samples costs.

    python -m bench.health_page [--tables 50] [--repeats 5]

Side by side in one run, on a throwaway PostgreSQL: `--tables` registered tables, each with a
Delta table of its own (written with deltalake, as small as an export's) and 24 hours of samples
at one per minute (1,440 each), plus a few dirty changes; then
- the page's server time: the figures read from PostgreSQL (ColdharborHook.health, through the
  Airflow connection as the API server reads them), the Delta logs listed, the HTML rendered;
- one export cycle's samples written (cdc_export's record_samples over every table, one statement);
medians of `--repeats`. Goals (the issue's): under 1 s, and under 10 ms. Printed, never asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

import psycopg
from coldharbor.runtime import pg
from psycopg.conninfo import conninfo_to_dict

from bench.common import Row, median, render, temporary_postgres, timed


def build(dsn: str, tables: int, lake_root: str) -> None:
    import pyarrow as pa
    from deltalake import write_deltalake

    with pg.connect(dsn) as conn:
        for n in range(tables):
            name = f"health_t{n}"
            conn.execute(f"CREATE TABLE {name} (id bigint PRIMARY KEY, v text)")
            conn.execute("SELECT coldharbor.register_table(%s)", (name,))
            conn.execute(f"INSERT INTO {name} SELECT g, 'v' FROM generate_series(1, 20) g")
            write_deltalake(f"{lake_root}/public/{name}", pa.table({"id": list(range(200)), "v": ["v"] * 200}))
        conn.execute("""
            INSERT INTO coldharbor.health_samples (table_id, sampled_at, export_status, export_rows, export_s,
                                                   dirty_rows, lag_s)
            SELECT t.table_id, now() - make_interval(mins => m), 'exported', 200 + m % 17, 1.5 + (m % 7) / 10.0,
                   m % 23, 20 + m % 40
              FROM coldharbor.tables t, generate_series(0, 1439) m""")
        # The page shows the last export: one flushed batch per table.
        conn.execute("""
            INSERT INTO coldharbor.export_batches (table_id, batch_id, run_id, state, change_count, row_count,
                                                   started_at, finished_at, lake_version, kind)
            SELECT table_id, 1, 'bench', 'flushed', 20, 20, now() - interval '1 minute', now(), 0, 'changes'
              FROM coldharbor.tables""")


def page_seconds(repeats: int) -> float:
    from coldharbor_airflow.health_page import build_page

    build_page()  # imports and first connection
    return median([timed(build_page) for _ in range(repeats)])


def sample_seconds(dsn: str, repeats: int) -> float:
    from coldharbor.capture import registry
    from coldharbor.export.export_job import record_samples
    from coldharbor.export.table_export import TableResult

    with pg.connect(dsn) as conn:
        tables = registry.load(conn)
        results = [TableResult(t.qualified_name, "exported", rows=20, seconds=1.2) for t in tables]
        return median([timed(lambda: record_samples(conn, tables, results)) for _ in range(repeats)])


def run(tables: int = 50, repeats: int = 5) -> list[Row]:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "plugins"))
    with temporary_postgres() as dsn, tempfile.TemporaryDirectory(prefix="coldharbor-bench-lake-") as lake_root:
        params = conninfo_to_dict(dsn)
        os.environ["AIRFLOW_CONN_COLDHARBOR_PG"] = json.dumps({
            "conn_type": "postgres", "host": params.get("host"), "port": int(params.get("port", 5432)),
            "login": params.get("user"), "password": params.get("password"), "schema": params.get("dbname")})
        os.environ["COLDHARBOR_LAKE_ROOT"] = lake_root
        build(dsn, tables, lake_root)
        with psycopg.connect(dsn) as conn:
            samples = conn.execute("SELECT count(*) FROM coldharbor.health_samples").fetchone()[0]
        page = page_seconds(repeats)
        write = sample_seconds(dsn, repeats)
    return [
        Row("health page", f"samples on record ({tables} tables x 24 h at one a minute)", samples, "rows", "", None),
        Row("health page", f"server time of the page, {tables} tables", page, "s", "< 1 s", page < 1.0),
        Row("health page", f"an export cycle's samples written, {tables} tables", write * 1000, "ms", "< 10 ms",
            write < 0.010),
    ]


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="bench.health_page", description=__doc__.splitlines()[0])
    parser.add_argument("--tables", type=int, default=50)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    print(render(run(args.tables, args.repeats)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""What writing a PostgreSQL report table in place costs against the swap it replaced.

    python -m bench.report_sink [--rows 1000000] [--runs 3]

A report result of `--rows` rows (four columns, as a report's output) is written to a staging
table by Spark's JDBC writer (the same for both), then moved into an existing report table:
- before: DROP the report table and RENAME the stage to it (lost grants, views and owner);
- now (report_tables.swap_in): DELETE its rows and INSERT the staged ones in one transaction.
Runs alternate between the two; medians are printed with the table's size afterwards (the DELETE
leaves dead rows for autovacuum; the drop left none).
"""

from __future__ import annotations

import argparse
import sys

from coldharbor.runtime import pg
from coldharbor.serve import report_tables, sinks
from coldharbor.serve.report_spec import REPORTS_SCHEMA
from psycopg import sql

from bench.common import Row, median, render, temporary_postgres, timed


def report_result(spark, rows: int):
    return spark.range(rows).selectExpr("id", "concat('customer-', id % 5000) AS customer",
                                        "cast(id % 100000 / 100.0 AS decimal(12,2)) AS amount",
                                        "concat('status-', id % 7) AS status")


def stage(result, jdbc: pg.JdbcTarget, name: str) -> None:
    (result.write.format("jdbc").options(**jdbc.options()).option("dbtable", f'{REPORTS_SCHEMA}."{name}"')
     .option("batchsize", sinks.JDBC_WRITE_BATCH).mode("errorifexists").save())


def swap_by_rename(conn, staged: str, target: str) -> None:
    """The swap before: drop the report table, rename the stage to it, in one transaction."""
    with conn.transaction():
        conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(sql.Identifier(REPORTS_SCHEMA, target)))
        conn.execute(sql.SQL("ALTER TABLE {} RENAME TO {}").format(sql.Identifier(REPORTS_SCHEMA, staged),
                                                                  sql.Identifier(target)))


def size_mb(conn, target: str) -> float:
    return conn.execute("SELECT pg_total_relation_size(to_regclass(%s))",
                        (f"{REPORTS_SCHEMA}.{target}",)).fetchone()[0] / 2**20


def run(rows: int = 1_000_000, runs: int = 3) -> list[Row]:
    from coldharbor.runtime.spark import get_session

    spark = get_session("coldharbor-bench-report-sink")
    result = report_result(spark, rows).cache()
    result.count()
    swaps = {"before": swap_by_rename, "now": report_tables.swap_in}
    staged_s: list[float] = []
    swap_s: dict[str, list[float]] = {kind: [] for kind in swaps}
    with temporary_postgres() as dsn, pg.connect(dsn) as conn:
        jdbc = pg.JdbcTarget.from_dsn(dsn)
        for i in range(runs + 1):  # the first round creates both report tables and is not counted
            for kind, swap in swaps.items():
                name = sinks.stage_name(f"bench_{kind}")
                took = timed(lambda name=name: stage(result, jdbc, name))
                moved = timed(lambda name=name, swap=swap, kind=kind: swap(conn, name, f"bench_{kind}"))
                if i:
                    staged_s.append(took)
                    swap_s[kind].append(moved)
        sizes = {kind: size_mb(conn, f"bench_{kind}") for kind in swaps}
    spark.stop()
    write = median(staged_s)
    label = f"report sink ({rows:,} rows)"
    return [
        Row(label, "stage write (Spark JDBC), either way", write, "s", "", None),
        Row(label, "swap before: drop + rename", median(swap_s["before"]), "s", "", None),
        Row(label, "swap now: DELETE + INSERT in place", median(swap_s["now"]), "s", "", None),
        Row(label, "whole write, now / before", (write + median(swap_s["now"])) / (write + median(swap_s["before"])),
            "x", "informational", None),
        Row(label, "table size after the runs, before", sizes["before"], "MB", "", None),
        Row(label, "table size after the runs, now (dead rows until autovacuum)", sizes["now"], "MB", "", None),
    ]


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.report_sink", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args(argv)
    print(render(run(args.rows, args.runs)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

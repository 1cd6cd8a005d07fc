"""Incremental refresh of a grouped report against its full recompute, after 1 % of the rows changed.

    python -m bench.incremental [--rows 10000000] [--changed 0.01] [--repeats 3] [--groups 100]

A table of `--rows` rows (exact history: capture logs each change's rows) is registered with its
rows in it and loaded. Two report files declare `-- refresh: incremental`:
- sums:    SELECT grp, count(*), count(note), sum(amount), avg(amount) ... WHERE ... GROUP BY grp
- extremes: the same with min(amount) and max(amount).
Each is refreshed once (its state built from the lake). Then, `--repeats` times: `--changed` of the
rows (random keys) are updated in one transaction and exported, and each report is refreshed
incrementally and recomputed in full (the same SQL run ad hoc) side by side, alternating which
goes first; both answers are compared; then the report is refreshed again with nothing changed
(the refresh's fixed cost), and PostgreSQL is timed computing the signed rows alone. A last round
leaves its changes dirty (not exported): the refresh then applies them from PostgreSQL's change
log. Reported: medians, full / incremental, and the most this design can give: full / (the fixed
cost + PostgreSQL's time for the signed rows), what is left with Spark's work on them taken away.
Spark runs in this process (local[2]) and is warmed by the first refreshes.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import psycopg
from coldharbor.capture import registry
from coldharbor.export.table_export import ExportConfig, export_table
from coldharbor.runtime import pg
from coldharbor.serve import incremental_changes, serve_cli
from psycopg import sql

from bench.common import Row, median, render, temporary_postgres

SUMS = ("SELECT grp, count(*) AS n, count(note) AS notes, sum(amount) AS total, avg(amount) AS mean "
        "FROM bench_inc WHERE flag GROUP BY grp")
EXTREMES = ("SELECT grp, count(*) AS n, sum(amount) AS total, min(amount) AS low, max(amount) AS high "
            "FROM bench_inc WHERE flag GROUP BY grp")


def export(spark, dsn: str, lake_root: str) -> None:
    with pg.connect(dsn) as conn:
        [table] = registry.load(conn, "public.bench_inc")
        result = export_table(spark, conn, pg.JdbcTarget.from_dsn(dsn), table,
                              ExportConfig("public.bench_inc", lake_root, "bench"), lambda point: None)
        assert result.status in ("exported", "loaded", "clean"), result


def serve(lake_root: str, *args: str) -> float:
    start = time.perf_counter()
    assert serve_cli.main(["--lake-root", lake_root, *args]) == 0
    return time.perf_counter() - start


def answer(conn: psycopg.Connection, target: str) -> list[tuple]:
    return conn.execute(f"SELECT * FROM reports.{target} ORDER BY 1").fetchall()


def detail(conn: psycopg.Connection, run_id: str) -> str:
    return conn.execute("SELECT detail FROM coldharbor.report_runs WHERE run_id = %s", (run_id,)).fetchone()[0]


def change(conn: psycopg.Connection, rows: int, changed: int, seed: int) -> None:
    conn.execute("""UPDATE bench_inc SET amount = amount + 1.25, flag = NOT flag OR id %% 3 = 0
                     WHERE id IN (SELECT 1 + (hashint8(g + %s * 1000003)::bigint & 2147483647) %% %s
                                    FROM generate_series(1, %s) g)""", (seed, rows, changed))


def signed_rows_time(conn: psycopg.Connection, round_: int) -> float:
    """PostgreSQL's own time to compute the signed rows the refresh reads after export `round_`
    (lake version round_ + 1; the state stands at round_), without sending them anywhere."""
    [table] = registry.load(conn, "public.bench_inc")
    query = incremental_changes.changes_query(table, registry.lake_columns(conn, table), round_, round_ + 1)
    start = time.perf_counter()
    conn.execute(sql.SQL("SELECT count(*) FROM ({}) signed").format(query)).fetchone()
    return time.perf_counter() - start


def run(rows: int = 10_000_000, changed_share: float = 0.01, repeats: int = 3, groups: int = 100) -> list[Row]:
    from coldharbor.runtime.spark import get_session

    spark = get_session("coldharbor-bench-incremental")
    changed = int(rows * changed_share)
    timings: dict[str, list[float]] = {}
    details: dict[str, list[str]] = {}
    with temporary_postgres() as dsn, tempfile.TemporaryDirectory(prefix="coldharbor-bench-") as folder:
        lake_root = f"{folder}/lake"
        reports = Path(folder) / "reports"
        reports.mkdir()
        for name, sql in (("inc_sums", SUMS), ("inc_extremes", EXTREMES)):
            (reports / f"{name}.sql").write_text(f"-- refresh: incremental\n{sql}\n")
        os.environ.update(COLDHARBOR_PG_DSN=dsn, COLDHARBOR_REPORTS_DIR=str(reports))
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("""CREATE TABLE bench_inc (id bigint PRIMARY KEY, grp integer NOT NULL,
                                                    amount numeric(12,2) NOT NULL, note text, flag boolean NOT NULL)""")
            conn.execute("""INSERT INTO bench_inc SELECT g, g %% %s, (g %% 100000) / 100.0,
                                   CASE WHEN g %% 4 = 0 THEN 'n' END, g %% 10 <> 0
                              FROM generate_series(1, %s) g""", (groups, rows))
            conn.execute("VACUUM ANALYZE bench_inc")
            conn.execute("SELECT coldharbor.register_table('public.bench_inc', p_history => 'exact')")
            export(spark, dsn, lake_root)                        # the initial load
            for name in ("inc_sums", "inc_extremes"):
                timings.setdefault(f"{name} state built", []).append(serve(lake_root, "--report", name))
            for round_ in range(repeats + 1):
                dirty = round_ == repeats
                change(conn, rows, changed, round_)
                if not dirty:
                    export(spark, dsn, lake_root)
                for name, sql in (("inc_sums", SUMS), ("inc_extremes", EXTREMES)):
                    label = f"{name}{', changes dirty' if dirty else ''}"
                    run_id = f"{name}-{round_}"
                    steps = [("incremental", ("--report", name, "--run-id", run_id)),
                             ("full", ("--sql", sql, "--target", f"adhoc_{name}", "--run-id", f"full-{run_id}"))]
                    for kind, args in (steps if round_ % 2 == 0 else steps[::-1]):
                        timings.setdefault(f"{label}: {kind}", []).append(serve(lake_root, *args))
                    assert answer(conn, name) == answer(conn, f"adhoc_{name}"), (name, round_)
                    details.setdefault(label, []).append(detail(conn, run_id))
                    print(f"round {round_} {label}: {detail(conn, run_id)}", flush=True)
                    if not dirty:  # the floor: the same refresh again, nothing changed since
                        timings.setdefault(f"{name}: nothing changed", []).append(
                            serve(lake_root, "--report", name, "--run-id", f"{run_id}-again"))
                        assert detail(conn, f"{run_id}-again").startswith("refreshed incrementally: 0 signed rows")
                if not dirty:
                    timings.setdefault("signed rows in PostgreSQL", []).append(signed_rows_time(conn, round_))
    spark.stop()
    out = []
    postgres = median(timings["signed rows in PostgreSQL"])
    out.append(Row("incremental", f"PostgreSQL alone computing the signed rows of {changed:,} changed keys "
                                  "(server time, no transfer)", postgres, "s", "-", None))
    for name in ("inc_sums", "inc_extremes"):
        out.append(Row("incremental", f"{name}: state built from the lake", timings[f"{name} state built"][0], "s",
                       "-", None))
        for label in (name, f"{name}, changes dirty"):
            inc, full = median(timings[f"{label}: incremental"]), median(timings[f"{label}: full"])
            ways = sorted({d.split(":")[0].split(" (")[0] for d in details[label]})
            out.append(Row("incremental", f"{label}: incremental ({'; '.join(ways)})", inc, "s", "-", None))
            out.append(Row("incremental", f"{label}: full recompute", full, "s", "-", None))
            out.append(Row("incremental", f"{label}: full / incremental, {changed:,} of {rows:,} rows changed",
                           full / inc, "x", ">= 20x", full / inc >= 20))
        floor, full = median(timings[f"{name}: nothing changed"]), median(timings[f"{name}: full"])
        out.append(Row("incremental", f"{name}: incremental refresh with nothing changed (its fixed cost)", floor, "s",
                       "-", None))
        out.append(Row("incremental", f"{name}: the most this design can give, full / (nothing changed + "
                                      "PostgreSQL's signed rows)", full / (floor + postgres), "x", "-", None))
    return out


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.incremental", description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument("--changed", type=float, default=0.01, help="share of the rows changed between refreshes")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--groups", type=int, default=100)
    args = parser.parse_args(argv)
    print(render(run(args.rows, args.changed, args.repeats, args.groups)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

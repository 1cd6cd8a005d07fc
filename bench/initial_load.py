"""Initial load and verify of a table registered with rows in it, side by side with what PostgreSQL
itself delivers (`COPY ... TO STDOUT (FORMAT binary)` read by one client), and the application's
write rate while the load runs against the same workload with no load running (the table registered
in both, so both pay capture's trigger).

    python -m bench.initial_load [--rows 10000000] [--seconds 20]

Spark runs in this process (local[2]), warmed first by the load and verify of a 1,000-row table:
a deployment's engine is a long-lived Spark Connect server that compiled these plans long before
(the warm-engine issue), where a fresh session spends seconds compiling them on first use. The
figures are end to end for the load itself: snapshot, parallel JDBC read, Delta write, recording
the base, and the export of the changes the writer made meanwhile.
"""

from __future__ import annotations

import argparse
import multiprocessing
import sys
import tempfile
import time

import psycopg
from coldharbor.capture import registry
from coldharbor.export.table_export import ExportConfig, export_table
from coldharbor.maintenance import verify
from coldharbor.runtime import pg

from bench.common import Row, render, temporary_postgres, timed

COLUMNS = """id bigint PRIMARY KEY, customer integer NOT NULL, amount numeric(12,2) NOT NULL, price double precision,
             status text NOT NULL, note varchar(40), created date NOT NULL, updated timestamptz NOT NULL,
             paid boolean NOT NULL, ref uuid NOT NULL"""
FILL = """INSERT INTO {table} SELECT g, g % 100000, (g % 10000) / 100.0, g * 0.5, 'status-' || (g % 7),
                 'note ' || (g % 1000), date '2020-01-01' + (g % 2000), timestamptz '2020-01-01' + g * interval '1 s',
                 g % 2 = 0, md5(g::text)::uuid
            FROM generate_series({start}, {end}) g"""


def fill(dsn: str, rows: int, table: str = "bench_load") -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"CREATE TABLE {table} ({COLUMNS})")
        step = 1_000_000
        for start in range(1, rows + 1, step):
            conn.execute(FILL.format(table=table, start=start, end=min(rows, start + step - 1)))
        conn.execute(f"VACUUM ANALYZE {table}")


def copy_binary(dsn: str) -> None:
    with psycopg.connect(dsn) as conn, conn.cursor() as cur:
        with cur.copy("COPY (SELECT * FROM bench_load) TO STDOUT (FORMAT binary)") as copy:
            for _ in copy:
                pass


def write_rate(dsn: str, rows: int, stop, count, ended) -> None:
    """Single-row UPDATE transactions, as an application makes them, until `stop` (its time in `ended`).
    Runs in a process of its own, as an application does: a thread of the process that drives Spark
    would take Python's lock from the job's driver (a 3M-row load took 140 s beside one, 21 s beside
    a process)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        i = 0
        while not stop.is_set():
            i += 1
            conn.execute("UPDATE bench_load SET amount = amount + 1 WHERE id = %s", ((i * 7919) % rows + 1,))
            with count.get_lock():
                count.value += 1
        ended.value = time.perf_counter()


def writes_for(dsn: str, rows: int, seconds: float, during=None) -> tuple[float, float]:
    """(writes/s, wall of `during`) with the writer running while `during` runs (or for `seconds`).
    `during` is called with an Event it sets when the part that counts is over (the load's commit):
    the writer's rate is taken until then, not over the export of its own changes that follows, which
    a writer keeping its rate makes as long as it likes."""
    context = multiprocessing.get_context("spawn")  # no fork of a process that holds a JVM gateway
    stop, count, ended = context.Event(), context.Value("q", 0), context.Value("d", 0.0)
    writer = context.Process(target=write_rate, args=(dsn, rows, stop, count, ended))
    writer.start()
    while count.value == 0 and writer.is_alive():  # started and writing: a spawn takes a while
        time.sleep(0.01)
    start, before = time.perf_counter(), count.value  # a monotonic clock both processes read alike
    wall = timed(lambda: during(stop)) if during else (time.sleep(seconds) or seconds)
    stop.set()
    writer.join()
    return (count.value - before) / (ended.value - start), wall


def load_and_verify(spark, dsn: str, lake_root: str, name: str) -> tuple[int, bool]:
    """(rows loaded, in sync): the initial load of a registered table, then verify of it."""
    with pg.connect(dsn) as conn:
        [table] = registry.load(conn, name)
        loaded = export_table(spark, conn, pg.JdbcTarget.from_dsn(dsn), table,
                              ExportConfig(name, lake_root, "bench"), lambda point: None).loaded_rows
        found = verify.verify_table(spark, conn, pg.JdbcTarget.from_dsn(dsn), table,
                                    verify.VerifyConfig(name, lake_root, 16, "bench"))
    return loaded, found.in_sync


def warm_up(spark, dsn: str, lake_root: str) -> None:
    fill(dsn, 1000, "bench_warm")
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SELECT coldharbor.register_table('public.bench_warm')")
    assert load_and_verify(spark, dsn, lake_root, "public.bench_warm") == (1000, True)


def run(rows: int = 10_000_000, seconds: float = 20.0) -> list[Row]:
    from coldharbor.runtime.spark import get_session

    spark = get_session("coldharbor-bench-initial-load")
    with temporary_postgres() as dsn, tempfile.TemporaryDirectory(prefix="coldharbor-bench-lake-") as lake_root:
        warm_up(spark, dsn, lake_root)
        fill(dsn, rows)
        copy_s = timed(lambda: copy_binary(dsn))
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("SELECT coldharbor.register_table('public.bench_load')")
        # Registered first: both rates include capture's trigger, which is not a cost of the load.
        idle_rate, _ = writes_for(dsn, rows, seconds)

        def load(landed) -> None:  # an Event
            def at(point: str) -> None:  # the load's crash points: its commit is where it ends
                if point == "load_after_commit":
                    landed.set()

            with pg.connect(dsn) as conn:
                [table] = registry.load(conn, "public.bench_load")
                result = export_table(spark, conn, pg.JdbcTarget.from_dsn(dsn), table,
                                      ExportConfig("public.bench_load", lake_root, "bench"), at)
                assert result.loaded_rows == rows and landed.is_set(), result

        loading_rate, load_s = writes_for(dsn, rows, seconds, during=load)

        def check() -> None:
            with pg.connect(dsn) as conn:
                [table] = registry.load(conn, "public.bench_load")
                found = verify.verify_table(spark, conn, pg.JdbcTarget.from_dsn(dsn), table,
                                            verify.VerifyConfig("public.bench_load", lake_root, 16, "bench"))
                assert found.in_sync, found.summary()

        verify_s = timed(check)
    spark.stop()
    return [
        Row("initial load", "COPY binary, one client (reference)", rows / copy_s, "rows/s", "-", None),
        Row("initial load", "load end to end", rows / load_s, "rows/s", ">= 100,000", rows / load_s >= 100_000),
        Row("initial load", "load / COPY binary", (rows / load_s) / (rows / copy_s), "x", "-", None),
        Row("initial load", "app writes, no load", idle_rate, "tx/s", "-", None),
        Row("initial load", "app writes during the load", loading_rate, "tx/s", "-", None),
        Row("initial load", "writes during / no load", loading_rate / idle_rate * 100, "%", ">= 70 %",
            loading_rate / idle_rate >= 0.7),
        Row("verify", "unified view vs PostgreSQL", rows / verify_s, "rows/s", ">= 200,000", rows / verify_s >= 200_000),
    ]


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.initial_load", description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument("--seconds", type=float, default=20.0, help="how long the idle write rate is measured")
    args = parser.parse_args(argv)
    print(render(run(args.rows, args.seconds)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

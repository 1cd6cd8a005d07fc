"""Read-path benchmark (issue: read path): the cost of the dirty-set anti-join.

    python -m bench.read_path [--rows 10000000] [--dirty-fraction 0.01] [--repeats 5]

A table of `rows` cold rows in the lake, `dirty-fraction` of its keys dirty in PostgreSQL (updated,
deleted and new keys). Two reports (a grouped aggregate and a selective filter) are computed three
ways, interleaved, in one run:
  unified    the serve path: pin, one-snapshot dirty set from PostgreSQL, (cold LWW - dirty) + hot
  cold-only  the same lake read with last-write-wins, ignoring PostgreSQL (fast and wrong)
  duckdb     the original design's engine: DuckDB over the same Delta files (listed by the
             `deltalake` package) and the same PostgreSQL dirty set
All three answers are compared; timings are medians, printed as ratios, never asserted.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from collections.abc import Callable

import duckdb
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from bench.common import Row, median, render, temporary_postgres, timed
from coldharbor import hot_snapshot, lake, pg, registry, serve, sql_guard
from coldharbor.unified import cold_live

TABLE = "bench_events"
REPORTS = {
    "grouped aggregate": f"SELECT status, count(*) AS n, sum(amount) AS total FROM {TABLE} GROUP BY status",
    "selective filter": f"SELECT id, customer, amount, status FROM {TABLE} WHERE customer = 4242",
}


def build_lake(spark: SparkSession, path: str, rows: int) -> None:
    """The lake as a long export history would leave it: one image per key, already compacted."""
    (spark.range(1, rows + 1)
     .select(F.col("id"), (F.col("id") % 100_000).cast("int").alias("customer"),
             ((F.col("id") % 100_000) / 100).cast("decimal(12,2)").alias("amount"),
             F.concat(F.lit("s"), (F.col("id") % 5).cast("string")).alias("status"),
             F.col("id").alias("_ch_seq"), F.lit(False).alias("_ch_deleted"),
             F.current_timestamp().alias("_ch_changed_at"), F.lit(1).cast("long").alias("_ch_batch_id"),
             F.current_timestamp().alias("_ch_exported_at"))
     .repartition(8).write.format("delta").mode("overwrite").save(path))


def build_hot_tier(dsn: str, rows: int, dirty: int) -> None:
    """PostgreSQL holds the dirty keys only (the rest were evicted): updates, deletes and new keys."""
    with pg.connect(dsn) as conn:
        conn.execute(f"""CREATE TABLE {TABLE} (id bigint PRIMARY KEY, customer integer NOT NULL,
                         amount numeric(12,2) NOT NULL, status text NOT NULL)""")
        conn.execute("SELECT coldharbor.register_table(%s)", (TABLE,))
        step = rows // dirty
        with conn.transaction():  # the flushed copies of the keys about to change: no change logged
            conn.execute("SET LOCAL session_replication_role = replica")
            conn.execute(f"""INSERT INTO {TABLE} SELECT g, g % 100000, (g % 100000) / 100.0, 's' || (g % 5)
                             FROM generate_series({step}, {rows}, {step}) g""")
        conn.execute(f"UPDATE {TABLE} SET amount = amount + 1, status = 'changed' WHERE id % {step * 10} <> 0")
        conn.execute(f"DELETE FROM {TABLE} WHERE id % {step * 10} = 0")
        conn.execute(f"""INSERT INTO {TABLE} SELECT {rows} + g, 4242, 1, 'new'
                         FROM generate_series(1, {max(1, dirty // 10)}) g""")
        conn.execute(f"VACUUM ANALYZE {TABLE}")
        conn.execute("VACUUM ANALYZE coldharbor.change_log")


def spark_unified(spark, dsn, lake_root, sql) -> list:
    with pg.connect(dsn) as conn:
        checked = sql_guard.check_query(sql, registry.load(conn))
        pinned = serve.pin_versions(spark, checked.tables, lake_root)
        snapshot = hot_snapshot.read(conn, pinned, checked.tables,
                                     lake_batches=serve.lake_batch_ids(spark, checked.tables, lake_root))
    serve.register_views(spark, snapshot, pinned, lake_root, None)
    return serve.run_query(spark, checked, {}).collect()


def spark_cold_only(spark, dsn, lake_root, sql) -> list:
    with pg.connect(dsn) as conn:
        tables = registry.load(conn)
        checked = sql_guard.check_query(sql, tables)
        columns = registry.lake_columns(conn, checked.tables[0])
    [table] = checked.tables
    path = table.lake_path(lake_root)
    view = lake.read_version(spark, path, lake.pin_version(spark, path)).transform(cold_live(columns))
    view.createOrReplaceTempView(sql_guard.view_name(table))
    return serve.run_query(spark, checked, {}).collect()


def duckdb_unified(dsn, lake_root, sql) -> list:
    from deltalake import DeltaTable

    with pg.connect(dsn) as conn:
        [table] = registry.load(conn, TABLE)
        pinned = {table.table_id: DeltaTable(table.lake_path(lake_root)).version()}
        snapshot = hot_snapshot.read(conn, pinned, [table])
    delta = DeltaTable(table.lake_path(lake_root), version=pinned[table.table_id])
    con = duckdb.connect()
    con.execute("SET threads = 2")
    con.register("dirty", snapshot.tables[table.table_id].images)
    con.execute(f"""CREATE VIEW {TABLE} AS
        WITH latest AS (
            SELECT * FROM read_parquet({delta.file_uris()!r})
            QUALIFY row_number() OVER (PARTITION BY id ORDER BY _ch_seq DESC, _ch_batch_id DESC) = 1)
        SELECT l.id, l.customer, l.amount, l.status FROM latest l
        WHERE NOT l._ch_deleted AND NOT EXISTS (SELECT 1 FROM dirty d WHERE d.id = l.id)
        UNION ALL
        SELECT id, customer, amount, status FROM dirty WHERE NOT _ch_deleted""")
    return con.execute(sql).fetchall()


def _normal(rows) -> list[tuple]:
    return sorted(tuple(float(v) if hasattr(v, "as_tuple") else v for v in tuple(r)) for r in rows)


def run(rows: int = 10_000_000, dirty_fraction: float = 0.01, repeats: int = 5) -> list[Row]:
    from coldharbor.spark import get_session

    spark = get_session("coldharbor-bench-read-path")
    spark.sparkContext.setLogLevel("ERROR")
    results: list[Row] = []
    dirty = int(rows * dirty_fraction)
    with temporary_postgres() as dsn, tempfile.TemporaryDirectory(prefix="coldharbor-lake-") as lake_root:
        build_hot_tier(dsn, rows, dirty)
        build_lake(spark, f"{lake_root}/public/{TABLE}", rows)
        for name, sql in REPORTS.items():
            engines: dict[str, Callable[[], list]] = {
                "unified": lambda: spark_unified(spark, dsn, lake_root, sql),
                "cold-only": lambda: spark_cold_only(spark, dsn, lake_root, sql),
                "duckdb": lambda: duckdb_unified(dsn, lake_root, sql),
            }
            answers = {engine: _normal(run_once()) for engine, run_once in engines.items()}  # also warms up
            if answers["unified"] != answers["duckdb"]:
                raise AssertionError(f"{name}: Spark's unified answer differs from DuckDB's")
            times: dict[str, list[float]] = {engine: [] for engine in engines}
            for i in range(repeats):
                order = list(engines) if i % 2 == 0 else list(reversed(engines))
                for engine in order:
                    times[engine].append(timed(engines[engine]))
            unified, cold, duck = (median(times[e]) for e in ("unified", "cold-only", "duckdb"))
            label = f"{name}, {rows:,} cold rows, {dirty:,} dirty keys"
            results += [
                Row("read path", f"{label}: unified (Spark)", unified, "s", "", None),
                Row("read path", f"{label}: cold-only (Spark)", cold, "s", "", None),
                Row("read path", f"{label}: unified (DuckDB)", duck, "s", "", None),
                Row("read path", f"{name}: unified / cold-only", unified / cold, "x", "<= 1.2x", unified / cold <= 1.2),
                Row("read path", f"{name}: unified Spark / unified DuckDB", unified / duck, "x", "", None),
                Row("read path", f"{name}: cold-only answer differs from unified", float(answers["cold-only"] !=
                                                                                         answers["unified"]),
                    "(1 = yes)", "", None),
            ]
    return results


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument("--dirty-fraction", type=float, default=0.01)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    print(render(run(args.rows, args.dirty_fraction, args.repeats)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

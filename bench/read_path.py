"""Read-path benchmark (issues: read path, reports at DuckDB speed): the cost of the dirty-set
anti-join over the lake shapes users have.

    python -m bench.read_path [--rows 10000000] [--dirty-fraction 0.01] [--repeats 5] [--exports 1440]
    python -m bench.read_path --settings     each candidate Spark setting against the defaults

`rows` keys in the lake, `dirty-fraction` of them dirty in PostgreSQL (updated, deleted and new
keys). Three lake shapes of the same table:
  single export      one image per key, settled (what an initial load or a compaction leaves)
  base + exports     a settled base plus a day of minute-sized exports on top: `exports` small
                     commits (written with the `deltalake` package, a Delta checkpoint every 10
                     commits as Spark's writer leaves them) touching 2 % of the keys, some deleted
  merged             "base + exports" after compaction's merge of the small export files (the
                     hourly `auto` compaction between its daily full rewrites): the same rows,
                     the exports in one file (the merge is timed)
  fully compacted    the same data as "base + exports", one settled version per key
Two reports (a grouped aggregate, a selective filter) run on each shape, interleaved, medians:
  unified        the serve path on the warm engine (a Spark Connect server, local[2]): pin, the
                 one-snapshot dirty set from PostgreSQL, (cold current rows - dirty) + hot
  cold-only      the same lake read, ignoring PostgreSQL (fast and wrong)
  duckdb         DuckDB over the same Delta files (listed by `deltalake`) and the same dirty set,
                 the same plan as Spark's (settled rows without a window, the rest ranked)
  duckdb-window  DuckDB ranking every lake row by key (the plan Spark used before `_ch_settled`)
Every engine's answer is compared with the others'; timings are printed, never asserted.
"""

from __future__ import annotations

import argparse
import random
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta, timezone
from decimal import Decimal
from pathlib import Path

import duckdb
from coldharbor.capture import registry
from coldharbor.lake import commits, delta
from coldharbor.lake.lake_rows import NEWEST, SETTLED, latest_per_key
from coldharbor.lake.unified import cold_live
from coldharbor.maintenance.compaction import compact_table
from coldharbor.maintenance.compaction_plan import CompactionConfig
from coldharbor.runtime import pg
from coldharbor.serve import hot_snapshot, serve_job, sql_guard
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from bench.common import Row, median, render, temporary_postgres, timed

TABLE = "bench_events"
REPORTS = {
    "grouped aggregate": f"SELECT status, count(*) AS n, sum(amount) AS total FROM {TABLE} GROUP BY status",
    "selective filter": f"SELECT id, customer, amount, status FROM {TABLE} WHERE customer = 4242",
}
T0 = datetime(2026, 11, 1, tzinfo=timezone.utc)


def build_lake(spark: SparkSession, path: str, rows: int, app_id: str) -> None:
    """One settled image per key: the lake as the table's initial load (batch 1) leaves it."""
    (spark.range(1, rows + 1)
     .select(F.col("id"), (F.col("id") % 100_000).cast("int").alias("customer"),
             ((F.col("id") % 100_000) / 100).cast("decimal(12,2)").alias("amount"),
             F.concat(F.lit("s"), (F.col("id") % 5).cast("string")).alias("status"),
             F.col("id").alias("_ch_seq"), F.lit(False).alias("_ch_deleted"),
             F.lit(T0).alias("_ch_changed_at"), F.lit(1).cast("long").alias("_ch_batch_id"),
             F.lit(T0).alias("_ch_exported_at"), F.lit(T0).alias("_ch_first_changed_at"),
             F.lit(NEWEST).alias(SETTLED))
     .repartition(8).write.format("delta").mode("overwrite").option("txnAppId", app_id).option("txnVersion", 1)
     .save(path))


def add_exports(path: str, rows: int, exports: int, touched_fraction: float = 0.02) -> None:
    """`exports` small commits on top of the table at `path`, each a minute's export: images of
    keys changed since (a twentieth of them delete markers), change sequences after the base's."""
    import pyarrow as pa
    from deltalake import DeltaTable, write_deltalake

    schema = pa.schema([("id", pa.int64()), ("customer", pa.int32()), ("amount", pa.decimal128(12, 2)),
                        ("status", pa.string()), ("_ch_seq", pa.int64()), ("_ch_deleted", pa.bool_()),
                        ("_ch_changed_at", pa.timestamp("us", tz="UTC")), ("_ch_batch_id", pa.int64()),
                        ("_ch_exported_at", pa.timestamp("us", tz="UTC")),
                        ("_ch_first_changed_at", pa.timestamp("us", tz="UTC")), (SETTLED, pa.int32())])
    rng = random.Random(22)
    per_export = max(1, int(rows * touched_fraction) // exports)
    seq = rows
    for export in range(exports):
        keys = rng.sample(range(1, rows + 1), per_export)
        at = T0 + timedelta(minutes=export + 1)
        deleted = [rng.random() < 0.05 for _ in keys]
        seqs = list(range(seq + 1, seq + 1 + len(keys)))
        seq += len(keys)
        batch = pa.table({
            "id": keys, "customer": [None if d else k % 100_000 for k, d in zip(keys, deleted)],
            "amount": [None if d else Decimal(export % 1000) + Decimal("0.25") for d in deleted],
            "status": [None if d else f"x{export % 3}" for d in deleted], "_ch_seq": seqs, "_ch_deleted": deleted,
            "_ch_changed_at": [at] * len(keys), "_ch_batch_id": [export + 2] * len(keys),
            "_ch_exported_at": [at] * len(keys), "_ch_first_changed_at": [at] * len(keys),
            SETTLED: [None] * len(keys)}, schema=schema)
        write_deltalake(path, batch, mode="append")
        if (export + 1) % 10 == 0:
            DeltaTable(path).create_checkpoint()


def compact_fully(spark: SparkSession, source: str, path: str, app_id: str, batch_id: int) -> None:
    """The data at `source`, one settled version per live key (what a compaction outside every
    history window leaves)."""
    rows = spark.read.format("delta").load(source)
    (rows.transform(latest_per_key(["id"])).filter(~F.col("_ch_deleted")).withColumn(SETTLED, F.lit(NEWEST))
     .repartition(8).write.format("delta").mode("overwrite").option("txnAppId", app_id)
     .option("txnVersion", batch_id).save(path))


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
        pinned = serve_job.pin_versions(spark, checked.tables, lake_root)
        snapshot = hot_snapshot.read(conn, pinned, checked.tables,
                                     lake_batches=serve_job.lake_batch_ids(spark, checked.tables, lake_root))
    serve_job.register_views(spark, snapshot, pinned, lake_root, None)
    return serve_job.run_query(spark, checked, {}).collect()


def spark_cold_only(spark, dsn, lake_root, sql) -> list:
    with pg.connect(dsn) as conn:
        tables = registry.load(conn)
        checked = sql_guard.check_query(sql, tables)
        columns = registry.lake_columns(conn, checked.tables[0])
    [table] = checked.tables
    path = table.lake_path(lake_root)
    version = delta.pin_version(spark, path)
    view = delta.read_version(spark, path, version).transform(cold_live(columns, split=delta.settled_split(path, version)))
    view.createOrReplaceTempView(sql_guard.view_name(table))
    return serve_job.run_query(spark, checked, {}).collect()


# The lake's current rows as Spark's `lake_rows.current_rows` computes them, in DuckDB's SQL.
DUCKDB_CURRENT = """
    lake AS (SELECT * FROM read_parquet({files})),
    fresh AS (SELECT * FROM lake WHERE _ch_settled IS NULL),
    current AS (
        SELECT * FROM lake s WHERE s._ch_settled = 1 AND NOT EXISTS (SELECT 1 FROM fresh f WHERE f.id = s.id)
        UNION ALL
        SELECT * FROM (SELECT * FROM fresh
                       UNION ALL
                       SELECT * FROM lake s WHERE s._ch_settled = 1 AND EXISTS (SELECT 1 FROM fresh f WHERE f.id = s.id))
        QUALIFY row_number() OVER (PARTITION BY id ORDER BY _ch_seq DESC, _ch_batch_id DESC) = 1)"""
DUCKDB_WINDOW = """
    current AS (
        SELECT * FROM read_parquet({files})
        QUALIFY row_number() OVER (PARTITION BY id ORDER BY _ch_seq DESC, _ch_batch_id DESC) = 1)"""


def duckdb_unified(dsn, lake_root, sql, plan: str) -> list:
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
        WITH {plan.format(files=repr(delta.file_uris()))}
        SELECT l.id, l.customer, l.amount, l.status FROM current l
        WHERE NOT l._ch_deleted AND NOT EXISTS (SELECT 1 FROM dirty d WHERE d.id = l.id)
        UNION ALL
        SELECT id, customer, amount, status FROM dirty WHERE NOT _ch_deleted""")
    return con.execute(sql).fetchall()


def _normal(rows) -> list[tuple]:
    return sorted(tuple(float(v) if hasattr(v, "as_tuple") else v for v in tuple(r)) for r in rows)


SHAPES = ("single export", "base + exports", "merged", "fully compacted")


def merge_small_files(spark: SparkSession, dsn: str, lake_root: str) -> float:
    """Compaction's merge of the export files under `lake_root`, as the job runs it; its seconds."""
    with pg.connect(dsn) as conn:
        [table] = registry.load(conn, TABLE)
        config = CompactionConfig(table=TABLE, lake_root=lake_root, run_id=f"bench-merge-{time.time_ns()}",
                                  mode="merge")
        started = time.perf_counter()
        result = compact_table(spark, conn, table, config)
        took = time.perf_counter() - started
    if result.status != "merged":
        raise AssertionError(f"the merge of the export files did nothing: {result}")
    return took


def build_shapes(spark: SparkSession, dsn: str, folder: str, rows: int, exports: int) -> tuple[dict[str, str], float]:
    """Each shape's lake root (the table at `<root>/public/bench_events`), written as the table's
    registration writes it (its exports' Delta app id), and the seconds the merge took."""
    with pg.connect(dsn) as conn:
        [registered] = registry.load(conn, TABLE)
        # As the registration's exports leave it: the base and every export batch recorded.
        conn.execute("UPDATE coldharbor.tables SET load_state = 'loaded', last_batch_id = %s WHERE table_id = %s",
                     (exports + 2, registered.table_id))
    app_id = commits.export_app_id(registered.table_id)
    roots = {shape: f"{folder}/{i}" for i, shape in enumerate(SHAPES)}
    table = f"public/{TABLE}"
    build_lake(spark, f"{roots['single export']}/{table}", rows, app_id)
    build_lake(spark, f"{roots['base + exports']}/{table}", rows, app_id)
    add_exports(f"{roots['base + exports']}/{table}", rows, exports)
    shutil.copytree(f"{roots['base + exports']}/{table}", f"{roots['merged']}/{table}")  # the log's paths are relative
    merge_seconds = merge_small_files(spark, dsn, roots["merged"])
    compact_fully(spark, f"{roots['base + exports']}/{table}", f"{roots['fully compacted']}/{table}", app_id,
                  exports + 2)
    return roots, merge_seconds


def run(rows: int = 10_000_000, dirty_fraction: float = 0.01, repeats: int = 5, exports: int = 1440,
        spark: SparkSession | None = None) -> list[Row]:
    """Every shape's figures (`bench.run_all` calls it as is: on a Connect server of its own)."""
    if spark is None:
        with on_warm_engine() as engine_session:
            return run(rows, dirty_fraction, repeats, exports, engine_session)
    results: list[Row] = []
    dirty = int(rows * dirty_fraction)
    medians: dict[tuple[str, str], float] = {}
    with temporary_postgres() as dsn, tempfile.TemporaryDirectory(prefix="coldharbor-lake-") as folder:
        build_hot_tier(dsn, rows, dirty)
        roots, merge_seconds = build_shapes(spark, dsn, folder, rows, exports)
        results.append(Row("read path", f"merge of {exports:,} export files (compact.py --mode merge)", merge_seconds,
                           "s", "", None))
        for name, sql in REPORTS.items():
            answers_of_shape: dict[str, list] = {}
            for shape, root in roots.items():
                engines: dict[str, Callable[[], list]] = {
                    "unified": lambda: spark_unified(spark, dsn, root, sql),
                    "cold-only": lambda: spark_cold_only(spark, dsn, root, sql),
                    "duckdb": lambda: duckdb_unified(dsn, root, sql, DUCKDB_CURRENT),
                    "duckdb-window": lambda: duckdb_unified(dsn, root, sql, DUCKDB_WINDOW),
                }
                answers = {engine: _normal(run_once()) for engine, run_once in engines.items()}  # also warms up
                for engine in ("duckdb", "duckdb-window"):
                    if answers["unified"] != answers[engine]:
                        raise AssertionError(f"{name}, {shape}: Spark's unified answer differs from {engine}'s")
                answers_of_shape[shape] = answers["unified"]
                times: dict[str, list[float]] = {engine: [] for engine in engines}
                for i in range(repeats):
                    order = list(engines) if i % 2 == 0 else list(reversed(engines))
                    for engine in order:
                        times[engine].append(timed(engines[engine]))
                figures = {engine: median(times[engine]) for engine in engines}
                medians.update({(shape, engine): value for engine, value in figures.items()})
                label = f"{name}, {shape}"
                results += [Row("read path", f"{label}: {engine}", figures[engine], "s", "", None) for engine in engines]
                results += [
                    Row("read path", f"{label}: unified / cold-only", figures["unified"] / figures["cold-only"], "x",
                        "<= 1.10x", figures["unified"] / figures["cold-only"] <= 1.10),
                    Row("read path", f"{label}: unified Spark / DuckDB (same plan)",
                        figures["unified"] / figures["duckdb"], "x", "<= 2x", figures["unified"] / figures["duckdb"] <= 2),
                    Row("read path", f"{label}: unified Spark / DuckDB ranking every row",
                        figures["unified"] / figures["duckdb-window"], "x", "", None),
                ]
            for shape in ("merged", "fully compacted"):
                if answers_of_shape["base + exports"] != answers_of_shape[shape]:
                    raise AssertionError(f"{name}: the {shape} lake answers differently from the lake it came from")
            for shape, label in (("base + exports", f"base + {exports:,} exports"),
                                 ("merged", f"base + {exports:,} exports merged")):
                ratio = medians[(shape, "unified")] / medians[("fully compacted", "unified")]
                results.append(Row("read path", f"{name}: {label} / fully compacted (unified)", ratio, "x",
                                   "<= 1.5x", ratio <= 1.5))
    return results


# Session settings the serve path could run with: each is measured against the defaults on the
# base + exports shape (`--settings`), and kept in spark.SESSION_CONF only when it helps.
CANDIDATE_SETTINGS = {
    "no partial window group limit": {"spark.sql.optimizer.windowGroupLimitThreshold": "-1"},
    "broadcast joins up to 64 MB": {"spark.sql.autoBroadcastJoinThreshold": str(64 * 1024 * 1024),
                                    "spark.sql.adaptive.autoBroadcastJoinThreshold": str(64 * 1024 * 1024)},
    "reader batches of 16,384 rows": {"spark.sql.parquet.columnarReaderBatchSize": "16384"},
    "splits of 32 MB": {"spark.sql.files.maxPartitionBytes": str(32 * 1024 * 1024)},
    "8 shuffle partitions": {"spark.sql.shuffle.partitions": "8"},
}


def run_settings(rows: int, dirty_fraction: float, repeats: int, exports: int, spark: SparkSession) -> list[Row]:
    """The unified reports on the base + exports shape under each candidate setting, interleaved
    with the defaults: median seconds and the ratio to the defaults (below 1: faster)."""
    from coldharbor.runtime.spark import temporary_conf

    results: list[Row] = []
    with temporary_postgres() as dsn, tempfile.TemporaryDirectory(prefix="coldharbor-lake-") as folder:
        build_hot_tier(dsn, rows, int(rows * dirty_fraction))
        with pg.connect(dsn) as conn:
            [registered] = registry.load(conn, TABLE)
            conn.execute("UPDATE coldharbor.tables SET load_state = 'loaded', last_batch_id = %s WHERE table_id = %s",
                         (exports + 1, registered.table_id))
        path = f"{folder}/public/{TABLE}"
        build_lake(spark, path, rows, commits.export_app_id(registered.table_id))
        add_exports(path, rows, exports)
        variants = {"defaults": {}, **CANDIDATE_SETTINGS}
        for name, sql in REPORTS.items():
            expected = _normal(spark_unified(spark, dsn, folder, sql))
            times: dict[str, list[float]] = {variant: [] for variant in variants}
            for i in range(repeats + 1):
                order = list(variants) if i % 2 == 0 else list(reversed(variants))
                for variant in order:
                    with temporary_conf(spark, variants[variant]):
                        answer: list = []
                        took = timed(lambda: answer.extend(spark_unified(spark, dsn, folder, sql)))
                    if _normal(answer) != expected:
                        raise AssertionError(f"{name} under {variant}: a different answer")
                    if i:  # the first round warms up
                        times[variant].append(took)
            base = median(times["defaults"])
            for variant in variants:
                value = median(times[variant])
                results.append(Row("read settings", f"{name}, base + {exports:,} exports: {variant}", value, "s", "", None))
                if variant != "defaults":
                    results.append(Row("read settings", f"{name}: {variant} / defaults", value / base, "x", "", None))
    return results


@contextmanager
def on_warm_engine() -> Iterator[SparkSession]:
    """A session on a Spark Connect server as `make run` starts one (local[2], loopback)."""
    from coldharbor.runtime.spark import connect_session

    from bench.engine import connect_server

    with tempfile.TemporaryDirectory(prefix="coldharbor-bench-engine-") as folder, \
            connect_server(Path(folder) / "server.log") as (url, _):
        yield connect_session(url, "coldharbor-bench-read-path")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument("--dirty-fraction", type=float, default=0.01)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--exports", type=int, default=1440, help="minute-sized exports on the base (default: a day)")
    parser.add_argument("--settings", action="store_true",
                        help="instead: the unified reports on base + exports under each candidate Spark setting")
    args = parser.parse_args(argv)
    with on_warm_engine() as spark:
        figures = run_settings if args.settings else run
        print(render(figures(args.rows, args.dirty_fraction, args.repeats, args.exports, spark=spark)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

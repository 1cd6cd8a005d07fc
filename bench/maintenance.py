"""Maintenance benchmark (issue: lake maintenance): what compaction buys a table that per-minute
exports built.

    python -m bench.maintenance [--exports 10000] [--rows-per-export 100]

The table: `exports` small Parquet files of `rows-per-export` lake rows each, one per export as
a per-minute export writes them, keys drawn from a pool a fifth the size of the total so busy keys
have many versions, 2% delete markers. They are written with pyarrow and committed to Delta, ten
to a commit, with the `deltalake` package, because 10,000 spark-submit runs would take hours; the
files a report has to open are the same either way.

The table is copied, the copy compacted (timed), and the same report is then run on both copies,
interleaved, through serve_report's path: the ratio of the medians is the speed-up. Targets are
printed, never asserted.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import sys
import tempfile
import uuid
from datetime import datetime, timedelta, timezone

import numpy as np
import pyarrow as pa
from coldharbor.capture import registry
from coldharbor.lake import delta
from coldharbor.maintenance.compaction import compact_table
from coldharbor.maintenance.compaction_plan import CompactionConfig
from coldharbor.runtime import pg
from coldharbor.serve import serve_cli

from bench.common import Row, median, render, temporary_postgres, timed

DDL = "id bigint PRIMARY KEY, customer integer, amount numeric(12,2), status text"
REPORT = "SELECT status, count(*) AS n, sum(amount) AS total, max(customer) AS c FROM {table} GROUP BY status"
TARGET_FILE_BYTES = 128 * 1024 * 1024


def export_rows(batch: int, rows_per_export: int, keys: int, start: datetime, rng) -> pa.Table:
    """The lake rows one per-minute export writes: keys drawn from the pool, 2% delete markers."""
    ids = rng.integers(1, keys + 1, rows_per_export)
    stamp = pa.array([start + timedelta(minutes=batch)] * rows_per_export, pa.timestamp("us", tz="UTC"))
    return pa.table({
        "id": pa.array(ids, pa.int64()),
        "customer": pa.array(ids % 1000, pa.int32()),
        "amount": pa.array([f"{(i % 10000) / 100:.2f}" for i in ids]).cast(pa.decimal128(12, 2)),
        "status": pa.array([f"s{(i + batch) % 5}" for i in ids]),
        "_ch_seq": pa.array(np.arange(batch * rows_per_export, (batch + 1) * rows_per_export), pa.int64()),
        "_ch_deleted": pa.array(rng.random(rows_per_export) < 0.02),
        "_ch_changed_at": stamp,
        "_ch_batch_id": pa.array(np.full(rows_per_export, batch), pa.int64()),
        "_ch_exported_at": stamp,
    })


def _stats(rows: pa.Table) -> str:
    """Delta file statistics (what Spark's writer records): counts, min/max of the numeric columns."""
    import pyarrow.compute as pc

    numeric = ("id", "_ch_seq", "_ch_batch_id")
    bounds = {name: pc.min_max(rows[name]).as_py() for name in numeric}
    return json.dumps({"numRecords": rows.num_rows,
                       "minValues": {n: b["min"] for n, b in bounds.items()},
                       "maxValues": {n: b["max"] for n, b in bounds.items()},
                       "nullCount": {n: 0 for n in numeric}})


def build_table(path: str, exports: int, rows_per_export: int, files_per_commit: int = 10, seed: int = 7) -> None:
    """`exports` small Parquet files, one per export, changed a minute apart (5+ weeks ago, so
    outside the default history window: compaction may drop superseded versions), committed
    `files_per_commit` to a Delta commit through `deltalake` (a commit costs it ~30-250 ms as the
    log grows; one per file would make the set-up longer than the benchmark)."""
    import pyarrow.parquet as pq
    from deltalake import DeltaTable, write_deltalake
    from deltalake.transaction import AddAction

    rng = np.random.default_rng(seed)
    keys = max(1, exports * rows_per_export // 5)
    start = datetime.now(timezone.utc) - timedelta(days=35)
    write_deltalake(path, export_rows(1, rows_per_export, keys, start, rng), mode="append")
    table = DeltaTable(path)
    schema = table.schema()
    for first in range(2, exports + 1, files_per_commit):
        actions = []
        for batch in range(first, min(first + files_per_commit, exports + 1)):
            rows = export_rows(batch, rows_per_export, keys, start, rng)
            name = f"part-{batch:05d}-{uuid.uuid4()}.snappy.parquet"
            pq.write_table(rows, f"{path}/{name}", compression="snappy")
            actions.append(AddAction(path=name, size=os.path.getsize(f"{path}/{name}"), partition_values={},
                                     modification_time=int(datetime.now().timestamp() * 1000), data_change=True,
                                     stats=_stats(rows)))
        table.create_write_transaction(actions, mode="append", schema=schema)
        table.update_incremental()


def run(exports: int = 10_000, rows_per_export: int = 100, repeats: int = 3) -> list[Row]:
    from coldharbor.runtime.spark import get_session

    spark = get_session("coldharbor-bench-maintenance")
    spark.sparkContext.setLogLevel("ERROR")
    with temporary_postgres() as dsn, tempfile.TemporaryDirectory(prefix="coldharbor-lake-") as lake_root:
        small, compacted = f"{lake_root}/small_files", f"{lake_root}/compacted"
        build_seconds = timed(lambda: build_table(small, exports, rows_per_export))
        shutil.copytree(small, compacted)
        with pg.connect(dsn) as conn:
            for name, path in (("events_small", small), ("events_compacted", compacted)):
                conn.execute(f"CREATE TABLE {name} ({DDL})")
                conn.execute("SELECT coldharbor.register_table(%s, p_lake_location => %s)", (name, path))
            [table] = registry.load(conn, "public.events_compacted")
            config = CompactionConfig(table=None, lake_root=lake_root, run_id=f"bench-{uuid.uuid4().hex[:8]}",
                                      target_file_bytes=TARGET_FILE_BYTES)
            before = delta.snapshot(spark, compacted)
            outcome = {}
            compaction_seconds = timed(lambda: outcome.update(r=compact_table(spark, conn, table, config)))
        after = delta.snapshot(spark, compacted)
        [part] = outcome["r"].partitions

        def report(name: str) -> float:
            args = ["--lake-root", lake_root, "--sql", REPORT.format(table=name), "--target", f"adhoc_{name}"]
            return timed(lambda: _check(serve_cli.main(args)))

        os.environ["COLDHARBOR_PG_DSN"] = dsn
        report("events_small"), report("events_compacted")  # warm-up: JIT, caches, jars
        latencies = {"events_small": [], "events_compacted": []}
        for r in range(repeats):
            for name in (("events_small", "events_compacted") if r % 2 == 0 else ("events_compacted", "events_small")):
                latencies[name].append(report(name))
        with pg.connect(dsn) as conn:
            answers = [conn.execute(f"SELECT * FROM reports.adhoc_{n} ORDER BY status").fetchall()
                       for n in ("events_small", "events_compacted")]
        if answers[0] != answers[1]:
            raise AssertionError(f"the compacted table answers differently: {answers}")

    slow, fast = median(latencies["events_small"]), median(latencies["events_compacted"])
    allowed = math.ceil(after.bytes / TARGET_FILE_BYTES) + 1  # one partition
    rows_total = exports * rows_per_export
    return [
        Row("maintenance", f"build: {exports:,} exports of {rows_per_export} rows (deltalake, 10 files a commit)",
            build_seconds, "s", "", None),
        Row("maintenance", "compaction time", compaction_seconds, "s", "", None),
        Row("maintenance", "compaction throughput", rows_total / compaction_seconds, "rows/s", "", None),
        Row("maintenance", "files before compaction", len(before.files), "files", "", None),
        Row("maintenance", "files after compaction", len(after.files), "files", f"<= {allowed}",
            len(after.files) <= allowed),
        Row("maintenance", "bytes before compaction", before.bytes / 1e6, "MB", "", None),
        Row("maintenance", "bytes after compaction", after.bytes / 1e6, "MB", "", None),
        Row("maintenance", "rows before -> after (versions / markers dropped)", part.rows_after, "rows",
            f"from {part.rows_before:,} ({part.versions_dropped:,} / {part.markers_dropped:,})", None),
        Row("maintenance", f"report latency before compaction (median of {repeats})", slow, "s", "", None),
        Row("maintenance", f"report latency after compaction (median of {repeats})", fast, "s", "", None),
        Row("maintenance", "report speed-up after compaction", slow / fast, "x", ">= 3x", slow / fast >= 3),
    ]


def _check(code: int) -> None:
    if code != 0:
        raise RuntimeError(f"serve_report exited {code}")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--exports", type=int, default=10_000)
    parser.add_argument("--rows-per-export", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    print(render(run(args.exports, args.rows_per_export, args.repeats)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""verify: prove that a table's unified view equals PostgreSQL, at one snapshot, chunk by chunk.

The view is what every report reads (invariant 6): lake@V minus the dirty keys plus their hot
images. Both sides are cut into the same chunks -- key ranges of the first key column when it is
an integer, date or timestamp (bounds from PostgreSQL's min and max, read through the key's index),
else hash buckets of the key -- and each chunk's row count and XOR of row digests are compared.
PostgreSQL counts and digests its rows itself, in parallel readers of block ranges that import the
snapshot the dirty set is read in; Spark digests the view's rows the same way (`row_digest`,
`verify_digests`). Rows are read only for the chunks that differ, to name sample keys and what is
wrong with each.

Exit codes: 0 in sync, 1 differences found, 2 refused (unknown table, a tier unreachable, a value the
lake cannot hold exactly, see `lake_values`) or an unexpected error (one line naming it; never exit 1).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass, field

import psycopg
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from coldharbor.capture import registry
from coldharbor.capture.registry import LakeColumn, RegisteredTable
from coldharbor.capture.table_job import jdbc_target, registered, table_job_main
from coldharbor.export import base_state, batches, table_reader
from coldharbor.export.table_reader import TableSnapshot
from coldharbor.lake import commits, delta, lake_values
from coldharbor.lake.lake_rows import column
from coldharbor.maintenance import maintenance_runs, verify_digests
from coldharbor.maintenance.verify_digests import CHUNK, HASH, WEIGHT, Chunking
from coldharbor.maintenance.verify_samples import differing_chunks, sample_differences, shown
from coldharbor.runtime import pg, settings
from coldharbor.runtime.errors import ColdharborError, ConfigError, LakeUnavailableError, jvm_message
from coldharbor.runtime.job_main import EXIT_DIFFERENT, EXIT_REFUSED, job_parser
from coldharbor.runtime.spark_python import collectable, collected
from coldharbor.serve import hot_snapshot

DEFAULT_CHUNKS = 16
# PostgreSQL's rows are digested from their exact values, but the dirty keys' hot images reach the
# view through the readers, and a lake exported before such values were refused may hold them moved
# or clamped: such a table is refused, naming the value.
VERIFY_REFUSED = ("the table cannot be verified until the value is changed (a lake exported before such values were "
                  "refused may hold it moved or clamped); change it: the next export carries the change")


@dataclass(frozen=True)
class VerifyConfig:
    table: str
    lake_root: str
    chunks: int
    run_id: str


@dataclass(frozen=True)
class Chunk:
    chunk: int
    rows: int
    hash: int
    first_key: object
    last_key: object


@dataclass
class VerifyResult:
    table: str
    rows: int
    chunks: int
    lake_version: int | None
    differing: list[dict] = field(default_factory=list)   # per differing chunk: both sides' figures
    samples: list[dict] = field(default_factory=list)     # sample keys and what is wrong with each

    @property
    def in_sync(self) -> bool:
        return not self.differing

    def summary(self) -> str:
        if self.in_sync:
            return f"{self.table} in sync: {self.rows} rows in {self.chunks} chunks (lake version {self.lake_version})"
        ranges = "; ".join(f"chunk {d['chunk']} (keys {shown(d['first_key'])} .. {shown(d['last_key'])}): "
                           f"view {d['view_rows']} "
                           f"rows, PostgreSQL {d['pg_rows']} rows" for d in self.differing)
        samples = ", ".join(f"{s['key']} {s['problem']}" for s in self.samples)
        return (f"{self.table} NOT in sync at lake version {self.lake_version}: {len(self.differing)} of "
                f"{self.chunks} chunks differ: {ranges}; sample keys: {samples}")


def postgres_chunks(spark: SparkSession, conn: psycopg.Connection, jdbc: pg.JdbcTarget, snapshot: TableSnapshot,
                    table: RegisteredTable, columns: Sequence[LakeColumn], chunks: Chunking,
                    utf8: bool) -> dict[int, Chunk]:
    """PostgreSQL's figures per chunk, computed by the server in the snapshot; refuses (naming it)
    a row holding a value the lake cannot hold exactly."""
    shares = table_reader.read_shares(spark, conn, jdbc, snapshot, lambda share: verify_digests.pg_figures_query(
        table, columns, chunks, utf8, share))
    # Hash buckets have no bounds (NULL text): only range bounds have the key's type.
    lake_type = chunks.keys[0].lake_type if chunks.by_range else None
    found = (shares.groupBy(column(CHUNK))
             .agg(F.sum(column("rows")).alias("rows"), F.bit_xor(column("hash")).alias("hash"),
                  collectable(F.min(column("first_key")), lake_type).alias("first"),
                  collectable(F.max(column("last_key")), lake_type).alias("last"),
                  F.min(column("problem")).alias("problem")).collect())
    problems = sorted(r["problem"] for r in found if r["problem"] is not None)
    if problems:
        raise lake_values.refusal(table.qualified_name, problems[0], VERIFY_REFUSED)
    return {r[CHUNK]: Chunk(r[CHUNK], r["rows"], r["hash"], collected(r["first"], lake_type),
                            collected(r["last"], lake_type)) for r in found}


def view_chunks(view: DataFrame, first_key: LakeColumn) -> dict[int, Chunk]:
    live = column(WEIGHT) > 0
    key = column(first_key.name)
    found = view.groupBy(column(CHUNK)).agg(F.sum(column(WEIGHT)).alias("rows"), F.bit_xor(column(HASH)).alias("hash"),
                                    collectable(F.min(F.when(live, key)), first_key.lake_type).alias("first"),
                                    collectable(F.max(F.when(live, key)), first_key.lake_type).alias("last")).collect()
    return {r[CHUNK]: Chunk(r[CHUNK], r["rows"], r["hash"], collected(r["first"], first_key.lake_type),
                            collected(r["last"], first_key.lake_type)) for r in found if r["rows"] or r["hash"]}


def refuse_missing_lake(conn: psycopg.Connection, table: RegisteredTable, path: str) -> None:
    """No lake table at `path`, although a batch of the table landed there: the unified view would be
    PostgreSQL alone, and comparing it with PostgreSQL would say "in sync" of a lake that is not
    there (a mistyped --lake-root, a removed folder). An empty table's load writes no lake table."""
    landed = conn.execute("SELECT max(finished_at) FROM coldharbor.export_batches WHERE table_id = %s "
                          "AND state = 'flushed'", (table.table_id,)).fetchone()[0]
    if landed is not None:
        raise LakeUnavailableError(
            f"the lake table of {table.qualified_name} is missing at {path}, but batches of it landed there "
            f"(the last at {landed}); the lake location (--lake-root, COLDHARBOR_LAKE_ROOT) is wrong or the "
            "folder was removed: nothing to verify")


def verify_table(spark: SparkSession, conn: psycopg.Connection, jdbc: pg.JdbcTarget, table: RegisteredTable,
                 config: VerifyConfig) -> VerifyResult:
    path = table.lake_path(config.lake_root)
    # A folder another registration wrote blocks the next export too: say that, not "wait for it".
    commits.require_own_lake(spark, path, commits.export_app_id(table.table_id), table.quoted_name)
    state = base_state.load_state(conn, table.table_id)
    if state.rebase_pending:
        raise ConfigError(f"{table.qualified_name} cannot be verified yet: its lake rows are being rebuilt from "
                          f"PostgreSQL ({state.rebase_reason}); the next export writes the new base")
    if state.pending:
        raise ConfigError(f"{table.qualified_name} cannot be verified yet: its initial load has not landed "
                          "(the next export writes it)")
    registry.require_privileges(conn, table)
    columns = registry.lake_columns(conn, table)
    version = delta.pin_version(spark, path)
    if version is None:
        refuse_missing_lake(conn, table, path)
    refuse_if_lake_ahead(spark, conn, table, path)
    utf8 = verify_digests.server_is_utf8(conn)
    with conn.transaction():
        # One snapshot: the dirty set and PostgreSQL's figures both come from it.
        conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        registry.guard_read(conn, table)  # before the snapshot
        snapshot = table_reader.export_snapshot(conn, table)
        chunks = verify_digests.chunking(conn, table, columns, config.chunks)
        pg_chunks = postgres_chunks(spark, conn, jdbc, snapshot, table, columns, chunks, utf8)
        hot = hot_snapshot.read_in_transaction(conn, {table.table_id: version}, [table]).tables[table.table_id]
        compared = Compared(spark, conn, jdbc, snapshot, table, hot, version, config.lake_root, chunks)
        try:
            view = compared.view(verify_digests.biggest_batch(conn, table, version))
            result = VerifyResult(table.qualified_name, sum(c.rows for c in pg_chunks.values()), config.chunks, version,
                                  differing_chunks(view_chunks(view, chunks.keys[0]), pg_chunks))
            if result.differing:
                bad = [d["chunk"] for d in result.differing]
                in_bad = column(CHUNK).isin(bad)
                postgres = table_reader.read_shares(spark, conn, jdbc, snapshot, lambda share: (
                    verify_digests.pg_digests_query(table, columns, chunks, utf8, bad, share)))
                postgres = postgres.select(*verify_digests.typed_keys(postgres, chunks.keys), column(HASH))
                twice = compared.restricted(verify_digests.keys_twice_in_a_batch(spark, hot, version, config.lake_root))
                result.samples = sample_differences(compared.view(None).filter(in_bad), postgres,
                                                    chunks.with_chunk(twice).filter(in_bad), chunks.keys)
        except Exception as exc:
            if delta.files_gone(exc):
                raise LakeUnavailableError(f"files of lake version {version} of {table.qualified_name} are gone: "
                                           f"{jvm_message(exc)}") from exc
            raise
    return result


class LakeAheadOfPostgresError(ColdharborError):
    """The lake holds batches PostgreSQL never recorded (it was restored from a backup): the lake is
    not PostgreSQL's past, and comparing the two would only list the restore's differences."""


def refuse_if_lake_ahead(spark: SparkSession, conn: psycopg.Connection, table: RegisteredTable, path: str) -> None:
    """LakeAheadOfPostgresError, naming the way out, when the lake committed a batch id PostgreSQL
    has not used (`commits.check_batch_id`; the lake's figure is read first, as the export reads it)."""
    lake_batch_id = commits.committed_txn_version(spark, path, commits.export_app_id(table.table_id))
    try:
        commits.check_batch_id(lake_batch_id, batches.next_batch_id(conn, table.table_id), table.qualified_name)
    except commits.LakeAheadError as exc:
        raise LakeAheadOfPostgresError(
            f"{table.quoted_name} cannot be verified: the lake is ahead of PostgreSQL (restored from a backup?): "
            f"{exc.detail}, so the lake's later commits are not PostgreSQL's past; rebuild the table's lake state "
            f"from PostgreSQL with `jobs/resync.py --table {table.cli_name}`, then verify again") from None


@dataclass(frozen=True)
class Compared:
    """What verify compares PostgreSQL with: the unified view at `version`, chunked."""

    spark: SparkSession
    conn: psycopg.Connection
    jdbc: pg.JdbcTarget
    snapshot: TableSnapshot
    table: RegisteredTable
    hot: hot_snapshot.HotTable
    version: int | None
    lake_root: str
    chunks: Chunking

    def restricted(self, rows: DataFrame) -> DataFrame:
        """`rows` of the keys to compare: a tiered table's evicted rows are in the lake alone by
        design, so only the keys PostgreSQL holds count there."""
        if not base_state.keeps_lake_only_rows(self.conn, self.table):
            return rows
        held = table_reader.read_table(self.spark, self.conn, self.jdbc, self.snapshot, self.table, self.chunks.keys)
        return rows.join(held.select(*verify_digests.typed_keys(held, self.chunks.keys)),
                         on=[k.name for k in self.chunks.keys], how="left_semi")

    def view(self, biggest_batch: int | None) -> DataFrame:
        """The view's weighted rows with their CHUNK (`verify_digests.view_digests`); without a
        `biggest_batch`, its rows exactly (every weight 1)."""
        rows = verify_digests.view_digests(self.spark, self.hot, self.version, self.lake_root, biggest_batch)
        return self.chunks.with_chunk(self.restricted(rows))


def parse_args(argv: list[str]) -> VerifyConfig:
    parser = job_parser(
        "verify.py",
        "Compare a registered table's unified view (lake minus dirty keys plus hot images) with PostgreSQL at one "
        "snapshot, chunk by chunk. Exit 0 in sync, 1 differences found, 2 refused or failed (one line says why). "
        f"PostgreSQL is reached through {settings.PG_DSN_ENV}.",
        run_id_help="identifier recorded in coldharbor.maintenance_runs (default: a new one)")
    parser.add_argument("--chunks", type=int, default=DEFAULT_CHUNKS,
                        help=f"chunks to compare (default {DEFAULT_CHUNKS})")
    args = parser.parse_args(argv)
    if not 1 <= args.chunks <= 100_000:
        parser.error(f"--chunks must be between 1 and 100000, got {args.chunks}")
    return VerifyConfig(args.table, settings.lake_root(args.lake_root), args.chunks,
                        args.run_id or maintenance_runs.new_run_id("verify"))


def run(spark: SparkSession, conn: psycopg.Connection, config: VerifyConfig) -> int:
    """Verifies the table, records the run and prints its summary: exit 0 in sync, 1 differences."""
    table = registered(conn, config.table)
    with maintenance_runs.recorded(conn, config.run_id, table.table_id, "verify"):
        result = verify_table(spark, conn, jdbc_target(), table, config)
    detail = {"result": "in sync" if result.in_sync else "differences", "rows": result.rows,
              "chunks": result.chunks, "differing": result.differing, "samples": result.samples}
    maintenance_runs.finish(conn, config.run_id, table.table_id, "verify",
                            "succeeded" if result.in_sync else "failed", detail, result.lake_version,
                            None if result.in_sync else result.summary()[:2000])
    print(result.summary(), flush=True)
    return 0 if result.in_sync else EXIT_DIFFERENT


def main(argv: list[str]) -> int:
    # Exit 1 says "differences found" alone: an error no check foresaw is one line and exit 2 too.
    return table_job_main("verify", argv, parse_args, run, unexpected_exit=EXIT_REFUSED)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

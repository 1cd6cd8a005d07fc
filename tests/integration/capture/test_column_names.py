"""Column names Spark would parse: a '.' (a struct field to Spark), a backtick (a quoted part), a
double quote, a non-ASCII letter, in the key and out of it. Registration accepts them and Delta
stores them; every job must take them as the names they are. Each step is compared to PostgreSQL."""

from __future__ import annotations

import time
import uuid
from datetime import timedelta

from coldharbor.capture import registry
from coldharbor.maintenance import resync, verify
from coldharbor.maintenance.cleanup import CleanupConfig, cleanup_table
from coldharbor.maintenance.compaction import compact_table
from coldharbor.maintenance.compaction_plan import CompactionConfig
from coldharbor.maintenance.purge import PurgeConfig, purge
from coldharbor.runtime import pg
from delta.tables import DeltaTable

from tests.connect_server import run_job
from tests.helpers import export, lake_live, pg_rows, serve_report

KEYS = ["k.1", "k`2"]
# PostgreSQL spellings: "k.1", "k`2", "a.b", "x`y", "ü.1", "q" with its double quotes, "s.t"
DDL = ('"k.1" bigint, "k`2" text, "a.b" text, "x`y" integer, "ü.1" numeric(10,2), """q""" text, "s.t" date, '
       'PRIMARY KEY ("k.1", "k`2")')
COLUMNS = '"k.1", "k`2", "a.b", "x`y", "ü.1", """q""", "s.t"'
ROWS = ("SELECT g, 'p' || (g % 2), 'a' || g, g * 10, g * 1.5, 'q\"' || g, date '2024-01-01' + g "
        "FROM generate_series(1, {n}) g")


def backticked(name: str) -> str:
    """A name as Spark SQL quotes it."""
    return "`" + name.replace("`", "``") + "`"


def make_table(conn, name: str, rows: int = 30) -> registry.RegisteredTable:
    """A table holding rows before it is registered (an initial load), partitioned by the key
    column with a backtick, sorted by the column with a dot."""
    conn.execute(f"CREATE TABLE {name} ({DDL})")
    conn.execute(f"INSERT INTO {name} ({COLUMNS}) {ROWS.format(n=rows)}")
    conn.execute("SELECT coldharbor.register_table(%s, p_partition_by => %s, p_sort_by => %s)",
                 (name, ["k`2"], ["a.b"]))
    return registry.load(conn, name)[0]


def change(conn, name: str, round_: int) -> None:
    conn.execute(f'UPDATE {name} SET "a.b" = %s, "x`y" = "x`y" + 1 WHERE mod("k.1", 5) = %s', (f"u{round_}", round_ % 5))
    conn.execute(f'DELETE FROM {name} WHERE "k.1" = %s', (round_ * 3,))
    conn.execute(f"INSERT INTO {name} ({COLUMNS}) VALUES (%s, 'p0', 'new', 1, 2.5, %s, date '2025-01-01')",
                 (1000 + round_, f'"{round_}"'))


def same_as_postgres(spark, conn, lake_root: str, name: str) -> dict:
    expected = pg_rows(conn, f"SELECT * FROM {name}", KEYS)
    assert lake_live(spark, lake_root, name, KEYS) == expected
    return expected


def test_a_table_whose_column_names_spark_would_parse_goes_through_every_job(
        spark, pg_dsn, pg_conn, table_name, lake_root, monkeypatch):
    table = make_table(pg_conn, table_name)
    assert {c.name for c in registry.lake_columns(pg_conn, table)} >= {"a.b", "x`y", "ü.1", '"q"', "s.t"}
    export(spark, pg_dsn, table_name, lake_root)                      # the initial load, then the export
    same_as_postgres(spark, pg_conn, lake_root, table_name)
    for round_ in (1, 2, 3):
        change(pg_conn, table_name, round_)
        export(spark, pg_dsn, table_name, lake_root)
        same_as_postgres(spark, pg_conn, lake_root, table_name)

    with pg.connect(pg_dsn) as conn:
        compacted = compact_table(spark, conn, table, CompactionConfig(
            None, lake_root, f"c-{table_name}", min_small_files=2, history_window=timedelta(0)))
    assert compacted.status == "compacted" and compacted.partitions, compacted
    assert {p.partition["k`2"] for p in compacted.partitions if p.status == "compacted"} == {"p0", "p1"}
    same_as_postgres(spark, pg_conn, lake_root, table_name)

    # Served: the lake's rows and the dirty ones' hot images, named with backticks.
    then = pg_conn.execute("SELECT clock_timestamp()").fetchone()[0]
    then_rows = pg_rows(pg_conn, f"SELECT * FROM {table_name}", KEYS)
    time.sleep(0.05)
    change(pg_conn, table_name, 4)
    report = (f"SELECT {', '.join(backticked(c) for c in ['k.1', 'k`2', 'a.b', 'x`y', 'ü.1', 's.t'])}, "
              f"`\"q\"` AS q FROM {table_name} WHERE `x``y` > 0")
    target = f"adhoc_names_{uuid.uuid4().hex[:6]}"
    assert serve_report(monkeypatch, pg_dsn, lake_root, "--sql", report, "--target", target) == 0
    expected = {k: {**{c: v for c, v in row.items() if c != '"q"'}, "q": row['"q"']}
                for k, row in pg_rows(pg_conn, f"SELECT * FROM {table_name}", KEYS).items()}
    assert pg_rows(pg_conn, f"SELECT * FROM reports.{target}", KEYS) == expected
    assert serve_report(monkeypatch, pg_dsn, lake_root, "--sql", f"SELECT * FROM {table_name}",
                        "--target", target, "--as-of", then.isoformat()) == 0
    assert pg_rows(pg_conn, f"SELECT * FROM reports.{target}", KEYS) == then_rows

    # Verify: in sync with changes dirty; a lake row removed by hand is found by its key; resync repairs it.
    assert run_verify(spark, pg_dsn, table_name, lake_root).in_sync
    export(spark, pg_dsn, table_name, lake_root)
    DeltaTable.forPath(spark, table.lake_path(lake_root)).delete("`k.1` = 7 AND `k``2` = 'p1'")
    found = run_verify(spark, pg_dsn, table_name, lake_root)
    assert not found.in_sync and any("7" in str(s["key"]) and "p1" in str(s["key"]) for s in found.samples), found
    with pg.connect(pg_dsn) as conn:
        resync.resync_table(spark, conn, pg.JdbcTarget.from_dsn(pg_dsn), table,
                            resync.ResyncConfig(table_name, lake_root, f"r-{table_name}"))
    assert run_verify(spark, pg_dsn, table_name, lake_root).in_sync
    before = same_as_postgres(spark, pg_conn, lake_root, table_name)

    # Purge one key by a predicate naming the columns as PostgreSQL does.
    with pg.connect(pg_dsn) as conn:
        purged = purge(spark, conn, table, PurgeConfig(table_name, '"k.1" = 11 AND "k`2" = \'p1\'', lake_root,
                                                       f"p-{table_name}", timedelta(0), allow_short_retention=True))
    assert purged.complete and purged.keys_purged == 1, purged
    assert same_as_postgres(spark, pg_conn, lake_root, table_name) == {k: v for k, v in before.items()
                                                                         if k != (11, "p1")}
    with pg.connect(pg_dsn) as conn:
        cleaned = cleanup_table(spark, conn, table, CleanupConfig(table_name, lake_root, f"cl-{table_name}",
                                                                  timedelta(0), allow_short_retention=True))
    assert cleaned.status == "cleaned" and cleaned.change_log_pruned, cleaned
    same_as_postgres(spark, pg_conn, lake_root, table_name)


def run_verify(spark, dsn: str, name: str, lake_root: str) -> verify.VerifyResult:
    with pg.connect(dsn) as conn:
        [table] = registry.load(conn, name)
        return verify.verify_table(spark, conn, pg.JdbcTarget.from_dsn(dsn), table,
                                   verify.VerifyConfig(name, lake_root, 4, f"v-{uuid.uuid4().hex[:6]}"))


def test_the_export_job_over_connect_takes_the_names_as_they_are(connect_server, on_connect, own_database,
                                                                 lake_root):
    """Spark Connect resolves names on the server: the job as the DAG runs it, on the warm engine."""
    from coldharbor.runtime.spark import get_session

    admin_dsn, pg_dsn = own_database
    name = f"cols_{uuid.uuid4().hex[:6]}"
    with pg.connect(admin_dsn) as conn:
        make_table(conn, name)
        for round_ in (0, 1):
            if round_:
                change(conn, name, round_)
            done = run_job("cdc_export.py", connect_server.url, pg_dsn, lake_root)
            assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr[-3000:]
        checked = run_job("verify.py", connect_server.url, pg_dsn, lake_root, "--table", name)
        assert checked.returncode == 0 and "in sync" in checked.stdout + checked.stderr, checked.stderr[-3000:]
        same_as_postgres(get_session("coldharbor-test-reader"), conn, lake_root, name)

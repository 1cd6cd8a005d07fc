"""Cleanup and eviction against real PostgreSQL and Spark + Delta."""

from __future__ import annotations

import os
import shutil
import time
from datetime import timedelta
from pathlib import Path

import pytest
from coldharbor.capture import registry
from coldharbor.lake import delta
from coldharbor.maintenance.cleanup import CleanupConfig, cleanup_tables
from coldharbor.maintenance.cleanup import main as cleanup_main
from coldharbor.maintenance.compaction import compact_table
from coldharbor.maintenance.compaction_plan import CompactionConfig
from coldharbor.runtime import pg
from coldharbor.runtime.errors import ConfigError
from coldharbor.serve import report_runs
from coldharbor.serve.report_runs import RunRecord

from tests.helpers import dirty_ids, export, lake_live, pg_rows, report_run, serve_report, spark_submit_export


def register(conn, name: str, hot_retention: str | None = None) -> registry.RegisteredTable:
    conn.execute(f"CREATE TABLE {name} (id bigint PRIMARY KEY, v text)")
    conn.execute("SELECT coldharbor.register_table(%s, p_hot_retention => %s::interval)", (name, hot_retention))
    return registry.load(conn, name)[0]


def cleanup(spark, dsn, lake_root, table: str | None, **overrides):
    settings = {"table": table, "lake_root": lake_root, "run_id": f"test-{time.time()}",
                "retention": timedelta(hours=1), "allow_short_retention": True}
    with pg.connect(dsn) as conn:
        return cleanup_tables(spark, conn, CleanupConfig(**{**settings, **overrides}))


def age(path: Path, minutes: float) -> None:
    stamp = time.time() - minutes * 60
    os.utime(path, (stamp, stamp))


def data_files(folder: Path) -> set[str]:
    return {p.name for p in folder.glob("*.parquet")}


def test_vacuum_removes_unreferenced_files_only_once_older_than_the_retention(
        spark, pg_dsn, pg_conn, table_name, lake_root):
    table = register(pg_conn, table_name)
    for i in range(3):
        pg_conn.execute(f"INSERT INTO {table_name} VALUES ({i}, 'a') ON CONFLICT (id) DO UPDATE SET v = 'b'")
        export(spark, pg_dsn, table_name, lake_root)
    with pg.connect(pg_dsn) as conn:
        compact_table(spark, conn, table, CompactionConfig(None, lake_root, "c", min_small_files=2))
    cleanup(spark, pg_dsn, lake_root, table_name)  # sets the table's retention to the configured hour
    folder = Path(table.lake_path(lake_root))
    replaced = data_files(folder)  # all tombstoned by the compaction just now, except its output
    # Files no version references, as a writer killed before its commit leaves them.
    sample = next(folder.glob("*.parquet"))
    just_inside, just_outside = folder / "part-99998-orphan.snappy.parquet", folder / "part-99999-orphan.snappy.parquet"
    shutil.copy(sample, just_inside)
    shutil.copy(sample, just_outside)
    age(just_inside, 59)
    age(just_outside, 61)
    expected = lake_live(spark, lake_root, table_name, ["id"])

    [dry] = cleanup(spark, pg_dsn, lake_root, table_name, dry_run=True)
    assert [Path(f).name for f in dry.vacuumed_files] == [just_outside.name]
    assert just_outside.exists()

    [done] = cleanup(spark, pg_dsn, lake_root, table_name)
    assert [Path(f).name for f in done.vacuumed_files] == [just_outside.name]
    assert not just_outside.exists() and just_inside.exists()
    assert replaced <= data_files(folder)  # tombstoned 0 minutes ago: inside the retention
    assert lake_live(spark, lake_root, table_name, ["id"]) == expected

    [again] = cleanup(spark, pg_dsn, lake_root, table_name)
    assert again.vacuumed_files == []
    age(just_inside, 61)
    [later] = cleanup(spark, pg_dsn, lake_root, table_name)
    assert [Path(f).name for f in later.vacuumed_files] == [just_inside.name]
    assert lake_live(spark, lake_root, table_name, ["id"]) == expected


def test_a_retention_below_the_guard_needs_the_override(lake_root):
    with pytest.raises(ConfigError, match="below Delta's 168-hour guard"):
        CleanupConfig(None, lake_root, "r", retention=timedelta(hours=24))
    assert CleanupConfig(None, lake_root, "r", retention=timedelta(hours=24), allow_short_retention=True)


def test_bad_input_exits_2_and_changes_nothing(pg_dsn, lake_root, monkeypatch, caplog):
    monkeypatch.setenv("COLDHARBOR_PG_DSN", pg_dsn)
    assert cleanup_main(["--lake-root", lake_root, "--table", "public.never_registered"]) == 2
    assert "not registered" in caplog.text
    assert cleanup_main(["--lake-root", lake_root, "--retention-hours", "1"]) == 2
    assert "--allow-short-retention" in caplog.text


def test_prunes_flushed_history_and_expires_runs_but_never_dirty_changes(
        spark, pg_dsn, pg_conn, table_name, lake_root):
    table = register(pg_conn, table_name)
    for i in range(3):
        pg_conn.execute(f"INSERT INTO {table_name} VALUES ({i}, 'a')")
        export(spark, pg_dsn, table_name, lake_root)
    pg_conn.execute(f"INSERT INTO {table_name} VALUES (100, 'dirty')")
    # The controlled clock: the first two batches and their changes were flushed two hours ago.
    pg_conn.execute("UPDATE coldharbor.change_log SET flushed_at = flushed_at - interval '2 hours', "
                    "created_at = created_at - interval '2 hours' WHERE table_id = %s AND lake_version < 2",
                    (table.table_id,))
    pg_conn.execute("UPDATE coldharbor.export_batches SET finished_at = finished_at - interval '2 hours' "
                    "WHERE table_id = %s AND batch_id < 3", (table.table_id,))
    pg_conn.execute("INSERT INTO coldharbor.report_runs (run_id, report, mode, state, finished_at) VALUES "
                    "('old-run', 'r', 'strict', 'succeeded', now() - interval '40 days'), "
                    "('new-run', 'r', 'strict', 'succeeded', now() - interval '1 day')")
    with pg.connect(pg_dsn) as pipeline:  # as a serve run that died before its swap leaves it
        pipeline.execute("CREATE TABLE reports._ch_stage_orphan_0a1b (x int)")

    cleanup(spark, pg_dsn, lake_root, None, dry_run=True)
    assert report_run(pg_conn, "old-run")
    assert pg_conn.execute("SELECT to_regclass('reports._ch_stage_orphan_0a1b')").fetchone()[0] is not None
    [result] = [r for r in cleanup(spark, pg_dsn, lake_root, None) if r.table == f"public.{table_name}"]
    assert (result.change_log_pruned, result.batches_pruned) == (2, 2)
    remaining = pg_conn.execute("SELECT lake_version FROM coldharbor.change_log WHERE table_id = %s ORDER BY id",
                                (table.table_id,)).fetchall()
    assert remaining == [(2,), (None,)]
    assert len(dirty_ids(pg_conn, table_name)) == 1
    assert pg_conn.execute("SELECT array_agg(batch_id) FROM coldharbor.export_batches WHERE table_id = %s",
                           (table.table_id,)).fetchone()[0] == [3]
    assert not report_run(pg_conn, "old-run") and report_run(pg_conn, "new-run")
    assert pg_conn.execute("SELECT to_regclass('reports._ch_stage_orphan_0a1b')").fetchone()[0] is None
    export(spark, pg_dsn, table_name, lake_root)
    assert lake_live(spark, lake_root, table_name, ["id"]) == pg_rows(pg_conn, f"SELECT * FROM {table_name}", ["id"])


def test_eviction_keeps_reports_whole_and_later_writes_are_captured(
        spark, pg_dsn, pg_conn, table_name, lake_root, monkeypatch):
    table = register(pg_conn, table_name, hot_retention="1 hour")
    pg_conn.execute(f"INSERT INTO {table_name} SELECT g, 'v' || g FROM generate_series(1, 10) g")
    export(spark, pg_dsn, table_name, lake_root)
    everything = pg_rows(pg_conn, f"SELECT * FROM {table_name}", ["id"])
    # Keys 1-6 were written and flushed two hours ago; 7-10 just now.
    pg_conn.execute("""UPDATE coldharbor.change_log SET created_at = created_at - interval '2 hours',
                              flushed_at = flushed_at - interval '2 hours'
                        WHERE table_id = %s AND (key ->> 'id')::int <= 6""", (table.table_id,))
    pg_conn.execute(f"UPDATE {table_name} SET v = 'dirty' WHERE id = 6")  # old, but changed since: stays
    last_change = pg_conn.execute("SELECT max(id) FROM coldharbor.change_log").fetchone()[0]

    [dry] = cleanup(spark, pg_dsn, lake_root, table_name, dry_run=True)
    assert dry.evicted_rows == 5
    assert pg_conn.execute(f"SELECT count(*) FROM {table_name}").fetchone()[0] == 10
    [done] = cleanup(spark, pg_dsn, lake_root, table_name)
    assert done.evicted_rows == 5
    assert [r[0] for r in pg_conn.execute(f"SELECT id FROM {table_name} ORDER BY id")] == [6, 7, 8, 9, 10]
    assert pg_conn.execute("SELECT max(id) FROM coldharbor.change_log").fetchone()[0] == last_change  # none logged

    everything[(6,)]["v"] = "dirty"
    assert serve_report(monkeypatch, pg_dsn, lake_root, "--sql", f"SELECT * FROM {table_name}",
                        "--target", "adhoc_evicted", "--run-id", "evicted-1") == 0
    assert pg_rows(pg_conn, "SELECT * FROM reports.adhoc_evicted", ["id"]) == everything

    pg_conn.execute(f"INSERT INTO {table_name} VALUES (2, 'back')")  # a later write to an evicted key
    pg_conn.execute(f"DELETE FROM {table_name} WHERE id = 7")
    everything[(2,)]["v"] = "back"
    del everything[(7,)]
    assert serve_report(monkeypatch, pg_dsn, lake_root, "--sql", f"SELECT * FROM {table_name}",
                        "--target", "adhoc_evicted", "--run-id", "evicted-2") == 0
    assert pg_rows(pg_conn, "SELECT * FROM reports.adhoc_evicted", ["id"]) == everything
    export(spark, pg_dsn, table_name, lake_root)
    assert lake_live(spark, lake_root, table_name, ["id"]) == everything


def test_a_run_over_every_table_cleans_the_others_when_one_was_dropped_and_created_again(
        spark, own_database, table_name, lake_root, monkeypatch, caplog):
    """The daily cleanup runs over every registered table: a table dropped (and created again)
    since its registration is named in the run's one error line, exit 2, and every other table is
    still evicted -- one team's dropped table must not stop everyone's maintenance."""
    admin_dsn, pg_dsn = own_database
    with pg.connect(admin_dsn) as pg_conn:
        kept = register(pg_conn, table_name, hot_retention="1 hour")
        pg_conn.execute(f"INSERT INTO {table_name} SELECT g, 'v' || g FROM generate_series(1, 4) g")
        export(spark, pg_dsn, table_name, lake_root)
        pg_conn.execute("""UPDATE coldharbor.change_log SET created_at = created_at - interval '2 hours',
                                  flushed_at = flushed_at - interval '2 hours' WHERE table_id = %s""",
                        (kept.table_id,))
        dropped = f'"{table_name} dropped ü"'
        pg_conn.execute(f"CREATE TABLE {dropped} (id bigint PRIMARY KEY, v text)")
        pg_conn.execute("SELECT coldharbor.register_table(%s, p_hot_retention => '1 hour')", (dropped,))
        pg_conn.execute(f"DROP TABLE {dropped}")
        pg_conn.execute(f"CREATE TABLE {dropped} (id bigint PRIMARY KEY, v text)")
        pg_conn.execute(f"INSERT INTO {dropped} VALUES (1, 'not captured')")

        monkeypatch.setenv("COLDHARBOR_PG_DSN", pg_dsn)
        caplog.clear()
        assert cleanup_main(["--lake-root", lake_root, "--retention-hours", "1", "--allow-short-retention"]) == 2
        [error] = [r.getMessage() for r in caplog.records if "tables not cleaned" in r.getMessage()]
        assert "1 of 2 tables not cleaned (the other 1 were)" in error, error
        assert f"public.{dropped} was dropped and created again" in error, error
        assert pg_conn.execute(f"SELECT count(*) FROM {table_name}").fetchone()[0] == 0  # all four evicted
        assert pg_conn.execute(f"SELECT v FROM {dropped}").fetchall() == [("not captured",)]  # untouched
        assert serve_report(monkeypatch, pg_dsn, lake_root, "--sql", f"SELECT count(*) AS n FROM {table_name}",
                            "--target", "adhoc_cleaned_others", "--run-id", f"others-{kept.table_id}") == 0
        assert pg_conn.execute("SELECT n FROM reports.adhoc_cleaned_others").fetchone()[0] == 4

        # Named alone, the dropped table is refused before Spark starts; the run changes nothing.
        caplog.clear()
        assert cleanup_main(["--lake-root", lake_root, "--table", f"public.{table_name} dropped ü"]) == 2
        assert "was dropped and created again" in caplog.text


def test_eviction_waits_for_reports_still_running(spark, pg_dsn, pg_conn, table_name, lake_root):
    table = register(pg_conn, table_name, hot_retention="1 hour")
    pg_conn.execute(f"INSERT INTO {table_name} VALUES (1, 'a')")
    export(spark, pg_dsn, table_name, lake_root)
    pg_conn.execute("UPDATE coldharbor.change_log SET created_at = created_at - interval '2 hours', "
                    "flushed_at = flushed_at - interval '90 minutes' WHERE table_id = %s", (table.table_id,))
    slow = RunRecord(f"slow-{table_name}", "slow", None, "postgres", "strict", None)
    with pg.connect(pg_dsn) as running:  # a report running (its session holds the run's lease)
        report_runs.start(running, slow)
        pg_conn.execute("UPDATE coldharbor.report_runs SET started_at = now() - interval '3 hours' "
                        "WHERE run_id = %s", (slow.run_id,))
        [held] = cleanup(spark, pg_dsn, lake_root, table_name, retention=timedelta(hours=3))
        assert held.evicted_rows == 0
        report_runs.succeed(running, slow)
    [done] = cleanup(spark, pg_dsn, lake_root, table_name, retention=timedelta(hours=3))
    assert done.evicted_rows == 1


def test_files_of_an_export_killed_mid_write_are_removed_once_old_enough(
        spark, pg_dsn, pg_conn, table_name, lake_root, tmp_path):
    table = register(pg_conn, table_name)
    pg_conn.execute(f"INSERT INTO {table_name} SELECT g, 'a' FROM generate_series(1, 10) g")
    export(spark, pg_dsn, table_name, lake_root)
    pg_conn.execute(f"INSERT INTO {table_name} SELECT g, 'b' FROM generate_series(11, 5000) g")
    killed = spark_submit_export(pg_dsn, lake_root, "--table", table_name,
                                 env={"COLDHARBOR_CRASH_AT": "during_write"})
    assert killed.returncode != 0, killed.stdout[-3000:]
    folder = Path(table.lake_path(lake_root))
    referenced = {Path(f.path).name for f in delta.snapshot(spark, str(folder)).files}
    leftovers = data_files(folder) - referenced
    assert leftovers, "the killed write left no file: the crash point did not fire mid-write"
    cleanup(spark, pg_dsn, lake_root, table_name)  # inside the retention: they stay
    assert leftovers <= data_files(folder)
    for name in leftovers:
        age(folder / name, 61)
    [done] = cleanup(spark, pg_dsn, lake_root, table_name)
    assert {Path(f).name for f in done.vacuumed_files} == leftovers
    assert data_files(folder) == referenced
    assert export(spark, pg_dsn, table_name, lake_root).status == "exported"
    assert lake_live(spark, lake_root, table_name, ["id"]) == pg_rows(pg_conn, f"SELECT * FROM {table_name}", ["id"])


def test_health_samples_older_than_two_days_are_pruned_and_a_dry_run_only_counts_them(pg_dsn, pg_conn, table_name):
    from coldharbor.maintenance.pruning import prune_health_samples

    pg_conn.execute(f"CREATE TABLE {table_name} (id int PRIMARY KEY)")
    pg_conn.execute("SELECT coldharbor.register_table(%s)", (table_name,))
    pg_conn.execute("""INSERT INTO coldharbor.health_samples (table_id, sampled_at, export_status, dirty_rows, lag_s)
                       SELECT table_id, now() - make_interval(hours => h), 'exported', 0, 0
                         FROM coldharbor.tables, (VALUES (1), (47), (49), (72)) v(h) WHERE table_name = %s""",
                    (table_name,))

    def kept() -> list[int]:
        return [r[0] for r in pg_conn.execute(
            "SELECT round(extract(epoch FROM now() - sampled_at) / 3600)::int FROM coldharbor.health_samples s "
            "JOIN coldharbor.tables t USING (table_id) WHERE t.table_name = %s ORDER BY 1", (table_name,))]

    with pg.connect(pg_dsn) as conn:  # as the cleanup job: the pipeline's login
        assert prune_health_samples(conn, dry_run=True) >= 2 and kept() == [1, 47, 49, 72]
        assert prune_health_samples(conn, dry_run=False) >= 2
    assert kept() == [1, 47]

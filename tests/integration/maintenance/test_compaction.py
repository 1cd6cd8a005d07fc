"""Compaction against real PostgreSQL and Spark + Delta: last-write-wins, history, markers, concurrency."""

from __future__ import annotations

import threading
from datetime import datetime, timedelta, timezone

import pytest
from coldharbor.capture import registry
from coldharbor.lake import commits, delta, lake_store, writes
from coldharbor.maintenance.compaction import compact_table
from coldharbor.maintenance.compaction_plan import CompactionConfig
from coldharbor.runtime import pg
from coldharbor.runtime.errors import ConfigError
from delta.tables import DeltaTable
from pyspark.sql import Row

from tests.helpers import export, lake_live, lake_table, pg_rows

OLD = datetime(2026, 1, 1, tzinfo=timezone.utc)


def register(conn, name: str, ddl: str = "id bigint PRIMARY KEY, v text", **kwargs) -> registry.RegisteredTable:
    conn.execute(f"CREATE TABLE {name} ({ddl})")
    args = ", ".join(f"{k} => %s" for k in kwargs)
    conn.execute(f"SELECT coldharbor.register_table(%s{', ' + args if args else ''})", (name, *kwargs.values()))
    return registry.load(conn, name)[0]


def config(lake_root: str, **overrides) -> CompactionConfig:
    settings = {"table": None, "lake_root": lake_root, "run_id": f"test-{datetime.now().timestamp()}",
                "min_small_files": 2, "history_window": timedelta(hours=1), "retry_backoff_s": 0.1}
    return CompactionConfig(**{**settings, **overrides})


def compact(spark, dsn, table, lake_root, hook=lambda point: None, **overrides):
    with pg.connect(dsn) as conn:
        return compact_table(spark, conn, table, config(lake_root, **overrides), hook)


def lake_row(id_, v, seq, batch, deleted=False, changed_at=OLD):
    return Row(id=id_, v=v, _ch_seq=seq, _ch_deleted=deleted, _ch_changed_at=changed_at, _ch_batch_id=batch,
               _ch_exported_at=changed_at)


def write_batches(spark, path: str, batches: dict[int, list[Row]]) -> None:
    """Lake rows written as the export writes them: one commit per batch, idempotent by batch id."""
    for batch_id, rows in batches.items():
        df = spark.createDataFrame(rows, "id long, v string, _ch_seq long, _ch_deleted boolean, "
                                         "_ch_changed_at timestamp, _ch_batch_id long, _ch_exported_at timestamp")
        writes.append_batch(df, path, app_id="test", batch_id=batch_id, partition_by=(), metadata={"batch": batch_id})


def all_rows(spark, path: str) -> list[tuple]:
    return sorted(((r.id, r.v, r._ch_seq, r._ch_batch_id, r._ch_deleted)
                   for r in spark.read.format("delta").load(path).collect()), key=lambda r: (r[0], r[2]))


def test_last_write_wins_within_and_across_batches_with_equal_times(spark, pg_dsn, pg_conn, table_name, lake_root):
    table = register(pg_conn, table_name)
    path = table.lake_path(lake_root)
    write_batches(spark, path, {
        1: [lake_row(1, "a", 10, 1), lake_row(1, "b", 12, 1), lake_row(1, "c", 11, 1),  # one batch, equal times
            lake_row(2, "old", 5, 1), lake_row(3, "gone", 7, 1), lake_row(4, "keep", 8, 1)],
        2: [lake_row(1, "d", 13, 2), lake_row(2, "tie-newer-batch", 5, 2),            # same seq: batch decides
            lake_row(3, None, 9, 2, deleted=True)],
        3: [lake_row(5, "x", 20, 3)],
    })
    before = lake_live(spark, lake_root, table_name, ["id"])
    result = compact(spark, pg_dsn, table, lake_root)
    assert result.status == "compacted"
    [part] = result.partitions
    assert part.files_before >= 3 and (part.rows_before, part.rows_after) == (10, 4)
    assert (part.versions_dropped, part.markers_dropped) == (5, 1)
    assert all_rows(spark, path) == [(1, "d", 13, 2, False), (2, "tie-newer-batch", 5, 2, False),
                                     (4, "keep", 8, 1, False), (5, "x", 20, 3, False)]
    assert lake_live(spark, lake_root, table_name, ["id"]) == before
    assert part.files_after == 1


def test_versions_inside_the_history_window_are_kept(spark, pg_dsn, pg_conn, table_name, lake_root):
    table = register(pg_conn, table_name)
    path = table.lake_path(lake_root)
    now = datetime.now(timezone.utc)
    recent = now - timedelta(minutes=10)
    write_batches(spark, path, {
        1: [lake_row(1, "v1", 1, 1), lake_row(2, "v1", 2, 1), lake_row(3, "v1", 3, 1)],
        2: [lake_row(1, "v2", 4, 2), lake_row(2, None, 5, 2, deleted=True)],            # the base versions
        3: [lake_row(1, "v3", 6, 3, changed_at=recent), lake_row(2, "back", 7, 3, changed_at=recent),
            lake_row(3, None, 8, 3, deleted=True, changed_at=recent)],
    })
    compact(spark, pg_dsn, table, lake_root, history_window=timedelta(hours=1))
    # Base of key 1 (v2) kept for as-of reads; key 2's base is a marker: dropped, nothing older left.
    assert all_rows(spark, path) == [(1, "v2", 4, 2, False), (1, "v3", 6, 3, False), (2, "back", 7, 3, False),
                                     (3, "v1", 3, 1, False), (3, None, 8, 3, True)]


def test_as_of_answers_are_unchanged_by_compaction(spark, pg_dsn, pg_conn, table_name, lake_root):
    from coldharbor.lake.unified import cold_live

    table = register(pg_conn, table_name)
    path = table.lake_path(lake_root)
    now = datetime.now(timezone.utc)
    times = [now - timedelta(minutes=m) for m in (50, 40, 30, 20)]
    write_batches(spark, path, {
        1: [lake_row(1, "a", 1, 1), lake_row(2, "a", 2, 1)],
        2: [lake_row(1, "b", 3, 2, changed_at=times[0]), lake_row(2, None, 4, 2, deleted=True, changed_at=times[1])],
        3: [lake_row(1, None, 5, 3, deleted=True, changed_at=times[2]), lake_row(2, "c", 6, 3, changed_at=times[3])],
    })
    columns = registry.lake_columns(pg_conn, table)

    def answers():
        df = spark.read.format("delta").load(path)
        return {t: sorted(tuple(r) for r in df.transform(cold_live(columns, t)).collect())
                for t in [now - timedelta(minutes=55), *times, now]}

    before = answers()
    compact(spark, pg_dsn, table, lake_root, history_window=timedelta(hours=1))
    assert answers() == before


def test_delete_export_compact_vacuum_replay_never_resurrects(spark, pg_dsn, pg_conn, table_name, lake_root):
    table = register(pg_conn, table_name)
    path = table.lake_path(lake_root)
    pg_conn.execute(f"INSERT INTO {table_name} VALUES (1, 'alive'), (2, 'stays')")
    first = export(spark, pg_dsn, table_name, lake_root)
    batch_one = delta.read_version(spark, path, 0).collect()
    pg_conn.execute(f"DELETE FROM {table_name} WHERE id = 1")
    export(spark, pg_dsn, table_name, lake_root)
    result = compact(spark, pg_dsn, table, lake_root, history_window=timedelta(microseconds=1))
    assert result.partitions[0].markers_dropped == 1
    spark.conf.set("spark.databricks.delta.retentionDurationCheck.enabled", "false")
    try:
        DeltaTable.forPath(spark, path).vacuum(0)
    finally:
        spark.conf.unset("spark.databricks.delta.retentionDurationCheck.enabled")
    # The crashed-and-retried export of batch 1 arrives again: Delta's txnVersion makes it a no-op.
    replay = spark.createDataFrame(batch_one, lake_table(spark, lake_root, table_name).schema)
    writes.append_batch(replay, path, app_id=commits.export_app_id(table.table_id), batch_id=first.batch_id,
                      partition_by=(), metadata={"replay": True})
    assert lake_live(spark, lake_root, table_name, ["id"]) == pg_rows(pg_conn, f"SELECT * FROM {table_name}", ["id"])
    assert [r.id for r in lake_table(spark, lake_root, table_name).collect()] == [2]


def _paused_at(point: str, reached: threading.Event, resume: threading.Event):
    def hook(p: str) -> None:
        if p == point:
            reached.set()
            assert resume.wait(120), f"never resumed at {point}"
    return hook


def _in_thread(target) -> tuple[threading.Thread, dict]:
    out: dict = {}

    def run():
        try:
            out["result"] = target()
        except BaseException as exc:  # surfaced by the test
            out["error"] = exc
    thread = threading.Thread(target=run)
    thread.start()
    return thread, out


@pytest.mark.parametrize("paused", ["compaction", "export"])
@pytest.mark.parametrize("mode", ["full", "merge"])
def test_compaction_and_export_interleaved_at_their_commits(spark, pg_dsn, pg_conn, table_name, lake_root, paused,
                                                            mode):
    """Either one waits at its commit while the other commits: a merge of the export files too."""
    table = register(pg_conn, table_name)
    for i in range(4):  # four small files
        pg_conn.execute(f"INSERT INTO {table_name} SELECT g, 'r{i}' FROM generate_series({i * 10}, {i * 10 + 9}) g")
        pg_conn.execute(f"UPDATE {table_name} SET v = v || '+' WHERE id < {i * 10}")
        export(spark, pg_dsn, table_name, lake_root)
    pg_conn.execute(f"UPDATE {table_name} SET v = 'late' WHERE id % 3 = 0")
    pg_conn.execute(f"DELETE FROM {table_name} WHERE id % 7 = 0")
    pg_conn.execute(f"INSERT INTO {table_name} SELECT g, 'new' FROM generate_series(100, 120) g")
    reached, resume = threading.Event(), threading.Event()
    if paused == "compaction":
        thread, out = _in_thread(lambda: compact(spark, pg_dsn, table, lake_root, mode=mode,
                                                 hook=_paused_at("compact_before_commit", reached, resume)))
        assert reached.wait(300)
        assert export(spark, pg_dsn, table_name, lake_root).status == "exported"
    else:
        thread, out = _in_thread(lambda: export(spark, pg_dsn, table_name, lake_root,
                                                hook=_paused_at("after_intent", reached, resume)))
        assert reached.wait(300)
        assert compact(spark, pg_dsn, table, lake_root, mode=mode).status == {"full": "compacted",
                                                                               "merge": "merged"}[mode]
    resume.set()
    thread.join(300)
    assert "error" not in out, out.get("error")
    if paused == "compaction":
        assert out["result"].status == {"full": "compacted", "merge": "merged"}[mode]
    expected = pg_rows(pg_conn, f"SELECT id, v FROM {table_name}", ["id"])
    assert lake_live(spark, lake_root, table_name, ["id"]) == expected
    # Nothing doubled: one row per key and change sequence.
    rows = lake_table(spark, lake_root, table_name).select("id", "_ch_seq").collect()
    assert len(rows) == len(set(rows))
    assert pg_conn.execute("SELECT count(*) FROM coldharbor.change_log c JOIN coldharbor.tables t USING (table_id) "
                           "WHERE t.table_name = %s AND flushed_at IS NULL", (table_name,)).fetchone()[0] == 0


def test_partitions_are_compacted_one_by_one(spark, pg_dsn, pg_conn, table_name, lake_root):
    table = register(pg_conn, table_name, "region text, id int, v text, PRIMARY KEY (region, id)",
                     p_partition_by=["region"])
    for i in range(3):
        pg_conn.execute(f"INSERT INTO {table_name} VALUES ('eu', {i}, 'a'), ('us', {i}, 'b')")
        pg_conn.execute(f"UPDATE {table_name} SET v = v || {i}")
        export(spark, pg_dsn, table_name, lake_root)
    pg_conn.execute(f"INSERT INTO {table_name} VALUES ('a''b', 1, 'quote')")  # a partition value with a quote
    export(spark, pg_dsn, table_name, lake_root)
    result = compact(spark, pg_dsn, table, lake_root)
    compacted = sorted(p.partition["region"] for p in result.partitions if p.status == "compacted")
    assert compacted == ["eu", "us"]
    # The run's commit of one partition is no concurrent rewrite of the next.
    assert [p.attempts for p in result.partitions] == [1] * len(result.partitions)
    assert lake_live(spark, lake_root, table_name, ["region", "id"]) == pg_rows(
        pg_conn, f"SELECT region, id, v FROM {table_name}", ["region", "id"])


def test_below_threshold_does_nothing_and_second_run_is_idempotent(spark, pg_dsn, pg_conn, table_name, lake_root):
    table = register(pg_conn, table_name)
    pg_conn.execute(f"INSERT INTO {table_name} VALUES (1, 'a')")
    export(spark, pg_dsn, table_name, lake_root)
    assert compact(spark, pg_dsn, table, lake_root).status == "nothing_to_do"
    pg_conn.execute(f"UPDATE {table_name} SET v = 'b'")
    export(spark, pg_dsn, table_name, lake_root)
    assert compact(spark, pg_dsn, table, lake_root).status == "compacted"
    version = delta.pin_version(spark, table.lake_path(lake_root))
    assert compact(spark, pg_dsn, table, lake_root).status == "nothing_to_do"
    assert delta.pin_version(spark, table.lake_path(lake_root)) == version
    run = pg_conn.execute("SELECT state, lake_version FROM coldharbor.maintenance_runs WHERE table_id = %s "
                          "AND kind = 'compact' ORDER BY started_at DESC LIMIT 1", (table.table_id,)).fetchone()
    assert run == ("succeeded", None)


@pytest.mark.parametrize("overrides, message", [
    ({"target_file_bytes": 10}, "target file size"),
    ({"min_small_files": 1}, "min small files"),
    ({"small_file_ratio": 1.5}, "small file ratio"),
    ({"max_attempts": 0}, "max attempts"),
])
def test_thresholds_that_make_no_sense_are_refused(lake_root, overrides, message):
    with pytest.raises(ConfigError, match=message):
        config(lake_root, **overrides)


def _delete_once_at_commit(spark, path: str):
    """A hook that, the first time compaction is about to commit, lets a DELETE commit first: it
    removes a file the compaction read, which Delta reports as a concurrent modification."""
    fired = []

    def hook(point: str) -> None:
        if point == "compact_before_commit" and not fired:
            fired.append(point)
            DeltaTable.forPath(spark, path).delete("id = 1")
    return hook


def test_a_concurrent_commit_is_retried_from_a_fresh_plan(spark, pg_dsn, pg_conn, table_name, lake_root):
    table = register(pg_conn, table_name)
    path = table.lake_path(lake_root)
    write_batches(spark, path, {b: [lake_row(i, f"b{b}", b * 10 + i, b) for i in range(1, 4)] for b in (1, 2, 3)})
    result = compact(spark, pg_dsn, table, lake_root, hook=_delete_once_at_commit(spark, path))
    [part] = result.partitions
    assert (result.status, part.status, part.attempts) == ("compacted", "compacted", 2)
    assert all_rows(spark, path) == [(2, "b3", 32, 3, False), (3, "b3", 33, 3, False)]


def test_a_run_that_loses_every_attempt_gives_up_and_changes_nothing(spark, pg_dsn, pg_conn, table_name, lake_root,
                                                                     caplog):
    table = register(pg_conn, table_name)
    path = table.lake_path(lake_root)
    write_batches(spark, path, {b: [lake_row(i, f"b{b}", b * 10 + i, b) for i in range(1, 4)] for b in (1, 2, 3)})
    result = compact(spark, pg_dsn, table, lake_root, hook=_delete_once_at_commit(spark, path), max_attempts=1)
    assert (result.status, result.partitions[0].status) == ("gave_up", "gave_up")
    assert "gave up after 1 attempts" in caplog.text
    assert [h.operation for h in DeltaTable.forPath(spark, path).history().collect()][0] == "DELETE"
    assert len(all_rows(spark, path)) == 6  # 9 versions minus key 1's three, none compacted away
    state = pg_conn.execute("SELECT state FROM coldharbor.maintenance_runs WHERE table_id = %s AND kind = 'compact'",
                            (table.table_id,)).fetchone()[0]
    assert state == "failed"


def test_compacting_an_unregistered_table_is_refused(pg_dsn, lake_root, monkeypatch, caplog):
    from coldharbor.maintenance.compaction import main

    monkeypatch.setenv("COLDHARBOR_PG_DSN", pg_dsn)
    assert main(["--table", "public.not_registered", "--lake-root", lake_root]) == 2
    assert "not registered" in caplog.text
    assert main(["--lake-root", lake_root, "--min-small-files", "1"]) == 2
    assert "min small files must be at least 2" in caplog.text


def test_current_reads_rank_only_the_keys_exported_since_the_compaction(spark, pg_dsn, pg_conn, table_name,
                                                                          lake_root):
    """A table registered with rows (a settled base), exports, a compaction that keeps older
    versions for as-of reads, then exports of the same keys again: the current read (which ranks
    only the keys with rows exported since) matches PostgreSQL and the ranking of every row."""
    from coldharbor.lake.lake_rows import NEWEST, OLDER, SETTLED, latest_per_key, live_rows

    pg_conn.execute(f"CREATE TABLE {table_name} (id bigint PRIMARY KEY, v text)")
    pg_conn.execute(f"INSERT INTO {table_name} SELECT g, 'base ' || g FROM generate_series(1, 8) g")
    pg_conn.execute("SELECT coldharbor.register_table(%s)", (table_name,))
    [table] = registry.load(pg_conn, table_name)
    path = table.lake_path(lake_root)
    export(spark, pg_dsn, table_name, lake_root)  # the initial load
    assert {r[SETTLED] for r in lake_table(spark, lake_root, table_name).collect()} == {NEWEST}
    for statement in (f"UPDATE {table_name} SET v = 'second' WHERE id IN (1, 2, 3)",
                      f"DELETE FROM {table_name} WHERE id IN (4, 5)",
                      f"INSERT INTO {table_name} VALUES (9, 'new')"):
        pg_conn.execute(statement)
        export(spark, pg_dsn, table_name, lake_root)
    assert {r[SETTLED] for r in lake_table(spark, lake_root, table_name).filter("_ch_batch_id > 1").collect()} \
        == {None}
    writes.set_table_property(spark, path, writes.STATS_COLUMNS_PROPERTY, "`id`")  # a table made before the column
    result = compact(spark, pg_dsn, table, lake_root, history_window=timedelta(hours=1))
    assert result.status == "compacted"
    compacted = lake_table(spark, lake_root, table_name).collect()
    assert sorted(r.id for r in compacted if r[SETTLED] == NEWEST) == [1, 2, 3, 4, 5, 6, 7, 8, 9]
    assert {r[SETTLED] for r in compacted} == {NEWEST, OLDER}  # the versions before kept for as-of reads
    assert "`_ch_settled`" in lake_store.table_property(path, writes.STATS_COLUMNS_PROPERTY).split(",")
    for statement in (f"UPDATE {table_name} SET v = 'third' WHERE id IN (1, 6)",
                      f"DELETE FROM {table_name} WHERE id IN (2, 9)",
                      f"INSERT INTO {table_name} VALUES (4, 'back')",
                      f"UPDATE {table_name} SET v = 'fourth' WHERE id = 1"):
        pg_conn.execute(statement)
        export(spark, pg_dsn, table_name, lake_root)
    expected = pg_rows(pg_conn, f"SELECT * FROM {table_name}", ["id"])
    assert lake_live(spark, lake_root, table_name, ["id"]) == expected
    rows = lake_table(spark, lake_root, table_name)
    split = delta.settled_split(path, delta.pin_version(spark, path))  # from the Delta log's statistics
    assert (split.unsettled_rows, split.settled_rows) == (rows.filter("_ch_settled IS NULL").count(),
                                                          rows.filter("_ch_settled IS NOT NULL").count())
    planned = rows.transform(live_rows(["id"], split)).collect()
    assert {(r.id,): {"id": r.id, "v": r.v} for r in planned} == expected
    every_row = (lake_table(spark, lake_root, table_name).transform(latest_per_key(["id"]))
                 .filter("NOT _ch_deleted").select("id", "v").collect())
    assert {(r.id,): {"id": r.id, "v": r.v} for r in every_row} == expected


def test_a_lake_table_written_before_the_settled_column_gains_it_and_its_statistics(spark, pg_dsn, pg_conn,
                                                                                      table_name, lake_root):
    from coldharbor.lake.lake_rows import NEWEST, SETTLED

    table = register(pg_conn, table_name)
    path = table.lake_path(lake_root)
    write_batches(spark, path, {1: [lake_row(1, "a", 1, 1), lake_row(2, "b", 2, 1)],
                                2: [lake_row(1, "a2", 3, 2)]})
    writes.set_table_property(spark, path, writes.STATS_COLUMNS_PROPERTY, "`id`,`_ch_seq`")  # as the export made it
    assert SETTLED not in lake_table(spark, lake_root, table_name).columns
    assert compact(spark, pg_dsn, table, lake_root).status == "compacted"
    assert {(r.id, r.v, r[SETTLED]) for r in lake_table(spark, lake_root, table_name).collect()} == \
        {(1, "a2", NEWEST), (2, "b", NEWEST)}
    assert writes.stats_property_columns(lake_store.table_property(path, writes.STATS_COLUMNS_PROPERTY)) == \
        ["id", "_ch_seq", SETTLED]


@pytest.mark.parametrize("hours, window", [("0.001", None), ("100", "168"), ("24", "48")])
def test_a_history_shorter_than_the_as_of_window_is_refused(hours, window, monkeypatch):
    """Found by the cold attack: --history-hours 0.001 dropped versions as-of reports inside the
    window still read, and they answered wrongly with exit 0."""
    from coldharbor.maintenance.compaction import parse_args

    if window is None:
        monkeypatch.delenv("COLDHARBOR_HISTORY_WINDOW_HOURS", raising=False)
    else:
        monkeypatch.setenv("COLDHARBOR_HISTORY_WINDOW_HOURS", window)
    with pytest.raises(ConfigError, match=r"is shorter than the window as-of reports may ask for"):
        parse_args(["--history-hours", hours, "--lake-root", "/tmp/lake"])
    assert parse_args(["--history-hours", "200", "--lake-root", "/tmp/lake"]).history_window.total_seconds() == 720000

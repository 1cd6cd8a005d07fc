"""Compaction's merge of small export files (`--mode merge`, and `auto` as the DAG runs it) against
real PostgreSQL and Spark + Delta: the same rows in fewer files, every read answering as before."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from coldharbor.capture import registry
from coldharbor.lake import delta
from coldharbor.lake.lake_rows import SETTLED
from coldharbor.lake.unified import cold_live

from tests.helpers import export, lake_live, lake_table, pg_rows
from tests.integration.maintenance.test_compaction import compact, lake_row, write_batches

# Key values a user can type, quotes and backslashes among them (the empty one is no partition value:
# Spark writes an empty string partition value as NULL).
REGIONS = ["eu", "o'brien", "a\\b", "ü-日本", ""]


def every_version(spark, lake_root: str, name: str) -> list[tuple]:
    """Every lake row with its metadata: what a merge must leave exactly as it found it."""
    return sorted((tuple(r) for r in lake_table(spark, lake_root, name).collect()),
                  key=lambda row: [(v is None, str(v)) for v in row])


def unsettled_files(path: str) -> list[delta.LakeFile]:
    return [f for f in delta.snapshot(None, path).files if f.unsettled_rows]  # the Delta log alone


def settled_files(path: str) -> set[str]:
    return {f.path for f in delta.snapshot(None, path).files if f.unsettled_rows == 0}


def as_of_answers(spark, path: str, columns, instants) -> dict:
    rows = spark.read.format("delta").load(path)
    return {t: sorted(tuple(r) for r in rows.transform(cold_live(columns, t)).collect()) for t in instants}


def last_commit(path: str) -> dict:
    log = sorted(Path(path, "_delta_log").glob("*.json"))[-1]
    return [json.loads(line) for line in log.read_text().splitlines()]


def registered_with_rows(pg_conn, name: str, partition_by: list[str] | None = None) -> registry.RegisteredTable:
    pg_conn.execute(f"CREATE TABLE {name} (region text, id bigint, v text, PRIMARY KEY (region, id))")
    pg_conn.execute(f"INSERT INTO {name} SELECT r, g, 'base ' || g FROM unnest(%s::text[]) r, "
                    "generate_series(1, 40) g", (REGIONS[:-1] if partition_by else REGIONS,))
    if partition_by:
        pg_conn.execute("SELECT coldharbor.register_table(%s, p_partition_by => %s)", (name, partition_by))
    else:
        pg_conn.execute("SELECT coldharbor.register_table(%s)", (name,))
    return registry.load(pg_conn, name)[0]


def small_exports(spark, pg_dsn, pg_conn, name: str, lake_root: str, count: int, start: int = 0) -> list[datetime]:
    """`count` exports of a few changes each (updates, a delete, an insert); the instant after each."""
    instants = []
    regions = [r for [r] in pg_conn.execute(f"SELECT DISTINCT region FROM {name} ORDER BY 1").fetchall()]
    for i in range(start, start + count):
        pg_conn.execute(f"UPDATE {name} SET v = 'e{i} ' || v WHERE id %% 7 = %s AND region = %s",
                        (i % 7, regions[i % len(regions)]))
        pg_conn.execute(f"DELETE FROM {name} WHERE id = %s AND region = %s", (i + 1, regions[i % len(regions)]))
        pg_conn.execute(f"INSERT INTO {name} VALUES (%s, %s, 'new') ON CONFLICT DO NOTHING",
                        (regions[(i + 2) % len(regions)], 1000 + i))
        assert export(spark, pg_dsn, name, lake_root).status == "exported"
        instants.append(datetime.now(timezone.utc))
    return instants


def test_merge_joins_the_small_export_files_and_changes_no_row(spark, pg_dsn, pg_conn, table_name, lake_root):
    table = registered_with_rows(pg_conn, table_name)
    path = table.lake_path(lake_root)
    export(spark, pg_dsn, table_name, lake_root)  # the initial load: settled
    base_files = settled_files(path)
    instants = small_exports(spark, pg_dsn, pg_conn, table_name, lake_root, 4)
    columns = registry.lake_columns(pg_conn, table)
    versions, answers = every_version(spark, lake_root, table_name), as_of_answers(spark, path, columns, instants)
    assert len(unsettled_files(path)) == 4

    result = compact(spark, pg_dsn, table, lake_root, mode="merge")

    assert result.status == "merged"
    [merged] = result.partitions
    assert (merged.status, merged.files_before, merged.files_after) == ("merged", 4, 1)
    assert merged.rows_before == merged.rows_after == sum(f.unsettled_rows for f in unsettled_files(path))
    assert len(unsettled_files(path)) == 1 and settled_files(path) == base_files  # the base untouched
    assert every_version(spark, lake_root, table_name) == versions  # no row dropped, changed or added
    assert as_of_answers(spark, path, columns, instants) == answers
    assert lake_live(spark, lake_root, table_name, ["region", "id"]) == pg_rows(
        pg_conn, f"SELECT * FROM {table_name}", ["region", "id"])
    commit = last_commit(path)
    assert json.loads(next(a["commitInfo"] for a in commit if "commitInfo" in a)["userMetadata"])["operation"] \
        == "coldharbor-merge-small-files"
    removed = {a["remove"]["path"] for a in commit if "remove" in a}
    assert removed and not removed & base_files

    # Exports go on over the merged file; the next merge takes it with the new ones.
    small_exports(spark, pg_dsn, pg_conn, table_name, lake_root, 2, start=4)
    assert compact(spark, pg_dsn, table, lake_root, mode="merge").status == "merged"
    assert len(unsettled_files(path)) == 1 and settled_files(path) == base_files
    assert lake_live(spark, lake_root, table_name, ["region", "id"]) == pg_rows(
        pg_conn, f"SELECT * FROM {table_name}", ["region", "id"])
    run = pg_conn.execute("SELECT state, detail ->> 'status' FROM coldharbor.maintenance_runs WHERE table_id = %s "
                          "AND kind = 'compact' ORDER BY started_at DESC LIMIT 1", (table.table_id,)).fetchone()
    assert run == ("succeeded", "merged")


def test_merge_runs_per_partition_whatever_the_partition_value(spark, pg_dsn, pg_conn, table_name, lake_root):
    table = registered_with_rows(pg_conn, table_name, partition_by=["region"])
    path = table.lake_path(lake_root)
    export(spark, pg_dsn, table_name, lake_root)
    small_exports(spark, pg_dsn, pg_conn, table_name, lake_root, 12)  # every region gets several files
    versions = every_version(spark, lake_root, table_name)

    result = compact(spark, pg_dsn, table, lake_root, mode="merge")

    assert result.status == "merged"
    assert {p.partition["region"] for p in result.partitions if p.status == "merged"} == set(REGIONS[:-1])
    assert [p.attempts for p in result.partitions] == [1] * len(result.partitions)  # none lost to the run itself
    per_region: dict[str | None, int] = {}
    for f in unsettled_files(path):
        region = dict(f.partition)["region"]
        per_region[region] = per_region.get(region, 0) + 1
    assert set(per_region.values()) == {1}
    assert every_version(spark, lake_root, table_name) == versions
    assert lake_live(spark, lake_root, table_name, ["region", "id"]) == pg_rows(
        pg_conn, f"SELECT * FROM {table_name}", ["region", "id"])


def test_auto_rewrites_fully_when_due_or_past_the_share_and_merges_in_between(spark, pg_dsn, pg_conn, table_name,
                                                                            lake_root):
    table = registered_with_rows(pg_conn, table_name)  # 200 rows
    path = table.lake_path(lake_root)

    def auto():
        result = compact(spark, pg_dsn, table, lake_root, mode="auto", full_rewrite_fraction=0.25,
                         history_window=timedelta(hours=1))
        assert lake_live(spark, lake_root, table_name, ["region", "id"]) == pg_rows(
            pg_conn, f"SELECT * FROM {table_name}", ["region", "id"])
        return result.status

    export(spark, pg_dsn, table_name, lake_root)
    small_exports(spark, pg_dsn, pg_conn, table_name, lake_root, 2)
    assert auto() == "compacted"  # never rewritten fully before
    assert unsettled_files(path) == []
    small_exports(spark, pg_dsn, pg_conn, table_name, lake_root, 3, start=2)  # ~25 of ~220 rows
    assert auto() == "merged"
    pg_conn.execute("UPDATE coldharbor.maintenance_runs SET finished_at = finished_at - interval '2 days' "
                    "WHERE table_id = %s AND detail ->> 'status' = 'compacted'", (table.table_id,))
    small_exports(spark, pg_dsn, pg_conn, table_name, lake_root, 2, start=5)
    assert auto() == "compacted"  # a day since the last full rewrite
    for i in range(2):  # a third of the table changes: past a quarter
        pg_conn.execute(f"UPDATE {table_name} SET v = 'wide {i}' WHERE id % 3 = 0")
        export(spark, pg_dsn, table_name, lake_root)
    assert auto() == "compacted"


@pytest.mark.parametrize("mode", ["merge", "full"])
def test_a_timestamp_partition_before_year_1000_is_compacted(spark, pg_dsn, pg_conn, table_name, lake_root, mode):
    """Found by an outside attack: the partition value was named with strftime's unpadded year
    ('999-06-01...'), whose CAST failed inside every compaction's write."""
    pg_conn.execute(f"CREATE TABLE {table_name} (day timestamptz, id int, v text, PRIMARY KEY (day, id))")
    pg_conn.execute(f"INSERT INTO {table_name} VALUES ('0999-06-01 00:00+00', 1, 'a'), ('2020-06-01 00:00+00', 2, 'b')")
    pg_conn.execute("SELECT coldharbor.register_table(%s, p_partition_by => %s)", (table_name, ["day"]))
    [table] = registry.load(pg_conn, table_name)
    export(spark, pg_dsn, table_name, lake_root)
    for i in range(3):
        pg_conn.execute(f"UPDATE {table_name} SET v = v || %s", (str(i),))
        assert export(spark, pg_dsn, table_name, lake_root).status == "exported"

    result = compact(spark, pg_dsn, table, lake_root, mode=mode)

    assert {p.status for p in result.partitions} == {"merged" if mode == "merge" else "compacted"}
    live = lake_live(spark, lake_root, table_name, ["day", "id"])
    assert sorted((r["id"], r["v"]) for r in live.values()) == [(1, "a012"), (2, "b012")]


def test_a_table_without_the_statistics_of_the_column_is_never_merged(spark, pg_dsn, pg_conn, table_name, lake_root):
    pg_conn.execute(f"CREATE TABLE {table_name} (id bigint PRIMARY KEY, v text)")
    pg_conn.execute("SELECT coldharbor.register_table(%s)", (table_name,))
    [table] = registry.load(pg_conn, table_name)
    path = table.lake_path(lake_root)
    write_batches(spark, path, {b: [lake_row(b, f"v{b}", b, b)] for b in range(1, 5)})  # before the column
    assert SETTLED not in lake_table(spark, lake_root, table_name).columns
    assert compact(spark, pg_dsn, table, lake_root, mode="merge").status == "nothing_to_do"
    assert compact(spark, pg_dsn, table, lake_root, mode="auto").status == "compacted"


@pytest.mark.parametrize("argv, message", [
    (["--mode", "auto", "--full-rewrite-fraction", "0"], "full rewrite fraction must be in (0, 1]"),
    (["--mode", "auto", "--full-every-hours", "-1"], "positive time"),
])
def test_compact_refuses_a_setting_that_makes_no_sense(pg_dsn, lake_root, monkeypatch, caplog, argv, message):
    from coldharbor.maintenance.compaction import main

    monkeypatch.setenv("COLDHARBOR_PG_DSN", pg_dsn)
    assert main(["--lake-root", lake_root, *argv]) == 2
    assert message in caplog.text


def test_compact_refuses_an_unknown_mode_with_its_usage(lake_root, capsys):
    from coldharbor.maintenance.compaction import main

    with pytest.raises(SystemExit) as exited:
        main(["--lake-root", lake_root, "--mode", "never"])
    assert exited.value.code == 2
    assert "argument --mode: invalid choice: 'never'" in capsys.readouterr().err

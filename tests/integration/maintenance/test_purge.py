"""Purge against real PostgreSQL and Spark + Delta: nothing left anywhere, bad input changes nothing."""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
from coldharbor.capture import registry
from coldharbor.lake import delta
from coldharbor.maintenance import purge_predicate
from coldharbor.maintenance.compaction import compact_table
from coldharbor.maintenance.compaction_plan import CompactionConfig
from coldharbor.maintenance.purge import PurgeConfig, purge
from coldharbor.maintenance.purge import main as purge_main
from coldharbor.maintenance.purge_steps import verify
from coldharbor.runtime import pg
from coldharbor.runtime.spark import temporary_conf

from tests.helpers import dirty_ids, evict, export, lake_live, pg_rows, serve_report

DDL = "id bigint PRIMARY KEY, customer text, amount numeric(10,2)"


def make(conn, name: str):
    conn.execute(f"CREATE TABLE {name} ({DDL})")
    conn.execute("SELECT coldharbor.register_table(%s)", (name,))
    return registry.load(conn, name)[0]


def history_of_c1(spark, pg_dsn, pg_conn, name, lake_root):
    """c1's rows in every place a row can be: current and old lake versions, compacted files,
    evicted from the hot tier, dirty in the change log."""
    pg_conn.execute(f"INSERT INTO {name} SELECT g, 'c' || (g % 4), g FROM generate_series(1, 40) g")
    export(spark, pg_dsn, name, lake_root)
    pg_conn.execute(f"UPDATE {name} SET customer = 'c2' WHERE id = 5")    # was c1: an old version matches
    pg_conn.execute(f"UPDATE {name} SET customer = 'c1' WHERE id = 6")    # now c1: its old versions do not
    pg_conn.execute(f"UPDATE {name} SET amount = amount + 1 WHERE customer = 'c1'")
    export(spark, pg_dsn, name, lake_root)
    pg_conn.execute(f"UPDATE {name} SET amount = 0 WHERE id = 9")
    export(spark, pg_dsn, name, lake_root)
    with pg.connect(pg_dsn) as conn:
        [table] = registry.load(conn, name)
        compact_table(spark, conn, table, CompactionConfig(None, lake_root, f"c-{name}", min_small_files=2))
    evict(pg_conn, name, "id = 13")  # id 13 (c1) evicted: only the lake has it now
    pg_conn.execute(f"INSERT INTO {name} VALUES (100, 'c1', 1)")          # dirty, never exported


def test_purge_leaves_nothing_behind_and_keeps_everything_else(
        spark, pg_dsn, pg_conn, table_name, lake_root, monkeypatch):
    table = make(pg_conn, table_name)
    history_of_c1(spark, pg_dsn, pg_conn, table_name, lake_root)
    others = {k: v for k, v in pg_rows(pg_conn, f"SELECT * FROM {table_name}", ["id"]).items()
              if v["customer"] != "c1"}
    with pg.connect(pg_dsn) as conn:
        result = purge(spark, conn, table, PurgeConfig(table_name, "customer = 'c1'", lake_root, "p1",
                                                       timedelta(0), allow_short_retention=True))
    assert result.complete, result.remaining
    assert result.remaining == {"postgres_rows": 0, "change_log_rows": 0, "lake_current_rows": 0,
                                "lake_rows_in_kept_files": 0}
    assert result.hot_rows_deleted == 10 and result.keys_purged == 11  # 9 + id 6 + id 100; + evicted id 13
    assert pg_rows(pg_conn, f"SELECT * FROM {table_name}", ["id"]) == others
    assert lake_live(spark, lake_root, table_name, ["id"]) == {k: v for k, v in others.items()}
    assert (5,) in others and others[(5,)]["customer"] == "c2"  # its old c1 version went, it did not
    lake_rows = spark.read.format("delta").load(table.lake_path(lake_root))
    assert lake_rows.filter("customer = 'c1'").count() == 0
    purged_log = pg_conn.execute("""SELECT count(*) FROM coldharbor.change_log WHERE table_id = %s
                                     AND (key ->> 'id')::int IN (1, 6, 13, 100)""", (table.table_id,)).fetchone()[0]
    assert purged_log == 0
    assert serve_report(monkeypatch, pg_dsn, lake_root, "--sql", f"SELECT * FROM {table_name}",
                        "--target", "adhoc_purged") == 0
    assert pg_rows(pg_conn, "SELECT * FROM reports.adhoc_purged", ["id"]) == others
    export(spark, pg_dsn, table_name, lake_root)
    assert lake_live(spark, lake_root, table_name, ["id"]) == others


def purge_now(spark, pg_dsn, table, name: str, where: str, lake_root: str, run_id: str):
    with pg.connect(pg_dsn) as conn:
        return purge(spark, conn, table, PurgeConfig(name, where, lake_root, run_id, timedelta(0),
                                                     allow_short_retention=True))


def test_a_row_updated_out_of_the_predicate_and_not_yet_exported_stays_in_reports(
        spark, pg_dsn, pg_conn, table_name, lake_root, monkeypatch):
    table = make(pg_conn, table_name)
    pg_conn.execute(f"INSERT INTO {table_name} VALUES (1, 'c1', 1), (2, 'c1', 2), (3, 'c2', 3)")
    export(spark, pg_dsn, table_name, lake_root)
    pg_conn.execute(f"UPDATE {table_name} SET customer = 'c3' WHERE id = 1")  # newest lake version still c1
    dirty = dirty_ids(pg_conn, table_name)

    result = purge_now(spark, pg_dsn, table, table_name, "customer = 'c1'", lake_root, "p-kept")
    assert result.complete, result.remaining
    current = {(1,): {"id": 1, "customer": "c3", "amount": 1}, (3,): {"id": 3, "customer": "c2", "amount": 3}}
    assert pg_rows(pg_conn, f"SELECT * FROM {table_name}", ["id"]) == current
    assert serve_report(monkeypatch, pg_dsn, lake_root, "--sql", f"SELECT * FROM {table_name}",
                        "--target", "adhoc_purge_kept") == 0
    assert pg_rows(pg_conn, "SELECT * FROM reports.adhoc_purge_kept", ["id"]) == current
    assert dirty_ids(pg_conn, table_name) == dirty  # the unexported change is still to export
    assert spark.read.format("delta").load(table.lake_path(lake_root)).filter("customer = 'c1'").count() == 0
    assert (result.hot_rows_deleted, result.keys_purged, result.keys_kept) == (1, 1, 1)
    export(spark, pg_dsn, table_name, lake_root)
    assert lake_live(spark, lake_root, table_name, ["id"]) == current


def test_a_purge_matching_null_values_keeps_delete_markers(spark, pg_dsn, pg_conn, table_name, lake_root,
                                                           monkeypatch):
    table = make(pg_conn, table_name)
    pg_conn.execute(f"INSERT INTO {table_name} VALUES (1, 'c1', 1), (2, NULL, 2), (3, 'c3', 3)")
    export(spark, pg_dsn, table_name, lake_root)
    pg_conn.execute(f"DELETE FROM {table_name} WHERE id = 1")  # its delete marker has NULL values
    export(spark, pg_dsn, table_name, lake_root)

    assert purge_now(spark, pg_dsn, table, table_name, "customer IS NULL", lake_root, "p-null").complete
    assert serve_report(monkeypatch, pg_dsn, lake_root, "--sql", f"SELECT id FROM {table_name}",
                        "--target", "adhoc_purge_null") == 0
    assert pg_rows(pg_conn, "SELECT id FROM reports.adhoc_purge_null", ["id"]) == {(3,): {"id": 3}}


def test_verify_finds_a_change_log_row_left_for_a_purged_key(spark, pg_dsn, pg_conn, table_name, lake_root):
    table = make(pg_conn, table_name)
    pg_conn.execute(f"INSERT INTO {table_name} VALUES (1, 'c1', 1), (2, 'c2', 2)")
    export(spark, pg_dsn, table_name, lake_root)
    assert purge_now(spark, pg_dsn, table, table_name, "customer = 'c1'", lake_root, "p-log").complete
    pg_conn.execute("INSERT INTO coldharbor.change_log (table_id, key, op) VALUES (%s, '{\"id\": 1}', 'U')",
                    (table.table_id,))
    with pg.connect(pg_dsn) as conn:
        columns = registry.lake_columns(conn, table)
        predicate = purge_predicate.parse("customer = 'c1'", columns)
        remaining = verify(spark, conn, table, table.lake_path(lake_root), [c for c in columns if c.is_key],
                           {(1,)}, predicate, has_lake=True)
    assert remaining["change_log_rows"] == 1


def test_an_accepted_predicate_selects_the_same_rows_in_postgresql_and_spark(spark, pg_dsn, pg_conn, table_name,
                                                                          lake_root):
    pg_conn.execute(f"CREATE TABLE {table_name} (id bigint PRIMARY KEY, name text, "
                    "at timestamptz, day date)")
    pg_conn.execute("SELECT coldharbor.register_table(%s)", (table_name,))
    pg_conn.execute(f"""INSERT INTO {table_name} VALUES
        (1, 'Zeta', '2026-01-01 00:30:00+00', '2026-01-01'), (2, 'alpha', '2025-12-31 23:30:00+00', '2025-12-31'),
        (3, 'Beta', '2026-01-01 05:00:00+05', '2026-01-02'), (4, 'b', NULL, NULL), (5, 'B', '2026-06-01 00:00:00Z',
        '2026-06-01')""")
    export(spark, pg_dsn, table_name, lake_root)
    [table] = registry.load(pg_conn, table_name)
    columns = registry.lake_columns(pg_conn, table)
    rows = spark.read.format("delta").load(table.lake_path(lake_root))
    pg_conn.execute("SET TimeZone = 'America/New_York'")
    with temporary_conf(spark, {"spark.sql.session.timeZone": "Asia/Tokyo"}):
        for where in ["name < 'a'", "name BETWEEN 'B' AND 'b'", "name = 'b'", "name LIKE 'B%'",
                      "at < '2026-01-01T00:00:00Z'", "at >= '2026-01-01 01:00:00+01:00' OR day = '2026-06-01'",
                      "day > '2025-12-31' AND NOT name IN ('Zeta')", "at IS NULL"]:
            predicate = purge_predicate.parse(where, columns)
            in_postgres = {r[0] for r in pg_conn.execute(f"SELECT id FROM {table_name} WHERE {predicate.postgres}")}
            in_spark = {r["id"] for r in rows.filter(predicate.spark).select("id").collect()}
            assert in_postgres == in_spark, (where, predicate)


def test_a_retention_that_keeps_old_files_is_reported_incomplete(spark, pg_dsn, pg_conn, table_name, lake_root,
                                                                 monkeypatch, caplog):
    make(pg_conn, table_name)
    pg_conn.execute(f"INSERT INTO {table_name} VALUES (1, 'c1', 1), (2, 'c2', 2)")
    export(spark, pg_dsn, table_name, lake_root)
    monkeypatch.setenv("COLDHARBOR_PG_DSN", pg_dsn)
    rc = purge_main(["--table", table_name, "--where", "customer = 'c1'", "--lake-root", lake_root,
                     "--vacuum-retention-hours", "200"])
    assert rc == 4
    assert "lake_rows_in_kept_files': 1" in caplog.text
    assert pg_rows(pg_conn, f"SELECT id FROM {table_name}", ["id"]) == {(2,): {"id": 2}}


@pytest.mark.parametrize("args, message", [
    (["--where", "custmer = 'c1'", "--vacuum-retention-hours", "0", "--allow-short-retention"],
     "column 'custmer'"),
    (["--where", "customer = ", "--vacuum-retention-hours", "0", "--allow-short-retention"], "does not parse"),
    (["--where", "customer = 'c1' OR pg_sleep(1) IS NULL", "--vacuum-retention-hours", "0",
      "--allow-short-retention"], "one column with literals"),
    (["--where", "customer = 'c1'", "--vacuum-retention-hours", "0"], "--allow-short-retention"),
])
def test_bad_input_changes_nothing(spark, pg_dsn, pg_conn, table_name, lake_root, monkeypatch, caplog,
                                   args, message):
    table = make(pg_conn, table_name)
    pg_conn.execute(f"INSERT INTO {table_name} VALUES (1, 'c1', 1), (2, 'c2', 2)")
    export(spark, pg_dsn, table_name, lake_root)
    version = delta.pin_version(spark, table.lake_path(lake_root))
    before = pg_rows(pg_conn, f"SELECT * FROM {table_name}", ["id"])
    monkeypatch.setenv("COLDHARBOR_PG_DSN", pg_dsn)
    assert purge_main(["--table", table_name, "--lake-root", lake_root, *args]) == 2
    assert message in caplog.text
    assert pg_rows(pg_conn, f"SELECT * FROM {table_name}", ["id"]) == before
    assert delta.pin_version(spark, table.lake_path(lake_root)) == version


def test_purging_an_unregistered_table_is_refused(pg_dsn, lake_root, monkeypatch, caplog):
    monkeypatch.setenv("COLDHARBOR_PG_DSN", pg_dsn)
    assert purge_main(["--table", "public.nope", "--where", "id = 1", "--lake-root", lake_root,
                       "--vacuum-retention-hours", "200"]) == 2
    assert "not registered" in caplog.text


@pytest.mark.parametrize("where, refusal", [
    ("code = 1", "column day holds 'infinity' (row region=north ü, day=infinity, code=1.00)"),
    ("day < '2000-01-01'", "column day holds '0044-03-15 BC' (row region=north ü, day=0044-03-15 BC, code=2.00)"),
    ("region = 'north ü'", "column day holds "),
], ids=["infinity", "bc", "either"])
def test_a_key_the_purge_cannot_read_is_refused_in_one_line(spark, pg_dsn, pg_conn, table_name, lake_root,
                                                            monkeypatch, caplog, where, refusal):
    """psycopg cannot give a date key of infinity or BC to Python: the purge died with a DataError
    traceback. Such a row never reached the lake (its export is refused): the purge refuses in one
    line naming it, and changes nothing."""
    pg_conn.execute(f"CREATE TABLE {table_name} (region text, day date, code numeric(10,2), v text, "
                    "PRIMARY KEY (region, day, code))")
    pg_conn.execute(f"INSERT INTO {table_name} SELECT 'r ' || (g % 3) || ' ü', date '2020-01-01' + g, g / 4.0, "
                    "'v' || g FROM generate_series(1, 30) g")
    pg_conn.execute("SELECT coldharbor.register_table(%s)", (table_name,))
    [table] = registry.load(pg_conn, table_name)
    export(spark, pg_dsn, table_name, lake_root)
    pg_conn.execute(f"INSERT INTO {table_name} VALUES ('north ü', 'infinity', 1, 'new'), "
                    "('north ü', '0044-03-15 BC', 2, 'new')")
    version = delta.pin_version(spark, table.lake_path(lake_root))
    query = f"SELECT region, day::text, code, v FROM {table_name}"
    before = pg_rows(pg_conn, query, ["region", "day", "code"])
    dirty = dirty_ids(pg_conn, table_name)
    monkeypatch.setenv("COLDHARBOR_PG_DSN", pg_dsn)

    assert purge_main(["--table", table_name, "--where", where, "--lake-root", lake_root,
                       "--vacuum-retention-hours", "200"]) == 2
    [line] = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert f"purge failed: public.{table_name}: {refusal}" in line and "nothing was purged" in line, line
    assert "Traceback" not in caplog.text
    assert pg_rows(pg_conn, query, ["region", "day", "code"]) == before
    assert dirty_ids(pg_conn, table_name) == dirty
    assert delta.pin_version(spark, table.lake_path(lake_root)) == version


@pytest.fixture(params=["UTC", "Asia/Tokyo"])
def python_zone(request, monkeypatch):
    """This Python process's local time zone (the JVM and PostgreSQL sessions stay in UTC)."""
    monkeypatch.setenv("TZ", request.param)
    time.tzset()
    yield request.param
    monkeypatch.undo()
    time.tzset()


def test_timestamptz_keys_at_the_lakes_edges_purge_whatever_the_python_zone(
        spark, pg_dsn, pg_conn, table_name, lake_root, monkeypatch, python_zone):
    """The purge brings the lake's matching keys into Python: PySpark converts a TIMESTAMP there in
    the process's local time, which fails for 0001-01-01 00:00 UTC ('year 0 is out of range') and
    shifts every key east or west of UTC, so the lake's keys matched none of PostgreSQL's."""
    t = table_name
    pg_conn.execute(f"CREATE TABLE {t} (at timestamptz, shop text, v text, PRIMARY KEY (at, shop))")
    pg_conn.execute(f"""INSERT INTO {t} VALUES ('0001-01-01 00:00:00+00', 'o''k', 'gone'),
                            ('9999-12-31 23:59:59.999999+00', 'a', 'gone'), ('2020-06-01 12:00:00+00', 'a', 'stay')""")
    pg_conn.execute(f"INSERT INTO {t} SELECT timestamptz '2021-01-01 00:00+00' + g * interval '1 hour', 'b', 'stay' "
                    "FROM generate_series(1, 40) g")
    pg_conn.execute("SELECT coldharbor.register_table(%s)", (t,))
    export(spark, pg_dsn, t, lake_root)
    pg_conn.execute(f"UPDATE {t} SET v = 'gone' WHERE at = '2020-06-01 12:00:00+00'")
    export(spark, pg_dsn, t, lake_root)
    pg_conn.execute(f"UPDATE {t} SET v = 'back' WHERE at = '2020-06-01 12:00:00+00'")  # not exported: kept
    [table] = registry.load(pg_conn, t)

    result = purge_now(spark, pg_dsn, table, t, "v = 'gone'", lake_root, f"p-{python_zone}")

    assert result.complete, result.remaining
    assert (result.hot_rows_deleted, result.keys_purged, result.keys_kept) == (2, 2, 1)
    expected = pg_rows(pg_conn, f"SELECT * FROM {t}", ["at", "shop"])
    assert len(expected) == 41 and all(row["v"] != "gone" for row in expected.values())
    assert serve_report(monkeypatch, pg_dsn, lake_root, "--sql", f"SELECT * FROM {t}", "--target",
                        f"adhoc_{t}") == 0
    assert pg_rows(pg_conn, f"SELECT * FROM reports.adhoc_{t}", ["at", "shop"]) == expected
    assert spark.read.format("delta").load(table.lake_path(lake_root)).filter("v = 'gone'").count() == 0


def test_a_kept_key_whose_settled_row_is_purged_is_ranked_again(spark, pg_dsn, pg_conn, table_name, lake_root,
                                                                 monkeypatch):
    """Compaction settled key 1's matching version and kept its older one; the purge takes the
    settled row of a key it keeps (its current row no longer matches): the key's remaining versions
    are ranked again, so the lake alone still answers with its newest remaining version."""
    from coldharbor.lake.lake_rows import SETTLED, latest_per_key, live_rows

    pg_conn.execute(f"CREATE TABLE {table_name} ({DDL})")
    pg_conn.execute(f"INSERT INTO {table_name} VALUES (1, 'c0', 1), (2, 'c2', 2)")
    pg_conn.execute("SELECT coldharbor.register_table(%s)", (table_name,))
    [table] = registry.load(pg_conn, table_name)
    export(spark, pg_dsn, table_name, lake_root)  # the initial load
    pg_conn.execute(f"UPDATE {table_name} SET customer = 'c1' WHERE id = 1")
    export(spark, pg_dsn, table_name, lake_root)
    with pg.connect(pg_dsn) as conn:
        compact_table(spark, conn, table, CompactionConfig(None, lake_root, f"c-{table_name}", min_small_files=2,
                                                           history_window=timedelta(hours=1)))
    path = table.lake_path(lake_root)
    assert sorted((r.id, r.customer, r[SETTLED]) for r in spark.read.format("delta").load(path).collect()) == \
        [(1, "c0", 0), (1, "c1", 1), (2, "c2", 1)]
    pg_conn.execute(f"UPDATE {table_name} SET customer = 'c3' WHERE id = 1")  # not exported

    result = purge_now(spark, pg_dsn, table, table_name, "customer = 'c1'", lake_root, "p-settled")
    assert result.complete, result.remaining
    assert result.keys_kept == 1
    lake_rows = spark.read.format("delta").load(path)
    ranked_all = {r.id: r.customer for r in lake_rows.transform(latest_per_key(["id"])).collect()}
    assert ranked_all == {1: "c0", 2: "c2"}
    assert {r.id: r.customer for r in lake_rows.transform(live_rows(["id"])).collect()} == ranked_all
    export(spark, pg_dsn, table_name, lake_root)
    assert lake_live(spark, lake_root, table_name, ["id"]) == pg_rows(pg_conn, f"SELECT * FROM {table_name}", ["id"])

"""Registering a table that already holds rows: the initial load, against real PostgreSQL and Spark + Delta.

Every test here registers tables that hold rows before registration, and most write to them while
their load runs: the review found that every earlier test registered an empty table.
"""

from __future__ import annotations

import threading
import time
import uuid

import psycopg
import pytest
from coldharbor.capture import registry
from coldharbor.export import base_state
from coldharbor.export.table_export import ExportConfig, export_tables
from coldharbor.runtime import pg
from coldharbor.runtime.errors import TableBusyError

from tests.helpers import _normal, export, lake_live, lake_table, pg_rows, report_run, serve_report

DDL = "id bigint PRIMARY KEY, customer text, amount numeric(12,2), status text"


def filled_table(conn, name: str, rows: int, ddl: str = DDL) -> None:
    """A table holding `rows` rows before it is registered."""
    conn.execute(f"CREATE TABLE {name} ({ddl})")
    conn.execute(f"INSERT INTO {name} SELECT g, 'c' || (g % 13), g * 0.5, 'new' FROM generate_series(1, {rows}) g")
    conn.execute("SELECT coldharbor.register_table(%s)", (name,))


def change_log_rows(conn, name: str) -> int:
    [table] = registry.load(conn, name)
    return conn.execute("SELECT count(*) FROM coldharbor.change_log WHERE table_id = %s",
                        (table.table_id,)).fetchone()[0]


def state_of(conn, name: str) -> base_state.LoadState:
    [table] = registry.load(conn, name)
    return base_state.load_state(conn, table.table_id)


def test_a_table_registered_with_rows_reaches_the_lake_whole(spark, pg_dsn, pg_conn, table_name, lake_root,
                                                             monkeypatch):
    filled_table(pg_conn, table_name, 5000)
    assert state_of(pg_conn, table_name).pending
    pg_conn.execute(f"UPDATE {table_name} SET status = 'paid' WHERE id = 7")
    pg_conn.execute(f"INSERT INTO {table_name} VALUES (5001, 'late', 1, 'new')")
    assert change_log_rows(pg_conn, table_name) == 2  # the 5,000 rows went through no change_log row

    result = export(spark, pg_dsn, table_name, lake_root)

    # The snapshot was taken after both writes: it holds 5,001 rows; the two logged changes follow it.
    assert (result.status, result.loaded_rows) == ("exported", 5001)
    expected = pg_rows(pg_conn, f"SELECT * FROM {table_name}", ["id"])
    assert lake_live(spark, lake_root, table_name, ["id"]) == expected
    assert len(expected) == 5001 and expected[(7,)]["status"] == "paid"
    state = state_of(pg_conn, table_name)
    assert not state.pending and state.loaded_version is not None and state.loaded_at is not None
    base = lake_table(spark, lake_root, table_name).filter("_ch_seq = 0")
    assert base.count() == 5001  # the load's rows sort before every captured change
    assert serve_report(monkeypatch, pg_dsn, lake_root, "--sql", f"SELECT count(*) AS n FROM {table_name}",
                        "--target", "adhoc_loaded", "--run-id", f"loaded-{table_name}") == 0
    assert pg_conn.execute("SELECT n FROM reports.adhoc_loaded").fetchone()[0] == 5001


def test_reports_before_the_load_lands_equal_postgres_and_say_so(spark, pg_dsn, pg_conn, table_name, lake_root,
                                                                monkeypatch):
    filled_table(pg_conn, table_name, 3000)
    pg_conn.execute(f"DELETE FROM {table_name} WHERE id <= 10")
    run_id = f"before-load-{table_name}"
    assert serve_report(monkeypatch, pg_dsn, lake_root, "--sql",
                        f"SELECT count(*) AS n, sum(amount) AS total FROM {table_name}",
                        "--target", "adhoc_before_load", "--run-id", run_id) == 0
    served = pg_conn.execute("SELECT n, total FROM reports.adhoc_before_load").fetchone()
    assert served == pg_conn.execute(f"SELECT count(*), sum(amount) FROM {table_name}").fetchone()
    assert served[0] == 2990
    record = report_run(pg_conn, run_id)
    assert record["served_from_postgres"] == [f"public.{table_name}"] and not record["degraded"]


def test_a_report_pinned_before_the_load_commit_is_served_from_postgres(spark, pg_dsn, pg_conn, table_name,
                                                                       lake_root):
    """The lake version is pinned before the PostgreSQL snapshot: a load that lands in between must
    not leave the report reading a lake version without the loaded rows."""
    from coldharbor.serve import hot_snapshot

    filled_table(pg_conn, table_name, 200)
    [table] = registry.load(pg_conn, table_name)
    pinned = {table.table_id: None}  # pinned while the lake had no table
    export(spark, pg_dsn, table_name, lake_root)
    snapshot = hot_snapshot.read(pg_conn, pinned, [table])
    hot = snapshot.tables[table.table_id]
    assert hot.hot_only and hot.load_pending and hot.images.num_rows == 200


KEY_TYPES = [
    ("smallint", "g::smallint"), ("integer", "g"), ("bigint", "g::bigint * 1000000007"), ("numeric(20,4)", "g / 7.0"),
    ("text", "'k-' || g || ' ü'"), ("varchar(40)", "md5(g::text)"), ("char(12)", "lpad(g::text, 12, '0')"),
    ("date", "date '2001-01-01' + g"), ("timestamp", "timestamp '2001-01-01' + g * interval '1 minute 1.5 s'"),
    ("timestamptz", "timestamptz '2001-01-01 00:00+05' + g * interval '77 s'"),
    ("uuid", "md5(g::text)::uuid"), ("bytea", "decode(md5(g::text), 'hex')"), ("boolean", "g % 2 = 0"),
]


@pytest.mark.parametrize("key_type,key_expr", KEY_TYPES, ids=[t for t, _ in KEY_TYPES])
def test_keys_of_every_accepted_type_load_exactly(spark, pg_dsn, pg_conn, table_name, lake_root, key_type, key_expr):
    pg_conn.execute(f"CREATE TABLE {table_name} (k {key_type}, n integer, v text, PRIMARY KEY (k, n))")
    pg_conn.execute(f"INSERT INTO {table_name} SELECT {key_expr}, g % 3, 'v' || g FROM generate_series(1, 300) g "
                    "ON CONFLICT DO NOTHING")
    pg_conn.execute("SELECT coldharbor.register_table(%s)", (table_name,))
    pg_conn.execute(f"UPDATE {table_name} SET v = 'changed' WHERE n = 1")
    pg_conn.execute(f"DELETE FROM {table_name} WHERE n = 2")

    export(spark, pg_dsn, table_name, lake_root)

    expected = pg_rows(pg_conn, f"SELECT k, n, v FROM {table_name}", ["k", "n"])
    live = lake_live(spark, lake_root, table_name, ["k", "n"])
    assert len(expected) > 0 and any(r["v"] == "changed" for r in expected.values())
    assert by_key(live) == by_key(expected)


def by_key(rows: dict) -> dict:
    """{(k, n): v} with uuids as the lake holds them (canonical text)."""
    def plain(value):
        return str(value) if isinstance(value, uuid.UUID) else _normal(value)
    return {tuple(plain(x) for x in key): row["v"] for key, row in rows.items()}


def test_many_tables_registered_with_rows_load_in_one_run(spark, pg_dsn, pg_conn, lake_root):
    names = [f"t_{uuid.uuid4().hex[:10]}" for _ in range(4)]
    for i, name in enumerate(names):
        filled_table(pg_conn, name, 500 * (i + 1))
        pg_conn.execute(f"UPDATE {name} SET amount = -1 WHERE id % 100 = 0")
    tables = [t for t in registry.load(pg_conn) if t.table_name in names]
    config = ExportConfig(table=None, lake_root=lake_root, run_id="many")
    results = export_tables(spark, pg_conn, pg.JdbcTarget.from_dsn(pg_dsn), config, tables, lambda point: None)
    assert sorted(r.loaded_rows for r in results) == [500, 1000, 1500, 2000]
    for name in names:
        assert lake_live(spark, lake_root, name, ["id"]) == pg_rows(pg_conn, f"SELECT * FROM {name}", ["id"])


def test_an_empty_table_settles_without_a_lake_commit(spark, pg_dsn, pg_conn, table_name, lake_root):
    pg_conn.execute(f"CREATE TABLE {table_name} ({DDL})")
    pg_conn.execute("SELECT coldharbor.register_table(%s)", (table_name,))
    result = export(spark, pg_dsn, table_name, lake_root)
    assert result.status == "clean" and result.loaded_rows == 0
    state = state_of(pg_conn, table_name)
    assert not state.pending and state.loaded_version is None


def test_writes_while_the_load_reads_are_exact(spark, pg_dsn, admin_dsn, pg_conn, table_name, lake_root):
    """Changes committed after capture but before the load's snapshot are both in the snapshot and in
    change_log (last write wins); changes after the snapshot are only in change_log."""
    filled_table(pg_conn, table_name, 2000)
    pg_conn.execute(f"UPDATE {table_name} SET status = 'before-snapshot' WHERE id <= 100")

    def write_after_snapshot(point: str) -> None:
        if point != "load_after_snapshot":
            return
        with psycopg.connect(admin_dsn, autocommit=True) as app:
            app.execute(f"UPDATE {table_name} SET status = 'after-snapshot', amount = amount + 1 "
                        "WHERE id BETWEEN 50 AND 150")
            app.execute(f"DELETE FROM {table_name} WHERE id BETWEEN 1000 AND 1100")
            app.execute(f"INSERT INTO {table_name} SELECT g, 'new', 2, 'after-snapshot' "
                        "FROM generate_series(2001, 2100) g")

    export(spark, pg_dsn, table_name, lake_root, hook=write_after_snapshot)

    expected = pg_rows(pg_conn, f"SELECT * FROM {table_name}", ["id"])
    assert lake_live(spark, lake_root, table_name, ["id"]) == expected
    assert sum(1 for r in expected.values() if r["status"] == "after-snapshot") == 201


def test_the_load_never_blocks_the_application(spark, pg_dsn, admin_dsn, pg_conn, table_name, lake_root):
    """The load takes ACCESS SHARE only: a writer with a short lock timeout keeps writing throughout."""
    filled_table(pg_conn, table_name, 20000)
    relid = pg_conn.execute("SELECT %s::regclass::oid", (table_name,)).fetchone()[0]
    done = threading.Event()
    modes: set[str] = set()
    writes, failures = [0], []

    def watch_locks() -> None:
        with psycopg.connect(admin_dsn, autocommit=True) as watcher:
            while not done.is_set():
                modes.update(r[0] for r in watcher.execute(
                    "SELECT mode FROM pg_locks l JOIN pg_stat_activity a USING (pid) "
                    "WHERE l.relation = %s AND a.application_name <> 'coldharbor-test-app' "
                    "AND a.backend_type = 'client backend'",  # autovacuum's own lock is not the load's
                    (relid,)).fetchall())

    def write() -> None:
        with psycopg.connect(admin_dsn, autocommit=True, application_name="coldharbor-test-app") as app:
            app.execute("SET lock_timeout = '2s'")
            i = 0
            while not done.is_set():
                i += 1
                try:
                    app.execute(f"UPDATE {table_name} SET amount = amount + 1 WHERE id = %s", (i % 20000 + 1,))
                    writes[0] += 1
                except psycopg.Error as exc:  # a lock timeout would land here
                    failures.append(str(exc))

    threads = [threading.Thread(target=watch_locks), threading.Thread(target=write)]
    for thread in threads:
        thread.start()
    try:
        export(spark, pg_dsn, table_name, lake_root)
    finally:
        done.set()
        for thread in threads:
            thread.join()
    assert failures == [] and writes[0] > 0
    assert modes <= {"AccessShareLock"}, modes
    export(spark, pg_dsn, table_name, lake_root)
    assert lake_live(spark, lake_root, table_name, ["id"]) == pg_rows(pg_conn, f"SELECT * FROM {table_name}", ["id"])


def test_a_truncate_during_the_load_goes_through_and_the_next_run_loads(spark, pg_dsn, admin_dsn, pg_conn,
                                                                       table_name, lake_root):
    """A TRUNCATE queued behind the load's lock made the JDBC readers queue behind it: the load waited
    for its readers, the readers for the TRUNCATE, the TRUNCATE (and the application behind it) for
    the load. Now the readers give up, the TRUNCATE goes through, and the next run loads."""
    filled_table(pg_conn, table_name, 2000)
    outcome, threads = {}, []

    def truncate() -> None:
        with psycopg.connect(admin_dsn, autocommit=True) as app:
            app.execute("SET lock_timeout = '60s'")  # bounds the test had the cycle come back
            try:
                app.execute(f"TRUNCATE {table_name}")
                outcome["truncate"] = "done"
            except psycopg.Error as exc:
                outcome["truncate"] = str(exc)

    def truncate_after_snapshot(point: str) -> None:
        if point != "load_after_snapshot":
            return
        threads.append(threading.Thread(target=truncate))
        threads[0].start()
        with psycopg.connect(admin_dsn, autocommit=True) as watcher:  # until the TRUNCATE waits for its lock
            while not watcher.execute("SELECT EXISTS (SELECT 1 FROM pg_locks WHERE relation = %s::regclass "
                                      "AND NOT granted)", (table_name,)).fetchone()[0]:
                time.sleep(0.05)

    try:
        with pytest.raises(TableBusyError, match="gave way to a statement that locks the table exclusively"):
            export(spark, pg_dsn, table_name, lake_root, hook=truncate_after_snapshot)
    finally:
        for thread in threads:
            thread.join()
    assert outcome["truncate"] == "done" and state_of(pg_conn, table_name).pending
    pg_conn.execute(f"INSERT INTO {table_name} VALUES (1, 'after', 1, 'new')")
    export(spark, pg_dsn, table_name, lake_root)
    assert lake_live(spark, lake_root, table_name, ["id"]) == pg_rows(pg_conn, f"SELECT * FROM {table_name}", ["id"])


def test_registration_settles_an_empty_table_at_commit_and_keeps_a_filled_one_pending(pg_conn, table_name):
    empty, filled = f"{table_name}_e", f"{table_name}_f"
    pg_conn.execute(f"CREATE TABLE {empty} ({DDL})")
    pg_conn.execute(f"CREATE TABLE {filled} ({DDL})")
    pg_conn.execute(f"INSERT INTO {filled} VALUES (1, 'a', 1, 'new')")
    pg_conn.execute("SELECT coldharbor.register_table(%s)", (empty,))
    pg_conn.execute("SELECT coldharbor.register_table(%s)", (filled,))
    assert not state_of(pg_conn, empty).pending
    assert state_of(pg_conn, filled).pending


def test_a_registration_in_a_repeatable_read_transaction_stays_pending_and_the_export_settles_it(
        spark, pg_dsn, pg_conn, table_name, lake_root):
    """Such a transaction cannot look at the table afresh at commit: its load is left to the export."""
    pg_conn.execute(f"CREATE TABLE {table_name} ({DDL})")
    with pg_conn.transaction():
        pg_conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        pg_conn.execute("SELECT coldharbor.register_table(%s)", (table_name,))
    assert state_of(pg_conn, table_name).pending
    with pg.connect(pg_dsn) as conn:
        [table] = registry.load(conn, table_name)
        from coldharbor.export.export_job import needs_spark

        assert not needs_spark(conn, table)  # settled by a snapshot look, no Spark started
    assert not state_of(pg_conn, table_name).pending


EDGE_DDL = "id integer PRIMARY KEY, d date, ts timestamp, tz timestamptz, n numeric(38,30), t text"
# Values at the edges of what the lake holds, each compared with PostgreSQL as text.
EDGE_ROWS = [
    (1, "0001-01-01", "0001-01-01 00:00:00", "0001-01-01 00:00:00+00", "0.000000000000000000000000000001", ""),
    (2, "9999-12-31", "9999-12-31 23:59:59.999999", "9999-12-31 23:59:59.999999+00", "-12345678.123456789012345678901234567890", " "),
    (3, "2024-02-29", "2024-02-29 01:02:03.000001", "2024-03-31 02:30:00.123456+05:45", "1", "it's \"q\" \\ ü 😀 \x01"),
    (4, "1582-10-15", "1582-10-04 23:59:59.999999", "1900-01-01 00:00+01:23:45", "-0.5", "\t\n\r"),
]
# Values the lake cannot hold exactly, each in a table of its own among good ones.
UNREPRESENTABLE = [("d", "infinity"), ("ts", "-infinity"), ("tz", "0044-03-15 12:00+00 BC"), ("d", "1582-10-10"),
                   ("n", "NaN")]


def test_edge_values_load_exactly_and_one_table_the_lake_cannot_hold_fails_alone(spark, pg_dsn, pg_conn, lake_root):
    """A date or timestamp outside what the lake holds (infinity, BC, the ten days of 1582 the JDBC
    calendar lacks) or a numeric NaN failed the Delta write, or landed ten days on, and failed every
    other table of the run with it. Now that table alone is refused, naming column and value, and stays pending."""
    good = f"t_{uuid.uuid4().hex[:10]}"
    bad = [f"t_{uuid.uuid4().hex[:10]}" for _ in UNREPRESENTABLE]
    for name in [good, *bad]:
        pg_conn.execute(f"CREATE TABLE {name} ({EDGE_DDL})")
        for row in EDGE_ROWS:
            pg_conn.execute(f"INSERT INTO {name} VALUES (%s, %s, %s, %s, %s, %s)", row)
    for name, (column, value) in zip(bad, UNREPRESENTABLE):
        pg_conn.execute(f"UPDATE {name} SET {column} = %s WHERE id = 3", (value,))
    for name in [good, *bad]:
        pg_conn.execute("SELECT coldharbor.register_table(%s)", (name,))
    tables = [t for t in registry.load(pg_conn) if t.table_name in [good, *bad]]

    results = {r.table: r for r in export_tables(spark, pg_conn, pg.JdbcTarget.from_dsn(pg_dsn),
                                       ExportConfig(None, lake_root, "edges"), tables, lambda point: None)}

    assert results[f"public.{good}"].loaded_rows == len(EDGE_ROWS)
    as_text = "id, d::text, ts::text, (tz AT TIME ZONE 'UTC')::text, n::text, t"
    expected = sorted(pg_conn.execute(f"SELECT {as_text} FROM {good}").fetchall())
    lake = (lake_table(spark, lake_root, good)
            .selectExpr("id", "cast(d AS string)", "cast(ts AS string)",
                        "date_format(tz, 'yyyy-MM-dd HH:mm:ss.SSSSSS')", "cast(n AS string)", "t").collect())
    # PostgreSQL drops zero microseconds from the text; the lake's format keeps them.
    assert sorted((r[0], r[1], r[2], r[3].removesuffix(".000000"), r[4], r[5]) for r in lake) == expected
    for name, (column, value) in zip(bad, UNREPRESENTABLE):
        result = results[f"public.{name}"]
        assert result.status == "failed", result
        assert f"column {column} holds" in result.error and "row id=3" in result.error, result.error
        assert "\n" not in result.error and state_of(pg_conn, name).pending


@pytest.mark.parametrize("setting, files", [("COLDHARBOR_BASE_READERS", 3), ("COLDHARBOR_JDBC_READERS", 2)],
                         ids=["base readers", "one fewer than the cores"])
def test_a_plain_table_is_loaded_by_its_base_readers(spark, pg_dsn, pg_conn, table_name, lake_root, monkeypatch,
                                                    setting, files):
    """Each reader reads its own block range and writes its own file: COLDHARBOR_BASE_READERS of
    them, else one fewer than the cores (here 3, COLDHARBOR_JDBC_READERS), which leaves a core to the
    application's writes. The size estimate once came from pg_partition_tree() alone, which lists
    nothing for a table that is not partitioned: every plain table was read by a single reader."""
    monkeypatch.setenv(setting, "3")
    filled_table(pg_conn, table_name, 20000)
    pg_conn.execute(f"UPDATE {table_name} SET status = 'paid' WHERE id % 1000 = 0")
    export(spark, pg_dsn, table_name, lake_root)
    base = lake_table(spark, lake_root, table_name).filter("_ch_seq = 0")
    assert len(base.inputFiles()) == files
    assert base.count() == 20000
    assert lake_live(spark, lake_root, table_name, ["id"]) == pg_rows(pg_conn, f"SELECT * FROM {table_name}", ["id"])

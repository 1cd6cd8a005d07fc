"""The change feed (jobs/changes.py) against real PostgreSQL and Spark + Delta: the feed between two
points is the net difference of PostgreSQL's table at those points, windows compose, `now` takes
the still-dirty changes from PostgreSQL, and every refusal is one line with nothing written."""

from __future__ import annotations

import time
from datetime import datetime

import pytest
from coldharbor.export import export_job as export_job
from coldharbor.serve import changes

from tests.helpers import _normal, pg_rows, report_run

HOSTILE = ' "q\'s" <b>ü'  # quotes of each kind, spaces, HTML and a non-ASCII letter
KEYS = ["id", "k"]
COLUMNS = ["id", "k", "v", "n"]


def quoted(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def instant(conn) -> datetime:
    """Now, on PostgreSQL's clock, with no commit at the same instant."""
    time.sleep(0.05)
    at = conn.execute("SELECT clock_timestamp()").fetchone()[0]
    time.sleep(0.05)
    return at


def state(conn, t: str) -> dict:
    return pg_rows(conn, f"SELECT id, k, v, n FROM {t}", KEYS)


def expected_feed(before: dict, after: dict) -> set:
    """(change type, row) of each net change from `before` to `after`."""
    rows = set()
    for key in before.keys() | after.keys():
        old, new = before.get(key), after.get(key)
        if old is None:
            rows.add(("insert", *new.values()))
        elif new is None:
            rows.add(("delete", *old.values()))
        elif old != new:
            rows.update({("update_preimage", *old.values()), ("update_postimage", *new.values())})
    return rows


def apply(table: dict, feed: set) -> dict:
    result = dict(table)
    for kind, *row in sorted(feed, key=lambda r: r[0] != "delete" and r[0] != "update_preimage"):
        key = tuple(row[COLUMNS.index(k)] for k in KEYS)
        if kind in ("delete", "update_preimage"):
            assert result.pop(key) == dict(zip(COLUMNS, row)), (kind, row)
        else:
            assert key not in result, (kind, row)
            result[key] = dict(zip(COLUMNS, row))
    return result


def feed(monkeypatch, pg_dsn, pg_conn, lake_root, name: str, start, end, target: str) -> set:
    monkeypatch.setenv("COLDHARBOR_PG_DSN", pg_dsn)
    point = (lambda p: p.isoformat() if isinstance(p, datetime) else str(p))
    assert changes.main(["--table", f"public.{name}", "--from", point(start), "--to", point(end),
                         "--target", target, "--lake-root", lake_root]) == 0
    rows = pg_conn.execute(f"SELECT _change_type, id, k, v, n, _change_seq, _commit_timestamp "
                           f"FROM reports.{target}").fetchall()
    assert all(seq is not None and at is not None for *_, seq, at in rows), rows
    found = {(kind, *map(_normal, values)) for kind, *values, _, _ in rows}
    assert len(found) == len(rows), "a change twice in the feed"
    return found


def exported(pg_dsn, lake_root, name) -> None:
    assert export_job.main(["--table", f"public.{name}", "--lake-root", lake_root]) == 0


def lake_version(spark, lake_root, name) -> int:
    from delta.tables import DeltaTable

    return DeltaTable.forPath(spark, f"{lake_root}/public/{name}").history(1).first()["version"]


def test_the_feed_is_the_net_difference_of_postgres_and_windows_compose(
        spark, pg_dsn, pg_conn, table_name, lake_root, monkeypatch):
    name = table_name + HOSTILE
    t = f"public.{quoted(name)}"
    monkeypatch.setenv("COLDHARBOR_PG_DSN", pg_dsn)
    pg_conn.execute(f"CREATE TABLE {t} (id bigint, k text, v text, n numeric(12,2), PRIMARY KEY (id, k))")
    pg_conn.execute(f"INSERT INTO {t} SELECT g, CASE WHEN g %% 2 = 0 THEN %s ELSE 'k' END, 'v' || g, g * 1.25 "
                    "FROM generate_series(1, 40) g", (HOSTILE + "\n; DROP TABLE x",))
    pg_conn.execute("SELECT coldharbor.register_table(%s)", (t,))
    exported(pg_dsn, lake_root, name)  # the initial load
    p0, s0 = instant(pg_conn), state(pg_conn, t)

    pg_conn.execute(f"UPDATE {t} SET v = v || ' changed', n = n + 1 WHERE id % 5 = 0")
    pg_conn.execute(f"DELETE FROM {t} WHERE id IN (3, 7)")
    pg_conn.execute(f"INSERT INTO {t} VALUES (100, 'new', 'inserted', NULL), (101, 'new', NULL, 0)")
    pg_conn.execute(f"UPDATE {t} SET v = 'back and forth' WHERE id = 11")
    pg_conn.execute(f"UPDATE {t} SET v = 'v11' WHERE id = 11")  # net: no change
    exported(pg_dsn, lake_root, name)
    v1 = lake_version(spark, lake_root, name)
    p1, s1 = instant(pg_conn), state(pg_conn, t)

    pg_conn.execute(f"DELETE FROM {t} WHERE id = 100")
    pg_conn.execute(f"INSERT INTO {t} VALUES (100, 'new', 'again', 7)")  # deleted and back: an update
    pg_conn.execute(f"INSERT INTO {t} VALUES (200, 'brief', 'gone soon', 1)")
    pg_conn.execute(f"DELETE FROM {t} WHERE id = 200")  # inserted and deleted: nothing
    pg_conn.execute(f"UPDATE {t} SET n = NULL WHERE id = 12")
    exported(pg_dsn, lake_root, name)
    v2 = lake_version(spark, lake_root, name)
    p2, s2 = instant(pg_conn), state(pg_conn, t)

    pg_conn.execute(f"UPDATE {t} SET v = 'dirty' WHERE id IN (1, 2, 100)")
    pg_conn.execute(f"DELETE FROM {t} WHERE id = 101")
    pg_conn.execute(f"INSERT INTO {t} VALUES (300, 'dirty', 'not exported', 3)")
    s3 = state(pg_conn, t)

    def of(start, end, target):
        return feed(monkeypatch, pg_dsn, pg_conn, lake_root, name, start, end, f"changes_{target}")

    f01, f12, f02 = of(p0, p1, "a"), of(p1, p2, "b"), of(p0, p2, "c")
    assert f01 == expected_feed(s0, s1) and f12 == expected_feed(s1, s2) and f02 == expected_feed(s0, s2)
    assert {r[0] for r in f01} == {"insert", "delete", "update_preimage", "update_postimage"}
    assert apply(apply(s0, f01), f12) == apply(s0, f02) == s2
    assert of(p2, "now", "d") == expected_feed(s2, s3)
    assert of(p0, "now", "e") == expected_feed(s0, s3)
    assert of(v1, v2, "f") == f12, "a lake version stands for the newest change it holds"
    assert of(p1, v2, "g") == f12


@pytest.fixture()
def busy_table(pg_conn, pg_dsn, table_name, lake_root, monkeypatch):
    """A loaded table with one export after its load, whose key 1 changed twice in that export."""
    monkeypatch.setenv("COLDHARBOR_PG_DSN", pg_dsn)
    pg_conn.execute(f"CREATE TABLE {table_name} (id bigint PRIMARY KEY, k text, v text, n numeric(12,2))")
    pg_conn.execute(f"INSERT INTO {table_name} SELECT g, 'k', 'v', g FROM generate_series(1, 10) g")
    before_registration = instant(pg_conn)
    pg_conn.execute("SELECT coldharbor.register_table(%s)", (table_name,))
    exported(pg_dsn, lake_root, table_name)
    loaded = instant(pg_conn)
    pg_conn.execute(f"UPDATE {table_name} SET v = 'first' WHERE id = 1")
    between = instant(pg_conn)
    pg_conn.execute(f"UPDATE {table_name} SET v = 'second' WHERE id = 1")
    exported(pg_dsn, lake_root, table_name)
    return {"before registration": before_registration, "loaded": loaded, "between": between,
            "exported": instant(pg_conn)}


# (window, target, what the one line says): each refused with exit 2 and nothing written
REFUSALS = [
    (("exported", "loaded"), "changes_x", "is not before --to"),
    (("before registration", "exported"), "changes_x", "--from: as-of {before registration} is before public."),
    (("loaded", "between"), "changes_x", "--to: as-of {between} cannot be answered exactly for public."),
    (("loaded", "99"), "changes_x", "does not exist; its newest is 1"),
    (("yesterday", "now"), "changes_x", "--from 'yesterday' is neither a lake version (a whole number from 0) nor "
                                        "an ISO-8601 time (e.g. 2026-11-22T06:00:00Z)"),
    (("loaded", "soon"), "changes_x", "--to 'soon' is not a lake version (a whole number from 0), an ISO-8601 "
                                      "time (e.g. 2026-11-22T06:00:00Z) or now"),
    (("\uff11", "now"), "changes_x", "--from '\uff11' is neither a lake version"),  # a fullwidth digit one
    (("loaded", "99999999999999999999999"), "changes_x", "does not exist; its newest is 1"),
    (("now", "now"), "changes_x", "--from cannot be now"),
    (("loaded", "now"), "adhoc_x", "a change feed writes a table named changes_<name>"),
    (("loaded", "now"), "changes_X; DROP TABLE y", "is not allowed: use lower-case letters"),
]


def test_a_window_that_cannot_be_answered_is_one_line_and_writes_nothing(
        spark, pg_conn, table_name, lake_root, busy_table, caplog, capsys):
    """All against one table (each case's own table would cost two exports)."""
    for window, target, refusal in REFUSALS:
        caplog.clear()
        points = [busy_table[p].isoformat() if p in busy_table else p for p in window]
        code = changes.main(["--table", table_name, "--from", points[0], "--to", points[1], "--target", target,
                             "--lake-root", lake_root])
        errors = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
        expected = refusal.format(**{p: busy_table[p].isoformat() for p in busy_table})
        assert code == 2 and len(errors) == 1 and expected in errors[0], (window, target, errors)
        assert "\n" not in errors[0] and "Traceback" not in caplog.text + capsys.readouterr().err, (window, target)
        assert pg_conn.execute("SELECT count(*) FROM pg_tables WHERE schemaname = 'reports' "
                               "AND tablename IN ('changes_x', 'adhoc_x')").fetchone()[0] == 0, (window, target)


def test_an_unknown_table_and_a_column_named_as_the_feed_s_own_are_refused(
        spark, pg_dsn, pg_conn, table_name, lake_root, monkeypatch, caplog):
    monkeypatch.setenv("COLDHARBOR_PG_DSN", pg_dsn)
    pg_conn.execute(f'CREATE TABLE {table_name} (id bigint PRIMARY KEY, "_Change_Type" text)')  # Spark: the same name
    pg_conn.execute("SELECT coldharbor.register_table(%s)", (table_name,))
    exported(pg_dsn, lake_root, table_name)
    for table, message in ((table_name, "has a column named _Change_Type"), ("t_no_such_table", "t_no_such_table")):
        caplog.clear()
        code = changes.main(["--table", table, "--from", "0", "--to", "now", "--target", "changes_y",
                             "--lake-root", lake_root])
        errors = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
        assert code == 2 and len(errors) == 1 and message in errors[0], errors
    assert pg_conn.execute("SELECT to_regclass('reports.changes_y')").fetchone()[0] is None


def test_the_job_runs_under_spark_submit(pg_dsn, pg_conn, table_name, lake_root, busy_table):
    from tests.helpers import spark_submit

    done = spark_submit("changes.py", pg_dsn, lake_root, "--table", table_name, "--from",
                        busy_table["loaded"].isoformat(), "--target", f"changes_{table_name}")
    assert done.returncode == 0, done.stdout[-3000:]
    assert (f"public.{table_name}: 2 change feed rows in reports.changes_{table_name} (0 insert, 0 delete, "
            "1 update_preimage, 1 update_postimage)") in done.stdout, done.stdout[-3000:]
    assert pg_conn.execute(f"SELECT _change_type, v FROM reports.changes_{table_name} ORDER BY 1").fetchall() == [
        ("update_postimage", "second"), ("update_preimage", "v")]


def test_a_window_holding_a_rebase_is_refused_and_the_windows_beside_it_are_exact(
        spark, pg_dsn, pg_conn, table_name, lake_root, monkeypatch, caplog):
    """ADD COLUMN with a default fills every row without a change; the base after it writes every
    key again. A feed across it listed some keys (those written in the window) and not others."""
    monkeypatch.setenv("COLDHARBOR_PG_DSN", pg_dsn)
    t = table_name
    pg_conn.execute(f"CREATE TABLE {t} (id bigint, k text, v text, n numeric(12,2), PRIMARY KEY (id, k))")
    pg_conn.execute(f"INSERT INTO {t} SELECT g, 'k', 'v', 0 FROM generate_series(1, 5) g")
    pg_conn.execute("SELECT coldharbor.register_table(%s)", (t,))
    exported(pg_dsn, lake_root, t)
    p0, s0 = instant(pg_conn), state(pg_conn, t)
    pg_conn.execute(f"UPDATE {t} SET v = 'tmp' WHERE id = 2")
    exported(pg_dsn, lake_root, t)
    p1, s1 = instant(pg_conn), state(pg_conn, t)
    pg_conn.execute(f"ALTER TABLE {t} ADD COLUMN d text DEFAULT 'filled'")
    pg_conn.execute(f"UPDATE {t} SET v = 'z' WHERE id = 3")
    exported(pg_dsn, lake_root, t)
    p2, s2 = instant(pg_conn), state(pg_conn, t)
    pg_conn.execute(f"UPDATE {t} SET v = 'after' WHERE id = 4")
    exported(pg_dsn, lake_root, t)
    p3, s3 = instant(pg_conn), state(pg_conn, t)

    for start, end in ((p0, p2), (p1, p3)):
        caplog.clear()
        assert changes.main(["--table", t, "--from", start.isoformat(), "--to", end.isoformat(), "--target",
                             "changes_across", "--lake-root", lake_root]) == 2
        [error] = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
        assert f"holds a rebase of public.{t} (" in error and "use windows that end before" in error, error
    assert pg_conn.execute("SELECT to_regclass('reports.changes_across')").fetchone()[0] is None

    def of(start, end, target):  # (id, k, v, n) of each row; column d aside
        return {(kind, *row[:4]) for kind, *row in
                pg_conn.execute(f"SELECT _change_type, id, k, v, n, d FROM reports.{target}").fetchall()} \
            if changes.main(["--table", t, "--from", start.isoformat(), "--to", end.isoformat(), "--target", target,
                             "--lake-root", lake_root]) == 0 else None

    assert of(p0, p1, f"changes_{t}_a") == {(kind, *map(_normal, row)) for kind, *row in
                                            expected_feed(s0, s1)}
    assert of(p2, p3, f"changes_{t}_b") == {(kind, *map(_normal, row)) for kind, *row in
                                            expected_feed(s2, s3)}


def test_a_double_changed_from_zero_to_minus_zero_is_a_change(spark, pg_dsn, pg_conn, table_name, lake_root,
                                                               monkeypatch):
    monkeypatch.setenv("COLDHARBOR_PG_DSN", pg_dsn)
    pg_conn.execute(f"CREATE TABLE {table_name} (id int PRIMARY KEY, x double precision)")
    pg_conn.execute(f"INSERT INTO {table_name} VALUES (1, 0.0), (2, 'NaN'), (3, 1.5)")
    pg_conn.execute("SELECT coldharbor.register_table(%s)", (table_name,))
    exported(pg_dsn, lake_root, table_name)
    start = instant(pg_conn)
    pg_conn.execute(f"UPDATE {table_name} SET x = '-0' WHERE id = 1")
    pg_conn.execute(f"UPDATE {table_name} SET x = 'NaN' WHERE id = 2")  # the same value written again
    assert changes.main(["--table", table_name, "--from", start.isoformat(), "--target", f"changes_{table_name}",
                         "--lake-root", lake_root]) == 0
    assert pg_conn.execute(f"SELECT _change_type, id, x::text FROM reports.changes_{table_name} "
                           "ORDER BY 1").fetchall() == [("update_postimage", 1, "-0"), ("update_preimage", 1, "0")]


def test_a_lake_root_without_the_table_s_lake_is_named_not_blamed_on_the_export(
        spark, pg_dsn, pg_conn, table_name, lake_root, busy_table, caplog, tmp_path):
    assert changes.main(["--table", table_name, "--from", busy_table["loaded"].isoformat(), "--target",
                         "changes_z", "--lake-root", str(tmp_path / "elsewhere")]) == 2
    [error] = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert "is missing, but changes of it were flushed there; the lake location is wrong" in error, error


def test_a_version_whose_files_were_vacuumed_is_refused_naming_times_instead(
        spark, pg_dsn, pg_conn, table_name, lake_root, busy_table, caplog):
    """The table rewritten whole (the same rows, as a compaction writes them), then its old files
    removed as VACUUM removes them."""
    from pathlib import Path

    path = Path(lake_root) / "public" / table_name
    rows = spark.read.format("delta").load(str(path))
    rows.localCheckpoint().write.format("delta").mode("overwrite").save(str(path))
    kept = {Path(f).name for f in spark.read.format("delta").load(str(path)).inputFiles()}
    for old in path.rglob("*.parquet"):
        if old.name not in kept and "_delta_log" not in old.parts:
            old.unlink()
    caplog.clear()
    assert changes.main(["--table", table_name, "--from", "0", "--to", "now", "--target", "changes_v",
                         "--lake-root", lake_root]) == 2
    [error] = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert "lake version 0 of public." in error and "can no longer be read (VACUUM removed its files); give the " \
        "window's point as a time" in error, error
    assert pg_conn.execute("SELECT to_regclass('reports.changes_v')").fetchone()[0] is None


def served(monkeypatch, pg_dsn, lake_root, sql: str, target: str, *args: str) -> int:
    from tests.helpers import serve_report

    return serve_report(monkeypatch, pg_dsn, lake_root, "--sql", sql, "--target", target, *args)


def test_a_report_reads_a_feed_with_changes_as_the_job_writes_it(spark, pg_dsn, pg_conn, table_name, lake_root,
                                                                  busy_table, monkeypatch):
    """`changes(table, from, to)` in a report's SQL: the same rows as jobs/changes.py, joinable with
    the table itself; its points literals or typed parameters; `now` in an as-of run is the as-of."""
    loaded, exported_at = busy_table["loaded"].isoformat(), busy_table["exported"].isoformat()
    pg_conn.execute(f"UPDATE {table_name} SET v = 'dirty' WHERE id IN (2, 3)")
    pg_conn.execute(f"DELETE FROM {table_name} WHERE id = 4")
    columns = "_change_type, id, k, v, n, _change_seq, _commit_timestamp"
    assert changes.main(["--table", table_name, "--from", loaded, "--to", "now", "--target", "changes_job",
                         "--lake-root", lake_root]) == 0
    job = set(pg_conn.execute(f"SELECT {columns} FROM reports.changes_job").fetchall())
    assert {r[0] for r in job} == {"update_preimage", "update_postimage", "delete"} and len(job) == 7

    sql = f"SELECT {columns} FROM changes({table_name}, '{loaded}', 'now')"
    assert served(monkeypatch, pg_dsn, lake_root, sql, "adhoc_feed") == 0
    assert set(pg_conn.execute(f"SELECT {columns} FROM reports.adhoc_feed").fetchall()) == job

    with_params = (f"-- param: since timestamp\n-- param: upto string = now\n"
                   f"SELECT c._change_type, c.id, c.v, t.v AS v_now FROM changes('public.{table_name}', :since, :upto) c "
                   f"LEFT JOIN {table_name} t ON t.id = c.id AND c._change_type <> 'update_preimage'")
    assert served(monkeypatch, pg_dsn, lake_root, with_params, "adhoc_joined", "--param", f"since={loaded}") == 0
    assert sorted(pg_conn.execute("SELECT * FROM reports.adhoc_joined").fetchall()) == [
        ("delete", 4, "v", None), ("update_postimage", 1, "second", "second"), ("update_postimage", 2, "dirty", "dirty"),
        ("update_postimage", 3, "dirty", "dirty"), ("update_preimage", 1, "v", None),
        ("update_preimage", 2, "v", None), ("update_preimage", 3, "v", None)]
    # As of the export's instant, `now` ends the window there: the dirty changes are not in it.
    assert served(monkeypatch, pg_dsn, lake_root, with_params, "adhoc_joined", "--param", f"since={loaded}",
                  "--as-of", exported_at) == 0
    assert sorted(r[:3] for r in pg_conn.execute("SELECT * FROM reports.adhoc_joined").fetchall()) == [
        ("update_postimage", 1, "second"), ("update_preimage", 1, "v")]


# (the report's SQL, what the one line says): each refused with exit 2, recorded, nothing written
FEED_REFUSALS = [
    ("SELECT * FROM changes({t}, '{exported}', '{loaded}')", "{t}'s changes() from ({exported}) is not before"),
    ("SELECT * FROM changes({t}, '{loaded}', '{between}')", "{t}'s changes() to: as-of {between} cannot be "
                                                            "answered exactly"),
    ("SELECT * FROM changes({t}, 'now', 'now')", "changes() from cannot be now"),
    ("SELECT * FROM changes({t}, 'yesterday', 'now')", "changes() from 'yesterday' is neither a lake version"),
    ("SELECT * FROM changes({t}, current_timestamp(), 'now')", "the from point of changes() is a string"),
    ("SELECT * FROM changes(t_no_such_table, 0, 'now')", "table t_no_such_table is not a registered table"),
    ("SELECT * FROM changes({t}, 0)", "changes() takes three arguments"),
    ("SELECT * FROM _ch_feed_0", "the prefix _ch_feed_ is reserved"),
    ("SELECT x FROM changes({t}, 0, 'now')", "the report does not run: [UNRESOLVED_COLUMN"),
]


def test_a_feed_a_report_cannot_read_is_refused_in_one_line(spark, pg_dsn, pg_conn, table_name, lake_root, busy_table,
                                                            monkeypatch, caplog):
    """All against one table (each case's own table would cost two exports)."""
    points = {p.split()[0]: busy_table[p].isoformat() for p in busy_table}
    for number, (sql, message) in enumerate(FEED_REFUSALS):
        caplog.clear()
        run_id = f"refused-{table_name}-{number}"
        code = served(monkeypatch, pg_dsn, lake_root, sql.format(t=table_name, **points), "adhoc_refused",
                      "--run-id", run_id)
        errors = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
        expected = message.format(t=f"public.{table_name}", **points)
        assert code == 2 and len(errors) == 1 and expected in errors[0], (sql, errors)
        assert "\n" not in errors[0] and "Traceback" not in caplog.text, sql
        assert pg_conn.execute("SELECT to_regclass('reports.adhoc_refused')").fetchone()[0] is None, sql
        assert report_run(pg_conn, run_id)["state"] == "failed", sql

"""Values the lake cannot hold exactly, written after registration (real PostgreSQL and Spark + Delta).

A date in 1582-10-05..14 went through the export's JDBC reader ten days on; NaN, +-infinity and
out-of-range timestamps failed the export with a Py4J traceback (failing every other table of the
run with it) or were written as another value; reports and verify failed with a psycopg DataError.
Now every path refuses such a row with one line naming table, column, value and key, writes and
marks nothing of that table, and carries on with the others; reports read a date of the gap exactly.
"""

from __future__ import annotations

import uuid

import pytest
from coldharbor.capture import registry
from coldharbor.export.table_export import ExportConfig, export_tables
from coldharbor.lake import delta
from coldharbor.maintenance import verify
from coldharbor.runtime import pg
from coldharbor.runtime.errors import UnrepresentableValueError

from tests.helpers import dirty_ids, export, lake_live, pg_rows, report_run, serve_report, spark_submit_export
from tests.integration.runtime.test_one_line_failures import one_error_line

PLAIN = "id integer PRIMARY KEY, d date, ts timestamp, tz timestamptz, n numeric(12,2), note text, tiny numeric(38,30)"
PLAIN_ROWS = ("INSERT INTO {t} SELECT g, date '2001-01-01' + g, timestamp '2001-01-01' + g * interval '1 h', "
              "timestamptz '2001-01-01 00:00+05' + g * interval '1 h', g / 8.0, 'it''s \"q\" ü ' || g, "
              "g * 1e-25 + 0.5 FROM generate_series(1, 40) g")  # scale beyond 18: a lost typmod rounds it
KEYED = "region text, day date, code numeric(10,2), v text, PRIMARY KEY (region, day, code)"
KEYED_ROWS = ("INSERT INTO {t} SELECT 'r ' || (g % 3) || ' ü', date '2020-01-01' + g, g / 4.0, 'v' || g "
              "FROM generate_series(1, 30) g")

# name: (table kind, the change after registration, column, value and key the refusal names, the fix)
CASES = {
    "gap-date-insert": ("plain", "INSERT INTO {t} VALUES (1000, '1582-10-10', now(), now(), 1, 'new')",
                        "d", "1582-10-10", "id=1000", "UPDATE {t} SET d = '1582-10-15' WHERE id = 1000"),
    "gap-timestamp-update": ("plain", "UPDATE {t} SET ts = '1582-10-05 00:00' WHERE id = 7",
                             "ts", "1582-10-05 00:00:00", "id=7", "UPDATE {t} SET ts = '2001-01-01' WHERE id = 7"),
    "gap-in-utc-update": ("plain", "UPDATE {t} SET tz = '1582-10-15 02:00+05' WHERE id = 8",
                          "tz", "1582-10-14 21:00:00+00", "id=8", "UPDATE {t} SET tz = '1582-10-15 12:00+00' WHERE id = 8"),
    "nan-numeric": ("plain", "UPDATE {t} SET n = 'NaN' WHERE id = 9",
                    "n", "NaN", "id=9", "UPDATE {t} SET n = -0.01 WHERE id = 9"),
    "infinity-timestamp": ("plain", "UPDATE {t} SET ts = 'infinity' WHERE id = 10",
                           "ts", "infinity", "id=10", "UPDATE {t} SET ts = '9999-12-31 23:59:59.999999' WHERE id = 10"),
    "minus-infinity-date": ("plain", "UPDATE {t} SET d = '-infinity' WHERE id = 11",
                            "d", "-infinity", "id=11", "UPDATE {t} SET d = '0001-01-01' WHERE id = 11"),
    "bc-date": ("plain", "UPDATE {t} SET d = '0044-03-15 BC' WHERE id = 12",
                "d", "0044-03-15 BC", "id=12", "UPDATE {t} SET d = NULL WHERE id = 12"),
    "year-10000-timestamp": ("plain", "UPDATE {t} SET ts = '10000-01-01 00:00' WHERE id = 13",
                             "ts", "10000-01-01 00:00:00", "id=13", "DELETE FROM {t} WHERE id = 13"),
    "year-10000-in-utc": ("plain", "UPDATE {t} SET tz = '9999-12-31 23:30-01' WHERE id = 14",
                          "tz", "10000-01-01 00:30:00+00", "id=14", "UPDATE {t} SET tz = now() WHERE id = 14"),
    "infinity-date-key": ("keyed", "INSERT INTO {t} VALUES ('north ü', 'infinity', 1, 'new')",
                          "day", "infinity", "region=north ü, day=infinity, code=1.00",
                          "UPDATE {t} SET day = '2030-01-01' WHERE day = 'infinity'"),
    "gap-date-key-update": ("keyed", "UPDATE {t} SET day = '1582-10-07' WHERE v = 'v5'",
                            "day", "1582-10-07", "region=r 2 ü, day=1582-10-07, code=1.25",
                            "UPDATE {t} SET day = '1582-10-17' WHERE v = 'v5'"),
    "nan-numeric-key": ("keyed", "INSERT INTO {t} VALUES ('south', '2020-01-01', 'NaN', 'new')",
                        "code", "NaN", "region=south, day=2020-01-01, code=NaN",
                        "DELETE FROM {t} WHERE code = 'NaN'"),
    # Spark writes an empty partition value as NULL: the key would come back as (NULL, ...).
    "empty-partition-key": ("partitioned", "INSERT INTO {t} VALUES ('', '2020-01-01', 1, 'new')",
                            "region", "", "region=, day=2020-01-01, code=1.00",
                            "UPDATE {t} SET region = ' ' WHERE region = ''"),
    "empty-partition-key-update": ("partitioned", "UPDATE {t} SET region = '' WHERE v = 'v5'",
                                   "region", "", "region=, day=2020-01-06, code=1.25",
                                   "DELETE FROM {t} WHERE region = ''"),
}
KEYS = {"plain": ["id"], "keyed": ["region", "day", "code"], "partitioned": ["region", "day", "code"]}


def new_table(conn, kind: str) -> str:
    """A table of the kind holding rows at its registration (partitioned: keyed, partitioned by region
    in the lake)."""
    name = f"t_{uuid.uuid4().hex[:10]}"
    conn.execute(f"CREATE TABLE {name} ({PLAIN if kind == 'plain' else KEYED})")
    conn.execute((PLAIN_ROWS if kind == "plain" else KEYED_ROWS).format(t=name))
    if kind == "partitioned":
        conn.execute("SELECT coldharbor.register_table(%s, p_partition_by => %s)", (name, ["region"]))
    else:
        conn.execute("SELECT coldharbor.register_table(%s)", (name,))
    return name


def refusal_of(name: str, column: str, value: str, key: str) -> str:
    return f"public.{name}: column {column} holds {value!r} (row {key}), which the lake cannot hold exactly"


def export_all(spark, dsn: str, lake_root: str, names: list[str]) -> dict:
    with pg.connect(dsn) as conn:
        tables = [t for t in registry.load(conn) if t.table_name in names]
        results = export_tables(spark, conn, pg.JdbcTarget.from_dsn(dsn), ExportConfig(None, lake_root, "values"), tables,
                      lambda point: None)
    return {r.table.removeprefix("public."): r for r in results}


def test_a_value_the_lake_cannot_hold_refuses_its_table_alone_until_it_is_changed(spark, pg_dsn, pg_conn, lake_root):
    good = new_table(pg_conn, "plain")
    names = {case: new_table(pg_conn, kind) for case, (kind, *_) in CASES.items()}
    assert {r.status for r in export_all(spark, pg_dsn, lake_root, [good, *names.values()]).values()} == {"loaded"}
    pg_conn.execute(f"UPDATE {good} SET note = 'changed', d = '1582-10-04' WHERE id <= 5")
    for case, name in names.items():
        pg_conn.execute(CASES[case][1].format(t=name))
    dirty = {name: dirty_ids(pg_conn, name) for name in names.values()}
    versions = {name: delta.pin_version(spark, f"{lake_root}/public/{name}") for name in names.values()}

    results = export_all(spark, pg_dsn, lake_root, [good, *names.values()])

    assert results[good].status == "exported" and results[good].rows == 5
    assert lake_live(spark, lake_root, good, ["id"]) == pg_rows(pg_conn, f"SELECT * FROM {good}", ["id"])
    for case, name in names.items():
        _, _, column, value, key, _ = CASES[case]
        assert results[name].status == "failed", (case, results[name])
        assert results[name].error.startswith(refusal_of(name, column, value, key)), (case, results[name].error)
        assert "\n" not in results[name].error
        assert dirty_ids(pg_conn, name) == dirty[name], case  # nothing marked flushed
        assert delta.pin_version(spark, f"{lake_root}/public/{name}") == versions[name], case  # nothing written

    for case, name in names.items():
        pg_conn.execute(CASES[case][5].format(t=name))
    results = export_all(spark, pg_dsn, lake_root, list(names.values()))
    for case, name in names.items():
        assert results[name].status == "exported", (case, results[name])
        keys = KEYS[CASES[case][0]]
        assert lake_live(spark, lake_root, name, keys) == pg_rows(pg_conn, f"SELECT * FROM {name}", keys), case
        assert dirty_ids(pg_conn, name) == [], case


def test_the_export_job_refuses_such_a_value_in_one_line_and_exit_2(spark, pg_dsn, pg_conn, lake_root):
    """As production runs it: a NaN was a Py4J traceback out of the JDBC reader."""
    name = new_table(pg_conn, "keyed")
    export(spark, pg_dsn, name, lake_root)
    pg_conn.execute(CASES["nan-numeric-key"][1].format(t=name))
    version = delta.pin_version(spark, f"{lake_root}/public/{name}")
    done = spark_submit_export(pg_dsn, lake_root, "--table", name)
    assert done.returncode == 2, done.stdout[-3000:]
    assert refusal_of(name, "code", "NaN", "region=south, day=2020-01-01, code=NaN") in one_error_line(done.stdout)
    assert delta.pin_version(spark, f"{lake_root}/public/{name}") == version and len(dirty_ids(pg_conn, name)) == 1


@pytest.mark.parametrize("case", ["nan-numeric", "infinity-timestamp", "bc-date", "year-10000-in-utc",
                                  "infinity-date-key", "empty-partition-key"])
def test_a_report_over_such_a_dirty_value_is_refused_in_one_line(spark, pg_dsn, pg_conn, lake_root, monkeypatch,
                                                                  caplog, case):
    kind, change, column, value, key, _ = CASES[case]
    name = new_table(pg_conn, kind)
    export(spark, pg_dsn, name, lake_root)
    pg_conn.execute(change.format(t=name))
    run_id = f"values-{name}"
    assert serve_report(monkeypatch, pg_dsn, lake_root, "--sql", f"SELECT count(*) AS n FROM {name}",
                        "--target", f"adhoc_{name}", "--run-id", run_id) == 2
    assert refusal_of(name, column, value, key) in report_run(pg_conn, run_id)["error"]
    assert "Traceback" not in caplog.text and "report was not run" in caplog.text
    assert pg_conn.execute("SELECT to_regclass(%s)", (f"reports.adhoc_{name}",)).fetchone()[0] is None


def test_a_report_reads_gap_dates_and_keys_left_behind_exactly(spark, pg_dsn, pg_conn, lake_root, monkeypatch):
    """psycopg reads a date of 1582-10-05..14 exactly: a report serves it from the hot tier while the
    export refuses it. A key the lake cannot hold that was changed away is no dirty key."""
    plain, keyed = new_table(pg_conn, "plain"), new_table(pg_conn, "keyed")
    export(spark, pg_dsn, plain, lake_root)
    export(spark, pg_dsn, keyed, lake_root)
    pg_conn.execute(CASES["gap-date-insert"][1].format(t=plain))
    pg_conn.execute(CASES["infinity-date-key"][1].format(t=keyed))
    pg_conn.execute(CASES["infinity-date-key"][5].format(t=keyed))
    assert serve_report(monkeypatch, pg_dsn, lake_root, "--sql", f"SELECT id, cast(d AS string) AS d FROM {plain} "
                        "WHERE d < DATE'1600-01-01'", "--target", f"adhoc_{plain}") == 0
    assert pg_conn.execute(f"SELECT * FROM reports.adhoc_{plain}").fetchall() == [(1000, "1582-10-10")]
    assert serve_report(monkeypatch, pg_dsn, lake_root, "--sql", f"SELECT region, day, code, v FROM {keyed}",
                        "--target", f"adhoc_{keyed}") == 0
    keys = KEYS["keyed"]
    assert pg_rows(pg_conn, f"SELECT * FROM reports.adhoc_{keyed}", keys) == \
        pg_rows(pg_conn, f"SELECT * FROM {keyed}", keys)


def test_a_report_over_a_table_whose_load_is_refused_is_refused_too(spark, pg_dsn, pg_conn, lake_root, monkeypatch):
    """Until its load lands a table is read whole from PostgreSQL: the same check applies."""
    name = f"t_{uuid.uuid4().hex[:10]}"
    pg_conn.execute(f"CREATE TABLE {name} ({PLAIN})")
    pg_conn.execute(PLAIN_ROWS.format(t=name))
    pg_conn.execute(f"UPDATE {name} SET ts = '-infinity' WHERE id = 3")
    pg_conn.execute("SELECT coldharbor.register_table(%s)", (name,))
    with pytest.raises(UnrepresentableValueError, match="nothing of the table was written"):
        export(spark, pg_dsn, name, lake_root)
    run_id = f"values-load-{name}"
    assert serve_report(monkeypatch, pg_dsn, lake_root, "--sql", f"SELECT count(*) AS n FROM {name}",
                        "--target", f"adhoc_{name}", "--run-id", run_id) == 2
    assert refusal_of(name, "ts", "-infinity", "id=3") in report_run(pg_conn, run_id)["error"]


def test_a_partitioned_table_registered_with_an_empty_partition_value_is_loaded_once_it_is_changed(
        spark, pg_dsn, pg_conn, lake_root):
    """An empty text partition value: the initial load is refused in one line (nothing written), a
    character(n) partition value of spaces is held as it is, and once the value is changed the load
    lands and reads back exactly."""
    name = f"t_{uuid.uuid4().hex[:10]}"
    pg_conn.execute(f"CREATE TABLE {name} (region varchar(10), shelf character(3), id int, v text, "
                    "PRIMARY KEY (region, shelf, id))")
    pg_conn.execute(f"INSERT INTO {name} VALUES ('north', '', 1, 'a'), ('', 'b', 2, 'b'), ('o''brien', 'c', 3, 'c')")
    pg_conn.execute("SELECT coldharbor.register_table(%s, p_partition_by => %s)", (name, ["region", "shelf"]))
    with pytest.raises(UnrepresentableValueError, match="nothing of the table was written") as refused:
        export(spark, pg_dsn, name, lake_root)
    assert str(refused.value).startswith(refusal_of(name, "region", "", "region=, shelf=b, id=2"))
    assert "a partition value must be non-empty text other than __HIVE_DEFAULT_PARTITION__" in str(refused.value)
    assert delta.pin_version(spark, f"{lake_root}/public/{name}") is None
    pg_conn.execute(f"UPDATE {name} SET region = 'south' WHERE id = 2")
    assert export(spark, pg_dsn, name, lake_root).status in {"loaded", "exported"}  # the load, then the change
    keys = ["region", "shelf", "id"]
    assert lake_live(spark, lake_root, name, keys) == pg_rows(pg_conn, f"SELECT * FROM {name}", keys)


@pytest.mark.parametrize("ddl, rows, column, value, key", [
    # Spark's partition writer reads the folder name back: this text is its name for NULL.
    ("region text", "('north', 1), ('__HIVE_DEFAULT_PARTITION__', 2)", "region", "__HIVE_DEFAULT_PARTITION__",
     "region=__HIVE_DEFAULT_PARTITION__, id=2"),
    # Bytes become a string by UTF-8: '' is then NULL, and \xff and \xfe both U+FFFD (one lake key).
    ("k bytea", "('abc'::bytea, 1), ('\\x'::bytea, 2)", "k", "\\x", "k=\\x, id=2"),
    ("k bytea", "('abc'::bytea, 1), ('\\xff'::bytea, 3)", "k", "\\xff", "k=\\xff, id=3"),
])
def test_a_partition_value_spark_does_not_write_back_is_refused_by_the_load(spark, pg_dsn, pg_conn, lake_root,
                                                                            ddl, rows, column, value, key):
    """Found by an outside attack on the empty-text check: other values the partition writer changes."""
    name = f"t_{uuid.uuid4().hex[:10]}"
    pg_conn.execute(f"CREATE TABLE {name} ({ddl}, id int, PRIMARY KEY ({ddl.split()[0]}, id))")
    pg_conn.execute(f"INSERT INTO {name} VALUES {rows}")
    pg_conn.execute("SELECT coldharbor.register_table(%s, p_partition_by => %s)", (name, [column]))
    with pytest.raises(UnrepresentableValueError) as refused:
        export(spark, pg_dsn, name, lake_root)
    assert str(refused.value).startswith(refusal_of(name, column, value, key))
    assert delta.pin_version(spark, f"{lake_root}/public/{name}") is None
    pg_conn.execute(f"DELETE FROM {name} WHERE id > 1")  # what is left (printable, non-empty) is held
    assert export(spark, pg_dsn, name, lake_root).status in {"loaded", "exported"}
    keys = [column, "id"]
    assert lake_live(spark, lake_root, name, keys) == pg_rows(pg_conn, f"SELECT * FROM {name}", keys)


def test_verify_names_a_date_the_lake_holds_ten_days_on(spark, pg_dsn, pg_conn, lake_root, monkeypatch, caplog):
    """What an export through the JDBC reader left before such dates were refused: the lake holds
    1582-10-20 where PostgreSQL holds 1582-10-10, with nothing dirty. Verify read PostgreSQL through
    the same reader, which moves the date the same way, and said in sync."""
    name = new_table(pg_conn, "plain")
    pg_conn.execute(f"UPDATE {name} SET d = '1582-10-20' WHERE id = 4")
    export(spark, pg_dsn, name, lake_root)
    with pg_conn.transaction():
        pg_conn.execute("SET LOCAL session_replication_role = replica")  # as the lake holds it: nothing dirty
        pg_conn.execute(f"UPDATE {name} SET d = '1582-10-10' WHERE id = 4")
    assert dirty_ids(pg_conn, name) == []
    monkeypatch.setenv("COLDHARBOR_PG_DSN", pg_dsn)
    assert verify.main(["--table", name, "--lake-root", lake_root]) == 2
    assert refusal_of(name, "d", "1582-10-10", "id=4") in caplog.text and "cannot be verified" in caplog.text


def test_verify_of_a_table_with_such_a_dirty_value_is_one_line_and_exit_2(spark, pg_dsn, pg_conn, lake_root,
                                                                         monkeypatch, caplog):
    name = new_table(pg_conn, "plain")
    export(spark, pg_dsn, name, lake_root)
    pg_conn.execute(CASES["infinity-timestamp"][1].format(t=name))
    monkeypatch.setenv("COLDHARBOR_PG_DSN", pg_dsn)
    assert verify.main(["--table", name, "--lake-root", lake_root]) == 2
    assert refusal_of(name, "ts", "infinity", "id=10") in caplog.text and "Traceback" not in caplog.text

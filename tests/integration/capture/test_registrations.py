"""Registering again (issue 18's second attack): a table dropped and created with another key type,
a registration removed and made anew over an existing lake folder, domain columns, inheritance
children, and the names jobs are given. Real PostgreSQL and Spark + Delta; every table holds rows
before it is registered."""

from __future__ import annotations

import logging
import os
import uuid
from uuid import UUID

import psycopg
import pytest
from coldharbor.capture import registry
from coldharbor.export import export_job as export_job
from coldharbor.lake import delta, writes
from coldharbor.maintenance import cleanup as cleanup_job
from coldharbor.maintenance import compaction, purge, resync, verify
from delta.tables import DeltaTable
from pyspark.sql import functions as F

from tests.helpers import lake_live, pg_rows, report_run, serve_report, spark_submit_export

HOSTILE = ' "q\'s" <b>ü'  # quotes of each kind, spaces, HTML and a non-ASCII letter


def quoted(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def report_equals_postgres(monkeypatch, conn, dsn: str, lake_root: str, name: str, keys: list[str]) -> dict:
    """`SELECT *` of public.<name> served as a report, row for row against PostgreSQL; the run's record."""
    run_id = f"r{uuid.uuid4().hex[:10]}"
    assert serve_report(monkeypatch, dsn, lake_root, "--sql", f"SELECT * FROM public.`{name}`",
                        "--target", f"adhoc_{run_id}", "--run-id", run_id) == 0, report_run(conn, run_id)
    assert pg_rows(conn, f"SELECT * FROM reports.adhoc_{run_id}", keys) == uuids_as_text(pg_rows(
        conn, f"SELECT * FROM public.{quoted(name)}", keys))
    return report_run(conn, run_id)


def uuids_as_text(rows: dict) -> dict:
    """PostgreSQL's rows as the lake (and so a report) holds them: a uuid as its canonical text."""
    def text(value):
        return str(value) if isinstance(value, UUID) else value

    return {tuple(map(text, key)): {c: text(v) for c, v in row.items()} for key, row in rows.items()}


def errors(caplog) -> list[str]:
    assert "Traceback" not in caplog.text
    return [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]


# (old table, its rows, new table, its rows, key columns of the new table)
REPLACED = [
    ("id bigint PRIMARY KEY, v text", "SELECT g, 'old' FROM generate_series(1, 300) g",
     "id text PRIMARY KEY, v text", "SELECT 'k-' || g || ' ''q'' <i>ü', 'new' FROM generate_series(1, 250) g", ["id"]),
    ("id text PRIMARY KEY, v text", "SELECT 'k' || g, 'old' FROM generate_series(1, 300) g",
     "id bigint PRIMARY KEY, v text", "SELECT g, 'new' FROM generate_series(100, 400) g", ["id"]),
    ("id bigint PRIMARY KEY, v text", "SELECT g, 'old' FROM generate_series(1, 300) g",
     "u uuid, n integer, v text, PRIMARY KEY (u, n)",
     "SELECT md5(g::text)::uuid, g % 3, 'new' FROM generate_series(1, 200) g", ["u", "n"]),
    ("id bigint PRIMARY KEY, v text", "SELECT g, 'old' FROM generate_series(1, 300) g",
     "id bigint, k2 integer, v text, PRIMARY KEY (id, k2)", "SELECT g, 1, 'new' FROM generate_series(1, 250) g",
     ["id", "k2"]),
    ("id bigint PRIMARY KEY, v text", "SELECT g, 'old' FROM generate_series(1, 300) g",
     "id bigint PRIMARY KEY, v text", "SELECT g, 'new' FROM generate_series(150, 500) g", ["id"]),
]


@pytest.mark.parametrize("old_ddl, old_rows, new_ddl, new_rows, keys", REPLACED,
                         ids=["bigint to text", "text to bigint", "bigint to uuid and integer", "a key column added",
                              "same key type"])
def test_a_table_created_again_with_another_key_registered_again_and_resynced_is_exact(
        spark, pg_dsn, pg_conn, table_name, lake_root, monkeypatch, caplog, old_ddl, old_rows, new_ddl, new_rows,
        keys):
    """The old relation's changes (flushed in several batches, some still dirty) must not be taken
    for changes of the new one: not by reports, verify or the export, whatever the key types. The
    new relation's base replaces the lake's rows: before, another key type was refused by every
    export and resync until the lake table was moved aside by hand, and a key column added was a
    traceback (the old rows have no such column)."""
    name = table_name + HOSTILE
    t = f"public.{quoted(name)}"
    pg_conn.execute(f"CREATE TABLE {t} ({old_ddl})")
    pg_conn.execute(f"INSERT INTO {t} {old_rows}")
    pg_conn.execute("SELECT coldharbor.register_table(%s)", (t,))
    monkeypatch.setenv("COLDHARBOR_PG_DSN", pg_dsn)
    for step in range(3):  # the load, then batches of changes: lake versions 0..2 in the change log
        if step:
            pg_conn.execute(f"UPDATE {t} SET v = 'changed {step}' WHERE v <> 'x' AND random() < 0.3")
        assert export_job.main(["--table", f"public.{name}", "--lake-root", lake_root]) == 0
    before_the_drop = pg_conn.execute("SELECT clock_timestamp()").fetchone()[0]
    pg_conn.execute(f"UPDATE {t} SET v = 'dirty at the drop' WHERE random() < 0.2")
    path = f"{lake_root}/public/{name}"

    pg_conn.execute(f"DROP TABLE {t}")
    pg_conn.execute(f"CREATE TABLE {t} ({new_ddl})")
    pg_conn.execute(f"INSERT INTO {t} {new_rows}")
    pg_conn.execute("SELECT coldharbor.register_table(%s)", (t,))
    assert export_job.main(["--table", f"public.{name}", "--lake-root", lake_root]) == 0, errors(caplog)
    assert sorted(lake_live(spark, lake_root, f"public.{name}", keys)) == sorted(uuids_as_text(pg_rows(
        pg_conn, f"SELECT * FROM {t}", keys)))  # the old table's keys are gone, whatever their type
    stats = spark.sql(f"DESCRIBE DETAIL {delta.path_literal(path)}").first()["properties"][writes.STATS_COLUMNS_PROPERTY]
    assert stats.startswith(",".join(f"`{k}`" for k in keys) + ",`_ch_seq`"), stats  # the new key's statistics
    # a base that replaced the old table's rows starts as-of history; one beside them answers before it
    run = f"a{uuid.uuid4().hex[:10]}"
    replaced = new_ddl != old_ddl
    assert serve_report(monkeypatch, pg_dsn, lake_root, "--sql", f"SELECT * FROM public.`{name}`", "--target",
                        f"adhoc_{run}", "--run-id", run, "--as-of", before_the_drop.isoformat()) == (
        2 if replaced else 0), report_run(pg_conn, run)
    assert not replaced or "and the lake knows nothing earlier" in report_run(pg_conn, run)["error"]
    caplog.clear()

    record = report_equals_postgres(monkeypatch, pg_conn, pg_dsn, lake_root, name, keys)
    assert record["dirty_rows"] == {f"public.{name}": 0} and not record["served_from_postgres"]
    assert verify.main(["--table", f"public.{name}", "--lake-root", lake_root]) == 0, errors(caplog)
    pg_conn.execute(f"UPDATE {t} SET v = 'after' WHERE v = 'new' AND random() < 0.5")
    assert export_job.main(["--table", f"public.{name}", "--lake-root", lake_root]) == 0, errors(caplog)
    live = lake_live(spark, lake_root, f"public.{name}", keys)
    assert {k: r["v"] for k, r in live.items()} == {k: r["v"] for k, r in uuids_as_text(pg_rows(
        pg_conn, f"SELECT * FROM {t}", keys)).items()}
    assert verify.main(["--table", f"public.{name}", "--lake-root", lake_root]) == 0, errors(caplog)
    assert not errors(caplog)


def loaded_table(conn, dsn: str, lake_root: str, monkeypatch, t: str, ddl: str, rows: str,
                 registration: str = "") -> None:
    """Table `t` of columns `ddl` holding `rows`, registered (with `registration`'s further arguments)
    and loaded by an export, which the rest of the test runs with `dsn`."""
    conn.execute(f"CREATE TABLE {t} ({ddl})")
    conn.execute(f"INSERT INTO {t} {rows}")
    conn.execute(f"SELECT coldharbor.register_table(%s{registration})", (t,))
    monkeypatch.setenv("COLDHARBOR_PG_DSN", dsn)
    assert export_job.main(["--table", t, "--lake-root", lake_root]) == 0


def tiered_with_evicted_rows(conn, dsn: str, lake_root: str, monkeypatch, t: str, ddl: str, rows: str,
                             evicted: str, evicted_count: int) -> int:
    """Table `t` holding `rows`, registered with a hot retention of 30 days and loaded, then holding
    `evicted` too, exported and evicted (their changes made 40 days old); returns its table_id."""
    loaded_table(conn, dsn, lake_root, monkeypatch, t, ddl, rows, ", p_hot_retention => interval '30 days'")
    conn.execute(f"INSERT INTO {t} {evicted}")
    assert export_job.main(["--table", t, "--lake-root", lake_root]) == 0
    [table_id] = conn.execute("SELECT table_id FROM coldharbor.tables WHERE table_name = %s", (t,)).fetchone()
    conn.execute("""UPDATE coldharbor.change_log SET created_at = created_at - interval '40 days',
                           flushed_at = flushed_at - interval '40 days' WHERE table_id = %s""", (table_id,))
    assert conn.execute("SELECT coldharbor.evict(%s, now() - interval '30 days')",
                        (table_id,)).fetchone()[0] == evicted_count
    return table_id


@pytest.mark.parametrize("key_type, key", [("bigint", "g"), ("text", "g::text")], ids=["same key type", "text key"])
def test_a_tiered_table_created_again_and_registered_again_loses_the_old_tables_keys(
        spark, pg_dsn, pg_conn, table_name, lake_root, monkeypatch, key_type, key):
    """A tiered table's base leaves keys only the lake holds as they are (they may be evicted); the
    keys of a table dropped before, evicted ones too, are not rows of the new one."""
    t = table_name
    tiered_with_evicted_rows(pg_conn, pg_dsn, lake_root, monkeypatch, t, "id bigint PRIMARY KEY, v text",
                             "SELECT g, 'old' FROM generate_series(1, 200) g",
                             "SELECT g, 'evicted' FROM generate_series(201, 230) g", 30)
    pg_conn.execute(f"DROP TABLE {t}")
    pg_conn.execute(f"CREATE TABLE {t} (id {key_type} PRIMARY KEY, v text)")
    pg_conn.execute(f"INSERT INTO {t} SELECT {key}, 'new' FROM generate_series(150, 260) g")
    pg_conn.execute("SELECT coldharbor.register_table(%s, p_hot_retention => interval '30 days')", (t,))
    assert export_job.main(["--table", t, "--lake-root", lake_root]) == 0
    assert sorted(lake_live(spark, lake_root, t, ["id"])) == sorted(
        (i if key_type == "bigint" else str(i),) for i in range(150, 261))
    report_equals_postgres(monkeypatch, pg_conn, pg_dsn, lake_root, t, ["id"])
    assert verify.main(["--table", t, "--lake-root", lake_root]) == 0


@pytest.mark.parametrize("rows", [400, 0], ids=["registered with rows", "registered empty"])
def test_a_registration_made_anew_over_an_existing_lake_folder_is_refused_until_it_is_moved(
        spark, pg_dsn, pg_conn, table_name, lake_root, monkeypatch, caplog, rows):
    """Its row removed from coldharbor.tables, the table registered again gets a new table id; the
    lake folder still holds the old registration's rows, batch ids and sequences, which would win
    over the new load. Nothing is written there, reports serve PostgreSQL, and once the folder is
    moved aside the next export writes the table whole."""
    name = table_name + HOSTILE
    t = f"public.{quoted(name)}"
    pg_conn.execute(f"CREATE TABLE {t} (id bigint PRIMARY KEY, v text)")
    pg_conn.execute(f"INSERT INTO {t} SELECT g, 'old' FROM generate_series(1, 400) g")
    pg_conn.execute("SELECT coldharbor.register_table(%s)", (t,))
    monkeypatch.setenv("COLDHARBOR_PG_DSN", pg_dsn)
    args = ["--table", f"public.{name}", "--lake-root", lake_root]
    assert export_job.main(args) == 0
    pg_conn.execute(f"UPDATE {t} SET v = 'old 2' WHERE id <= 100")
    assert export_job.main(args) == 0
    path = f"{lake_root}/public/{name}"
    version = delta.pin_version(spark, path)

    [old] = registry.load(pg_conn, f"public.{name}")
    pg_conn.execute("DELETE FROM coldharbor.change_log WHERE table_id = %s", (old.table_id,))
    pg_conn.execute("DELETE FROM coldharbor.tables WHERE table_id = %s", (old.table_id,))
    pg_conn.execute(f"DELETE FROM {t} WHERE id > %s", (rows,))
    pg_conn.execute("SELECT coldharbor.register_table(%s)", (t,))
    pg_conn.execute(f"UPDATE {t} SET v = 'new' WHERE id % 3 = 0")
    pg_conn.execute(f"INSERT INTO {t} SELECT g, 'new' FROM generate_series(1000, 1010) g")

    caplog.clear()
    assert export_job.main(args) == 2
    [line] = errors(caplog)
    assert f"the lake folder {path} holds a Delta table that this registration of {t} did not write" in line
    assert "move that folder aside" in line
    assert delta.pin_version(spark, path) == version  # nothing written
    caplog.clear()
    assert verify.main(args) == 2  # the folder is the cause, not a load still to land (an attack found)
    [line] = errors(caplog)
    assert f"the lake folder {path} holds a Delta table that this registration of {t} did not write" in line
    caplog.clear()
    record = report_equals_postgres(monkeypatch, pg_conn, pg_dsn, lake_root, name, ["id"])
    assert record["served_from_postgres"] == [f"public.{name}"]

    os.rename(path, path + ".old")
    assert export_job.main(args) == 0
    report_equals_postgres(monkeypatch, pg_conn, pg_dsn, lake_root, name, ["id"])
    assert verify.main(args) == 0, errors(caplog)


def test_a_domain_column_added_after_registration_is_exported_like_its_base_type(
        spark, pg_dsn, pg_conn, table_name, lake_root, monkeypatch, caplog):
    t = table_name
    d = f"d_{uuid.uuid4().hex[:8]}"
    pg_conn.execute(f"CREATE DOMAIN {d}_code AS varchar(12) CHECK (VALUE <> '')")
    pg_conn.execute(f"CREATE DOMAIN {d}_money AS numeric(12,2) CHECK (VALUE >= 0)")
    pg_conn.execute(f"CREATE DOMAIN {d}_price AS {d}_money")  # a domain over a domain
    pg_conn.execute(f"CREATE TABLE {t} (code {d}_code PRIMARY KEY, amount {d}_money, at timestamptz)")
    pg_conn.execute(f"INSERT INTO {t} SELECT 'c''' || g, g * 0.25, '2026-01-01'::timestamptz + g * interval '1 h' "
                    "FROM generate_series(1, 300) g")
    pg_conn.execute("SELECT coldharbor.register_table(%s)", (t,))
    monkeypatch.setenv("COLDHARBOR_PG_DSN", pg_dsn)
    args = ["--table", t, "--lake-root", lake_root]
    assert export_job.main(args) == 0, errors(caplog)

    pg_conn.execute(f"ALTER TABLE {t} ADD COLUMN price {d}_price DEFAULT 9.99")
    pg_conn.execute(f"UPDATE {t} SET price = 1.5, amount = 0 WHERE code = 'c''7'")
    caplog.clear()
    caplog.set_level(logging.INFO, logger="coldharbor.serve.hot_snapshot")
    report_equals_postgres(monkeypatch, pg_conn, pg_dsn, lake_root, t, ["code"])  # from PostgreSQL, saying why
    # A domain with a CHECK constraint makes the ADD COLUMN ... DEFAULT rewrite the table.
    assert f"public.{t}: the new base of a rebase (ALTER TABLE rewrote public.{t} " in caplog.text
    assert export_job.main(args) == 0, errors(caplog)
    report_equals_postgres(monkeypatch, pg_conn, pg_dsn, lake_root, t, ["code"])
    assert verify.main(args) == 0, errors(caplog)
    schema = spark.read.format("delta").load(f"{lake_root}/public/{t}").schema
    assert [(f.name, f.dataType.simpleString()) for f in schema if not f.name.startswith("_ch_")] == [
        ("code", "string"), ("amount", "decimal(12,2)"), ("at", "timestamp"), ("price", "decimal(12,2)")]


def test_a_domain_over_a_type_the_lake_cannot_hold_is_refused_naming_both(pg_conn, table_name):
    d = f"d_{uuid.uuid4().hex[:8]}"
    pg_conn.execute(f"CREATE DOMAIN {d} AS inet")
    pg_conn.execute(f"CREATE TABLE {table_name} (id bigint PRIMARY KEY, addr {d})")
    with pytest.raises(psycopg.errors.FeatureNotSupported) as refused:
        pg_conn.execute("SELECT coldharbor.register_table(%s)", (table_name,))
    assert refused.value.diag.message_primary == (
        f"column addr of table public.{table_name} has type public.{d} (a domain over inet), which does not "
        "round-trip to the lake")


def test_a_table_with_inheritance_children_is_refused_at_registration(pg_conn, table_name):
    t = table_name
    pg_conn.execute(f"CREATE TABLE {t} (id bigint PRIMARY KEY, v text)")
    pg_conn.execute(f'CREATE TABLE "{t} child" (extra text) INHERITS ({t})')
    pg_conn.execute(f"INSERT INTO {t} VALUES (1, 'a')")
    with pytest.raises(psycopg.errors.WrongObjectType) as refused:
        pg_conn.execute("SELECT coldharbor.register_table(%s)", (t,))
    assert refused.value.diag.message_primary == (
        f'cannot register public.{t}: it has inheritance children (public."{t} child"), whose rows a read of it '
        "includes but whose writes its capture does not see")
    assert pg_conn.execute("SELECT count(*) FROM coldharbor.tables WHERE table_name = %s", (t,)).fetchone()[0] == 0


@pytest.mark.parametrize("main", [export_job.main, verify.main, resync.main, compaction.main, cleanup_job.main],
                         ids=["cdc_export", "verify", "resync", "compact", "cleanup"])
def test_an_empty_table_name_says_so(pg_dsn, lake_root, monkeypatch, caplog, main):
    monkeypatch.setenv("COLDHARBOR_PG_DSN", pg_dsn)
    assert main(["--table", "", "--lake-root", lake_root]) == 2
    [line] = errors(caplog)
    assert line.endswith(" failed: the table name is empty: name a registered table as schema.table"), line


@pytest.mark.parametrize("main", [export_job.main, verify.main, resync.main, compaction.main, cleanup_job.main],
                         ids=["cdc_export", "verify", "resync", "compact", "cleanup"])
@pytest.mark.parametrize("spelling", ['public."t_unbalanced', '"public.t_unbalanced"x', 'public.t"""'])
def test_a_name_whose_quotes_do_not_make_an_sql_name_says_so(pg_dsn, lake_root, monkeypatch, caplog, main, spelling):
    monkeypatch.setenv("COLDHARBOR_PG_DSN", pg_dsn)
    assert main(["--table", spelling, "--lake-root", lake_root]) == 2
    [line] = errors(caplog)
    assert line.endswith(f" failed: table {spelling} is not registered with coldharbor, and its double quotes do "
                         'not make an SQL name: write app."Weird Tbl" (a quote inside doubled) or app.Weird Tbl'), line


def test_every_job_takes_the_name_as_its_messages_print_it(spark, pg_dsn, pg_conn, lake_root, monkeypatch, caplog,
                                                          capsys):
    """`app."Weird Tbl"` (how the jobs' messages and SQL write it) and `app.Weird Tbl` name one table;
    verify's samples show key values as SQL writes them, not as Python reprs."""
    schema = f"App_{uuid.uuid4().hex[:6]}"
    name = "Weird Tbl " + HOSTILE
    t = f"{quoted(schema)}.{quoted(name)}"
    pg_conn.execute(f"CREATE SCHEMA {quoted(schema)}")
    pg_conn.execute(f"CREATE TABLE {t} (code text, at date, n integer, PRIMARY KEY (code, at))")
    pg_conn.execute(f"INSERT INTO {t} SELECT 'o''k ' || g, date '2026-01-01' + g, g FROM generate_series(1, 200) g")
    pg_conn.execute("SELECT coldharbor.register_table(%s)", (t,))
    monkeypatch.setenv("COLDHARBOR_PG_DSN", pg_dsn)
    for spelling in (t, f"{schema}.{name}"):
        caplog.clear()
        common = ["--table", spelling, "--lake-root", lake_root]
        assert export_job.main(common) == 0, errors(caplog)
        assert verify.main(common) == 0, errors(caplog)
        assert resync.main(common) == 0, errors(caplog)
        assert compaction.main(common) == 0, errors(caplog)
        assert cleanup_job.main([*common, "--no-evict"]) == 0, errors(caplog)
        assert purge.main([*common, "--where", "n = 3", "--vacuum-retention-hours", "0",
                           "--allow-short-retention"]) == 0, errors(caplog)
    assert pg_conn.execute(f"SELECT count(*) FROM {t} WHERE n = 3").fetchone()[0] == 0

    DeltaTable.forPath(spark, f"{lake_root}/{schema}/{name}").update("n = 17", {"n": F.lit(-1)})
    capsys.readouterr()
    assert verify.main(["--table", t, "--lake-root", lake_root]) == 1
    out = capsys.readouterr().out
    assert "sample keys: (code='o''k 17', at=2026-01-18) has different values" in out, out


@pytest.mark.parametrize("point", ["rebase_after_intent", "rebase_during_write"])
def test_a_new_relation_s_base_killed_midway_is_finished_under_another_partitioning(
        spark, pg_dsn, pg_conn, table_name, lake_root, monkeypatch, caplog, point):
    """The next run fences the killed base's batch with an empty commit, which took the new
    registration's partitioning: `DELTA_PARTITION_COLUMN_NOT_FOUND`, every export and resync refused
    for good. The fence takes the lake table's own now."""
    t = table_name
    loaded_table(pg_conn, pg_dsn, lake_root, monkeypatch, t, "id bigint PRIMARY KEY, customer text",
                 "SELECT g, 'c' || g FROM generate_series(1, 120) g")
    pg_conn.execute(f"DROP TABLE {t}")
    pg_conn.execute(f"CREATE TABLE {t} (k text, r integer, v text, PRIMARY KEY (k, r))")
    pg_conn.execute(f"INSERT INTO {t} SELECT 'k' || g, g % 3, 'v' FROM generate_series(1, 90) g")
    pg_conn.execute("SELECT coldharbor.register_table(%s, p_partition_by => '{r}')", (t,))

    killed = spark_submit_export(pg_dsn, lake_root, "--table", t, env={"COLDHARBOR_CRASH_AT": point})
    assert killed.returncode != 0, killed.stdout[-2000:]
    assert export_job.main(["--table", t, "--lake-root", lake_root]) == 0, errors(caplog)
    assert lake_live(spark, lake_root, t, ["k", "r"]) == pg_rows(pg_conn, f"SELECT * FROM {t}", ["k", "r"])
    assert verify.main(["--table", t, "--lake-root", lake_root]) == 0, errors(caplog)


# (key before, key after, rows changed before the key changes (so that the new key holds), and after;
# the table is (a int, b int, v text))
KEY_CHANGES = [
    ("a, b", "a", "DELETE FROM {t} WHERE b = 2", "UPDATE {t} SET b = 3 WHERE a % 6 = 0"),
    ("a", "a, b", "UPDATE {t} SET v = v || ' before' WHERE a % 6 = 0",
     "INSERT INTO {t} SELECT a, 2, 'second' FROM {t} WHERE a % 3 = 0"),
]


@pytest.mark.parametrize("old_key, new_key, before, after", KEY_CHANGES,
                         ids=["a key column dropped", "a key column added"])
def test_a_table_registered_again_with_another_primary_key_is_rebased_and_exact(
        spark, pg_dsn, pg_conn, table_name, lake_root, monkeypatch, caplog, old_key, new_key, before, after):
    """Registering the same table again after its primary key changed took the new key and nothing
    else: the lake's rows stayed keyed by the old key, so with (a) -> (a, b) the rows the table gained
    under the new key never reached the lake (the changes logged under (a) have no b), and with
    (a, b) -> (a) an as-of report before the change was answered with (a, 1) and (a, 2) ranked as
    one key. Now the registration asks for a base that replaces the lake's rows, and as-of history
    starts again there."""
    name = table_name + HOSTILE
    t = f"public.{quoted(name)}"
    rows = "SELECT g, 1, 'v' || g FROM generate_series(1, 120) g" if old_key == "a" else \
        "SELECT g / 2 + 1, g % 2 + 1, 'v' || g FROM generate_series(0, 239) g"
    pg_conn.execute(f"CREATE TABLE {t} (a int, b int, v text, PRIMARY KEY ({old_key}))")
    pg_conn.execute(f"INSERT INTO {t} {rows}")
    pg_conn.execute("SELECT coldharbor.register_table(%s)", (t,))
    monkeypatch.setenv("COLDHARBOR_PG_DSN", pg_dsn)
    common = ["--table", f"public.{name}", "--lake-root", lake_root]
    assert export_job.main(common) == 0, errors(caplog)
    pg_conn.execute(f"UPDATE {t} SET v = v || ' changed' WHERE a % 4 = 0")
    assert export_job.main(common) == 0, errors(caplog)
    assert compaction.main(common) == 0, errors(caplog)  # one settled row per old key
    before_the_change = pg_conn.execute("SELECT clock_timestamp()").fetchone()[0]

    pg_conn.execute(before.format(t=t))
    pg_conn.execute(f"ALTER TABLE {t} DROP CONSTRAINT {quoted(name + '_pkey')}")
    pg_conn.execute(f"ALTER TABLE {t} ADD PRIMARY KEY ({new_key})")
    pg_conn.execute(after.format(t=t))
    pg_conn.execute(f"UPDATE {t} SET v = v || ' after' WHERE a % 5 = 0")
    pg_conn.execute("SELECT coldharbor.register_table(%s)", (t,))
    registered = pg_conn.execute("SELECT clock_timestamp()").fetchone()[0]
    state, reason = pg_conn.execute("SELECT load_state, rebase_reason FROM coldharbor.tables WHERE table_name = %s",
                                    (name,)).fetchone()
    assert state == "pending" and f"registered again with primary key ({new_key}) where it was ({old_key})" in reason

    keys = [k.strip() for k in new_key.split(",")]
    assert export_job.main(common) == 0, errors(caplog)
    assert sorted(lake_live(spark, lake_root, f"public.{name}", keys)) == sorted(pg_rows(
        pg_conn, f"SELECT * FROM {t}", keys))
    report_equals_postgres(monkeypatch, pg_conn, pg_dsn, lake_root, name, keys)
    refusals = []
    for instant in (before_the_change, registered):  # before the key change; between it and the base
        run = f"a{uuid.uuid4().hex[:10]}"
        assert serve_report(monkeypatch, pg_dsn, lake_root, "--sql", f"SELECT * FROM public.`{name}`", "--target",
                            f"adhoc_{run}", "--run-id", run, "--as-of", instant.isoformat()) == 2
        refusals.append(report_run(pg_conn, run)["error"])
    assert "and the lake knows nothing earlier; the oldest time a report can be asked for is that one" in refusals[0]
    assert "it falls inside a rebase" in refusals[1] and "(none before it can be read)" in refusals[1]
    assert all("ask for an instant before" not in r for r in refusals), refusals
    caplog.clear()
    assert verify.main(common) == 0, errors(caplog)

    pg_conn.execute(f"UPDATE {t} SET v = 'later' WHERE a % 7 = 0")
    pg_conn.execute(f"DELETE FROM {t} WHERE a % 11 = 0")
    assert export_job.main(common) == 0, errors(caplog)
    assert compaction.main(common) == 0, errors(caplog)
    report_equals_postgres(monkeypatch, pg_conn, pg_dsn, lake_root, name, keys)
    assert verify.main(common) == 0, errors(caplog)
    assert not errors(caplog)


def test_a_table_with_evicted_rows_registered_again_with_another_primary_key_is_refused(
        spark, pg_dsn, pg_conn, table_name, lake_root, monkeypatch):
    """Evicted rows live in the lake alone under the old key: a base from PostgreSQL cannot key them
    again, so the registration is refused, naming both keys, and the table keeps its registration."""
    t = table_name
    table_id = tiered_with_evicted_rows(pg_conn, pg_dsn, lake_root, monkeypatch, t,
                                        "a int, b int, v text, PRIMARY KEY (a, b)",
                                        "SELECT g, 1, 'v' FROM generate_series(1, 50) g",
                                        "SELECT g, 1, 'evicted' FROM generate_series(51, 60) g", 10)
    # The same columns in another order are the same key: taken as they are, no base.
    pg_conn.execute(f"ALTER TABLE {t} DROP CONSTRAINT {t}_pkey")
    pg_conn.execute(f"ALTER TABLE {t} ADD PRIMARY KEY (b, a)")
    pg_conn.execute("SELECT coldharbor.register_table(%s)", (t,))
    assert pg_conn.execute("SELECT key_columns, load_state FROM coldharbor.tables WHERE table_id = %s",
                           (table_id,)).fetchone() == (["b", "a"], "loaded")
    pg_conn.execute(f"UPDATE {t} SET v = 'after the reorder' WHERE a % 2 = 0")
    assert export_job.main(["--table", t, "--lake-root", lake_root]) == 0
    live = lake_live(spark, lake_root, t, ["a", "b"])  # the evicted rows 51..60 stay, beside PostgreSQL's
    assert sorted(live) == [(g, 1) for g in range(1, 61)]
    assert [k for k, row in live.items() if row["v"] == "after the reorder"] == [(g, 1) for g in range(2, 51, 2)]

    pg_conn.execute(f"ALTER TABLE {t} DROP CONSTRAINT {t}_pkey")
    pg_conn.execute(f"ALTER TABLE {t} ADD PRIMARY KEY (a)")
    with pytest.raises(psycopg.errors.FeatureNotSupported) as refused:
        pg_conn.execute("SELECT coldharbor.register_table(%s)", (t,))
    assert f"cannot register public.{t} again with primary key (a): rows evicted from it live in the lake alone, " \
           "keyed by (b, a)" in str(refused.value)
    assert pg_conn.execute("SELECT key_columns, load_state FROM coldharbor.tables WHERE table_id = %s",
                           (table_id,)).fetchone() == (["b", "a"], "loaded")

"""DDL that changes a registered table's rows without writing any (sql/migrations/014): the table goes back to
'pending', reports serve it from PostgreSQL, and the next export writes a new base from one snapshot.

Every table here holds rows and is in the lake before the DDL: the review found an ADD COLUMN ...
DEFAULT and a drop-and-register-again that left the lake with rows PostgreSQL no longer had.
"""

from __future__ import annotations

import uuid

import psycopg
import pytest
from coldharbor.capture import registry
from coldharbor.export import base_state
from coldharbor.runtime import pg

from tests.helpers import export, lake_live, pg_rows, report_run, serve_report

DDL = "id bigint PRIMARY KEY, customer text, amount numeric(12,2), status text"


def filled_table(conn, name: str, rows: int = 300, ddl: str = DDL) -> None:
    conn.execute(f"CREATE TABLE {name} ({ddl})")
    conn.execute(f"INSERT INTO {name} (id, customer, amount, status) "
                 f"SELECT g, 'c' || (g % 13), g * 0.5, 'new' FROM generate_series(1, {rows}) g")
    conn.execute("SELECT coldharbor.register_table(%s)", (name,))


def state_of(conn, name: str) -> base_state.LoadState:
    [table] = registry.load(conn, name)
    return base_state.load_state(conn, table.table_id)


def report_equals_postgres(monkeypatch, conn, dsn: str, lake_root: str, name: str, run_id: str) -> dict:
    """Serves `SELECT * FROM name` and checks it row for row against PostgreSQL; the run's record."""
    assert serve_report(monkeypatch, dsn, lake_root, "--sql", f"SELECT * FROM {name}",
                        "--target", f"adhoc_{run_id}", "--run-id", run_id) == 0
    assert pg_rows(conn, f"SELECT * FROM reports.adhoc_{run_id}", ["id"]) == pg_rows(
        conn, f"SELECT * FROM {name}", ["id"])
    return report_run(conn, run_id)


def exported_and_in_the_lake(spark, conn, dsn: str, lake_root: str, name: str) -> None:
    """Exports, then compares the lake's live rows on PostgreSQL's columns (a dropped or renamed
    column's old name stays in the lake, NULL in new rows)."""
    assert export(spark, dsn, name, lake_root).status in ("exported", "loaded")
    expected = pg_rows(conn, f"SELECT * FROM {name}", ["id"])
    columns = next(iter(expected.values())).keys() if expected else ()
    live = lake_live(spark, lake_root, name, ["id"])
    assert {key: {c: row.get(c) for c in columns} for key, row in live.items()} == expected


# (set-up before registration, the DDL, what the reason names)
ROW_CHANGING = [
    ("", "ALTER TABLE {t} ADD COLUMN region text DEFAULT 'eu'", "column region was added with a default"),
    ("", "ALTER TABLE {t} ADD COLUMN qty integer NOT NULL DEFAULT 7", "column qty was added with a default"),
    ("", "ALTER TABLE {t} ADD COLUMN r double precision DEFAULT random()", "ALTER TABLE rewrote"),
    ("", "ALTER TABLE {t} ALTER COLUMN status TYPE text USING upper(status)", "ALTER TABLE rewrote"),
    ("", "ALTER TABLE {t} ADD COLUMN twice bigint GENERATED ALWAYS AS (id * 2)",
     "column twice was added as a generated column"),
    ("", "ALTER TABLE {t} ADD COLUMN twice bigint GENERATED ALWAYS AS (id * 2) STORED",
     "column twice was added as a generated column"),
    ("ALTER TABLE {t} ADD COLUMN twice bigint GENERATED ALWAYS AS (id * 2)",
     "ALTER TABLE {t} ALTER COLUMN twice SET EXPRESSION AS (id * 3)",
     "the generation expression of column twice changed"),
    ("ALTER TABLE {t} ADD COLUMN twice bigint GENERATED ALWAYS AS (id * 2) STORED",
     "ALTER TABLE {t} ALTER COLUMN twice SET EXPRESSION AS (id * 3)",
     "the generation expression of column twice changed"),
    ("", "ALTER TABLE {t} RENAME COLUMN customer TO buyer", "column customer was renamed to buyer"),
    ("", "ALTER TABLE {t} DROP COLUMN status; ALTER TABLE {t} ADD COLUMN status text",
     "column status was added under the name of a dropped column"),
]


@pytest.mark.parametrize("before, ddl, reason", ROW_CHANGING,
                         ids=["default", "not null default", "volatile default", "type using",
                              "virtual generated", "stored generated", "virtual expression", "stored expression",
                              "column rename", "dropped and added again"])
def test_ddl_that_changes_rows_sends_the_table_back_and_the_next_export_rebuilds_it(
        spark, pg_dsn, pg_conn, table_name, lake_root, monkeypatch, before, ddl, reason):
    t = table_name
    pg_conn.execute(f"CREATE TABLE {t} ({DDL})")
    for statement in filter(None, before.format(t=t).split("; ")):
        pg_conn.execute(statement)
    pg_conn.execute(f"INSERT INTO {t} (id, customer, amount, status) "
                    "SELECT g, 'c' || (g % 13), g * 0.5, 'new' FROM generate_series(1, 300) g")
    pg_conn.execute("SELECT coldharbor.register_table(%s)", (t,))
    exported_and_in_the_lake(spark, pg_conn, pg_dsn, lake_root, t)
    pg_conn.execute(f"UPDATE {t} SET amount = amount + 1 WHERE id <= 5")  # dirty changes before the DDL too

    pg_conn.execute(ddl.format(t=t))

    state = state_of(pg_conn, t)
    assert state.pending and reason in state.rebase_reason
    record = report_equals_postgres(monkeypatch, pg_conn, pg_dsn, lake_root, t, f"r1_{t}")
    assert record["served_from_postgres"] == [f"public.{t}"]
    pg_conn.execute(f"UPDATE {t} SET amount = 0 WHERE id = 7")  # and changes after it
    exported_and_in_the_lake(spark, pg_conn, pg_dsn, lake_root, t)
    state = state_of(pg_conn, t)
    assert not state.pending and state.loaded_at is not None  # the initial load's time stays
    assert state.rebase_reason is None  # settled: the reason stays in coldharbor.rebases only
    [(kept, settled)] = pg_conn.execute(
        "SELECT r.reason, r.settled_at IS NOT NULL FROM coldharbor.rebases r JOIN coldharbor.tables t USING "
        "(table_id) WHERE t.table_name = %s ORDER BY r.serial DESC LIMIT 1", (t,)).fetchall()
    assert reason in kept and settled
    record = report_equals_postgres(monkeypatch, pg_conn, pg_dsn, lake_root, t, f"r2_{t}")
    assert not record["served_from_postgres"]


@pytest.mark.parametrize("ddl", [
    "ALTER TABLE {t} ADD COLUMN note text",
    "ALTER TABLE {t} ALTER COLUMN status SET DEFAULT 'paid'",
    "CREATE INDEX ON {t} (customer)",
    "ALTER TABLE {t} ALTER COLUMN code TYPE varchar(40)",
    "ALTER TABLE {t} DROP COLUMN customer",
], ids=["nullable column", "default for new rows", "index", "type without rewrite", "dropped column"])
def test_ddl_that_changes_no_row_keeps_the_table_in_the_lake(spark, pg_dsn, pg_conn, table_name, lake_root, ddl):
    t = table_name
    filled_table(pg_conn, t, ddl=DDL + ", code varchar(10) DEFAULT 'k'")
    exported_and_in_the_lake(spark, pg_conn, pg_dsn, lake_root, t)

    pg_conn.execute(ddl.format(t=t))

    assert not state_of(pg_conn, t).pending
    pg_conn.execute(f"UPDATE {t} SET status = 'paid' WHERE id = 3")
    exported_and_in_the_lake(spark, pg_conn, pg_dsn, lake_root, t)


@pytest.mark.parametrize("new_rows", [
    "SELECT g, 'other', g * 2.0, 'redone' FROM generate_series(200, 450) g",
    "SELECT g, 'other', 1, 'redone' FROM generate_series(1, 0) g",
], ids=["other rows", "empty"])
def test_a_table_dropped_created_again_and_registered_again_is_rebuilt(spark, pg_dsn, pg_conn, table_name,
                                                                      lake_root, monkeypatch, new_rows):
    t = table_name
    filled_table(pg_conn, t)
    exported_and_in_the_lake(spark, pg_conn, pg_dsn, lake_root, t)
    pg_conn.execute(f"UPDATE {t} SET status = 'paid' WHERE id <= 20")  # dirty when the table goes

    pg_conn.execute(f"DROP TABLE {t}")
    pg_conn.execute(f"CREATE TABLE {t} ({DDL})")
    pg_conn.execute(f"INSERT INTO {t} {new_rows}")
    pg_conn.execute("SELECT coldharbor.register_table(%s)", (t,))

    state = state_of(pg_conn, t)
    assert state.pending and "dropped and created anew" in state.rebase_reason
    report_equals_postgres(monkeypatch, pg_conn, pg_dsn, lake_root, t, f"r1_{t}")
    exported_and_in_the_lake(spark, pg_conn, pg_dsn, lake_root, t)
    assert not state_of(pg_conn, t).pending
    report_equals_postgres(monkeypatch, pg_conn, pg_dsn, lake_root, t, f"r2_{t}")


def test_registering_the_same_table_again_changes_nothing(spark, pg_dsn, pg_conn, table_name, lake_root):
    filled_table(pg_conn, table_name)
    export(spark, pg_dsn, table_name, lake_root)
    pg_conn.execute("SELECT coldharbor.register_table(%s, p_hot_retention => interval '7 days')", (table_name,))
    assert not state_of(pg_conn, table_name).pending


@pytest.mark.parametrize("point", ["rebase_after_intent", "rebase_after_commit"],
                         ids=["before the snapshot, after the columns were read", "after the commit"])
def test_a_rebase_requested_while_the_base_is_written_keeps_the_table_pending(spark, pg_dsn, admin_dsn, pg_conn,
                                                                             table_name, lake_root, monkeypatch,
                                                                             point):
    t = table_name
    filled_table(pg_conn, t)
    exported_and_in_the_lake(spark, pg_conn, pg_dsn, lake_root, t)
    pg_conn.execute(f"ALTER TABLE {t} ADD COLUMN region text DEFAULT 'eu'")

    def alter_after_the_commit(reached: str) -> None:
        # A second ALTER commits while the base is written: after it read the table's columns but
        # before its snapshot, or after its Delta commit but before it is recorded.
        if reached == point:
            with psycopg.connect(admin_dsn, autocommit=True) as other:
                other.execute(f"ALTER TABLE {t} ADD COLUMN channel text DEFAULT 'web'")

    assert export(spark, pg_dsn, t, lake_root, hook=alter_after_the_commit).status == "loaded"
    state = state_of(pg_conn, t)
    assert state.pending and "column channel" in state.rebase_reason  # the base read no channel
    report_equals_postgres(monkeypatch, pg_conn, pg_dsn, lake_root, t, f"r1_{t}")
    exported_and_in_the_lake(spark, pg_conn, pg_dsn, lake_root, t)
    assert not state_of(pg_conn, t).pending


def test_verify_of_a_table_being_rebuilt_says_why(spark, pg_dsn, pg_conn, table_name, lake_root, monkeypatch,
                                                  caplog):
    from coldharbor.maintenance import verify

    filled_table(pg_conn, table_name)
    export(spark, pg_dsn, table_name, lake_root)
    pg_conn.execute(f"ALTER TABLE {table_name} ADD COLUMN region text DEFAULT 'eu'")
    monkeypatch.setenv("COLDHARBOR_PG_DSN", pg_dsn)
    assert verify.main(["--table", table_name, "--lake-root", lake_root]) == 2
    [line] = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert "being rebuilt from PostgreSQL (column region was added with a default" in line


def test_a_pipeline_login_cannot_request_a_rebase(pg_dsn, pg_conn, table_name):
    filled_table(pg_conn, table_name)
    [table] = registry.load(pg_conn, table_name)
    with pg.connect(pg_dsn) as pipeline, pytest.raises(psycopg.errors.InsufficientPrivilege):
        pipeline.execute("UPDATE coldharbor.tables SET rebase_reason = 'x' WHERE table_id = %s", (table.table_id,))


HOSTILE = ' "q\'s" ü'  # a quote of each kind, spaces and a non-ASCII letter in the table's name


def test_a_table_dropped_and_created_again_but_not_registered_again_is_refused_by_every_job(
        spark, own_database, table_name, lake_root, monkeypatch, caplog):
    """The registration still names the old relation; the new table has no capture triggers, so its
    writes are not captured: every job refuses it in one line (exit 2) and writes nothing, with or
    without the sql_drop event trigger's record of the drop. (A database of its own: the runs over
    every table meet this test's alone.)"""
    admin_dsn, pg_dsn = own_database
    with pg.connect(admin_dsn) as pg_conn:
        replaced_table_refused(spark, pg_dsn, pg_conn, table_name, lake_root, monkeypatch, caplog)


def replaced_table_refused(spark, pg_dsn, pg_conn, table_name, lake_root, monkeypatch, caplog):
    from tests.integration.runtime.test_one_line_failures import one_error_line, run_job

    name = table_name + HOSTILE
    quoted = '"' + name.replace('"', '""') + '"'
    pg_conn.execute(f"CREATE TABLE {quoted} ({DDL})")
    pg_conn.execute(f"INSERT INTO {quoted} SELECT g, 'c', g, 'new' FROM generate_series(1, 50) g")
    pg_conn.execute("SELECT coldharbor.register_table(%s)", (quoted,))
    assert export(spark, pg_dsn, f"public.{name}", lake_root).status == "loaded"
    path = f"{lake_root}/public/{name}"
    from coldharbor.lake import delta
    version = delta.pin_version(spark, path)
    pg_conn.execute(f"DROP TABLE {quoted}")
    pg_conn.execute(f"CREATE TABLE {quoted} ({DDL})")
    pg_conn.execute(f"INSERT INTO {quoted} SELECT g, 'other', g, 'new' FROM generate_series(1, 70) g")
    [table] = registry.load(pg_conn, f"public.{name}")
    batches = pg_conn.execute("SELECT count(*) FROM coldharbor.export_batches WHERE table_id = %s",
                              (table.table_id,)).fetchone()[0]
    expected = f"public.{quoted} was dropped and created again since it was registered"
    again = "SELECT coldharbor.register_table('public." + quoted.replace("'", "''") + "')"

    for recorded_drop in (True, False):
        if not recorded_drop:  # as without the event trigger (a migration by a non-superuser)
            pg_conn.execute("UPDATE coldharbor.tables SET dropped_at = NULL WHERE table_id = %s", (table.table_id,))
        for job, args in [("cdc_export.py", []), ("cdc_export.py", ["--table", f"public.{name}"]),
                          ("cleanup.py", []), ("compact.py", []), ("compact.py", ["--table", f"public.{name}"]),
                          ("verify.py", ["--table", f"public.{name}"]), ("resync.py", ["--table", f"public.{name}"]),
                          ("purge.py", ["--table", f"public.{name}", "--where", "id = 1",
                                        "--vacuum-retention-hours", "168"])]:
            done = run_job(job, "--lake-root", lake_root, *args, dsn=pg_dsn)
            assert done.returncode == 2, (job, done.stderr[-3000:])
            line = one_error_line(done.stderr)
            assert expected in line and again in line, (job, line)
        caplog.clear()
        run_id = f"replaced-{recorded_drop}-{table.table_id}"
        assert serve_report(monkeypatch, pg_dsn, lake_root, "--sql", f"SELECT count(*) AS n FROM public.`{name}`",
                            "--target", "adhoc_replaced", "--run-id", run_id) == 2
        assert expected in report_run(pg_conn, run_id)["error"] and "Traceback" not in caplog.text

    assert delta.pin_version(spark, path) == version  # nothing written
    assert pg_conn.execute("SELECT count(*) FROM coldharbor.export_batches WHERE table_id = %s",
                           (table.table_id,)).fetchone()[0] == batches
    # Registered again: the next export rebuilds the lake from the new table.
    pg_conn.execute("SELECT coldharbor.register_table(%s)", (quoted,))
    assert state_of(pg_conn, f"public.{name}").pending
    assert export(spark, pg_dsn, f"public.{name}", lake_root).status == "loaded"
    assert serve_report(monkeypatch, pg_dsn, lake_root, "--sql", f"SELECT count(*) AS n, min(customer) AS c "
                        f"FROM public.`{name}`", "--target", "adhoc_replaced", "--run-id", f"again-{table.table_id}") == 0
    assert pg_conn.execute("SELECT n, c FROM reports.adhoc_replaced").fetchone() == (70, "other")


def clock(conn) -> object:
    return conn.execute("SELECT clock_timestamp()").fetchone()[0]


def as_of_report(monkeypatch, dsn: str, lake_root: str, name: str, instant, run_id: str) -> int:
    return serve_report(monkeypatch, dsn, lake_root, "--sql", f"SELECT * FROM public.`{name}`",
                        "--target", f"adhoc_{run_id}", "--as-of", instant.isoformat(), "--run-id", run_id)


def test_as_of_reports_across_a_rebase_are_exact_before_and_after_it_and_refused_inside(
        spark, pg_dsn, pg_conn, table_name, lake_root, monkeypatch):
    """ADD COLUMN ... DEFAULT at T1 changes every row without writing one; the new base lands at T2.
    Asked after T2, an instant in [T1, T2) read the pre-DDL lake rows (region NULL) where PostgreSQL
    held 'eu': it is refused, naming the table and the window; instants outside are exact."""
    name = table_name + HOSTILE
    quoted = '"' + name.replace('"', '""') + '"'
    pg_conn.execute(f"CREATE TABLE {quoted} ({DDL})")
    pg_conn.execute(f"INSERT INTO {quoted} SELECT g, 'c' || (g % 13), g * 0.5, 'new' FROM generate_series(1, 300) g")
    pg_conn.execute("SELECT coldharbor.register_table(%s)", (quoted,))
    assert export(spark, pg_dsn, f"public.{name}", lake_root).status in ("exported", "loaded")
    pg_conn.execute(f"UPDATE {quoted} SET amount = amount + 1 WHERE id <= 10")
    assert export(spark, pg_dsn, f"public.{name}", lake_root).status in ("exported", "loaded")
    before = pg_rows(pg_conn, f"SELECT *, NULL::text AS region FROM {quoted}", ["id"])
    t_before = clock(pg_conn)
    pg_conn.execute(f"ALTER TABLE {quoted} ADD COLUMN region text DEFAULT 'eu'")
    t_inside = clock(pg_conn)
    assert export(spark, pg_dsn, f"public.{name}", lake_root).status in ("exported", "loaded")
    t_after = clock(pg_conn)
    after = pg_rows(pg_conn, f"SELECT * FROM {quoted}", ["id"])

    run = f"r{uuid.uuid4().hex[:8]}"
    assert as_of_report(monkeypatch, pg_dsn, lake_root, name, t_before, f"{run}_before") == 0
    assert pg_rows(pg_conn, f"SELECT * FROM reports.adhoc_{run}_before", ["id"]) == before
    assert as_of_report(monkeypatch, pg_dsn, lake_root, name, t_after, f"{run}_after") == 0
    assert pg_rows(pg_conn, f"SELECT * FROM reports.adhoc_{run}_after", ["id"]) == after
    assert as_of_report(monkeypatch, pg_dsn, lake_root, name, t_inside, f"{run}_inside") == 2
    error = report_run(pg_conn, f"{run}_inside")["error"]
    assert error.startswith(f"as-of {t_inside.isoformat()} cannot be answered for public.{quoted}: it falls "
                            "inside a rebase: column region was added with a default"), error
    [table] = registry.load(pg_conn, f"public.{name}")
    window = pg_conn.execute("SELECT requested_at, settled_at FROM coldharbor.rebases WHERE table_id = %s",
                             (table.table_id,)).fetchall()
    assert len(window) == 1 and t_before < window[0][0] < t_inside < window[0][1] < t_after
    assert f"from {window[0][0].isoformat()} until its new base of {window[0][1].isoformat()}" in error
    assert pg_conn.execute(f"SELECT to_regclass('reports.adhoc_{run}_inside')").fetchone()[0] is None

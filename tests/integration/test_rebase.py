"""DDL that changes a registered table's rows without writing any (sql/014): the table goes back to
'pending', reports serve it from PostgreSQL, and the next export writes a new base from one snapshot.

Every table here holds rows and is in the lake before the DDL: the review found an ADD COLUMN ...
DEFAULT and a drop-and-register-again that left the lake with rows PostgreSQL no longer had.
"""

from __future__ import annotations

import psycopg
import pytest

from coldharbor import base_load, pg, registry
from tests.helpers import export, lake_live, pg_rows, report_run, serve_report

DDL = "id bigint PRIMARY KEY, customer text, amount numeric(12,2), status text"


def filled_table(conn, name: str, rows: int = 300, ddl: str = DDL) -> None:
    conn.execute(f"CREATE TABLE {name} ({ddl})")
    conn.execute(f"INSERT INTO {name} (id, customer, amount, status) "
                 f"SELECT g, 'c' || (g % 13), g * 0.5, 'new' FROM generate_series(1, {rows}) g")
    conn.execute("SELECT coldharbor.register_table(%s)", (name,))


def state_of(conn, name: str) -> base_load.LoadState:
    [table] = registry.load(conn, name)
    return base_load.load_state(conn, table.table_id)


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
]


@pytest.mark.parametrize("before, ddl, reason", ROW_CHANGING,
                         ids=["default", "not null default", "volatile default", "type using",
                              "virtual generated", "stored generated", "virtual expression", "stored expression",
                              "column rename"])
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


def test_a_rebase_requested_while_the_base_is_written_keeps_the_table_pending(spark, pg_dsn, admin_dsn, pg_conn,
                                                                             table_name, lake_root, monkeypatch):
    t = table_name
    filled_table(pg_conn, t)
    exported_and_in_the_lake(spark, pg_conn, pg_dsn, lake_root, t)
    pg_conn.execute(f"ALTER TABLE {t} ADD COLUMN region text DEFAULT 'eu'")

    def alter_after_the_commit(point: str) -> None:
        # The base's rows are in the lake but not yet recorded: a second ALTER commits in between.
        if point == "resync_after_commit":
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
    from coldharbor import verify

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

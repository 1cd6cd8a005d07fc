"""Writes that name a partition of a registered table are captured once, in their transaction, like
writes to the table itself (issue 20, attack finding 1): statement triggers on a partitioned table
fire only for statements naming it. Partitions created, attached or detached after registration
follow, and a partition is not dropped from under its table. Each table here already holds rows in
several partitions when it is registered, and the application that owns it is not a superuser."""

from __future__ import annotations

from dataclasses import dataclass

import psycopg
import pytest
from coldharbor.capture import registry
from coldharbor.runtime import pg

from tests.helpers import export, lake_live, pg_rows, serve_report

KEYS = ["day", "region", "id"]
COLUMNS = "day date, region text, id bigint, v text, PRIMARY KEY (day, region, id)"
# Rows the table holds before it is registered, in every partition of both layouts.
ROWS_BEFORE = """INSERT INTO {t} VALUES
    ('2026-01-05', 'eu', 1, 'jan eu'), ('2026-01-06', 'us', 2, 'it''s "quoted" \\ back'),
    ('2026-02-05', 'eu', 3, 'feb eu'), ('2026-02-06', 'é''u', 4, E'new\\nline'),
    ('2026-02-07', 'us', 5, 'feb us'), ('2026-02-08', 'us', 6, 'feb us 2'),
    ('2027-01-01', 'eu', 7, 'next year'), ('2026-03-01', 'mars', 8, 'march')"""


@dataclass(frozen=True)
class Layout:
    """A partition tree ({t}: the table's name) and direct writes to its partitions, each with the
    number of changes it makes (what capture must log for it, once)."""

    ddl: list[str]
    writes: list[tuple[str, int]]


LAYOUTS = {
    # RANGE by day; February is itself partitioned by LIST (region).
    "range": Layout(
        ddl=[f"CREATE TABLE {{t}} ({COLUMNS}) PARTITION BY RANGE (day)",
             "CREATE TABLE {t}_jan PARTITION OF {t} FOR VALUES FROM ('2026-01-01') TO ('2026-02-01')",
             "CREATE TABLE {t}_feb PARTITION OF {t} FOR VALUES FROM ('2026-02-01') TO ('2026-03-01') "
             "PARTITION BY LIST (region)",
             "CREATE TABLE {t}_feb_eu PARTITION OF {t}_feb FOR VALUES IN ('eu', 'é''u')",
             "CREATE TABLE {t}_feb_rest PARTITION OF {t}_feb DEFAULT",
             "CREATE TABLE {t}_rest PARTITION OF {t} DEFAULT"],
        writes=[("INSERT INTO {t}_jan VALUES ('2026-01-10', 'eu', 10, 'to a leaf'), ('2026-01-11', 'é''u', 11, 'é')", 2),
                ("INSERT INTO {t}_feb VALUES ('2026-02-10', 'us', 12, 'routed below a partition')", 1),
                ("UPDATE {t}_feb_eu SET v = v || ' changed'", 2),
                ("DELETE FROM {t}_jan WHERE id = 2", 1),
                ("UPDATE {t} SET day = '2026-01-20' WHERE id = 3", 2),               # feb_eu -> jan
                ("UPDATE {t}_feb SET region = 'eu' WHERE id = 5", 2),               # feb_rest -> feb_eu
                ("TRUNCATE {t}_feb_rest", 2),                                        # ids 6 and 12
                ("INSERT INTO {t}_rest VALUES ('2027-01-01', 'eu', 7, 'upserted') "
                 "ON CONFLICT (day, region, id) DO UPDATE SET v = EXCLUDED.v", 1)]),
    # LIST by region; 'us' is itself partitioned by RANGE (day).
    "list": Layout(
        ddl=[f"CREATE TABLE {{t}} ({COLUMNS}) PARTITION BY LIST (region)",
             "CREATE TABLE {t}_eu PARTITION OF {t} FOR VALUES IN ('eu', 'é''u')",
             "CREATE TABLE {t}_us PARTITION OF {t} FOR VALUES IN ('us') PARTITION BY RANGE (day)",
             "CREATE TABLE {t}_us_jan PARTITION OF {t}_us FOR VALUES FROM ('2026-01-01') TO ('2026-02-01')",
             "CREATE TABLE {t}_us_rest PARTITION OF {t}_us DEFAULT",
             "CREATE TABLE {t}_rest PARTITION OF {t} DEFAULT"],
        writes=[("INSERT INTO {t}_eu VALUES ('2026-01-10', 'eu', 10, 'to a leaf'), ('2026-01-11', 'é''u', 11, 'é')", 2),
                ("INSERT INTO {t}_us VALUES ('2026-02-10', 'us', 12, 'routed below a partition')", 1),
                ("UPDATE {t}_us_rest SET v = v || ' changed' WHERE id <> 12", 2),
                ("DELETE FROM {t}_eu WHERE id = 1", 1),
                ("UPDATE {t} SET region = 'us' WHERE id = 3", 2),                   # eu -> us_rest
                ("UPDATE {t}_us SET day = '2026-01-30' WHERE id = 5", 2),           # us_rest -> us_jan
                ("TRUNCATE {t}_us_rest", 3),                                         # ids 3, 6 and 12
                ("INSERT INTO {t}_rest VALUES ('2026-03-01', 'mars', 8, 'upserted') "
                 "ON CONFLICT (day, region, id) DO UPDATE SET v = EXCLUDED.v", 1)]),
}


def change_count(admin: psycopg.Connection, table_id: int) -> int:
    return admin.execute("SELECT count(*) FROM coldharbor.change_log WHERE table_id = %s", (table_id,)).fetchone()[0]


def reports_equal_postgres(monkeypatch, pg_dsn, admin, lake_root, name: str, run: str) -> None:
    """A report over the table, served now, holds exactly the rows PostgreSQL holds."""
    target = f"adhoc_{name.replace('.', '_')}_{run}"
    assert serve_report(monkeypatch, pg_dsn, lake_root, "--sql", f"SELECT * FROM {name}", "--target", target,
                        "--run-id", target) == 0
    assert pg_rows(admin, f"SELECT * FROM reports.{target}", KEYS) == pg_rows(admin, f"SELECT * FROM {name}", KEYS)


@pytest.fixture()
def app(app_logins):
    """An application's schema and connection (not a superuser): (schema, connection)."""
    schema, dsn = app_logins()
    with pg.connect(dsn) as conn:
        yield schema, conn


def registered(app_conn, name: str, layout: Layout, hot_retention: str | None = None) -> None:
    for statement in layout.ddl:
        app_conn.execute(statement.format(t=name))
    app_conn.execute(ROWS_BEFORE.format(t=name))
    app_conn.execute("SELECT coldharbor.register_table(%s, p_hot_retention => %s::interval)", (name, hot_retention))


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_writes_to_partitions_are_captured_once_and_reach_reports(
        spark, pg_dsn, pg_conn, app, lake_root, monkeypatch, layout):
    schema, conn = app
    name = f"{schema}.events"
    registered(conn, name, LAYOUTS[layout])
    [table] = registry.load(pg_conn, name)
    export(spark, pg_dsn, name, lake_root)                                       # the initial load

    for statement, changes in LAYOUTS[layout].writes:
        before = change_count(pg_conn, table.table_id)
        conn.execute(statement.format(t=name))
        assert change_count(pg_conn, table.table_id) - before == changes, statement

    reports_equal_postgres(monkeypatch, pg_dsn, pg_conn, lake_root, name, "dirty")
    export(spark, pg_dsn, name, lake_root)
    assert lake_live(spark, lake_root, name, KEYS) == pg_rows(pg_conn, f"SELECT * FROM {name}", KEYS)
    reports_equal_postgres(monkeypatch, pg_dsn, pg_conn, lake_root, name, "flushed")


def test_partitions_created_attached_or_detached_later_keep_reports_equal_to_postgres(
        spark, pg_dsn, pg_conn, app, lake_root, monkeypatch):
    schema, conn = app
    name = f"{schema}.events"
    registered(conn, name, LAYOUTS["range"])
    [table] = registry.load(pg_conn, name)
    export(spark, pg_dsn, name, lake_root)

    # A partition created after registration is captured from its first row.
    conn.execute(f"CREATE TABLE {name}_apr PARTITION OF {name} FOR VALUES FROM ('2026-04-01') TO ('2026-05-01')")
    conn.execute(f"INSERT INTO {name}_apr VALUES ('2026-04-02', 'eu', 20, 'new partition')")
    # A table attached with rows, itself partitioned: its rows enter the table now, as inserts, once.
    conn.execute(f"CREATE TABLE {name}_may ({COLUMNS}) PARTITION BY LIST (region)")
    conn.execute(f"CREATE TABLE {name}_may_eu PARTITION OF {name}_may FOR VALUES IN ('eu')")
    conn.execute(f"CREATE TABLE {name}_may_rest PARTITION OF {name}_may DEFAULT")
    conn.execute(f"INSERT INTO {name}_may VALUES ('2026-05-02', 'eu', 21, 'attached'), "
                 "('2026-05-03', 'o''brien', 22, 'attached too')")
    before = change_count(pg_conn, table.table_id)
    conn.execute(f"ALTER TABLE {name} ATTACH PARTITION {name}_may FOR VALUES FROM ('2026-05-01') TO ('2026-06-01')")
    assert change_count(pg_conn, table.table_id) - before == 2
    conn.execute(f"UPDATE {name}_may_rest SET v = 'changed once attached'")
    # A detached partition's rows leave the table: deletes. Its later writes are not the table's.
    before = change_count(pg_conn, table.table_id)
    conn.execute(f"ALTER TABLE {name} DETACH PARTITION {name}_jan")
    assert change_count(pg_conn, table.table_id) - before == 2
    conn.execute(f"INSERT INTO {name}_jan VALUES ('2026-01-15', 'eu', 23, 'no longer the table''s')")
    assert change_count(pg_conn, table.table_id) - before == 2
    # A partition is not dropped from under the table; once detached it may go.
    with pytest.raises(psycopg.errors.InsufficientPrivilege,
                       match=f"cannot drop table {name}_feb_rest: it is a partition of {name}"):
        conn.execute(f"DROP TABLE {name}_feb_rest")
    conn.execute(f"DROP TABLE {name}_jan")

    reports_equal_postgres(monkeypatch, pg_dsn, pg_conn, lake_root, name, "dirty")
    export(spark, pg_dsn, name, lake_root)
    assert lake_live(spark, lake_root, name, KEYS) == pg_rows(pg_conn, f"SELECT * FROM {name}", KEYS)
    reports_equal_postgres(monkeypatch, pg_dsn, pg_conn, lake_root, name, "flushed")


def test_a_partition_cannot_be_registered_nor_a_registered_table_attached(pg_conn, app):
    schema, conn = app
    name = f"{schema}.events"
    registered(conn, name, LAYOUTS["range"])
    with pytest.raises(psycopg.errors.WrongObjectType,
                       match=f"cannot register {name}_jan: it is a partition of {name}, and writes through"):
        conn.execute("SELECT coldharbor.register_table(%s)", (f"{name}_jan",))
    conn.execute(f"CREATE TABLE {schema}.june ({COLUMNS})")
    conn.execute("SELECT coldharbor.register_table(%s)", (f"{schema}.june",))
    with pytest.raises(psycopg.errors.InsufficientPrivilege,
                       match=f"{schema}.june is registered with coldharbor and cannot be a partition of {name}"):
        conn.execute(f"ALTER TABLE {name} ATTACH PARTITION {schema}.june FOR VALUES FROM ('2026-06-01') TO ('2026-07-01')")


def test_a_partition_another_role_owns_is_named_with_the_grant_its_owner_runs(pg_conn, app):
    schema, conn = app
    name = f"{schema}.events"
    for statement in LAYOUTS["range"].ddl:
        conn.execute(statement.format(t=name))
    pg_conn.execute(f"ALTER TABLE {name}_feb_rest OWNER TO CURRENT_USER")      # the superuser's now
    with pytest.raises(psycopg.errors.InsufficientPrivilege,
                       match=rf"cannot capture {name}_feb_rest, a partition of {name}: role coldharbor_owner lacks "
                             "TRIGGER or SELECT on it") as refused:
        conn.execute("SELECT coldharbor.register_table(%s)", (name,))
    assert refused.value.diag.message_hint == f"Its owner runs GRANT SELECT, TRIGGER ON {name}_feb_rest TO coldharbor_owner."
    pg_conn.execute(f"GRANT SELECT, TRIGGER ON {name}_feb_rest TO coldharbor_owner")
    conn.execute("SELECT coldharbor.register_table(%s)", (name,))
    conn.execute(f"INSERT INTO {name}_feb VALUES ('2026-02-01', 'us', 1, 'captured')")
    assert pg_conn.execute("SELECT count(*) FROM coldharbor.change_log c JOIN coldharbor.tables t USING (table_id) "
                           "WHERE t.schema_name = %s AND t.table_name = 'events'", (schema,)).fetchone()[0] == 1


def test_a_concurrent_detach_logs_the_rows_that_leave_when_it_completes(pg_conn, app):
    schema, conn = app
    name = f"{schema}.events"
    conn.execute(f"CREATE TABLE {name} (k int, id int, v text, PRIMARY KEY (k, id)) PARTITION BY LIST (k)")
    conn.execute(f"CREATE TABLE {name}_1 PARTITION OF {name} FOR VALUES IN (1)")
    conn.execute(f"CREATE TABLE {name}_2 PARTITION OF {name} FOR VALUES IN (2)")
    conn.execute(f"INSERT INTO {name} VALUES (1, 1, 'stays'), (2, 1, 'leaves'), (2, 2, 'leaves too')")
    conn.execute("SELECT coldharbor.register_table(%s)", (name,))
    conn.execute(f"ALTER TABLE {name} DETACH PARTITION {name}_2 CONCURRENTLY")
    conn.execute(f"INSERT INTO {name}_2 VALUES (2, 3, 'no longer the table''s')")
    conn.execute(f"DROP TABLE {name}_2")
    assert pg_conn.execute("""SELECT c.key, c.op FROM coldharbor.change_log c JOIN coldharbor.tables t USING (table_id)
                               WHERE t.schema_name = %s AND t.table_name = 'events' ORDER BY c.id""",
                           (schema,)).fetchall() == [({"k": 2, "id": 1}, "D"), ({"k": 2, "id": 2}, "D")]

"""A PostgreSQL report table is written in place: readers keep their grants, views and snapshot,
the table keeps its owner and identity; a report whose columns changed replaces it (grants and
owner carried over) unless something depends on it, which is refused naming it."""

from __future__ import annotations

from coldharbor.runtime import pg

from tests.helpers import report_run, serve_report

UPTO = "-- param: upto int\nSELECT id, v FROM {t} WHERE id <= :upto"


def make_table(conn, name: str) -> None:
    conn.execute(f"CREATE TABLE {name} (id bigint PRIMARY KEY, v text)")
    conn.execute("SELECT coldharbor.register_table(%s)", (name,))
    conn.execute(f"INSERT INTO {name} SELECT g, 'v' || g FROM generate_series(1, 50) g")


def run(monkeypatch, dsn, lake_root, sql: str, target: str, *extra: str) -> int:
    return serve_report(monkeypatch, dsn, lake_root, "--sql", sql, "--target", target, *extra)


def table_facts(conn, target: str, reader: str) -> tuple:
    return conn.execute("""SELECT c.oid, pg_get_userbyid(c.relowner), has_table_privilege(%s, c.oid, 'SELECT')
                           FROM pg_class c WHERE c.oid = to_regclass(%s)""", (reader, f"reports.{target}")).fetchone()


def test_grants_views_owner_and_a_reader_s_snapshot_survive_a_new_result(
        spark, pg_dsn, pg_conn, table_name, lake_root, monkeypatch):
    make_table(pg_conn, table_name)
    target, reader, owner = f"adhoc_{table_name}", f"reader_{table_name}", f"owner_{table_name}"
    sql = UPTO.format(t=table_name)
    assert run(monkeypatch, pg_dsn, lake_root, sql, target, "--param", "upto=10") == 0
    pg_conn.execute(f"CREATE ROLE {reader}; CREATE ROLE {owner}")
    pg_conn.execute(f"GRANT SELECT ON reports.{target} TO {reader}")
    # An administrator hands the table to another role, which lets the jobs keep writing it.
    pg_conn.execute(f"ALTER TABLE reports.{target} OWNER TO {owner}")
    pg_conn.execute(f"GRANT SELECT, INSERT, DELETE ON reports.{target} TO coldharbor_pipeline")
    pg_conn.execute(f"CREATE VIEW public.v_{table_name} AS SELECT count(*) AS n FROM reports.{target}")
    before = table_facts(pg_conn, target, reader)
    with pg.connect(pg_dsn, autocommit=False) as snapshot_reader:
        snapshot_reader.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        snapshot_reader.execute(f"SELECT 1 FROM reports.{target} LIMIT 0")  # its snapshot is taken here

        assert run(monkeypatch, pg_dsn, lake_root, sql, target, "--param", "upto=30") == 0
        # The old complete result, never an empty or missing table, for the rest of its transaction.
        assert snapshot_reader.execute(f"SELECT count(*) FROM reports.{target}").fetchone()[0] == 10
    assert table_facts(pg_conn, target, reader) == before == (before[0], owner, True)
    assert pg_conn.execute(f"SELECT n FROM public.v_{table_name}").fetchone()[0] == 30
    assert pg_conn.execute(f"SELECT count(*), max(id) FROM reports.{target}").fetchone() == (30, 30)


def test_a_report_table_the_jobs_may_no_longer_write_is_refused_with_the_grant_to_give(
        spark, pg_dsn, pg_conn, table_name, lake_root, monkeypatch):
    make_table(pg_conn, table_name)
    target, owner = f"adhoc_{table_name}", f"owner_{table_name}"
    assert run(monkeypatch, pg_dsn, lake_root, UPTO.format(t=table_name), target, "--param", "upto=10") == 0
    pg_conn.execute(f"CREATE ROLE {owner}")
    pg_conn.execute(f"ALTER TABLE reports.{target} OWNER TO {owner}")
    for n, sql in enumerate([UPTO.format(t=table_name), UPTO.replace("id, v", "id").format(t=table_name)]):  # in place; replaced
        run_id = f"not-ours-{n}-{table_name}"
        assert run(monkeypatch, pg_dsn, lake_root, sql, target, "--param", "upto=30", "--run-id", run_id) == 2
        error = report_run(pg_conn, run_id)["error"]
        assert f"reports.{target} belongs to {owner}" in error and "nothing was written" in error, error
        assert ("GRANT SELECT, INSERT, DELETE ON" if n == 0 else "OWNER TO coldharbor_pipeline") in error, error
        assert pg_conn.execute(f"SELECT count(*), max(id) FROM reports.{target}").fetchone() == (10, 10)
    assert pg_conn.execute("SELECT count(*) FROM pg_tables WHERE schemaname = 'reports' "
                           "AND tablename LIKE '\\_ch\\_stage\\_%'").fetchone()[0] == 0


def test_changed_columns_replace_the_table_with_its_grants_unless_something_depends_on_it(
        spark, pg_dsn, pg_conn, table_name, lake_root, monkeypatch):
    make_table(pg_conn, table_name)
    target, reader = f"adhoc_{table_name}", f"reader_{table_name}"
    assert run(monkeypatch, pg_dsn, lake_root, f"SELECT id, v FROM {table_name}", target) == 0
    pg_conn.execute(f"CREATE ROLE {reader}")
    pg_conn.execute(f"GRANT SELECT ON reports.{target} TO {reader}")
    owner = table_facts(pg_conn, target, reader)[1]

    assert run(monkeypatch, pg_dsn, lake_root, f"SELECT id, v, id * 2 AS twice FROM {table_name}", target) == 0
    assert table_facts(pg_conn, target, reader)[1:] == (owner, True)
    assert pg_conn.execute(f"SELECT sum(twice) FROM reports.{target}").fetchone()[0] == 2 * sum(range(1, 51))

    pg_conn.execute(f"CREATE VIEW public.w_{table_name} AS SELECT twice FROM reports.{target}")
    run_id = f"narrowed-{table_name}"
    assert run(monkeypatch, pg_dsn, lake_root, f"SELECT id FROM {table_name} WHERE id < 5", target,
               "--run-id", run_id) == 2
    error = report_run(pg_conn, run_id)["error"]
    assert f"view w_{table_name} depends on table reports.{target}" in error
    assert "columns changed (id bigint, v text, twice bigint -> id bigint)" in error
    assert pg_conn.execute(f"SELECT count(*) FROM reports.{target}").fetchone()[0] == 50  # unchanged
    assert pg_conn.execute("SELECT count(*) FROM pg_tables WHERE schemaname = 'reports' "
                           "AND tablename LIKE '\\_ch\\_stage\\_%'").fetchone()[0] == 0
    assert pg_conn.execute(f"SELECT count(*) FROM public.w_{table_name}").fetchone()[0] == 50

"""Least privilege (invariant 14) from the jobs' side: the pipeline role evicts and purges without
logging and without suspending anyone else's capture, cannot reach beyond its role, a job lacking a
privilege refuses naming it, and migrations keep all of it for tables registered before and objects
created after."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import psycopg
import pytest
from coldharbor.capture import migrate, registry, roles
from coldharbor.maintenance import cleanup
from coldharbor.runtime import pg
from coldharbor.runtime.errors import PrivilegeError

from tests.helpers import PROJECT, dirty_ids, export, serve_report, single_directory_layout


def make(conn, name: str, hot_retention: str | None = None) -> registry.RegisteredTable:
    conn.execute(f"CREATE TABLE {name} (id int PRIMARY KEY, v text)")
    conn.execute("SELECT coldharbor.register_table(%s, p_hot_retention => %s::interval)", (name, hot_retention))
    conn.execute(f"INSERT INTO {name} SELECT g, 'v' || g FROM generate_series(1, 5) g")
    return registry.load(conn, name)[0]


def ops(conn, table_id: int) -> list[tuple]:
    return conn.execute("SELECT (key ->> 'id')::int, op FROM coldharbor.change_log WHERE table_id = %s ORDER BY id",
                        (table_id,)).fetchall()


def test_evict_as_the_pipeline_logs_nothing_and_suspends_only_its_own_delete(spark, pg_dsn, pg_conn, table_name,
                                                                             lake_root):
    table = make(pg_conn, table_name, "1 millisecond")
    export(spark, pg_dsn, table_name, lake_root)
    pg_conn.execute(f"INSERT INTO {table_name} VALUES (6, 'dirty')")            # not flushed: stays hot
    with pg.connect(pg_dsn) as pipeline:
        assert cleanup.evict(pipeline, table, dry_run=False) == 5
    assert pg_conn.execute(f"SELECT id FROM {table_name}").fetchall() == [(6,)]
    assert [op for _, op in ops(pg_conn, table.table_id)] == ["I"] * 6, "eviction logged nothing"

    export(spark, pg_dsn, table_name, lake_root)
    pg_conn.execute(f"INSERT INTO {table_name} VALUES (7, 'dirty')")
    with pg_conn.transaction():   # in the transaction that evicted, a later delete is captured again
        assert pg_conn.execute("SELECT coldharbor.evict(%s, clock_timestamp())", (table.table_id,)).fetchone()[0] == 1
        pg_conn.execute(f"DELETE FROM {table_name} WHERE id = 7")
    assert ops(pg_conn, table.table_id)[-2:] == [(7, "I"), (7, "D")]
    assert pg_conn.execute(f"SELECT count(*) FROM {table_name}").fetchone()[0] == 0
    assert pg_conn.execute("SELECT count(*) FROM coldharbor.capture_suspended").fetchone()[0] == 0


def test_purge_rows_deletes_only_rows_still_as_read(pg_dsn, pg_conn, table_name):
    table = make(pg_conn, table_name)
    with pg.connect(pg_dsn) as pipeline:
        images = [r[0] for r in pipeline.execute(f"SELECT to_jsonb(t)::text FROM {table_name} t WHERE id <= 2 "
                                                 "ORDER BY id")]
        pg_conn.execute(f"UPDATE {table_name} SET v = 'changed meanwhile' WHERE id = 1")
        deleted = pipeline.execute("SELECT coldharbor.purge_rows(%s, %s::jsonb)",
                                   (table.table_id, "[" + ",".join(images) + "]")).fetchall()
    assert deleted == [(2,)]
    assert [r[0] for r in pg_conn.execute(f"SELECT id FROM {table_name} ORDER BY id")] == [1, 3, 4, 5]
    assert ops(pg_conn, table.table_id)[5:] == [(1, "U")], "the purge's delete logged nothing"


@pytest.mark.parametrize("statement", [
    "ALTER ROLE coldharbor_pipeline SUPERUSER",
    "ALTER ROLE coldharbor_pipeline CREATEROLE",
    "SET ROLE coldharbor_owner",
    "CREATE FUNCTION coldharbor.mine() RETURNS int LANGUAGE sql AS 'SELECT 1'",
    "CREATE TABLE coldharbor.mine (x int)",
    "CREATE FUNCTION reports.mine() RETURNS int LANGUAGE sql AS 'SELECT 1'",
    "CREATE VIEW reports.mine AS SELECT 1 AS x",
    "SELECT count(*) FROM {secret}",
    "DELETE FROM {table}",
    "UPDATE coldharbor.tables SET lake_location = '/tmp/elsewhere'",
    "INSERT INTO coldharbor.change_log (table_id, key, op) SELECT table_id, '{{}}', 'D' FROM coldharbor.tables",
    "INSERT INTO coldharbor.capture_suspended SELECT pg_current_xact_id(), table_id FROM coldharbor.tables",
    "SELECT coldharbor.register_table('{table}')",
    "SELECT coldharbor.put_entity('x', '{{}}')",
    "SELECT coldharbor.install_capture(1)",
    "SELECT coldharbor.apply_privileges()",
])
def test_the_pipeline_cannot_reach_beyond_its_role(pg_dsn, pg_conn, table_name, statement):
    make(pg_conn, table_name)
    pg_conn.execute(f"CREATE TABLE {table_name}_secret (x int)")
    with pg.connect(pg_dsn) as pipeline, pytest.raises(psycopg.errors.InsufficientPrivilege):
        pipeline.execute(statement.format(table=f"public.{table_name}", secret=f"{table_name}_secret"))


def test_the_pipeline_writes_its_own_state_and_report_tables(pg_dsn, pg_conn, table_name):
    make(pg_conn, table_name)
    with pg.connect(pg_dsn) as pipeline:
        pipeline.execute("UPDATE coldharbor.tables SET last_batch_id = last_batch_id WHERE table_name = %s",
                         (table_name,))
        pipeline.execute(f"CREATE TABLE reports.{table_name} (x int)")
        pipeline.execute(f"ALTER TABLE reports.{table_name} RENAME TO {table_name}_swapped")
        pipeline.execute(f"DROP TABLE reports.{table_name}_swapped")


def run_entrypoint(job: str, dsn: str, *args: str) -> subprocess.CompletedProcess:
    """A job's entrypoint with plain Python: the privilege checks come before Spark starts."""
    return subprocess.run([sys.executable, str(PROJECT / "jobs" / job), *args],
                          env={"PATH": "/usr/bin:/bin", "COLDHARBOR_PG_DSN": dsn}, capture_output=True, text=True,
                          timeout=300)


@pytest.mark.parametrize("job, revoke, missing", [
    ("cdc_export.py", "REVOKE SELECT ON {t} FROM coldharbor_pipeline", "role coldharbor_pipeline lacks SELECT"),
    ("purge.py", "REVOKE DELETE ON {t} FROM coldharbor_owner", "role coldharbor_owner lacks DELETE"),
    ("cleanup.py", "REVOKE UPDATE (id) ON {t} FROM coldharbor_owner", "role coldharbor_owner lacks UPDATE"),
])
def test_a_job_lacking_a_privilege_refuses_naming_it_and_changes_nothing(spark, pg_dsn, pg_conn, table_name, lake_root,
                                                                         job, revoke, missing):
    table = make(pg_conn, table_name, "1 millisecond")
    pg_conn.execute(revoke.format(t=table_name))   # as a table registered before the grants existed
    args = {"cdc_export.py": ["--table", table_name],
            "purge.py": ["--table", table_name, "--where", "id = 1", "--vacuum-retention-hours", "200"],
            "cleanup.py": ["--table", table_name]}[job]
    done = run_entrypoint(job, pg_dsn, "--lake-root", lake_root, *args)
    assert done.returncode == 2, done.stderr
    [line] = [x for x in done.stderr.splitlines() if "failed:" in x]
    assert missing in line and f"SELECT coldharbor.register_table('public.{table_name}')" in line
    assert "Traceback" not in done.stderr
    assert len(dirty_ids(pg_conn, table_name)) == 5 and not Path(lake_root).exists()
    assert pg_conn.execute(f"SELECT count(*) FROM {table_name}").fetchone()[0] == 5
    assert pg_conn.execute("SELECT count(*) FROM coldharbor.maintenance_runs WHERE table_id = %s",
                           (table.table_id,)).fetchone()[0] == 0
    pg_conn.execute("SELECT coldharbor.register_table(%s, p_hot_retention => '1 millisecond')", (table_name,))
    assert export(spark, pg_dsn, table_name, lake_root).status == "exported"   # the way out the message gives


def test_a_report_over_a_table_the_pipeline_cannot_read_is_refused(spark, pg_dsn, pg_conn, table_name, lake_root,
                                                                   monkeypatch):
    make(pg_conn, table_name)
    pg_conn.execute(f"REVOKE SELECT ON {table_name} FROM coldharbor_pipeline")
    assert serve_report(monkeypatch, pg_dsn, lake_root, "--sql", f"SELECT * FROM {table_name}",
                        "--target", "adhoc_refused", "--run-id", f"refused-{table_name}") == 2
    error = pg_conn.execute("SELECT error FROM coldharbor.report_runs WHERE run_id = %s",
                            (f"refused-{table_name}",)).fetchone()[0]
    assert "role coldharbor_pipeline lacks SELECT" in error
    assert pg_conn.execute("SELECT to_regclass('reports.adhoc_refused')").fetchone()[0] is None
    pg_conn.execute("SELECT coldharbor.register_table(%s)", (table_name,))  # as it was, for later jobs over all tables


def owned_table_with_code(app_logins) -> tuple[str, str, psycopg.Connection]:
    """An application's registered table (and a partition of it), and a function of the application that,
    run as the schema owner, would copy the owner-only change log into a table anyone may write.
    (schema, table, the application's connection)."""
    schema, dsn = app_logins()
    app = pg.connect(dsn)
    app.execute(f"CREATE TABLE {schema}.loot (n bigint)")
    app.execute(f"GRANT INSERT ON {schema}.loot TO PUBLIC")
    app.execute(f"CREATE TABLE {schema}.t (part int, id int, PRIMARY KEY (part, id)) PARTITION BY LIST (part)")
    app.execute(f"CREATE TABLE {schema}.t_1 PARTITION OF {schema}.t FOR VALUES IN (1)")
    app.execute("SELECT coldharbor.register_table(%s, p_hot_retention => '1 millisecond')", (f"{schema}.t",))
    app.execute(f"INSERT INTO {schema}.t VALUES (1, 1), (1, 2)")
    app.execute(f"""CREATE FUNCTION {schema}.steal() RETURNS boolean LANGUAGE plpgsql AS $$
                    BEGIN INSERT INTO {schema}.loot SELECT count(*) FROM coldharbor.change_log; RETURN true; END $$""")
    app.execute(f"""CREATE FUNCTION {schema}.steal_on_delete() RETURNS trigger LANGUAGE plpgsql AS $$
                    BEGIN PERFORM {schema}.steal(); RETURN OLD; END $$""")
    return schema, f"{schema}.t", app


@pytest.mark.parametrize("code, job_says", [
    ("CREATE TRIGGER steal BEFORE DELETE ON {s}.t_1 FOR EACH ROW EXECUTE FUNCTION {s}.steal_on_delete()",
     "cannot evict from or purge {t}: trigger steal on {s}.t_1 runs on DELETE"),
    ("CREATE RULE steal AS ON DELETE TO {s}.t DO ALSO SELECT {s}.steal()",
     "cannot read {t}: {t} has a rule, which can route writes around capture"),
    ("ALTER TABLE {s}.t ENABLE ROW LEVEL SECURITY; CREATE POLICY steal ON {s}.t USING ({s}.steal())",
     "cannot read {t}: {t} has row-level security"),
])
def test_no_code_of_the_table_owner_runs_as_the_schema_owner(app_logins, pg_dsn, pg_conn, lake_root, code,
                                                            job_says):
    """Eviction and purge delete as the schema owner; a trigger, rule or policy of the table would run
    as whoever deletes. They refuse such a table (the job before it starts), TRUNCATE capture refuses
    one with row-level security, and the code never runs with the owner's privileges."""
    schema, name, app = owned_table_with_code(app_logins)
    with app:
        app.execute(code.format(s=schema))
        [table] = registry.load(pg_conn, name)
        with pg.connect(pg_dsn) as pipeline:
            for call in ("SELECT coldharbor.evict(%s, clock_timestamp())",
                         "SELECT coldharbor.purge_rows(%s, (SELECT jsonb_agg(to_jsonb(t)) FROM " + name + " t))"):
                with pytest.raises(psycopg.errors.InsufficientPrivilege, match=f"cannot evict from or purge {name}: "):
                    pipeline.execute(call, (table.table_id,))
        done = run_entrypoint("cleanup.py", pg_dsn, "--lake-root", lake_root, "--table", name)
        assert done.returncode == 2 and job_says.format(s=schema, t=name) in done.stderr, done.stderr
        if "ROW LEVEL SECURITY" in code:
            with pytest.raises(psycopg.errors.FeatureNotSupported, match="cannot capture TRUNCATE"):
                app.execute(f"TRUNCATE {name}")
        assert pg_conn.execute(f"SELECT count(*) FROM {schema}.loot").fetchone()[0] == 0
        assert pg_conn.execute(f"SELECT count(*) FROM {name}").fetchone()[0] == 2


@pytest.mark.parametrize("code, refusal", [
    ("ALTER TABLE {s}.t ENABLE ROW LEVEL SECURITY; CREATE POLICY steal ON {s}.t USING ({s}.steal())",
     "has row-level security"),
    ("DROP TABLE {s}.t; CREATE VIEW {s}.t AS SELECT 1 AS part, 1 AS id WHERE {s}.steal(); "
     "GRANT SELECT ON {s}.t TO coldharbor_pipeline", "is not a table"),
])
def test_the_pipeline_never_runs_code_of_the_table_owner(spark, app_logins, pg_dsn, pg_conn, lake_root, monkeypatch,
                                                         code, refusal):
    """A policy, or a view put under the registered name, would run the owner's code as the pipeline
    that reads it: export and reports refuse to read such a relation, under a lock that keeps it so."""
    schema, name, app = owned_table_with_code(app_logins)
    with app:
        app.execute(code.format(s=schema))
    done = run_entrypoint("cdc_export.py", pg_dsn, "--lake-root", lake_root, "--table", name)
    assert done.returncode == 2 and f"cannot read {name}: {name} {refusal}" in done.stderr, done.stderr
    assert serve_report(monkeypatch, pg_dsn, lake_root, "--sql", f"SELECT * FROM {name}", "--target",
                        "adhoc_never") == 2
    [table] = registry.load(pg_conn, name)
    with pg.connect(pg_dsn) as pipeline, pipeline.transaction():
        with pytest.raises(PrivilegeError, match=refusal):
            registry.guard_read(pipeline, table)
    assert pg_conn.execute(f"SELECT count(*) FROM {schema}.loot").fetchone()[0] == 0
    assert not Path(lake_root).exists()


def test_an_upgrade_secures_what_was_there_and_what_later_migrations_add(other_database, tmp_path):
    """A database made before roles existed (the single-directory layout up to 007), upgraded by that
    layout and then by today's: what it held is secured, and so is what a later migration and a later
    definition add."""
    with pg.connect(other_database) as conn:
        migrate.apply(conn, single_directory_layout(below="008"))
        conn.execute("CREATE TABLE public.old (id int PRIMARY KEY, v text)")
        conn.execute("SELECT coldharbor.register_table('public.old')")
        conn.execute("INSERT INTO public.old VALUES (1, 'a'), (2, 'b')")
        conn.execute("CREATE TABLE reports.old_report (x int)")
        migrate.apply(conn, single_directory_layout())
        today = migrate.discover()
        later_table = migrate.Migration("999_later.sql", "CREATE TABLE coldharbor.later_state (id int);\n")
        later_function = migrate.Migration(
            "999_later.sql", "CREATE OR REPLACE FUNCTION coldharbor.later() RETURNS int LANGUAGE sql AS 'SELECT 1';\n")
        migrate.apply(conn, migrate.Layout(today.migrations + (later_table,), today.definitions + (later_function,)))
        with conn.transaction():
            conn.execute("SET LOCAL coldharbor.evicting = 'on'")
            conn.execute("DELETE FROM public.old WHERE id = 1")
        assert conn.execute("SELECT op FROM coldharbor.change_log ORDER BY id").fetchall()[-1] == ("D",)
        assert conn.execute("""SELECT has_table_privilege(%(p)s, 'public.old', 'SELECT'),
                                      has_table_privilege(%(o)s, 'public.old', 'TRIGGER'), pg_get_userbyid(relowner)
                                 FROM pg_class WHERE oid = 'reports.old_report'::regclass""",
                            {"p": roles.PIPELINE, "o": roles.OWNER}).fetchone() == (True, True, roles.PIPELINE)
        assert conn.execute("""SELECT pg_get_userbyid(proowner), has_function_privilege('public', oid, 'EXECUTE'),
                                      has_function_privilege(%s, oid, 'EXECUTE')
                                 FROM pg_proc WHERE oid = 'coldharbor.later()'::regprocedure""",
                            (roles.PIPELINE,)).fetchone() == (roles.OWNER, False, True)
        assert conn.execute("SELECT has_table_privilege(%s, 'coldharbor.later_state', 'INSERT')",
                            (roles.PIPELINE,)).fetchone()[0]


def test_a_role_with_more_power_than_it_needs_is_refused_by_the_migration(other_database, admin_dsn):
    with pg.connect(admin_dsn) as admin:
        admin.execute("ALTER ROLE coldharbor_app CREATEDB")
        try:
            with pg.connect(other_database) as conn, pytest.raises(
                    migrate.MigrationFailedError,
                    match=r"migration \d{3}_\w+\.sql failed and was rolled back: role coldharbor_app exists with") as refused:
                migrate.apply(conn, migrate.discover())
            assert isinstance(refused.value.__cause__, psycopg.errors.InsufficientPrivilege)
        finally:
            admin.execute("ALTER ROLE coldharbor_app NOCREATEDB")
        with pg.connect(other_database) as conn:
            assert conn.execute("SELECT to_regclass('coldharbor.capture_suspended')").fetchone()[0] is None


def test_an_upgrade_captures_the_partitions_of_tables_registered_before(other_database):
    """Migration 013 of the single-directory layout on a database whose registered partitioned, tiered table
    holds rows, then today's layout: writes naming a partition are captured from then on, and the
    partitions carry the eviction guard."""
    with pg.connect(other_database) as conn:
        migrate.apply(conn, single_directory_layout(below="013"))
        conn.execute("CREATE TABLE public.old (k int, id int, v text, PRIMARY KEY (k, id)) PARTITION BY LIST (k)")
        conn.execute("CREATE TABLE public.old_1 PARTITION OF public.old FOR VALUES IN (1)")
        conn.execute("CREATE TABLE public.old_2 PARTITION OF public.old FOR VALUES IN (2) PARTITION BY LIST (id)")
        conn.execute("CREATE TABLE public.old_2_all PARTITION OF public.old_2 DEFAULT")
        conn.execute("INSERT INTO public.old VALUES (1, 1, 'a'), (2, 1, 'b'), (2, 2, 'c')")
        conn.execute("SELECT coldharbor.register_table('public.old', p_hot_retention => '1 day')")
        migrate.apply(conn, single_directory_layout())    # its own upgrade, then today's layout's
        migrate.apply(conn, migrate.discover())
        conn.execute("INSERT INTO public.old_1 VALUES (1, 2, 'd')")
        conn.execute("UPDATE public.old_2 SET v = 'e' WHERE id = 1")
        conn.execute("DELETE FROM public.old_2_all WHERE id = 2")
        conn.execute("TRUNCATE public.old_1")
        assert conn.execute("SELECT key, op FROM coldharbor.change_log ORDER BY id").fetchall() == [
            ({"k": 1, "id": 2}, "I"), ({"k": 2, "id": 1}, "U"), ({"k": 2, "id": 2}, "D"),
            ({"k": 1, "id": 1}, "D"), ({"k": 1, "id": 2}, "D")]
        assert conn.execute("""SELECT array_agg(tgrelid::regclass::text ORDER BY tgrelid::regclass::text) FROM pg_trigger
                                WHERE tgname = 'coldharbor_evict_guard'""").fetchone()[0] == [
            "old", "old_1", "old_2", "old_2_all"]


def test_an_upgrade_hashes_the_rows_before_changes_of_tables_with_exact_history(other_database):
    """Migration 024 of the single-directory layout, then today's layout, on a database with a table
    keeping exact history: its updates and deletes log
    the hash of the row before them from then on (the export chains images with it); a table with
    the default history logs none, as before."""
    with pg.connect(other_database) as conn:
        migrate.apply(conn, single_directory_layout(below="024"))
        for name, history in (("public.old", "exact"), ("public.plain", "latest")):
            conn.execute(f"CREATE TABLE {name} (id int PRIMARY KEY, v text NOT NULL)")
            conn.execute(f"INSERT INTO {name} VALUES (1, 'a')")
            conn.execute("SELECT coldharbor.register_table(%s, p_history => %s)", (name, history))
            conn.execute(f"UPDATE {name} SET v = 'b'")
        migrate.apply(conn, single_directory_layout())    # its own upgrade, then today's layout's
        migrate.apply(conn, migrate.discover())
        for name in ("public.old", "public.plain"):
            conn.execute(f"UPDATE {name} SET v = 'c'")
            conn.execute(f"DELETE FROM {name}")
        logged = conn.execute("SELECT t.table_name, c.op, c.old_hash FROM coldharbor.change_log c "
                              "JOIN coldharbor.tables t USING (table_id) ORDER BY c.id").fetchall()
        hash_of = dict(conn.execute("SELECT v, hash_record_extended(ROW(1, v), 0) FROM unnest(ARRAY['b', 'c']) v"))
        assert logged == [("old", "U", None), ("plain", "U", None), ("old", "U", hash_of["b"]),
                          ("old", "D", hash_of["c"]), ("plain", "U", None), ("plain", "D", None)]

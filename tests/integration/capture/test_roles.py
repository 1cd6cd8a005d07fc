"""Least privilege (invariant 14), attacked from an application's login: capture cannot be suspended,
internal functions and other tables are out of reach, registration is the table owner's alone, and
the table's owner cannot drop or disable its capture."""

from __future__ import annotations

import psycopg
import pytest
from coldharbor.capture import roles
from coldharbor.runtime import pg

APP_ENTRY_POINTS = {"register_table", "register_table_as_owner", "check_may_register", "grant_capture_privileges",
                    "set_freshness_as_owner", "set_mode_as_owner",
                    "set_history_as_owner", "put_entity", "delete_entity"}


@pytest.fixture()
def app(app_logins) -> tuple[str, psycopg.Connection]:
    """An application's connection and a table of its own, registered by it: (qualified name, connection)."""
    schema, dsn = app_logins()
    with pg.connect(dsn) as conn:
        conn.execute(f"CREATE TABLE {schema}.orders (id int PRIMARY KEY, v text)")
        conn.execute("SELECT coldharbor.register_table(%s)", (f"{schema}.orders",))
        conn.execute(f"INSERT INTO {schema}.orders SELECT g, 'v' || g FROM generate_series(1, 5) g")
        yield f"{schema}.orders", conn


def changes(admin: psycopg.Connection, name: str) -> list[tuple]:
    schema, table = name.split(".")
    return admin.execute("""SELECT c.key, c.op FROM coldharbor.change_log c JOIN coldharbor.tables t USING (table_id)
                            WHERE t.schema_name = %s AND t.table_name = %s ORDER BY c.id""", (schema, table)).fetchall()


def test_an_application_deletes_are_captured_whatever_it_sets(app, pg_conn):
    name, conn = app
    with conn.transaction():
        conn.execute("SET LOCAL coldharbor.evicting = 'on'")           # what suspended capture before
        for setting in ("coldharbor.purging", "coldharbor.capture", "coldharbor.suspended"):
            conn.execute(f"SET LOCAL {setting} = 'on'")
        with pytest.raises(psycopg.errors.InsufficientPrivilege), conn.transaction():
            conn.execute("SET LOCAL session_replication_role = replica")
        conn.execute(f"DELETE FROM {name} WHERE id <= 2")
    conn.execute(f"TRUNCATE {name}")
    assert [c for c in changes(pg_conn, name) if c[1] == "D"] == [({"id": i}, "D") for i in (1, 2, 3, 4, 5)]


def test_no_coldharbor_function_reads_a_session_setting(pg_conn):
    """Capture and its suspension depend on no setting a session can change. The readers allowed:
    registration's settle trigger reads transaction_isolation, and a session that changes it only
    keeps its table's initial load pending (the safe direction: the export then loads it); a rebase
    request's window start reads track_commit_timestamp, which only a server restart changes."""
    readers = pg_conn.execute("""SELECT proname FROM pg_proc WHERE pronamespace = 'coldharbor'::regnamespace
                                 AND (prosrc ILIKE '%current_setting%' OR prosrc ILIKE '%set_config%')
                                 ORDER BY proname""").fetchall()
    assert readers == [("oldest_dirty_change_at",), ("settle_load_at_registration",)]
    for function, setting in [("settle_load_at_registration", "transaction_isolation"),
                              ("oldest_dirty_change_at", "track_commit_timestamp")]:
        [source] = pg_conn.execute("SELECT prosrc FROM pg_proc WHERE proname = %s", (function,)).fetchone()
        assert source.count("current_setting") == 1 and f"current_setting('{setting}')" in source
    assert pg_conn.execute("SELECT context FROM pg_settings WHERE name = 'track_commit_timestamp'"
                           ).fetchone()[0] == "postmaster"


def test_an_application_cannot_write_the_suspension_table_or_read_the_schema(app, pg_conn):
    name, conn = app
    for statement in ("INSERT INTO coldharbor.capture_suspended "
                      "SELECT pg_current_xact_id(), table_id FROM coldharbor.tables",
                      "SELECT count(*) FROM coldharbor.change_log",
                      "SELECT count(*) FROM coldharbor.tables",
                      "SELECT count(*) FROM coldharbor.entity_main",
                      "UPDATE coldharbor.change_log SET flushed_at = now()"):
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute(statement)


@pytest.mark.parametrize("call", [
    "coldharbor.evict({tid}, now() + interval '1 day')",
    "coldharbor.purge_rows({tid}, '[]')",
    "coldharbor.install_capture({tid})",
    "coldharbor.capture_is_suspended({tid})",
    "coldharbor.entity_log('D', ARRAY[gen_random_uuid()], ARRAY[1])",
    "coldharbor.register_table_unchecked('{name}', NULL, '{{}}', '{{}}', NULL)",
    "coldharbor.define_entity_schema('x', '{{}}')",
    "coldharbor.register_entity_schema('x')",
    "coldharbor.apply_privileges()",
    "coldharbor.entity_flatten_sql('x')",
])
def test_an_application_cannot_call_internal_functions(app, pg_conn, call):
    name, conn = app
    [tid] = pg_conn.execute("SELECT table_id FROM coldharbor.tables WHERE schema_name || '.' || table_name = %s",
                            (name,)).fetchone()
    with pytest.raises(psycopg.errors.InsufficientPrivilege, match="permission denied for function"):
        conn.execute(f"SELECT {call.format(tid=tid, name=name)}")


def test_nobody_but_the_owner_executes_a_capture_trigger_function(app, pg_conn):
    name, _ = app
    [tid] = pg_conn.execute("SELECT table_id FROM coldharbor.tables WHERE schema_name || '.' || table_name = %s",
                            (name,)).fetchone()
    for kind in ("ins", "upd", "del", "trunc"):
        for role in (roles.PIPELINE, roles.APP, "public"):
            assert not pg_conn.execute("SELECT has_function_privilege(%s, %s, 'EXECUTE')",
                                       (role, f"coldharbor.capture_{tid}_{kind}()")).fetchone()[0], (kind, role)


def test_functions_have_no_public_execute_and_run_as_the_owner_with_a_fixed_search_path(pg_conn):
    rows = pg_conn.execute("""
        SELECT p.proname, pg_get_userbyid(p.proowner), p.prosecdef, coalesce(p.proconfig, '{}'),
               has_function_privilege('public', p.oid, 'EXECUTE'),
               has_function_privilege('coldharbor_app', p.oid, 'EXECUTE')
          FROM pg_proc p WHERE p.pronamespace = 'coldharbor'::regnamespace""").fetchall()
    assert rows
    for name, owner, definer, config, public, app_may in rows:
        assert owner == roles.OWNER, name
        assert not public, f"{name} keeps PUBLIC EXECUTE"
        assert app_may == (name in APP_ENTRY_POINTS), name
        if definer:
            assert "search_path=pg_catalog, pg_temp" in config, name


def test_an_application_cannot_register_a_table_it_does_not_own(app, app_logins, pg_conn, table_name):
    owner = app[0].split(".")[0]
    pg_conn.execute(f"CREATE TABLE public.{table_name} (id int PRIMARY KEY)")
    pg_conn.execute(f"ALTER TABLE public.{table_name} OWNER TO {owner}")   # another application's table
    victim = f"public.{table_name}"
    _, other_dsn = app_logins()
    with pg.connect(other_dsn) as other:
        for call in ("coldharbor.register_table(%s)", "coldharbor.register_table(%s, p_history => 'exact')",
                     "coldharbor.register_table_as_owner(%s, NULL, '{}', '{}', NULL)",
                     "coldharbor.set_history_as_owner(%s, 'exact')"):
            with pytest.raises(psycopg.errors.InsufficientPrivilege,
                               match=f"cannot register {victim}: role app_.* does not own it .its owner is {owner}"):
                other.execute(f"SELECT {call}", (victim,))
    assert pg_conn.execute("SELECT count(*) FROM coldharbor.tables WHERE table_name = %s",
                           (table_name,)).fetchone()[0] == 0
    assert not pg_conn.execute("SELECT has_table_privilege(%s, %s, 'SELECT')", (roles.PIPELINE, victim)).fetchone()[0]


def test_an_application_keeps_exact_history_of_its_own_table(app, pg_conn):
    name, conn = app
    conn.execute("SELECT coldharbor.register_table(%s, p_history => 'exact')", (name,))
    conn.execute(f"UPDATE {name} SET v = 'changed' WHERE id = 1")
    assert pg_conn.execute("""SELECT c.image::text FROM coldharbor.change_log c JOIN coldharbor.tables t USING (table_id)
                              WHERE t.schema_name || '.' || t.table_name = %s ORDER BY c.id DESC LIMIT 1""",
                           (name,)).fetchone()[0] == '{"id":1,"v":"changed"}'


def test_registering_grants_the_pipeline_read_access_and_only_an_admin_picks_a_lake_location(app, pg_conn):
    name, conn = app
    assert pg_conn.execute("SELECT has_table_privilege(%s, %s, 'SELECT'), has_table_privilege(%s, %s, 'DELETE')",
                           (roles.PIPELINE, name, roles.PIPELINE, name)).fetchone() == (True, False)
    with pytest.raises(psycopg.errors.InsufficientPrivilege,
                       match="only an administrator may choose its lake location"):
        conn.execute("SELECT coldharbor.register_table(%s, p_lake_location => 's3a://lake/public/demo_orders')",
                     (name,))
    pg_conn.execute("SELECT coldharbor.register_table(%s, p_lake_location => 's3a://lake/apps/orders')", (name,))
    conn.execute("SELECT coldharbor.register_table(%s, p_lake_location => 's3a://lake/apps/orders')", (name,))


@pytest.mark.parametrize("ddl, refused", [
    ("ALTER TABLE {t} DISABLE TRIGGER coldharbor_capture_del", "cannot disable trigger coldharbor_capture_del"),
    ("ALTER TABLE {t} DISABLE TRIGGER ALL", "cannot disable trigger"),
    ("ALTER TABLE {t} ENABLE REPLICA TRIGGER coldharbor_capture_ins", "cannot disable trigger coldharbor_capture_ins"),
    ("DROP TRIGGER coldharbor_capture_del ON {t}", "cannot drop trigger coldharbor_capture_del"),
    ("ALTER TRIGGER coldharbor_capture_del ON {t} RENAME TO gone", "cannot change trigger gone"),
    ("CREATE OR REPLACE TRIGGER coldharbor_capture_del AFTER DELETE ON {t} FOR EACH STATEMENT "
     "EXECUTE FUNCTION {s}.nothing()", "cannot change trigger coldharbor_capture_del"),
    ("ALTER TABLE {t} RENAME TO elsewhere", "cannot rename or move table {t}"),
])
def test_the_table_owner_cannot_stop_its_capture(app, pg_conn, ddl, refused):
    name, conn = app
    schema = name.split(".")[0]
    conn.execute(f"CREATE FUNCTION {schema}.nothing() RETURNS trigger LANGUAGE plpgsql AS 'BEGIN RETURN NULL; END'")
    with pytest.raises(psycopg.errors.InsufficientPrivilege, match=refused.format(t=name)):
        conn.execute(ddl.format(t=name, s=schema))
    conn.execute(f"DELETE FROM {name} WHERE id = 1")
    assert changes(pg_conn, name)[-1] == ({"id": 1}, "D")


def test_the_table_owner_still_alters_and_drops_its_table(app, pg_conn):
    name, conn = app
    conn.execute(f"ALTER TABLE {name} ADD COLUMN note text")
    conn.execute(f"CREATE INDEX ON {name} (v)")
    conn.execute(f"DELETE FROM {name} WHERE id = 2")
    assert changes(pg_conn, name)[-1] == ({"id": 2}, "D")
    conn.execute(f"DROP TABLE {name}")


def test_a_partitioned_table_registers_and_captures(app_logins, pg_conn):
    schema, dsn = app_logins()
    with pg.connect(dsn) as conn:
        conn.execute(f"CREATE TABLE {schema}.events (day date, id int, PRIMARY KEY (day, id)) PARTITION BY RANGE (day)")
        conn.execute(f"CREATE TABLE {schema}.events_2026 PARTITION OF {schema}.events "
                     "FOR VALUES FROM ('2026-01-01') TO ('2027-01-01')")
        conn.execute("SELECT coldharbor.register_table(%s, p_partition_by => '{day}')", (f"{schema}.events",))
        conn.execute(f"INSERT INTO {schema}.events VALUES ('2026-03-01', 1)")
        conn.execute(f"DELETE FROM {schema}.events")
    assert [op for _, op in changes(pg_conn, f"{schema}.events")] == ["I", "D"]


def test_an_application_writes_entities_only_through_the_helpers(app_logins, entity, pg_conn):
    _, dsn = app_logins()
    with pg.connect(dsn) as conn:
        row_id = conn.execute("SELECT coldharbor.put_entity(%s, '{\"name\": \"Ann\"}')", (entity,)).fetchone()[0]
        assert conn.execute(f"SELECT name FROM entities.{entity} WHERE row_id = %s", (row_id,)).fetchone() == ("Ann",)
        for statement in ("DELETE FROM coldharbor.entity_main", "UPDATE coldharbor.eav_data SET value_text = 'x'",
                          f"DELETE FROM entities.{entity}"):
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute(statement)
        assert conn.execute("SELECT coldharbor.delete_entity(%s)", (row_id,)).fetchone()[0] is True
    [table_id] = pg_conn.execute("SELECT table_id FROM coldharbor.tables WHERE schema_name = 'entities' "
                                 "AND table_name = %s", (entity,)).fetchone()
    assert pg_conn.execute("SELECT op FROM coldharbor.change_log WHERE table_id = %s AND key = %s ORDER BY id",
                           (table_id, psycopg.types.json.Jsonb({"row_id": str(row_id)}))).fetchall() == [("I",), ("D",)]


@pytest.fixture()
def tiered(app_logins) -> tuple[str, psycopg.Connection]:
    """An application's tiered, partitioned table holding rows, registered by it: (qualified name, connection)."""
    schema, dsn = app_logins()
    with pg.connect(dsn) as conn:
        conn.execute(f"CREATE TABLE {schema}.events (k int, id int, v text, PRIMARY KEY (k, id)) PARTITION BY LIST (k)")
        conn.execute(f"CREATE TABLE {schema}.events_1 PARTITION OF {schema}.events FOR VALUES IN (1)")
        conn.execute(f"CREATE TABLE {schema}.events_2 PARTITION OF {schema}.events FOR VALUES IN (2) PARTITION BY LIST (id)")
        conn.execute(f"CREATE TABLE {schema}.events_2_all PARTITION OF {schema}.events_2 DEFAULT")
        conn.execute(f"INSERT INTO {schema}.events VALUES (1, 1, 'a'), (2, 1, 'b')")
        conn.execute("SELECT coldharbor.register_table(%s, p_hot_retention => '1 day')", (f"{schema}.events",))
        conn.execute(f"CREATE FUNCTION {schema}.nothing() RETURNS trigger LANGUAGE plpgsql AS 'BEGIN RETURN NULL; END'")
        yield f"{schema}.events", conn


@pytest.mark.parametrize("ddl, refused", [
    ("DROP TRIGGER coldharbor_evict_guard ON {t}", "cannot drop trigger coldharbor_evict_guard on {t}"),
    ("ALTER TABLE {t} DISABLE TRIGGER coldharbor_evict_guard", "cannot disable trigger coldharbor_evict_guard on {t}"),
    ("ALTER TABLE {t} ENABLE REPLICA TRIGGER coldharbor_evict_guard", "cannot disable trigger coldharbor_evict_guard"),
    ("ALTER TRIGGER coldharbor_evict_guard ON {t} RENAME TO gone", "cannot change trigger gone on {t}"),
    ("CREATE OR REPLACE TRIGGER coldharbor_evict_guard BEFORE UPDATE OR DELETE ON {t} FOR EACH STATEMENT "
     "EXECUTE FUNCTION {s}.nothing()", "cannot change trigger coldharbor_evict_guard on {t}"),
    ("DROP TRIGGER coldharbor_evict_guard ON {t}_2_all", "cannot drop trigger coldharbor_evict_guard on {t}_2_all"),
    ("ALTER TABLE {t}_1 DISABLE TRIGGER ALL", "cannot disable trigger"),
    ("DROP TRIGGER coldharbor_capture_del ON {t}_2", "cannot drop trigger coldharbor_capture_del on {t}_2"),
    ("ALTER TABLE {t}_2_all DISABLE TRIGGER coldharbor_capture_upd", "cannot disable trigger coldharbor_capture_upd"),
    ("CREATE OR REPLACE TRIGGER coldharbor_capture_ins AFTER INSERT ON {t}_1 FOR EACH STATEMENT "
     "EXECUTE FUNCTION {s}.nothing()", "cannot change trigger coldharbor_capture_ins on {t}_1"),
    ("DROP TABLE {t}_2_all", "cannot drop table {t}_2_all: it is a partition of {t}"),
])
def test_the_table_owner_cannot_stop_the_eviction_guard_or_the_capture_of_a_partition(tiered, pg_conn, ddl, refused):
    name, conn = tiered
    with pytest.raises(psycopg.errors.InsufficientPrivilege, match=refused.format(t=name)):
        conn.execute(ddl.format(t=name, s=name.split(".")[0]))
    guards = pg_conn.execute("""SELECT tgrelid::regclass::text, tgenabled FROM pg_trigger
                                 WHERE tgname = 'coldharbor_evict_guard' AND tgfoid = 'coldharbor.evict_guard'::regproc
                                   AND tgrelid::regclass::text LIKE %s ORDER BY 1""", (name + "%",)).fetchall()
    assert guards == [(name, "O"), (f"{name}_1", "O"), (f"{name}_2", "O"), (f"{name}_2_all", "O")]
    conn.execute(f"DELETE FROM {name}_2_all WHERE id = 1")
    conn.execute(f"TRUNCATE {name}_1")
    assert changes(pg_conn, name)[-2:] == [({"k": 2, "id": 1}, "D"), ({"k": 1, "id": 1}, "D")]


def test_the_owner_takes_a_tables_hot_retention_away_by_registering_it_again(tiered, pg_conn):
    """Registering again without a retention leaves the eviction guard inert (the schema owner may create
    triggers on the table, not drop them); the table's owner may then drop it."""
    name, conn = tiered
    conn.execute("SELECT coldharbor.register_table(%s)", (name,))
    assert {r[0] for r in pg_conn.execute("""SELECT tgfoid::regproc::text FROM pg_trigger
                                             WHERE tgname = 'coldharbor_evict_guard'
                                               AND tgrelid::regclass::text LIKE %s""", (name + "%",))} == {
        "coldharbor.capture_off"}
    conn.execute(f"DROP TRIGGER coldharbor_evict_guard ON {name}_1")
    conn.execute(f"UPDATE {name} SET v = 'changed'")
    assert [op for _, op in changes(pg_conn, name)[-2:]] == ["U", "U"]

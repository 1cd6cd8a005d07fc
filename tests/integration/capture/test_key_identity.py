"""Key identity is canonical (invariant 15): the same key is one key in capture, export, reports,
eviction and purge, whichever session settings wrote it. Every accepted key type, and composite
keys, are written by an application session in one set of settings and changed by another."""

from __future__ import annotations

from datetime import timedelta

import psycopg
import pytest
from coldharbor.capture import registry
from coldharbor.maintenance.purge import PurgeConfig, purge
from coldharbor.runtime import pg

from tests.helpers import export, lake_live, pg_rows, serve_report

# Two application sessions that render keys as differently as settings allow.
SESSION_A = {"TimeZone": "UTC", "bytea_output": "hex", "DateStyle": "ISO, MDY", "IntervalStyle": "postgres",
             "extra_float_digits": "1"}
SESSION_B = {"TimeZone": "Pacific/Chatham", "bytea_output": "escape", "DateStyle": "SQL, DMY",
             "IntervalStyle": "sql_standard", "extra_float_digits": "-15", "lc_monetary": "C"}

# key columns (name, type) and one key's values as SQL literals
KEYS = {
    "smallint": ([("k", "smallint")], ["7"]),
    "integer": ([("k", "integer")], ["7"]),
    "bigint": ([("k", "bigint")], ["7000000000"]),
    "numeric": ([("k", "numeric(9,3)")], ["12.5"]),
    "boolean": ([("k", "boolean")], ["true"]),
    "text": ([("k", "text")], ["'ké y'"]),
    "varchar": ([("k", "varchar(12)")], ["'ké y'"]),
    "char": ([("k", "char(6)")], ["'ab'"]),
    "date": ([("k", "date")], ["'2026-03-01'"]),
    "timestamp": ([("k", "timestamp")], ["'2026-03-01 10:00:00.123456'"]),
    "timestamptz": ([("k", "timestamptz")], ["'2026-03-01 10:00:00.123456+00'"]),
    "uuid": ([("k", "uuid")], ["'6F9619FF-8B86-D011-B42D-00C04FC964FF'"]),
    "bytea": ([("k", "bytea")], ["'\\x00ff5c41'"]),
    "composite": ([("at", "timestamptz"), ("raw", "bytea"), ("id", "uuid"), ("n", "numeric(6,2)")],
                  ["'2026-03-01 23:30:00+00'", "'\\x5c7830'", "'6f9619ff-8b86-d011-b42d-00c04fc964ff'", "1.5"]),
}


def app_session(dsn: str, settings: dict[str, str]) -> psycopg.Connection:
    """An application's connection (not the jobs': they pin their own settings) with `settings`."""
    conn = psycopg.connect(dsn, autocommit=True)
    for name, value in settings.items():
        conn.execute(f"SET {name} = '{value}'")
    return conn


def key_texts(conn, table_id: int) -> set[str]:
    return {r[0] for r in conn.execute("SELECT key::text FROM coldharbor.change_log WHERE table_id = %s",
                                       (table_id,))}


def report(monkeypatch, pg_dsn, pg_conn, lake_root, name: str, run: str) -> list[tuple]:
    assert serve_report(monkeypatch, pg_dsn, lake_root, "--sql", f"SELECT * FROM {name}",
                        "--target", f"adhoc_{name}", "--run-id", f"{name}-{run}") == 0
    return pg_conn.execute(f"SELECT v, count(*) FROM reports.adhoc_{name} GROUP BY v ORDER BY v").fetchall()


@pytest.mark.parametrize("kind", sorted(KEYS))
def test_a_key_is_one_key_whatever_the_session_settings(
        spark, pg_dsn, admin_dsn, pg_conn, table_name, lake_root, monkeypatch, kind):
    columns, values = KEYS[kind]
    names = [c for c, _ in columns]
    where = " AND ".join(f"{c} = {v}" for c, v in zip(names, values))
    pg_conn.execute(f"CREATE TABLE {table_name} ({', '.join(f'{c} {t}' for c, t in columns)}, v text, "
                    f"PRIMARY KEY ({', '.join(names)}))")
    pg_conn.execute("SELECT coldharbor.register_table(%s, p_hot_retention => '1 hour')", (table_name,))
    [table] = registry.load(pg_conn, table_name)
    with app_session(admin_dsn, SESSION_A) as a, app_session(admin_dsn, SESSION_B) as b:
        # Capture: written in A, changed in B, then in A again: one key text.
        a.execute(f"INSERT INTO {table_name} VALUES ({', '.join(values)}, 'a1')")
        b.execute(f"UPDATE {table_name} SET v = 'b1' WHERE {where}")
        assert len(key_texts(pg_conn, table.table_id)) == 1

        # Export: one lake row for the key.
        export(spark, pg_dsn, table_name, lake_root)
        assert [r["v"] for r in lake_live(spark, lake_root, table_name, names).values()] == ["b1"]

        # Report: changed in both sessions since the export, the key is one dirty key, one row.
        a.execute(f"UPDATE {table_name} SET v = 'a2' WHERE {where}")
        b.execute(f"UPDATE {table_name} SET v = 'b2' WHERE {where}")
        assert len(key_texts(pg_conn, table.table_id)) == 1
        assert report(monkeypatch, pg_dsn, pg_conn, lake_root, table_name, "1") == [("b2", 1)]

        # Eviction: flushed and old, but changed since in B: eviction (run in A's settings) keeps it.
        export(spark, pg_dsn, table_name, lake_root)
        pg_conn.execute("""UPDATE coldharbor.change_log SET created_at = created_at - interval '2 hours',
                                  flushed_at = flushed_at - interval '2 hours' WHERE table_id = %s""",
                        (table.table_id,))
        b.execute(f"UPDATE {table_name} SET v = 'b3' WHERE {where}")
        assert a.execute("SELECT coldharbor.evict(%s, now())", (table.table_id,)).fetchone()[0] == 0
        export(spark, pg_dsn, table_name, lake_root)
        pg_conn.execute("""UPDATE coldharbor.change_log SET created_at = created_at - interval '2 hours',
                                  flushed_at = flushed_at - interval '2 hours' WHERE table_id = %s""",
                        (table.table_id,))
        assert b.execute("SELECT coldharbor.evict(%s, now())", (table.table_id,)).fetchone()[0] == 1
        assert report(monkeypatch, pg_dsn, pg_conn, lake_root, table_name, "2") == [("b3", 1)]

        # Purge (the job's own session): the key's change rows go with it, whatever wrote them.
        b.execute(f"INSERT INTO {table_name} VALUES ({', '.join(values)}, 'b4')")   # back, in B's settings
        a.execute(f"UPDATE {table_name} SET v = 'a4' WHERE {where}")
    with pg.connect(pg_dsn) as conn:
        result = purge(spark, conn, table, PurgeConfig(table_name, "v = 'a4'", lake_root, f"p-{table_name}",
                                                       timedelta(0), allow_short_retention=True))
    assert result.complete, result.remaining
    assert key_texts(pg_conn, table.table_id) == set()
    assert pg_rows(pg_conn, f"SELECT * FROM {table_name}", names) == {}
    assert lake_live(spark, lake_root, table_name, names) == {}


@pytest.mark.parametrize("key_type", ["real", "double precision", "jsonb"])
def test_key_types_without_a_canonical_identity_are_refused_at_registration(pg_conn, table_name, key_type):
    pg_conn.execute(f"CREATE TABLE {table_name} (k {key_type} PRIMARY KEY, v text)")
    with pytest.raises(psycopg.errors.FeatureNotSupported) as refused:
        pg_conn.execute("SELECT coldharbor.register_table(%s)", (table_name,))
    assert str(refused.value).splitlines()[0] == (
        f"cannot register public.{table_name}: key column k has type {key_type}, "
        "whose values have no canonical identity")
    assert pg_conn.execute("SELECT count(*) FROM coldharbor.tables WHERE table_name = %s",
                           (table_name,)).fetchone()[0] == 0

"""A write racing an eviction is refused with a serialization failure, never lost silently; after
eviction an UPDATE of the evicted key changes nothing and an INSERT of it writes a new version."""

from __future__ import annotations

import threading
import time

import psycopg
import pytest
from coldharbor.capture import registry

from tests.helpers import export, pg_rows, serve_report

BLOCKED_WAIT_S = 120  # how long the test waits for the writer to block before giving up (never asserted)


def wait_until_blocked(conn, pid: int) -> None:
    """Until the backend `pid` waits on a lock (a bounded poll, not a timing assertion)."""
    deadline = time.monotonic() + BLOCKED_WAIT_S
    while conn.execute("SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s", (pid,)).fetchone()[0] != "Lock":
        assert time.monotonic() < deadline, "the writer never blocked on the eviction"
        time.sleep(0.05)


def write_while_evicting(admin_conn, evicting, writer, statement: str) -> dict[str, object]:
    """Runs `statement` on `writer` while `evicting` holds an uncommitted eviction, commits the eviction
    once the writer waits on it, and returns what the write did: {"rows": n} or {"error": exc}."""
    outcome: dict[str, object] = {}

    def write_row() -> None:
        try:
            outcome["rows"] = writer.execute(statement).rowcount
        except psycopg.Error as exc:
            outcome["error"] = exc

    thread = threading.Thread(target=write_row)
    thread.start()
    wait_until_blocked(admin_conn, writer.info.backend_pid)
    evicting.commit()
    thread.join()
    return outcome


@pytest.mark.parametrize("write", ["UPDATE {t} SET v = 'late' WHERE id = 1", "DELETE FROM {t} WHERE id = 1"])
def test_a_write_blocked_by_an_eviction_fails_with_a_serialization_failure(
        spark, pg_dsn, admin_dsn, pg_conn, table_name, lake_root, monkeypatch, write):
    pg_conn.execute(f"CREATE TABLE {table_name} (id bigint PRIMARY KEY, v text)")
    pg_conn.execute("SELECT coldharbor.register_table(%s, p_hot_retention => '1 hour')", (table_name,))
    [table] = registry.load(pg_conn, table_name)
    pg_conn.execute(f"INSERT INTO {table_name} VALUES (1, 'old'), (2, 'kept')")
    export(spark, pg_dsn, table_name, lake_root)
    pg_conn.execute("""UPDATE coldharbor.change_log SET created_at = created_at - interval '2 hours',
                              flushed_at = flushed_at - interval '2 hours' WHERE table_id = %s""", (table.table_id,))
    changes = pg_conn.execute("SELECT count(*) FROM coldharbor.change_log").fetchone()[0]

    with psycopg.connect(pg_dsn) as evicting, psycopg.connect(admin_dsn, autocommit=True) as writer:
        assert evicting.execute("SELECT coldharbor.evict(%s, now())", (table.table_id,)).fetchone()[0] == 2
        outcome = write_while_evicting(pg_conn, evicting, writer, write.format(t=table_name))
        assert isinstance(outcome.get("error"), psycopg.errors.SerializationFailure), outcome
        assert str(outcome["error"]).startswith(f"could not {write.split()[0].lower()} public.{table_name}: "
                                                "rows of it were evicted from the hot tier")
        # The retry sees the row gone from the hot tier: it changes nothing and logs nothing.
        assert writer.execute(write.format(t=table_name)).rowcount == 0
        assert pg_conn.execute("SELECT count(*) FROM coldharbor.change_log").fetchone()[0] == changes
        # A write that did not race an eviction goes through as ever.
        writer.execute(f"INSERT INTO {table_name} VALUES (1, 'new')")
        writer.execute(f"UPDATE {table_name} SET v = 'newer' WHERE id = 1")

    assert serve_report(monkeypatch, pg_dsn, lake_root, "--sql", f"SELECT * FROM {table_name}",
                        "--target", f"adhoc_{table_name}", "--run-id", f"{table_name}-race") == 0
    assert pg_rows(pg_conn, f"SELECT * FROM reports.adhoc_{table_name}", ["id"]) == {
        (1,): {"id": 1, "v": "newer"}, (2,): {"id": 2, "v": "kept"}}


def test_an_eviction_waits_for_a_writers_transaction(pg_dsn, admin_dsn, pg_conn, table_name):
    """A writer's open transaction keeps eviction out of its table until it ends: eviction evicts
    nothing this run rather than delete under it."""
    pg_conn.execute(f"CREATE TABLE {table_name} (id bigint PRIMARY KEY, v text)")
    pg_conn.execute("SELECT coldharbor.register_table(%s, p_hot_retention => '1 hour')", (table_name,))
    [table] = registry.load(pg_conn, table_name)
    pg_conn.execute(f"INSERT INTO {table_name} VALUES (1, 'a')")
    pg_conn.execute("UPDATE coldharbor.change_log SET flushed_at = now() - interval '2 hours', "
                    "created_at = now() - interval '2 hours' WHERE table_id = %s", (table.table_id,))
    with psycopg.connect(admin_dsn) as writer, psycopg.connect(pg_dsn) as evicting:
        writer.execute(f"UPDATE {table_name} SET v = v WHERE id = 2")   # another key: the transaction stays open
        assert evicting.execute("SELECT coldharbor.evict(%s, now())", (table.table_id,)).fetchone()[0] == 0
        writer.commit()
        evicting.commit()
        assert evicting.execute("SELECT coldharbor.evict(%s, now())", (table.table_id,)).fetchone()[0] == 1


PARTITIONED = """CREATE TABLE {t} (k int, id bigint, v text, PRIMARY KEY (k, id)) PARTITION BY LIST (k);
                 CREATE TABLE {t}_1 PARTITION OF {t} FOR VALUES IN (1);
                 CREATE TABLE {t}_2 PARTITION OF {t} FOR VALUES IN (2) PARTITION BY RANGE (id);
                 CREATE TABLE {t}_2_low PARTITION OF {t}_2 FOR VALUES FROM (0) TO (100)"""


def age_changes(conn, table_id: int) -> None:
    """Makes every change of the table look made and flushed two hours ago (past a 1 hour retention)."""
    conn.execute("""UPDATE coldharbor.change_log SET created_at = created_at - interval '2 hours',
                           flushed_at = flushed_at - interval '2 hours' WHERE table_id = %s""", (table_id,))


@pytest.mark.parametrize("write", ["UPDATE {t}_2_low SET v = 'late' WHERE id = 1", "DELETE FROM {t}_2 WHERE id = 1"])
def test_a_write_to_a_partition_blocked_by_an_eviction_fails_with_a_serialization_failure(
        spark, pg_dsn, admin_dsn, pg_conn, table_name, lake_root, monkeypatch, write):
    """The eviction guard is on every partition: a write naming one is refused like a write naming the table."""
    pg_conn.execute(PARTITIONED.format(t=table_name))
    pg_conn.execute(f"INSERT INTO {table_name} VALUES (1, 1, 'held'), (2, 1, 'old'), (2, 2, 'kept')")
    pg_conn.execute("SELECT coldharbor.register_table(%s, p_hot_retention => '1 hour')", (table_name,))
    [table] = registry.load(pg_conn, table_name)
    export(spark, pg_dsn, table_name, lake_root)                      # the initial load
    pg_conn.execute(f"UPDATE {table_name} SET v = v")                 # every key now has flushed changes
    export(spark, pg_dsn, table_name, lake_root)
    age_changes(pg_conn, table.table_id)

    with psycopg.connect(pg_dsn) as evicting, psycopg.connect(admin_dsn, autocommit=True) as writer:
        assert evicting.execute("SELECT coldharbor.evict(%s, now())", (table.table_id,)).fetchone()[0] == 3
        outcome = write_while_evicting(pg_conn, evicting, writer, write.format(t=table_name))
        assert isinstance(outcome.get("error"), psycopg.errors.SerializationFailure), outcome
        writer.execute(f"INSERT INTO {table_name}_2_low VALUES (2, 1, 'new')")

    assert serve_report(monkeypatch, pg_dsn, lake_root, "--sql", f"SELECT * FROM {table_name}",
                        "--target", f"adhoc_{table_name}", "--run-id", f"{table_name}-race") == 0
    assert pg_rows(pg_conn, f"SELECT * FROM reports.adhoc_{table_name}", ["k", "id"]) == {
        (1, 1): {"k": 1, "id": 1, "v": "held"}, (2, 1): {"k": 2, "id": 1, "v": "new"},
        (2, 2): {"k": 2, "id": 2, "v": "kept"}}


def test_an_eviction_from_a_partitioned_table_deletes_its_candidates_only(pg_dsn, pg_conn, table_name):
    """Rows of different partitions share ctids: a row never changed since registration (its key has
    no change logged), at the ctid of a candidate in another partition, stays."""
    pg_conn.execute(PARTITIONED.format(t=table_name))
    pg_conn.execute(f"INSERT INTO {table_name} VALUES (2, 1, 'held since before registration')")
    pg_conn.execute("SELECT coldharbor.register_table(%s, p_hot_retention => '1 hour')", (table_name,))
    [table] = registry.load(pg_conn, table_name)
    pg_conn.execute(f"INSERT INTO {table_name} VALUES (1, 1, 'old, flushed')")
    pg_conn.execute("UPDATE coldharbor.change_log SET flushed_at = now() WHERE table_id = %s", (table.table_id,))
    age_changes(pg_conn, table.table_id)
    assert pg_conn.execute(f"SELECT count(DISTINCT ctid) FROM {table_name}").fetchone()[0] == 1
    with psycopg.connect(pg_dsn) as evicting:
        assert evicting.execute("SELECT coldharbor.evict(%s, now(), true)", (table.table_id,)).fetchone()[0] == 1
        assert evicting.execute("SELECT coldharbor.evict(%s, now())", (table.table_id,)).fetchone()[0] == 1
    assert pg_conn.execute(f"SELECT k, id FROM {table_name}").fetchall() == [(2, 1)]

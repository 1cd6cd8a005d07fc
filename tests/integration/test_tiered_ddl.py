"""DDL a tiered table's evicted rows cannot follow (sql/018).

Rows evicted from the hot tier live in the lake alone, under their columns' names, and no base
rewrites them. Before sql/018 a `RENAME COLUMN` of such a table made every evicted row read NULL in
the renamed column, and a column added under a dropped one's name showed the dropped column's values
in them. Both are refused now once rows were evicted; before any eviction they go through as before.
"""

from __future__ import annotations

import psycopg
import pytest

from coldharbor import registry
from tests.helpers import export, lake_live, pg_rows, serve_report

DDL = "id bigint PRIMARY KEY, customer text, amount numeric(12,2), status text"


def tiered_table(conn, name: str) -> registry.RegisteredTable:
    """A tiered table registered with 200 rows (its initial load), and 60 more written after."""
    conn.execute(f"CREATE TABLE {name} ({DDL})")
    conn.execute(f"INSERT INTO {name} SELECT g, 'c' || (g % 13), g * 0.5, 'new' FROM generate_series(1, 200) g")
    conn.execute("SELECT coldharbor.register_table(%s, p_hot_retention => interval '1 hour')", (name,))
    conn.execute(f"INSERT INTO {name} SELECT g, 'late ' || g, g, 'paid' FROM generate_series(201, 260) g")
    [table] = registry.load(conn, name)
    return table


def in_the_lake(spark, dsn: str, conn, name: str, lake_root: str) -> None:
    """Exports until the table's load and every change are in the lake."""
    assert export(spark, dsn, name, lake_root).status in ("loaded", "exported")
    assert export(spark, dsn, name, lake_root).status in ("exported", "clean")
    assert lake_live(spark, lake_root, name, ["id"]) == pg_rows(conn, f"SELECT * FROM {name}", ["id"])


def evict_written_rows(conn, table: registry.RegisteredTable) -> int:
    """Makes every logged change look made and flushed two hours ago, then evicts (1 hour retention)."""
    conn.execute("""UPDATE coldharbor.change_log SET created_at = created_at - interval '2 hours',
                           flushed_at = flushed_at - interval '2 hours' WHERE table_id = %s""", (table.table_id,))
    return conn.execute("SELECT coldharbor.evict(%s, now())", (table.table_id,)).fetchone()[0]


def report(monkeypatch, conn, dsn: str, lake_root: str, name: str, run_id: str) -> dict:
    assert serve_report(monkeypatch, dsn, lake_root, "--sql", f"SELECT * FROM {name}",
                        "--target", f"adhoc_{run_id}", "--run-id", run_id) == 0
    return pg_rows(conn, f"SELECT * FROM reports.adhoc_{run_id}", ["id"])


def rebase_serial(conn, table: registry.RegisteredTable) -> int:
    return conn.execute("SELECT rebase_serial FROM coldharbor.tables WHERE table_id = %s",
                        (table.table_id,)).fetchone()[0]


def test_a_column_of_a_tiered_table_with_evicted_rows_is_neither_renamed_nor_reused(
        spark, pg_dsn, pg_conn, table_name, lake_root, monkeypatch):
    t = table_name
    table = tiered_table(pg_conn, t)
    in_the_lake(spark, pg_dsn, pg_conn, t, lake_root)
    everything = pg_rows(pg_conn, f"SELECT * FROM {t}", ["id"])
    assert evict_written_rows(pg_conn, table) == 60
    assert pg_conn.execute("SELECT evicted_at IS NOT NULL FROM coldharbor.tables WHERE table_id = %s",
                           (table.table_id,)).fetchone()[0]
    serial = rebase_serial(pg_conn, table)

    with pytest.raises(psycopg.errors.FeatureNotSupported) as refused:
        pg_conn.execute(f"ALTER TABLE {t} RENAME COLUMN customer TO buyer")
    message = str(refused.value)
    assert message.startswith(f"cannot rename column customer of public.{t} to buyer: rows evicted from its hot "
                              "tier (last at ") and "would read NULL under the new one" in message
    assert "\n" not in message.split("HINT")[0].strip()
    assert [c.name for c in registry.lake_columns(pg_conn, table)][:2] == ["id", "customer"]
    assert rebase_serial(pg_conn, table) == serial  # nothing requested: the DDL rolled back
    assert report(monkeypatch, pg_conn, pg_dsn, lake_root, t, f"a_{t}") == everything

    # A dropped column's name is not taken again: evicted rows hold its values under that name.
    pg_conn.execute(f"ALTER TABLE {t} DROP COLUMN status")
    with pytest.raises(psycopg.errors.FeatureNotSupported, match=(
            f"cannot add column status to public.{t}: rows evicted from its hot tier .* holding the values of "
            "the dropped column status, and would show them as the new column's")):
        pg_conn.execute(f"ALTER TABLE {t} ADD COLUMN status text")
    pg_conn.execute(f"ALTER TABLE {t} ADD COLUMN state text")  # another name is a column like any other
    for row in everything.values():
        del row["status"]
        row["state"] = None
    export(spark, pg_dsn, t, lake_root)
    assert report(monkeypatch, pg_conn, pg_dsn, lake_root, t, f"b_{t}") == everything
    live = lake_live(spark, lake_root, t, ["id"])
    assert {k: r["customer"] for k, r in live.items()} == {k: r["customer"] for k, r in everything.items()}


def test_a_tiered_table_with_nothing_evicted_renames_a_column_as_any_table(
        spark, pg_dsn, pg_conn, table_name, lake_root, monkeypatch):
    t = table_name
    table = tiered_table(pg_conn, t)
    in_the_lake(spark, pg_dsn, pg_conn, t, lake_root)
    # Changes made just now are inside the retention: nothing goes.
    assert pg_conn.execute("SELECT coldharbor.evict(%s, now() - interval '1 hour')",
                           (table.table_id,)).fetchone()[0] == 0

    pg_conn.execute(f"ALTER TABLE {t} RENAME COLUMN customer TO buyer")

    assert rebase_serial(pg_conn, table) == 1
    assert export(spark, pg_dsn, t, lake_root).status == "loaded"  # the rename's base
    expected = pg_rows(pg_conn, f"SELECT * FROM {t}", ["id"])
    assert len(expected) == 260
    live = lake_live(spark, lake_root, t, ["id"])
    assert {k: r["buyer"] for k, r in live.items()} == {k: r["buyer"] for k, r in expected.items()}
    assert report(monkeypatch, pg_conn, pg_dsn, lake_root, t, f"n_{t}") == expected


def test_a_table_registered_again_after_its_evictions_renames_a_column(
        spark, pg_dsn, pg_conn, table_name, lake_root, monkeypatch):
    """The evicted rows were the old relation's: the new relation's base marks their keys deleted."""
    t = table_name
    table = tiered_table(pg_conn, t)
    in_the_lake(spark, pg_dsn, pg_conn, t, lake_root)
    assert evict_written_rows(pg_conn, table) == 60
    pg_conn.execute(f"DROP TABLE {t}")
    pg_conn.execute(f"CREATE TABLE {t} ({DDL})")
    pg_conn.execute(f"INSERT INTO {t} SELECT g, 'n' || g, g, 'new' FROM generate_series(100, 150) g")
    pg_conn.execute("SELECT coldharbor.register_table(%s, p_hot_retention => interval '1 hour')", (t,))

    pg_conn.execute(f"ALTER TABLE {t} RENAME COLUMN customer TO buyer")

    assert export(spark, pg_dsn, t, lake_root).status in ("loaded", "exported")
    expected = pg_rows(pg_conn, f"SELECT * FROM {t}", ["id"])
    assert report(monkeypatch, pg_conn, pg_dsn, lake_root, t, f"c_{t}") == expected
    live = lake_live(spark, lake_root, t, ["id"])
    assert {k: r["buyer"] for k, r in live.items()} == {k: r["buyer"] for k, r in expected.items()}

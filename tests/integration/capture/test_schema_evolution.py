"""Schema evolution of a registered table: added columns reach the lake, dropped ones stay there,
type changes are refused before anything is written."""

from __future__ import annotations

import pytest
from coldharbor.capture import registry
from coldharbor.lake import delta
from coldharbor.runtime.errors import ConfigError

from tests.helpers import dirty_ids, export, lake_live, lake_table, pg_rows, serve_report


def make(conn, name):
    conn.execute(f"CREATE TABLE {name} (id bigint PRIMARY KEY, v text)")
    conn.execute("SELECT coldharbor.register_table(%s)", (name,))
    conn.execute(f"INSERT INTO {name} SELECT g, 'v' || g FROM generate_series(1, 5) g")


def test_an_added_column_reaches_the_lake_null_in_older_rows(spark, pg_dsn, pg_conn, table_name, lake_root,
                                                             monkeypatch):
    make(pg_conn, table_name)
    export(spark, pg_dsn, table_name, lake_root)
    pg_conn.execute(f"ALTER TABLE {table_name} ADD COLUMN qty numeric(8,2)")
    pg_conn.execute(f"UPDATE {table_name} SET qty = id * 1.5 WHERE id <= 2")
    pg_conn.execute(f"INSERT INTO {table_name} VALUES (6, 'new', 7)")
    assert export(spark, pg_dsn, table_name, lake_root).status == "exported"
    assert "qty" in lake_table(spark, lake_root, table_name).columns
    expected = pg_rows(pg_conn, f"SELECT * FROM {table_name}", ["id"])
    assert lake_live(spark, lake_root, table_name, ["id"]) == expected
    assert expected[(3,)]["qty"] is None
    assert serve_report(monkeypatch, pg_dsn, lake_root, "--sql", f"SELECT * FROM {table_name}",
                        "--target", "adhoc_widened") == 0
    assert pg_rows(pg_conn, "SELECT * FROM reports.adhoc_widened", ["id"]) == expected


def test_a_dropped_column_stays_in_the_lake_null_in_new_rows(spark, pg_dsn, pg_conn, table_name, lake_root,
                                                            monkeypatch):
    make(pg_conn, table_name)
    pg_conn.execute(f"ALTER TABLE {table_name} ADD COLUMN note text DEFAULT 'n'")
    export(spark, pg_dsn, table_name, lake_root)
    pg_conn.execute(f"ALTER TABLE {table_name} DROP COLUMN note")
    pg_conn.execute(f"UPDATE {table_name} SET v = 'changed' WHERE id = 1")
    assert export(spark, pg_dsn, table_name, lake_root).status == "exported"
    live = lake_live(spark, lake_root, table_name, ["id"])
    assert live[(1,)]["note"] is None and live[(2,)]["note"] == "n"
    assert serve_report(monkeypatch, pg_dsn, lake_root, "--sql", f"SELECT * FROM {table_name}",
                        "--target", "adhoc_narrowed") == 0
    assert pg_rows(pg_conn, "SELECT * FROM reports.adhoc_narrowed", ["id"]) == pg_rows(
        pg_conn, f"SELECT * FROM {table_name}", ["id"])


@pytest.mark.parametrize("change, update, refusal", [
    ("ALTER COLUMN id TYPE integer", "SET v = 'x'", r"column id's type changed: its values now need the lake \(Spark SQL\) type int, but the lake table at"),
    ('RENAME COLUMN v TO "unit price"', "SET \"unit price\" = 'x'",
     'column "unit price" of table {t} has a name the lake cannot store'),
], ids=["type change", "name the lake cannot store"])
def test_a_refused_change_is_refused_before_anything_is_written(spark, pg_dsn, pg_conn, table_name, lake_root,
                                                                 change, update, refusal):
    make(pg_conn, table_name)
    export(spark, pg_dsn, table_name, lake_root)
    path = registry.load(pg_conn, table_name)[0].lake_path(lake_root)
    version = delta.pin_version(spark, path)
    pg_conn.execute(f"ALTER TABLE {table_name} {change}")
    pg_conn.execute(f"UPDATE {table_name} {update} WHERE id = 1")
    dirty = dirty_ids(pg_conn, table_name)
    with pytest.raises(ConfigError, match=f"public.{table_name}: " + refusal.format(t=table_name)):
        export(spark, pg_dsn, table_name, lake_root)
    assert delta.pin_version(spark, path) == version
    assert dirty_ids(pg_conn, table_name) == dirty and dirty
    assert pg_conn.execute("SELECT count(*) FROM coldharbor.export_batches b JOIN coldharbor.tables t "
                           "USING (table_id) WHERE t.table_name = %s AND b.state = 'pending'",
                           (table_name,)).fetchone()[0] == 0

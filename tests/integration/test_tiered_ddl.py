"""DDL a tiered table's evicted rows cannot follow (sql/018).

Rows evicted from the hot tier live in the lake alone, under their columns' names and lake types,
and no base rewrites them. Before sql/018 a `RENAME COLUMN` of such a table made every evicted row
read NULL in the renamed column, a column added under a dropped one's name showed the dropped
column's values in them, and a type change the lake cannot widen to left the table refused by every
export. All three are refused now once rows were evicted; before any eviction they go through as
before. A rename spelled `ALTER TYPE ... RENAME ATTRIBUTE` (or through ALTER VIEW, MATERIALIZED VIEW,
FOREIGN TABLE) reached no trigger at all before: the lake kept the old name for every table.
"""

from __future__ import annotations

import psycopg
import pytest

from coldharbor import registry, resync, verify
from tests.helpers import export, lake_live, pg_rows, report_run, serve_report

DDL = "id bigint PRIMARY KEY, customer text, amount numeric(12,2), status text, qty integer"


def tiered_table(conn, name: str) -> registry.RegisteredTable:
    """A tiered table registered with 200 rows (its initial load), and 60 more written after."""
    conn.execute(f"CREATE TABLE {name} ({DDL})")
    conn.execute(f"INSERT INTO {name} SELECT g, 'c' || (g % 13), g * 0.5, 'new', g FROM generate_series(1, 200) g")
    conn.execute("SELECT coldharbor.register_table(%s, p_hot_retention => interval '1 hour')", (name,))
    conn.execute(f"INSERT INTO {name} SELECT g, 'late ' || g, g, 'paid', g FROM generate_series(201, 260) g")
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


def evicted_tiered_table(spark, dsn: str, conn, name: str, lake_root: str) -> tuple[registry.RegisteredTable, dict]:
    """A tiered table in the lake whose 60 rows written after registration were evicted; with every
    row it held before the eviction (what its reports must still show)."""
    table = tiered_table(conn, name)
    in_the_lake(spark, dsn, conn, name, lake_root)
    everything = pg_rows(conn, f"SELECT * FROM {name}", ["id"])
    assert evict_written_rows(conn, table) == 60
    return table, everything


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
    table, everything = evicted_tiered_table(spark, pg_dsn, pg_conn, t, lake_root)
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
    table, _ = evicted_tiered_table(spark, pg_dsn, pg_conn, t, lake_root)
    pg_conn.execute(f"DROP TABLE {t}")
    pg_conn.execute(f"CREATE TABLE {t} ({DDL})")
    pg_conn.execute(f"INSERT INTO {t} SELECT g, 'n' || g, g, 'new', g FROM generate_series(100, 150) g")
    pg_conn.execute("SELECT coldharbor.register_table(%s, p_hot_retention => interval '1 hour')", (t,))

    pg_conn.execute(f"ALTER TABLE {t} RENAME COLUMN customer TO buyer")

    assert export(spark, pg_dsn, t, lake_root).status in ("loaded", "exported")
    expected = pg_rows(pg_conn, f"SELECT * FROM {t}", ["id"])
    assert report(monkeypatch, pg_conn, pg_dsn, lake_root, t, f"c_{t}") == expected
    live = lake_live(spark, lake_root, t, ["id"])
    assert {k: r["buyer"] for k, r in live.items()} == {k: r["buyer"] for k, r in expected.items()}


# Every spelling PostgreSQL accepts for renaming a column of a table.
RENAMES = ["ALTER TABLE {t} RENAME COLUMN customer TO buyer", "ALTER TYPE {t} RENAME ATTRIBUTE customer TO buyer",
           "ALTER VIEW {t} RENAME COLUMN customer TO buyer", "ALTER MATERIALIZED VIEW {t} RENAME COLUMN customer TO buyer",
           "ALTER FOREIGN TABLE {t} RENAME COLUMN customer TO buyer"]
RENAME_IDS = ["table", "type attribute", "view", "materialized view", "foreign table"]


@pytest.mark.parametrize("rename", RENAMES, ids=RENAME_IDS)
def test_every_spelling_of_a_rename_sends_the_table_back_for_a_new_base(
        spark, pg_dsn, pg_conn, table_name, lake_root, monkeypatch, rename):
    t = table_name
    pg_conn.execute(f"CREATE TABLE {t} ({DDL})")
    pg_conn.execute(f"INSERT INTO {t} SELECT g, 'c' || g, g, 'new', g FROM generate_series(1, 120) g")
    pg_conn.execute("SELECT coldharbor.register_table(%s)", (t,))
    [table] = registry.load(pg_conn, t)
    in_the_lake(spark, pg_dsn, pg_conn, t, lake_root)

    pg_conn.execute(rename.format(t=t))

    assert pg_conn.execute("SELECT load_state, rebase_reason FROM coldharbor.tables WHERE table_id = %s",
                           (table.table_id,)).fetchone() == ("pending", "column customer was renamed to buyer")
    expected = pg_rows(pg_conn, f"SELECT * FROM {t}", ["id"])
    assert report(monkeypatch, pg_conn, pg_dsn, lake_root, t, f"p_{t}") == expected
    assert export(spark, pg_dsn, t, lake_root).status == "loaded"
    live = lake_live(spark, lake_root, t, ["id"])
    assert {k: r["buyer"] for k, r in live.items()} == {k: r["buyer"] for k, r in expected.items()}
    assert report(monkeypatch, pg_conn, pg_dsn, lake_root, t, f"q_{t}") == expected


@pytest.mark.parametrize("rename", RENAMES[1:], ids=RENAME_IDS[1:])
def test_every_spelling_of_a_rename_is_refused_once_rows_were_evicted(
        spark, pg_dsn, pg_conn, table_name, lake_root, monkeypatch, rename):
    t = table_name
    table, _ = evicted_tiered_table(spark, pg_dsn, pg_conn, t, lake_root)

    with pytest.raises(psycopg.errors.FeatureNotSupported, match=f"cannot rename column customer of public.{t} to buyer"):
        pg_conn.execute(rename.format(t=t))
    assert rebase_serial(pg_conn, table) == 0


@pytest.mark.parametrize("ddl, lake_types", [
    ("ALTER TABLE {t} ALTER COLUMN amount TYPE numeric(12,0)", "DECIMAL(12,2), and the lake cannot widen them to DECIMAL(12,0)"),
    ("ALTER TABLE {t} ALTER COLUMN qty TYPE text", "INT, and the lake cannot widen them to STRING"),
    ("ALTER TABLE {t} ALTER COLUMN qty TYPE smallint", "INT, and the lake cannot widen them to SHORT"),
], ids=["decimal scale", "integer to text", "narrower integer"])
def test_a_type_change_the_lake_cannot_widen_is_refused_once_rows_were_evicted(
        spark, pg_dsn, pg_conn, table_name, lake_root, monkeypatch, ddl, lake_types):
    """The export would refuse the table for good, and its way out (the lake moved aside, a resync)
    would lose the evicted rows."""
    t = table_name
    table, everything = evicted_tiered_table(spark, pg_dsn, pg_conn, t, lake_root)

    with pytest.raises(psycopg.errors.FeatureNotSupported) as refused:
        pg_conn.execute(ddl.format(t=t))
    assert str(refused.value).startswith("cannot change the type of column ")
    assert f"of public.{t} to " in str(refused.value) and f"live in the lake alone, as {lake_types}" in str(refused.value)
    assert rebase_serial(pg_conn, table) == 0
    assert report(monkeypatch, pg_conn, pg_dsn, lake_root, t, f"r_{t}") == everything


def test_a_type_change_the_lake_widens_goes_through_after_evictions(
        spark, pg_dsn, pg_conn, table_name, lake_root, monkeypatch):
    t = table_name
    table, everything = evicted_tiered_table(spark, pg_dsn, pg_conn, t, lake_root)

    pg_conn.execute(f"ALTER TABLE {t} ALTER COLUMN qty TYPE bigint")

    assert export(spark, pg_dsn, t, lake_root).status == "loaded"
    assert report(monkeypatch, pg_conn, pg_dsn, lake_root, t, f"w_{t}") == everything
    # the next change is checked against the widened type
    with pytest.raises(psycopg.errors.FeatureNotSupported, match="as LONG, and the lake cannot widen them to INT"):
        pg_conn.execute(f"ALTER TABLE {t} ALTER COLUMN qty TYPE integer")


# Text a key and a value hold as they are: quotes, a backslash, a newline, SQL, non-ASCII.
HOSTILE = ["o'brien \"q\"", "a\\b\nc; DROP TABLE x; --", "zürich ☃ 東京"]
PENDING_CASES = {
    "add_column_default": (
        "id bigint PRIMARY KEY, customer text, amount numeric(12,2), status text", ["id"],
        "ALTER TABLE {t} ADD COLUMN region text DEFAULT 'eu'", lambda row: {**row, "region": None}),
    "type_change_using": (
        "shop text, id int, customer text, amount numeric(12,2), status text, PRIMARY KEY (shop, id)", ["shop", "id"],
        "ALTER TABLE {t} ALTER COLUMN status TYPE text USING upper(status)", lambda row: row),
}


def keyed_tiered_table(conn, name: str, ddl: str, keys: list[str]) -> registry.RegisteredTable:
    """`tiered_table` with the case's key (a composite one holds hostile text in its first column)."""
    conn.execute(f"CREATE TABLE {name} ({ddl})")
    shop = "(ARRAY[%s, %s, %s])[g %% 3 + 1], " if keys != ["id"] else ""
    insert = f"INSERT INTO {name} SELECT {shop}g, %s || (g %% 13), g * 0.5, %s FROM generate_series(%s::int, %s::int) g"
    hostile = HOSTILE if shop else []
    conn.execute(insert, (*hostile, HOSTILE[2], "new", 1, 200))
    conn.execute("SELECT coldharbor.register_table(%s, p_hot_retention => interval '1 hour')", (name,))
    conn.execute(insert, (*hostile, "late " + HOSTILE[1], "paid", 201, 260))
    [table] = registry.load(conn, name)
    return table


def exported_until_clean(spark, dsn: str, name: str, lake_root: str) -> None:
    statuses = [export(spark, dsn, name, lake_root).status for _ in range(3)]
    assert statuses[-1] == "clean", statuses


def keyed_report(monkeypatch, conn, dsn: str, lake_root: str, select: str, keys: list[str], run_id: str) -> dict:
    assert serve_report(monkeypatch, dsn, lake_root, "--sql", select, "--target", f"adhoc_{run_id}",
                        "--run-id", run_id) == 0
    return pg_rows(conn, f"SELECT * FROM reports.adhoc_{run_id}", keys)


@pytest.mark.parametrize("case", sorted(PENDING_CASES))
def test_a_tiered_table_pending_a_rebase_keeps_its_evicted_rows_in_reports(
        spark, pg_dsn, pg_conn, table_name, lake_root, monkeypatch, case):
    """While DDL keeps a tiered table pending its new base, reports read PostgreSQL's rows plus the
    lake's rows of the keys PostgreSQL does not hold and no unexported change touched: the evicted
    rows, as the lake holds them. Before, the table was read from PostgreSQL alone and every evicted
    row was missing until the export wrote the base."""
    ddl, keys, change, evicted_after = PENDING_CASES[case]
    t = table_name
    table = keyed_tiered_table(pg_conn, t, ddl, keys)
    assert export(spark, pg_dsn, t, lake_root).status in ("loaded", "exported")
    pg_conn.execute(f"DELETE FROM {t} WHERE id = 3")  # its delete marker is exported
    exported_until_clean(spark, pg_dsn, t, lake_root)
    before = pg_rows(pg_conn, f"SELECT * FROM {t}", keys)
    assert evict_written_rows(pg_conn, table) == 60
    left = pg_rows(pg_conn, f"SELECT * FROM {t}", keys)
    evicted = {k: row for k, row in before.items() if k not in left}
    assert len(evicted) == 60 and all(row["id"] > 200 for row in evicted.values())
    back = next(k for k in sorted(evicted) if evicted[k]["id"] == 210)
    pg_conn.execute(f"INSERT INTO {t} SELECT * FROM (VALUES ({', '.join(['%s'] * len(before[back]))})) v",
                    tuple({**before[back], "customer": "back in the hot tier"}.values()))  # an evicted key again
    del evicted[back]
    pg_conn.execute(f"DELETE FROM {t} WHERE id = 4")  # not exported: must not come back from the lake
    pg_conn.execute(change.format(t=t))
    assert pg_conn.execute("SELECT load_state, rebase_reason IS NOT NULL FROM coldharbor.tables WHERE table_id = %s",
                           (table.table_id,)).fetchone() == ("pending", True)
    expected = pg_rows(pg_conn, f"SELECT * FROM {t}", keys)
    assert not set(expected) & set(evicted) and not any(row["id"] in (3, 4) for row in expected.values())
    expected.update({k: evicted_after(row) for k, row in evicted.items()})
    assert len(expected) == 258

    run = f"p_{t}"
    assert keyed_report(monkeypatch, pg_conn, pg_dsn, lake_root, f"SELECT * FROM {t}", keys, run) == expected
    record = report_run(pg_conn, run)
    assert not record["served_from_postgres"] and not record["degraded"]
    assert record["dirty_rows"] == {f"public.{t}": 199 + 1}  # every row PostgreSQL holds, and the deleted key
    assert keyed_report(monkeypatch, pg_conn, pg_dsn, lake_root, f"SELECT count(*) AS n FROM {t}", ["n"],
                        f"n_{t}") == {(258,): {"n": 258}}
    as_of = pg_conn.execute("SELECT now()").fetchone()[0]
    assert serve_report(monkeypatch, pg_dsn, lake_root, "--sql", f"SELECT * FROM {t}", "--target",
                        f"adhoc_a_{t}", "--run-id", f"a_{t}", "--as-of", as_of.isoformat()) == 2
    assert "it falls inside a rebase" in report_run(pg_conn, f"a_{t}")["error"]

    exported_until_clean(spark, pg_dsn, t, lake_root)  # the rebase's base and the changes
    assert pg_conn.execute("SELECT load_state, rebase_reason FROM coldharbor.tables WHERE table_id = %s",
                           (table.table_id,)).fetchone() == ("loaded", None)
    assert keyed_report(monkeypatch, pg_conn, pg_dsn, lake_root, f"SELECT * FROM {t}", keys, f"e_{t}") == expected
    assert not report_run(pg_conn, f"e_{t}")["served_from_postgres"]


def test_a_resync_after_the_hot_retention_was_removed_keeps_the_evicted_rows(
        spark, pg_dsn, pg_conn, table_name, lake_root, monkeypatch):
    """Registered again without a retention, the table evicts nothing more, but the rows it evicted
    still live in the lake alone: a base (here a resync's) must not mark them deleted."""
    t = table_name
    _, everything = evicted_tiered_table(spark, pg_dsn, pg_conn, t, lake_root)
    pg_conn.execute("SELECT coldharbor.register_table(%s)", (t,))
    assert pg_conn.execute("SELECT hot_retention FROM coldharbor.tables WHERE table_name = %s",
                           (t,)).fetchone()[0] is None
    monkeypatch.setenv("COLDHARBOR_PG_DSN", pg_dsn)
    assert resync.main(["--table", t, "--lake-root", lake_root]) == 0
    assert report(monkeypatch, pg_conn, pg_dsn, lake_root, t, f"u_{t}") == everything
    assert lake_live(spark, lake_root, t, ["id"]) == everything
    # verify takes them as evicted rows too, not as rows the lake has and PostgreSQL lacks
    assert verify.main(["--table", t, "--lake-root", lake_root]) == 0

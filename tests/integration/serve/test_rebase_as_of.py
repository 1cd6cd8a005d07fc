"""As-of reports around DDL that changed rows without writing them (sql/migrations/014-016), attacked where the
window of sql/migrations/015 ([request, base]) was not the whole truth:

- a key changed before the DDL and not exported when it ran is exported afterwards with the
  values the DDL left, stamped with its change's earlier commit time: as of an instant between
  that change and the DDL the lake holds no true image of it (the window starts at that change);
- a renamed column is held under its old name by older lake rows: as of before the rename it
  would read NULL under the new one (refused);
- the refusal says where the instant falls (before the request, inside the window).

Every table holds rows when it is registered; keys are composite (text, integer), uuid and
bigint; names carry quotes, spaces and a non-ASCII letter. Each exact instant is compared with a
copy of PostgreSQL taken at that instant.
"""

from __future__ import annotations

import uuid

import pytest
from coldharbor.capture import registry

from tests.helpers import export, pg_rows, report_run, serve_report

HOSTILE = ' "q\'s" ü'  # a quote of each kind, spaces and a non-ASCII letter in the table's name


def quoted(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def clock(conn) -> object:
    return conn.execute("SELECT clock_timestamp()").fetchone()[0]


def as_of(monkeypatch, conn, dsn: str, lake_root: str, select: str, instant, keys: list[str]) -> tuple[int, object]:
    """Serves `select` as of `instant`: (exit code, the report's rows or the run's error)."""
    run = f"r{uuid.uuid4().hex[:10]}"
    code = serve_report(monkeypatch, dsn, lake_root, "--sql", select, "--target", f"adhoc_{run}",
                        "--as-of", instant.isoformat(), "--run-id", run)
    if code != 0:
        assert conn.execute(f"SELECT to_regclass('reports.adhoc_{run}')").fetchone()[0] is None
        error = report_run(conn, run)["error"]
        assert "\n" not in error
        return code, error
    return code, pg_rows(conn, f"SELECT * FROM reports.adhoc_{run}", keys)


def rebase_of(conn, name: str) -> dict:
    [table] = registry.load(conn, name)
    cur = conn.execute("SELECT * FROM coldharbor.rebases WHERE table_id = %s ORDER BY serial DESC LIMIT 1",
                       (table.table_id,))
    return dict(zip([d.name for d in cur.description], cur.fetchone()))


# (table columns, the view's select of PostgreSQL, keys, the DDL, its reason, the columns after it)
DIRTY_AT_DDL = [
    ("k text, n integer, v varchar(20), PRIMARY KEY (k, n)", "k, n, v", ["k", "n"],
     "ALTER TABLE {t} ALTER COLUMN v TYPE varchar(3) USING left(v, 3)", "ALTER TABLE rewrote", "k, n, v"),
    ("id uuid PRIMARY KEY, v text", "id::text AS id, v", ["id"],
     "ALTER TABLE {t} ADD COLUMN region text DEFAULT 'x'", "column region was added with a default",
     "id::text AS id, v, region"),
]


@pytest.mark.parametrize("columns, select, keys, ddl, reason, after", DIRTY_AT_DDL,
                         ids=["composite key, type using", "uuid key, add column default"])
def test_as_of_after_changes_not_exported_when_ddl_rewrote_them_is_refused(
        spark, pg_dsn, pg_conn, table_name, lake_root, monkeypatch, columns, select, keys, ddl, reason, after):
    """Keys updated to 'LONGVALUE-new' and still dirty when the DDL ran reach the lake only as the
    DDL left them ('LON', or with region 'x'), stamped with the update's commit time. Before the
    fix an as-of instant between the update and the DDL read those values (PostgreSQL then held
    'LONGVALUE-new' and no region); now it is refused naming the table, the reason and the window
    from the oldest such change. Instants before it and after the new base equal PostgreSQL then."""
    name = table_name + HOSTILE
    t = quoted(name)
    pg_conn.execute(f"CREATE TABLE {t} ({columns})")
    key_values = "'k' || (g % 4), g" if len(keys) == 2 else "gen_random_uuid()"
    pg_conn.execute(f"INSERT INTO {t} ({', '.join(keys)}, v) SELECT {key_values}, 'OLDVALUE-' || g "
                    "FROM generate_series(1, 40) g")
    pg_conn.execute("SELECT coldharbor.register_table(%s)", (t,))
    assert export(spark, pg_dsn, f"public.{name}", lake_root).status == "loaded"
    pg_conn.execute(f"UPDATE {t} SET v = 'EXPORTED-' || v WHERE v LIKE '%1'")
    assert export(spark, pg_dsn, f"public.{name}", lake_root).status == "exported"
    report = f"SELECT * FROM public.`{name}`"
    missing = ", NULL::text AS region" if "region" in after else ""

    t_exact = clock(pg_conn)
    at_exact = pg_rows(pg_conn, f"SELECT {select}{missing} FROM {t}", keys)
    pg_conn.execute(f"UPDATE {t} SET v = 'LONGVALUE-new' WHERE v LIKE '%2' OR v LIKE '%3'")
    t_dirty = clock(pg_conn)
    at_dirty = pg_rows(pg_conn, f"SELECT {select}{missing} FROM {t}", keys)
    assert sum(r["v"] == "LONGVALUE-new" for r in at_dirty.values()) == 8
    pg_conn.execute(ddl.format(t=t))
    assert export(spark, pg_dsn, f"public.{name}", lake_root).status in ("loaded", "exported")
    t_after = clock(pg_conn)
    at_after = pg_rows(pg_conn, f"SELECT {after} FROM {t}", keys)

    assert as_of(monkeypatch, pg_conn, pg_dsn, lake_root, report, t_exact, keys) == (0, at_exact)
    assert as_of(monkeypatch, pg_conn, pg_dsn, lake_root, report, t_after, keys) == (0, at_after)
    code, error = as_of(monkeypatch, pg_conn, pg_dsn, lake_root, report, t_dirty, keys)
    assert code == 2, f"served {[r['v'] for r in error.values() if r not in at_dirty.values()]} where " \
        f"PostgreSQL held {sorted(r['v'] for r in at_dirty.values() if r not in error.values())}"
    window = rebase_of(pg_conn, f"public.{name}")
    assert t_exact < window["dirty_since"] < t_dirty < window["requested_at"] < window["settled_at"] < t_after
    assert error.startswith(f"as-of {t_dirty.isoformat()} cannot be answered for public.{t}: it falls before a "
                            f"rebase ({reason}"), error
    assert (f"changes from {window['dirty_since'].isoformat()} on were not exported when its DDL ran at "
            f"{window['requested_at'].isoformat()}") in error
    assert (f"ask for an instant before {window['dirty_since'].isoformat()}, or from "
            f"{window['settled_at'].isoformat()} on") in error


def test_as_of_before_a_rename_is_refused_and_after_its_base_is_exact(
        spark, pg_dsn, pg_conn, table_name, lake_root, monkeypatch):
    """Older lake rows hold a renamed column under its old name: before the fix an as-of instant
    before RENAME COLUMN read NULL under the new name. Refused now, naming both names (quotes of
    each kind and a non-ASCII letter in them) and the first instant that is exact."""
    name = table_name + HOSTILE
    t = quoted(name)
    old, new = "cu\"st'ö", "bü'y\"er"
    pg_conn.execute(f"CREATE TABLE {t} (id bigint PRIMARY KEY, {quoted(old)} text, amount numeric(12,2))")
    pg_conn.execute(f"INSERT INTO {t} SELECT g, 'c' || (g % 7), g * 0.5 FROM generate_series(1, 30) g")
    pg_conn.execute("SELECT coldharbor.register_table(%s)", (t,))
    assert export(spark, pg_dsn, f"public.{name}", lake_root).status == "loaded"
    pg_conn.execute(f"UPDATE {t} SET {quoted(old)} = 'again' WHERE id <= 3")
    assert export(spark, pg_dsn, f"public.{name}", lake_root).status == "exported"
    t_before = clock(pg_conn)
    pg_conn.execute(f"ALTER TABLE {t} RENAME COLUMN {quoted(old)} TO {quoted(new)}")
    report = f"SELECT id, `{new}` AS buyer FROM public.`{name}`"
    assert export(spark, pg_dsn, f"public.{name}", lake_root).status == "loaded"
    t_after = clock(pg_conn)
    at_after = pg_rows(pg_conn, f"SELECT id, {quoted(new)} AS buyer FROM {t}", ["id"])

    assert as_of(monkeypatch, pg_conn, pg_dsn, lake_root, report, t_after, ["id"]) == (0, at_after)
    code, error = as_of(monkeypatch, pg_conn, pg_dsn, lake_root, report, t_before, ["id"])
    assert code == 2, f"served {error}"
    window = rebase_of(pg_conn, f"public.{name}")
    assert window["renames_column"] and t_before < window["requested_at"] < window["settled_at"] < t_after
    reason = f"column {quoted(old)} was renamed to {quoted(new)}"
    assert error == (f"as-of {t_before.isoformat()} cannot be answered for public.{t}: it falls before a rename "
                     f"({reason}, at {window['requested_at'].isoformat()}): lake rows written before it hold the "
                     "column under its old name, so no earlier instant can be read under the new one; ask for an "
                     f"instant from {window['settled_at'].isoformat()} on")


def test_as_of_before_a_rebase_no_base_answered_yet_is_not_told_it_is_inside_it(
        spark, pg_dsn, pg_conn, table_name, lake_root, monkeypatch):
    """While a rebase is pending the table is read from PostgreSQL alone and as-of reports over it
    are refused; before the fix an instant before the DDL was told it fell inside the rebase. A
    change made in the DDL's own transaction does not move the window before the DDL. Once the
    base lands, that instant equals PostgreSQL then (the new column NULL: it did not exist)."""
    name = table_name + HOSTILE
    t = quoted(name)
    pg_conn.execute(f"CREATE TABLE {t} (code text PRIMARY KEY, amount numeric(12,2))")
    pg_conn.execute(f"INSERT INTO {t} SELECT 'code-' || g || ' ''x''', g FROM generate_series(1, 25) g")
    pg_conn.execute("SELECT coldharbor.register_table(%s)", (t,))
    assert export(spark, pg_dsn, f"public.{name}", lake_root).status == "loaded"
    t_before = clock(pg_conn)
    at_before = pg_rows(pg_conn, f"SELECT *, NULL::integer AS qty FROM {t}", ["code"])
    with pg_conn.transaction():  # the DDL's own change commits with it: inside the window, not before it
        pg_conn.execute(f"UPDATE {t} SET amount = -1 WHERE code = 'code-1 ''x'''")
        pg_conn.execute(f"ALTER TABLE {t} ADD COLUMN qty integer NOT NULL DEFAULT 7")
    t_inside = clock(pg_conn)
    report = f"SELECT * FROM public.`{name}`"

    code, error = as_of(monkeypatch, pg_conn, pg_dsn, lake_root, report, t_before, ["code"])
    assert code == 2 and "inside a rebase" not in error, error
    window = rebase_of(pg_conn, f"public.{name}")
    assert window["dirty_since"] is None and window["settled_at"] is None and not window["renames_column"]
    assert error == (f"as-of {t_before.isoformat()} cannot be answered for public.{t}: it falls before a rebase "
                     f"(column qty was added with a default, which every existing row holds, at "
                     f"{window['requested_at'].isoformat()}) that no base has answered yet: until the next export "
                     "writes it, reports read the table from PostgreSQL alone; retry after that export (then instants "
                     f"before {window['requested_at'].isoformat()} and from the new base on are answered)")
    code, error = as_of(monkeypatch, pg_conn, pg_dsn, lake_root, report, t_inside, ["code"])
    assert code == 2 and "it falls inside a rebase: column qty was added with a default" in error, error

    assert export(spark, pg_dsn, f"public.{name}", lake_root).status == "exported"  # the base, then the change
    assert rebase_of(pg_conn, f"public.{name}")["settled_at"] is not None
    assert as_of(monkeypatch, pg_conn, pg_dsn, lake_root, report, t_before, ["code"]) == (0, at_before)


def test_as_of_after_changes_not_exported_when_the_table_was_dropped_and_created_anew_is_refused(
        spark, pg_dsn, pg_conn, table_name, lake_root, monkeypatch):
    """Changes of the old table still dirty when it was dropped are exported after the new table's
    base, their keys' images read from the new table under their old times: as of an instant
    between them and the drop the lake holds the new table's rows. Refused from the oldest of them;
    an instant before it equals the old table then."""
    name = table_name + HOSTILE
    t = quoted(name)
    pg_conn.execute(f"CREATE TABLE {t} (id bigint PRIMARY KEY, v text)")
    pg_conn.execute(f"INSERT INTO {t} SELECT g, 'old-' || g FROM generate_series(1, 20) g")
    pg_conn.execute("SELECT coldharbor.register_table(%s)", (t,))
    assert export(spark, pg_dsn, f"public.{name}", lake_root).status == "loaded"
    report = f"SELECT * FROM public.`{name}`"
    t_exact = clock(pg_conn)
    at_exact = pg_rows(pg_conn, f"SELECT * FROM {t}", ["id"])
    pg_conn.execute(f"UPDATE {t} SET v = 'changed' WHERE id <= 4")
    t_dirty = clock(pg_conn)
    pg_conn.execute(f"DROP TABLE {t}")
    pg_conn.execute(f"CREATE TABLE {t} (id bigint PRIMARY KEY, v text)")
    pg_conn.execute(f"INSERT INTO {t} SELECT g, 'new-' || g FROM generate_series(1, 10) g")
    pg_conn.execute("SELECT coldharbor.register_table(%s)", (t,))
    assert export(spark, pg_dsn, f"public.{name}", lake_root).status in ("loaded", "exported")

    assert as_of(monkeypatch, pg_conn, pg_dsn, lake_root, report, t_exact, ["id"]) == (0, at_exact)
    code, error = as_of(monkeypatch, pg_conn, pg_dsn, lake_root, report, t_dirty, ["id"])
    assert code == 2, f"served {sorted(r['v'] for r in error.values())} where the old table held 'changed'"
    window = rebase_of(pg_conn, f"public.{name}")
    assert t_exact < window["dirty_since"] < t_dirty < window["requested_at"]
    assert error.startswith(f"as-of {t_dirty.isoformat()} cannot be answered for public.{t}: it falls before a "
                            "rebase (registered again after the table was dropped and created anew"), error

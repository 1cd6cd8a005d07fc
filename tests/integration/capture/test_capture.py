"""Change capture in PostgreSQL: every change lands in coldharbor.change_log in its transaction."""

from __future__ import annotations

import psycopg
import pytest
from psycopg import sql


def register(conn, name: str, ddl: str, **options) -> int:
    conn.execute(f"CREATE TABLE {name} ({ddl})")
    args = ", ".join(f"{k} => %({k})s" for k in options)
    return conn.execute(f"SELECT coldharbor.register_table(%(t)s{', ' + args if args else ''})",
                        {"t": name, **options}).fetchone()[0]


def changes(conn, table_id: int) -> list[tuple]:
    return conn.execute("SELECT key, op FROM coldharbor.change_log WHERE table_id = %s ORDER BY id",
                        (table_id,)).fetchall()


def test_insert_update_delete_are_logged_dirty(pg_conn, table_name):
    tid = register(pg_conn, table_name, "id int PRIMARY KEY, v text")
    pg_conn.execute(f"INSERT INTO {table_name} VALUES (1, 'a'), (2, 'b')")
    pg_conn.execute(f"UPDATE {table_name} SET v = 'c' WHERE id = 1")
    pg_conn.execute(f"DELETE FROM {table_name} WHERE id = 2")
    assert changes(pg_conn, tid) == [({"id": 1}, "I"), ({"id": 2}, "I"), ({"id": 1}, "U"), ({"id": 2}, "D")]
    dirty = pg_conn.execute("SELECT count(*) FROM coldharbor.change_log WHERE table_id = %s AND flushed_at IS NULL",
                            (tid,)).fetchone()[0]
    assert dirty == 4


def test_a_rolled_back_write_leaves_no_change(pg_conn, table_name):
    tid = register(pg_conn, table_name, "id int PRIMARY KEY")
    with pytest.raises(RuntimeError), pg_conn.transaction():
        pg_conn.execute(f"INSERT INTO {table_name} VALUES (1)")
        raise RuntimeError("application aborts")
    assert changes(pg_conn, tid) == []


def test_primary_key_update_logs_delete_of_old_and_insert_of_new(pg_conn, table_name):
    tid = register(pg_conn, table_name, "id int PRIMARY KEY, v text")
    pg_conn.execute(f"INSERT INTO {table_name} VALUES (1, 'a'), (2, 'b')")
    pg_conn.execute(f"UPDATE {table_name} SET id = id + 10 WHERE id = 1")
    assert sorted(changes(pg_conn, tid)[2:], key=lambda c: c[1]) == [({"id": 1}, "D"), ({"id": 11}, "I")]


def test_key_swap_in_one_statement_is_two_updates(pg_conn, table_name):
    tid = register(pg_conn, table_name, "id int PRIMARY KEY DEFERRABLE, v text")
    pg_conn.execute(f"INSERT INTO {table_name} VALUES (1, 'a'), (2, 'b')")
    pg_conn.execute(f"UPDATE {table_name} SET id = 3 - id")
    assert sorted(changes(pg_conn, tid)[2:], key=lambda c: c[0]["id"]) == [({"id": 1}, "U"), ({"id": 2}, "U")]


def test_composite_keys_are_logged_whole(pg_conn, table_name):
    tid = register(pg_conn, table_name, "region text, id int, v text, PRIMARY KEY (region, id)")
    pg_conn.execute(f"INSERT INTO {table_name} VALUES ('eu', 1, 'a')")
    assert changes(pg_conn, tid) == [({"region": "eu", "id": 1}, "I")]


def test_truncate_logs_a_delete_per_key(pg_conn, table_name):
    tid = register(pg_conn, table_name, "id int PRIMARY KEY")
    pg_conn.execute(f"INSERT INTO {table_name} SELECT generate_series(1, 3)")
    pg_conn.execute(f"TRUNCATE {table_name}")
    assert [c for c in changes(pg_conn, tid) if c[1] == "D"] == [({"id": i}, "D") for i in (1, 2, 3)]


def _capture_calls(conn, table_id: int) -> int:
    conn.execute("SELECT pg_stat_force_next_flush()")
    conn.execute("SELECT pg_stat_clear_snapshot()")
    return conn.execute("""SELECT coalesce(sum(calls), 0) FROM pg_stat_user_functions
                           WHERE schemaname = 'coldharbor' AND funcname LIKE %s""",
                        (f"capture\\_{table_id}\\_%",)).fetchone()[0]


def test_bulk_statements_pay_one_trigger_call_not_one_per_row(pg_conn, table_name):
    pg_conn.execute("SET track_functions = 'all'")
    tid = register(pg_conn, table_name, "id int PRIMARY KEY, v text")
    before = _capture_calls(pg_conn, tid)
    pg_conn.execute(f"INSERT INTO {table_name} SELECT g, 'x' FROM generate_series(1, 5000) g")
    pg_conn.execute(f"UPDATE {table_name} SET v = 'y'")
    pg_conn.execute(f"DELETE FROM {table_name} WHERE id <= 2500")
    assert _capture_calls(pg_conn, tid) - before == 3
    assert pg_conn.execute("SELECT count(*) FROM coldharbor.change_log WHERE table_id = %s",
                           (tid,)).fetchone()[0] == 12_500


UNSUPPORTED = [
    ("inet", "inet"), ("cidr", "cidr"), ("numeric", "numeric"), ("numeric(40,2)", "numeric(40,2)"),
    ("int[]", "integer[]"), ("int4range", "int4range"), ("xml", "xml"), ("tsvector", "tsvector"),
    ("money", "money"), ("time", "time without time zone"), ("interval", "interval"), ("jsonb[]", "jsonb[]"),
]


@pytest.mark.parametrize("ddl_type, shown", UNSUPPORTED)
def test_unsupported_types_are_rejected_naming_the_column(pg_conn, table_name, ddl_type, shown):
    pg_conn.execute(f"CREATE TABLE {table_name} (id int PRIMARY KEY, bad_col {ddl_type})")
    with pytest.raises(psycopg.errors.FeatureNotSupported) as err:
        pg_conn.execute("SELECT coldharbor.register_table(%s)", (table_name,))
    assert err.value.diag.message_primary == (
        f"column bad_col of table public.{table_name} has type {shown}, which does not round-trip to the lake")
    assert pg_conn.execute("SELECT count(*) FROM coldharbor.tables WHERE table_name = %s",
                           (table_name,)).fetchone()[0] == 0


def test_enum_and_composite_types_are_rejected(pg_conn, table_name):
    pg_conn.execute(f"CREATE TYPE {table_name}_mood AS ENUM ('ok'); CREATE TYPE {table_name}_pair AS (a int, b int)")
    for col_type in (f"{table_name}_mood", f"{table_name}_pair"):
        pg_conn.execute(f"DROP TABLE IF EXISTS {table_name}; CREATE TABLE {table_name} (id int PRIMARY KEY, c {col_type})")
        with pytest.raises(psycopg.errors.FeatureNotSupported, match=f"column c of table public.{table_name} has type"):
            pg_conn.execute("SELECT coldharbor.register_table(%s)", (table_name,))


def test_a_table_without_a_primary_key_is_rejected(pg_conn, table_name):
    pg_conn.execute(f"CREATE TABLE {table_name} (id int, v text)")
    with pytest.raises(psycopg.errors.InvalidTableDefinition,
                       match=f"cannot register public.{table_name}: it has no primary key"):
        pg_conn.execute("SELECT coldharbor.register_table(%s)", (table_name,))
    assert pg_conn.execute(f"SELECT count(*) FROM pg_trigger WHERE tgrelid = '{table_name}'::regclass").fetchone()[0] == 0


def test_an_unknown_table_is_rejected(pg_conn):
    with pytest.raises(psycopg.errors.UndefinedTable, match="no_such_table"):
        pg_conn.execute("SELECT coldharbor.register_table('public.no_such_table')")


def test_partition_columns_must_be_part_of_the_key(pg_conn, table_name):
    pg_conn.execute(f"CREATE TABLE {table_name} (id int PRIMARY KEY, day date)")
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="partition column day is not part of the primary key"):
        pg_conn.execute("SELECT coldharbor.register_table(%s, p_partition_by => '{day}')", (table_name,))


@pytest.mark.parametrize("column, shown", [("_ch_seq", "_ch_seq"), ('"_CH_SEQ"', '"_CH_SEQ"')])
def test_reserved_metadata_prefix_is_rejected_in_any_case(pg_conn, table_name, column, shown):
    pg_conn.execute(f"CREATE TABLE {table_name} (id int PRIMARY KEY, {column} int)")
    with pytest.raises(psycopg.errors.InvalidName, match=f"column {shown} .* reserved for lake metadata"):
        pg_conn.execute("SELECT coldharbor.register_table(%s)", (table_name,))


@pytest.mark.parametrize("column", ["unit price", "a,b", "a;b", "f(x)", "a=b", "{x}", "tab\there", "line\nbreak"])
def test_a_column_name_the_lake_cannot_store_is_rejected(pg_conn, table_name, column):
    pg_conn.execute(sql.SQL("CREATE TABLE {} (id int PRIMARY KEY, {} int)").format(
        sql.Identifier(table_name), sql.Identifier(column)))
    with pytest.raises(psycopg.errors.InvalidName, match=r"has a name the lake cannot store") as failure:
        pg_conn.execute("SELECT coldharbor.register_table(%s)", (table_name,))
    quoted = pg_conn.execute("SELECT quote_ident(%s)", (column,)).fetchone()[0]
    assert failure.value.diag.message_primary.startswith(f"column {quoted} of table public.{table_name} ")
    assert pg_conn.execute("SELECT count(*) FROM coldharbor.tables WHERE table_name = %s",
                           (table_name,)).fetchone()[0] == 0
    assert pg_conn.execute(f"SELECT count(*) FROM pg_trigger WHERE tgrelid = '{table_name}'::regclass").fetchone()[0] == 0


def test_column_names_differing_only_in_case_are_rejected(pg_conn, table_name):
    pg_conn.execute(f'CREATE TABLE {table_name} (id int PRIMARY KEY, "Amount" int, amount int)')
    with pytest.raises(psycopg.errors.InvalidName, match='columns "Amount" and amount .* differ only in case'):
        pg_conn.execute("SELECT coldharbor.register_table(%s)", (table_name,))


def test_every_supported_type_registers(pg_conn, table_name):
    tid = register(pg_conn, table_name, """id bigint PRIMARY KEY, a smallint, b integer, c real,
        d double precision, e numeric(38,10), f boolean, g text, h varchar(20), i char(3), j date,
        k timestamp, l timestamptz, m uuid, n bytea, o json, p jsonb""")
    lake_types = pg_conn.execute("SELECT lake_type FROM coldharbor.lake_columns(%s)", (table_name,)).fetchall()
    assert [t[0] for t in lake_types] == ["LONG", "SHORT", "INT", "FLOAT", "DOUBLE", "DECIMAL(38,10)", "BOOLEAN",
                                          "STRING", "STRING", "STRING", "DATE", "TIMESTAMP_NTZ", "TIMESTAMP",
                                          "STRING", "BINARY", "STRING", "STRING"]
    assert tid > 0

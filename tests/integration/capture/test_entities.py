"""Flexible entities in PostgreSQL: schema definition, the validated write helper, the flattening
view and capture (one change per record per transaction), against a real server."""

from __future__ import annotations

import uuid
from datetime import date, datetime, timezone

import psycopg
import pytest

from tests.entities import DOC, HOT, SCHEMA, define, put


def view_row(conn: psycopg.Connection, name: str, row_id: uuid.UUID) -> dict | None:
    cur = conn.execute(f"SELECT * FROM entities.{name} WHERE row_id = %s", (row_id,))
    row = cur.fetchone()
    return None if row is None else dict(zip([d.name for d in cur.description], row))


def changes(conn: psycopg.Connection, name: str) -> list[tuple[str, str]]:
    return [(r[0], r[1]) for r in conn.execute(
        """SELECT c.key ->> 'row_id', c.op FROM coldharbor.change_log c JOIN coldharbor.tables t USING (table_id)
           WHERE t.schema_name = 'entities' AND t.table_name = %s ORDER BY c.id""", (name,)).fetchall()]


def counts(conn: psycopg.Connection) -> tuple[int, int, int]:
    return conn.execute("SELECT (SELECT count(*) FROM coldharbor.entity_main), "
                        "(SELECT count(*) FROM coldharbor.eav_data), "
                        "(SELECT count(*) FROM coldharbor.change_log)").fetchone()


def test_a_document_flattens_to_one_typed_row(pg_conn, entity):
    row_id = put(pg_conn, entity, DOC)
    row = view_row(pg_conn, entity, row_id)
    assert row == {
        "row_id": row_id, "schema_version": 1, "updated_at": row["updated_at"],
        "name": "Ann", "age": 31, "score": 1.5, "vip": True, "born": date(1990, 1, 2),
        "seen": datetime(2024, 1, 1, 10, tzinfo=timezone.utc), "tier": "gold", "tags": ["a", "b"],
        "address": {"city": "Oslo"}, "note": "hi"}
    # Hot attributes sit in typed slot columns of entity_main, each with a B-tree index; the rest in eav_data.
    slots = pg_conn.execute("SELECT hot_slots FROM coldharbor.entity_schemas WHERE name = %s", (entity,)).fetchone()[0]
    assert set(slots) == set(HOT)
    main = pg_conn.execute(f"SELECT {slots['name']}, {slots['age']} FROM coldharbor.entity_main WHERE row_id = %s",
                           (row_id,)).fetchone()
    assert main == ("Ann", 31)
    for slot in slots.values():
        assert pg_conn.execute("SELECT to_regclass(%s)", (f"coldharbor.entity_main_{slot}",)).fetchone()[0]
    eav = {r[0] for r in pg_conn.execute("SELECT attribute FROM coldharbor.eav_data WHERE row_id = %s", (row_id,))}
    assert eav == set(DOC) - set(HOT)


def test_create_update_delete_log_one_change_each(pg_conn, entity):
    row_id = put(pg_conn, entity, DOC)
    put(pg_conn, entity, {"name": "Ann B", "age": 32, "note": "moved"}, row_id)
    row = view_row(pg_conn, entity, row_id)
    # A put replaces the whole record: attributes missing from the document are gone.
    assert (row["name"], row["age"], row["note"], row["score"], row["tier"]) == ("Ann B", 32, "moved", None, None)
    assert pg_conn.execute("SELECT count(*) FROM coldharbor.eav_data WHERE row_id = %s", (row_id,)).fetchone()[0] == 1
    assert pg_conn.execute("SELECT coldharbor.delete_entity(%s)", (row_id,)).fetchone()[0] is True
    assert view_row(pg_conn, entity, row_id) is None
    assert pg_conn.execute("SELECT count(*) FROM coldharbor.eav_data WHERE row_id = %s", (row_id,)).fetchone()[0] == 0
    assert changes(pg_conn, entity) == [(str(row_id), "I"), (str(row_id), "U"), (str(row_id), "D")]
    assert pg_conn.execute("SELECT coldharbor.delete_entity(%s)", (row_id,)).fetchone()[0] is False


def test_a_record_changed_in_both_tables_in_one_transaction_logs_one_change(admin_dsn, entity):
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        row_id = put(conn, entity, DOC)
        slot = conn.execute("SELECT hot_slots ->> 'name' FROM coldharbor.entity_schemas WHERE name = %s",
                            (entity,)).fetchone()[0]
        with conn.transaction():
            conn.execute(f"UPDATE coldharbor.entity_main SET {slot} = 'Direct' WHERE row_id = %s", (row_id,))
            conn.execute("UPDATE coldharbor.eav_data SET value_text = 'direct' WHERE row_id = %s "
                         "AND attribute = 'note'", (row_id,))
            conn.execute("DELETE FROM coldharbor.eav_data WHERE row_id = %s AND attribute = 'vip'", (row_id,))
            put(conn, entity, {**DOC, "age": 40}, row_id)
        assert changes(conn, entity) == [(str(row_id), "I"), (str(row_id), "U")]
        # Two transactions: two changes.
        conn.execute("UPDATE coldharbor.eav_data SET value_text = 'again' WHERE row_id = %s AND attribute = 'note'",
                     (row_id,))
        assert len(changes(conn, entity)) == 3


def test_bulk_statements_log_one_change_per_record(pg_conn, entity):
    ids = [put(pg_conn, entity, {**DOC, "age": i}) for i in range(5)]
    before = len(changes(pg_conn, entity))
    pg_conn.execute("UPDATE coldharbor.eav_data SET value_text = 'bulk' WHERE attribute = 'note' AND row_id = ANY(%s)",
                    (ids,))
    pg_conn.execute("DELETE FROM coldharbor.entity_main WHERE row_id = ANY(%s)", (ids[:2],))
    logged = changes(pg_conn, entity)[before:]
    assert sorted(logged) == sorted([(str(i), "U") for i in ids] + [(str(i), "D") for i in ids[:2]])


@pytest.mark.parametrize("doc, message", [
    ({"name": "B", "age": "x"}, "attribute age of schema .* must be integer, got string"),
    ({"name": "B", "age": 1.5}, "attribute age of schema .* must be an integer within 64 bits, got 1.5"),
    ({"name": "B", "score": "1"}, "attribute score of schema .* must be number, got string"),
    ({"age": 1}, "attribute name is required by schema"),
    ({"name": None}, "attribute name is required by schema|attribute name of schema .* must be string, got null"),
    ({"name": "B", "tier": "bronze"}, r'attribute tier of schema .* must be one of \["gold", "silver"\], got "bronze"'),
    ({"name": "B", "born": "1990-13-01"}, r"attribute born of schema .* must be a date \(YYYY-MM-DD\)"),
    ({"name": "B", "seen": "2024-01-01 10:00"}, "attribute seen of schema .* must be a date-time with a time zone"),
    ({"name": "B", "vip": "yes"}, "attribute vip of schema .* must be boolean"),
    ({"name": "B", "tags": {"a": 1}}, "attribute tags of schema .* must be array, got object"),
    ({"name": "B", "zzz": 1}, "attribute 'zzz' is not in schema"),
    ({"name": "B", "Bad Name": 1}, "attribute 'Bad Name' is not in schema"),
    ({"name": "B", "age": 9223372036854775808}, "must be an integer within 64 bits"),
])
def test_an_invalid_document_is_refused_naming_the_attribute_and_nothing_is_written(pg_conn, entity, doc, message):
    row_id = put(pg_conn, entity, DOC)
    before = counts(pg_conn), view_row(pg_conn, entity, row_id)
    with pytest.raises(psycopg.Error, match=message):
        put(pg_conn, entity, doc, row_id)
    with pytest.raises(psycopg.Error, match=message):
        put(pg_conn, entity, doc)
    assert (counts(pg_conn), view_row(pg_conn, entity, row_id)) == before


def test_unknown_schema_and_foreign_records_are_refused(pg_conn, entity):
    before = counts(pg_conn)
    with pytest.raises(psycopg.errors.UndefinedObject, match="unknown entity schema 'no_such_schema'"):
        put(pg_conn, "no_such_schema", {"name": "x"})
    with pytest.raises(psycopg.errors.UndefinedObject, match="unknown entity schema 'no_such_schema'"):
        pg_conn.execute("SELECT coldharbor.register_entity_schema('no_such_schema')")
    with pytest.raises(psycopg.Error, match="must be a JSON object, got array"):
        put(pg_conn, entity, [1, 2])
    other = f"{entity}_other"
    define(pg_conn, other, {"properties": {"name": {"type": "string"}}})
    row_id = put(pg_conn, entity, DOC)
    with pytest.raises(psycopg.Error, match=f"record {row_id} belongs to schema {entity}, not {other}"):
        put(pg_conn, other, {"name": "x"}, row_id)
    assert counts(pg_conn)[0] == before[0] + 1


@pytest.mark.parametrize("schema, hot, message", [
    ({"properties": {"Bad Name": {"type": "string"}}}, [], "attribute 'Bad Name' is not a valid identifier"),
    ({"properties": {"x;drop": {"type": "string"}}}, [], "attribute 'x;drop' is not a valid identifier"),
    ({"properties": {"row_id": {"type": "string"}}}, [], "attribute row_id is reserved"),
    ({"properties": {"_ch_seq": {"type": "integer"}}}, [], "attribute _ch_seq is reserved"),
    ({"properties": {"x": {"type": "null"}}}, [], "exactly one type"),
    ({"properties": {"x": {"type": ["string", "integer"]}}}, [], "exactly one type"),
    ({"properties": {"x": {}}}, [], "attribute x of schema .* has type none"),
    ({"properties": {"x": {"type": "string", "enum": "a"}}}, [], "enum must be an array"),
    ({"properties": {"x": {"type": "integer", "enum": [1, "a"]}}}, [], "attribute x of schema .* must be integer"),
    ({"properties": {"x": {"type": "string"}}, "required": ["y"]}, [], "required attribute y is not among"),
    ({"properties": {"x": {"type": "object"}}}, ["x"], "attribute x is an object, which has no hot slot"),
    ({"properties": {"x": {"type": "string"}}}, ["y"], "hot attribute y is not among its properties"),
    ({"properties": {f"b{i}": {"type": "boolean"} for i in range(4)}}, [f"b{i}" for i in range(4)],
     "no free boolean slot for hot attribute b3"),
    ({"type": "array", "properties": {}}, [], "must be a JSON Schema object"),
    ({"type": "object"}, [], "must be a JSON Schema object with \"properties\""),
])
def test_a_schema_that_cannot_round_trip_is_refused(pg_conn, schema, hot, message):
    name = f"e_{uuid.uuid4().hex[:10]}"
    with pytest.raises(psycopg.Error, match=message):
        define(pg_conn, name, schema, hot)
    assert pg_conn.execute("SELECT count(*) FROM coldharbor.entity_schemas WHERE name = %s", (name,)).fetchone()[0] == 0


def test_a_schema_name_must_be_an_identifier(pg_conn):
    for bad in ["Customer", "a-b", "x y", "1abc", "a" * 64, 'x"; DROP TABLE t; --']:
        with pytest.raises(psycopg.errors.InvalidName, match="is not a valid identifier"):
            define(pg_conn, bad, {"properties": {}})


def test_evolution_adds_attributes_and_widens_integer_to_number_only(pg_conn, entity):
    old = put(pg_conn, entity, DOC)
    versions = pg_conn.execute("SELECT count(*) FROM coldharbor.entity_schemas WHERE name = %s", (entity,)).fetchone()
    for attr, new_type in [("name", {"type": "integer"}), ("age", {"type": "string"}), ("score", {"type": "integer"}),
                           ("born", {"type": "string", "format": "date-time"}), ("tags", {"type": "string"})]:
        broken = {**SCHEMA, "properties": {**SCHEMA["properties"], attr: new_type}}
        with pytest.raises(psycopg.errors.FeatureNotSupported, match=f"attribute {attr} changes from .* not a safe"):
            define(pg_conn, entity, broken, HOT)
    assert pg_conn.execute("SELECT count(*) FROM coldharbor.entity_schemas WHERE name = %s",
                           (entity,)).fetchone() == versions

    v2 = {**SCHEMA, "properties": {**SCHEMA["properties"], "age": {"type": "number"}, "email": {"type": "string"}}}
    define(pg_conn, entity, v2, ["name", "email"])   # age leaves its slot for eav_data; email takes a slot
    new = put(pg_conn, entity, {"name": "Cy", "age": 2.5, "email": "c@example.com"})
    columns = dict(pg_conn.execute("""SELECT attname, format_type(atttypid, atttypmod) FROM pg_attribute
                                      WHERE attrelid = %s::regclass AND attnum > 0""",
                                   (f"entities.{entity}",)).fetchall())
    assert columns["age"] == "double precision" and columns["email"] == "text"
    assert view_row(pg_conn, entity, old) | {"updated_at": None} == {
        "row_id": old, "schema_version": 1, "updated_at": None, "name": "Ann", "age": 31.0, "score": 1.5, "vip": True,
        "born": date(1990, 1, 2), "seen": datetime(2024, 1, 1, 10, tzinfo=timezone.utc), "tier": "gold",
        "tags": ["a", "b"], "address": {"city": "Oslo"}, "note": "hi", "email": None}
    row = view_row(pg_conn, entity, new)
    assert (row["schema_version"], row["name"], row["age"], row["email"], row["tier"]) == (2, "Cy", 2.5,
                                                                                           "c@example.com", None)


def test_records_of_an_unregistered_schema_are_logged_when_it_is_registered(pg_conn):
    name = f"e_{uuid.uuid4().hex[:10]}"
    define(pg_conn, name, SCHEMA, HOT)
    ids = {put(pg_conn, name, {**DOC, "age": i}) for i in range(3)}
    assert changes(pg_conn, name) == []
    pg_conn.execute("SELECT coldharbor.register_entity_schema(%s)", (name,))
    assert sorted(changes(pg_conn, name)) == sorted((str(i), "I") for i in ids)
    pg_conn.execute("SELECT coldharbor.register_entity_schema(%s)", (name,))   # again: settings only
    assert len(changes(pg_conn, name)) == 3
    [(kind, keys)] = pg_conn.execute("SELECT source_kind, key_columns FROM coldharbor.tables "
                                     "WHERE schema_name = 'entities' AND table_name = %s", (name,)).fetchall()
    assert (kind, keys) == ("entity", ["row_id"])


def test_direct_writes_that_would_break_a_record_are_refused(pg_conn, entity):
    row_id = put(pg_conn, entity, DOC)
    before = counts(pg_conn)
    with pytest.raises(psycopg.errors.ForeignKeyViolation, match="which is not in entity_main"):
        pg_conn.execute("INSERT INTO coldharbor.eav_data (row_id, attribute, value_text) VALUES (%s, 'note', 'x')",
                        (uuid.uuid4(),))
    with pytest.raises(psycopg.errors.FeatureNotSupported, match="row_id of an entity record cannot change"):
        pg_conn.execute("UPDATE coldharbor.entity_main SET row_id = %s WHERE row_id = %s", (uuid.uuid4(), row_id))
    for table in ("entity_main", "eav_data"):
        with pytest.raises(psycopg.errors.FeatureNotSupported, match=f"TRUNCATE of coldharbor.{table} is not captured"):
            pg_conn.execute(f"TRUNCATE coldharbor.{table}")
    assert counts(pg_conn) == before

"""Shared by the entity tests: a schema exercising every attribute kind, a document of it, and
the SQL calls that define schemas and write records."""

from __future__ import annotations

import json
import uuid

import psycopg

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "age": {"type": "integer"},
        "score": {"type": "number"},
        "vip": {"type": "boolean"},
        "born": {"type": "string", "format": "date"},
        "seen": {"type": "string", "format": "date-time"},
        "tier": {"type": "string", "enum": ["gold", "silver"]},
        "tags": {"type": "array"},
        "address": {"type": ["object", "null"]},
        "note": {"type": "string"},
    },
    "required": ["name"],
}
HOT = ["name", "age", "tier"]
DOC = {"name": "Ann", "age": 31, "score": 1.5, "vip": True, "born": "1990-01-02", "seen": "2024-01-01T10:00:00Z",
       "tier": "gold", "tags": ["a", "b"], "address": {"city": "Oslo"}, "note": "hi"}


def define(conn: psycopg.Connection, name: str, schema: dict, hot: list[str] = ()) -> int:
    return conn.execute("SELECT coldharbor.define_entity_schema(%s, %s::jsonb, %s)",
                        (name, json.dumps(schema), list(hot))).fetchone()[0]


def put(conn: psycopg.Connection, name: str, doc: dict, row_id: uuid.UUID | None = None) -> uuid.UUID:
    return conn.execute("SELECT coldharbor.put_entity(%s, %s::jsonb, %s)",
                        (name, json.dumps(doc), row_id)).fetchone()[0]

"""The lake's copy of the registry (for best-effort reports without PostgreSQL)."""

from __future__ import annotations

import json

from coldharbor.capture.registry import LakeColumn, RegisteredTable
from coldharbor.lake import registry_cache

ID = [LakeColumn("id", "bigint", "LONG", 1)]


def table(table_id: int, schema: str, name: str) -> RegisteredTable:
    return RegisteredTable(table_id, schema, name, ("id",), None, (), ())


def test_tables_whose_names_spell_alike_are_both_kept(tmp_path):
    """"a.b".c and a."b.c" are both schema.table "a.b.c": the copy kept one of them."""
    root = str(tmp_path)
    registry_cache.save(None, root, [(table(1, "a.b", "c"), ID), (table(2, "a", "b.c"), ID)])
    tables, columns = registry_cache.load(None, root)
    assert sorted((t.table_id, t.schema_name, t.table_name) for t in tables) == [(1, "a.b", "c"), (2, "a", "b.c")]
    assert set(columns) == {1, 2}


def test_a_copy_written_before_keeps_each_table_once(tmp_path):
    root = str(tmp_path)
    old = {"a.b.t": {"table": [7, "a.b", "t", ["id"], None, [], []], "columns": [["id", "bigint", "LONG", 1]]},
           "public.u": {"table": [8, "public", "u", ["id"], None, [], []], "columns": [["id", "bigint", "LONG", 1]]}}
    (tmp_path / "_coldharbor").mkdir()
    (tmp_path / "_coldharbor" / "registry.json").write_text(json.dumps(old))
    registry_cache.save(None, root, [(table(7, "a.b", "t"), ID)])  # now keyed "a.b".t
    tables, _ = registry_cache.load(None, root)
    assert sorted(t.table_id for t in tables) == [7, 8]

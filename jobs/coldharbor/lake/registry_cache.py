"""A copy of the registry kept in the lake, so that a best-effort report can still read the lake
when PostgreSQL is unreachable. Every report run that reaches PostgreSQL refreshes it."""

from __future__ import annotations

import json
from collections.abc import Sequence

from pyspark.sql import SparkSession

from coldharbor.capture.registry import LakeColumn, RegisteredTable
from coldharbor.lake import lake_store
from coldharbor.runtime.errors import PostgresUnavailableError


def cache_path(lake_root: str) -> str:
    return f"{lake_root}/_coldharbor/registry.json"


def save(spark: SparkSession, lake_root: str, tables: Sequence[tuple[RegisteredTable, Sequence[LakeColumn]]]) -> None:
    # Keyed by the quoted name: "a.b".c and a."b.c" are two tables (their schema.table spelling is one).
    entries = {t.quoted_name: {"table": [t.table_id, t.schema_name, t.table_name, list(t.key_columns),
                                         t.lake_location, list(t.partition_by), list(t.sort_by)],
                               "columns": [[c.name, c.pg_type, c.lake_type, c.key_position] for c in columns]}
               for t, columns in tables}
    current = lake_store.read_text(cache_path(lake_root))
    saved = {t.table_id for t, _ in tables}
    # An entry of a table saved now goes, whatever its key (a copy written before keyed it otherwise).
    kept = {k: v for k, v in (json.loads(current) if current else {}).items() if v["table"][0] not in saved}
    merged = {**kept, **entries}
    if merged != (json.loads(current) if current else None):
        lake_store.write_text(cache_path(lake_root), json.dumps(merged, sort_keys=True))


def load(spark: SparkSession, lake_root: str) -> tuple[list[RegisteredTable], dict[int, list[LakeColumn]]]:
    text = lake_store.read_text(cache_path(lake_root))
    if text is None:
        raise PostgresUnavailableError("PostgreSQL is unreachable and the lake holds no registry copy yet "
                                       f"({cache_path(lake_root)}); a best-effort report needs one earlier run")
    tables, columns = [], {}
    for entry in json.loads(text).values():
        t = entry["table"]
        table = RegisteredTable(t[0], t[1], t[2], tuple(t[3]), t[4], tuple(t[5]), tuple(t[6]))
        tables.append(table)
        columns[table.table_id] = [LakeColumn(*c) for c in entry["columns"]]
    return tables, columns

"""Entity export benchmark (issue: flexible entities): records of 20 attributes (5 hot in
entity_main slots, 15 in eav_data) flattened and exported, side by side with a plain 20-column
table holding the same data.

    python -m bench.entities [--records 1000000] [--rounds 2]

Both sources are loaded once; each round exports both (order alternating, so machine noise hits
both alike) into a fresh lake folder, after marking every change dirty again. Targets are
printed, never asserted.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile

from coldharbor.capture import registry
from coldharbor.export.table_export import ExportConfig, export_table
from coldharbor.runtime import pg

from bench.common import Row, median, render, temporary_postgres, timed

# attribute -> (JSON Schema property, plain column type, SQL value of record g)
ATTRIBUTES = {
    "name": ({"type": "string"}, "text", "'name-' || g"),
    "city": ({"type": "string"}, "text", "'city-' || (g % 100)"),
    "age": ({"type": "integer"}, "bigint", "g % 90"),
    "balance": ({"type": "number"}, "double precision", "(g % 10000)::float8 / 7"),
    "active": ({"type": "boolean"}, "boolean", "g % 2 = 0"),
    "email": ({"type": "string"}, "text", "'user' || g || '@example.com'"),
    "phone": ({"type": "string"}, "text", "'+47-' || g"),
    "country": ({"type": "string"}, "text", "'c' || (g % 30)"),
    "segment": ({"type": "string", "enum": ["a", "b", "c"]}, "text", "(ARRAY['a','b','c'])[1 + g % 3]"),
    "notes": ({"type": "string"}, "text", "md5(g::text)"),
    "visits": ({"type": "integer"}, "bigint", "g % 1000"),
    "orders": ({"type": "integer"}, "bigint", "g % 50"),
    "points": ({"type": "integer"}, "bigint", "g * 3"),
    "rating": ({"type": "number"}, "double precision", "(g % 50)::float8 / 10"),
    "discount": ({"type": "number"}, "double precision", "(g % 20)::float8 / 100"),
    "verified": ({"type": "boolean"}, "boolean", "g % 3 = 0"),
    "signup": ({"type": "string", "format": "date"}, "date", "date '2020-01-01' + (g % 2000)"),
    "last_login": ({"type": "string", "format": "date-time"}, "timestamptz",
                   "timestamptz '2026-01-01 00:00:00+00' + g * interval '1 second'"),
    "prefs": ({"type": "object"}, "jsonb", "jsonb_build_object('theme', 'dark', 'n', g % 10)"),
    "tags": ({"type": "array"}, "jsonb", "jsonb_build_array('t' || (g % 5))"),
}
HOT = ["name", "city", "age", "balance", "active"]
KIND_COLUMN = {"string": "value_text", "integer": "value_integer", "number": "value_number",
               "boolean": "value_boolean", "object": "value_json", "array": "value_json"}
VALUE_TYPES = {"value_text": "text", "value_integer": "bigint", "value_number": "double precision",
               "value_boolean": "boolean", "value_date": "date", "value_timestamp": "timestamptz", "value_json": "jsonb"}
ROW_ID = "md5(g::text)::uuid"


def _value_column(prop: dict) -> str:
    fmt = prop.get("format")
    if fmt == "date":
        return "value_date"
    if fmt == "date-time":
        return "value_timestamp"
    return KIND_COLUMN[prop["type"]]


def load(dsn: str, records: int) -> None:
    """The plain table (captured as it is filled) and the entity records (registered afterwards,
    which logs every record once): the same values, record for record."""
    with pg.connect(dsn) as conn:
        columns = ", ".join(f"{a} {t}" for a, (_, t, _) in ATTRIBUTES.items())
        conn.execute(f"CREATE TABLE bench_plain (row_id uuid PRIMARY KEY, {columns})")
        conn.execute("SELECT coldharbor.register_table('bench_plain')")
        conn.execute(f"INSERT INTO bench_plain SELECT {ROW_ID}, "
                     f"{', '.join(v for _, _, v in ATTRIBUTES.values())} FROM generate_series(1, {int(records)}) g")

        schema = {"type": "object", "properties": {a: p for a, (p, _, _) in ATTRIBUTES.items()}, "required": ["name"]}
        schema_id = conn.execute("SELECT coldharbor.define_entity_schema('bench_entity', %s::jsonb, %s)",
                                 (json.dumps(schema), HOT)).fetchone()[0]
        slots = conn.execute("SELECT hot_slots FROM coldharbor.entity_schemas WHERE schema_id = %s",
                             (schema_id,)).fetchone()[0]
        conn.execute(f"INSERT INTO coldharbor.entity_main (row_id, schema_id, {', '.join(slots[a] for a in HOT)}) "
                     f"SELECT {ROW_ID}, {schema_id}, {', '.join(ATTRIBUTES[a][2] for a in HOT)} "
                     f"FROM generate_series(1, {int(records)}) g")
        eav = [a for a in ATTRIBUTES if a not in HOT]
        value_columns = list(VALUE_TYPES)
        rows = []
        for a in eav:
            column = _value_column(ATTRIBUTES[a][0])
            values = ", ".join(f"({ATTRIBUTES[a][2]})::{VALUE_TYPES[c]}" if c == column else f"NULL::{VALUE_TYPES[c]}"
                               for c in value_columns)
            rows.append(f"('{a}', {values})")
        # A record's attributes side by side, as put_entity writes them.
        conn.execute(f"INSERT INTO coldharbor.eav_data (row_id, attribute, {', '.join(value_columns)}) "
                     f"SELECT {ROW_ID}, v.* FROM generate_series(1, {int(records)}) g "
                     f"CROSS JOIN LATERAL (VALUES {', '.join(rows)}) v")
        conn.execute("SELECT coldharbor.register_entity_schema('bench_entity')")
        for table in ("bench_plain", "coldharbor.entity_main", "coldharbor.eav_data", "coldharbor.change_log"):
            conn.execute(f"VACUUM ANALYZE {table}")


def export_once(spark, dsn: str, name: str, lake_root: str, records: int) -> float:
    with pg.connect(dsn) as conn:
        [table] = registry.load(conn, name)
        config = ExportConfig(table=name, lake_root=lake_root, run_id="bench")
        result = {}
        seconds = timed(lambda: result.update(r=export_table(spark, conn, pg.JdbcTarget.from_dsn(dsn), table, config)))
        assert result["r"].rows == records, result
        # Dirty again for the next round: the same changes, a fresh lake folder.
        conn.execute("UPDATE coldharbor.change_log SET flushed_at = NULL, lake_version = NULL WHERE table_id = %s",
                     (table.table_id,))
        conn.execute("VACUUM ANALYZE coldharbor.change_log")
    return seconds


def warm_up(spark, dsn: str) -> None:
    """One small export first, so neither measured export pays the JVM's first-use costs."""
    with pg.connect(dsn) as conn:
        conn.execute("CREATE TABLE bench_warm_up (id bigint PRIMARY KEY, v text)")
        conn.execute("SELECT coldharbor.register_table('bench_warm_up')")
        conn.execute("INSERT INTO bench_warm_up SELECT g, md5(g::text) FROM generate_series(1, 10000) g")
    with tempfile.TemporaryDirectory(prefix="coldharbor-lake-") as lake_root:
        export_once(spark, dsn, "public.bench_warm_up", lake_root, 10_000)


def run(records: int = 1_000_000, rounds: int = 2) -> list[Row]:
    from coldharbor.runtime.spark import get_session

    times: dict[str, list[float]] = {"public.bench_plain": [], "entities.bench_entity": []}
    with temporary_postgres() as dsn:
        load(dsn, records)
        spark = get_session("coldharbor-bench-entities")
        spark.sparkContext.setLogLevel("ERROR")
        warm_up(spark, dsn)
        for r in range(rounds):
            order = list(times) if r % 2 == 0 else list(reversed(times))
            for name in order:
                with tempfile.TemporaryDirectory(prefix="coldharbor-lake-") as lake_root:
                    times[name].append(export_once(spark, dsn, name, lake_root, records))
    plain, entity = median(times["public.bench_plain"]), median(times["entities.bench_entity"])
    ratio = plain / entity
    return [
        Row("entities", f"export {records:,} rows of a plain 20-column table (median of {rounds})",
            records / plain, "rows/s", "", None),
        Row("entities", f"export {records:,} entity records, 20 attributes (5 hot, 15 eav)",
            records / entity, "rows/s", "", None),
        Row("entities", "entity export speed / plain export speed", ratio, "x", ">= 0.5x", ratio >= 0.5),
    ]


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args(argv)
    print(render(run(records=args.records, rounds=args.rounds)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""Entity schemas through the pipeline: the CDC export flattens records into one typed wide row
each (exact flush, last write wins), the lake table widens with the schema, and the read path
serves the latest document of every record, dirty ones included. Real PostgreSQL, Spark + Delta."""

from __future__ import annotations

import json

import pytest
from coldharbor.capture import registry
from coldharbor.lake import commits, delta
from coldharbor.runtime.errors import ConfigError
from pyspark.sql import functions as F

from tests.entities import DOC, SCHEMA, define, put
from tests.helpers import dirty_ids, export, lake_live, lake_table, pg_rows, report_run, serve_report, spark_submit

# The view as the lake types it: uuid and JSON as text, timestamps in UTC.
VIEW_AS_LAKE = ("SELECT row_id::text AS row_id, schema_version, updated_at, address::text AS address, age, born, "
                "name, note, score, seen, tags::text AS tags, tier, vip FROM entities.{}")


def documents(count: int) -> list[dict]:
    return [{**DOC, "name": f"n{i}", "age": i, "score": i / 4, "vip": i % 2 == 0, "tier": ["gold", "silver"][i % 2],
             "tags": [f"t{i}"], "address": None if i % 3 == 0 else {"n": i}, "note": f"note {i}"}
            for i in range(count)]


def lake_rows_of(spark, lake_root: str, name: str) -> dict:
    live = lake_live(spark, lake_root, f"entities.{name}", ["row_id"])
    return {key: {c: v for c, v in row.items() if not c.startswith("_ch_")} for key, row in live.items()}


def test_export_flattens_each_record_into_one_typed_wide_row(spark, pg_dsn, pg_conn, entity, lake_root):
    ids = [put(pg_conn, entity, doc) for doc in documents(20)]
    result = export(spark, pg_dsn, f"entities.{entity}", lake_root)
    assert (result.status, result.rows, result.changes) == ("exported", 20, 20)
    assert dirty_ids(pg_conn, f"entities.{entity}") == []

    schema = {f.name: f.dataType.simpleString() for f in lake_table(spark, lake_root, f"entities.{entity}").schema}
    assert {k: schema[k] for k in ("row_id", "name", "age", "score", "vip", "born", "seen", "tags", "address")} == {
        "row_id": "string", "name": "string", "age": "bigint", "score": "double", "vip": "boolean",
        "born": "date", "seen": "timestamp", "tags": "string", "address": "string"}
    # Flattening equals the JSON documents written.
    lake_rows = lake_rows_of(spark, lake_root, entity)
    for row_id, doc in zip(ids, documents(20)):
        row = lake_rows[(str(row_id),)]
        assert {k: row[k] for k in ("name", "age", "score", "vip", "tier", "note")} == {
            k: doc[k] for k in ("name", "age", "score", "vip", "tier", "note")}
        assert str(row["born"]) == doc["born"] and row["seen"].isoformat() == "2024-01-01T10:00:00"
        assert json.loads(row["tags"]) == doc["tags"]
        assert (None if row["address"] is None else json.loads(row["address"])) == doc["address"]
    assert lake_rows == pg_rows(pg_conn, VIEW_AS_LAKE.format(entity), ["row_id"])


def test_updates_and_deletes_reach_the_lake_last_write_wins(spark, pg_dsn, pg_conn, entity, lake_root):
    ids = [put(pg_conn, entity, doc) for doc in documents(10)]
    export(spark, pg_dsn, f"entities.{entity}", lake_root)
    put(pg_conn, entity, {"name": "renamed", "age": 99, "note": "only hot and one eav"}, ids[0])
    pg_conn.execute("UPDATE coldharbor.eav_data SET value_text = 'direct' WHERE row_id = %s AND attribute = 'note'",
                    (ids[1],))
    pg_conn.execute("SELECT coldharbor.delete_entity(%s)", (ids[2],))
    created = put(pg_conn, entity, {"name": "new"})
    result = export(spark, pg_dsn, f"entities.{entity}", lake_root)
    assert (result.rows, result.changes) == (4, 4)
    lake_rows = lake_rows_of(spark, lake_root, entity)
    assert (str(ids[2]),) not in lake_rows
    assert lake_rows[(str(ids[0]),)]["score"] is None and lake_rows[(str(ids[0]),)]["age"] == 99
    assert lake_rows[(str(ids[1]),)]["note"] == "direct"
    assert lake_rows[(str(created),)]["name"] == "new"
    assert lake_rows == pg_rows(pg_conn, VIEW_AS_LAKE.format(entity), ["row_id"])
    # A replay of the export finds nothing dirty and changes nothing.
    assert export(spark, pg_dsn, f"entities.{entity}", lake_root).status == "clean"


def test_a_change_after_the_read_stays_dirty_and_goes_next_run(spark, pg_dsn, pg_conn, entity, lake_root):
    [row_id] = [put(pg_conn, entity, doc) for doc in documents(1)]

    def hook(point: str) -> None:
        if point == "after_read":
            put(pg_conn, entity, {**DOC, "name": "late"}, row_id)

    export(spark, pg_dsn, f"entities.{entity}", lake_root, hook)
    assert len(dirty_ids(pg_conn, f"entities.{entity}")) == 1
    assert lake_rows_of(spark, lake_root, entity)[(str(row_id),)]["name"] == "n0"
    export(spark, pg_dsn, f"entities.{entity}", lake_root)
    assert lake_rows_of(spark, lake_root, entity)[(str(row_id),)]["name"] == "late"


def test_a_new_schema_version_widens_the_lake_table(spark, pg_dsn, pg_conn, entity, lake_root):
    old = [put(pg_conn, entity, doc) for doc in documents(3)]
    export(spark, pg_dsn, f"entities.{entity}", lake_root)
    name = f"entities.{entity}"
    path = registry.load(pg_conn, name)[0].lake_path(lake_root)

    v2 = {**SCHEMA, "properties": {**SCHEMA["properties"], "age": {"type": "number"}, "email": {"type": "string"}}}
    define(pg_conn, entity, v2, ["name", "email"])
    new = put(pg_conn, entity, {"name": "Cy", "age": 2.5, "email": "c@example.com"})
    put(pg_conn, entity, {**documents(3)[1], "age": 7}, old[1])
    export(spark, pg_dsn, name, lake_root)

    schema = {f.name: f.dataType.simpleString() for f in lake_table(spark, lake_root, name).schema}
    assert (schema["age"], schema["email"]) == ("double", "string")
    rows = lake_rows_of(spark, lake_root, entity)
    assert rows[(str(new),)]["age"] == 2.5 and rows[(str(new),)]["email"] == "c@example.com"
    assert rows[(str(old[0]),)]["age"] == 0.0 and rows[(str(old[0]),)]["email"] is None   # rewritten, not lost
    assert rows[(str(old[1]),)]["age"] == 7.0
    assert rows == pg_rows(pg_conn, VIEW_AS_LAKE.format(entity).replace(", vip FROM", ", vip, email FROM"),
                           ["row_id"])
    history = commits.find_commit_entry(spark, path, {"operation": "coldharbor-widen"})
    assert history is not None
    # Versions before the rewrite are still readable (a report pinned there casts them).
    assert spark.read.format("delta").option("versionAsOf", 0).load(path).schema["age"].dataType.simpleString() \
        == "bigint"


def test_a_type_change_the_lake_cannot_take_is_refused_before_anything_is_written(spark, pg_dsn, pg_conn,
                                                                                 entity, lake_root):
    """The registry refuses it first; if the view is changed behind its back, the export refuses."""
    put(pg_conn, entity, DOC)
    export(spark, pg_dsn, f"entities.{entity}", lake_root)
    path = registry.load(pg_conn, f"entities.{entity}")[0].lake_path(lake_root)
    version = delta.pin_version(spark, path)
    view = pg_conn.execute("SELECT pg_get_viewdef(%s::regclass)", (f"entities.{entity}",)).fetchone()[0]
    view = view.strip().rstrip(";")
    with pg_conn.transaction():  # as the schema's owner, whose views the pipeline may read
        pg_conn.execute("SET LOCAL ROLE coldharbor_owner")
        pg_conn.execute(f"DROP VIEW entities.{entity}")
        pg_conn.execute(f"CREATE VIEW entities.{entity} AS SELECT row_id, schema_version, updated_at, address, "
                        f"age::text AS age, born, name, note, score, seen, tags, tier, vip FROM ({view}) v")
    put(pg_conn, entity, {**DOC, "name": "x"})
    dirty = dirty_ids(pg_conn, f"entities.{entity}")
    with pytest.raises(ConfigError, match="column age's type changed: its values now need the lake \\(Spark SQL\\) type string, but the lake table at .* holds it as bigint"):
        export(spark, pg_dsn, f"entities.{entity}", lake_root)
    assert delta.pin_version(spark, path) == version
    assert dirty_ids(pg_conn, f"entities.{entity}") == dirty


def test_the_read_path_serves_the_latest_document_of_every_record(spark, pg_dsn, pg_conn, entity, lake_root,
                                                                  monkeypatch):
    ids = [put(pg_conn, entity, doc) for doc in documents(12)]
    export(spark, pg_dsn, f"entities.{entity}", lake_root)
    # Dirty after the export: an update in both tables, a delete, a new record.
    put(pg_conn, entity, {**documents(12)[3], "name": "hot now", "note": "changed"}, ids[3])
    pg_conn.execute("SELECT coldharbor.delete_entity(%s)", (ids[4],))
    put(pg_conn, entity, {"name": "brand new", "age": 1000})
    target = f"adhoc_{entity}"
    sql = f"SELECT row_id, name, age, score, vip, tier, note, tags, address FROM {entity} WHERE age >= 3"
    assert serve_report(monkeypatch, pg_dsn, lake_root, "--sql", sql, "--target", target) == 0
    expected = pg_rows(pg_conn, "SELECT row_id::text AS row_id, name, age, score, vip, tier, note, tags::text AS tags, "
                                f"address::text AS address FROM entities.{entity} WHERE age >= 3", ["row_id"])
    assert pg_rows(pg_conn, f"SELECT * FROM reports.{target}", ["row_id"]) == expected
    assert expected[(str(ids[3]),)]["name"] == "hot now" and (str(ids[4]),) not in expected
    assert len(expected) == 12 - 3 - 1 + 1
    run = pg_conn.execute("SELECT dirty_rows FROM coldharbor.report_runs WHERE target LIKE %s "
                          "ORDER BY started_at DESC LIMIT 1", (f"%{target}",)).fetchone()
    assert run is not None and run[0] == {f"entities.{entity}": 3}


def test_purge_deletes_records_in_both_tiers(spark, pg_dsn, pg_conn, entity, lake_root, monkeypatch):
    from coldharbor.maintenance import purge

    ids = [put(pg_conn, entity, doc) for doc in documents(6)]
    export(spark, pg_dsn, f"entities.{entity}", lake_root)
    monkeypatch.setenv("COLDHARBOR_PG_DSN", pg_dsn)
    code = purge.main(["--table", f"entities.{entity}", "--where", "tier = 'silver'", "--lake-root", lake_root,
                       "--vacuum-retention-hours", "0", "--allow-short-retention"])
    assert code == 0
    remaining = {r[0] for r in pg_conn.execute(f"SELECT row_id FROM entities.{entity}")}
    assert remaining == {ids[0], ids[2], ids[4]}
    assert pg_conn.execute("SELECT count(*) FROM coldharbor.eav_data WHERE row_id = ANY(%s)",
                           ([ids[1], ids[3], ids[5]],)).fetchone()[0] == 0
    live = lake_rows_of(spark, lake_root, entity)
    assert set(live) == {(str(i),) for i in remaining}
    assert lake_table(spark, lake_root, f"entities.{entity}").filter(F.col("tier") == "silver").count() == 0


def test_the_demo_entity_report_runs_under_spark_submit(spark, pg_dsn, admin_dsn, pg_conn, lake_root):
    """The shipped report over the demo entity schema, as its DAG runs it, with dirty records."""
    from coldharbor.embedded import stack

    stack.demo(admin_dsn, "demo-password", rows=300)   # also defines, registers and fills entities.demo_customer
    export(spark, pg_dsn, f"entities.{stack.DEMO_ENTITY}", lake_root)
    for (row_id,) in pg_conn.execute("SELECT row_id FROM entities.demo_customer LIMIT 5").fetchall():
        stack.put_demo_customer(pg_conn, row_id)             # dirty again: replaced documents
    done = spark_submit("serve_report.py", pg_dsn, lake_root, "--report", "demo_customers_by_tier",
                        "--param", "min_credit=1000", "--run-id", "entity-report-1")
    assert done.returncode == 0, done.stdout[-3000:]
    expected = {(r[0], r[1]): (r[2], float(r[3]), r[4]) for r in pg_conn.execute(
        """SELECT tier, country, count(*), avg(credit), sum(CASE WHEN newsletter THEN 1 ELSE 0 END)
           FROM entities.demo_customer WHERE credit >= 1000 GROUP BY tier, country""")}
    served = {(r[0], r[1]): (r[2], r[3], r[4]) for r in pg_conn.execute(
        "SELECT tier, country, customers, avg_credit, newsletter_subscribers FROM reports.demo_customers_by_tier")}
    assert served.keys() == expected.keys() and expected
    for key, (count, avg, subscribers) in expected.items():
        assert served[key][0] == count and served[key][2] == subscribers
        assert abs(served[key][1] - avg) < 1e-6
    run = report_run(pg_conn, "entity-report-1")
    assert run["state"] == "succeeded" and run["dirty_rows"][f"entities.{stack.DEMO_ENTITY}"] == 5

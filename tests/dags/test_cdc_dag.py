"""coldharbor_cdc end to end with dag.test(): real PostgreSQL, real spark-submit, real Delta, and
its StatsD gauges sent through Airflow's metrics client to a real UDP socket."""

from __future__ import annotations

from tests.dags.statsd_socket import received, statsd_listener, stop_sending
from tests.helpers import PROJECT, dirty_ids, lake_live, pg_rows


def test_one_cycle_exports_the_dirty_table_and_a_clean_cycle_maps_nothing(airflow_home, spark, pg_conn,
                                                                         table_name, tmp_path, monkeypatch):
    from airflow.dag_processing.dagbag import DagBag
    from coldharbor_airflow.hooks import ColdharborHook
    from delta.tables import DeltaTable

    lake_root = str(tmp_path / "lake")
    monkeypatch.setenv("COLDHARBOR_LAKE_ROOT", lake_root)
    pg_conn.execute(f"CREATE TABLE {table_name} (id bigint PRIMARY KEY, v text)")
    pg_conn.execute("SELECT coldharbor.register_table(%s)", (table_name,))
    pg_conn.execute(f"INSERT INTO {table_name} SELECT g, 'v' || g FROM generate_series(1, 50) g")
    pg_conn.execute(f"DELETE FROM {table_name} WHERE id > 45")
    # Other tests' tables may be dirty too: export only this one by cleaning the rest first.
    pg_conn.execute("""UPDATE coldharbor.change_log c SET flushed_at = now()
                        FROM coldharbor.tables t WHERE t.table_id = c.table_id AND t.table_name <> %s
                         AND c.flushed_at IS NULL""", (table_name,))

    listener = statsd_listener(monkeypatch)
    dag = DagBag(dag_folder=str(PROJECT / "dags")).dags["coldharbor_cdc"]
    try:
        run = dag.test()
        first = received(listener)
        clean = dag.test()
        sent = received(listener)
    finally:
        stop_sending(listener)
    assert run.state == "success", run
    states = {(ti.task_id, ti.map_index): ti.state for ti in run.get_task_instances()}
    assert states[("export", 0)] == "success", states
    assert states[("publish_metrics", -1)] == "success", states
    assert states[("check_freshness", -1)] == "success", states
    assert f"airflow.coldharbor.table.public.{table_name}.dirty_rows" in first
    assert dirty_ids(pg_conn, table_name) == []
    assert lake_live(spark, lake_root, table_name, ["id"]) == pg_rows(pg_conn, f"SELECT * FROM {table_name}", ["id"])

    assert clean.state == "success"
    assert {ti.task_id: ti.state for ti in clean.get_task_instances()}["export"] == "skipped"
    # The clean cycle's gauges: nothing dirty, the first cycle's export as PostgreSQL recorded it,
    # the lake table's files as its Delta log lists them.
    [health] = [t for t in ColdharborHook().health()["tables"] if t["table_name"] == table_name]
    prefix = f"airflow.coldharbor.table.public.{table_name}"
    assert sent[f"{prefix}.dirty_rows"] == 0 and sent[f"{prefix}.oldest_dirty_change_age_seconds"] == 0, sent
    assert sent[f"{prefix}.last_export_rows"] == health["last_export_rows"] > 0
    files = DeltaTable.forPath(spark, f"{lake_root}/public/{table_name}").detail().first()
    assert (sent[f"{prefix}.lake_files"], sent[f"{prefix}.lake_bytes"]) == (files["numFiles"], files["sizeInBytes"])
    assert sent[f"{prefix}.lake_readable"] == 1 and sent["airflow.coldharbor.up.postgres"] == 1

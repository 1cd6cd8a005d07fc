"""coldharbor_cdc end to end with dag.test(): real PostgreSQL, real spark-submit, real Delta, and
its StatsD gauges sent through Airflow's metrics client to a real UDP socket."""

from __future__ import annotations

import socket

from tests.helpers import PROJECT, dirty_ids, lake_live, pg_rows


def statsd_listener(monkeypatch) -> socket.socket:
    """A UDP socket on 127.0.0.1 that Airflow's metrics client sends to: [metrics] statsd_on, as a
    deployment sets it. dag.test() runs tasks in this process, where no task runner's main() has
    initialised Airflow's Stats from that configuration: the test does what main() does."""
    from airflow.sdk.observability import stats
    from airflow.sdk.observability.metrics.stats_utils import get_stats_factory

    listener = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    listener.bind(("127.0.0.1", 0))
    listener.settimeout(0.2)
    for key, value in {"STATSD_ON": "True", "STATSD_HOST": "127.0.0.1", "STATSD_PORT": str(listener.getsockname()[1]),
                       "STATSD_PREFIX": "airflow"}.items():
        monkeypatch.setenv(f"AIRFLOW__METRICS__{key}", value)
    stats.initialize(factory=get_stats_factory(), export_legacy_names=False)
    return listener


def received(listener: socket.socket) -> dict[str, float]:
    """{name: value} of every gauge received so far (the last value of each)."""
    gauges: dict[str, float] = {}
    while True:
        try:
            datagram = listener.recv(65536).decode()
        except TimeoutError:
            return gauges
        for line in datagram.splitlines():
            name, _, value = line.partition(":")
            if value.endswith("|g"):
                gauges[name] = float(value.removesuffix("|g"))


def test_one_cycle_exports_the_dirty_table_and_a_clean_cycle_maps_nothing(airflow_home, spark, pg_conn,
                                                                         table_name, tmp_path, monkeypatch):
    from airflow.dag_processing.dagbag import DagBag
    from airflow.sdk.observability import stats
    from airflow.sdk.observability.metrics.stats_utils import NoStatsLogger
    from delta.tables import DeltaTable

    from coldharbor_airflow.hooks import ColdharborHook

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
        stats.initialize(factory=NoStatsLogger, export_legacy_names=False)
        listener.close()
    assert run.state == "success", run
    states = {(ti.task_id, ti.map_index): ti.state for ti in run.get_task_instances()}
    assert states[("export", 0)] == "success", states
    assert states[("publish_metrics", -1)] == "success", states
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

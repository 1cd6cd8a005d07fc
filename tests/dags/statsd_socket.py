"""A real UDP socket that Airflow's StatsD client sends to, for the tests of the metrics a DAG sends."""

from __future__ import annotations

import socket


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


def stop_sending(listener: socket.socket) -> None:
    """Airflow's Stats back to sending nothing (as before `statsd_listener`); the socket closed."""
    from airflow.sdk.observability import stats
    from airflow.sdk.observability.metrics.stats_utils import NoStatsLogger

    stats.initialize(factory=NoStatsLogger, export_legacy_names=False)
    listener.close()

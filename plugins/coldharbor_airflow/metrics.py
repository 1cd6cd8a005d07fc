"""Prometheus metrics of the pipeline, served at /coldharbor/metrics behind Airflow's login (the
health page's app and its `page_auth` check), in the text exposition format.

Every metric is a gauge read at scrape time from the hot tier's registry and each table's Delta log
(the same figures as the health page):

    coldharbor_up{tier}                                    1 when the tier could be read, else 0:
                                                           tier="lake" is 0 when any exported table's
                                                           Delta log could not be read, and absent
                                                           while PostgreSQL is down (the tables, so
                                                           their folders, are unknown)
    coldharbor_table_dirty_rows{schema,table}              changes not yet in the lake
    coldharbor_table_oldest_dirty_change_age_seconds{...}  age of the oldest of them (or of a pending base); 0 when none
    coldharbor_table_freshness_promise_seconds{...}        the table's freshness promise (p_freshness):
                                                           lagging when the age above is past it
    coldharbor_table_last_export_rows{...}                 rows the last export of changes wrote (an
                                                           initial load's or a resync's base is not one)
    coldharbor_table_last_export_duration_seconds{...}     how long that export took
    coldharbor_table_last_export_timestamp_seconds{...}    when it finished (Unix time)
    coldharbor_table_landing_rows{...}                     a lake-first table's rows still in PostgreSQL
                                                           (absent for other tables)
    coldharbor_table_lake_readable{...}                    1 when its Delta log could be read, else 0
                                                           (absent before its first export)
    coldharbor_table_lake_version{...}                     the Delta table's current version
    coldharbor_table_lake_files{...}                       its data files
    coldharbor_table_lake_bytes{...}                       their size
    coldharbor_report_runs_24h{report}                     runs started in the last 24 hours (every
                                                           report with a run on record, 0 included)
    coldharbor_report_failed_runs_24h{report}              of which failed
    coldharbor_report_last_run_duration_seconds{report}    the last finished run's duration
    coldharbor_report_last_run_failed{report}              1 when that run failed

A table without an export, or whose log cannot be read, has no lake or export sample (the reason is
in the API server's log). Labels carry names as registered; prometheus_client escapes them.

The CDC DAG's `publish_metrics` task sends the same gauges to StatsD through Airflow's metrics
client every cycle (`publish_statsd`), named by `statsd_name`: coldharbor.table.<schema>.<table>.<measure>,
coldharbor.report.<report>.<measure>, coldharbor.up.<tier>.
"""

from __future__ import annotations

import hashlib
import logging
import re
from collections.abc import Iterable, Iterator
from typing import Any

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.registry import Collector, CollectorRegistry

log = logging.getLogger(__name__)
CONTENT_TYPE = CONTENT_TYPE_LATEST

_TABLE = ["schema", "table"]
_TABLE_GAUGES = [  # (name, help, the figure's key) of the gauges read from the registry
    ("coldharbor_table_dirty_rows", "Changes captured in PostgreSQL and not yet in the lake.", "dirty_rows"),
    ("coldharbor_table_oldest_dirty_change_age_seconds",
     "Age of the oldest change not yet in the lake, or of a pending initial load or new base; 0 when there is "
     "none.", "freshness_lag_s"),
    ("coldharbor_table_freshness_promise_seconds",
     "How far behind PostgreSQL the table's lake may fall (register_table's p_freshness).", "freshness_promise_s"),
    ("coldharbor_table_last_export_rows", "Rows the table's last export of changes wrote to the lake.",
     "last_change_export_rows"),
    ("coldharbor_table_last_export_duration_seconds", "How long the table's last export of changes took.",
     "last_change_export_duration_s"),
    ("coldharbor_table_last_export_timestamp_seconds",
     "When the table's last export of changes finished (Unix time).", "last_change_export_at"),
    ("coldharbor_table_landing_rows",
     "Rows a lake-first table still holds in PostgreSQL: not in the lake yet, or removed by the next export.",
     "landing_rows"),
]
_REPORT_GAUGES = [
    ("coldharbor_report_runs_24h", "Runs of the report started in the last 24 hours.", "runs_24h"),
    ("coldharbor_report_failed_runs_24h", "Runs of the report started in the last 24 hours that failed.",
     "failed_24h"),
    ("coldharbor_report_last_run_duration_seconds", "Duration of the report's last finished run.",
     "last_duration_s"),
]


def _number(value: Any) -> float | None:
    if value is None:
        return None
    if hasattr(value, "timestamp"):
        return value.timestamp()
    return float(value)


def read_figures() -> dict[str, Any] | None:
    """{"tables": the health page's per-table figures, "reports": ColdharborHook.report_figures()};
    None when PostgreSQL cannot be read (or the connection is missing), the reason in the log."""
    from coldharbor_airflow.hooks import ColdharborHook

    hook = ColdharborHook()
    try:
        return {"tables": hook.health(recent_runs=0, with_samples=False)["tables"], "reports": hook.report_figures()}
    except Exception:
        log.exception("the metrics cannot read the hot tier")
        return None


def families(figures: dict[str, Any] | None) -> Iterator[GaugeMetricFamily]:
    """The gauges for `read_figures()`, or only `coldharbor_up` saying PostgreSQL is down when
    they are None."""
    from coldharbor_airflow.lake_files import folder, read_log

    up = GaugeMetricFamily("coldharbor_up", "1 when Coldharbor could read the tier, else 0.", labels=["tier"])
    up.add_metric(["postgres"], 0 if figures is None else 1)
    if figures is None:
        yield up
        return
    tables = figures["tables"]
    gauges = [GaugeMetricFamily(name, text, labels=_TABLE) for name, text, _ in _TABLE_GAUGES]
    readable, version, files, size = (GaugeMetricFamily(name, text, labels=_TABLE) for name, text in [
        ("coldharbor_table_lake_readable", "1 when the table's Delta log could be read, else 0."),
        ("coldharbor_table_lake_version", "The Delta table's current version."),
        ("coldharbor_table_lake_files", "Data files in the Delta table's current version."),
        ("coldharbor_table_lake_bytes", "Size of the data files in the Delta table's current version.")])
    lake_readable = True
    for t in tables:
        labels = [t["schema_name"], t["table_name"]]
        for gauge, (_, _, key) in zip(gauges, _TABLE_GAUGES):
            value = _number(t[key])
            if key == "freshness_lag_s" and value is None:
                value = 0.0  # nothing dirty: no lag
            if value is not None:
                gauge.add_metric(labels, value)
        if t["last_export_version"] is None:
            continue  # nothing in the lake yet
        path, _ = folder(t)
        read = read_log(path) if path is not None else None
        readable.add_metric(labels, 1 if isinstance(read, tuple) else 0)
        if not isinstance(read, tuple):
            lake_readable = False
            continue
        version.add_metric(labels, read[0])
        files.add_metric(labels, len(read[1]))
        size.add_metric(labels, sum(read[1]))
    up.add_metric(["lake"], 1 if lake_readable else 0)
    yield up
    yield from gauges
    yield from (readable, version, files, size)
    yield from _report_families(figures["reports"])


def _report_families(reports: Iterable[dict[str, Any]]) -> Iterator[GaugeMetricFamily]:
    gauges = [GaugeMetricFamily(name, text, labels=["report"]) for name, text, _ in _REPORT_GAUGES]
    failed = GaugeMetricFamily("coldharbor_report_last_run_failed", "1 when the report's last finished run failed.",
                               labels=["report"])
    for r in reports:
        for gauge, (_, _, key) in zip(gauges, _REPORT_GAUGES):
            if r[key] is not None:
                gauge.add_metric([r["report"]], float(r[key]))
        if r["last_state"] is not None:
            failed.add_metric([r["report"]], 1 if r["last_state"] == "failed" else 0)
    yield from gauges
    yield failed


class _Figures(Collector):
    def __init__(self, figures: dict[str, Any] | None) -> None:
        self.figures = figures

    def collect(self) -> Iterator[GaugeMetricFamily]:
        return families(self.figures)


def build() -> bytes:
    """The exposition text of one scrape. PostgreSQL unreachable (or the connection missing) is
    `coldharbor_up{tier="postgres"} 0`, the reason in the server's log."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Figures(read_figures()))
    return generate_latest(registry)


# StatsD: the same gauges, pushed through Airflow's own metrics client ([metrics] statsd_on,
# statsd_host, statsd_port, statsd_prefix) by the CDC DAG's `publish_metrics` task every cycle.
_STATSD_KINDS = ("table", "report")
_STATSD_PART = re.compile(r"[A-Za-z0-9_-]{1,60}")
_HASHED = re.compile(r".*_[0-9a-f]{8}")


def statsd_part(value: str) -> str:
    """A label value as one StatsD name segment: itself when it holds only letters, digits, _ and
    - (at most 60) and does not end as a hashed segment does; else its first 50 characters with '_'
    for every other character, '_' and a hash of the whole value. So two values never share a
    segment ("a.b" is a_b_69f6642c, and the name "a_b_69f6642c" is hashed too)."""
    if _STATSD_PART.fullmatch(value) and not _HASHED.fullmatch(value):
        return value
    digest = hashlib.sha1(value.encode("utf-8", "surrogatepass")).hexdigest()[:8]
    return f"{re.sub(r'[^A-Za-z0-9_-]', '_', value)[:50]}_{digest}"


def statsd_name(metric: str, labels: dict[str, str]) -> str:
    """coldharbor_table_dirty_rows{schema=public,table=orders} -> coldharbor.table.public.orders.dirty_rows;
    coldharbor_up{tier=lake} -> coldharbor.up.lake."""
    rest = metric.removeprefix("coldharbor_")
    kind, _, measure = rest.partition("_")
    parts = [statsd_part(v) for v in labels.values()]
    if kind in _STATSD_KINDS:
        return ".".join(["coldharbor", kind, *parts, measure])
    return ".".join(["coldharbor", rest, *parts])


def publish_statsd() -> int:
    """Every gauge of one scrape sent through Airflow's metrics client (a no-op when Airflow's
    metrics are off); how many were sent."""
    from airflow.sdk.observability.stats import gauge

    sent = 0
    for family in families(read_figures()):
        for sample in family.samples:
            gauge(statsd_name(sample.name, sample.labels), sample.value, tags=dict(sample.labels))
            sent += 1
    return sent

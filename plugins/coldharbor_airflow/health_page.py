"""The "Lakehouse health" page and its Prometheus metrics: a FastAPI app the Airflow API server
mounts under /coldharbor (/coldharbor/health, /coldharbor/metrics).

Server-rendered HTML (no script), read-only: per table its state (ok, lagging, failing) with the
rule that decided it, the dirty rows and the freshness lag against its promise, each with a chart
of the last 24 hours (health_charts), the last export and its Delta version, file count and
average size, the last compaction and cleanup, the initial load's state and the last verify's
verdict, a link to its export runs; then the recent report runs.

Airflow does not authenticate a plugin's app: every route here depends on `page_auth`, Airflow's
own token check (the UI's `_token` cookie or a bearer header) and its permission to view plugins.
What fails is logged here; the page shows a generic sentence, never an error text or a path.
"""

from __future__ import annotations

import asyncio
import html
import logging
from datetime import datetime, timezone
from typing import Any

from fastapi import Depends, FastAPI
from fastapi.responses import HTMLResponse, Response

from coldharbor_airflow import health_charts as charts
from coldharbor_airflow.page_auth import install_refusal_pages, require_plugin_viewer

log = logging.getLogger(__name__)

# No OpenAPI document or docs pages: the app's only public surface is the page itself.
# No redirect of /health/ to /health either: Starlette builds it from the request's Host header.
app = FastAPI(title="Coldharbor", description="Lakehouse health", docs_url=None, redoc_url=None,
              openapi_url=None, redirect_slashes=False, dependencies=[Depends(require_plugin_viewer)])
install_refusal_pages(app)
HOT_TIER_UNREADABLE = "The hot tier cannot be read right now; the API server's log says why."
RUN_FAILED = "failed: the run's task log has the message"
RUNS_LINK = "../dags/coldharbor_cdc/runs"  # Airflow's UI, beside this page's /coldharbor/health

_STYLE = """body{font-family:system-ui,sans-serif;margin:1.5rem;color:#1d2733}
table{border-collapse:collapse;margin:.5rem 0 1.5rem}th,td{border:1px solid #c9d1d9;padding:.3rem .6rem;
text-align:left;font-size:.9rem;vertical-align:top}th{background:#f0f3f6}.bad{color:#b42318;font-weight:600}
.state{font-weight:700;padding:0 .3rem;border-radius:3px}.ok{background:#dafbe1;color:#116329}
.lagging,.failing{background:#ffebe9;color:#b42318}"""


def _cell(value: Any) -> str:
    if value is None:
        return "—"
    if isinstance(value, datetime):
        return value.strftime("%Y-%m-%d %H:%M:%S %Z")
    if isinstance(value, float):
        return f"{value:,.1f}"
    return html.escape(str(value))


def _lake_files(row: dict[str, Any]) -> tuple[Any, float | None]:
    """(file count, average size) of the table's lake folder, found as the jobs find it; or a
    sentence why there is none."""
    from coldharbor_airflow.lake_files import file_figures, folder

    path, why_none = folder(row)
    if path is None:
        return why_none, None
    files = file_figures(path)
    if isinstance(files, str) and row.get("last_batch") is None:  # no export ever flushed: no folder yet
        return "none yet: nothing was exported", None
    return files if isinstance(files, tuple) else (files, None)


def _load_cell(row: dict[str, Any]) -> str:
    """Pending (reports serve the table from PostgreSQL alone), or what the load read and when."""
    if row.get("replaced"):
        return ('<span class="bad">dropped and created again since it was registered: its writes are not captured '
                'and every job refuses it; register it again</span>')
    if row.get("load_state") == "pending" and row.get("rebase_reason"):
        return (f'<span class="bad">rebuilding from PostgreSQL ({_cell(row["rebase_reason"])}): served from '
                'PostgreSQL until the next export writes its new base</span>')
    if row.get("load_state") == "pending":
        return '<span class="bad">pending: served from PostgreSQL until the next export loads it</span>'
    if row.get("loaded_at") is None:
        return "not needed (registered empty)"
    return f'{_cell(row["base_rows"])} rows as of {_cell(row["loaded_at"])}'


def _landing_cell(row: dict[str, Any]) -> str:
    """A lake-first table's landing backlog: the rows PostgreSQL still holds (not in the lake yet, or
    in it and removed by the next export); other tables hold every row in PostgreSQL."""
    if row.get("mode") != "lake_first":
        return "mirror: every row"
    if row.get("landing_rows") is None:
        return '<span class="bad">lake-first: its rows cannot be counted</span>'
    return f'lake-first: {charts.count(row["landing_rows"])} rows landing'


def _verify_cell(row: dict[str, Any]) -> str:
    """The last verify's verdict; its message (key samples, paths) stays in the task log."""
    if row.get("last_verify_at") is None:
        return _cell(None)
    if row.get("last_verify_result") == "in sync":
        return f'in sync at {_cell(row["last_verify_at"])}'
    verdict = "differences found" if row.get("last_verify_result") else "did not finish"
    return f'<span class="bad">{verdict} at {_cell(row["last_verify_at"])}: the task log names the keys</span>'


def _table_cells(t: dict[str, Any], samples: list[dict[str, Any]], now: datetime) -> list[str]:
    count, average = _lake_files(t)
    state, rule = charts.status(t, samples)
    promise = float(t["freshness_promise_s"]) if t.get("freshness_promise_s") is not None else None
    lag = t["freshness_lag_s"]
    return [
        f'<a href="{RUNS_LINK}" title="the export runs of this table">{_cell(t["name"])}</a>',
        f'<span class="state {state}">{state}</span>: {html.escape(rule)}',
        charts.count(t["dirty_rows"]),
        charts.sparkline(samples, "dirty_rows", now, "dirty rows", formatter=charts.count),
        (f'<span class="{"bad" if state == "lagging" else ""}">{charts.duration(lag)}</span> / '
         f'{charts.duration(promise)}'),
        charts.sparkline(samples, "lag_s", now, "freshness lag", limit=promise),
        _cell(t["last_batch"]), _cell(t["last_export_at"]), _cell(t["last_export_version"]),
        f'{charts.count(t["last_change_export_rows"])} rows in {charts.duration(t["last_change_export_duration_s"])}',
        charts.sparkline(samples, "export_rows", now, "rows exported", formatter=charts.count),
        charts.sparkline(samples, "export_s", now, "export duration"),
        _cell(count), _cell(average / 1024 if average is not None else None),
        f'{_cell(t["last_compaction_at"])} ({_cell(t["last_compaction_state"])})',
        f'{_cell(t["last_cleanup_at"])} ({_cell(t["last_cleanup_state"])})',
        _landing_cell(t), _load_cell(t), _verify_cell(t)]


def render(figures: dict[str, Any]) -> str:
    now = figures.get("now") or datetime.now(timezone.utc)
    samples = figures.get("samples", {})
    rows = ["<tr>" + "".join(f"<td>{c}</td>" for c in _table_cells(t, samples.get(t["table_id"], []), now)) + "</tr>"
            for t in figures["tables"]]
    # A run's error is the job's message (PostgreSQL's or Spark's text, paths): the page only says there is one.
    runs = ["<tr>" + "".join(f"<td>{_cell(r[k])}</td>" for k in (
        "report", "target", "mode", "state", "degraded", "as_of", "row_count", "started_at", "finished_at"))
        + f"<td>{RUN_FAILED if r['error'] else _cell(None)}</td></tr>" for r in figures["report_runs"]]
    return f"""<!doctype html><html><head><meta charset="utf-8"><title>Lakehouse health</title>
<style>{_STYLE}</style></head><body><h1>Lakehouse health</h1>
<p>Per table: its state and the rule behind it, and the last 24 hours of each export cycle (charts: latest and
highest in each chart's tooltip; the dashed line is the freshness promise).</p>
<h2>Tables</h2><table id="tables"><tr><th>table</th><th>state</th><th>dirty rows</th><th>dirty rows, 24 h</th>
<th>freshness lag / promise</th><th>lag, 24 h</th>
<th>last export batch</th><th>last export at</th><th>Delta version</th><th>last export of changes</th>
<th>rows per export, 24 h</th><th>export time, 24 h</th><th>files</th><th>avg file (KiB)</th>
<th>last compaction</th><th>last cleanup</th><th>in PostgreSQL</th><th>initial load</th><th>last verify</th></tr>{''.join(rows)}</table>
<h2>Recent report runs</h2><table id="report-runs"><tr><th>report</th><th>target</th><th>mode</th><th>state</th>
<th>degraded</th><th>as of</th><th>rows</th><th>started</th><th>finished</th><th>error</th></tr>{''.join(runs)}
</table></body></html>"""


def build_page() -> str:
    """The page from the hot tier's figures; when they cannot be read (PostgreSQL down, the
    connection missing), a plain sentence, and the reason in the server's log."""
    from coldharbor_airflow.hooks import ColdharborHook

    try:
        return render(ColdharborHook().health())
    except Exception:
        log.exception("the health page cannot read the hot tier")
        return (f"<!doctype html><html><body><h1>Lakehouse health</h1><p class='bad' id='error'>"
                f"{HOT_TIER_UNREADABLE}</p></body></html>")


@app.get("/health", response_class=HTMLResponse)
async def health_page() -> HTMLResponse:
    return HTMLResponse(await asyncio.to_thread(build_page))


@app.get("/metrics")
async def metrics_page() -> Response:
    """The Prometheus metrics (coldharbor_airflow.metrics names them), behind the same login."""
    from coldharbor_airflow import metrics

    return Response(await asyncio.to_thread(metrics.build), media_type=metrics.CONTENT_TYPE)

"""The "Lakehouse health" page: a FastAPI app the Airflow API server mounts under /coldharbor.

Server-rendered HTML (no script), read-only: per table the dirty rows and the freshness lag, the
last export and its Delta version, file count and average size, the last compaction and cleanup;
then the recent report runs.
"""

from __future__ import annotations

import asyncio
import html
import os
from datetime import datetime
from typing import Any

from fastapi import FastAPI
from fastapi.responses import HTMLResponse

app = FastAPI(title="Coldharbor", description="Lakehouse health")

_STYLE = """body{font-family:system-ui,sans-serif;margin:1.5rem;color:#1d2733}
table{border-collapse:collapse;margin:.5rem 0 1.5rem}th,td{border:1px solid #c9d1d9;padding:.3rem .6rem;
text-align:left;font-size:.9rem}th{background:#f0f3f6}.bad{color:#b42318;font-weight:600}"""


def _cell(value: Any) -> str:
    if value is None:
        return "—"
    if isinstance(value, datetime):
        return value.strftime("%Y-%m-%d %H:%M:%S %Z")
    if isinstance(value, float):
        return f"{value:,.1f}"
    return html.escape(str(value))


def _lake_path(row: dict[str, Any]) -> str | None:
    if row["lake_location"]:
        return row["lake_location"]
    root = os.environ.get("COLDHARBOR_LAKE_ROOT")
    return f"{root.rstrip('/')}/{row['name'].replace('.', '/')}" if root else None


def render(figures: dict[str, Any]) -> str:
    from coldharbor_airflow.lake_files import file_figures

    rows = []
    for t in figures["tables"]:
        path = _lake_path(t)
        files = file_figures(path) if path else "unavailable: no lake root configured"
        count, average = (files if isinstance(files, tuple) else (files, None))
        lag = t["freshness_lag_s"]
        rows.append("<tr>" + "".join(f"<td>{c}</td>" for c in [
            _cell(t["name"]), _cell(t["dirty_rows"]),
            f'<span class="{"bad" if lag and lag > 90 else ""}">{_cell(lag)}</span>',
            _cell(t["last_batch"]), _cell(t["last_export_at"]), _cell(t["last_export_version"]),
            _cell(count), _cell(average / 1024 if average is not None else None),
            f'{_cell(t["last_compaction_at"])} ({_cell(t["last_compaction_state"])})',
            f'{_cell(t["last_cleanup_at"])} ({_cell(t["last_cleanup_state"])})']) + "</tr>")
    runs = ["<tr>" + "".join(f"<td>{_cell(r[k])}</td>" for k in (
        "report", "target", "mode", "state", "degraded", "as_of", "row_count", "started_at", "finished_at",
        "error")) + "</tr>" for r in figures["report_runs"]]
    return f"""<!doctype html><html><head><meta charset="utf-8"><title>Lakehouse health</title>
<style>{_STYLE}</style></head><body><h1>Lakehouse health</h1>
<h2>Tables</h2><table id="tables"><tr><th>table</th><th>dirty rows</th><th>freshness lag (s)</th>
<th>last export batch</th><th>last export at</th><th>Delta version</th><th>files</th><th>avg file (KiB)</th>
<th>last compaction</th><th>last cleanup</th></tr>{''.join(rows)}</table>
<h2>Recent report runs</h2><table id="report-runs"><tr><th>report</th><th>target</th><th>mode</th><th>state</th>
<th>degraded</th><th>as of</th><th>rows</th><th>started</th><th>finished</th><th>error</th></tr>{''.join(runs)}
</table></body></html>"""


@app.get("/health", response_class=HTMLResponse)
async def health_page() -> HTMLResponse:
    from coldharbor_airflow.hooks import ColdharborHook

    def build() -> str:
        try:
            return render(ColdharborHook().health())
        except Exception as exc:  # PostgreSQL down or the connection missing: say so on the page
            return (f"<!doctype html><html><body><h1>Lakehouse health</h1><p class='bad' id='error'>"
                    f"Cannot read the hot tier: {html.escape(str(exc).splitlines()[0] if str(exc) else repr(exc))}"
                    "</p></body></html>")

    return HTMLResponse(await asyncio.to_thread(build))

"""What the health page draws and how it words a table's state, from coldharbor.health_samples
(one row per table per export, written by cdc_export.py) and the registry's figures.

Charts are inline SVG drawn here, on the server: no script, no library, no network, so the page
works offline and behind any proxy. Each chart covers the last 24 hours, oldest left; a cycle
that exported nothing of a table wrote no sample (nothing was dirty), so where samples are more than
three minutes apart the line falls to 0 between them. The latest sample is a dot.
"""

from __future__ import annotations

import html
import math
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

WINDOW = timedelta(hours=24)
WIDTH, HEIGHT = 240, 36
CYCLE = timedelta(minutes=1)   # the export cadence
GAP = timedelta(minutes=3)     # samples further apart than this: the cycles between had nothing to export


def _finite(value: Any) -> float:
    """A figure a chart can place: NaN, infinities and negatives (a hand-written sample) count as 0."""
    number = float(value or 0)
    return number if math.isfinite(number) and number > 0 else 0.0


def duration(seconds: Any) -> str:
    """Seconds for people: 42 s, 7.2 min, 3.5 h."""
    if seconds is None:
        return "—"
    value = float(seconds)
    if value < 120:
        return f"{value:,.0f} s" if value >= 10 else f"{value:,.1f} s"
    if value < 7200:
        return f"{value / 60:,.1f} min"
    return f"{value / 3600:,.1f} h"


def count(value: Any) -> str:
    return "—" if value is None else f"{int(value):,}"


def status(row: dict[str, Any], samples: Sequence[dict[str, Any]]) -> tuple[str, str]:
    """(ok | lagging | failing, the rule that decided it, in words)."""
    promise = row.get("freshness_promise_s")
    lag = row.get("freshness_lag_s")
    last = samples[-1] if samples else None
    if last is not None and last["export_status"] == "failed":
        return "failing", (f"its last export, at {last['sampled_at']:%Y-%m-%d %H:%M:%S %Z}, failed: the export "
                           "task's log says why; its changes wait in PostgreSQL")
    if lag is not None and promise is not None and float(lag) > float(promise) and row.get("base_lagging"):
        return "lagging", (f"its initial load (or a new base after DDL) has been pending for {duration(lag)}, past "
                           f"the promise of {duration(promise)}: the lake lacks the whole table (the export task's "
                           "log says why)")
    if lag is not None and promise is not None and float(lag) > float(promise):
        return "lagging", (f"the oldest unexported change is {duration(lag)} old, past the promise of "
                           f"{duration(promise)}")
    if promise is None:
        return "ok", "every change is in the lake or younger than its promise"
    return "ok", f"every unexported change is younger than the promise of {duration(promise)}"


def sparkline(samples: Sequence[dict[str, Any]], key: str, now: datetime, label: str,
              limit: float | None = None, formatter=duration) -> str:
    """An inline SVG line of samples[key] over the last 24 hours (a dashed line at `limit`); its
    title names the latest and highest values."""
    start = now - WINDOW
    points: list[tuple[datetime, float]] = []
    for sample in samples:
        at, value = sample["sampled_at"], _finite(sample[key])
        if not start <= at <= now:
            continue
        if points and at - points[-1][0] > GAP:  # no sample between: nothing was dirty, so nothing exported
            points += [(points[-1][0] + CYCLE, 0.0), (at - CYCLE, 0.0)]
        points.append((at, value))
    top = max([v for _, v in points] + [limit or 0, 1e-9])

    def xy(at: datetime, value: float) -> str:
        x = (at - start).total_seconds() / WINDOW.total_seconds() * WIDTH
        return f"{x:.1f},{HEIGHT - 2 - value / top * (HEIGHT - 4):.1f}"

    line = " ".join(xy(at, v) for at, v in points)
    latest = formatter(points[-1][1]) if points else "no sample"
    highest = formatter(max(v for _, v in points)) if points else "no sample"
    title = html.escape(f"{label}, last 24 hours: latest {latest}, highest {highest}")
    parts = [f'<svg class="chart" role="img" width="{WIDTH}" height="{HEIGHT}" viewBox="0 0 {WIDTH} {HEIGHT}">',
             f"<title>{title}</title>",
             f'<rect width="{WIDTH}" height="{HEIGHT}" fill="#f6f8fa"/>']
    if limit:
        y = HEIGHT - 2 - limit / top * (HEIGHT - 4)
        parts.append(f'<line x1="0" x2="{WIDTH}" y1="{y:.1f}" y2="{y:.1f}" stroke="#b42318" stroke-dasharray="4 3"/>')
    if points:
        parts.append(f'<polyline fill="none" stroke="#1f6feb" stroke-width="1.5" points="{line}"/>')
        x, y = xy(*points[-1]).split(",")
        parts.append(f'<circle cx="{x}" cy="{y}" r="2" fill="#1f6feb"/>')  # the latest, visible alone too
    parts.append("</svg>")
    return "".join(parts)

"""Shared benchmark scaffolding: a throwaway embedded PostgreSQL, timers and the ratio table."""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from coldharbor.embedded.stack import throwaway_server


@dataclass(frozen=True)
class Row:
    """One line of a benchmark table: what was measured, the figure, and its target."""

    benchmark: str
    measure: str
    value: float
    unit: str
    target: str
    met: bool | None

    def cells(self) -> list[str]:
        verdict = "" if self.met is None else ("yes" if self.met else "NO")
        return [self.benchmark, self.measure, f"{self.value:,.2f} {self.unit}", self.target, verdict]


def render(rows: list[Row]) -> str:
    header = ["benchmark", "measure", "value", "target", "met"]
    table = [header] + [r.cells() for r in rows]
    widths = [max(len(line[i]) for line in table) for i in range(len(header))]
    lines = [" | ".join(cell.ljust(w) for cell, w in zip(line, widths)) for line in table]
    lines.insert(1, "-+-".join("-" * w for w in widths))
    return "\n".join(lines)


@contextmanager
def temporary_postgres() -> Iterator[str]:
    """A fresh migrated server on a free loopback port; yields its superuser's DSN: a benchmark
    builds its tables and evicts rows (replica mode) with it, and times the jobs under it too."""
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    with tempfile.TemporaryDirectory(prefix="coldharbor-bench-") as folder, throwaway_server(Path(folder)) as logins:
        yield logins.admin


def timed(action: Callable[[], object]) -> float:
    start = time.perf_counter()
    action()
    return time.perf_counter() - start


def median(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[len(ordered) // 2]

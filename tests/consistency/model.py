"""The reference model: what a report must return, now or as of a past instant.

The model is the table as committed, key -> value, plus its history: the state after every commit,
stamped with a PostgreSQL clock reading taken after the commit and before the next write began.
Eviction does not change it (invariant 10); a purge removes its keys from the present and from
every past state (a purge erases history too).
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from datetime import datetime


@dataclass
class Model:
    rows: dict[int, str] = field(default_factory=dict)
    history: list[tuple[datetime, dict[int, str]]] = field(default_factory=list)

    def apply(self, writes: list[tuple[str, int, str | None]]) -> None:
        """One committed transaction: ("put", key, value) and ("del", key, None) in order."""
        for kind, key, value in writes:
            if kind == "put":
                self.rows[key] = value
            else:
                self.rows.pop(key, None)

    def stamp(self, at: datetime) -> None:
        """Records the present as the state at `at` (taken after the last commit)."""
        self.history.append((at, dict(self.rows)))

    def purge(self, low: int, high: int) -> None:
        def keep(rows: dict[int, str]) -> dict[int, str]:
            return {k: v for k, v in rows.items() if not low <= k <= high}

        self.rows = keep(self.rows)
        self.history = [(at, keep(rows)) for at, rows in self.history]

    def as_of(self, at: datetime) -> dict[int, str]:
        """The state at `at`: the last stamp at or before it."""
        times = [t for t, _ in self.history]
        index = bisect.bisect_right(times, at) - 1
        if index < 0:
            return {}
        return dict(self.history[index][1])

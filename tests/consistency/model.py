"""The reference model: what a report must return, now or as of a past instant.

The model is the table as committed, key -> value, plus its history: the state after every commit,
stamped with a PostgreSQL clock reading taken after the commit and before the next write began.
Eviction does not change it (invariant 10); a purge by key range removes its keys from the present
and from every past state (a purge erases history too). A purge by value removes the rows whose
current value matches and keeps every other current row (an unexported update out of the
predicate included); which past versions it erases depends on what was exported (an erased
version falls back to the one exported before it), which the model does not track: its history
restarts at the purge, and as-of checks only ask about instants after it.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterable
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

    def purge_values(self, matches: Callable[[str], bool], also: Iterable[int] = ()) -> None:
        """A purge by value: the rows whose current value matches go, and the keys in `also` (no
        longer in the table, whose newest exported version matched); the history restarts."""
        gone = set(also)
        self.rows = {k: v for k, v in self.rows.items() if not matches(v) and k not in gone}
        self.history = []

    def as_of(self, at: datetime) -> dict[int, str]:
        """The state at `at`: the last stamp at or before it."""
        times = [t for t, _ in self.history]
        index = bisect.bisect_right(times, at) - 1
        if index < 0:
            return {}
        return dict(self.history[index][1])

"""Rebase windows (sql/migrations/015-016) without a server: which instants a window hides, and that the
refusal says where the instant falls."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pyarrow as pa
from coldharbor.capture.registry import RegisteredTable
from coldharbor.export.base_state import RebaseWindow
from coldharbor.serve.as_of import rebase_refusal
from coldharbor.serve.hot_snapshot import HotTable

T0 = datetime(2026, 11, 20, 12, 0, tzinfo=timezone.utc)  # the oldest change dirty at the DDL
REQUEST = T0 + timedelta(minutes=5)
SETTLED = T0 + timedelta(minutes=9)
TABLE = RegisteredTable(1, "public", 'o"r\nders', ("id",), None, (), ())


def window(**changes) -> RebaseWindow:
    values = dict(reason="column region was added with a default", requested_at=REQUEST, settled_at=SETTLED,
                  settled_version=4, dirty_since=T0, renames_column=False)
    values.update(changes)
    return RebaseWindow(**values)


def at(minutes: float) -> datetime:
    return T0 + timedelta(minutes=minutes)


def test_a_window_hides_from_the_oldest_change_dirty_at_the_ddl_until_its_base():
    w = window()
    assert [w.hides(at(m), 4, None) for m in (-1, 0, 3, 5, 8, 9, 20)] == [False, True, True, True, True, False, False]
    assert w.hides(at(20), 3, None)  # lake@3 lacks the base of version 4
    assert window(dirty_since=None).starts_at == REQUEST and not window(dirty_since=None).hides(at(3), 4, None)


def test_a_rename_hides_every_instant_before_its_base_but_not_in_an_earlier_lake():
    w = window(renames_column=True, dirty_since=None)
    assert w.hides(at(-600), 4, None) and not w.hides(at(9), 4, None)
    assert not w.hides(at(-600), 4, SETTLED + timedelta(seconds=1))  # a lake started after the rename's base
    assert window(renames_column=True, settled_at=None, settled_version=None).hides(at(-600), None, None)


def test_the_refusal_says_where_the_instant_falls():
    head = "cannot be answered for public.\"o\"\"r\\nders\": it falls"
    inside = rebase_refusal(at(6), TABLE, window())
    assert f"{head} inside a rebase: column region" in inside and f"instant before {T0.isoformat()}" in inside
    dirty = rebase_refusal(at(1), TABLE, window())
    assert f"{head} before a rebase (column region was added with a default), but changes from {T0.isoformat()}" \
           f" on were not exported when its DDL ran at {REQUEST.isoformat()}" in dirty
    pending = rebase_refusal(at(-1), TABLE, window(settled_at=None, settled_version=None))
    assert f"{head} before a rebase (column region was added with a default, at {REQUEST.isoformat()}) that no " \
           "base has answered yet" in pending
    renamed = rebase_refusal(at(-1), TABLE, window(reason="column a was renamed to b", renames_column=True))
    assert f"{head} before a rename (column a was renamed to b, at {REQUEST.isoformat()})" in renamed
    assert all("\n" not in m and "inside" not in m for m in (dirty, pending, renamed))


def test_a_window_holding_the_instant_is_named_before_one_whose_base_is_not_in_the_pinned_version():
    older = window(reason="older", requested_at=at(-30), settled_at=at(-20), dirty_since=None, settled_version=5)
    newer = window(settled_at=None, settled_version=None)
    hot = HotTable(TABLE, (), pa.table({}), None, hot_only=True, load_pending=True, pinned_version=4,
                   rebase_windows=(older, newer))
    assert hot.hiding_window(at(6)) is newer
    assert hot.hiding_window(at(-1)) is older  # only the older one hides it: its base is not in lake@4

"""The consistency suite's reference model: the oracle must itself be right."""

from __future__ import annotations

from datetime import datetime, timedelta

from tests.consistency.model import Model

T0 = datetime(2026, 1, 1)


def test_the_model_applies_commits_and_answers_as_of_the_last_stamp_before():
    model = Model()
    model.stamp(T0)
    model.apply([("put", 1, "a"), ("put", 2, "b")])
    model.stamp(T0 + timedelta(seconds=1))
    model.apply([("del", 1, None), ("put", 1, "c"), ("del", 2, None)])  # delete-then-reinsert, delete
    model.stamp(T0 + timedelta(seconds=2))
    assert model.rows == {1: "c"}
    assert model.as_of(T0 - timedelta(seconds=1)) == {}
    assert model.as_of(T0) == {}
    assert model.as_of(T0 + timedelta(seconds=1, milliseconds=500)) == {1: "a", 2: "b"}
    assert model.as_of(T0 + timedelta(hours=1)) == {1: "c"}


def test_a_purge_erases_its_keys_from_the_present_and_the_past():
    model = Model()
    model.apply([("put", k, str(k)) for k in range(1, 6)])
    model.stamp(T0)
    model.apply([("put", 9, "nine")])
    model.stamp(T0 + timedelta(seconds=1))
    model.purge(2, 3)
    assert model.rows == {1: "1", 4: "4", 5: "5", 9: "nine"}
    assert model.as_of(T0) == {1: "1", 4: "4", 5: "5"}


def test_a_purge_by_value_keeps_current_rows_that_do_not_match_and_restarts_the_history():
    model = Model()
    model.apply([("put", 1, "x"), ("put", 2, "y"), ("put", 3, "z")])
    model.stamp(T0)
    model.apply([("put", 1, "w"), ("del", 3, None)])  # 1 no longer matches; 3 is gone but its last value did
    model.purge_values(lambda v: v in ("x", "y", "z"), also=[3])
    assert model.rows == {1: "w"}
    assert model.history == []

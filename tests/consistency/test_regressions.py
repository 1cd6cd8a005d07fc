"""Counter-examples the consistency suite found, kept as tests.

Named sequences replay a seed whose failure was fixed; `regressions.json` holds the seeds the long
profile (long_run.py) found failing, each replayed here until it is fixed and named above.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.consistency.harness import run_sequence

KEPT = json.loads((Path(__file__).resolve().parent / "regressions.json").read_text())


def test_as_of_between_two_changes_exported_together_is_refused(spark, pg_dsn, admin_dsn, tmp_path, monkeypatch):
    """Seed 1, nine steps: keys inserted in bulk, one of them moved to a new key (a delete of the
    old), one export of both changes; a report as of the instant between insert and move was served
    from the lake without the moved key: the lake had only the move. Fixed by recording each lake
    row's first change time and refusing an as-of inside such a span (test_serve has the direct
    form of it)."""
    monkeypatch.setenv("COLDHARBOR_PG_DSN", pg_dsn)
    outcome = run_sequence(1, 9, [], spark=spark, dsn=pg_dsn, admin_dsn=admin_dsn, workdir=tmp_path, prefilled=False)
    assert outcome.trace[3].startswith("bulk_insert") and outcome.trace[5].startswith("pk_change")
    assert "refused, inside a span exported together (correct)" in outcome.trace[8]


def test_the_kept_seeds_file_lists_replayable_sequences():
    """regressions.json is a list of {seed, steps, crash_points[, prefilled, engine, found]} (long_run.py
    writes `found`, the first line of the failure, and `engine` for a run over Spark Connect); an
    entry the replay below cannot read would otherwise be a counter-example silently dropped."""
    assert isinstance(KEPT, list)
    for case in KEPT:
        assert {"seed", "steps", "crash_points"} <= set(case) <= {"seed", "steps", "crash_points", "prefilled", "engine",
                                                                  "found"}, case
        assert isinstance(case["seed"], int) and isinstance(case["steps"], int) and case["steps"] > 0, case
        assert case.get("engine", "spark-submit") in ("spark-submit", "connect"), case


if KEPT:  # defined only when a seed is kept: an empty parameter set would be a skipped test proving nothing
    @pytest.mark.parametrize("case", KEPT, ids=[f"seed-{c['seed']}" for c in KEPT])
    def test_kept_seed_replays_clean(case, request, pg_dsn, admin_dsn, tmp_path, monkeypatch):
        """Replayed on the engine it was found on: spark-submit, or the run's Spark Connect server."""
        monkeypatch.setenv("COLDHARBOR_PG_DSN", pg_dsn)
        connect_url = request.getfixturevalue("on_connect") if case.get("engine") == "connect" else None
        spark = request.getfixturevalue("connect_spark" if connect_url else "spark")
        run_sequence(case["seed"], case["steps"], case["crash_points"], spark=spark, dsn=pg_dsn, admin_dsn=admin_dsn,
                     workdir=tmp_path, prefilled=case.get("prefilled"), connect_url=connect_url)

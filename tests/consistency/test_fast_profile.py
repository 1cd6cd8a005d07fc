"""The consistency suite's fast profile: fixed seeds, each crash point exercised once across them
with the jobs under spark-submit, and once more with the jobs as clients of a Spark Connect server.

The long profile is `make consistency` (tests/consistency/long_run.py): many seeds, one summary line.
"""

from __future__ import annotations

import pytest

from tests.consistency.harness import CRASH_POINTS, Run, run_sequence

# seed -> the crash points that seed injects; together they cover every point.
FAST_SEEDS = {
    1: ["load_after_snapshot", "after_read", "during_mark", "rebase_after_snapshot"],
    2: ["load_during_write", "during_write", "compact_during_write"],
    3: ["load_after_commit", "after_commit", "during_vacuum"],
}
# 16 random steps besides the crashes (24 until 2026-11-28; the suite outgrew CI's 90 minutes): the
# seeds still check 4, 7 and 4 reports and run compaction in each mode (merge, auto, full); the long
# profile (`make consistency`) runs 40 steps.
STEPS = 16
# The same crash points over Connect, on seeds of their own and shorter sequences (a crashed Connect
# client costs no JVM start, but the whole profile runs inside `make test`).
CONNECT_SEEDS = {seed + 3: points for seed, points in FAST_SEEDS.items()}
CONNECT_STEPS = 10
# The sequence of the incremental report (its crash points are FAST_SEEDS' too).
INCREMENTAL_SEED = 7


@pytest.mark.parametrize("seeds", [FAST_SEEDS, CONNECT_SEEDS], ids=["spark-submit", "connect"])
def test_the_fast_seeds_cover_every_crash_point(seeds):
    assert sorted(p for points in seeds.values() for p in points) == sorted(CRASH_POINTS)


@pytest.mark.parametrize("seed", sorted(FAST_SEEDS))
def test_random_sequence_matches_the_model(seed, spark, pg_dsn, admin_dsn, tmp_path, monkeypatch):
    monkeypatch.setenv("COLDHARBOR_PG_DSN", pg_dsn)
    outcome = run_sequence(seed, STEPS, FAST_SEEDS[seed], spark=spark, dsn=pg_dsn, admin_dsn=admin_dsn,
                           workdir=tmp_path)
    compactions = [line for line in outcome.trace if line.startswith("compact (")]
    print(f"seed {seed}: {outcome.steps} steps, {outcome.reports} reports checked, crashes at {outcome.crashes}, "
          f"compactions {compactions}")
    assert outcome.reports >= 3
    assert sorted(outcome.crashes) == sorted(FAST_SEEDS[seed])


@pytest.mark.parametrize("seed", sorted(CONNECT_SEEDS))
def test_random_sequence_over_connect_matches_the_model(seed, on_connect, connect_spark, pg_dsn, admin_dsn, tmp_path,
                                                        monkeypatch):
    """Every job a Connect client: each crash point kills the client (inside a Spark task, from the
    server's task), and the next run, over Connect too, recovers."""
    monkeypatch.setenv("COLDHARBOR_PG_DSN", pg_dsn)
    outcome = run_sequence(seed, CONNECT_STEPS, CONNECT_SEEDS[seed], spark=connect_spark, dsn=pg_dsn,
                           admin_dsn=admin_dsn, workdir=tmp_path, connect_url=on_connect)
    print(f"seed {seed} over Connect: {outcome.steps} steps, {outcome.reports} reports checked, "
          f"crashes at {outcome.crashes}")
    assert outcome.reports >= 1
    assert sorted(outcome.crashes) == sorted(CONNECT_SEEDS[seed])


def test_an_incremental_report_equals_its_full_recompute_after_every_step(spark, pg_dsn, admin_dsn, tmp_path,
                                                                         monkeypatch):
    """`-- refresh: incremental` over a random sequence with crashes in the export: after every step
    the report refreshed from the change log equals the same SQL recomputed in full, and most
    refreshes were incremental (the others say why not: a purge, a new base, a MIN lost)."""
    monkeypatch.setenv("COLDHARBOR_PG_DSN", pg_dsn)
    outcome = run_sequence(INCREMENTAL_SEED, STEPS, ["after_commit", "during_mark"], spark=spark, dsn=pg_dsn,
                           admin_dsn=admin_dsn, workdir=tmp_path, incremental=True)
    print(f"seed {INCREMENTAL_SEED} incremental: " + "; ".join(outcome.incremental_refreshes))
    assert len(outcome.incremental_refreshes) == STEPS + 1
    assert sum(d.startswith("refreshed incrementally") for d in outcome.incremental_refreshes) >= STEPS // 2


def test_a_purge_by_value_matches_the_model(spark, pg_dsn, admin_dsn, tmp_path, monkeypatch):
    """A value purge over unexported updates out of the predicate, an unexported delete and evicted
    rows, then a random one; each checked by a report against the model."""
    monkeypatch.setenv("COLDHARBOR_PG_DSN", pg_dsn)
    run = Run(101, spark, pg_dsn, admin_dsn, str(tmp_path / "lake"), prefilled=False)
    try:
        run.committed_write("bulk_insert")
        run.export()
        exported = sorted(run.model.rows.values())
        run.committed_write("update")
        run.committed_write("delete")
        run.cleanup()  # evicts the exported rows left unchanged
        run.purge_values(exported)  # updated keys keep their new, unexported value
        kept = int(run.trace[-1].rsplit(", ", 1)[1].split()[0])
        run.report()
        for step in (run.export, run.report, run.purge_values, run.report):
            step()
    finally:
        run.close()
    assert kept >= 1, run.trace
    assert run.reports == 3

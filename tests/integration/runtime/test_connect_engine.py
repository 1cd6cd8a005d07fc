"""Every job as a thin client of one warm Spark Connect server: `python jobs/<job>.py` with
COLDHARBOR_SPARK_REMOTE set, no spark-submit and no Java of its own, over a table that held rows
before it was registered and keeps changing; each result is checked against PostgreSQL."""

from __future__ import annotations

import os
import time
import uuid
from pathlib import Path

import pytest
from coldharbor.lake import delta, lake_store, writes
from coldharbor.runtime.spark import get_session

from tests.connect_server import run_job
from tests.helpers import dirty_ids, lake_live, pg_rows

# Partition values and text Hive escaping, SQL quoting and JSON must all carry through unchanged.
REGIONS = ["eu'x", "a/b=c d%", "日本", "plain"]
NOTES = ["'; DROP TABLE x; --", "line\nbreak", "back\\slash", "🙂 emoji", "${env:HOME}", ""]


def make_table(conn, name: str, history: str = "latest") -> None:
    """A table with rows before registration (an initial load to make), a composite key of text and
    bigint, partitioned by the text part."""
    conn.execute(f"""CREATE TABLE {name} (region text, id bigint, at timestamptz NOT NULL, amount numeric(12,2),
                                          note text, PRIMARY KEY (region, id))""")
    conn.execute(f"""INSERT INTO {name} SELECT (%s::text[])[1 + g %% 4], g,
                                             timestamptz '2026-03-29 01:30:00+01' + g * interval '17 minutes',
                                             g * 1.25, (%s::text[])[1 + g %% 6]
                     FROM generate_series(1, 300) g""", (REGIONS, NOTES))
    conn.execute("SELECT coldharbor.register_table(%s, p_partition_by => ARRAY['region'], p_history => %s)",
                 (name, history))


def change(conn, name: str, round_: int) -> None:
    """Updates, deletes and inserts in every partition."""
    conn.execute(f"UPDATE {name} SET amount = amount + {round_}, note = note || %s WHERE id %% 7 = {round_ % 7}",
                 (f" r{round_}'",))
    conn.execute(f"DELETE FROM {name} WHERE id % 50 = {round_}")
    conn.execute(f"""INSERT INTO {name} SELECT (%s::text[])[1 + g %% 4], g, now(), g, %s
                     FROM generate_series({1000 * round_}, {1000 * round_ + 20}) g""", (REGIONS, NOTES[round_ % 6]))


def ok(done) -> str:
    assert done.returncode == 0, f"exit {done.returncode}\n{done.stderr[-4000:]}\n{done.stdout[-2000:]}"
    assert "Traceback" not in done.stderr
    return done.stdout + done.stderr


@pytest.fixture()
def connect_spark(on_connect):
    """This process's own Connect session on the server, for reading the lake the way the jobs do."""
    return get_session("coldharbor-test-reader")


def expected(conn, name: str) -> dict:
    return pg_rows(conn, f"SELECT region, id, at, amount, note FROM {name}", ["region", "id"])


def live(spark, lake_root: str, name: str) -> dict:
    rows = lake_live(spark, lake_root, f"public.{name}", ["region", "id"])
    return {k: {c: v[c] for c in ("region", "id", "at", "amount", "note")} for k, v in rows.items()}


def test_every_job_runs_over_connect_and_equals_postgresql(connect_server, connect_spark, pg_dsn, pg_conn,
                                                           table_name, lake_root):
    url, name = connect_server.url, table_name
    make_table(pg_conn, name)
    change(pg_conn, name, 1)  # live changes on top of the rows to load

    # Registration + initial load, then the changes made since, in one export run.
    ok(run_job("cdc_export.py", url, pg_dsn, lake_root, "--table", name))
    assert dirty_ids(pg_conn, name) == []
    assert live(connect_spark, lake_root, name) == expected(pg_conn, name)

    for round_ in (2, 3, 4):  # small files in every partition
        change(pg_conn, name, round_)
        ok(run_job("cdc_export.py", url, pg_dsn, lake_root, "--table", name))
    assert live(connect_spark, lake_root, name) == expected(pg_conn, name)

    path = f"{lake_root}/public/{name}"
    before = delta.snapshot(connect_spark, path)
    ok(run_job("compact.py", url, pg_dsn, lake_root, "--table", name, "--min-small-files", "2"))
    after = delta.snapshot(connect_spark, path)
    assert len(after.files) < len(before.files)
    assert {dict(f.partition)["region"] for f in after.files} == set(REGIONS)
    assert live(connect_spark, lake_root, name) == expected(pg_conn, name)

    cleanup_drops_unreferenced_files_and_leftovers(url, pg_dsn, lake_root, path)
    assert live(connect_spark, lake_root, name) == expected(pg_conn, name)

    out = ok(run_job("purge.py", url, pg_dsn, lake_root, "--table", name, "--where", "region = 'eu''x'",
                     "--vacuum-retention-hours", "0", "--allow-short-retention"))
    assert "remaining: {'postgres_rows': 0, 'change_log_rows': 0, 'lake_current_rows': 0, " \
           "'lake_rows_in_kept_files': 0}" in out
    assert pg_conn.execute(f"SELECT count(*) FROM {name} WHERE region = 'eu''x'").fetchone()[0] == 0
    assert live(connect_spark, lake_root, name) == expected(pg_conn, name)

    change(pg_conn, name, 5)  # dirty rows for the report, the verify and the resync to take in
    report_equals_postgresql(url, pg_dsn, pg_conn, lake_root, name)
    assert "in sync" in ok(run_job("verify.py", url, pg_dsn, lake_root, "--table", name))
    assert "resynced from PostgreSQL" in ok(run_job("resync.py", url, pg_dsn, lake_root, "--table", name))
    assert live(connect_spark, lake_root, name) == expected(pg_conn, name)
    assert "in sync" in ok(run_job("verify.py", url, pg_dsn, lake_root, "--table", name))


def cleanup_drops_unreferenced_files_and_leftovers(url: str, dsn: str, lake_root: str, path: str) -> None:
    """VACUUM at a zero retention leaves exactly the files the current version references; a write
    probe a killed export left long ago goes too."""
    probe = Path(path) / writes.WRITE_PROBE
    probe.write_text("")
    os.utime(probe, (time.time() - 86400, time.time() - 86400))
    table = f"public.{Path(path).name}"
    ok(run_job("cleanup.py", url, dsn, lake_root, "--table", table, "--retention-hours", "0",
               "--allow-short-retention", "--no-evict"))
    assert not probe.exists()
    referenced = {f["path"] for f in lake_store.live_files(path)[1]}
    on_disk = {str(Path(f).relative_to(path)) for f in lake_store.data_files(path)}
    assert {Path(f).name for f in on_disk} == {Path(f).name for f in referenced}


def report_equals_postgresql(url: str, dsn: str, conn, lake_root: str, name: str) -> None:
    target = f"adhoc_{uuid.uuid4().hex[:8]}"
    query = f"SELECT region, count(*) AS n, sum(amount) AS total, max(id) AS top_id FROM public.{name} GROUP BY region"
    ok(run_job("serve_report.py", url, dsn, lake_root, "--sql", query, "--target", target, "--run-id", target))
    served = conn.execute(f"SELECT region, n, total, top_id FROM reports.{target} ORDER BY region").fetchall()
    assert served == conn.execute(f"{query} ORDER BY region").fetchall()
    run = conn.execute("SELECT state, dirty_rows FROM coldharbor.report_runs WHERE run_id = %s", (target,)).fetchone()
    assert run[0] == "succeeded" and run[1][f"public.{name}"] > 0, run


def test_a_report_with_nothing_dirty_runs_over_connect(connect_server, connect_spark, pg_dsn, pg_conn, table_name,
                                                       lake_root):
    """Every change exported: the report's hot images are empty, a dataset a Spark Connect session
    infers no schema from; the report is the lake alone, equal to PostgreSQL, now and as of now."""
    url, name = connect_server.url, table_name
    make_table(pg_conn, name)
    change(pg_conn, name, 1)
    ok(run_job("cdc_export.py", url, pg_dsn, lake_root, "--table", name))
    assert dirty_ids(pg_conn, name) == []
    query = f"SELECT region, id, at, amount, note FROM public.{name}"
    for extra in ([], ["--as-of", pg_conn.execute("SELECT clock_timestamp()").fetchone()[0].isoformat()]):
        target = f"adhoc_{uuid.uuid4().hex[:8]}"
        ok(run_job("serve_report.py", url, pg_dsn, lake_root, "--sql", query, "--target", target, "--run-id", target,
                   *extra))
        assert pg_rows(pg_conn, f"SELECT region, id, at, amount, note FROM reports.{target}", ["region", "id"]) == \
            expected(pg_conn, name)
        run = pg_conn.execute("SELECT dirty_rows FROM coldharbor.report_runs WHERE run_id = %s", (target,)).fetchone()
        assert run[0][f"public.{name}"] == 0, run


PARAM_REPORT = """-- param: region string
-- param: min_id bigint = 0
-- param: every int = 3
-- param: rate decimal(6,3) = 1.5
-- param: factor double = 2
-- param: after timestamp = 2000-01-01T00:00:00+00:00
-- param: since date = 2000-01-01
-- param: keep boolean = true
SELECT region, :region AS asked, count(*) AS n, sum(amount * :rate) AS scaled, max(id * :factor) AS top
FROM public.{t} WHERE region = :region AND id >= :min_id AND id % :every = 0 AND at > :after
  AND CAST(at AS DATE) >= :since AND :keep GROUP BY region"""
INCREMENTAL_REPORT = """-- refresh: incremental
-- param: min_id bigint = 0
-- param: skip string
SELECT region, count(*) AS n, sum(amount) AS total FROM public.{t} WHERE id >= :min_id AND note <> :skip
GROUP BY region"""


def test_parameterized_reports_run_over_connect(connect_server, pg_dsn, pg_conn, table_name, lake_root, tmp_path):
    """Spark Connect leaves `spark.sql(..., args=...)` unbound; the serve job binds every declared
    type itself: a full report and an incremental one (built, then moved by changes) equal PostgreSQL
    for values a user typed, quotes and backslashes included."""
    url, name = connect_server.url, table_name
    make_table(pg_conn, name, history="exact")  # incremental refresh applies the logged rows
    ok(run_job("cdc_export.py", url, pg_dsn, lake_root, "--table", name))
    change(pg_conn, name, 1)  # dirty rows on top of the lake
    reports = tmp_path / "reports"
    reports.mkdir()
    (reports / f"p_{name}.sql").write_text(PARAM_REPORT.format(t=name))
    (reports / f"i_{name}.sql").write_text(INCREMENTAL_REPORT.format(t=name))
    env = {"COLDHARBOR_REPORTS_DIR": str(reports)}

    ok(run_job("serve_report.py", url, pg_dsn, lake_root, "--report", f"p_{name}", "--param", "region=eu'x",
               "--param", "every=7", "--param", "rate=0.125", env=env))
    assert pg_conn.execute(f"SELECT * FROM reports.p_{name}").fetchall() == pg_conn.execute(
        f"""SELECT region, region, count(*), sum(amount * 0.125), max(id * 2.0::float8) FROM {name}
            WHERE region = 'eu''x' AND id % 7 = 0 GROUP BY region""").fetchall()

    # A value Spark cannot compute (ANSI mode) is one line naming Spark's error, over Connect too.
    failed = run_job("serve_report.py", url, pg_dsn, lake_root, "--sql", f"SELECT id / (id - id) AS q FROM {name}",
                     "--target", f"adhoc_{name}")
    assert failed.returncode == 2 and "Traceback" not in failed.stderr, failed.stderr[-2000:]
    assert "the report fails on its data: [DIVIDE_BY_ZERO] Division by zero." in failed.stderr, failed.stderr[-2000:]
    overflow = f"SELECT sum(CAST(repeat('9', 37) AS DECIMAL(38, 0))) AS s FROM {name}"
    failed = run_job("serve_report.py", url, pg_dsn, lake_root, "--sql", overflow, "--target", f"adhoc_{name}")
    assert failed.returncode == 2 and "the report fails on its data: [ARITHMETIC_OVERFLOW] Overflow in sum of " \
        "decimals. Use 'try_sum' to tolerate overflow and return NULL instead. SQLSTATE: 22003; nothing was written" \
        in failed.stderr, failed.stderr[-2000:]

    skip = NOTES[2]  # back\slash
    truth = f"SELECT region, count(*), sum(amount) FROM {name} WHERE id >= 5 AND note <> %s GROUP BY region ORDER BY 1"
    details = []
    for round_ in (2, 3, 4):  # the first turns on the old images its changes need; then built, then moved
        run_id = f"i-{name}-{round_}"
        ok(run_job("serve_report.py", url, pg_dsn, lake_root, "--report", f"i_{name}", "--param", "min_id=5",
                   "--param", f"skip={skip}", "--run-id", run_id, env=env))
        assert pg_conn.execute(f"SELECT * FROM reports.i_{name} ORDER BY 1").fetchall() == \
            pg_conn.execute(truth, (skip,)).fetchall()
        details.append(pg_conn.execute("SELECT detail FROM coldharbor.report_runs WHERE run_id = %s",
                                       (run_id,)).fetchone()[0])
        ok(run_job("cdc_export.py", url, pg_dsn, lake_root, "--table", name))
        change(pg_conn, name, round_)
    assert details[-1].startswith("refreshed incrementally"), details

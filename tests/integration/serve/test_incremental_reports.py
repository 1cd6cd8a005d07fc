"""Incremental reports (`-- refresh: incremental`): after every step of a random workload, the report
refreshed from what changed equals the same SQL recomputed in full, and the run says how it was
refreshed; a report of another shape, or over a table without exact history, is refreshed in full,
saying why."""

from __future__ import annotations

import random
import zlib
from pathlib import Path

import psycopg
import pytest
from coldharbor.capture import registry

from tests.helpers import export, pg_rows, serve_report

REPORT = ("SELECT grp, count(*) AS n, count(note) AS notes, sum(amount) AS total, avg(amount) AS mean, "
          "min(amount) AS low, max(k) AS high, sum(k) AS ks, avg(k) AS mean_k FROM {t} WHERE k % 7 <> 3 GROUP BY grp")


def run_detail(conn, run_id: str) -> str:
    return conn.execute("SELECT state, detail FROM coldharbor.report_runs WHERE run_id = %s", (run_id,)).fetchone()


def incremental_and_full(monkeypatch, pg_dsn, lake_root, conn, name: str, sql: str, step: str) -> tuple[str, dict]:
    """Runs incremental report `name` and its SQL in full; asserts they agree and the run succeeded;
    returns how it was refreshed and its rows by group."""
    run, full_target = f"{name}-{step}", f"adhoc_{name}"[:48]
    assert serve_report(monkeypatch, pg_dsn, lake_root, "--report", name, "--run-id", run) == 0
    assert serve_report(monkeypatch, pg_dsn, lake_root, "--sql", sql, "--target", full_target,
                        "--run-id", f"{run}-full") == 0
    incremental = conn.execute(f"SELECT * FROM reports.{name} ORDER BY 1").fetchall()
    full = conn.execute(f"SELECT * FROM reports.{full_target} ORDER BY 1").fetchall()
    assert incremental == full, (step, run_detail(conn, run))
    state, detail = run_detail(conn, run)
    assert state == "succeeded", detail
    return detail, {r[0]: r[1:] for r in incremental}


def refresh_both(monkeypatch, pg_dsn, lake_root, conn, name: str, step: int) -> str:
    """Runs the incremental report and the same SQL in full; asserts they agree; returns how the
    incremental one was refreshed."""
    detail, _ = incremental_and_full(monkeypatch, pg_dsn, lake_root, conn, f"inc_{name}", REPORT.format(t=name),
                                     str(step))
    return detail


@pytest.fixture()
def reports_dir(tmp_path, monkeypatch):
    folder = tmp_path / "reports"
    folder.mkdir()
    monkeypatch.setenv("COLDHARBOR_REPORTS_DIR", str(folder))
    return folder


def test_a_random_workload_refreshed_incrementally_equals_the_full_recompute_after_every_step(
        spark, pg_dsn, pg_conn, table_name, lake_root, monkeypatch, reports_dir):
    rng = random.Random(23)
    t = table_name
    pg_conn.execute(f"""CREATE TABLE {t} (id bigint PRIMARY KEY, grp text, amount numeric(12,2), k integer NOT NULL,
                                          note text)""")
    pg_conn.execute(f"""INSERT INTO {t} SELECT g, 'g' || (g % 5), (g % 1000) / 7.0, g % 97,
                                                CASE WHEN g % 3 = 0 THEN 'n' || g END
                          FROM generate_series(1, 3000) g""")
    pg_conn.execute("SELECT coldharbor.register_table(%s, p_history => 'exact')", (t,))
    (reports_dir / f"inc_{t}.sql").write_text(f"-- refresh: incremental\n{REPORT.format(t=t)}\n")
    export(spark, pg_dsn, t, lake_root)                        # the initial load
    details = [refresh_both(monkeypatch, pg_dsn, lake_root, pg_conn, t, 0)]
    next_id = 3001
    for step in range(1, 9):
        with pg_conn.transaction():
            for _ in range(rng.randint(5, 40)):
                what = rng.random()
                key = rng.randint(1, next_id - 1)
                if what < 0.3:
                    pg_conn.execute(f"INSERT INTO {t} VALUES (%s, %s, %s, %s, %s)",
                                    (next_id, rng.choice(["g0", "g1", "g5", None]), rng.randint(-500, 500) / 4,
                                     rng.randint(0, 200), rng.choice([None, "x"])))
                    next_id += 1
                elif what < 0.55:   # moves the row to another group, maybe twice in the transaction
                    pg_conn.execute(f"UPDATE {t} SET grp = %s, amount = amount + 1 WHERE id = %s",
                                    (rng.choice(["g0", "g2", "g9", None]), key))
                elif what < 0.75:
                    pg_conn.execute(f"UPDATE {t} SET k = k + 3, note = NULL WHERE id = %s", (key,))
                elif what < 0.9 or step not in (4, 5):
                    pg_conn.execute(f"DELETE FROM {t} WHERE id = %s", (key,))
                else:               # the extremes leave: refreshed from the lake (or in full, not yet exported)
                    pg_conn.execute(f"DELETE FROM {t} WHERE amount = (SELECT max(amount) FROM {t}) "
                                    f"OR k = (SELECT max(k) FROM {t})")
        if step % 3 != 1:
            export(spark, pg_dsn, t, lake_root)
        details.append(refresh_both(monkeypatch, pg_dsn, lake_root, pg_conn, t, step))
    assert details[0].startswith("refreshed from the lake"), details
    assert sum(d.startswith("refreshed incrementally") for d in details) >= 3, details


def test_other_shapes_and_tables_without_exact_history_are_refreshed_in_full_saying_why(
        spark, pg_dsn, pg_conn, table_name, lake_root, monkeypatch, reports_dir):
    t = table_name
    pg_conn.execute(f"CREATE TABLE {t} (id bigint PRIMARY KEY, grp text, v double precision)")
    pg_conn.execute(f"INSERT INTO {t} SELECT g, 'g' || (g % 3), g / 3.0 FROM generate_series(1, 50) g")
    pg_conn.execute("SELECT coldharbor.register_table(%s)", (t,))
    export(spark, pg_dsn, t, lake_root)
    cases = {
        f"having_{t}": (f"SELECT grp, count(*) AS n FROM {t} GROUP BY grp HAVING count(*) > 1", "it has HAVING"),
        f"latest_{t}": (f"SELECT grp, count(*) AS n FROM {t} GROUP BY grp", "does not keep exact history"),
    }
    for name, (sql, _) in cases.items():
        (reports_dir / f"{name}.sql").write_text(f"-- refresh: incremental\n{sql}\n")
    for name, (sql, why) in cases.items():
        assert serve_report(monkeypatch, pg_dsn, lake_root, "--report", name, "--run-id", name) == 0
        state, detail = run_detail(pg_conn, name)
        assert state == "succeeded" and detail.startswith("refreshed in full: ") and why in detail, detail
        assert pg_rows(pg_conn, f"SELECT * FROM reports.{name}", ["grp"]) == pg_rows(
            pg_conn, f"SELECT grp, count(*) AS n FROM {t} GROUP BY grp" + (" HAVING count(*) > 1" if "having" in name
                                                                            else ""), ["grp"])
    # A sum of doubles depends on the order of addition.
    pg_conn.execute("SELECT coldharbor.register_table(%s, p_history => 'exact')", (t,))
    (reports_dir / f"dbl_{t}.sql").write_text(f"-- refresh: incremental\nSELECT grp, sum(v) AS s FROM {t} GROUP BY grp\n")
    assert serve_report(monkeypatch, pg_dsn, lake_root, "--report", f"dbl_{t}", "--run-id", f"dbl-{t}") == 0
    assert "SUM adds double values, whose total depends on the order of addition" in run_detail(pg_conn, f"dbl-{t}")[1]
    assert registry.load(pg_conn, t)[0].history == "exact"


def test_cases_a_cold_attack_found_answer_as_the_full_recompute(spark, pg_dsn, admin_dsn, pg_conn, table_name,
                                                                lake_root, monkeypatch, reports_dir):
    """Wide decimals keep every digit of their sums and averages (adding two decimal(38, s) columns
    would cut the scale); a purge rebuilds at the lake's current version (the purged rows do not
    come back); an AVG of integers past 2^53, where Spark's double sum depends on the order, is a
    full refresh; a damaged state is rebuilt; exported changes that do not chain rebuild the state
    and the next run is incremental again; a run while another holds the state is a full refresh."""
    t = table_name
    pg_conn.execute(f"""CREATE TABLE {t} (id bigint PRIMARY KEY, g text, a numeric(28,10), f numeric(38,8),
                                          b bigint)""")
    pg_conn.execute(f"""INSERT INTO {t} VALUES (1, 'x', 1.0000000001, 1.00000001, 1), (2, 'x', 2.0000000002, 1.00000002, 2),
                                               (3, 'y', 0.3333333333, 7.77777777, 3), (4, 'z', 5, 5, 4)""")
    pg_conn.execute("SELECT coldharbor.register_table(%s, p_history => 'exact')", (t,))
    sql = f"SELECT g, count(*) AS n, sum(a) AS sa, avg(a) AS va, sum(f) AS sf, avg(f) AS vf, avg(b) AS vb FROM {t} GROUP BY g"
    name = f"inc_{t}"
    (reports_dir / f"{name}.sql").write_text(f"-- refresh: incremental\n{sql}\n")
    export(spark, pg_dsn, t, lake_root)
    incremental_and_full(monkeypatch, pg_dsn, lake_root, pg_conn, name, sql, "built")
    pg_conn.execute(f"UPDATE {t} SET a = a + 0.0000000007, f = f + 0.00000003 WHERE id = 1")
    export(spark, pg_dsn, t, lake_root)
    detail, rows = incremental_and_full(monkeypatch, pg_dsn, lake_root, pg_conn, name, sql, "decimals")
    assert detail.startswith("refreshed incrementally"), detail
    assert str(rows["x"][1]) == "3.0000000010" and str(rows["x"][3]) == "2.00000006", rows

    from coldharbor.maintenance import purge
    monkeypatch.setenv("COLDHARBOR_PG_DSN", pg_dsn)
    assert purge.main(["--table", t, "--where", "id = 4", "--lake-root", lake_root,
                       "--vacuum-retention-hours", "168"]) in (0, 4)
    detail, rows = incremental_and_full(monkeypatch, pg_dsn, lake_root, pg_conn, name, sql, "purged")
    assert "z" not in rows and "purged" in detail, detail
    detail, rows = incremental_and_full(monkeypatch, pg_dsn, lake_root, pg_conn, name, sql, "after the purge")
    assert "z" not in rows and detail.startswith("refreshed incrementally"), detail

    state = Path(lake_root) / "_coldharbor" / "incremental" / name
    for data in state.glob("*.parquet"):
        data.unlink()
    pg_conn.execute(f"UPDATE {t} SET b = b + 1 WHERE id = 3")
    detail, _ = incremental_and_full(monkeypatch, pg_dsn, lake_root, pg_conn, name, sql, "damaged")
    assert detail.startswith("refreshed from the lake"), detail

    pg_conn.execute(f"""CREATE FUNCTION {t}_again() RETURNS trigger LANGUAGE plpgsql AS $$
                        BEGIN UPDATE {t} SET b = b + 100 WHERE id = NEW.id AND b < 100; RETURN NULL; END $$""")
    pg_conn.execute(f"CREATE TRIGGER again AFTER UPDATE ON {t} FOR EACH ROW EXECUTE FUNCTION {t}_again()")
    pg_conn.execute(f"UPDATE {t} SET g = 'w' WHERE id = 2")            # logged out of order: no chain
    pg_conn.execute(f"DROP TRIGGER again ON {t}")
    export(spark, pg_dsn, t, lake_root)
    detail, _ = incremental_and_full(monkeypatch, pg_dsn, lake_root, pg_conn, name, sql, "unchained")
    assert "cannot be applied" in detail and detail.startswith("refreshed from the lake"), detail
    pg_conn.execute(f"UPDATE {t} SET g = 'v' WHERE id = 3")
    detail, _ = incremental_and_full(monkeypatch, pg_dsn, lake_root, pg_conn, name, sql, "chained again")
    assert detail.startswith("refreshed incrementally"), detail

    with psycopg.connect(admin_dsn) as other:
        other.execute("SELECT pg_advisory_lock(%s, %s)", (0x43480008, zlib.crc32(name.encode()) & 0x7FFFFFFF))
        detail, _ = incremental_and_full(monkeypatch, pg_dsn, lake_root, pg_conn, name, sql, "locked")
        assert detail == "refreshed in full: another run of it is refreshing its state", detail

    pg_conn.execute(f"UPDATE {t} SET b = 9007199254740993 WHERE id = 3")
    detail, _ = incremental_and_full(monkeypatch, pg_dsn, lake_root, pg_conn, name, sql, "past 2^53")
    assert "2^53" in detail and detail.startswith("refreshed in full"), detail

"""One export cycle over many tables, several at once (COLDHARBOR_EXPORT_WORKERS): tables that held
rows before they were registered, keys of several types, names a user typed, one table refused
among them; every table's lake equals PostgreSQL and the results come in the tables' order."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from coldharbor.capture import registry
from coldharbor.export import base_state, export_job, hot_reader, table_export
from coldharbor.export.table_export import ExportConfig
from coldharbor.runtime import pg, settings

from tests.connect_server import run_job
from tests.helpers import lake_live, pg_rows

# (key definition, key columns, key expression of generate_series' g)
KEYS = [
    ("id bigint PRIMARY KEY", ["id"], "g"),
    ("code text PRIMARY KEY", ["code"], "'k''' || g || ' ; --'"),
    ("u uuid PRIMARY KEY", ["u"], "md5(g::text)::uuid"),
    ("a integer, b varchar(20), PRIMARY KEY (a, b)", ["a", "b"], "g, 'b\"' || (g % 3)"),
    ("d date PRIMARY KEY", ["d"], "date '2020-01-01' + g"),
]


def make_tables(conn, prefix: str) -> list[tuple[str, list[str]]]:
    """One table per key type, each holding 150 rows before it is registered (an initial load each)."""
    made = []
    for n, (key_def, keys, key_expr) in enumerate(KEYS):
        name = f'"{prefix} {n}; x"' if n == 1 else f"{prefix}_{n}"
        conn.execute(f"CREATE TABLE {name} ({key_def}, note text, amount numeric(10,2))")
        conn.execute(f"INSERT INTO {name} SELECT {key_expr}, 'n''' || g || E'\\n', g * 1.5 "
                     "FROM generate_series(1, 150) g")
        conn.execute("SELECT coldharbor.register_table(%s)", (name,))
        made.append((name, keys))
    return made


def change(conn, tables: list[tuple[str, list[str]]], round_: int) -> None:
    for name, _ in tables:
        conn.execute(f"UPDATE {name} SET amount = amount + {round_}, note = note || 'r{round_}' "
                     f"WHERE amount::int % 4 = {round_ % 4}")
        conn.execute(f"DELETE FROM {name} WHERE amount::int % 37 = {round_}")


def same_as_postgres(spark, conn, lake_root: str, name: str, keys: list[str]) -> None:
    [table] = registry.load(conn, name)
    lake = lake_live(spark, lake_root, table.qualified_name, keys)
    cols = keys + ["note", "amount"]
    expected = pg_rows(conn, f"SELECT {', '.join(cols)} FROM {name}", keys)

    def plain(value):  # the lake holds a uuid as its text
        return str(value) if isinstance(value, uuid.UUID) else value

    expected = {tuple(map(plain, k)): {c: plain(v) for c, v in row.items()} for k, row in expected.items()}
    assert {k: {c: v[c] for c in cols} for k, v in lake.items()} == expected, name
    assert conn.execute("SELECT count(*) FROM coldharbor.change_log WHERE table_id = %s AND flushed_at IS NULL",
                        (table.table_id,)).fetchone()[0] == 0, name


def run_cycle(spark, pg_dsn: str, lake_root: str, workers: int, names: list[str]):
    """table_export.export_tables over the tables `names` (the database holds other tests' tables too)."""
    with pg.connect(pg_dsn) as conn:
        tables = [t for name in names for t in registry.load(conn, name)]
        config = ExportConfig(table=None, lake_root=lake_root, run_id=f"test-{uuid.uuid4().hex[:6]}")
        return tables, table_export.export_tables(spark, conn, pg.JdbcTarget.from_dsn(pg_dsn), config, tables,
                                  lambda point: None, dsn=pg_dsn, workers=workers)


def test_tables_export_several_at_once_and_each_equals_postgresql(spark, pg_dsn, pg_conn, admin_dsn, lake_root):
    prefix = f"par_{uuid.uuid4().hex[:6]}"
    tables = make_tables(pg_conn, prefix)
    refused_name = tables[3][0]
    # One table the jobs' login may no longer read: refused alone, the others export beside it.
    pg_conn.execute(f"REVOKE SELECT ON {refused_name} FROM coldharbor_pipeline")

    names = [name for name, _ in tables]
    loaded, results = run_cycle(spark, pg_dsn, lake_root, 3, names)
    assert [r.table for r in results] == [t.qualified_name for t in loaded]  # the tables' order
    by_name = {r.table: r for r in results}
    for name, keys in tables:
        [table] = registry.load(pg_conn, name)
        result = by_name[table.qualified_name]
        if name == refused_name:
            assert result.status == "failed" and "lacks SELECT" in result.error, result
            continue
        assert result.status in ("loaded", "exported"), result
        assert result.loaded_rows == 150
        same_as_postgres(spark, pg_conn, lake_root, name, keys)

    pg_conn.execute(f"GRANT SELECT ON {refused_name} TO coldharbor_pipeline")
    for round_ in (1, 2):
        change(pg_conn, tables, round_)
        _, results = run_cycle(spark, pg_dsn, lake_root, 4, names)
        assert all(r.status in ("exported", "loaded", "clean") for r in results), results
    for name, keys in tables:
        same_as_postgres(spark, pg_conn, lake_root, name, keys)


def test_a_dirty_set_larger_than_one_readers_share_is_read_by_every_reader(spark, pg_dsn, pg_conn, table_name,
                                                                         lake_root, monkeypatch):
    """Small dirty sets have one JDBC reader; above ONE_READER_CHANGES each core reads a share of the
    keys (here lowered to 10 so 300 changes take that path), and together they are the whole set."""
    pg_conn.execute(f"CREATE TABLE {table_name} (id bigint PRIMARY KEY, note text, amount numeric(10,2))")
    pg_conn.execute(f"INSERT INTO {table_name} SELECT g, 'a' || g FROM generate_series(1, 300) g")
    pg_conn.execute("SELECT coldharbor.register_table(%s)", (table_name,))
    run_cycle(spark, pg_dsn, lake_root, 1, [table_name])
    monkeypatch.setattr(hot_reader, "ONE_READER_CHANGES", 10)
    reads = []
    real = hot_reader.snapshot_read
    monkeypatch.setattr(hot_reader, "snapshot_read", lambda *a, **k: reads.append(a[2]) or real(*a, **k))
    pg_conn.execute(f"UPDATE {table_name} SET note = note || '!' WHERE id % 3 <> 0")
    pg_conn.execute(f"DELETE FROM {table_name} WHERE id % 10 = 0")
    _, [result] = run_cycle(spark, pg_dsn, lake_root, 1, [table_name])
    assert result.status == "exported" and result.rows == 200 + 10, result
    assert len(reads) == 2 and all("jsonb_hash" in q for q in reads)  # local[2]: two shares
    same_as_postgres(spark, pg_conn, lake_root, table_name, ["id"])

    monkeypatch.setattr(hot_reader, "ONE_READER_CHANGES", 50_000)
    reads.clear()
    pg_conn.execute(f"UPDATE {table_name} SET note = 'b' WHERE id < 50")
    _, [result] = run_cycle(spark, pg_dsn, lake_root, 1, [table_name])
    assert len(reads) == 1 and "jsonb_hash" not in reads[0]
    same_as_postgres(spark, pg_conn, lake_root, table_name, ["id"])


@pytest.mark.parametrize("raw", ["0", "65", "two", "1.5"])
def test_a_bad_worker_count_is_one_line_naming_the_setting(raw, monkeypatch):
    monkeypatch.setenv(settings.EXPORT_WORKERS_ENV, raw)
    with pytest.raises(settings.ConfigError, match=settings.EXPORT_WORKERS_ENV):
        settings.export_workers()


def test_the_job_over_connect_exports_tables_several_at_once(connect_server, on_connect, own_database, lake_root):
    """The job as the DAG runs it on the warm engine: every dirty table in one cycle, three at once
    (in a database of its own: the job meets this test's tables alone)."""

    admin_dsn, pg_dsn = own_database
    with pg.connect(admin_dsn) as pg_conn:
        _job_over_connect_several_at_once(connect_server, pg_dsn, pg_conn, lake_root)


def _job_over_connect_several_at_once(connect_server, pg_dsn, pg_conn, lake_root) -> None:
    from coldharbor.runtime.spark import get_session

    prefix = f"parc_{uuid.uuid4().hex[:6]}"
    tables = make_tables(pg_conn, prefix)
    env = {settings.EXPORT_WORKERS_ENV: "3"}
    for round_ in (0, 1):
        if round_:
            change(pg_conn, tables, round_)
        done = run_job("cdc_export.py", connect_server.url, pg_dsn, lake_root, env=env)
        assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr[-3000:]
        assert "at once" in done.stdout + done.stderr
    reader = get_session("coldharbor-test-reader")
    for name, keys in tables:
        same_as_postgres(reader, pg_conn, lake_root, name, keys)


# Two points, one on each side of the lake commit: each export crash point alone (one table) is
# exercised under spark-submit and over Connect by the consistency suite's fast profile; here, what
# the other workers were doing when the job died is what is tested (each case took about 1.5 min).
@pytest.mark.parametrize("point", ["during_write", "after_commit"])
def test_a_cycle_killed_while_tables_export_at_once_converges(point, connect_server, on_connect, own_database,
                                                              lake_root):
    """The job killed (SIGKILL) at `point` of whichever table reaches it first, the other workers in
    the middle of theirs: the next cycle finishes every table, none with a row lost or doubled."""
    admin_dsn, pg_dsn = own_database
    with pg.connect(admin_dsn) as pg_conn:
        _killed_while_several_at_once(point, connect_server, pg_dsn, pg_conn, lake_root)


def _killed_while_several_at_once(point, connect_server, pg_dsn, pg_conn, lake_root) -> None:
    from coldharbor.lake.lake_rows import SEQ
    from coldharbor.runtime.spark import get_session
    from pyspark.sql import functions as F

    prefix = f"park_{uuid.uuid4().hex[:6]}"
    tables = make_tables(pg_conn, prefix)
    env = {settings.EXPORT_WORKERS_ENV: "3"}
    done = run_job("cdc_export.py", connect_server.url, pg_dsn, lake_root, env=env)  # the initial loads
    assert done.returncode == 0, done.stderr[-3000:]
    change(pg_conn, tables, 1)
    killed = run_job("cdc_export.py", connect_server.url, pg_dsn, lake_root, env={**env, "COLDHARBOR_CRASH_AT": point})
    assert killed.returncode == -9, (killed.returncode, killed.stderr[-3000:])
    change(pg_conn, tables, 2)
    done = run_job("cdc_export.py", connect_server.url, pg_dsn, lake_root, env=env)
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr[-3000:]
    reader = get_session("coldharbor-test-reader")
    for name, keys in tables:
        same_as_postgres(reader, pg_conn, lake_root, name, keys)
        [table] = registry.load(pg_conn, name)
        doubled = (reader.read.format("delta").load(table.lake_path(lake_root))
                   .groupBy(*keys, SEQ).count().filter(F.col("count") > 1).count())
        assert doubled == 0, name
        verified = run_job("verify.py", connect_server.url, pg_dsn, lake_root, "--table", table.qualified_name)
        assert verified.returncode == 0 and "in sync" in verified.stdout + verified.stderr, verified.stderr[-2000:]


def test_workers_export_at_the_same_time_each_with_its_own_session_and_connection(spark, pg_dsn, pg_conn,
                                                                                 lake_root):
    """Two tables, two workers: both must be inside their export at once (a barrier at after_read
    fails a run that takes them one after the other), in two threads, two Spark sessions and two
    PostgreSQL backends."""
    import threading

    prefix = f"paro_{uuid.uuid4().hex[:6]}"
    tables = make_tables(pg_conn, prefix)[:2]
    names = [name for name, _ in tables]
    run_cycle(spark, pg_dsn, lake_root, 1, names)  # the initial loads
    change(pg_conn, tables, 1)
    together = threading.Barrier(2, timeout=120)
    seen = []
    real_begin = export_job.batches.begin

    def begin(conn, table, run_id, rows):
        seen.append((threading.get_ident(), conn.info.backend_pid))
        return real_begin(conn, table, run_id, rows)

    sessions = []
    real_read = export_job.hot_reader.read_dirty_images

    def read(session, *args, **kwargs):
        sessions.append(session)
        return real_read(session, *args, **kwargs)

    def hook(point: str) -> None:
        if point == "after_read":
            together.wait()

    import unittest.mock as mock

    with mock.patch.object(export_job.batches, "begin", begin), mock.patch.object(export_job.hot_reader, "read_dirty_images",
                                                                              read):
        with pg.connect(pg_dsn) as conn:
            loaded = [t for name in names for t in registry.load(conn, name)]
            config = ExportConfig(table=None, lake_root=lake_root, run_id="test-overlap")
            results = table_export.export_tables(spark, conn, pg.JdbcTarget.from_dsn(pg_dsn), config, loaded, hook,
                                 dsn=pg_dsn, workers=2)
    assert [r.status for r in results] == ["exported", "exported"], results
    assert len({thread for thread, _ in seen}) == 2 and len({pid for _, pid in seen}) == 2
    assert len({id(s) for s in sessions}) == 2 and spark in sessions
    for name, keys in tables:
        same_as_postgres(spark, pg_conn, lake_root, name, keys)


def test_a_stopped_cycle_starts_no_more_tables_and_the_next_converges(spark, pg_dsn, pg_conn, lake_root):
    """Ctrl-C (or Airflow stopping the task) while two workers export five tables: the stop is
    raised in the job's thread, the tables under way are interrupted, no other one is started, and
    the next cycle exports them all."""
    import os
    import signal
    import time

    prefix = f"pars_{uuid.uuid4().hex[:6]}"
    tables = make_tables(pg_conn, prefix)
    names = [name for name, _ in tables]
    run_cycle(spark, pg_dsn, lake_root, 1, names)  # the initial loads
    change(pg_conn, tables, 1)
    reached = []

    def hook(point: str) -> None:
        if point == "after_read":
            reached.append(point)
            if len(reached) == 1:
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(2)

    with pytest.raises(KeyboardInterrupt):
        with pg.connect(pg_dsn) as conn:
            loaded = [t for name in names for t in registry.load(conn, name)]
            config = ExportConfig(table=None, lake_root=lake_root, run_id="test-stopped")
            table_export.export_tables(spark, conn, pg.JdbcTarget.from_dsn(pg_dsn), config, loaded, hook, dsn=pg_dsn, workers=2)
    assert len(reached) <= 2, reached  # the two under way; a run that went on would reach all five
    _, results = run_cycle(spark, pg_dsn, lake_root, 2, names)
    assert all(r.status in ("exported", "clean") for r in results), results
    for name, keys in tables:
        same_as_postgres(spark, pg_conn, lake_root, name, keys)


def test_a_name_that_is_no_folder_name_fails_alone_and_writes_nothing_outside_its_own_folder(spark, pg_dsn, pg_conn,
                                                                                             lake_root):
    """Found by a cold attack: "../../x" wrote a Delta table outside the lake root, "../public/t"
    into another table's folder, and "p%41q" / "h#y?z" stuck their tables for good (the JVM and
    the Python reader disagreed on the folder)."""
    prefix = f"esc_{uuid.uuid4().hex[:6]}"
    victim = f"public.{prefix}_victim"
    hostile = [f'public."../../{prefix}_out"', f'public."../public/{prefix}_victim"', f'public."{prefix}%41q"',
               f'public."{prefix}#y?z"', f'public.".{prefix}"']
    for name in [victim, *hostile]:
        pg_conn.execute(f"CREATE TABLE {name} (id bigint PRIMARY KEY, v text)")
        pg_conn.execute(f"INSERT INTO {name.replace('%', '%%')} SELECT g, %s || g FROM generate_series(1, 20) g",
                        (name,))
        pg_conn.execute("SELECT coldharbor.register_table(%s)", (name,))

    loaded, results = run_cycle(spark, pg_dsn, lake_root, 2, [victim, *hostile])
    assert len(loaded) == 6
    assert results[0].status == "loaded" and results[0].loaded_rows == 20, results[0]
    for result in results[1:]:
        assert result.status == "failed" and "has no lake folder of its own name" in result.error, result
        assert "\n" not in result.error
    root = Path(lake_root)
    assert not (root.parent / f"{prefix}_out").exists()
    assert sorted(p.name for p in (root / "public").iterdir() if p.name.startswith(f"{prefix}")) == [f"{prefix}_victim"]
    lake = lake_live(spark, lake_root, victim, ["id"])
    assert {k: (r["id"], r["v"]) for k, r in lake.items()} == \
        {k: (r["id"], r["v"]) for k, r in pg_rows(pg_conn, f"SELECT id, v FROM {victim}", ["id"]).items()}
    assert {r["v"] for r in lake.values()} == {f"{victim}{i}" for i in range(1, 21)}  # its own rows only
    for name in hostile:  # the initial load still waits for an administrator's p_lake_location
        [table] = registry.load(pg_conn, name)
        assert base_state.load_state(pg_conn, table.table_id).pending, name


def test_a_pending_table_the_job_may_not_read_fails_alone_in_the_job(spark, own_database, lake_root, monkeypatch,
                                                                     caplog):
    """Found by a cold attack: a table registered with rows and not loaded yet, SELECT revoked from
    the jobs' login, stopped the whole cycle before any table exported ("PostgreSQL refused the
    job's role"); now it is one failed table, named, and the others export."""
    admin_dsn, pg_dsn = own_database
    prefix = f"rv_{uuid.uuid4().hex[:6]}"
    with pg.connect(admin_dsn) as conn:
        for name in (f"{prefix}_ok", f"{prefix}_revoked"):
            conn.execute(f"CREATE TABLE {name} (id bigint PRIMARY KEY, v text)")
            conn.execute(f"INSERT INTO {name} SELECT g, 'v' || g FROM generate_series(1, 40) g")
            conn.execute("SELECT coldharbor.register_table(%s)", (name,))
        conn.execute(f"REVOKE SELECT ON {prefix}_revoked FROM coldharbor_pipeline")
        monkeypatch.setenv(settings.PG_DSN_ENV, pg_dsn)
        assert export_job.main(["--lake-root", lake_root]) == 2
        failed = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
        assert len(failed) == 1 and f"public.{prefix}_revoked" in failed[0], failed
        assert "lacks SELECT" in caplog.text
        lake = lake_live(spark, lake_root, f"public.{prefix}_ok", ["id"])
        assert sorted(k[0] for k in lake) == list(range(1, 41))
        [revoked] = registry.load(conn, f"{prefix}_revoked")
        assert base_state.load_state(conn, revoked.table_id).pending
        assert not (Path(lake_root) / "public" / f"{prefix}_revoked").exists()


def test_a_table_registered_again_at_its_old_folder_goes_on_where_it_stopped(spark, pg_dsn, pg_conn, lake_root):
    """The README's upgrade step for a table whose name is no longer a folder name: registered
    again naming the folder it has, its load state, batches and dirty changes stay and the export
    appends to that folder."""
    name = f'public."up_{uuid.uuid4().hex[:6]}:v2"'
    folder_name = name.split('"')[1]
    folder = f"{lake_root}/public/{folder_name}"
    pg_conn.execute(f"CREATE TABLE {name} (id bigint PRIMARY KEY, v text)")
    pg_conn.execute(f"INSERT INTO {name} SELECT g, 'v' || g FROM generate_series(1, 30) g")
    pg_conn.execute("SELECT coldharbor.register_table(%s, p_lake_location => %s)", (name, folder))  # as before
    run_cycle(spark, pg_dsn, lake_root, 1, [name])
    pg_conn.execute(f"UPDATE {name} SET v = v || '!' WHERE id <= 10")
    [table] = registry.load(pg_conn, name)
    batches_before = pg_conn.execute("SELECT count(*) FROM coldharbor.export_batches WHERE table_id = %s",
                                     (table.table_id,)).fetchone()[0]
    pg_conn.execute("SELECT coldharbor.register_table(%s, p_lake_location => %s)", (name, folder))
    assert not base_state.load_state(pg_conn, table.table_id).pending
    assert hot_reader.has_dirty(pg_conn, table.table_id)
    assert pg_conn.execute("SELECT count(*) FROM coldharbor.export_batches WHERE table_id = %s",
                           (table.table_id,)).fetchone()[0] == batches_before
    _, [result] = run_cycle(spark, pg_dsn, lake_root, 1, [name])
    assert result.status == "exported" and result.rows == 10, result
    lake = {k: r["v"] for k, r in lake_live(spark, lake_root, f"public.{folder_name}", ["id"]).items()}
    assert lake == {k: r["v"] for k, r in pg_rows(pg_conn, f"SELECT id, v FROM {name}", ["id"]).items()}

"""File names outside ASCII: a JVM whose locale is not UTF-8 (LC_ALL=C, common in containers and
CI) writes a table folder "tü" as "t?", which "tö" shares. Found by a cold attack: two tables'
batches landed in one Delta table. Every JVM Coldharbor starts gets a UTF-8 locale
(jvm_locale.jvm_environment); a JVM started by someone else with an ASCII one is refused, one line,
before anything is written."""

from __future__ import annotations

import uuid
from pathlib import Path

from coldharbor.capture import registry
from coldharbor.export import base_state
from coldharbor.runtime import pg

from tests.connect_server import run_job, running_server
from tests.helpers import lake_live, pg_rows, spark_submit_export


def make_tables(admin_dsn: str, names: list[str]) -> None:
    with pg.connect(admin_dsn) as conn:
        for name in names:
            conn.execute(f'CREATE TABLE public."{name}" (id bigint PRIMARY KEY, v text)')
            conn.execute(f'INSERT INTO public."{name}" SELECT g, %s || g FROM generate_series(1, 25) g', (name,))
            conn.execute("SELECT coldharbor.register_table(%s)", (f'public."{name}"',))


def test_a_connect_server_started_under_lc_all_c_writes_each_table_under_its_own_name(
        spark, own_database, lake_root, tmp_path):
    admin_dsn, pg_dsn = own_database
    tag = uuid.uuid4().hex[:6]
    names = [f"t\u00fc_{tag}", f"t\u00f6_{tag}"]
    make_tables(admin_dsn, names)
    with running_server(tmp_path, env={"LC_ALL": "C", "LANG": "C"}) as server:
        done = run_job("cdc_export.py", server.url, pg_dsn, lake_root, env={"LC_ALL": "C"})
    assert done.returncode == 0, done.stderr[-3000:]
    assert sorted(p.name for p in (Path(lake_root) / "public").iterdir()) == sorted(names)
    with pg.connect(admin_dsn) as conn:
        for name in names:
            lake = lake_live(spark, lake_root, f"public.{name}", ["id"])
            assert {k: r["v"] for k, r in lake.items()} == \
                {k: r["v"] for k, r in pg_rows(conn, f'SELECT id, v FROM public."{name}"', ["id"]).items()}


def test_spark_submit_under_lc_all_c_is_refused_before_anything_is_written(own_database, lake_root):
    admin_dsn, pg_dsn = own_database
    name = f"r\u00e9_{uuid.uuid4().hex[:6]}"
    make_tables(admin_dsn, [name])
    done = spark_submit_export(pg_dsn, lake_root, env={"LC_ALL": "C", "LANG": "C"})
    assert done.returncode == 2, done.stdout[-3000:]
    assert "Traceback" not in done.stdout
    errors = [line for line in done.stdout.splitlines() if " ERROR coldharbor" in line]
    assert len(errors) == 1 and "encodes file names as ANSI_X3.4-1968" in errors[0], done.stdout[-3000:]
    assert "LC_ALL=C.UTF-8" in errors[0]
    assert not (Path(lake_root) / "public").exists() or not any((Path(lake_root) / "public").iterdir())
    with pg.connect(admin_dsn) as conn:
        [table] = registry.load(conn, f'public."{name}"')
        assert base_state.load_state(conn, table.table_id).pending

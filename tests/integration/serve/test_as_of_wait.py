"""What a report run waits for before an as-of read (serve_cli.waiting_for, the report DAGs'
wait_for_lake sensor): only what the next export brings in, against real PostgreSQL and Spark."""

from __future__ import annotations

import time
from datetime import datetime, timedelta, timezone

from coldharbor.serve.serve_cli import waiting_for

from tests.helpers import export

HOSTILE = ' "q\'s" <b>ü'  # quotes of each kind, spaces, HTML and a non-ASCII letter


def quoted(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def now(conn) -> datetime:
    instant = conn.execute("SELECT clock_timestamp()").fetchone()[0]
    time.sleep(0.05)
    return instant


def report(name: str, as_of: datetime | str) -> list[str]:
    """serve_report's arguments for an ad-hoc report over public.<name> as of `as_of`."""
    at = as_of if isinstance(as_of, str) else as_of.isoformat()
    table = "`" + name.replace("`", "``") + "`"
    return ["--sql", f"SELECT count(*) AS n FROM public.{table}", "--target", "adhoc_wait", "--as-of", at]


def test_a_run_waits_for_changes_before_its_instant_and_for_a_rebase_s_base_nothing_else(
        spark, pg_dsn, pg_conn, table_name, lake_root):
    name = table_name + HOSTILE
    t = f"public.{quoted(name)}"
    pg_conn.execute(f"CREATE TABLE {t} (id bigint PRIMARY KEY, v text)")
    pg_conn.execute(f"INSERT INTO {t} SELECT g, 'v' FROM generate_series(1, 50) g")
    pg_conn.execute("SELECT coldharbor.register_table(%s)", (t,))
    args = ["--lake-root", lake_root]

    registered = now(pg_conn)
    assert waiting_for([*report(name, registered), *args], pg_dsn) is None, \
        "the lake knows nothing before its initial load: the run refuses the instant at once"
    assert waiting_for([*report(name, "now"), *args], pg_dsn) is None, "a run without an as-of waits for nothing"

    export(spark, pg_dsn, f"public.{name}", lake_root)
    loaded = now(pg_conn)
    assert waiting_for([*report(name, loaded), *args], pg_dsn) is None

    pg_conn.execute(f"UPDATE {t} SET v = 'w' WHERE id <= 5")
    changed = now(pg_conn)
    waiting = waiting_for([*report(name, changed), *args], pg_dsn)
    assert waiting is not None and waiting.startswith(f"as-of {changed.isoformat()} is not in the lake yet; "
                                                      f"public.{name}: changes from "), waiting
    assert waiting.endswith(" are not exported yet"), waiting
    assert waiting_for([*report(name, loaded), *args], pg_dsn) is None, \
        "an instant before the dirty changes is in the lake already"

    export(spark, pg_dsn, f"public.{name}", lake_root)
    assert waiting_for([*report(name, changed), *args], pg_dsn) is None

    exported = now(pg_conn)
    pg_conn.execute(f"ALTER TABLE {t} ADD COLUMN d text DEFAULT 'filled'")  # a rebase: every row changed
    waiting = waiting_for([*report(name, exported), *args], pg_dsn)
    assert waiting == (f"as-of {exported.isoformat()} is not in the lake yet; public.{name}: the new base of a "
                       "rebase is not in the lake yet"), waiting
    assert waiting_for([*report(name, now(pg_conn)), *args], pg_dsn) is None, \
        "an instant inside the rebase window is refused whatever the base: not waited for"
    export(spark, pg_dsn, f"public.{name}", lake_root)
    assert waiting_for([*report(name, exported), *args], pg_dsn) is None


def test_a_report_the_run_refuses_is_not_waited_for(spark, pg_dsn, pg_conn, table_name, lake_root):
    """The serve task refuses it, records it and says why: nothing is gained by waiting first."""
    pg_conn.execute(f"CREATE TABLE {table_name} (id bigint PRIMARY KEY, v text)")
    pg_conn.execute("SELECT coldharbor.register_table(%s)", (table_name,))
    pg_conn.execute(f"INSERT INTO {table_name} VALUES (1, 'dirty')")
    instant = datetime.now(timezone.utc)
    args = ["--lake-root", lake_root]
    assert waiting_for([*report(table_name, instant), *args], pg_dsn) is not None
    for refused in (report("t_not_registered", instant),
                    ["--sql", f"SELECT v FROM {table_name}; DROP TABLE x", "--target", "adhoc_w", "--as-of",
                     instant.isoformat()],
                    [*report(table_name, instant)[:-1], "yesterday"],
                    ["--no-such-option"]):
        assert waiting_for([*refused, *args], pg_dsn) is None, refused
    assert waiting_for([*report(table_name, instant), *args], "postgresql://nobody@127.0.0.1:1/none") is None
    future = datetime.now(timezone.utc) + timedelta(hours=1)
    assert waiting_for([*report(table_name, future), *args], pg_dsn) is None, "refused as in the future"
    assert waiting_for([*report(table_name, instant - timedelta(days=30)), *args], pg_dsn) is None, \
        "refused as before the history window"

"""The "Lakehouse health" page behind Airflow's login, against a running Airflow API server: in a
real headless browser (Debian's Chromium) logged in through Airflow's own login form, and with
plain HTTP requests carrying no token, a forged or expired one, or a real one."""

from __future__ import annotations

import json
import re
import time

import httpx
import pytest

from tests.dags.airflow_api import api_server as start_api_server
from tests.dags.airflow_api import login_token, password_of, server_env, signed_token
from tests.dags.browser import Browser
from tests.helpers import export

PAGE = "/coldharbor/health"


@pytest.fixture(scope="module")
def airflow_web(airflow_home, tmp_path_factory):
    """(base URL, server environment, lake root) of one API server for the module's tests."""
    lake_root = str(tmp_path_factory.mktemp("lake"))
    env = server_env(lake_root)
    with start_api_server(env, tmp_path_factory.mktemp("api") / "api-server.log") as base:
        yield base, env, lake_root


def log_in(browser: Browser, base: str, user: str) -> None:
    """Airflow's login form, typed into as a person would, starting from the page's own link."""
    browser.open(f"{base}{PAGE}")
    browser.evaluate("document.getElementById('login').click()")
    browser.wait_for("document.querySelector('input[name=username]')")
    browser.fill("input[name=username]", user)
    browser.fill("input[name=password]", password_of(user))
    browser.wait_for("!document.querySelector('button[type=submit]').disabled")
    browser.evaluate("document.querySelector('button[type=submit]').click()")
    browser.wait_for(f"location.pathname === '{PAGE}' && document.readyState === 'complete'")


def table_cells(page: str, table: str) -> list[str]:
    row = next(line for line in page.split("<tr>") if f"public.{table}" in line)
    return [c.split("</td>")[0] for c in row.split("<td>")[1:]]


def test_a_logged_in_browser_sees_an_exported_table(airflow_web, spark, pg_dsn, pg_conn, table_name, tmp_path):
    base, _, lake_root = airflow_web
    pg_conn.execute(f"CREATE TABLE {table_name} (id bigint PRIMARY KEY, v text)")
    pg_conn.execute("SELECT coldharbor.register_table(%s)", (table_name,))
    pg_conn.execute(f"INSERT INTO {table_name} SELECT g, 'v' FROM generate_series(1, 30) g")
    result = export(spark, pg_dsn, table_name, lake_root)
    pg_conn.execute(f"UPDATE {table_name} SET v = 'w' WHERE id <= 4")  # four dirty rows

    with Browser(tmp_path / "chromium") as browser:
        log_in(browser, base, "admin")
        assert "_token" in browser.cookie_names()  # the UI's cookie, not a header, carries the login
        page = browser.html()
        # The UI's own link to the page (Browse > Lakehouse health) shows it inside Airflow too.
        browser.open(f"{base}/plugin/lakehouse-health")
        browser.wait_for("document.querySelector('iframe')?.contentDocument?.getElementById('tables')")
        framed = browser.evaluate("document.querySelector('iframe').contentDocument.documentElement.outerHTML")

    assert "<h1>Lakehouse health</h1>" in page and 'id="report-runs"' in page
    cells = table_cells(page, table_name)
    assert cells[1].startswith('<span class="state ok">ok</span>: every unexported change is younger than the '
                               "promise of 5.0 min")
    assert cells[2] == "4"                                   # dirty rows
    assert cells[4].endswith("</span> / 5.0 min")            # freshness lag / promise
    assert cells[6] == str(result.batch_id) and cells[8] == str(result.lake_version)
    assert cells[9] == "30 rows in " + cells[9].split(" in ")[1] and cells[3].startswith("<svg")
    assert int(cells[12]) >= 1                               # files in the Delta table
    assert table_cells(framed, table_name)[2] == "4"


def test_an_anonymous_browser_is_refused_and_offered_the_login(airflow_web, pg_conn, table_name, tmp_path):
    base, _, _ = airflow_web
    pg_conn.execute(f"CREATE TABLE {table_name} (id bigint PRIMARY KEY)")
    pg_conn.execute("SELECT coldharbor.register_table(%s)", (table_name,))
    with Browser(tmp_path / "chromium") as browser:
        browser.open(f"{base}{PAGE}")
        page = browser.html()
    assert 'id="refused"' in page and 'id="login"' in page
    assert 'id="tables"' not in page and table_name not in page


def test_requests_without_a_valid_token_are_refused(airflow_web):
    base, env, _ = airflow_web
    expired = signed_token(env, "admin", "admin", valid_for_s=-300)
    forged = signed_token({**env, "AIRFLOW__API_AUTH__JWT_SECRET": "not-the-servers-key-0123456789abcdef"},
                          "admin", "admin", valid_for_s=3600)
    refusals = {
        "no token": httpx.get(f"{base}{PAGE}"),
        "expired bearer": httpx.get(f"{base}{PAGE}", headers={"Authorization": f"Bearer {expired}"}),
        "expired cookie": httpx.get(f"{base}{PAGE}", cookies={"_token": expired}),
        "forged bearer": httpx.get(f"{base}{PAGE}", headers={"Authorization": f"Bearer {forged}"}),
        "forged cookie": httpx.get(f"{base}{PAGE}", cookies={"_token": forged}),
        "garbage bearer": httpx.get(f"{base}{PAGE}", headers={"Authorization": "Bearer x.y.z"}),
    }
    assert {name: r.status_code for name, r in refusals.items()} == {
        "no token": 401, "expired bearer": 401, "expired cookie": 401, "forged bearer": 403, "forged cookie": 403,
        "garbage bearer": 403}
    assert all('id="tables"' not in r.text for r in refusals.values())
    assert refusals["no token"].headers["www-authenticate"] == "Bearer"


def test_a_token_from_airflows_login_endpoint_opens_the_page(airflow_web):
    base, _, _ = airflow_web
    token = login_token(base, "admin")
    for response in (httpx.get(f"{base}{PAGE}", headers={"Authorization": f"Bearer {token}"}),
                     httpx.get(f"{base}{PAGE}", cookies={"_token": token})):
        assert response.status_code == 200 and 'id="tables"' in response.text


def test_a_user_without_the_permission_to_view_plugins_is_refused(airflow_web):
    base, _, _ = airflow_web
    token = login_token(base, "nobody")  # logs in, but has no role
    response = httpx.get(f"{base}{PAGE}", headers={"Authorization": f"Bearer {token}"})
    assert response.status_code == 403 and 'id="tables"' not in response.text


@pytest.mark.parametrize("method, path", [
    ("GET", "/coldharbor/health/"), ("GET", "/coldharbor/./health"), ("GET", "/coldharbor/%68ealth"),
    ("GET", "/coldharbor/health?x=1"), ("GET", "/coldharbor/"), ("GET", "/coldharbor"), ("GET", "//coldharbor/health"),
    ("GET", "/coldharbor/docs"), ("GET", "/coldharbor/redoc"), ("GET", "/coldharbor/openapi.json"),
    ("HEAD", PAGE), ("OPTIONS", PAGE), ("POST", PAGE),
])
def test_no_path_or_method_under_the_mount_answers_anonymously(airflow_web, method, path):
    """Nothing under the plugin's mount gives an anonymous caller the page, its figures or a
    description of its routes (what answers 200 here is the Airflow UI's own login shell)."""
    base, _, _ = airflow_web
    response = httpx.request(method, f"{base}{path}", follow_redirects=True)
    assert 'id="tables"' not in response.text and 'id="report-runs"' not in response.text
    assert '"openapi"' not in response.text
    if response.status_code == 200:
        assert "<title>Airflow</title>" in response.text  # the UI's shell, which asks for a login itself
    else:
        assert response.status_code in (401, 403, 404, 405)


def test_the_page_shows_no_error_text_or_path(airflow_home, spark, pg_dsn, pg_conn, table_name, monkeypatch, caplog,
                                              capsys, tmp_path):
    """An unreachable hot tier, an unreadable lake and a failed report run: the page says so in a
    plain sentence; the server's log has the details (the PostgreSQL error, the paths). A table
    never exported has no lake folder yet, and says that instead."""
    import shutil

    from coldharbor_airflow import health_page

    missing_lake = tmp_path / "no-such-lake"
    monkeypatch.setenv("COLDHARBOR_LAKE_ROOT", str(missing_lake))
    for name in (table_name, f"{table_name}_new"):
        pg_conn.execute(f"CREATE TABLE {name} (id bigint PRIMARY KEY)")
        pg_conn.execute(f"INSERT INTO {name} VALUES (1)")
        pg_conn.execute("SELECT coldharbor.register_table(%s)", (name,))
    export(spark, pg_dsn, table_name, str(missing_lake))
    shutil.rmtree(missing_lake)                                   # the lake removed under the page
    assert "none yet: nothing was exported" in table_cells(health_page.build_page(), f"{table_name}_new")[12]
    secret_error = f"could not open file {tmp_path}/x: ERROR: relation \"secret_table\" does not exist"
    pg_conn.execute("""INSERT INTO coldharbor.report_runs (run_id, report, target, mode, state, degraded, error)
                       VALUES (gen_random_uuid()::text, 'r', 'adhoc_x', 'strict', 'failed', false, %s)""",
                    (secret_error,))
    caplog.set_level("WARNING")
    page = health_page.build_page()
    assert health_page.RUN_FAILED in page and "unavailable" in page
    assert str(tmp_path) not in page and "secret_table" not in page
    assert str(missing_lake) in caplog.text + capsys.readouterr().out  # Airflow logs through structlog to stdout

    monkeypatch.setenv("AIRFLOW_CONN_COLDHARBOR_PG", json.dumps(
        {"conn_type": "postgres", "host": "127.0.0.1", "port": 1, "login": "u", "password": "pw", "schema": "db"}))
    page = health_page.build_page()
    assert health_page.HOT_TIER_UNREADABLE in page
    assert "127.0.0.1" not in page and "refused" not in page.lower()
    assert "127.0.0.1:1/db" in caplog.text + capsys.readouterr().out  # the reason, for the server's log


def test_the_page_shows_each_tables_initial_load_and_last_verify(airflow_home, spark, pg_dsn, pg_conn, table_name,
                                                                 tmp_path, monkeypatch):
    """A table whose load is pending, one loaded and verified in sync, one whose lake was edited by
    hand and verified out of sync (the sample keys stay in the task log, not on the page)."""
    from coldharbor.maintenance import verify
    from coldharbor_airflow import health_page
    from delta.tables import DeltaTable

    lake_root = str(tmp_path / "lake")
    monkeypatch.setenv("COLDHARBOR_LAKE_ROOT", lake_root)
    monkeypatch.setenv("COLDHARBOR_PG_DSN", pg_dsn)
    pending, in_sync, drifted = (f"{table_name}_{s}" for s in ("p", "s", "d"))
    for name in (pending, in_sync, drifted):
        pg_conn.execute(f"CREATE TABLE {name} (id bigint PRIMARY KEY, v text)")
        pg_conn.execute(f"INSERT INTO {name} SELECT g, 'v' FROM generate_series(1, 40) g")
        pg_conn.execute("SELECT coldharbor.register_table(%s)", (name,))
    for name in (in_sync, drifted):
        export(spark, pg_dsn, name, lake_root)
    DeltaTable.forPath(spark, f"{lake_root}/public/{drifted}").delete("id = 31")
    assert verify.main(["--table", in_sync, "--lake-root", lake_root]) == 0
    assert verify.main(["--table", drifted, "--lake-root", lake_root]) == 1

    page = health_page.build_page()
    assert table_cells(page, pending)[-2].startswith('<span class="bad">pending: served from PostgreSQL')
    assert table_cells(page, pending)[-1] == "—"
    assert table_cells(page, in_sync)[-2].startswith("40 rows as of ")
    assert table_cells(page, in_sync)[-1].startswith("in sync at ")
    assert "differences found at " in table_cells(page, drifted)[-1]
    assert "id=31" not in page and lake_root not in page


def test_a_table_being_rebuilt_shows_why_with_its_column_names_escaped(airflow_home, pg_conn, table_name):
    """A rebase (sql/migrations/014) names the column it is about; a column name is the table owner's text."""
    from coldharbor_airflow import health_page

    pg_conn.execute(f'CREATE TABLE {table_name} (id bigint PRIMARY KEY, "<b>x</b>" text)')
    pg_conn.execute(f"INSERT INTO {table_name} VALUES (1, 'a')")
    pg_conn.execute("SELECT coldharbor.register_table(%s)", (table_name,))
    pg_conn.execute(f"""UPDATE coldharbor.tables SET load_state = 'loaded'
                         WHERE table_name = '{table_name}'""")  # as if its initial load had landed
    pg_conn.execute(f'ALTER TABLE {table_name} RENAME COLUMN "<b>x</b>" TO y')
    page = health_page.build_page()
    assert "rebuilding from PostgreSQL (column &quot;&lt;b&gt;x&lt;/b&gt;&quot; was renamed to y)" in page
    assert "<b>x</b>" not in page


def test_a_table_dropped_and_created_again_shows_it_with_its_name_escaped(airflow_home, pg_conn, table_name):
    """Not registered again, the new table's writes are not captured: the page says so. The table's
    name is its owner's text."""
    import html

    from coldharbor_airflow import health_page

    name = f'{table_name} <b>x</b> "q\'s" ü'
    quoted = '"' + name.replace('"', '""') + '"'
    pg_conn.execute(f"CREATE TABLE {quoted} (id bigint PRIMARY KEY)")
    pg_conn.execute("SELECT coldharbor.register_table(%s)", (quoted,))
    page = health_page.build_page()
    row = next(line for line in page.split("<tr>") if html.escape(f"public.{name}") in line)
    assert "dropped and created again" not in row
    pg_conn.execute(f"DROP TABLE {quoted}")
    pg_conn.execute(f"CREATE TABLE {quoted} (id bigint PRIMARY KEY)")
    page = health_page.build_page()
    row = next(line for line in page.split("<tr>") if html.escape(f"public.{name}") in line)
    assert "dropped and created again since it was registered: its writes are not captured" in row
    assert "<b>x</b>" not in page


def test_the_page_finds_each_tables_lake_folder_as_the_jobs_do(airflow_home, spark, pg_dsn, pg_conn, table_name,
                                                               tmp_path, monkeypatch):
    """Found by a cold attack: the page made the folder of "public.t.v" public/t/v (the jobs write
    public/"t.v"), and showed a folder for a name the jobs refuse as a folder ("../x")."""
    import html

    from coldharbor_airflow import health_page, lake_files

    lake_root = str(tmp_path / "lake")
    monkeypatch.setenv("COLDHARBOR_LAKE_ROOT", lake_root)
    dotted, hostile = f"{table_name}.v", f"../{table_name}"
    for name in (dotted, hostile):
        pg_conn.execute(f'CREATE TABLE public."{name}" (id bigint PRIMARY KEY, v text)')
        pg_conn.execute(f'INSERT INTO public."{name}" SELECT g, \'v\' FROM generate_series(1, 30) g')
        pg_conn.execute("SELECT coldharbor.register_table(%s)", (f'public."{name}"',))
    export(spark, pg_dsn, f'public."{dotted}"', lake_root)
    page = health_page.build_page()
    files = table_cells(page, dotted)[12]
    assert files.isdigit() and int(files) >= 1, table_cells(page, dotted)
    row = next(line for line in page.split("<tr>") if html.escape(f"public.{hostile}") in line)
    assert html.escape(lake_files.NO_OWN_FOLDER) in row
    assert lake_root not in page


METRICS = "/coldharbor/metrics"


def scrape(text: str) -> dict[tuple[str, tuple], float]:
    """{(metric name, sorted label pairs): value}, parsed by Prometheus's own Python parser."""
    from prometheus_client.parser import text_string_to_metric_families

    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def test_the_metrics_are_behind_the_same_login(airflow_web):
    base, env, _ = airflow_web
    forged = signed_token({**env, "AIRFLOW__API_AUTH__JWT_SECRET": "not-the-servers-key-0123456789abcdef"},
                          "admin", "admin", valid_for_s=3600)
    refused = {"anonymous": httpx.get(f"{base}{METRICS}"),
               "forged": httpx.get(f"{base}{METRICS}", headers={"Authorization": f"Bearer {forged}"}),
               "no permission": httpx.get(f"{base}{METRICS}",
                                          headers={"Authorization": f"Bearer {login_token(base, 'nobody')}"})}
    assert {k: r.status_code for k, r in refused.items()} == {"anonymous": 401, "forged": 403, "no permission": 403}
    assert all("coldharbor_" not in r.text for r in refused.values())
    allowed = httpx.get(f"{base}{METRICS}", headers={"Authorization": f"Bearer {login_token(base, 'admin')}"})
    assert allowed.status_code == 200
    assert allowed.headers["content-type"].startswith("text/plain; version=")
    assert scrape(allowed.text)[("coldharbor_up", (("tier", "postgres"),))] == 1


def test_the_metrics_give_each_tables_backlog_export_and_files(airflow_web, spark, pg_dsn, pg_conn, table_name):
    """Scraped over HTTP from the API server: an exported table whose name holds quotes and a space
    (four rows dirty since), a table whose name holds a newline and a backslash (no lake folder, five
    rows dirty), a table registered with 20 rows (its initial load is no export of changes), and a
    report with a failed last run: each sample under its exact names."""
    base, _, lake_root = airflow_web
    exported, unexported, loaded = f"{table_name} \"q'", f"{table_name}\n\\x", f"{table_name}_loaded"
    pg_conn.execute(f"CREATE TABLE {loaded} AS SELECT g AS id FROM generate_series(1, 20) g")
    pg_conn.execute(f"ALTER TABLE {loaded} ADD PRIMARY KEY (id)")
    pg_conn.execute("SELECT coldharbor.register_table(%s)", (loaded,))
    export(spark, pg_dsn, loaded, lake_root)
    quoted = {n: '"' + n.replace('"', '""') + '"' for n in (exported, unexported)}
    for name in (exported, unexported):
        pg_conn.execute(f"CREATE TABLE public.{quoted[name]} (id bigint PRIMARY KEY, v text)")
        pg_conn.execute("SELECT coldharbor.register_table(%s)", (f"public.{quoted[name]}",))
    pg_conn.execute(f"INSERT INTO public.{quoted[exported]} SELECT g, 'v' FROM generate_series(1, 30) g")
    export(spark, pg_dsn, f"public.{quoted[exported]}", lake_root)
    pg_conn.execute(f"UPDATE public.{quoted[exported]} SET v = 'w' WHERE id <= 4")
    pg_conn.execute(f"INSERT INTO public.{quoted[unexported]} SELECT g, 'v' FROM generate_series(1, 5) g")
    report, quiet = f"r_{table_name}\"\\", f"q_{table_name}"
    for report_name, state, minutes_ago in ((report, "succeeded", 30), (report, "failed", 10),
                                            (report, "succeeded", 60 * 25), (quiet, "failed", 60 * 30)):
        pg_conn.execute("""INSERT INTO coldharbor.report_runs (run_id, report, target, mode, state, started_at, finished_at)
                           VALUES (gen_random_uuid()::text, %s, 'x', 'strict', %s,
                                   now() - make_interval(mins => %s), now() - make_interval(mins => %s) + interval '3 s')""",
                        (report_name, state, minutes_ago, minutes_ago))

    text = httpx.get(f"{base}{METRICS}", headers={"Authorization": f"Bearer {login_token(base, 'admin')}"}).text
    samples = scrape(text)

    def of(metric: str, name: str) -> float | None:
        return samples.get((metric, (("schema", "public"), ("table", name))))

    assert of("coldharbor_table_dirty_rows", exported) == 4
    assert of("coldharbor_table_dirty_rows", unexported) == 5
    assert of("coldharbor_table_oldest_dirty_change_age_seconds", exported) > 0
    assert of("coldharbor_table_freshness_promise_seconds", exported) == 300
    assert of("coldharbor_table_last_export_rows", exported) == 30
    assert of("coldharbor_table_last_export_duration_seconds", exported) >= 0
    assert of("coldharbor_table_lake_readable", exported) == 1
    assert of("coldharbor_table_lake_version", exported) >= 0
    assert of("coldharbor_table_lake_files", exported) >= 1
    assert of("coldharbor_table_lake_bytes", exported) > 0
    assert of("coldharbor_table_last_export_rows", unexported) is None
    assert of("coldharbor_table_lake_files", unexported) is None
    assert of("coldharbor_table_lake_readable", unexported) is None
    assert of("coldharbor_table_last_export_rows", loaded) is None and of("coldharbor_table_lake_files", loaded) >= 1
    assert samples[("coldharbor_report_runs_24h", (("report", report),))] == 2
    assert samples[("coldharbor_report_failed_runs_24h", (("report", report),))] == 1
    assert samples[("coldharbor_report_last_run_failed", (("report", report),))] == 1
    assert samples[("coldharbor_report_last_run_duration_seconds", (("report", report),))] == 3
    # A report that has not run for a day still shows its last run failed, and no run since.
    assert samples[("coldharbor_report_last_run_failed", (("report", quiet),))] == 1
    assert samples[("coldharbor_report_runs_24h", (("report", quiet),))] == 0


def test_statsd_names_of_two_tables_never_meet(airflow_home):
    """A name StatsD cannot carry is hashed; a plain name that looks hashed is hashed too, so a
    table cannot take another's gauges by its name."""
    from coldharbor_airflow.metrics import statsd_name

    tables = ["orders", "a.b", "a_b", "a_b_69f6642c", "a b", "ordérs", "x" * 61, "x" * 60, "", "-"]
    names = [statsd_name("coldharbor_table_dirty_rows", {"schema": "public", "table": t}) for t in tables]
    assert len(set(names)) == len(tables), names
    assert names[0] == "coldharbor.table.public.orders.dirty_rows"
    assert all(re.fullmatch(r"[A-Za-z0-9_.-]{1,250}", n) and ".." not in n for n in names), names


def test_the_metrics_say_which_tier_is_down_without_a_path(airflow_home, spark, own_database, table_name, tmp_path,
                                                           monkeypatch, caplog, capsys):
    """A database of its own with one exported table: the lake is up; its lake root moved away:
    coldharbor_up{tier="lake"} 0; PostgreSQL unreachable: only coldharbor_up{tier="postgres"} 0. The
    reasons go to the server's log, not the metrics."""
    from coldharbor.runtime import pg
    from coldharbor_airflow import metrics
    from psycopg.conninfo import conninfo_to_dict

    admin_dsn, jobs_dsn = own_database
    lake_root = str(tmp_path / "lake")
    with pg.connect(admin_dsn) as conn:
        conn.execute(f"CREATE TABLE {table_name} (id bigint PRIMARY KEY)")
        conn.execute("SELECT coldharbor.register_table(%s)", (table_name,))
        conn.execute(f"INSERT INTO {table_name} SELECT generate_series(1, 3)")
    export(spark, jobs_dsn, table_name, lake_root)
    own = conninfo_to_dict(jobs_dsn)
    monkeypatch.setenv("AIRFLOW_CONN_COLDHARBOR_PG", json.dumps(
        {"conn_type": "postgres", "host": own["host"], "port": int(own["port"]), "login": own["user"],
         "password": own.get("password"), "schema": own["dbname"]}))
    labels = (("schema", "public"), ("table", table_name))
    monkeypatch.setenv("COLDHARBOR_LAKE_ROOT", lake_root)
    samples = scrape(metrics.build().decode())
    assert samples[("coldharbor_up", (("tier", "lake"),))] == 1
    assert samples[("coldharbor_table_lake_files", labels)] >= 1

    monkeypatch.setenv("COLDHARBOR_LAKE_ROOT", str(tmp_path / "moved-away"))
    text = metrics.build().decode()
    assert scrape(text)[("coldharbor_up", (("tier", "lake"),))] == 0
    assert scrape(text)[("coldharbor_table_lake_readable", labels)] == 0
    assert ("coldharbor_table_lake_files", labels) not in scrape(text)
    assert scrape(text)[("coldharbor_table_last_export_rows", labels)] == 3  # PostgreSQL's figures stay
    assert str(tmp_path) not in text

    monkeypatch.setenv("AIRFLOW_CONN_COLDHARBOR_PG", json.dumps(
        {"conn_type": "postgres", "host": "127.0.0.1", "port": 1, "login": "u", "password": "pw", "schema": "db"}))
    text = metrics.build().decode()
    assert scrape(text) == {("coldharbor_up", (("tier", "postgres"),)): 0}
    assert "127.0.0.1" not in text
    assert "127.0.0.1:1/db" in caplog.text + capsys.readouterr().out


def test_a_lagging_and_a_failing_table_are_red_with_their_rule_charts_and_links(
        airflow_web, pg_dsn, pg_conn, table_name, tmp_path, monkeypatch):
    """In Chromium, with health samples the export job itself wrote: a table past its freshness
    promise and one whose last export failed (a value the lake cannot hold), beside a healthy one."""
    from coldharbor.export import export_job as export_job

    base, _, lake_root = airflow_web
    monkeypatch.setenv("COLDHARBOR_PG_DSN", pg_dsn)
    lagging, failing, fine = f"{table_name}_lag", f"{table_name}_fail", f"{table_name}_ok"
    for name, promise in ((lagging, "1 second"), (failing, "1 hour"), (fine, "1 hour")):
        pg_conn.execute(f"CREATE TABLE {name} (id bigint PRIMARY KEY, d date)")
        pg_conn.execute("SELECT coldharbor.register_table(%s, p_freshness => %s)", (name, promise))
        pg_conn.execute(f"INSERT INTO {name} SELECT g, '2026-11-28' FROM generate_series(1, 1500) g")
        assert export_job.main(["--table", f"public.{name}", "--lake-root", lake_root]) == 0
    pg_conn.execute(f"UPDATE {failing} SET d = 'infinity' WHERE id = 7")  # the lake holds no such date
    assert export_job.main(["--table", f"public.{failing}", "--lake-root", lake_root]) == 2
    pg_conn.execute(f"UPDATE {lagging} SET d = '2026-11-29' WHERE id <= 10")
    time.sleep(1.5)

    with Browser(tmp_path / "chromium") as browser:
        log_in(browser, base, "admin")
        png = browser.screenshot(tmp_path / "health.png")
        page = browser.html()
        charts = browser.evaluate("document.querySelectorAll('#tables svg.chart polyline').length")
        links = browser.evaluate("[...document.querySelectorAll('#tables a')].map(a => a.href)")

    assert png.startswith(b"\x89PNG\r\n\x1a\n") and len(png) > 20_000, len(png)
    lag_cells, fail_cells, ok_cells = (table_cells(page, n) for n in (lagging, failing, fine))
    assert lag_cells[1].startswith('<span class="state lagging">lagging</span>: the oldest unexported change is ')
    assert "past the promise of 1.0 s" in lag_cells[1] and lag_cells[2] == "10"
    assert fail_cells[1].startswith('<span class="state failing">failing</span>: its last export, at ')
    assert "failed: the export task's log says why" in fail_cells[1] and fail_cells[2] == "1"
    assert ok_cells[1].startswith('<span class="state ok">ok</span>') and ok_cells[9].startswith("1,500 rows in ")
    for cells in (lag_cells, fail_cells, ok_cells):  # backlog, lag, rows and time charts, drawn from samples
        assert all(cells[i].startswith('<svg class="chart"') and "<polyline" in cells[i] for i in (3, 5, 10, 11)), cells
    assert charts >= 12
    assert links and all(link == f"{base}/dags/coldharbor_cdc/runs" for link in links), links
    for name in (lagging, failing):  # behind their promises: no later check_freshness of the run should see them
        pg_conn.execute(f"DROP TABLE {name}")


def test_a_lake_first_tables_landing_backlog_is_on_the_page_and_in_the_metrics(
        airflow_home, spark, pg_dsn, pg_conn, table_name, tmp_path, monkeypatch):
    lake_root = str(tmp_path / "lake")
    from coldharbor.export import export_job
    from coldharbor_airflow import health_page, metrics

    monkeypatch.setenv("COLDHARBOR_LAKE_ROOT", lake_root)
    monkeypatch.setenv("COLDHARBOR_PG_DSN", pg_dsn)
    first, mirror = f"{table_name}_l", f"{table_name}_m"
    for name, mode in ((first, "lake_first"), (mirror, "mirror")):
        pg_conn.execute(f"CREATE TABLE {name} (id bigint PRIMARY KEY, v text)")
        pg_conn.execute("SELECT coldharbor.register_table(%s, p_mode => %s)", (name, mode))
        pg_conn.execute(f"INSERT INTO {name} SELECT g, 'v' FROM generate_series(1, 1234) g")
    assert table_cells(health_page.build_page(), first)[-3] == "lake-first: 1,234 rows landing"
    assert table_cells(health_page.build_page(), mirror)[-3] == "mirror: every row"
    assert export_job.main(["--lake-root", lake_root, "--table", first]) == 0
    pg_conn.execute(f"INSERT INTO {first} VALUES (5000, 'late')")
    assert table_cells(health_page.build_page(), first)[-3] == "lake-first: 1 rows landing"
    text = metrics.build().decode()
    assert f'coldharbor_table_landing_rows{{schema="public",table="{first}"}} 1.0' in text
    assert f'table="{mirror}"}}' in text and f'landing_rows{{schema="public",table="{mirror}"}}' not in text

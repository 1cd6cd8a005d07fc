"""`make run`'s set-up (coldharbor.embedded.stack) on a server of its own: the jobs' settings hold the pipeline's
login only, the superuser's stays with set-up, and the demo application writes as its own role."""

from __future__ import annotations

import stat

from coldharbor.capture import roles
from coldharbor.embedded import stack
from coldharbor.embedded.postgres import EmbeddedPostgres, new_password
from coldharbor.runtime import pg, settings
from psycopg.conninfo import conninfo_to_dict


def test_set_up_gives_the_jobs_the_pipeline_login_and_keeps_the_superuser_apart(tmp_path, monkeypatch):
    monkeypatch.setattr(settings, "DATA_DIR", tmp_path)
    monkeypatch.setattr(stack, "ENV_FILE", tmp_path / "coldharbor.env")
    monkeypatch.setattr(stack, "SETUP_ENV_FILE", tmp_path / "coldharbor-setup.env")
    server = EmbeddedPostgres(tmp_path / "pg", stack.free_port())
    monkeypatch.setattr(stack, "server", lambda: server)
    superuser_password = new_password()
    server.init(superuser_password)
    # A data folder set up before the roles existed: the jobs' file held the superuser's DSN.
    stack.ENV_FILE.write_text(f"{settings.PG_DSN_ENV}={server.dsn(superuser_password)}\n")
    try:
        logins = stack.up()
        jobs_file = stack.ENV_FILE.read_text()
        assert superuser_password not in jobs_file
        assert conninfo_to_dict(stack._read_env(stack.ENV_FILE)[settings.PG_DSN_ENV])["user"] == roles.PIPELINE
        assert stack._read_env(stack.SETUP_ENV_FILE)[settings.ADMIN_PG_DSN_ENV] == server.dsn(superuser_password)
        for path in (stack.ENV_FILE, stack.SETUP_ENV_FILE):
            assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
        with pg.connect(logins.pipeline) as jobs:
            assert jobs.execute("SELECT current_user, rolsuper FROM pg_roles WHERE rolname = current_user"
                                ).fetchone() == (roles.PIPELINE, False)
        assert stack.up() == logins, "a second start keeps the pipeline's password"

        app_dsn = stack.demo(logins.admin, "demo-password", rows=20)
        with pg.connect(app_dsn) as app:
            assert app.execute("SELECT current_user, rolsuper FROM pg_roles WHERE rolname = current_user"
                               ).fetchone() == (stack.DEMO_ROLE, False)
            app.execute("DELETE FROM public.demo_orders WHERE order_id = 1")
            stack.put_demo_customer(app)
        with pg.connect(logins.pipeline) as jobs:
            assert jobs.execute("""SELECT count(*) FROM coldharbor.change_log c
                                     JOIN coldharbor.tables t USING (table_id)
                                   WHERE t.table_name = 'demo_orders'""").fetchone()[0] > 20
    finally:
        server.stop()

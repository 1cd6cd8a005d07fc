"""The embedded stack on one machine: PostgreSQL on 127.0.0.1, the lake and jar cache under data/.

    python -m coldharbor.embedded.stack up          start PostgreSQL, apply sql/, write data/coldharbor.env (the jobs':
                                           coldharbor_pipeline's DSN, the lake root) and data/coldharbor-setup.env
                                           (set-up's: the superuser's DSN, the demo application's)
    python -m coldharbor.embedded.stack down        stop PostgreSQL
    python -m coldharbor.embedded.stack fetch-jars  resolve Delta and the JDBC driver into the jar cache
    python -m coldharbor.embedded.stack demo        the demo application (its own login role): a demo table and a demo
                                           entity schema, registered and written to; print what is dirty
                                           (COLDHARBOR_ADMIN_PG_DSN and COLDHARBOR_DEMO_PASSWORD, else the setup file)
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import random
import socket
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from psycopg import sql
from psycopg.conninfo import conninfo_to_dict

from coldharbor.capture import migrate, roles
from coldharbor.embedded.postgres import EmbeddedPostgres, new_password
from coldharbor.runtime import pg, settings

PG_PORT = int(os.environ.get("COLDHARBOR_PG_PORT", "54329"))
ENV_FILE = settings.DATA_DIR / "coldharbor.env"              # the jobs' settings: `make export` sources it
SETUP_ENV_FILE = settings.DATA_DIR / "coldharbor-setup.env"  # set-up's secrets: never given to a job
DEMO_ROLE = "coldharbor_demo"                                 # the demo application's login
DEMO_PG_DSN_ENV = "COLDHARBOR_DEMO_PG_DSN"
DEMO_PASSWORD_ENV = "COLDHARBOR_DEMO_PASSWORD"
DEMO_TABLE = "public.demo_orders"
DEMO_ENTITY = "demo_customer"
DEMO_ENTITY_SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "tier": {"type": "string", "enum": ["gold", "silver", "bronze"]},
        "credit": {"type": "integer"},
        "country": {"type": "string"},
        "newsletter": {"type": "boolean"},
        "joined": {"type": "string", "format": "date"},
        "preferences": {"type": "object"},
    },
    "required": ["name", "tier"],
}
DEMO_ENTITY_HOT = ["name", "tier"]


def server() -> EmbeddedPostgres:
    return EmbeddedPostgres(settings.DATA_DIR / "pg", PG_PORT)


@dataclass(frozen=True)
class Logins:
    """The DSNs of one server: set-up's (a superuser) and the jobs' (coldharbor_pipeline)."""

    admin: str
    pipeline: str


def up() -> Logins:
    """Starts the embedded server (initializing it the first time), migrates and sets the pipeline's
    login; writes the jobs' env file (the pipeline's DSN only) and set-up's (the superuser's)."""
    settings.DATA_DIR.mkdir(parents=True, exist_ok=True)
    srv = server()
    setup = _read_env(SETUP_ENV_FILE) if SETUP_ENV_FILE.exists() else {}
    if not srv.is_initialized():
        password = new_password()
        srv.init(password)
        setup = {settings.ADMIN_PG_DSN_ENV: srv.dsn(password)}
    elif settings.ADMIN_PG_DSN_ENV not in setup:
        # Set up before the roles existed: the jobs' file held the superuser's DSN. It moves here.
        setup = {**setup, settings.ADMIN_PG_DSN_ENV: _read_env(ENV_FILE)[settings.PG_DSN_ENV]}
    _write_env(SETUP_ENV_FILE, setup)
    srv.start()
    logins = prepare(setup[settings.ADMIN_PG_DSN_ENV], _saved_password(ENV_FILE, settings.PG_DSN_ENV, roles.PIPELINE))
    _write_env(ENV_FILE, {settings.PG_DSN_ENV: logins.pipeline,
                          settings.LAKE_ROOT_ENV: str(settings.DATA_DIR / "lake")})
    return logins


def prepare(admin_dsn: str, pipeline_password: str) -> Logins:
    """Migrates the server at `admin_dsn` and gives coldharbor_pipeline this password."""
    with pg.connect(admin_dsn) as conn:
        migrate.apply(conn, migrate.discover())
        roles.set_password(conn, roles.PIPELINE, pipeline_password)
    return Logins(admin_dsn, roles.login_dsn(admin_dsn, roles.PIPELINE, pipeline_password))


def _saved_password(env_file: Path, key: str, role: str) -> str:
    """The password of `role` in the DSN an earlier run wrote to `env_file`, else a new one."""
    dsn = _read_env(env_file).get(key) if env_file.exists() else None
    params = conninfo_to_dict(dsn) if dsn else {}
    return params["password"] if params.get("user") == role and params.get("password") else new_password()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def throwaway_server(folder: Path) -> Iterator[Logins]:
    """A new migrated server in `folder` on a free loopback port (tests, benchmarks); yields its logins."""
    with throwaway(folder) as (_, logins):
        yield logins


@contextmanager
def throwaway(folder: Path, **overrides: str) -> Iterator[tuple[EmbeddedPostgres, Logins]]:
    """`throwaway_server` that also yields the server (to stop and start it), with server settings
    that differ from the embedded defaults, e.g. track_commit_timestamp="off"."""
    srv = EmbeddedPostgres(folder / "pgdata", free_port(), overrides=tuple(overrides.items()))
    password = new_password()
    srv.init(password)
    srv.start()
    try:
        yield srv, prepare(srv.dsn(password), new_password())
    finally:
        srv.stop()


def _write_env(path: Path, values: dict[str, str]) -> None:
    """KEY=value lines a shell can source (the values are URLs and paths: no spaces or quotes)."""
    path.touch(mode=0o600)
    path.chmod(0o600)
    path.write_text("".join(f"{key}={value}\n" for key, value in values.items()))


def _read_env(path: Path = ENV_FILE) -> dict[str, str]:
    pairs = (line.split("=", 1) for line in path.read_text().splitlines() if "=" in line)
    return {key: value for key, value in pairs}


def fetch_jars() -> None:
    """Resolves the Maven packages once, so that no scheduled run waits on a download."""
    from coldharbor.runtime.spark import get_session

    spark = get_session("coldharbor-fetch-jars")
    spark.range(1).count()
    spark.stop()
    print(f"jars cached under {Path(os.environ.get('COLDHARBOR_IVY_DIR', settings.DATA_DIR / 'ivy'))}")


def demo(admin_dsn: str, demo_password: str, rows: int = 1000) -> str:
    """The demo application: its own login role (a member of coldharbor_app, no superuser) owning a
    small live-looking table it registers and writes (inserts, updates and deletes, all captured),
    and records of a demo entity schema it writes through put_entity. Returns its DSN."""
    app_dsn = roles.login_dsn(admin_dsn, DEMO_ROLE, demo_password)
    with pg.connect(admin_dsn) as admin:
        roles.ensure_app_login(admin, DEMO_ROLE, demo_password)
        # Only the schema's owner may create tables in public (PostgreSQL 15+): set-up creates it for the application.
        admin.execute("""CREATE TABLE IF NOT EXISTS public.demo_orders (
                             order_id bigint PRIMARY KEY, customer text NOT NULL,
                             amount numeric(12,2) NOT NULL, status text NOT NULL,
                             updated_at timestamptz NOT NULL DEFAULT now())""")
        admin.execute(sql.SQL("ALTER TABLE public.demo_orders OWNER TO {}").format(sql.Identifier(DEMO_ROLE)))
        demo_schema(admin)
    with pg.connect(app_dsn) as conn:
        conn.execute("SELECT coldharbor.register_table('public.demo_orders')")  # as its owner
        start = conn.execute("SELECT coalesce(max(order_id), 0) FROM public.demo_orders").fetchone()[0]
        conn.execute("""INSERT INTO public.demo_orders (order_id, customer, amount, status)
                        SELECT %s + g, 'customer-' || (g %% 50), round((random() * 500)::numeric, 2), 'new'
                        FROM generate_series(1, %s) g""", (start, rows))
        touched = random.sample(range(start + 1, start + rows + 1), k=max(1, rows // 10))
        conn.execute("UPDATE public.demo_orders SET status = 'paid', updated_at = now() WHERE order_id = ANY(%s)",
                     (touched[: len(touched) // 2],))
        conn.execute("DELETE FROM public.demo_orders WHERE order_id = ANY(%s)", (touched[len(touched) // 2:],))
        customers = max(1, rows // 10)
        for _ in range(customers):
            put_demo_customer(conn)
    with pg.connect(admin_dsn) as admin:
        dirty = admin.execute("SELECT count(*) FROM coldharbor.change_log WHERE flushed_at IS NULL").fetchone()[0]
    print(f"demo: {DEMO_ROLE} wrote {rows} orders to {DEMO_TABLE} and {customers} records of entity schema "
          f"{DEMO_ENTITY} (entities.{DEMO_ENTITY}); {dirty} changes are dirty")
    return app_dsn


def demo_schema(admin) -> None:
    """The demo entity schema, defined and registered once (an administrator's act)."""
    defined = admin.execute("SELECT EXISTS (SELECT 1 FROM coldharbor.entity_schemas WHERE name = %s)",
                            (DEMO_ENTITY,)).fetchone()[0]
    if not defined:
        admin.execute("SELECT coldharbor.define_entity_schema(%s, %s::jsonb, %s)",
                      (DEMO_ENTITY, json.dumps(DEMO_ENTITY_SCHEMA), DEMO_ENTITY_HOT))
    admin.execute("SELECT coldharbor.register_entity_schema(%s)", (DEMO_ENTITY,))


def demo_password() -> str:
    """The demo application's password: COLDHARBOR_DEMO_PASSWORD, else the one an earlier set-up
    saved, else a new one (saved for the next)."""
    password = os.environ.get(DEMO_PASSWORD_ENV)
    if password:
        return password
    password = _saved_password(SETUP_ENV_FILE, DEMO_PG_DSN_ENV, DEMO_ROLE)
    setup = _read_env(SETUP_ENV_FILE) if SETUP_ENV_FILE.exists() else {}
    admin = setup.get(settings.ADMIN_PG_DSN_ENV)
    if admin:
        _write_env(SETUP_ENV_FILE, {**setup, DEMO_PG_DSN_ENV: roles.login_dsn(admin, DEMO_ROLE, password)})
    return password


def admin_dsn() -> str:
    """Set-up's DSN: COLDHARBOR_ADMIN_PG_DSN, else the setup file `up` wrote."""
    dsn = os.environ.get(settings.ADMIN_PG_DSN_ENV)
    if dsn:
        return dsn
    if SETUP_ENV_FILE.exists() and settings.ADMIN_PG_DSN_ENV in _read_env(SETUP_ENV_FILE):
        return _read_env(SETUP_ENV_FILE)[settings.ADMIN_PG_DSN_ENV]
    return settings.admin_pg_dsn()  # says which setting is missing


def put_demo_customer(conn, row_id=None):
    """Creates (or, given a row_id, replaces) one demo customer record; returns its row_id."""
    document = {"name": f"customer-{random.randint(1, 10_000)}", "tier": random.choice(["gold", "silver", "bronze"]),
                "credit": random.randint(0, 5_000), "country": random.choice(["NO", "SE", "DK", "FI"]),
                "newsletter": random.random() < 0.5,
                "joined": f"2026-{random.randint(1, 12):02d}-{random.randint(1, 28):02d}"}
    if random.random() < 0.5:
        document["preferences"] = {"channel": random.choice(["email", "sms"])}
    return conn.execute("SELECT coldharbor.put_entity(%s, %s::jsonb, %s)",
                        (DEMO_ENTITY, json.dumps(document), row_id)).fetchone()[0]


def main(argv: list[str]) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    parser = argparse.ArgumentParser(prog="python -m coldharbor.embedded.stack", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", choices=["up", "down", "fetch-jars", "demo", "env"])
    args = parser.parse_args(argv)
    if args.command == "up":
        logins = up()
        print(f"PostgreSQL is up at {pg.describe(logins.pipeline)}; the jobs' settings (coldharbor_pipeline's DSN) "
              f"in {ENV_FILE}, set-up's (the superuser's DSN) in {SETUP_ENV_FILE}")
    elif args.command == "down":
        server().stop()
    elif args.command == "fetch-jars":
        fetch_jars()
    elif args.command == "demo":
        demo(admin_dsn(), demo_password())
    elif args.command == "env":
        sys.stdout.write(ENV_FILE.read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

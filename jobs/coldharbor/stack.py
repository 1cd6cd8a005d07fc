"""The embedded stack on one machine: PostgreSQL on 127.0.0.1, the lake and jar cache under data/.

    python -m coldharbor.stack up          start PostgreSQL, apply sql/, write data/coldharbor.env
    python -m coldharbor.stack down        stop PostgreSQL
    python -m coldharbor.stack fetch-jars  resolve Delta and the JDBC driver into the jar cache
    python -m coldharbor.stack demo        register a demo table and a demo entity schema, write to them,
                                           print what is dirty
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
from pathlib import Path

from coldharbor import migrate, pg, settings
from coldharbor.embedded_pg import EmbeddedPostgres, new_password

log = logging.getLogger(__name__)

PG_PORT = int(os.environ.get("COLDHARBOR_PG_PORT", "54329"))
ENV_FILE = settings.DATA_DIR / "coldharbor.env"
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


def up() -> str:
    """Starts the embedded server (initializing it the first time) and migrates; returns the DSN."""
    settings.DATA_DIR.mkdir(parents=True, exist_ok=True)
    srv = server()
    if not srv.is_initialized():
        password = new_password()
        srv.init(password)
        _write_env(srv.dsn(password))
    srv.start()
    dsn = _read_env()[settings.PG_DSN_ENV]
    with pg.connect(dsn) as conn:
        migrate.apply(conn, migrate.discover())
    return dsn


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def throwaway_server(folder: Path) -> Iterator[str]:
    """A new migrated server in `folder` on a free loopback port (tests, benchmarks); yields its DSN."""
    with throwaway(folder) as (_, dsn):
        yield dsn


@contextmanager
def throwaway(folder: Path, **overrides: str) -> Iterator[tuple[EmbeddedPostgres, str]]:
    """`throwaway_server` that also yields the server (to stop and start it), with server settings
    that differ from the embedded defaults, e.g. track_commit_timestamp="off"."""
    srv = EmbeddedPostgres(folder / "pgdata", free_port(), overrides=tuple(overrides.items()))
    password = new_password()
    srv.init(password)
    srv.start()
    try:
        dsn = srv.dsn(password)
        with pg.connect(dsn) as conn:
            migrate.apply(conn, migrate.discover())
        yield srv, dsn
    finally:
        srv.stop()


def _write_env(dsn: str) -> None:
    lake = settings.DATA_DIR / "lake"
    ENV_FILE.write_text(f"{settings.PG_DSN_ENV}={dsn}\n{settings.LAKE_ROOT_ENV}={lake}\n")
    ENV_FILE.chmod(0o600)


def _read_env() -> dict[str, str]:
    pairs = (line.split("=", 1) for line in ENV_FILE.read_text().splitlines() if "=" in line)
    return {key: value for key, value in pairs}


def fetch_jars() -> None:
    """Resolves the Maven packages once, so that no scheduled run waits on a download."""
    from coldharbor.spark import get_session

    spark = get_session("coldharbor-fetch-jars")
    spark.range(1).count()
    spark.stop()
    print(f"jars cached under {Path(os.environ.get('COLDHARBOR_IVY_DIR', settings.DATA_DIR / 'ivy'))}")


def demo(dsn: str, rows: int = 1000) -> None:
    """A small live-looking table: inserts, updates and deletes, all captured."""
    with pg.connect(dsn) as conn:
        conn.execute("""CREATE TABLE IF NOT EXISTS public.demo_orders (
                            order_id bigint PRIMARY KEY, customer text NOT NULL,
                            amount numeric(12,2) NOT NULL, status text NOT NULL,
                            updated_at timestamptz NOT NULL DEFAULT now())""")
        conn.execute("SELECT coldharbor.register_table('public.demo_orders')")
        start = conn.execute("SELECT coalesce(max(order_id), 0) FROM public.demo_orders").fetchone()[0]
        conn.execute("""INSERT INTO public.demo_orders (order_id, customer, amount, status)
                        SELECT %s + g, 'customer-' || (g %% 50), round((random() * 500)::numeric, 2), 'new'
                        FROM generate_series(1, %s) g""", (start, rows))
        touched = random.sample(range(start + 1, start + rows + 1), k=max(1, rows // 10))
        conn.execute("UPDATE public.demo_orders SET status = 'paid', updated_at = now() WHERE order_id = ANY(%s)",
                     (touched[: len(touched) // 2],))
        conn.execute("DELETE FROM public.demo_orders WHERE order_id = ANY(%s)", (touched[len(touched) // 2:],))
        customers = max(1, rows // 10)
        demo_entities(conn, customers)
        dirty = conn.execute("SELECT count(*) FROM coldharbor.change_log WHERE flushed_at IS NULL").fetchone()[0]
    print(f"demo: wrote {rows} orders to {DEMO_TABLE} and {customers} records of entity schema {DEMO_ENTITY} "
          f"(entities.{DEMO_ENTITY}); {dirty} changes are dirty")


def demo_entities(conn, records: int) -> None:
    """The demo entity schema (defined and registered once) and some records written through the
    validating write helper."""
    defined = conn.execute("SELECT EXISTS (SELECT 1 FROM coldharbor.entity_schemas WHERE name = %s)",
                           (DEMO_ENTITY,)).fetchone()[0]
    if not defined:
        conn.execute("SELECT coldharbor.define_entity_schema(%s, %s::jsonb, %s)",
                     (DEMO_ENTITY, json.dumps(DEMO_ENTITY_SCHEMA), DEMO_ENTITY_HOT))
    conn.execute("SELECT coldharbor.register_entity_schema(%s)", (DEMO_ENTITY,))
    for _ in range(records):
        put_demo_customer(conn)


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
    parser = argparse.ArgumentParser(prog="python -m coldharbor.stack", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", choices=["up", "down", "fetch-jars", "demo", "env"])
    args = parser.parse_args(argv)
    if args.command == "up":
        dsn = up()
        print(f"PostgreSQL is up at {pg.describe(dsn)}; settings (DSN with password) in {ENV_FILE}")
    elif args.command == "down":
        server().stop()
    elif args.command == "fetch-jars":
        fetch_jars()
    elif args.command == "demo":
        demo(os.environ.get(settings.PG_DSN_ENV) or _read_env()[settings.PG_DSN_ENV])
    elif args.command == "env":
        sys.stdout.write(ENV_FILE.read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

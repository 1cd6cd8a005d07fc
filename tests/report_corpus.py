"""The report sandbox's corpus (tests/corpus/*_reports.json): hostile reports the allow-list must
refuse, legitimate ones it must pass. Every entry is returned; none is filtered out."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from coldharbor.capture.registry import RegisteredTable

CORPUS = Path(__file__).resolve().parent / "corpus"
ORDERS, CUSTOMERS, ITEMS = "sb_orders", "sb_customers", "sb_order_items"
CANARY_ENV = "COLDHARBOR_CANARY"
# The registry the unit tests check against: the tables the integration tests create.
REGISTERED = (
    RegisteredTable(1, "public", ORDERS, ("order_id",), None, (), ()),
    RegisteredTable(2, "public", CUSTOMERS, ("customer_id",), None, (), ()),
    RegisteredTable(3, "public", ITEMS, ("order_id", "line"), None, (), ()),
)


@dataclass(frozen=True)
class Hostile:
    id: str
    sql: str
    refused: str   # a fragment of the refusal message: the construct, named
    harm: str      # what Spark would do with it


@dataclass(frozen=True)
class Legitimate:
    id: str
    report: str            # report text, possibly with '-- param:' header lines
    postgres: str | None   # the same question in PostgreSQL's SQL


def fill(text: str, marker: str = "/tmp/coldharbor-marker", tables: tuple[str, str, str] = (ORDERS, CUSTOMERS, ITEMS)
         ) -> str:
    for token, value in (("@orders@", tables[0]), ("@customers@", tables[1]), ("@items@", tables[2]),
                         ("@marker@", marker), ("@canary@", CANARY_ENV)):
        text = text.replace(token, value)
    return text


def hostile() -> list[Hostile]:
    entries = json.loads((CORPUS / "hostile_reports.json").read_text())["reports"]
    reports = [Hostile(e["id"], e["sql"], e["refused"], e["harm"]) for e in entries]
    if any(not r.refused for r in reports):
        raise ValueError("every hostile report names the refusal it expects")
    return reports


def legitimate() -> list[Legitimate]:
    entries = json.loads((CORPUS / "legitimate_reports.json").read_text())["reports"]
    return [Legitimate(e["id"], e["report"], e["postgres"]) for e in entries]


def create_tables(conn) -> None:
    """The three registered tables the corpus reads, with deterministic rows."""
    conn.execute(f"""CREATE TABLE {CUSTOMERS} (customer_id int PRIMARY KEY, name text NOT NULL, region text NOT NULL,
                                              signup_date date NOT NULL, vip boolean NOT NULL)""")
    conn.execute(f"""CREATE TABLE {ORDERS} (order_id bigint PRIMARY KEY, customer_id int NOT NULL, status text NOT NULL,
                                           amount numeric(12,2) NOT NULL, created_at timestamptz NOT NULL,
                                           order_date date NOT NULL, tags text, meta jsonb)""")
    conn.execute(f"""CREATE TABLE {ITEMS} (order_id bigint, line int, product text NOT NULL, qty int NOT NULL,
                                          price numeric(10,2) NOT NULL, PRIMARY KEY (order_id, line))""")
    for name in (CUSTOMERS, ORDERS, ITEMS):
        conn.execute("SELECT coldharbor.register_table(%s)", (name,))
    conn.execute(f"""INSERT INTO {CUSTOMERS}
        SELECT g, 'Customer ' || lpad(g::text, 2, '0'), (ARRAY['north', 'south', 'east', 'west'])[g % 4 + 1],
               DATE '2025-01-01' + g * 7, g % 5 = 0
        FROM generate_series(1, 20) g""")
    conn.execute(f"""INSERT INTO {ORDERS}
        SELECT g, g % 20 + 1, (ARRAY['new', 'paid', 'shipped', 'cancelled'])[g % 4 + 1], (g * 37 % 500) + 0.5,
               TIMESTAMPTZ '2026-01-01 00:00:00+00' + g * interval '7 hours',
               ((TIMESTAMPTZ '2026-01-01 00:00:00+00' + g * interval '7 hours') AT TIME ZONE 'UTC')::date,
               CASE g % 3 WHEN 0 THEN NULL WHEN 1 THEN 'gift,express' ELSE 'bulk' END,
               CASE WHEN g % 2 = 0 THEN jsonb_build_object('channel', CASE WHEN g % 4 = 0 THEN 'web' ELSE 'shop' END,
                                                          'discount', (g % 10) * 0.5) END
        FROM generate_series(1, 200) g""")
    conn.execute(f"""INSERT INTO {ITEMS}
        SELECT g, line, 'p' || ((g + line) % 6), (g + line) % 7 + 1, (g * line) % 40 + 1.25
        FROM generate_series(1, 200) g, generate_series(1, 3) line WHERE line <= g % 3 + 1""")


def change_after_export(conn) -> None:
    """Updates, deletes and inserts after the export: the views mix lake rows and hot images."""
    conn.execute(f"UPDATE {ORDERS} SET status = 'paid', amount = amount + 1 WHERE order_id <= 20")
    conn.execute(f"DELETE FROM {ORDERS} WHERE order_id > 190")
    conn.execute(f"""INSERT INTO {ORDERS} VALUES (201, 3, 'new', 999.99, TIMESTAMPTZ '2026-02-27 10:00:00+00',
                                                 DATE '2026-02-27', 'gift', '{{"channel": "web", "discount": 1}}')""")
    conn.execute(f"UPDATE {CUSTOMERS} SET vip = NOT vip WHERE customer_id IN (3, 4)")
    conn.execute(f"INSERT INTO {ITEMS} VALUES (201, 1, 'p9', 2, 10.00)")


def table_counts(conn) -> dict[str, int]:
    return {name: conn.execute(f"SELECT count(*) FROM {name}").fetchone()[0] for name in (ORDERS, CUSTOMERS, ITEMS)}

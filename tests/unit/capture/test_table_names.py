"""How the jobs read a --table name, and how verify writes key values (no PostgreSQL, no Spark)."""

from __future__ import annotations

from datetime import date, datetime, timezone
from decimal import Decimal

import pytest
from coldharbor.capture.table_names import name_candidates, quote_ident
from coldharbor.maintenance.verify_samples import shown
from coldharbor.runtime.errors import ConfigError


@pytest.mark.parametrize("name, meant", [
    ("app.Weird Tbl", [("app", "Weird Tbl")]),
    ('app."Weird Tbl"', [("app", '"Weird Tbl"'), ("app", "Weird Tbl")]),
    ("orders", [("public", "orders")]),
    ("App.Orders", [("App", "Orders"), ("app", "orders")]),
    ('public."a.b"', [("public", "a.b")]),
    ('s."q""s <b>ü"', [("s", '"q""s <b>ü"'), ("s", 'q"s <b>ü')]),
    ("ü.Ä", [("ü", "Ä")]),  # PostgreSQL folds ASCII letters only
])
def test_a_name_means_what_it_says_as_written_and_as_sql_writes_it(name, meant):
    assert name_candidates(name) == meant


@pytest.mark.parametrize("schema, table", [("app", "Weird Tbl"), ("public", ' "q\'s" <b>ü'), ("S", "x.y")])
def test_the_spelling_the_messages_print_names_the_table(schema, table):
    assert (schema, table) in name_candidates(f"{quote_ident(schema)}.{quote_ident(table)}")


@pytest.mark.parametrize("name, message", [
    ("", "the table name is empty"), ("  ", "the table name is empty"),
    ("a.b.c", "table name 'a.b.c' is not of the form schema.table"),
])
def test_a_name_that_names_nothing_says_why(name, message):
    with pytest.raises(ConfigError, match=message):
        name_candidates(name)


@pytest.mark.parametrize("value, text", [
    (None, "NULL"), (42, "42"), ("o'k", "'o''k'"), ("two\nlines", "'two\\nlines'"), (True, "true"),
    (Decimal("12.50"), "12.50"), (date(2026, 1, 18), "2026-01-18"),
    (datetime(2026, 1, 18, 6, 30), "2026-01-18 06:30:00"),
    (datetime(2026, 1, 18, 6, 30, tzinfo=timezone.utc), "2026-01-18 06:30:00+00:00"),
    (bytearray(b"\x00\xff"), "'\\x00ff'"),
])
def test_verify_writes_key_values_as_sql_does(value, text):
    assert shown(value) == text

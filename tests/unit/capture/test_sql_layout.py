"""The two kinds of SQL file (sql/README.md), read without a server: migrations hold no function,
trigger or grant; each object is defined in exactly one definitions file, as CREATE OR REPLACE; the
frozen single-directory layout is the one whose checksums migrate recognises."""

from __future__ import annotations

import re
from collections import Counter

from coldharbor.capture import legacy_layout, migrate

from tests.helpers import single_directory_layout

LAYOUT = migrate.discover()
FUNCTION = re.compile(r"^CREATE (?:OR REPLACE )?FUNCTION coldharbor\.(\w+)\(", re.M)
TRIGGER = re.compile(r"^CREATE (?:OR REPLACE |CONSTRAINT )?TRIGGER (\w+)\s.*?\sON (\S+)", re.M | re.S)


def test_migrations_hold_no_function_trigger_view_or_grant():
    statement = re.compile(r"^\s*(CREATE (OR REPLACE )?(FUNCTION|PROCEDURE|TRIGGER|CONSTRAINT TRIGGER|EVENT TRIGGER|"
                           r"VIEW)|GRANT|REVOKE|ALTER DEFAULT PRIVILEGES|ALTER FUNCTION)\b", re.M | re.I)
    assert LAYOUT.migrations and {m.name: statement.findall(m.sql) for m in LAYOUT.migrations
                                  if statement.search(m.sql)} == {}


def test_each_object_is_defined_in_exactly_one_definitions_file_as_create_or_replace():
    functions = Counter(name for d in LAYOUT.definitions for name in FUNCTION.findall(d.sql))
    triggers = Counter(pair for d in LAYOUT.definitions for pair in TRIGGER.findall(d.sql))
    # (The capture triggers of the two record tables are made by one loop in 060_entities.sql, which
    # this count does not see; the migrate test's schema comparison does.)
    assert len(functions) > 80 and len(triggers) >= 5
    assert {name: n for name, n in (functions + triggers).items() if n > 1} == {}
    for d in LAYOUT.definitions:
        assert not re.search(r"^CREATE FUNCTION|^CREATE TRIGGER|^CREATE CONSTRAINT TRIGGER", d.sql, re.M), d.name
        # A constraint trigger (no OR REPLACE) is made again only when pg_get_triggerdef differs.
        for name, table in re.findall(r"'CREATE CONSTRAINT TRIGGER (\w+) .*? ON (\S+) ", d.sql):
            assert f"tgname = '{name}'" in d.sql and f"DROP TRIGGER IF EXISTS {name} ON {table};" in d.sql, name


def test_the_frozen_single_directory_layout_is_the_one_migrate_recognises():
    frozen = single_directory_layout()
    assert {m.name: m.checksum for m in frozen.migrations} == legacy_layout.SINGLE_DIRECTORY_LAYOUT
    # every migration of today's layout numbered like one of that layout carries its name
    assert {m.name for m in LAYOUT.migrations if m.name[:3] <= "028"} <= set(legacy_layout.SINGLE_DIRECTORY_LAYOUT)


def test_every_definitions_file_as_it_is_now_is_listed_as_shipped():
    """sql/definitions/shipped.sha256 is append-only: a changed definitions file adds its line (the
    old lines stay, so a database those versions migrated is known as an older one, not a newer)."""
    assert LAYOUT.definitions and {(d.name, d.checksum) for d in LAYOUT.definitions} <= LAYOUT.shipped

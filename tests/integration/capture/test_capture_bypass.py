"""Writes routed around capture (found by an outside review): an application that owns a registered
table adds an inheritance child and an INSTEAD rule, and its INSERTs land in the child, uncaptured.
Capture cannot see them, so every job that reads the table refuses it by name instead of serving or
exporting a table that silently differs from PostgreSQL."""

from __future__ import annotations

import pytest
from coldharbor.capture import registry
from coldharbor.runtime import pg
from coldharbor.runtime.errors import PrivilegeError

from tests.helpers import export, serve_report


@pytest.mark.parametrize("bypass", ["child-and-rule", "rule-only"])
def test_a_registered_table_with_an_inheritance_child_or_a_rule_is_refused_by_name(
        spark, pg_dsn, pg_conn, app_logins, lake_root, monkeypatch, caplog, bypass):
    name, dsn = app_logins()
    with pg.connect(dsn) as app:
        app.execute(f"CREATE TABLE {name}.par (id int PRIMARY KEY, v text)")
        app.execute("SELECT coldharbor.register_table(%s)", (f"{name}.par",))
        app.execute(f"CREATE TABLE {name}.other (id int, v text)")
        if bypass == "child-and-rule":
            app.execute(f"CREATE TABLE {name}.kid () INHERITS ({name}.par)")
            app.execute(f"CREATE RULE r AS ON INSERT TO {name}.par DO INSTEAD INSERT INTO {name}.kid VALUES (NEW.*)")
        else:
            app.execute(f"CREATE RULE r AS ON INSERT TO {name}.par DO INSTEAD INSERT INTO {name}.other VALUES (NEW.*)")
        app.execute(f"INSERT INTO {name}.par VALUES (1, 'never captured')")
    expected = "has inheritance children" if bypass == "child-and-rule" else "has a rule"

    with pytest.raises(PrivilegeError, match=expected):
        export(spark, pg_dsn, f"{name}.par", lake_root)
    monkeypatch.setenv("COLDHARBOR_PG_DSN", pg_dsn)
    assert serve_report(monkeypatch, pg_dsn, lake_root, "--sql", f"SELECT count(*) AS n FROM {name}.par",
                        "--target", "adhoc_bypass") == 2
    assert expected in caplog.text
    [table] = registry.load(pg_conn, f"{name}.par")
    assert pg_conn.execute("SELECT count(*) FROM coldharbor.export_batches WHERE table_id = %s",
                           (table.table_id,)).fetchone()[0] == 0

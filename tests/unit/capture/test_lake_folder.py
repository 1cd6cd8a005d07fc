"""A table's lake folder is <root>/<schema>/<table> only when both names are safe folder names:
the allow-list, never a list of what is dangerous."""

from __future__ import annotations

import pytest
from coldharbor.capture.registry import RegisteredTable
from coldharbor.runtime.errors import ConfigError


def table(schema: str, name: str, lake_location: str | None = None) -> RegisteredTable:
    return RegisteredTable(1, schema, name, ("id",), lake_location, (), ())


@pytest.mark.parametrize("schema, name", [
    ("public", "orders"), ("public", "dot.ted"), ("we\"ird sch", ' "q\'s" <b>ü'), ("public", "par_1 1; x"),
    ("Shop", "CaseT"), ("public", "tick`name"), ("public", "bestillinger_æøå_2026"),
])
def test_names_a_user_types_are_their_own_folders(schema, name):
    assert table(schema, name).lake_path("/lake") == f"/lake/{schema}/{name}"


@pytest.mark.parametrize("schema, name, shown", [
    ("evil", "../../escape", "starts with '.'"), ("evil", "../public/victim", "starts with '.'"),
    ("..", "orders", "starts with '.'"), ("public", ".hidden", "starts with '.'"), ("public", "a/b", "holds '/'"),
    ("public", "a\\b", "holds '\\\\'"), ("public", "p%41q", "holds '%'"), ("public", "h#y?z", "holds '#'"),
    ("public", "c:d", "holds ':'"), ("public", "glob*", "holds '*'"), ("public", "new\nline", "holds '\\n'"),
    ("public", "snow☃", "holds '☃'"), ("public", "", "is empty"), ("public", "orders@v3", "holds '@'"),
    ("public", "a|b", "holds '|'"), ("public", "a^b", "holds '^'"), ("_coldharbor", "registry.json", "own folder"),
])
def test_any_other_name_is_refused_in_one_line_naming_it(schema, name, shown):
    with pytest.raises(ConfigError) as refused:
        table(schema, name).lake_path("/lake")
    message = str(refused.value)
    assert "has no lake folder of its own name" in message and shown in message and "\n" not in message
    assert "p_lake_location" in message


def test_an_administrators_lake_location_is_used_as_given():
    assert table("evil", "../x", "/lake/chosen").lake_path("/lake") == "/lake/chosen"

"""Fixtures of the integration tests."""

from __future__ import annotations

import uuid

import pytest

from tests.entities import HOT, SCHEMA, define


@pytest.fixture()
def entity(pg_conn) -> str:
    """A defined and registered entity schema of its own for each test."""
    name = f"e_{uuid.uuid4().hex[:10]}"
    define(pg_conn, name, SCHEMA, HOT)
    pg_conn.execute("SELECT coldharbor.register_entity_schema(%s)", (name,))
    return name

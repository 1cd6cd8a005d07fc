"""Fixtures of the consistency suite."""

from __future__ import annotations

import pytest


@pytest.fixture()
def connect_spark(on_connect):
    """This process's own session on the run's Spark Connect server, for the harness's steps and
    checks (the reports it serves open and release sessions of their own)."""
    from coldharbor.runtime.spark import connect_session

    session = connect_session(on_connect, "coldharbor-consistency")
    yield session
    session.stop()

"""The one-table jobs (verify, resync, the change feed) refuse a DSN Spark's JDBC driver cannot use
before anything starts: no PostgreSQL session, no JVM (found by the review of their run())."""

from __future__ import annotations

import pytest
from coldharbor.maintenance import resync, verify
from coldharbor.runtime import pg, settings
from coldharbor.serve import changes


@pytest.mark.parametrize("main, args", [
    (verify.main, ["--table", "public.t"]),
    (resync.main, ["--table", "public.t"]),
    (changes.main, ["--table", "public.t", "--from", "0", "--to", "now", "--target", "changes_t"]),
])
def test_a_socket_dsn_is_refused_before_postgres_or_spark(main, args, monkeypatch, tmp_path, caplog):
    monkeypatch.setenv(settings.PG_DSN_ENV, "host=/var/run/postgresql dbname=app user=u")

    def never(*_args, **_kwargs):
        raise AssertionError("nothing may start for a DSN the jobs cannot use")

    monkeypatch.setattr(pg, "connect", never)
    monkeypatch.setattr("coldharbor.runtime.spark.get_session", never)
    assert main([*args, "--lake-root", str(tmp_path)]) == 2
    assert "Spark's JDBC needs TCP" in caplog.text

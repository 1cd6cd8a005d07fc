"""As-of reports need PostgreSQL's commit timestamps: against a real server started without
track_commit_timestamp, an as-of report is refused in one line naming the setting and how to turn
it on (exit 2, nothing written), while a report of the present still runs."""

from __future__ import annotations

from datetime import datetime, timezone

from coldharbor.runtime import pg

from tests.helpers import export, report_run, serve_report, server_with_orders


def test_as_of_is_refused_where_postgres_does_not_track_commit_timestamps(spark, tmp_path, monkeypatch, caplog):
    lake_root = str(tmp_path / "lake")
    with server_with_orders(tmp_path / "server", rows=5, track_commit_timestamp="off") as (_, dsn), \
            pg.connect(dsn) as conn:
        assert conn.execute("SHOW track_commit_timestamp").fetchone()[0] == "off"
        export(spark, dsn, "public.orders", lake_root)
        now = datetime.now(timezone.utc).isoformat()

        caplog.clear()
        assert serve_report(monkeypatch, dsn, lake_root, "--sql", "SELECT * FROM orders", "--target", "adhoc_then",
                            "--as-of", now, "--run-id", "as-of-untracked") == 2
        [error] = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
        assert "track_commit_timestamp = on" in error and "-c track_commit_timestamp=on" in error
        assert "\n" not in error and "Traceback" not in caplog.text
        assert conn.execute("SELECT to_regclass('reports.adhoc_then')").fetchone()[0] is None
        assert report_run(conn, "as-of-untracked")["state"] == "failed"

        assert serve_report(monkeypatch, dsn, lake_root, "--sql", "SELECT * FROM orders", "--target",
                            "adhoc_now") == 0
        assert conn.execute("SELECT count(*) FROM reports.adhoc_now").fetchone()[0] == 5

"""Health samples (sql/migrations/023) as the export job writes them, for the health page: one per table it
handled, and a failed one for each table of a run that failed in a way no check foresaw."""

from __future__ import annotations

from coldharbor.export import export_job as export_job


def samples(conn, name: str) -> list[tuple]:
    return conn.execute("SELECT s.export_status, s.dirty_rows FROM coldharbor.health_samples s "
                        "JOIN coldharbor.tables t USING (table_id) WHERE t.table_name = %s ORDER BY s.sampled_at",
                        (name,)).fetchall()


def test_an_export_that_fails_unforeseen_records_its_tables_as_failing(pg_dsn, pg_conn, table_name, lake_root,
                                                                        monkeypatch):
    pg_conn.execute(f"CREATE TABLE {table_name} (id int PRIMARY KEY)")
    pg_conn.execute("SELECT coldharbor.register_table(%s)", (table_name,))
    pg_conn.execute(f"INSERT INTO {table_name} SELECT generate_series(1, 3)")

    def lost(*args, **kwargs):
        raise RuntimeError("the Spark driver went away")

    monkeypatch.setenv("COLDHARBOR_PG_DSN", pg_dsn)
    monkeypatch.setattr(export_job.spark_sessions, "get_session", lambda name: None)
    monkeypatch.setattr(export_job, "export_tables", lost)
    assert export_job.main(["--table", f"public.{table_name}", "--lake-root", lake_root]) == 1
    assert samples(pg_conn, table_name) == [("failed", 3)]

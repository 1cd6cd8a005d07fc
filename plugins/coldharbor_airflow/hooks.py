"""The registry and its figures, read from the hot tier through the `coldharbor_pg` connection."""

from __future__ import annotations

from typing import Any

from airflow.sdk import BaseHook

DEFAULT_CONN_ID = "coldharbor_pg"


class ColdharborHook(BaseHook):
    """psycopg 3 connections to the hot tier built from an Airflow connection (Postgres type)."""

    conn_name_attr = "coldharbor_conn_id"
    default_conn_name = DEFAULT_CONN_ID
    conn_type = "postgres"
    hook_name = "Coldharbor (PostgreSQL hot tier)"

    def __init__(self, coldharbor_conn_id: str = DEFAULT_CONN_ID) -> None:
        super().__init__()
        self.coldharbor_conn_id = coldharbor_conn_id

    def dsn(self) -> str:
        """A libpq key=value string; it carries the password, so it goes to processes through the
        environment, never onto a command line or into a log."""
        from psycopg.conninfo import make_conninfo

        conn = self.get_connection(self.coldharbor_conn_id)
        params: dict[str, Any] = {"host": conn.host or "127.0.0.1", "port": conn.port or 5432,
                                  "dbname": conn.schema or "postgres", "user": conn.login or "postgres",
                                  "application_name": "coldharbor-airflow"}
        if conn.password:
            params["password"] = conn.password
        return make_conninfo(**params)

    def connect(self):
        import psycopg

        return psycopg.connect(self.dsn(), autocommit=True, connect_timeout=10)

    def tables_needing_export(self) -> list[str]:
        """schema.table of every registered table with a dirty change or an unfinished batch: an
        index probe per table, so a clean minute costs no Spark start."""
        with self.connect() as conn:
            rows = conn.execute("""
                SELECT t.schema_name || '.' || t.table_name
                  FROM coldharbor.tables t
                 WHERE EXISTS (SELECT 1 FROM coldharbor.change_log c
                                WHERE c.table_id = t.table_id AND c.flushed_at IS NULL)
                    OR EXISTS (SELECT 1 FROM coldharbor.export_batches b
                                WHERE b.table_id = t.table_id AND b.state = 'pending')
                 ORDER BY t.table_id""").fetchall()
        return [r[0] for r in rows]

    def tables_needing_compaction(self, min_new_batches: int) -> list[str]:
        """Tables with at least `min_new_batches` exports since their last successful compaction (a
        cheap proxy for "enough new small files"; the job checks the real file counts)."""
        with self.connect() as conn:
            rows = conn.execute("""
                SELECT t.schema_name || '.' || t.table_name
                  FROM coldharbor.tables t
                 WHERE (SELECT count(*) FROM coldharbor.export_batches b
                         WHERE b.table_id = t.table_id AND b.state = 'flushed'
                           AND b.finished_at > coalesce((SELECT max(m.finished_at) FROM coldharbor.maintenance_runs m
                                                          WHERE m.table_id = t.table_id AND m.kind = 'compact'
                                                            AND m.state = 'succeeded'), '-infinity')) >= %s
                 ORDER BY t.table_id""", (min_new_batches,)).fetchall()
        return [r[0] for r in rows]

"""The registry and its figures, read from the hot tier through the `coldharbor_pg` connection."""

from __future__ import annotations

from typing import Any

from airflow.sdk import BaseHook
from airflow.sdk.exceptions import AirflowException, AirflowNotFoundException

DEFAULT_CONN_ID = "coldharbor_pg"


# Since when a table's lake has lagged PostgreSQL (`l.since`), from `d.oldest` (its oldest
# unexported change): that change, or the request of a base still pending (an initial load, or a new
# base after DDL: the lake lacks the whole table meanwhile, and a quiet table has no change to show
# it), whichever is older (`p.pending_since`).
LAGGING_SINCE = """
                  CROSS JOIN LATERAL (SELECT CASE WHEN t.load_state = 'pending' THEN
                                          coalesce((SELECT min(r.requested_at) FROM coldharbor.rebases r
                                                     WHERE r.table_id = t.table_id AND r.settled_at IS NULL),
                                                   t.registered_at) END AS pending_since) p
                  CROSS JOIN LATERAL (SELECT least(d.oldest, p.pending_since) AS since) l"""

# The health page's row of each table: its backlog and lag, its last export (and last export of
# changes, not a base), compaction, cleanup and verify, its load state, its landing backlog
# (lake-first), and whether the table its name now means is not the one registered.
TABLE_HEALTH = f"""
            SELECT t.table_id, t.schema_name || '.' || t.table_name AS name, t.schema_name, t.table_name,
                   t.lake_location,
                   d.dirty_rows, extract(epoch FROM now() - l.since) AS freshness_lag_s,
                   coalesce(l.since = p.pending_since, false) AS base_lagging,
                   extract(epoch FROM t.freshness) AS freshness_promise_s,
                   e.batch_id AS last_batch, e.finished_at AS last_export_at, e.lake_version AS last_export_version,
                   e.row_count AS last_export_rows,
                   x.row_count AS last_change_export_rows, x.finished_at AS last_change_export_at,
                   extract(epoch FROM x.finished_at - x.started_at) AS last_change_export_duration_s,
                   c.finished_at AS last_compaction_at, c.state AS last_compaction_state,
                   c.detail AS last_compaction_detail,
                   k.finished_at AS last_cleanup_at, k.state AS last_cleanup_state,
                   t.load_state, t.loaded_at, t.base_rows, t.base_at, t.rebase_reason,
                   t.mode, coldharbor.landing_rows(t.table_id) AS landing_rows,
                   t.source_kind = 'table' AND r.rel IS NOT NULL
                       AND (t.dropped_at IS NOT NULL OR t.relid <> r.rel) AS replaced,
                   v.finished_at AS last_verify_at, v.state AS last_verify_state,
                   v.detail ->> 'result' AS last_verify_result
              FROM coldharbor.tables t
              CROSS JOIN LATERAL (SELECT to_regclass(quote_ident(t.schema_name) || '.'
                                                     || quote_ident(t.table_name))::oid AS rel) r
              LEFT JOIN LATERAL (SELECT count(*) AS dirty_rows, min(created_at) AS oldest
                                   FROM coldharbor.change_log
                                  WHERE table_id = t.table_id AND flushed_at IS NULL) d ON true
              {LAGGING_SINCE}
              LEFT JOIN LATERAL (SELECT batch_id, finished_at, lake_version, row_count
                                   FROM coldharbor.export_batches
                                  WHERE table_id = t.table_id AND state = 'flushed'
                                  ORDER BY batch_id DESC LIMIT 1) e ON true
              LEFT JOIN LATERAL (SELECT started_at, finished_at, row_count  -- not a base (load, resync)
                                   FROM coldharbor.export_batches
                                  WHERE table_id = t.table_id AND state = 'flushed' AND kind = 'changes'
                                  ORDER BY batch_id DESC LIMIT 1) x ON true
              LEFT JOIN LATERAL (SELECT finished_at, state, detail FROM coldharbor.maintenance_runs
                                  WHERE table_id = t.table_id AND kind = 'compact'
                                  ORDER BY started_at DESC LIMIT 1) c ON true
              LEFT JOIN LATERAL (SELECT finished_at, state FROM coldharbor.maintenance_runs
                                  WHERE table_id = t.table_id AND kind = 'cleanup'
                                  ORDER BY started_at DESC LIMIT 1) k ON true
              LEFT JOIN LATERAL (SELECT finished_at, state, detail FROM coldharbor.maintenance_runs
                                  WHERE table_id = t.table_id AND kind = 'verify'
                                  ORDER BY started_at DESC LIMIT 1) v ON true
             ORDER BY t.table_id"""

# The last report runs. An as-of a run was refused for may lie beyond what Python's datetime holds
# (year 10000): shown as none.
RECENT_RUNS = """SELECT run_id, report, target, mode, state, degraded,
                 CASE WHEN as_of BETWEEN '0001-01-02' AND '9999-12-30' THEN as_of END AS as_of,
                 row_count,
                 started_at, finished_at, error
            FROM coldharbor.report_runs ORDER BY started_at DESC LIMIT %s"""

# The health samples of the last 24 hours; a clock stepped back may have left samples in the
# future: not shown.
RECENT_SAMPLES = """SELECT s.table_id, s.sampled_at, s.export_status, s.export_rows, s.export_s,
                     s.dirty_rows, s.lag_s
                FROM coldharbor.health_samples s JOIN coldharbor.tables t USING (table_id)
               WHERE s.sampled_at > now() - interval '24 hours' AND s.sampled_at <= now()
               ORDER BY s.table_id, s.sampled_at"""


def _dicts(conn, query: str, params: tuple = ()) -> list[dict[str, Any]]:
    """The rows of a query, each a dict by column name."""
    cur = conn.execute(query, params)
    names = [d.name for d in cur.description]
    return [dict(zip(names, row)) for row in cur.fetchall()]


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
        """A libpq key=value string: the connection's address and credentials, and the libpq
        settings of its extra that the jobs pass on to psycopg and JDBC alike (sslmode, sslrootcert,
        options, application_name, connect_timeout). It carries the password, so it reaches a job
        through a file or a Kubernetes secret, never a command line or a log."""
        from psycopg.conninfo import make_conninfo

        try:
            conn = self.get_connection(self.coldharbor_conn_id)
        except AirflowNotFoundException:
            raise AirflowException(
                f"the PostgreSQL connection {self.coldharbor_conn_id!r} is not defined: create it (Admin > "
                f"Connections, type Postgres, or AIRFLOW_CONN_{self.coldharbor_conn_id.upper()}) pointing at the "
                "hot tier") from None
        params: dict[str, Any] = {"host": conn.host or "127.0.0.1", "port": conn.port or 5432,
                                  "dbname": conn.schema or "postgres", "user": conn.login or "postgres",
                                  **self._libpq_extras(conn.extra_dejson)}
        if conn.password:
            params["password"] = conn.password
        return make_conninfo(**params)

    def _libpq_extras(self, extra: dict[str, Any]) -> dict[str, str]:
        """The extra's libpq settings Coldharbor passes on; another libpq keyword is refused, since
        the JDBC side could not honour it (Airflow's own extras, such as `cursor`, are ignored)."""
        import psycopg

        from coldharbor_airflow.paths import import_jobs_package

        import_jobs_package()
        from coldharbor.runtime.pg import JDBC_PROPERTIES

        libpq_keywords = {d.keyword.decode() for d in psycopg.pq.Conninfo.get_defaults()}
        refused = sorted(k for k in extra if k in libpq_keywords and k not in JDBC_PROPERTIES)
        if refused:
            raise AirflowException(
                f"the extra {refused[0]!r} of connection {self.coldharbor_conn_id!r} is not supported: the jobs "
                f"pass only {', '.join(JDBC_PROPERTIES)} to both psycopg and Spark's JDBC driver")
        return {k: str(v) for k, v in extra.items() if k in JDBC_PROPERTIES}

    def connect(self):
        import psycopg
        from psycopg.conninfo import conninfo_to_dict

        dsn = self.dsn()
        params = conninfo_to_dict(dsn)
        try:
            return psycopg.connect(dsn, autocommit=True, connect_timeout=params.get("connect_timeout") or 10,
                                   application_name=params.get("application_name") or "coldharbor-airflow")
        except psycopg.OperationalError as exc:
            first_line = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            raise AirflowException(
                f"PostgreSQL at {params.get('host')}:{params.get('port')}/{params.get('dbname')} (connection "
                f"{self.coldharbor_conn_id!r}) is unreachable: {first_line}") from None

    def tables_needing_export(self) -> list[str]:
        """schema.table of every registered table with an initial load to write, a dirty change or an
        unfinished batch: an index probe per table, so a clean minute costs no Spark start."""
        with self.connect() as conn:
            rows = conn.execute("""
                SELECT t.schema_name || '.' || t.table_name
                  FROM coldharbor.tables t
                 WHERE t.load_state = 'pending'
                    OR EXISTS (SELECT 1 FROM coldharbor.change_log c
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

    def tables_needing_verify(self, every_days: float) -> list[str]:
        """Loaded tables whose last verify started more than `every_days` ago (or never ran)."""
        with self.connect() as conn:
            rows = conn.execute("""
                SELECT t.schema_name || '.' || t.table_name
                  FROM coldharbor.tables t
                 WHERE t.load_state = 'loaded'
                   AND coalesce((SELECT max(m.started_at) FROM coldharbor.maintenance_runs m
                                  WHERE m.table_id = t.table_id AND m.kind = 'verify'), '-infinity')
                       < now() - make_interval(secs => %s)
                 ORDER BY t.table_id""", (every_days * 86400,)).fetchall()
        return [r[0] for r in rows]

    def broken_promises(self) -> list[dict[str, Any]]:
        """Every registered table whose lake is further behind than its freshness promise
        (`register_table(..., p_freshness => ...)`): name, lag_s, promise_s, oldest (the oldest
        unexported change's transaction start, or since when its base is pending: `LAGGING_SINCE`),
        pending (whether that base is what the lake lacks), most lagging first."""
        with self.connect() as conn:
            return _dicts(conn, f"""
                SELECT t.schema_name || '.' || t.table_name AS name, extract(epoch FROM now() - l.since) AS lag_s,
                       extract(epoch FROM t.freshness) AS promise_s, l.since AS oldest,
                       l.since IS NOT DISTINCT FROM p.pending_since AS pending
                  FROM coldharbor.tables t
                  CROSS JOIN LATERAL (SELECT min(created_at) AS oldest FROM coldharbor.change_log
                                       WHERE table_id = t.table_id AND flushed_at IS NULL) d
                  {LAGGING_SINCE}
                 WHERE extract(epoch FROM now() - l.since) > extract(epoch FROM t.freshness)  -- as the page
                 ORDER BY l.since, t.table_id""")

    def health(self, recent_runs: int = 10, with_samples: bool = True) -> dict[str, Any]:
        """The figures of the health page, per table (with its health samples of the last 24 hours)
        and for recent report runs, from PostgreSQL."""
        samples: dict[int, list[dict[str, Any]]] = {}
        with self.connect() as conn:
            tables = _dicts(conn, TABLE_HEALTH)
            runs = _dicts(conn, RECENT_RUNS, (recent_runs,))
            for sample in _dicts(conn, RECENT_SAMPLES) if with_samples else []:
                samples.setdefault(sample["table_id"], []).append(sample)
            now = conn.execute("SELECT now()").fetchone()[0]
        return {"tables": tables, "report_runs": runs, "samples": samples, "now": now}

    def report_figures(self) -> list[dict[str, Any]]:
        """Per report with a run on record: runs and failed runs started in the last 24 hours, and
        the state and duration of its last finished run (the metrics' report gauges)."""
        with self.connect() as conn:
            return _dicts(conn, """
                SELECT r.report, r.runs_24h, r.failed_24h, l.state AS last_state, l.duration_s AS last_duration_s
                  FROM (SELECT report, count(*) FILTER (WHERE started_at > now() - interval '24 hours') AS runs_24h,
                               count(*) FILTER (WHERE started_at > now() - interval '24 hours'
                                                  AND state = 'failed') AS failed_24h
                          FROM coldharbor.report_runs GROUP BY report) r
                  LEFT JOIN LATERAL (SELECT state, extract(epoch FROM finished_at - started_at) AS duration_s
                                       FROM coldharbor.report_runs
                                      WHERE report = r.report AND finished_at IS NOT NULL
                                      ORDER BY started_at DESC LIMIT 1) l ON true
                 ORDER BY r.report""")

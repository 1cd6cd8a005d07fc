"""What cleanup removes from PostgreSQL once it has served: a table's change_log rows flushed
before the retention and its batches finished before it (the newest flushed batch stays: it
proves the table has reached the lake), finished report runs past their retention, health
samples older than the page shows, and the report staging tables runs that died left behind.
Each says how many (would) go; with dry_run nothing is removed."""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import TYPE_CHECKING

import psycopg
from psycopg import sql

from coldharbor.capture.registry import RegisteredTable

if TYPE_CHECKING:
    from coldharbor.maintenance.cleanup import CleanupConfig

log = logging.getLogger(__name__)


def prune_change_log(conn: psycopg.Connection, table: RegisteredTable, config: CleanupConfig) -> tuple[int, int]:
    """change_log rows flushed before the retention, and the batches finished before it."""
    cutoff = sql.SQL("now() - {}::interval").format(sql.Literal(config.retention))
    verb = sql.SQL("SELECT count(*)") if config.dry_run else sql.SQL("WITH gone AS (DELETE")
    tail = sql.SQL("") if config.dry_run else sql.SQL(" RETURNING 1) SELECT count(*) FROM gone")
    with conn.transaction():
        changes = conn.execute(sql.SQL("{} FROM coldharbor.change_log WHERE table_id = {} AND flushed_at < {}{}")
                               .format(verb, sql.Literal(table.table_id), cutoff, tail)).fetchone()[0]
        batches = conn.execute(sql.SQL("""{} FROM coldharbor.export_batches b
             WHERE b.table_id = {table_id} AND b.state <> 'pending' AND b.finished_at < {cutoff}
               AND b.batch_id <> coalesce((SELECT max(batch_id) FROM coldharbor.export_batches
                                            WHERE table_id = {table_id} AND state = 'flushed'), -1){}""").format(
            verb, tail, table_id=sql.Literal(table.table_id), cutoff=cutoff)).fetchone()[0]
    return changes, batches


def expire_report_runs(conn: psycopg.Connection, config: CleanupConfig) -> int:
    query = "FROM coldharbor.report_runs WHERE state <> 'running' AND finished_at < now() - %s::interval"
    if config.dry_run:
        return conn.execute("SELECT count(*) " + query, (config.report_runs_retention,)).fetchone()[0]
    return conn.execute("DELETE " + query, (config.report_runs_retention,)).rowcount


HEALTH_SAMPLES_KEPT = timedelta(days=2)  # the page charts the last 24 hours


def prune_health_samples(conn: psycopg.Connection, dry_run: bool) -> int:
    """Health samples (the page's charts) older than HEALTH_SAMPLES_KEPT; how many (would) go."""
    query = "FROM coldharbor.health_samples WHERE sampled_at < now() - %s::interval"
    if dry_run:
        return conn.execute("SELECT count(*) " + query, (HEALTH_SAMPLES_KEPT,)).fetchone()[0]
    return conn.execute("DELETE " + query, (HEALTH_SAMPLES_KEPT,)).rowcount


def drop_stale_staging_tables(conn: psycopg.Connection, dry_run: bool) -> list[str]:
    """reports._ch_stage_* tables of serve runs that died before their swap (none may be running): the
    job's role created them, and may drop only those."""
    running = conn.execute("SELECT count(*) FROM coldharbor.report_runs WHERE state = 'running' "
                           "AND sink = 'postgres'").fetchone()[0]
    if running:
        log.info("report staging tables left alone: %s PostgreSQL report run(s) in progress", running)
        return []
    names = [r[0] for r in conn.execute("SELECT tablename FROM pg_catalog.pg_tables WHERE schemaname = 'reports' "
                                        "AND tablename LIKE '\\_ch\\_stage\\_%' AND tableowner = current_user"
                                        ).fetchall()]
    if not dry_run:
        for name in names:
            conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(sql.Identifier("reports", name)))
    return names

-- Read path: the schema report tables are written to, and the log of every report run.
CREATE SCHEMA IF NOT EXISTS reports;

CREATE TABLE coldharbor.report_runs (
    run_id          text        PRIMARY KEY,
    report          text        NOT NULL,          -- report file name, or 'adhoc'
    target          text,                          -- reports.<name> or the Delta report path
    sink            text        CHECK (sink IN ('postgres', 'delta')),
    mode            text        NOT NULL CHECK (mode IN ('strict', 'best_effort')),
    as_of           timestamptz,                   -- NULL: now
    state           text        NOT NULL DEFAULT 'running'
                                CHECK (state IN ('running', 'succeeded', 'failed')),
    degraded        boolean     NOT NULL DEFAULT false,
    missing_tier    text        CHECK (missing_tier IN ('postgres', 'lake')),
    stale_since     timestamptz,                   -- degraded: the answer may miss changes after this
    detail          text,                          -- degraded: what was served instead, in words
    pg_snapshot_at  timestamptz,                   -- when the PostgreSQL snapshot was taken
    lake_versions   jsonb,                         -- {"public.orders": 12, ...}: the pinned versions
    dirty_rows      jsonb,                         -- {"public.orders": 40, ...}: dirty keys served hot
    row_count       bigint,
    error           text,
    started_at      timestamptz NOT NULL DEFAULT now(),
    finished_at     timestamptz
);

CREATE INDEX report_runs_recent ON coldharbor.report_runs (report, started_at DESC);

-- The read path finds the changes flushed after its pinned lake version through their batches:
-- a batch keeps its change ids after the mark, until cleanup expires them.
CREATE INDEX export_batches_flushed ON coldharbor.export_batches (table_id, lake_version)
    WHERE state = 'flushed';

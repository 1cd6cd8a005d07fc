-- Maintenance: the log of compaction/cleanup/purge runs, and hot-tier eviction.

-- One row per job run and table: what the health page shows as "last compaction/cleanup".
CREATE TABLE coldharbor.maintenance_runs (
    run_id        text        NOT NULL,
    table_id      integer     NOT NULL,
    kind          text        NOT NULL CHECK (kind IN ('compact', 'cleanup', 'purge')),
    state         text        NOT NULL DEFAULT 'running'
                              CHECK (state IN ('running', 'succeeded', 'failed', 'skipped')),
    lake_version  bigint,                      -- the Delta version the run committed, if any
    detail        jsonb,                       -- the run's figures (files, bytes, rows, markers, ...)
    error         text,
    started_at    timestamptz NOT NULL DEFAULT now(),
    finished_at   timestamptz,
    PRIMARY KEY (run_id, table_id, kind)
);

CREATE INDEX maintenance_runs_recent ON coldharbor.maintenance_runs (table_id, kind, started_at DESC);

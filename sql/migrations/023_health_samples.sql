-- Health samples (issue 25, part 1): each export writes one row per table it handled, so the
-- health page can chart a table's freshness lag, dirty backlog and export figures over the last
-- 24 hours and tell a table whose last export failed. Cleanup prunes rows older than two days.
-- A cycle that exports nothing of a table (nothing dirty) writes no row for it: no lag then.
CREATE TABLE coldharbor.health_samples (
    table_id      integer          NOT NULL,
    sampled_at    timestamptz      NOT NULL DEFAULT now(),
    export_status text             NOT NULL,   -- exported | loaded | clean | skipped | failed
    export_rows   bigint           NOT NULL DEFAULT 0,
    export_s      double precision NOT NULL DEFAULT 0,
    dirty_rows    bigint           NOT NULL,   -- after the export
    lag_s         double precision NOT NULL    -- age of the oldest change still dirty after it (0: none)
);

CREATE INDEX health_samples_by_table ON coldharbor.health_samples (table_id, sampled_at);

-- What compaction kept of each table's history (issue 26): compaction drops the versions older than
-- its history window (all but the newest older one per key), so as-of reports for instants before
-- its cutoff are no longer exact, whatever window they are asked with later. Compaction records its
-- cutoff here before it commits (the newest cutoff stands), and an as-of report or change feed
-- point before it is refused, naming it (`as_of.refuse_table_as_of`). Without this, raising
-- COLDHARBOR_HISTORY_WINDOW_HOURS above what an earlier compaction kept answered that gap wrongly.
-- Written by the pipeline (compaction), read by reports.
CREATE TABLE coldharbor.history_kept (
    table_id    integer     PRIMARY KEY,
    kept_from   timestamptz NOT NULL,              -- versions older than this may be gone from the lake
    recorded_at timestamptz NOT NULL DEFAULT now()
);

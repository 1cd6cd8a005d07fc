-- Initial load, resync and verify (invariant 12: a table is exact from its registration).
--
-- Registration captures changes from then on; the rows a table already held reach the lake through
-- an initial load: one snapshot read of the whole table, taken after capture was committed, written
-- as the table's base commit with change sequence 0 (before every captured change). Until it lands,
-- reports serve the table from PostgreSQL alone. A resync writes a new base the same way, replacing
-- the lake's current state in one commit (earlier versions stay readable until VACUUM).

-- Tables registered before this migration keep 'loaded' (run jobs/resync.py for one that held rows
-- when it was registered); every registration from now on starts 'pending'. The export settles an
-- empty table's load without Spark, and an entity schema's (its registration logs every record).
ALTER TABLE coldharbor.tables
    ADD COLUMN load_state     text NOT NULL DEFAULT 'loaded' CHECK (load_state IN ('pending', 'loaded')),
    ADD COLUMN loaded_at      timestamptz,   -- when the initial load landed
    ADD COLUMN loaded_version bigint,        -- Delta version of the initial load (NULL: the table was empty)
    ADD COLUMN base_version   bigint,        -- Delta version of the newest base commit (initial load or resync)
    ADD COLUMN base_at        timestamptz,   -- that base's snapshot time: as-of reports start there
    ADD COLUMN base_rows      bigint;

ALTER TABLE coldharbor.tables ALTER COLUMN load_state SET DEFAULT 'pending';

-- A base commit is an export batch of its own kind: its intent is recorded before the Delta commit,
-- so a run that dies between the commit and recording the base is finished by the next run.
ALTER TABLE coldharbor.export_batches
    ADD COLUMN kind text NOT NULL DEFAULT 'changes' CHECK (kind IN ('changes', 'load', 'resync')),
    ADD COLUMN snapshot_at timestamptz;      -- load/resync: the snapshot the base was read in


-- Verify and resync runs are logged with the other maintenance runs (the health page's "last verify").
ALTER TABLE coldharbor.maintenance_runs DROP CONSTRAINT maintenance_runs_kind_check;

ALTER TABLE coldharbor.maintenance_runs
    ADD CONSTRAINT maintenance_runs_kind_check CHECK (kind IN ('compact', 'cleanup', 'purge', 'verify', 'resync'));

-- Reports record the tables they served from PostgreSQL alone because their initial load had not landed.
ALTER TABLE coldharbor.report_runs ADD COLUMN served_from_postgres text[];

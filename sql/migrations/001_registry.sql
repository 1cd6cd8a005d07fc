-- Hot-tier schema: the table registry, the change log and the export batch log.
CREATE SCHEMA IF NOT EXISTS coldharbor;

-- One row per registered table. Columns are read from the catalog at export time
-- (coldharbor.lake_columns), so the registry keeps only what the catalog cannot say.
CREATE TABLE coldharbor.tables (
    table_id       serial PRIMARY KEY,
    schema_name    text        NOT NULL,
    table_name     text        NOT NULL,
    key_columns    text[]      NOT NULL,
    lake_location  text,                       -- NULL: <lake root>/<schema>/<table>
    partition_by   text[]      NOT NULL DEFAULT '{}',
    sort_by        text[]      NOT NULL DEFAULT '{}',
    hot_retention  interval,                   -- NULL: rows are never evicted from the hot tier
    last_batch_id  bigint      NOT NULL DEFAULT 0,
    registered_at  timestamptz NOT NULL DEFAULT now(),
    UNIQUE (schema_name, table_name)
);

-- Written by the capture triggers in the same transaction as the data.
-- No foreign key on table_id: an RI check is a per-row trigger, which bulk writes must not pay.
CREATE TABLE coldharbor.change_log (
    id            bigserial   PRIMARY KEY,
    table_id      integer     NOT NULL,
    key           jsonb       NOT NULL,
    op            "char"      NOT NULL CHECK (op IN ('I', 'U', 'D')),
    created_at    timestamptz NOT NULL DEFAULT now(),
    flushed_at    timestamptz,                 -- NULL: dirty, not yet in the lake
    lake_version  bigint                       -- Delta version that holds this change
);

-- Keeps the dirty-set lookup proportional to the dirty set, not to history.
CREATE INDEX change_log_dirty ON coldharbor.change_log (table_id, id) WHERE flushed_at IS NULL;

-- Intent log of the CDC export (write-ahead of the Delta commit): the change ids of a batch are
-- recorded before the lake commit, so a run that dies between commit and mark can be finished
-- by the next run without writing the batch twice.
CREATE TABLE coldharbor.export_batches (
    table_id          integer     NOT NULL,
    batch_id          bigint      NOT NULL,
    run_id            text        NOT NULL,
    state             text        NOT NULL DEFAULT 'pending'
                                  CHECK (state IN ('pending', 'flushed', 'abandoned')),
    change_ids        bigint[],                -- cleared once flushed
    change_count      bigint      NOT NULL,
    row_count         bigint      NOT NULL,
    oldest_change_at  timestamptz,
    started_at        timestamptz NOT NULL DEFAULT now(),
    finished_at       timestamptz,
    lake_version      bigint,
    PRIMARY KEY (table_id, batch_id)
);

CREATE INDEX export_batches_pending ON coldharbor.export_batches (table_id) WHERE state = 'pending';

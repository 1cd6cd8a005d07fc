-- Rebase windows and replaced tables (issue 18, after review of sql/migrations/014).
--
-- 1. A rebase (sql/migrations/014) is a time when PostgreSQL held values the lake did not: from the request
--    (the DDL that changed rows without writing them) until the base that answered it landed. An
--    as-of report for an instant in between would read the pre-DDL rows, so every request is now
--    kept in coldharbor.rebases with its time and, once settled, the base's snapshot time and Delta
--    version; reports refuse as-of instants inside a window (serve.check_as_of).
-- 2. A registered table dropped and created again under its name, but not registered again, has no
--    capture triggers: its writes are not captured. The jobs refuse it by comparing the relation
--    registered (`relid`) with the one the name resolves to; an sql_drop event trigger records the
--    drop too (`dropped_at`), so the refusal holds even if the new table were given the old oid,
--    and registering again opens the rebase window at the drop, when PostgreSQL's rows changed.
-- 3. The base that settles a table clears its `rebase_reason` (the history stays in rebases).
ALTER TABLE coldharbor.tables ADD COLUMN dropped_at timestamptz;  -- the registered relation was dropped then

CREATE TABLE coldharbor.rebases (
    table_id        integer     NOT NULL REFERENCES coldharbor.tables ON DELETE CASCADE,
    serial          bigint      NOT NULL,   -- the table's rebase_serial after this request
    reason          text        NOT NULL,
    requested_at    timestamptz NOT NULL,   -- inside the requesting transaction: never after its commit
    settled_at      timestamptz,            -- snapshot time of the base that answered it
    settled_version bigint,                 -- that base's Delta version
    PRIMARY KEY (table_id, serial)
);

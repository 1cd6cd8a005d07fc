-- Lake-first tables (issue 23, part 3): `register_table(..., p_mode => 'lake_first')` for data whose
-- home is the lake (events, logs). PostgreSQL is only their landing zone:
--   * it accepts inserts, captured as any table's; UPDATE, DELETE, TRUNCATE and DETACH PARTITION are
--     refused with an error naming the table (an upsert, INSERT ... ON CONFLICT DO UPDATE, is an
--     UPDATE: refused too; ON CONFLICT DO NOTHING is an insert);
--   * once a row's insert is in the lake (its change flushed, or the row in the initial load), the
--     export removes it from PostgreSQL (coldharbor.remove_landed), logging no change: as eviction
--     does, it records the removal in coldharbor.evictions, so `tables.evicted_at` marks that rows
--     live in the lake alone and every guard of a table with evicted rows holds (DDL that would need
--     PostgreSQL to hold every row is refused, a base keeps the lake's rows, verify compares only
--     what PostgreSQL holds);
--   * reports read it as any table: the lake's rows, minus the keys with unexported changes, plus
--     PostgreSQL's images of those.
-- The refusal runs in evict_guard, the BEFORE UPDATE OR DELETE statement trigger of tiered tables,
-- which every relation of a lake-first table carries (protected against being dropped, disabled or
-- replaced since 013), and in log_rows, which TRUNCATE and DETACH PARTITION call (both in
-- sql/definitions/020_capture.sql and 050_tiering.sql).
ALTER TABLE coldharbor.tables ADD COLUMN mode text NOT NULL DEFAULT 'mirror'
    CONSTRAINT tables_mode_check CHECK (mode IN ('mirror', 'lake_first'));

-- Canonical key identity (invariant 15, issue 20 item 2).
--
-- A change_log key used to be jsonb_build_object over the key columns, whose text depends on the
-- session that wrote it: timestamptz carries the session's TimeZone offset, bytea follows
-- bytea_output, numeric keeps the scale it was written with, char(n) its padding. The same key
-- could then be two dirty keys (two report rows), two export shares (two lake rows in one batch)
-- or a key eviction's re-check does not match. Every key is now built by the SQL that
-- coldharbor.key_sql() generates, whose text is the same whatever the session's settings:
--   timestamptz  the UTC time, XSD form plus '+00:00' ('infinity' and '-infinity' as such)
--   bytea        '\x' and lower-case hex
--   numeric      trim_scale (1.50 and 1.5 are one key)
--   char(n)      the value without its padding (char comparison ignores it too)
--   date, timestamp, integers, boolean, text, varchar, uuid: jsonb's own form, which no setting
--   changes (dates and timestamps are written in XSD form whatever DateStyle says).
-- Each element casts back to its column type in any session ((key ->> 'col')::type), which is how
-- the jobs read keys. Key columns of any other type (real, double precision, json, jsonb) have no
-- safe canonical identity (float text follows extra_float_digits, jsonb equality is not the
-- text's): registration refuses them, naming the column.

-- A write racing an eviction (issue 20, item 3).
--
-- Tiered tables (a hot retention) are for rows the application no longer changes. Still, a write
-- must never be lost silently: an UPDATE or DELETE blocked on eviction's row lock would, in READ
-- COMMITTED, find the row gone once eviction commits and change nothing, with no error and no
-- change logged. So:
--   * evict() holds, until its transaction ends, an exclusive transaction advisory lock on the table
--     (namespace 0x43480007, the table id) and records its transaction in coldharbor.evictions when
--     it evicted rows;
--   * every UPDATE or DELETE statement on a tiered table first runs coldharbor.evict_guard() (a
--     BEFORE ... FOR EACH STATEMENT trigger), which takes that lock shared until the writer's
--     transaction ends (an eviction in progress is waited for; a new one waits for the writer) and
--     then fails with SQLSTATE 40001 (serialization_failure) when an eviction of the table committed
--     that the statement's snapshot does not see: the statement may have been about to change
--     rows that are no longer there. The application retries, as after any serialization failure.
--   * an UPDATE or DELETE of a key evicted before the statement started affects 0 rows (the row is
--     not in the hot tier; reports keep serving its lake version). INSERT of an evicted key writes a
--     new version, which is captured and wins over the lake's.
-- Eviction tries for about 5 s to get past writers' open transactions, else evicts nothing this run.

-- The last eviction transaction of each table that evicted rows. Written by evict() alone.
CREATE TABLE coldharbor.evictions (
    table_id integer PRIMARY KEY,
    xact     xid8    NOT NULL
);

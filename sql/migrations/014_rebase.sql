-- Rebase: changes to a registered table's rows that capture cannot carry (issue 18).
--
-- Capture sees rows written by INSERT, UPDATE, DELETE and TRUNCATE. Some DDL changes the rows a
-- table holds without any of them, and the lake would keep the old rows for good:
--   - the table is dropped and created again under its name, then registered again: the lake
--     holds the old table's rows, none of the new one's;
--   - ALTER TABLE ... ADD COLUMN with a default (or a domain's): every existing row holds the
--     value, stored once in the catalog (a "fast default"), no row written;
--   - ALTER TABLE rewrites the table: ALTER COLUMN ... TYPE ... USING, a volatile default, a stored
--     generated column added or its expression changed;
--   - a virtual generated column (PostgreSQL 18's default kind) is added or its expression set;
--   - RENAME COLUMN: the lake knows a column by its name, older rows would read NULL under the new one.
-- Each sends the table back to 'pending' with the reason: reports serve it from PostgreSQL alone
-- (invariant 12, as before its initial load) and the next export writes a new base from one
-- snapshot (base_load.py, kind resync), which outranks every older lake row key by key and marks
-- the keys PostgreSQL no longer has deleted. An ALTER that only adds a nullable column, changes a
-- default for future rows or renames a column needs no base and sends nothing back.
--
-- rebase_serial counts the requests; a base records the serial it started under (in its Delta
-- commit's metadata) and settles the table only if no request came after it, so an ALTER that
-- commits after the base's snapshot is not lost.
ALTER TABLE coldharbor.tables
    ADD COLUMN relid         oid,                        -- the relation registered under the name
    ADD COLUMN columns_seen  jsonb,                      -- per attnum, what defines its values (column_values_signature)
    ADD COLUMN rebase_serial bigint NOT NULL DEFAULT 0,  -- how many rebases were requested
    ADD COLUMN rebase_reason text;

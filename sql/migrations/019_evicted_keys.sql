-- Keys of a tiered table with evicted rows, and the DDL triggers' reach (issue 18).
--
-- 1. A rewrite of a key column. A base (written from PostgreSQL) keeps the lake's rows of keys
--    PostgreSQL does not hold as the table's evicted rows: it cannot tell a key eviction took away
--    from one that DDL rewrote. `ALTER TABLE t ALTER COLUMN id TYPE bigint USING id + 1000` (or
--    `TYPE integer USING ...`, the type unchanged) rewrites every key and logs nothing; its rebase
--    then kept every old key as if it were evicted, and reports showed each hot row twice, under
--    its old key and its new one. Once rows of a table were evicted (`tables.evicted_at`), a
--    statement that rewrites the table and changes a key column's definition is refused unless it
--    is known to keep every key: a single plain `ALTER TABLE t ALTER [COLUMN] k [SET DATA] TYPE x`,
--    sent on its own with no USING and no other subcommand, to a type the key's values cast to
--    unchanged (key_cast_keeps_values: a wider integer; text or varchar to text or to an unbounded
--    varchar; varchar to one no shorter; the same type with no smaller modifier; a char(n) key, which
--    the lake holds padded to n, keeps its type and length).
--    A key type change PostgreSQL makes without a rewrite (varchar(10) -> text) changes no value
--    and goes through; so does every rewrite that leaves the key columns alone (their values are
--    the ones the hot rows had: a `USING` on another column is applied to the rows PostgreSQL
--    holds, as an UPDATE of them would be). Which statement rewrote what is seen by comparing,
--    per table with evicted rows, its relation files and its key columns' catalog rows before the
--    statement (ddl_command_start, kept in coldharbor.ddl_keys_before) and after it
--    (ddl_command_end); only the catalog is read, never the table.
--    A table with a hot retention is pictured too: an eviction may commit while the statement waits
--    for its lock. `ALTER TYPE ... CASCADE` on the composite type of a typed table (CREATE TABLE t
--    OF type) reports the type alone: both DDL triggers also take the typed tables of a type the
--    command touched (ddl_touched_tables), so its renames and key rewrites are seen.
-- 2. `registered_tables_of` found a registration whose relation was dropped (`dropped_at`) when
--    PostgreSQL gave its oid to a new relation: DDL on that unrelated relation was refused or sent
--    the old registration back to pending. A dropped registration owns no relation now.
-- 3. A database migrated by a non-superuser up to 014 and by a superuser at 018 got the guard
--    without the rebase triggers (018 recreated the DDL one only if it existed). Each event trigger
--    is created when missing and a superuser migrates (install_ddl_triggers, in
--    sql/definitions/070_guards.sql).
-- 4. Renames made before 018 through `ALTER TYPE ... RENAME ATTRIBUTE`, `ALTER VIEW`, ... reached no
--    trigger: `columns_seen` still holds the old name and no rebase was asked for.
--    reconcile_columns_seen (sql/definitions/040_rebase.sql) sends every table whose columns differ
--    from what was seen in a way that needs a base back to pending; the databases of that time ran
--    it at this migration.

-- What each table with evicted rows looked like when the current DDL statement of a backend began.
-- A table only the owner writes, not a session setting: a statement's own code (a USING expression,
-- a default) could change a setting between the statement's start and its end.
CREATE UNLOGGED TABLE coldharbor.ddl_keys_before (
    backend_pid integer PRIMARY KEY,
    tables      jsonb   NOT NULL     -- table_id -> key_watch(table_id)
);

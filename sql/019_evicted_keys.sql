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
-- 3. A database migrated by a non-superuser up to sql/014 and by a superuser at sql/018 got the
--    guard without the rebase triggers (018 recreated the DDL one only if it existed). Each event
--    trigger is created here when missing and a superuser migrates (install_ddl_triggers).
-- 4. Renames made before sql/018 through `ALTER TYPE ... RENAME ATTRIBUTE`, `ALTER VIEW`, ... reached
--    no trigger: `columns_seen` still holds the old name and no rebase was asked for. Every table
--    whose columns differ from what was seen in a way that needs a base is sent back to pending now
--    (reconcile_columns_seen).

-- 2.
CREATE OR REPLACE FUNCTION coldharbor.registered_tables_of(p_rel oid)
RETURNS SETOF integer
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $$
    SELECT t.table_id FROM coldharbor.tables t
     WHERE t.source_kind = 'table' AND t.relid IS NOT NULL AND t.dropped_at IS NULL
       AND (t.relid = p_rel OR t.relid IN (SELECT a FROM pg_partition_ancestors(p_rel::regclass) a))
$$;

-- The registered tables the DDL command being ended touched: relations it names (a partition's
-- registered ancestor included), and the typed tables (CREATE TABLE ... OF type) of a composite type
-- it altered (`ALTER TYPE ... CASCADE` reports the type alone, not the tables it rewrites).
CREATE FUNCTION coldharbor.ddl_touched_tables()
RETURNS SETOF integer
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $$
    SELECT DISTINCT coldharbor.registered_tables_of(r.rel)
      FROM pg_event_trigger_ddl_commands() c,
           LATERAL (SELECT c.objid AS rel WHERE c.classid = 'pg_class'::regclass
                    UNION ALL
                    SELECT typed.oid FROM pg_class typed
                     WHERE typed.reloftype <> 0
                       AND typed.reloftype = CASE WHEN c.classid = 'pg_type'::regclass THEN c.objid
                                                  WHEN c.classid = 'pg_class'::regclass
                                                  THEN (SELECT x.reltype FROM pg_class x WHERE x.oid = c.objid) END) r
$$;

-- As sql/014's (with 018's reach, every DDL command), and the tables it touched as above.
CREATE OR REPLACE FUNCTION coldharbor.rebase_on_ddl()
RETURNS event_trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_table integer;
    v_reason text;
BEGIN
    IF TG_EVENT = 'table_rewrite' THEN
        FOR v_table IN SELECT coldharbor.registered_tables_of(pg_event_trigger_table_rewrite_oid()) LOOP
            PERFORM coldharbor.request_rebase(v_table, format(
                'ALTER TABLE rewrote %s (a type change, a volatile default or a stored generated column): its '
                'rows may all have changed', pg_event_trigger_table_rewrite_oid()::regclass));
        END LOOP;
        RETURN;
    END IF;
    FOR v_table IN SELECT coldharbor.ddl_touched_tables() LOOP
        v_reason := coldharbor.rebase_reason_for(v_table);
        IF v_reason IS NOT NULL THEN
            PERFORM coldharbor.request_rebase(v_table, v_reason);
        END IF;
        UPDATE coldharbor.tables SET columns_seen = coldharbor.columns_seen_after(columns_seen, relid)
         WHERE table_id = v_table;
    END LOOP;
END;
$$;

-- 1. What a statement may change under table p_table_id, from the catalog alone: its relation files
-- (every leaf of a partitioned table; a rewrite gives a relation a new one) and each key column's
-- catalog row (a new row version when its definition changed), type and modifier.
CREATE FUNCTION coldharbor.key_watch(p_table_id integer)
RETURNS jsonb
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $$
    SELECT jsonb_build_object(
               'files', (SELECT string_agg(c.relfilenode::text, ',' ORDER BY c.oid)
                           FROM pg_class c
                          WHERE c.oid = t.relid OR c.oid IN (SELECT p.relid FROM pg_partition_tree(t.relid::regclass) p)),
               'keys', (SELECT coalesce(jsonb_object_agg(a.attname, jsonb_build_object(
                                   'row', a.ctid::text, 'type', a.atttypid::regtype::text, 'typmod', a.atttypmod,
                                   'base', (coldharbor.base_type(a.atttypid, a.atttypmod)).base_type::bigint,
                                   'base_typmod', (coldharbor.base_type(a.atttypid, a.atttypmod)).base_typmod)), '{}')
                          FROM pg_attribute a
                         WHERE a.attrelid = t.relid AND a.attname = ANY (t.key_columns) AND NOT a.attisdropped))
      FROM coldharbor.tables t
     WHERE t.table_id = p_table_id
$$;

-- Whether every value of a key column of (base) type p_from/p_from_mod casts to p_to/p_to_mod
-- unchanged, with the same identity (coldharbor.key_element_sql) -- an allow list, not a list of
-- what may change them. A length or precision limit that shrinks would cut values; a numeric scale
-- change rounds them.
CREATE FUNCTION coldharbor.key_cast_keeps_values(p_from oid, p_from_mod integer, p_to oid, p_to_mod integer)
RETURNS boolean
LANGUAGE sql IMMUTABLE SET search_path = pg_catalog, pg_temp AS $$
    SELECT CASE
        -- the lake holds a char(n) key padded to n: any other type or length is another key
        WHEN p_from = 'character'::regtype OR p_to = 'character'::regtype THEN p_from = p_to AND p_to_mod = p_from_mod
        WHEN p_from = p_to AND p_to = 'numeric'::regtype THEN
            p_to_mod = -1 OR (p_from_mod <> -1 AND ((p_to_mod - 4) & 65535) = ((p_from_mod - 4) & 65535)
                              AND ((p_to_mod - 4) >> 16) >= ((p_from_mod - 4) >> 16))
        WHEN p_from = p_to THEN p_to_mod = -1 OR (p_from_mod <> -1 AND p_to_mod >= p_from_mod)
        WHEN p_from IN ('smallint'::regtype, 'integer'::regtype) AND p_to IN ('integer'::regtype, 'bigint'::regtype) THEN
            p_from = 'smallint'::regtype OR p_to = 'bigint'::regtype
        WHEN p_from IN ('text'::regtype, 'character varying'::regtype)
         AND p_to IN ('text'::regtype, 'character varying'::regtype) THEN
            p_to_mod = -1 OR (p_from <> 'text'::regtype AND p_from_mod <> -1 AND p_to_mod >= p_from_mod)
        ELSE false
    END
$$;

-- Whether statement text p_sql is one plain `ALTER TABLE [IF EXISTS] [ONLY] t ALTER [COLUMN] c
-- [SET DATA] TYPE x` and nothing else: no USING, no COLLATE, no other subcommand, no second
-- statement, no comment. The type is words, quoted names, dots and one `(n[, m])`.
CREATE FUNCTION coldharbor.is_plain_type_change(p_sql text)
RETURNS boolean
LANGUAGE sql IMMUTABLE SET search_path = pg_catalog, pg_temp AS $$
    WITH p AS (
        SELECT '(?:[a-z_][a-z0-9_$]*|"(?:[^"]|"")+")' AS name,
               '(?:(?!(?:using|collate)\M)[a-z_][a-z0-9_$]*|"(?:[^"]|"")+")' AS word)
    SELECT p_sql ~* ('^\s*alter\s+table\s+(?:if\s+exists\s+)?(?:only\s+)?' || name || '(?:\s*\.\s*' || name || '){0,2}'
                     || '(?:\s*\*)?\s+alter\s+(?:column\s+)?' || name || '\s+(?:set\s+data\s+)?type\s+'
                     || word || '(?:\s*\.\s*' || word || ')?(?:\s+' || word || ')*'
                     || '(?:\s*\(\s*\d+\s*(?:,\s*\d+\s*)?\))?(?:\s+' || word || ')*\s*;?\s*$')
      FROM p
$$;

-- Why the statement that just ran must not change table p_table_id's keys, or NULL; p_before is
-- key_watch(p_table_id) when the statement began (NULL: the table had no evicted rows then).
CREATE FUNCTION coldharbor.evicted_keys_refusal(p_table_id integer, p_before jsonb)
RETURNS text
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    t     record;
    v_now jsonb;
    k     text;
    was   jsonb;
    cur   jsonb;
BEGIN
    SELECT * INTO t FROM coldharbor.tables WHERE table_id = p_table_id;
    IF p_before IS NULL THEN
        -- No picture: nothing was evicted and no retention set when the statement began. Rows were
        -- evicted since (while it waited for its lock): refused if it changed a key column.
        IF EXISTS (SELECT 1 FROM pg_attribute a
                    WHERE a.attrelid = t.relid AND a.attname = ANY (t.key_columns)
                      AND a.xmin = pg_current_xact_id()::xid) THEN
            RETURN format('cannot change key column %s of %I.%I now: rows were evicted from its hot tier (at %s) '
                          'while the statement waited for its lock; run it again, and it is checked against them',
                          (SELECT string_agg(quote_ident(k), ', ') FROM unnest(t.key_columns) k),
                          t.schema_name, t.table_name, t.evicted_at);
        END IF;
        RETURN NULL;
    END IF;
    v_now := coldharbor.key_watch(p_table_id);
    IF (v_now ->> 'files') IS NOT DISTINCT FROM (p_before ->> 'files') THEN
        RETURN NULL;  -- nothing rewritten: no stored value changed
    END IF;
    FOR k, was IN SELECT * FROM jsonb_each(p_before -> 'keys') LOOP
        cur := v_now -> 'keys' -> k;
        CONTINUE WHEN cur IS NOT NULL AND (cur ->> 'row') = (was ->> 'row');
        IF cur IS NULL OR NOT coldharbor.is_plain_type_change(current_query())
           OR NOT coldharbor.key_cast_keeps_values((was ->> 'base')::oid, (was ->> 'base_typmod')::integer,
                                                   (cur ->> 'base')::oid, (cur ->> 'base_typmod')::integer) THEN
            RETURN format('cannot rewrite key column %s of %I.%I (%s to %s): rows evicted from its hot tier (last '
                          'at %s) live in the lake alone under their keys, and a base cannot tell them from keys '
                          'the rewrite took away, so every old key would stay in reports beside its new one; '
                          'accepted on such a table: one plain ALTER TABLE ... ALTER COLUMN %s TYPE, sent on '
                          'its own without USING, to a type its keys cast to unchanged (a wider integer, text '
                          'no shorter or unbounded, the same type with no smaller modifier)',
                          quote_ident(k), t.schema_name, t.table_name, was ->> 'type',
                          coalesce(cur ->> 'type', 'nothing'), t.evicted_at, quote_ident(k));
        END IF;
    END LOOP;
    RETURN NULL;
END;
$$;

-- What each table with evicted rows looked like when the current DDL statement of a backend began.
-- A table only the owner writes, not a session setting: a statement's own code (a USING expression,
-- a default) could change a setting between the statement's start and its end.
CREATE UNLOGGED TABLE coldharbor.ddl_keys_before (
    backend_pid integer PRIMARY KEY,
    tables      jsonb   NOT NULL     -- table_id -> key_watch(table_id)
);

-- ddl_command_start of any DDL (catalog reads only; a row written only while some table has
-- evicted rows or a hot retention: an eviction may commit while the statement waits for its lock).
CREATE FUNCTION coldharbor.watch_evicted_keys()
RETURNS event_trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    -- Nothing evicted: the table is not touched (a row left from before is read only for a table
    -- with evicted rows, which writes a new one first).
    IF NOT EXISTS (SELECT 1 FROM coldharbor.tables WHERE evicted_at IS NOT NULL OR hot_retention IS NOT NULL) THEN
        RETURN;
    END IF;
    DELETE FROM coldharbor.ddl_keys_before WHERE backend_pid = pg_backend_pid();
    INSERT INTO coldharbor.ddl_keys_before (backend_pid, tables)
    SELECT pg_backend_pid(), coalesce(jsonb_object_agg(t.table_id::text, coldharbor.key_watch(t.table_id)), '{}')
      FROM coldharbor.tables t
     WHERE (t.evicted_at IS NOT NULL OR t.hot_retention IS NOT NULL) AND t.source_kind = 'table'
       AND t.dropped_at IS NULL AND EXISTS (SELECT 1 FROM pg_class c WHERE c.oid = t.relid);
END;
$$;

-- As sql/018's, and a rewrite of a key column is checked as in 1. above.
CREATE OR REPLACE FUNCTION coldharbor.guard_evicted_rows()
RETURNS event_trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_table  integer;
    v_reason text;
    v_before jsonb;
BEGIN
    FOR v_table IN SELECT coldharbor.ddl_touched_tables() LOOP
        v_reason := coldharbor.evicted_rows_refusal(v_table);
        IF v_reason IS NULL AND (SELECT evicted_at IS NOT NULL FROM coldharbor.tables WHERE table_id = v_table) THEN
            SELECT b.tables -> v_table::text INTO v_before
              FROM coldharbor.ddl_keys_before b WHERE b.backend_pid = pg_backend_pid();
            -- none: the table had no evicted rows when the statement began
            v_reason := coldharbor.evicted_keys_refusal(v_table, v_before);
        END IF;
        IF v_reason IS NOT NULL THEN
            RAISE EXCEPTION '%', v_reason
                USING ERRCODE = 'feature_not_supported',
                      HINT = 'Rows evicted from the hot tier keep the names, lake types and keys they were evicted '
                             'with; a view can show a column under another name or type, and an UPDATE of a key '
                             'is logged as a delete and an insert.';
        END IF;
        UPDATE coldharbor.tables SET lake_types = coldharbor.column_lake_types(relid)
         WHERE table_id = v_table AND lake_types IS DISTINCT FROM coldharbor.column_lake_types(relid);
    END LOOP;
END;
$$;

-- 3. The event triggers of sql/009-019 that are missing, when a superuser migrates (only a superuser
-- may create one); the names of those it could not create otherwise.
CREATE FUNCTION coldharbor.install_ddl_triggers()
RETURNS text[]
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_wanted  text[][] := ARRAY[
        ['coldharbor_guard_capture_ddl', 'ddl_command_end', 'coldharbor.guard_capture'],
        ['coldharbor_guard_capture_drop', 'sql_drop', 'coldharbor.guard_capture'],
        ['coldharbor_grant_partition_capture', 'ddl_command_end', 'coldharbor.grant_partition_capture'],
        ['coldharbor_rebase_ddl', 'ddl_command_end', 'coldharbor.rebase_on_ddl'],
        ['coldharbor_rebase_rewrite', 'table_rewrite', 'coldharbor.rebase_on_ddl'],
        ['coldharbor_evicted_rows_guard', 'ddl_command_end', 'coldharbor.guard_evicted_rows'],
        ['coldharbor_evicted_keys_watch', 'ddl_command_start', 'coldharbor.watch_evicted_keys'],
        ['coldharbor_note_registered_drop', 'sql_drop', 'coldharbor.note_registered_drop']];
    v_missing text[] := '{}';
    i         integer;
BEGIN
    FOR i IN 1 .. array_length(v_wanted, 1) LOOP
        CONTINUE WHEN EXISTS (SELECT 1 FROM pg_event_trigger WHERE evtname = v_wanted[i][1]);
        IF (SELECT rolsuper FROM pg_roles WHERE rolname = current_user) THEN
            EXECUTE format('CREATE EVENT TRIGGER %I ON %s EXECUTE FUNCTION %s()',
                           v_wanted[i][1], v_wanted[i][2], v_wanted[i][3]);
        ELSE
            v_missing := v_missing || v_wanted[i][1];
        END IF;
    END LOOP;
    RETURN v_missing;
END;
$$;

REVOKE ALL ON FUNCTION coldharbor.install_ddl_triggers() FROM PUBLIC;

DO $triggers$
DECLARE
    v_missing text[] := coldharbor.install_ddl_triggers();
BEGIN
    IF cardinality(v_missing) > 0 THEN
        RAISE WARNING 'not a superuser: event triggers % were not created; run the migration as a superuser '
                      '(or SELECT coldharbor.install_ddl_triggers() as one) for DDL on registered tables to be seen',
                      array_to_string(v_missing, ', ');
    END IF;
END
$triggers$;

-- 4. Sends back to pending every table whose columns differ from `columns_seen` in a way that needs
-- a base (rebase_reason_for), and moves `columns_seen` on; returns how many it sent back.
CREATE FUNCTION coldharbor.reconcile_columns_seen()
RETURNS integer
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_table  integer;
    v_reason text;
    v_sent   integer := 0;
BEGIN
    FOR v_table IN
        SELECT t.table_id FROM coldharbor.tables t
         WHERE t.source_kind = 'table' AND t.dropped_at IS NULL AND t.columns_seen IS NOT NULL
           AND EXISTS (SELECT 1 FROM pg_class c WHERE c.oid = t.relid)
         ORDER BY t.table_id
    LOOP
        v_reason := coldharbor.rebase_reason_for(v_table);
        IF v_reason IS NOT NULL THEN
            PERFORM coldharbor.request_rebase(v_table, v_reason);
            v_sent := v_sent + 1;
        END IF;
        UPDATE coldharbor.tables SET columns_seen = coldharbor.columns_seen_after(columns_seen, relid)
         WHERE table_id = v_table AND columns_seen IS DISTINCT FROM coldharbor.columns_seen_after(columns_seen, relid);
    END LOOP;
    RETURN v_sent;
END;
$$;

REVOKE ALL ON FUNCTION coldharbor.reconcile_columns_seen() FROM PUBLIC;

SELECT coldharbor.reconcile_columns_seen();

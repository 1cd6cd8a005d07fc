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

-- The canonical key element of an expression of type p_type, or NULL when that type may not be
-- part of a key (an allow-list).
CREATE FUNCTION coldharbor.key_element_sql(p_type regtype, p_expr text)
RETURNS text
LANGUAGE sql IMMUTABLE SET search_path = pg_catalog, pg_temp AS $$
    SELECT CASE p_type
        WHEN 'smallint'::regtype                    THEN p_expr
        WHEN 'integer'::regtype                     THEN p_expr
        WHEN 'bigint'::regtype                      THEN p_expr
        WHEN 'boolean'::regtype                     THEN p_expr
        WHEN 'text'::regtype                        THEN p_expr
        WHEN 'character varying'::regtype           THEN p_expr
        WHEN 'uuid'::regtype                        THEN p_expr
        WHEN 'date'::regtype                        THEN p_expr
        WHEN 'timestamp without time zone'::regtype THEN p_expr
        WHEN 'character'::regtype                   THEN format('(%s)::text', p_expr)
        WHEN 'numeric'::regtype                     THEN format('trim_scale(%s)', p_expr)
        WHEN 'bytea'::regtype                       THEN format('(''\x'' || encode(%s, ''hex''))', p_expr)
        WHEN 'timestamp with time zone'::regtype    THEN
            format('((to_jsonb((%1$s) AT TIME ZONE ''UTC'') #>> ''{}'') || CASE WHEN isfinite(%1$s) THEN ''+00:00'' ELSE '''' END)',
                   p_expr)
    END
$$;

-- The SQL expression of the canonical key of table p_table_id's row under alias p_alias: the one
-- place key identity is produced (capture, eviction, purge). Raises, naming the column, when a key
-- column's type may not be part of a key.
CREATE FUNCTION coldharbor.key_sql(p_table_id integer, p_alias text)
RETURNS text
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    t       coldharbor.tables;
    r       record;
    v_parts text[] := '{}';
    v_elem  text;
BEGIN
    SELECT * INTO STRICT t FROM coldharbor.tables WHERE table_id = p_table_id;
    FOR r IN SELECT k.name, a.atttypid::regtype AS type
               FROM unnest(t.key_columns) WITH ORDINALITY AS k(name, n)
               JOIN pg_attribute a ON a.attrelid = format('%I.%I', t.schema_name, t.table_name)::regclass
                                  AND a.attname = k.name AND NOT a.attisdropped
              ORDER BY k.n LOOP
        v_elem := coldharbor.key_element_sql(r.type, format('%I.%I', p_alias, r.name));
        IF v_elem IS NULL THEN
            RAISE EXCEPTION 'cannot register %.%: key column % has type %, whose values have no canonical identity',
                quote_ident(t.schema_name), quote_ident(t.table_name), quote_ident(r.name), r.type
                USING ERRCODE = 'feature_not_supported',
                      HINT = 'Key columns may be smallint, integer, bigint, numeric(p,s), boolean, text, varchar, char, '
                          || 'date, timestamp, timestamptz, uuid or bytea.';
        END IF;
        v_parts := v_parts || format('%L, %s', r.name, v_elem);
    END LOOP;
    RETURN 'jsonb_build_object(' || array_to_string(v_parts, ', ') || ')';
END;
$$;

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

-- Whether an eviction of p_table_id committed that p_snapshot does not see. Waits for an eviction in
-- progress and keeps new ones out until the caller's transaction ends (the shared lock). VOLATILE:
-- its query takes a new snapshot, which sees an eviction that committed while it waited.
CREATE FUNCTION coldharbor.evicted_since(p_table_id integer, p_snapshot pg_snapshot)
RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM pg_advisory_xact_lock_shared(1128792071, p_table_id);   -- 0x43480007: eviction
    RETURN EXISTS (SELECT 1 FROM coldharbor.evictions
                    WHERE table_id = p_table_id AND NOT pg_visible_in_snapshot(xact, p_snapshot)
                      AND xact IS DISTINCT FROM pg_current_xact_id_if_assigned());
END;
$$;

-- The BEFORE UPDATE OR DELETE statement trigger of a tiered table (TG_ARGV[0]: its table id).
-- STABLE, so pg_current_snapshot() is the snapshot of the statement that fired it.
CREATE FUNCTION coldharbor.evict_guard()
RETURNS trigger
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF coldharbor.evicted_since(TG_ARGV[0]::integer, pg_current_snapshot()) THEN
        RAISE EXCEPTION 'could not % %: rows of it were evicted from the hot tier while this statement ran',
            lower(TG_OP), TG_RELID::regclass
            USING ERRCODE = 'serialization_failure',
                  HINT = 'Retry the transaction. Evicted rows are in the lake only: an UPDATE or DELETE of them '
                      || 'changes nothing, an INSERT of their key writes a new version.';
    END IF;
    RETURN NULL;
END;
$$;

-- As 009's, but evict_guard (which only reads) is among the triggers that may run when the schema
-- owner deletes.
CREATE OR REPLACE FUNCTION coldharbor.owner_delete_refusal(p_table regclass)
RETURNS text
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $$
    WITH RECURSIVE members(relid) AS (
        SELECT p_table::oid
        UNION
        SELECT i.inhrelid FROM pg_inherits i JOIN members m ON i.inhparent = m.relid)
    SELECT coalesce(
        coldharbor.read_refusal(p_table),
        (SELECT format('%s has row-level security', c.oid::regclass)
           FROM members m JOIN pg_class c ON c.oid = m.relid WHERE c.relrowsecurity LIMIT 1),
        (SELECT format('trigger %s on %s runs on DELETE', quote_ident(t.tgname), t.tgrelid::regclass)
           FROM members m JOIN pg_trigger t ON t.tgrelid = m.relid
          WHERE NOT t.tgisinternal AND (t.tgtype & 8) <> 0     -- TRIGGER_TYPE_DELETE
            AND t.tgfoid NOT IN (SELECT oid FROM pg_proc WHERE pronamespace = 'coldharbor'::regnamespace
                                    AND (proname ~ '^capture_[0-9]+_(ins|upd|del|trunc)$' OR proname = 'evict_guard'))
          LIMIT 1),
        (SELECT format('rule %s on %s runs on DELETE', quote_ident(r.rulename), r.ev_class::regclass)
           FROM members m JOIN pg_rewrite r ON r.ev_class = m.relid WHERE r.ev_type = '4' LIMIT 1))
$$;

-- (Re)creates the capture of one registered table: four trigger functions owned by the schema
-- owner (SECURITY DEFINER, fixed search_path, no EXECUTE for anyone else) and the statement-level
-- triggers calling them. It runs as the owner, which holds TRIGGER on every registered table
-- (granted at registration), and replaces the triggers in place (CREATE OR REPLACE TRIGGER): the
-- owner of the schema never needs to own the table.
CREATE OR REPLACE FUNCTION coldharbor.install_capture(p_table_id integer)
RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $install$
DECLARE
    t        coldharbor.tables;
    v_rel    text;
    v_prefix text;
    v_key_n  text;      -- canonical key built from alias n (key_sql)
    v_key_o  text;      -- canonical key built from alias o
    v_join   text;
    v_first  text;
    v_kind   text;
BEGIN
    SELECT * INTO STRICT t FROM coldharbor.tables WHERE table_id = p_table_id;
    v_rel := format('%I.%I', t.schema_name, t.table_name);
    v_prefix := format('coldharbor.capture_%s', t.table_id);
    v_key_n := coldharbor.key_sql(p_table_id, 'n');
    v_key_o := coldharbor.key_sql(p_table_id, 'o');
    SELECT string_agg(format('n.%I = o.%I', c, c), ' AND ') INTO v_join FROM unnest(t.key_columns) AS c;
    v_first := quote_ident(t.key_columns[1]);

    EXECUTE format($f$
        CREATE OR REPLACE FUNCTION %s_ins() RETURNS trigger
        LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $b$
        BEGIN
            INSERT INTO coldharbor.change_log (table_id, key, op)
            SELECT %s, %s, 'I' FROM new_rows n;
            RETURN NULL;
        END $b$$f$, v_prefix, t.table_id, v_key_n);

    -- Eviction is not deletion (invariant 10): deletes that evict() or purge_rows() make log nothing.
    -- (capture_is_suspended, inlined: this runs on every DELETE statement.)
    EXECUTE format($f$
        CREATE OR REPLACE FUNCTION %s_del() RETURNS trigger
        LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $b$
        BEGIN
            IF EXISTS (SELECT 1 FROM coldharbor.capture_suspended
                        WHERE xact = pg_current_xact_id() AND table_id = %s) THEN
                RETURN NULL;
            END IF;
            INSERT INTO coldharbor.change_log (table_id, key, op)
            SELECT %s, %s, 'D' FROM old_rows o;
            RETURN NULL;
        END $b$$f$, v_prefix, t.table_id, t.table_id, v_key_o);

    -- An UPDATE that changes a key logs a delete of the old key and an insert of the new one.
    EXECUTE format($f$
        CREATE OR REPLACE FUNCTION %s_upd() RETURNS trigger
        LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $b$
        BEGIN
            INSERT INTO coldharbor.change_log (table_id, key, op)
            SELECT %s,
                   CASE WHEN n.%s IS NULL THEN %s ELSE %s END,
                   CASE WHEN o.%s IS NULL THEN 'I' WHEN n.%s IS NULL THEN 'D' ELSE 'U' END
            FROM new_rows n FULL JOIN old_rows o ON %s;
            RETURN NULL;
        END $b$$f$, v_prefix, t.table_id, v_first, v_key_o, v_key_n, v_first, v_first, v_join);

    -- TRUNCATE fires no row-level work; log a delete for every key it is about to remove. Reading the
    -- table as the schema owner would evaluate row-level security policies as the owner (and see
    -- only the rows they let it): a table with row-level security cannot be truncated.
    EXECUTE format($f$
        CREATE OR REPLACE FUNCTION %s_trunc() RETURNS trigger
        LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $b$
        BEGIN
            IF (SELECT relrowsecurity FROM pg_class WHERE oid = TG_RELID) THEN
                RAISE EXCEPTION 'cannot capture TRUNCATE of %%: it has row-level security; delete the rows instead',
                    TG_RELID::regclass USING ERRCODE = 'feature_not_supported';
            END IF;
            INSERT INTO coldharbor.change_log (table_id, key, op)
            SELECT %s, %s, 'D' FROM %s o;
            RETURN NULL;
        END $b$$f$, v_prefix, t.table_id, v_key_o, v_rel);

    -- Trigger functions cannot be called directly; nobody needs EXECUTE on them anyway.
    FOREACH v_kind IN ARRAY ARRAY['ins', 'upd', 'del', 'trunc'] LOOP
        EXECUTE format('REVOKE ALL ON FUNCTION %s_%s() FROM PUBLIC, coldharbor_pipeline, coldharbor_app',
                       v_prefix, v_kind);
    END LOOP;

    EXECUTE format('CREATE OR REPLACE TRIGGER coldharbor_capture_ins AFTER INSERT ON %s '
                   'REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION %s_ins()',
                   v_rel, v_prefix);
    EXECUTE format('CREATE OR REPLACE TRIGGER coldharbor_capture_upd AFTER UPDATE ON %s '
                   'REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows '
                   'FOR EACH STATEMENT EXECUTE FUNCTION %s_upd()', v_rel, v_prefix);
    EXECUTE format('CREATE OR REPLACE TRIGGER coldharbor_capture_del AFTER DELETE ON %s '
                   'REFERENCING OLD TABLE AS old_rows FOR EACH STATEMENT EXECUTE FUNCTION %s_del()',
                   v_rel, v_prefix);
    EXECUTE format('CREATE OR REPLACE TRIGGER coldharbor_capture_trunc BEFORE TRUNCATE ON %s '
                   'FOR EACH STATEMENT EXECUTE FUNCTION %s_trunc()', v_rel, v_prefix);

    -- A tiered table's writes must not race an eviction unnoticed (evict_guard, below).
    IF t.hot_retention IS NOT NULL THEN
        EXECUTE format('CREATE OR REPLACE TRIGGER coldharbor_evict_guard BEFORE UPDATE OR DELETE ON %s '
                       'FOR EACH STATEMENT EXECUTE FUNCTION coldharbor.evict_guard(%L)', v_rel, t.table_id);
    ELSE
        EXECUTE format('DROP TRIGGER IF EXISTS coldharbor_evict_guard ON %s', v_rel);
    END IF;
END;
$install$;

-- Evicts from the hot tier the rows of one table whose every change is flushed, and was made and
-- flushed before p_cutoff; returns how many rows went (or would go, with p_dry_run). It runs as the
-- schema owner and suspends the capture of this table for its own delete only (capture_suspended).
-- Keys are compared in canonical form (key_sql), and writers racing it are refused (evict_guard).
CREATE OR REPLACE FUNCTION coldharbor.evict(p_table_id integer, p_cutoff timestamptz, p_dry_run boolean DEFAULT false)
RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    t        coldharbor.tables;
    v_rel    text;
    v_key_t  text;
    v_ctids  tid[];
    v_count  bigint;
    v_try    integer;
BEGIN
    SELECT * INTO STRICT t FROM coldharbor.tables WHERE table_id = p_table_id;
    v_rel := format('%I.%I', t.schema_name, t.table_name);
    v_key_t := coldharbor.key_sql(p_table_id, 't');
    PERFORM coldharbor.lock_for_owner_delete(v_rel::regclass);

    -- 0. Writers' transactions on the table hold the eviction lock shared (evict_guard). Try for about
    --    5 s, without queueing (later writers never wait behind eviction), else evict nothing this run.
    IF NOT p_dry_run THEN
        FOR v_try IN 1..50 LOOP
            EXIT WHEN pg_try_advisory_xact_lock(1128792071, p_table_id);   -- 0x43480007: eviction
            IF v_try = 50 THEN
                RAISE NOTICE '%: writers kept the table busy; nothing evicted this run', v_rel;
                RETURN 0;
            END IF;
            PERFORM pg_sleep(0.1);
        END LOOP;
    END IF;

    -- 1. Lock the candidates. A row being written right now is skipped, not waited for.
    EXECUTE format($q$
        SELECT array_agg(ctid) FROM (
            SELECT t.ctid FROM %s t
              JOIN (SELECT key FROM coldharbor.change_log WHERE table_id = %s GROUP BY key
                    HAVING bool_and(flushed_at IS NOT NULL) AND max(flushed_at) < $1 AND max(created_at) < $1) c
                ON c.key = %s
            FOR UPDATE OF t SKIP LOCKED) locked$q$, v_rel, t.table_id, v_key_t)
      INTO v_ctids USING p_cutoff;
    IF v_ctids IS NULL THEN
        RETURN 0;
    END IF;

    -- 2. The rows are locked, so no write can reach them any more; a fresh snapshot (a new
    --    statement) sees every change that committed before the locks were taken. Re-check.
    IF NOT p_dry_run THEN
        INSERT INTO coldharbor.capture_suspended (xact, table_id) VALUES (pg_current_xact_id(), t.table_id);
    END IF;
    EXECUTE format($q$
        %s FROM %s t WHERE t.ctid = ANY ($1)
           AND NOT EXISTS (SELECT 1 FROM coldharbor.change_log c
                            WHERE c.table_id = %s AND c.key = %s
                              AND (c.flushed_at IS NULL OR c.flushed_at >= $2 OR c.created_at >= $2))$q$,
        CASE WHEN p_dry_run THEN 'SELECT 1' ELSE 'DELETE' END, v_rel, t.table_id, v_key_t)
      USING v_ctids, p_cutoff;
    GET DIAGNOSTICS v_count = ROW_COUNT;
    DELETE FROM coldharbor.capture_suspended WHERE xact = pg_current_xact_id() AND table_id = t.table_id;
    IF v_count > 0 AND NOT p_dry_run THEN   -- writers whose snapshot misses this commit get 40001
        INSERT INTO coldharbor.evictions (table_id, xact) VALUES (t.table_id, pg_current_xact_id())
            ON CONFLICT (table_id) DO UPDATE SET xact = EXCLUDED.xact;
    END IF;
    RETURN v_count;
END;
$$;


-- As 009's, with evict_guard among the triggers that may run when the schema owner deletes
-- (owner_delete_refusal) and coldharbor.evictions among the tables only the owner writes.
CREATE OR REPLACE FUNCTION coldharbor.apply_privileges()
RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    r record;
BEGIN
    ALTER SCHEMA coldharbor OWNER TO coldharbor_owner;
    ALTER SCHEMA entities OWNER TO coldharbor_owner;
    ALTER SCHEMA reports OWNER TO coldharbor_owner;
    -- Tables, views and sequences; a sequence owned by a table moves with it, so sequences come last.
    FOR r IN SELECT c.oid::regclass AS rel, c.relkind FROM pg_class c
              WHERE c.relnamespace IN ('coldharbor'::regnamespace, 'entities'::regnamespace)
                AND c.relkind IN ('r', 'p', 'v', 'm', 'f') AND c.relowner <> 'coldharbor_owner'::regrole LOOP
        EXECUTE format('ALTER %s %s OWNER TO coldharbor_owner',
                       CASE r.relkind WHEN 'v' THEN 'VIEW' WHEN 'm' THEN 'MATERIALIZED VIEW'
                                      WHEN 'f' THEN 'FOREIGN TABLE' ELSE 'TABLE' END, r.rel);
    END LOOP;
    FOR r IN SELECT c.oid::regclass AS rel FROM pg_class c
              WHERE c.relnamespace IN ('coldharbor'::regnamespace, 'entities'::regnamespace)
                AND c.relkind = 'S' AND c.relowner <> 'coldharbor_owner'::regrole LOOP
        EXECUTE format('ALTER SEQUENCE %s OWNER TO coldharbor_owner', r.rel);
    END LOOP;
    FOR r IN SELECT p.oid::regprocedure AS fn, p.prokind FROM pg_proc p
              WHERE p.pronamespace = 'coldharbor'::regnamespace AND p.proowner <> 'coldharbor_owner'::regrole LOOP
        EXECUTE format('ALTER %s %s OWNER TO coldharbor_owner',
                       CASE r.prokind WHEN 'p' THEN 'PROCEDURE' WHEN 'a' THEN 'AGGREGATE' ELSE 'FUNCTION' END, r.fn);
    END LOOP;
    -- Report tables are swapped in by the pipeline (drop and rename), which only their owner may do.
    FOR r IN SELECT c.oid::regclass AS rel FROM pg_class c
              WHERE c.relnamespace = 'reports'::regnamespace AND c.relkind IN ('r', 'p')
                AND c.relowner <> 'coldharbor_pipeline'::regrole LOOP
        EXECUTE format('ALTER TABLE %s OWNER TO coldharbor_pipeline', r.rel);
    END LOOP;

    GRANT USAGE ON SCHEMA coldharbor, entities TO coldharbor_pipeline, coldharbor_app;
    GRANT USAGE, CREATE ON SCHEMA reports TO coldharbor_pipeline;

    REVOKE ALL ON ALL FUNCTIONS IN SCHEMA coldharbor FROM PUBLIC;
    FOR r IN SELECT p.oid::regprocedure AS fn, p.prosecdef,
                    p.prorettype IN ('trigger'::regtype, 'event_trigger'::regtype) AS is_trigger
               FROM pg_proc p WHERE p.pronamespace = 'coldharbor'::regnamespace LOOP
        IF r.is_trigger THEN
            EXECUTE format('REVOKE ALL ON FUNCTION %s FROM coldharbor_pipeline, coldharbor_app', r.fn);
        ELSIF NOT r.prosecdef THEN
            EXECUTE format('GRANT EXECUTE ON FUNCTION %s TO coldharbor_pipeline', r.fn);
        END IF;
    END LOOP;
    GRANT EXECUTE ON FUNCTION coldharbor.evict(integer, timestamptz, boolean),
                              coldharbor.purge_rows(integer, jsonb) TO coldharbor_pipeline;
    GRANT EXECUTE ON FUNCTION coldharbor.register_table(regclass, text, text[], text[], interval),
                              coldharbor.register_table_as_owner(regclass, text, text[], text[], interval),
                              coldharbor.check_may_register(regclass, name),
                              coldharbor.grant_capture_privileges(regclass),
                              coldharbor.put_entity(text, jsonb, uuid),
                              coldharbor.delete_entity(uuid) TO coldharbor_app;

    REVOKE ALL ON ALL TABLES IN SCHEMA coldharbor FROM PUBLIC;
    GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA coldharbor TO coldharbor_pipeline;
    GRANT USAGE ON ALL SEQUENCES IN SCHEMA coldharbor TO coldharbor_pipeline;
    -- The registry, the entity store, capture's own state and the migration log are written only by
    -- the owner's functions (and set-up). change_log: the pipeline marks (UPDATE) and prunes
    -- (DELETE); only capture inserts. The registry: the pipeline only advances batch ids
    REVOKE INSERT, UPDATE, DELETE ON coldharbor.tables, coldharbor.entity_schemas, coldharbor.entity_main,
                                     coldharbor.eav_data, coldharbor.schema_migrations,
                                     coldharbor.capture_suspended, coldharbor.evictions FROM coldharbor_pipeline;
    REVOKE INSERT ON coldharbor.change_log FROM coldharbor_pipeline;
    -- ... and records a table's initial load and resync bases (008).
    GRANT UPDATE (last_batch_id, load_state, loaded_at, loaded_version, base_version, base_at, base_rows)
        ON coldharbor.tables TO coldharbor_pipeline;
    -- A resync after a restore moves the change-id sequence past the lake's newest sequence.
    GRANT SELECT, UPDATE ON SEQUENCE coldharbor.change_log_id_seq TO coldharbor_pipeline;
    GRANT SELECT ON ALL TABLES IN SCHEMA entities TO coldharbor_pipeline, coldharbor_app;
END;
$$;

SELECT coldharbor.apply_privileges();

-- Keys already logged: rewritten in canonical form (each element cast back to its column type,
-- which reads any session's text correctly), then capture reinstalled with canonical keys. A table
-- registered with a key type now refused keeps its capture as it was, and is named.
DO $rewrite$
DECLARE
    t       record;
    v_typed text;
BEGIN
    FOR t IN SELECT * FROM coldharbor.tables
              WHERE source_kind = 'table' AND to_regclass(format('%I.%I', schema_name, table_name)) IS NOT NULL LOOP
        BEGIN
            SELECT string_agg(format('(c.key ->> %L)::%s AS %I', k, format_type(a.atttypid, a.atttypmod), k), ', ')
              INTO v_typed
              FROM unnest(t.key_columns) AS k
              JOIN pg_attribute a ON a.attrelid = format('%I.%I', t.schema_name, t.table_name)::regclass AND a.attname = k;
            EXECUTE format($q$
                UPDATE coldharbor.change_log c SET key = v.canonical
                  FROM (SELECT k."coldharbor change id", %s AS canonical
                          FROM (SELECT c.id AS "coldharbor change id", %s FROM coldharbor.change_log c
                                 WHERE c.table_id = %s) k) v
                 WHERE c.id = v."coldharbor change id" AND c.key IS DISTINCT FROM v.canonical$q$,
                coldharbor.key_sql(t.table_id, 'k'), v_typed, t.table_id);
            PERFORM coldharbor.install_capture(t.table_id);
        EXCEPTION WHEN feature_not_supported THEN
            RAISE WARNING '%.%: %; its keys stay as they were, re-register it with a supported key',
                quote_ident(t.schema_name), quote_ident(t.table_name), SQLERRM;
        END;
    END LOOP;
END
$rewrite$;

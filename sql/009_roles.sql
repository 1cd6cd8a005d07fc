-- Least privilege in PostgreSQL (invariant 14).
--
--   coldharbor_owner     NOLOGIN. Owns the schemas coldharbor, entities and reports and every object in
--                        coldharbor and entities. Capture, registration, eviction and purge run as it,
--                        through SECURITY DEFINER functions with a fixed search_path.
--   coldharbor_pipeline  LOGIN, the jobs' role (no superuser; its password is set by set-up, never
--                        here). Reads the schema and the registered tables, writes the jobs' own
--                        state, owns the report tables, may call evict() and purge_rows().
--   coldharbor_app       NOLOGIN group for applications that register their own tables or write
--                        entities: register_table, put_entity, delete_entity. An application that
--                        only writes its registered tables needs nothing: capture runs as the owner.
--
-- Capture used to be suspended by the session setting coldharbor.evicting, which any session could
-- set. It is now suspended only for a (transaction, table) pair recorded in the owner-only table
-- coldharbor.capture_suspended, which only evict() and purge_rows() write, inside their own body.
--
-- Privileges are (re)applied by coldharbor.apply_privileges(), which migrate.py runs after every
-- migration, so objects later migrations create are owned by coldharbor_owner and have no PUBLIC
-- EXECUTE either.

DO $roles$
DECLARE
    r record;
BEGIN
    -- Roles are cluster-wide: another database of the cluster may have created them already.
    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = 'coldharbor_owner') THEN
        CREATE ROLE coldharbor_owner NOLOGIN;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = 'coldharbor_pipeline') THEN
        CREATE ROLE coldharbor_pipeline LOGIN;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = 'coldharbor_app') THEN
        CREATE ROLE coldharbor_app NOLOGIN;
    END IF;
    -- Roles found with more power than they are meant to have are refused, not silently kept.
    FOR r IN SELECT rolname FROM pg_catalog.pg_roles
              WHERE rolname IN ('coldharbor_owner', 'coldharbor_pipeline', 'coldharbor_app')
                AND (rolsuper OR rolcreaterole OR rolcreatedb OR rolreplication OR rolbypassrls) LOOP
        RAISE EXCEPTION 'role % exists with superuser, createrole, createdb, replication or bypassrls; '
                        'coldharbor needs it without', r.rolname
            USING ERRCODE = 'insufficient_privilege',
                  HINT = format('ALTER ROLE %I NOSUPERUSER NOCREATEROLE NOCREATEDB NOREPLICATION NOBYPASSRLS', r.rolname);
    END LOOP;
    IF pg_catalog.pg_has_role('coldharbor_pipeline', 'coldharbor_owner', 'MEMBER')
       OR pg_catalog.pg_has_role('coldharbor_app', 'coldharbor_owner', 'MEMBER') THEN
        RAISE EXCEPTION 'coldharbor_pipeline and coldharbor_app must not be members of coldharbor_owner'
            USING ERRCODE = 'insufficient_privilege';
    END IF;
END
$roles$;

-- One row per transaction and table whose deletes evict() or purge_rows() is making right now.
-- Only the owner may write it; rows live for one statement of one transaction (UNLOGGED: after a
-- crash there is nothing to keep). xid8 never wraps, so a row can never match another transaction.
CREATE UNLOGGED TABLE coldharbor.capture_suspended (
    xact     xid8    NOT NULL,
    table_id integer NOT NULL,
    PRIMARY KEY (xact, table_id)
);

-- Whether the current transaction's deletes from table p_table_id are an eviction or a purge.
CREATE FUNCTION coldharbor.capture_is_suspended(p_table_id integer)
RETURNS boolean
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    SELECT EXISTS (SELECT 1 FROM coldharbor.capture_suspended
                    WHERE xact = pg_current_xact_id() AND table_id = p_table_id)
$$;

-- Why reading p_table could run code of its owner's as the reader, or NULL: a view runs its functions,
-- and row-level security policies are evaluated, as whoever reads. The pipeline reads registered
-- tables (export, reports, purge) and the schema owner reads them (TRUNCATE capture, eviction), so a
-- registered name must stay a table without row-level security. Readers lock the table first
-- (ACCESS SHARE conflicts with enabling row-level security, creating policies, dropping the table),
-- so the answer holds for their transaction.
CREATE FUNCTION coldharbor.read_refusal(p_table regclass)
RETURNS text
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $$
    SELECT CASE WHEN c.relkind NOT IN ('r', 'p') THEN format('%s is not a table (relkind %s)', c.oid::regclass, c.relkind)
                WHEN c.relrowsecurity THEN format('%s has row-level security', c.oid::regclass)
                -- Rows of an inheritance child read as the table's but are written past its capture
                -- triggers; a rule can route a write elsewhere (an outside review wrote uncaptured rows so).
                WHEN EXISTS (SELECT 1 FROM pg_inherits i JOIN pg_class k ON k.oid = i.inhrelid
                              WHERE i.inhparent = c.oid AND NOT k.relispartition)
                    THEN format('%s has inheritance children, whose rows capture does not see', c.oid::regclass)
                WHEN EXISTS (SELECT 1 FROM pg_rewrite r WHERE r.ev_class = c.oid AND r.rulename <> '_RETURN')
                    THEN format('%s has a rule, which can route writes around capture', c.oid::regclass) END
      FROM pg_class c WHERE c.oid = p_table
$$;

-- Why the schema owner must not delete rows of p_table (eviction, purge), or NULL. Triggers and rules
-- run as the user whose statement fires them, and row-level security policies are evaluated as the
-- querying user: a trigger or rule on DELETE, or a policy, that the table's owner put on the table
-- (or on a partition or child of it) would run its code with the schema owner's privileges. Only the
-- capture triggers may run there. Callers lock the table first (SHARE UPDATE EXCLUSIVE, which
-- conflicts with creating, enabling or replacing triggers, rules and policies and with attaching
-- partitions), so the answer holds until they commit.
CREATE FUNCTION coldharbor.owner_delete_refusal(p_table regclass)
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
                                    AND proname ~ '^capture_[0-9]+_(ins|upd|del|trunc)$')
          LIMIT 1),
        (SELECT format('rule %s on %s runs on DELETE', quote_ident(r.rulename), r.ev_class::regclass)
           FROM members m JOIN pg_rewrite r ON r.ev_class = m.relid WHERE r.ev_type = '4' LIMIT 1))
$$;

-- Raises unless the schema owner may delete rows of p_table (see owner_delete_refusal); takes the lock
-- that keeps it so.
CREATE FUNCTION coldharbor.lock_for_owner_delete(p_table regclass)
RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_refusal text;
BEGIN
    EXECUTE format('LOCK TABLE %s IN SHARE UPDATE EXCLUSIVE MODE', p_table);
    v_refusal := coldharbor.owner_delete_refusal(p_table);
    IF v_refusal IS NOT NULL THEN
        RAISE EXCEPTION 'cannot evict from or purge %: %, and eviction and purge delete as the schema owner, '
                        'whose privileges that code would run with', p_table, v_refusal
            USING ERRCODE = 'insufficient_privilege',
                  HINT = 'Drop it, or give the table no hot retention and purge it by hand as its owner.';
    END IF;
END;
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
    v_key_n  text;      -- jsonb key built from alias n
    v_key_o  text;      -- jsonb key built from alias o
    v_join   text;
    v_first  text;
    v_kind   text;
BEGIN
    SELECT * INTO STRICT t FROM coldharbor.tables WHERE table_id = p_table_id;
    v_rel := format('%I.%I', t.schema_name, t.table_name);
    v_prefix := format('coldharbor.capture_%s', t.table_id);
    SELECT 'jsonb_build_object(' || string_agg(format('%L, n.%I', c, c), ', ') || ')',
           'jsonb_build_object(' || string_agg(format('%L, o.%I', c, c), ', ') || ')',
           string_agg(format('n.%I = o.%I', c, c), ' AND ')
      INTO v_key_n, v_key_o, v_join
      FROM unnest(t.key_columns) AS c;
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
END;
$install$;

-- Evicts from the hot tier the rows of one table whose every change is flushed, and was made and
-- flushed before p_cutoff; returns how many rows went (or would go, with p_dry_run). As 004's
-- version, but it runs as the schema owner and suspends the capture of this table for its own
-- delete only (capture_suspended), instead of setting a session variable anyone could set.
CREATE OR REPLACE FUNCTION coldharbor.evict(p_table_id integer, p_cutoff timestamptz, p_dry_run boolean DEFAULT false)
RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    t        coldharbor.tables;
    v_rel    text;
    v_key_t  text;
    v_ctids  tid[];
    v_count  bigint;
BEGIN
    SELECT * INTO STRICT t FROM coldharbor.tables WHERE table_id = p_table_id;
    v_rel := format('%I.%I', t.schema_name, t.table_name);
    SELECT 'jsonb_build_object(' || string_agg(format('%L, t.%I', c, c), ', ') || ')'
      INTO v_key_t FROM unnest(t.key_columns) AS c;
    PERFORM coldharbor.lock_for_owner_delete(v_rel::regclass);

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
    RETURN v_count;
END;
$$;

-- Purge's PostgreSQL delete: removes, logging no change, the rows of one registered table or entity
-- schema that are still exactly as the purge job read them. p_rows is a JSON array of row images
-- (to_jsonb of each row of the table, or of the entity view, read by the caller in its own
-- transaction); a row changed since it was read is left alone (the purge then finds it and says so).
-- Returns the 1-based positions in p_rows of the rows it deleted. No SQL text crosses this call:
-- the predicate is evaluated by the caller, with the caller's privileges.
CREATE FUNCTION coldharbor.purge_rows(p_table_id integer, p_rows jsonb)
RETURNS SETOF bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    t        coldharbor.tables;
    v_rel    text;
    v_match  text;
BEGIN
    SELECT * INTO STRICT t FROM coldharbor.tables WHERE table_id = p_table_id;
    IF jsonb_typeof(p_rows) IS DISTINCT FROM 'array' THEN
        RAISE EXCEPTION 'purge_rows: p_rows must be a JSON array of row images, got %', coalesce(jsonb_typeof(p_rows), 'NULL')
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    v_rel := format('%I.%I', t.schema_name, t.table_name);
    SELECT string_agg(format('t.%I = k.%I', c, c), ' AND ') INTO v_match FROM unnest(t.key_columns) AS c;
    IF t.source_kind <> 'entity' THEN
        PERFORM coldharbor.lock_for_owner_delete(v_rel::regclass);
    END IF;
    INSERT INTO coldharbor.capture_suspended (xact, table_id) VALUES (pg_current_xact_id(), t.table_id);
    IF t.source_kind = 'entity' THEN
        RETURN QUERY EXECUTE format($q$
            DELETE FROM coldharbor.entity_main m USING (
                SELECT r.n, t.row_id
                  FROM jsonb_array_elements($1) WITH ORDINALITY AS r(img, n)
                 CROSS JOIN LATERAL jsonb_populate_record(NULL::%1$s, r.img) AS k
                  JOIN %1$s t ON %2$s AND to_jsonb(t) = r.img) s
             WHERE m.row_id = s.row_id
            RETURNING s.n$q$, v_rel, v_match) USING p_rows;
    ELSE
        RETURN QUERY EXECUTE format($q$
            DELETE FROM %1$s t
             USING jsonb_array_elements($1) WITH ORDINALITY AS r(img, n)
             CROSS JOIN LATERAL jsonb_populate_record(NULL::%1$s, r.img) AS k
             WHERE %2$s AND to_jsonb(t) = r.img
            RETURNING r.n$q$, v_rel, v_match) USING p_rows;
    END IF;
    DELETE FROM coldharbor.capture_suspended WHERE xact = pg_current_xact_id() AND table_id = t.table_id;
END;
$$;

-- Entity records: deleting records deletes their eav_data rows; a purge's delete logs nothing.
CREATE OR REPLACE FUNCTION coldharbor.capture_entity_main_del() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    DELETE FROM coldharbor.eav_data e USING old_rows o WHERE e.row_id = o.row_id;
    PERFORM coldharbor.entity_log('D', array_agg(o.row_id), array_agg(o.schema_id))
       FROM old_rows o JOIN coldharbor.entity_schemas s USING (schema_id)
      WHERE s.table_id IS NULL OR NOT coldharbor.capture_is_suspended(s.table_id);
    RETURN NULL;
END;
$$;

-- Registration.
--
-- Who may register a table: its owner (a role whose privileges include the owner's), or a
-- superuser. Registering lets the pipeline read the table and sends its rows to the lake, so nobody
-- else may, and a registration is changed only by the same people. Only an administrator (a
-- superuser or a member of coldharbor_owner) may choose a lake location: a location that is another
-- table's would mix the two tables' rows in one lake table.
--
-- Registration runs in two halves. register_table runs as its caller (the table's owner), who
-- alone can grant on the table: it grants the pipeline SELECT and the schema owner what capture,
-- eviction and purge need. register_table_as_owner then runs as the schema owner: it checks the
-- session again (it may be called directly) and runs the registration body, renamed here
-- register_table_unchecked and executable by the owner alone.
ALTER FUNCTION coldharbor.register_table(regclass, text, text[], text[], interval) RENAME TO register_table_unchecked;
-- 004's wrapper made install_capture call this; the install_capture above replaces both.
DROP FUNCTION coldharbor.install_capture_v1(integer);
ALTER FUNCTION coldharbor.register_table_unchecked(regclass, text, text[], text[], interval)
    SET search_path = pg_catalog, pg_temp;

-- Raises unless p_role may act as the owner of p_table.
CREATE FUNCTION coldharbor.check_may_register(p_table regclass, p_role name)
RETURNS void
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_owner name;
BEGIN
    SELECT pg_get_userbyid(relowner) INTO STRICT v_owner FROM pg_class WHERE oid = p_table;
    IF NOT pg_has_role(p_role, v_owner, 'USAGE') THEN
        RAISE EXCEPTION 'cannot register %: role % does not own it (its owner is %)', p_table, p_role, v_owner
            USING ERRCODE = 'insufficient_privilege',
                  HINT = 'Only the owner of a table (or a superuser) may register it.';
    END IF;
END;
$$;

-- Grants what the jobs and capture need on one table: SELECT to the pipeline (export, reports,
-- purge's read); SELECT, DELETE, TRIGGER and UPDATE of the key columns to the schema owner
-- (capture triggers, TRUNCATE capture, eviction's row locks and deletes, purge's delete); USAGE on
-- the table's schema to both. Runs as its caller, who must be able to grant them (the table's
-- owner, or a superuser).
CREATE FUNCTION coldharbor.grant_capture_privileges(p_table regclass)
RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_schema oid;
    v_keys   text;
BEGIN
    SELECT relnamespace INTO STRICT v_schema FROM pg_class WHERE oid = p_table;
    IF NOT (has_schema_privilege('coldharbor_owner', v_schema, 'USAGE')
            AND has_schema_privilege('coldharbor_pipeline', v_schema, 'USAGE')) THEN
        BEGIN
            EXECUTE format('GRANT USAGE ON SCHEMA %s TO coldharbor_owner, coldharbor_pipeline', v_schema::regnamespace);
        EXCEPTION WHEN insufficient_privilege THEN
            NULL;   -- said below, with the way out
        END;
        IF NOT (has_schema_privilege('coldharbor_owner', v_schema, 'USAGE')
                AND has_schema_privilege('coldharbor_pipeline', v_schema, 'USAGE')) THEN
            RAISE EXCEPTION 'cannot register %: roles coldharbor_owner and coldharbor_pipeline need USAGE on schema %, '
                            'which only its owner can grant', p_table, v_schema::regnamespace
                USING ERRCODE = 'insufficient_privilege',
                      HINT = format('GRANT USAGE ON SCHEMA %s TO coldharbor_owner, coldharbor_pipeline;', v_schema::regnamespace);
        END IF;
    END IF;
    EXECUTE format('GRANT SELECT ON %s TO coldharbor_pipeline', p_table);
    EXECUTE format('GRANT SELECT, DELETE, TRIGGER ON %s TO coldharbor_owner', p_table);
    SELECT string_agg(quote_ident(a.attname), ', ') INTO v_keys
      FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY (i.indkey)
     WHERE i.indrelid = p_table AND i.indisprimary;
    IF v_keys IS NOT NULL THEN   -- without a key the registration itself refuses the table
        EXECUTE format('GRANT UPDATE (%s) ON %s TO coldharbor_owner', v_keys, p_table);
    END IF;
END;
$$;

CREATE FUNCTION coldharbor.register_table_as_owner(
    p_table         regclass,
    p_lake_location text,
    p_partition_by  text[],
    p_sort_by       text[],
    p_hot_retention interval)
RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    -- session_user: the login that called, whatever this function runs as.
    PERFORM coldharbor.check_may_register(p_table, session_user);
    IF p_lake_location IS NOT NULL AND NOT pg_has_role(session_user, 'coldharbor_owner', 'USAGE')
       AND p_lake_location IS DISTINCT FROM (
           SELECT t.lake_location FROM coldharbor.tables t JOIN pg_class c ON c.relname = t.table_name
             JOIN pg_namespace n ON n.oid = c.relnamespace AND n.nspname = t.schema_name
            WHERE c.oid = p_table) THEN
        RAISE EXCEPTION 'cannot register %: only an administrator may choose its lake location', p_table
            USING ERRCODE = 'insufficient_privilege',
                  HINT = 'Leave p_lake_location out: the table goes to <lake root>/<schema>/<table>, a place no other table has.';
    END IF;
    IF NOT (has_table_privilege('coldharbor_owner', p_table, 'TRIGGER')
            AND has_table_privilege('coldharbor_pipeline', p_table, 'SELECT')) THEN
        RAISE EXCEPTION 'cannot register %: its owner has not granted what capture and export need', p_table
            USING ERRCODE = 'insufficient_privilege',
                  HINT = 'Register it with coldharbor.register_table(...), which grants them.';
    END IF;
    RETURN coldharbor.register_table_unchecked(p_table, p_lake_location, p_partition_by, p_sort_by, p_hot_retention);
END;
$$;

-- Registers a table for capture and export; returns its table_id. Registering again updates the
-- settings and reinstalls the triggers. Fails, naming the problem, when the caller does not own the
-- table, the table has no primary key, a column type does not round-trip, or a partition or sort
-- column is not allowed; nothing is granted then either (one statement).
CREATE FUNCTION coldharbor.register_table(
    p_table         regclass,
    p_lake_location text     DEFAULT NULL,
    p_partition_by  text[]   DEFAULT '{}',
    p_sort_by       text[]   DEFAULT '{}',
    p_hot_retention interval DEFAULT NULL)
RETURNS integer
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM coldharbor.check_may_register(p_table, current_user);
    PERFORM coldharbor.grant_capture_privileges(p_table);
    RETURN coldharbor.register_table_as_owner(p_table, p_lake_location, p_partition_by, p_sort_by, p_hot_retention);
END;
$$;

-- Entities: the write helpers and the schema definitions run as the owner, so applications need
-- no privilege on entity_main and eav_data, and generated views and indexes belong to the owner.
ALTER FUNCTION coldharbor.put_entity(text, jsonb, uuid) SECURITY DEFINER SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION coldharbor.delete_entity(uuid) SECURITY DEFINER SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION coldharbor.define_entity_schema(text, jsonb, text[]) SECURITY DEFINER SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION coldharbor.register_entity_schema(text, text, text[]) SECURITY DEFINER SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION coldharbor.entity_refresh_view(text) SECURITY DEFINER SET search_path = pg_catalog, pg_temp;

-- Capture is protected against other sessions and settings by the above. Against the owner of a
-- registered table, who may alter its own table, event triggers (only a superuser can create,
-- alter or drop one) refuse the DDL that would stop capture: dropping, disabling or replacing a
-- capture trigger, or renaming or moving the table away from its registration. They also keep
-- schema reports, where the pipeline may create tables, free of anything that runs code.
CREATE FUNCTION coldharbor.guard_capture()
RETURNS event_trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    r record;
BEGIN
    IF TG_EVENT = 'sql_drop' THEN
        -- A capture trigger may go only with its table.
        SELECT d.object_identity, t.schema_name, t.table_name INTO r
          FROM pg_event_trigger_dropped_objects() d
          JOIN coldharbor.tables t ON t.source_kind = 'table'
                                  AND t.schema_name = d.address_names[1] AND t.table_name = d.address_names[2]
         WHERE d.object_type = 'trigger' AND d.address_names[3] LIKE 'coldharbor\_capture\_%'
           AND NOT EXISTS (SELECT 1 FROM pg_event_trigger_dropped_objects() x
                            WHERE x.object_type IN ('table', 'partitioned table')
                              AND x.address_names = d.address_names[1:2])
         LIMIT 1;
        IF FOUND THEN
            RAISE EXCEPTION 'cannot drop trigger %: it captures the changes of %.%, which is registered with coldharbor',
                r.object_identity, quote_ident(r.schema_name), quote_ident(r.table_name)
                USING ERRCODE = 'insufficient_privilege',
                      HINT = 'Capture is part of the table''s registration; see README, "Roles and privileges".';
        END IF;
        RETURN;
    END IF;

    -- Report tables are read by people with more privileges than the pipeline that writes them: in
    -- schema reports only tables (and their indexes and sequences) may be made, except by a
    -- superuser. A view, function or policy there would run its code as whoever reads it.
    -- (A policy, rule or trigger has no schema of its own: it is its table's.)
    SELECT c.object_type, c.object_identity INTO r
      FROM pg_event_trigger_ddl_commands() c
     WHERE c.object_type NOT IN ('table', 'index', 'sequence', 'table constraint', 'table column')
       AND 'reports' = coalesce(c.schema_name,
               (SELECT n.nspname FROM pg_class t JOIN pg_namespace n ON n.oid = t.relnamespace
                 WHERE t.oid = CASE c.classid
                                   WHEN 'pg_policy'::regclass THEN (SELECT polrelid FROM pg_policy WHERE oid = c.objid)
                                   WHEN 'pg_rewrite'::regclass THEN (SELECT ev_class FROM pg_rewrite WHERE oid = c.objid)
                                   WHEN 'pg_trigger'::regclass THEN (SELECT tgrelid FROM pg_trigger WHERE oid = c.objid)
                               END))
       AND NOT (SELECT rolsuper FROM pg_roles WHERE rolname = session_user)
     LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'cannot create % % in schema reports: it holds report tables only', r.object_type, r.object_identity
            USING ERRCODE = 'insufficient_privilege';
    END IF;

    -- Every trigger of the tables the command touched that is, or should be, a capture trigger.
    FOR r IN
        WITH touched AS (
            SELECT c.objid AS relid FROM pg_event_trigger_ddl_commands() c WHERE c.classid = 'pg_class'::regclass
            UNION
            SELECT tg.tgrelid FROM pg_event_trigger_ddl_commands() c JOIN pg_trigger tg ON tg.oid = c.objid
             WHERE c.classid = 'pg_trigger'::regclass),
        triggers AS (
            SELECT tg.tgname, tg.tgenabled, tg.tgfoid, n.nspname, cl.relname,
                   CASE WHEN p.pronamespace = 'coldharbor'::regnamespace
                        THEN substring(p.proname FROM '^capture_([0-9]+)_(?:ins|upd|del|trunc)$')::integer END AS fn_table_id,
                   CASE WHEN p.pronamespace = 'coldharbor'::regnamespace
                        THEN substring(p.proname FROM '^capture_[0-9]+_(ins|upd|del|trunc)$') END AS fn_kind,
                   substring(tg.tgname FROM '^coldharbor_capture_(ins|upd|del|trunc)$') AS tg_kind
              FROM touched
              JOIN pg_trigger tg ON tg.tgrelid = touched.relid AND NOT tg.tgisinternal
              JOIN pg_class cl ON cl.oid = tg.tgrelid
              JOIN pg_namespace n ON n.oid = cl.relnamespace
              JOIN pg_proc p ON p.oid = tg.tgfoid)
        SELECT g.*, owner.table_id AS owner_table_id, owner.schema_name AS owner_schema, owner.table_name AS owner_table,
               here.table_id AS here_table_id
          FROM triggers g
          LEFT JOIN coldharbor.tables owner ON owner.table_id = g.fn_table_id
          LEFT JOIN coldharbor.tables here ON here.source_kind = 'table'
                                           AND here.schema_name = g.nspname AND here.table_name = g.relname
         WHERE g.fn_table_id IS NOT NULL OR (g.tg_kind IS NOT NULL AND here.table_id IS NOT NULL)
    LOOP
        IF r.owner_table_id IS NOT NULL AND (r.owner_schema, r.owner_table) <> (r.nspname, r.relname) THEN
            RAISE EXCEPTION 'cannot rename or move table %.%: it is registered with coldharbor under that name',
                quote_ident(r.owner_schema), quote_ident(r.owner_table)
                USING ERRCODE = 'insufficient_privilege';
        END IF;
        IF r.tgenabled NOT IN ('O', 'A') THEN
            RAISE EXCEPTION 'cannot disable trigger % on %.%: it captures the changes of a table registered with coldharbor',
                quote_ident(r.tgname), quote_ident(r.nspname), quote_ident(r.relname)
                USING ERRCODE = 'insufficient_privilege';
        END IF;
        IF r.here_table_id IS NOT NULL
           AND (r.fn_table_id IS DISTINCT FROM r.here_table_id OR r.fn_kind IS DISTINCT FROM r.tg_kind) THEN
            RAISE EXCEPTION 'cannot change trigger % on %.%: it captures the changes of a table registered with coldharbor',
                quote_ident(r.tgname), quote_ident(r.nspname), quote_ident(r.relname)
                USING ERRCODE = 'insufficient_privilege';
        END IF;
    END LOOP;
END;
$$;

-- Creating an event trigger needs a superuser; a migration run by a non-superuser admin leaves the
-- guard out and says so (README, "Roles and privileges": what is and is not protected).
DO $guard$
BEGIN
    IF (SELECT rolsuper FROM pg_catalog.pg_roles WHERE rolname = current_user) THEN
        CREATE EVENT TRIGGER coldharbor_guard_capture_ddl ON ddl_command_end
            EXECUTE FUNCTION coldharbor.guard_capture();
        CREATE EVENT TRIGGER coldharbor_guard_capture_drop ON sql_drop
            EXECUTE FUNCTION coldharbor.guard_capture();
    ELSE
        RAISE WARNING 'not a superuser: the event triggers that keep table owners from dropping or disabling '
                      'capture triggers were not created; a superuser can create them later (see README)';
    END IF;
END
$guard$;

-- (Re)applies ownership and privileges; idempotent. migrate.py runs it after every migration, so
-- whatever a later migration creates is owned by coldharbor_owner and has no PUBLIC EXECUTE.
--   functions  no PUBLIC EXECUTE on any. The pipeline may execute every function that runs with
--              its caller's privileges (SECURITY INVOKER: it can do nothing through one that it
--              could not do itself) except trigger functions; of the SECURITY DEFINER ones, only
--              those granted to it by name (evict, purge_rows). coldharbor_app: register_table,
--              put_entity, delete_entity.
--   tables     the pipeline reads every table of the schema and writes the jobs' own state; the
--              tables that define what is captured and registered are the owner's alone.
CREATE FUNCTION coldharbor.apply_privileges()
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
                                     coldharbor.capture_suspended FROM coldharbor_pipeline;
    REVOKE INSERT ON coldharbor.change_log FROM coldharbor_pipeline;
    -- ... and records a table's initial load and resync bases (008).
    GRANT UPDATE (last_batch_id, load_state, loaded_at, loaded_version, base_version, base_at, base_rows)
        ON coldharbor.tables TO coldharbor_pipeline;
    -- A resync after a restore moves the change-id sequence past the lake's newest sequence.
    GRANT SELECT, UPDATE ON SEQUENCE coldharbor.change_log_id_seq TO coldharbor_pipeline;
    GRANT SELECT ON ALL TABLES IN SCHEMA entities TO coldharbor_pipeline, coldharbor_app;
END;
$$;

-- Objects the owner creates while running (capture functions, entity views) get the same.
ALTER DEFAULT PRIVILEGES FOR ROLE coldharbor_owner REVOKE EXECUTE ON FUNCTIONS FROM PUBLIC;
ALTER DEFAULT PRIVILEGES FOR ROLE coldharbor_owner IN SCHEMA coldharbor
    GRANT SELECT ON TABLES TO coldharbor_pipeline;
ALTER DEFAULT PRIVILEGES FOR ROLE coldharbor_owner IN SCHEMA entities
    GRANT SELECT ON TABLES TO coldharbor_pipeline, coldharbor_app;

SELECT coldharbor.apply_privileges();

-- Tables registered before this migration: the grants registration now makes, then capture
-- reinstalled as the owner (the delete trigger no longer reads coldharbor.evicting).
SELECT coldharbor.grant_capture_privileges(format('%I.%I', schema_name, table_name)::regclass)
  FROM coldharbor.tables
 WHERE source_kind = 'table' AND to_regclass(format('%I.%I', schema_name, table_name)) IS NOT NULL;
SELECT coldharbor.install_capture(table_id)
  FROM coldharbor.tables
 WHERE source_kind = 'table' AND to_regclass(format('%I.%I', schema_name, table_name)) IS NOT NULL;

-- Exact history (issue 26, part 1): a table registered with p_history => 'exact' keeps the row
-- image of every insert and update in its change_log row, so the export can write one lake row per
-- change (not one per key per batch) and an as-of report can be answered for any instant inside the
-- history window, however often a key changed between two exports.
--
-- The image is row_to_json(n.*) of the row as the statement's transition table holds it, kept as json (not
-- jsonb): json keeps each value's text as PostgreSQL printed it (floats with extra_float_digits = 3,
-- set on the logging functions: the writer's session may have fewer), and the export reads it back
-- through the column type's input function (`(image ->> 'c')::type`), which gives the same value
-- for every type the lake accepts (a float's -0, NaN and infinities, dates before Christ). What an
-- image cannot hold, exact history refuses at registration, naming the column: a virtual generated
-- column (a transition table holds NULL there), a json column (the spaces around its value are
-- lost), and a nullable jsonb column (SQL NULL and JSON null both print null). The export treats an
-- image as none when such a column appeared since (`hot_reader._image_usable`).
--
-- 'latest' (the default, and every table registered before) logs no image, exactly as before.
-- Changing a table's history reinstalls its capture; images logged before a rebase request (DDL
-- that changed rows without writing them, a rename) are not used: they hold the old shape.

ALTER TABLE coldharbor.tables ADD COLUMN history text NOT NULL DEFAULT 'latest'
    CONSTRAINT tables_history_check CHECK (history IN ('latest', 'exact'));
ALTER TABLE coldharbor.change_log ADD COLUMN image json;   -- exact history: the row after an insert or update

-- Raises, naming the column, when a column of p_table cannot be captured as an image exactly.
CREATE FUNCTION coldharbor.check_exact_history(p_table regclass)
RETURNS void
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    r record;
BEGIN
    -- The first column an image cannot hold, and why (a virtual generated column: NULL in a
    -- statement's transition table; json: the spaces around a value are lost; a nullable jsonb:
    -- SQL NULL and JSON null print alike).
    SELECT a.attname::text AS name, format_type(b.base_type, b.base_typmod) AS pg_type,
           CASE WHEN a.attgenerated = 'v' THEN 'virtual' WHEN b.base_type = 'json'::regtype THEN 'json'
                ELSE 'nullable' END AS why INTO r
      FROM pg_attribute a CROSS JOIN LATERAL coldharbor.base_type(a.atttypid, a.atttypmod) b
     WHERE a.attrelid = p_table AND a.attnum > 0 AND NOT a.attisdropped
       AND (a.attgenerated = 'v' OR b.base_type = 'json'::regtype
            OR (b.base_type = 'jsonb'::regtype AND NOT a.attnotnull))
     ORDER BY a.attgenerated <> 'v', b.base_type <> 'json'::regtype, a.attnum LIMIT 1;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    IF r.why = 'virtual' THEN
        RAISE EXCEPTION 'cannot keep exact history of %: column % is a virtual generated column, which a row '
                        'image does not hold', p_table, quote_ident(r.name)
            USING ERRCODE = 'feature_not_supported',
                  HINT = 'Make it STORED, or register the table without p_history => ''exact''.';
    ELSIF r.why = 'json' THEN
        RAISE EXCEPTION 'cannot keep exact history of %: column % is json, whose text a row image does not keep '
                        'exactly (the spaces around a value are lost)', p_table, quote_ident(r.name)
            USING ERRCODE = 'feature_not_supported',
                  HINT = 'Use jsonb, or register the table without p_history => ''exact''.';
    END IF;
    RAISE EXCEPTION 'cannot keep exact history of %: column % (%) may be NULL, and a row image cannot tell '
                    'its SQL NULL from a JSON null', p_table, quote_ident(r.name), r.pg_type
        USING ERRCODE = 'feature_not_supported',
              HINT = format('Make it NOT NULL (ALTER TABLE %s ALTER COLUMN %s SET NOT NULL), or register the '
                            'table without p_history => ''exact''.', p_table, quote_ident(r.name));
END;
$$;

-- Sets the history a registered table keeps ('latest' or 'exact'), as the schema owner, for a
-- caller who may register it; reinstalls its capture when it changes.
CREATE FUNCTION coldharbor.set_history_as_owner(p_table regclass, p_history text)
RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_id integer;
    v_history text;
BEGIN
    PERFORM coldharbor.check_may_register(p_table, session_user);
    IF p_history IS NULL OR p_history NOT IN ('latest', 'exact') THEN
        RAISE EXCEPTION 'cannot register %: p_history must be ''latest'' or ''exact'', not %', p_table,
            coalesce(quote_literal(p_history), 'NULL')
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = '''exact'' keeps every change''s row image, so as-of reports are exact at any instant; '
                      || '''latest'' (the default) keeps the newest image of a key per export.';
    END IF;
    SELECT table_id, history INTO v_id, v_history FROM coldharbor.tables
     WHERE source_kind = 'table' AND relid = p_table::oid;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'cannot set the history of %: it is not a registered table', p_table
            USING ERRCODE = 'undefined_object',
                  HINT = 'Register it with coldharbor.register_table(..., p_history => ...).';
    END IF;
    IF p_history = 'exact' THEN
        PERFORM coldharbor.check_exact_history(p_table);
    END IF;
    IF v_history IS DISTINCT FROM p_history THEN
        UPDATE coldharbor.tables SET history = p_history WHERE table_id = v_id;
        PERFORM coldharbor.install_capture(v_id);
    END IF;
END;
$$;

-- As 009's, with p_history (NULL: a new registration keeps 'latest', a registration again keeps
-- what the table had).
DROP FUNCTION coldharbor.register_table(regclass, text, text[], text[], interval);
CREATE FUNCTION coldharbor.register_table(
    p_table         regclass,
    p_lake_location text     DEFAULT NULL,
    p_partition_by  text[]   DEFAULT '{}',
    p_sort_by       text[]   DEFAULT '{}',
    p_hot_retention interval DEFAULT NULL,
    p_history       text     DEFAULT NULL)
RETURNS integer
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_id integer;
BEGIN
    PERFORM coldharbor.check_may_register(p_table, current_user);
    PERFORM coldharbor.grant_capture_privileges(p_table);
    v_id := coldharbor.register_table_as_owner(p_table, p_lake_location, p_partition_by, p_sort_by, p_hot_retention);
    IF p_history IS NOT NULL THEN
        PERFORM coldharbor.set_history_as_owner(p_table, p_history);
    END IF;
    RETURN v_id;
END;
$$;

-- As 013's, logging the row image of inserts and updates for a table with exact history.
CREATE OR REPLACE FUNCTION coldharbor.install_capture(p_table_id integer)
RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $install$
DECLARE
    t        coldharbor.tables;
    v_prefix text;
    v_key_n  text;      -- canonical key built from alias n (key_sql)
    v_key_o  text;      -- canonical key built from alias o
    v_join   text;
    v_first  text;
    v_kind   text;
    v_tree   oid[];
    v_image  text;      -- the row image an insert or update logs: row_to_json(n), or NULL
BEGIN
    SELECT * INTO STRICT t FROM coldharbor.tables WHERE table_id = p_table_id;
    v_prefix := format('coldharbor.capture_%s', t.table_id);
    v_key_n := coldharbor.key_sql(p_table_id, 'n');
    v_key_o := coldharbor.key_sql(p_table_id, 'o');
    SELECT string_agg(format('n.%I = o.%I', c, c), ' AND ') INTO v_join FROM unnest(t.key_columns) AS c;
    v_first := quote_ident(t.key_columns[1]);
    v_image := CASE t.history WHEN 'exact' THEN 'row_to_json(n.*)' ELSE 'NULL::json' END;  -- n.*: a column may be named n

    EXECUTE format($f$
        CREATE OR REPLACE FUNCTION %s_ins() RETURNS trigger
        LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp SET extra_float_digits = 3 AS $b$
        BEGIN
            INSERT INTO coldharbor.change_log (table_id, key, op, image)
            SELECT %s, %s, 'I', %s FROM new_rows n;
            RETURN NULL;
        END $b$$f$, v_prefix, t.table_id, v_key_n, v_image);

    -- Eviction is not deletion (invariant 10): deletes that evict() or purge_rows() make log nothing.
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
        LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp SET extra_float_digits = 3 AS $b$
        BEGIN
            INSERT INTO coldharbor.change_log (table_id, key, op, image)
            SELECT %s,
                   CASE WHEN n.%s IS NULL THEN %s ELSE %s END,
                   CASE WHEN o.%s IS NULL THEN 'I' WHEN n.%s IS NULL THEN 'D' ELSE 'U' END,
                   CASE WHEN n.%s IS NOT NULL THEN %s END
            FROM new_rows n FULL JOIN old_rows o ON %s;
            RETURN NULL;
        END $b$$f$, v_prefix, t.table_id, v_first, v_key_o, v_key_n, v_first, v_first, v_first, v_image, v_join);

    -- TRUNCATE fires no row-level work; log a delete for every key it is about to remove. It fires
    -- this trigger on every relation it empties: each logs the rows it holds itself (log_rows).
    EXECUTE format($f$
        CREATE OR REPLACE FUNCTION %s_trunc() RETURNS trigger
        LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $b$
        BEGIN
            PERFORM coldharbor.log_rows(%s, TG_RELID, 'D', 'TRUNCATE');
            RETURN NULL;
        END $b$$f$, v_prefix, t.table_id);

    -- Trigger functions cannot be called directly; nobody needs EXECUTE on them anyway.
    FOREACH v_kind IN ARRAY ARRAY['ins', 'upd', 'del', 'trunc'] LOOP
        EXECUTE format('REVOKE ALL ON FUNCTION %s_%s() FROM PUBLIC, coldharbor_pipeline, coldharbor_app',
                       v_prefix, v_kind);
    END LOOP;

    v_tree := ARRAY(SELECT m FROM coldharbor.capture_tree(p_table_id) AS m ORDER BY m);   -- sorted, as capture_partitions compares it
    PERFORM coldharbor.capture_relation(p_table_id, m) FROM unnest(v_tree) AS m;
    PERFORM coldharbor.release_relation(m)
       FROM unnest(t.capture_relations) AS m
      WHERE m <> ALL (v_tree) AND EXISTS (SELECT 1 FROM pg_class WHERE oid = m);
    UPDATE coldharbor.tables SET capture_relations = v_tree WHERE table_id = p_table_id;
END;
$install$;

-- As 011's, granting the register_table of this file and set_history_as_owner.
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
    GRANT EXECUTE ON FUNCTION coldharbor.register_table(regclass, text, text[], text[], interval, text),
                              coldharbor.set_history_as_owner(regclass, text),
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

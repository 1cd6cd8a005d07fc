-- The capture of a registered table: every change lands in coldharbor.change_log in its own
-- transaction, through statement-level triggers on the table and each of its partitions.
-- (Definitions: each object here only, CREATE OR REPLACE; see sql/README.md.)

-- (Re)creates the capture of one registered table: four trigger functions owned by the schema owner
-- (SECURITY DEFINER, fixed search_path, no EXECUTE for anyone else) and, on the table and every
-- partition of it, the statement-level triggers calling them (capture_relation). Records the
-- relations it covers; one that left the tree since (detached while no event trigger watched) gets
-- inert triggers. Logs no rows: rows a table held at registration reach the lake by its initial load.
-- Since 021: logging the row image of inserts and updates for a table with exact history.
-- Since 024: logging the hash of the row before each update and delete for a table with exact history.
-- Since 028: logging the row before each update and delete of a table with exact history and old images.
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
    v_old    text;      -- the hash of the row before an update or delete: hash_record_extended(o), or NULL
    v_before text;      -- the row before an update or delete: row_to_json(o), or NULL
BEGIN
    SELECT * INTO STRICT t FROM coldharbor.tables WHERE table_id = p_table_id;
    v_prefix := format('coldharbor.capture_%s', t.table_id);
    v_key_n := coldharbor.key_sql(p_table_id, 'n');
    v_key_o := coldharbor.key_sql(p_table_id, 'o');
    SELECT string_agg(format('n.%I = o.%I', c, c), ' AND ') INTO v_join FROM unnest(t.key_columns) AS c;
    v_first := quote_ident(t.key_columns[1]);
    v_image := CASE t.history WHEN 'exact' THEN 'row_to_json(n.*)' ELSE 'NULL::json' END;  -- n.*: a column may be named n
    v_old := CASE t.history WHEN 'exact' THEN 'hash_record_extended(o.*, 0)' ELSE 'NULL::bigint' END;
    v_before := CASE WHEN t.history = 'exact' AND t.old_images THEN 'row_to_json(o.*)' ELSE 'NULL::json' END;

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
        LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp SET extra_float_digits = 3 AS $b$
        BEGIN
            IF EXISTS (SELECT 1 FROM coldharbor.capture_suspended
                        WHERE xact = pg_current_xact_id() AND table_id = %s) THEN
                RETURN NULL;
            END IF;
            INSERT INTO coldharbor.change_log (table_id, key, op, old_hash, old_image)
            SELECT %s, %s, 'D', %s, %s FROM old_rows o;
            RETURN NULL;
        END $b$$f$, v_prefix, t.table_id, t.table_id, v_key_o, v_old, v_before);

    -- An UPDATE that changes a key logs a delete of the old key and an insert of the new one.
    EXECUTE format($f$
        CREATE OR REPLACE FUNCTION %s_upd() RETURNS trigger
        LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp SET extra_float_digits = 3 AS $b$
        BEGIN
            INSERT INTO coldharbor.change_log (table_id, key, op, image, old_hash, old_image)
            SELECT %s,
                   CASE WHEN n.%s IS NULL THEN %s ELSE %s END,
                   CASE WHEN o.%s IS NULL THEN 'I' WHEN n.%s IS NULL THEN 'D' ELSE 'U' END,
                   CASE WHEN n.%s IS NOT NULL THEN %s END,
                   CASE WHEN o.%s IS NOT NULL THEN %s END,
                   CASE WHEN o.%s IS NOT NULL THEN %s END
            FROM new_rows n FULL JOIN old_rows o ON %s;
            RETURN NULL;
        END $b$$f$, v_prefix, t.table_id, v_first, v_key_o, v_key_n, v_first, v_first, v_first, v_image,
                    v_first, v_old, v_first, v_before, v_join);

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

-- Whether the current transaction's deletes from table p_table_id are an eviction or a purge.
CREATE OR REPLACE FUNCTION coldharbor.capture_is_suspended(p_table_id integer)
RETURNS boolean
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    SELECT EXISTS (SELECT 1 FROM coldharbor.capture_suspended
                    WHERE xact = pg_current_xact_id() AND table_id = p_table_id)
$$;

-- What a capture trigger the schema owner can no longer drop runs: nothing.
CREATE OR REPLACE FUNCTION coldharbor.capture_off()
RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    RETURN NULL;
END;
$$;

-- The table_id of the registered table whose partition tree holds relation p_rel (p_rel itself or
-- its nearest registered ancestor), or NULL.
CREATE OR REPLACE FUNCTION coldharbor.registration_of(p_rel oid)
RETURNS integer
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    SELECT t.table_id
      FROM (SELECT p_rel AS relid, 0::bigint AS depth
            UNION ALL
            SELECT a.relid, a.depth FROM pg_partition_ancestors(p_rel) WITH ORDINALITY AS a(relid, depth)) a
      JOIN pg_class c ON c.oid = a.relid
      JOIN pg_namespace n ON n.oid = c.relnamespace
      JOIN coldharbor.tables t ON t.source_kind = 'table' AND t.schema_name = n.nspname AND t.table_name = c.relname
     ORDER BY a.depth
     LIMIT 1
$$;

-- The relations of registered table p_table_id's partition tree: the table and its partitions, at any depth.
CREATE OR REPLACE FUNCTION coldharbor.capture_tree(p_table_id integer)
RETURNS SETOF oid
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    WITH root AS (
        SELECT to_regclass(format('%I.%I', schema_name, table_name)) AS relid
          FROM coldharbor.tables WHERE table_id = p_table_id AND source_kind = 'table')
    SELECT relid FROM root WHERE relid IS NOT NULL
    UNION
    SELECT m.relid FROM root CROSS JOIN LATERAL pg_partition_tree(root.relid) m
$$;

-- Logs every row relation p_rel holds as a change p_op of registered table p_table_id: the rows a
-- TRUNCATE removes, an ATTACH brings in, a DETACH takes away (p_cause names which). A partitioned
-- table holds no rows of its own: its partitions are logged one by one. The rows are read as the
-- schema owner, whom row-level security policies would filter (and whose privileges they would
-- run with): a relation with row-level security is refused.
-- Since 024: logging the hash of each row a TRUNCATE or DETACH removes from a table with exact history.
-- Since 028: logging the row each TRUNCATE or DETACH PARTITION removes from a table with exact history
-- and old images, and refusing both for a lake-first table (sql/migrations/027): they would remove only the rows
-- still landing, and the lake's would stay.
CREATE OR REPLACE FUNCTION coldharbor.log_rows(p_table_id integer, p_rel regclass, p_op "char", p_cause text)
RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp SET extra_float_digits = 3 AS $$
DECLARE
    v_kind "char";
    v_rls  boolean;
    v_hash boolean;     -- log the hash of each row removed (exact history)
    t      coldharbor.tables;
BEGIN
    SELECT * INTO STRICT t FROM coldharbor.tables WHERE table_id = p_table_id;
    IF t.mode = 'lake_first' AND p_op = 'D' THEN
        RAISE EXCEPTION 'cannot % %: %.% is a lake-first table, whose rows live in the lake; PostgreSQL only accepts '
                        'inserts into it', p_cause, p_rel, quote_ident(t.schema_name), quote_ident(t.table_name)
            USING ERRCODE = 'feature_not_supported',
                  HINT = 'Its rows leave PostgreSQL by themselves once they are in the lake; purge keys with '
                      || 'jobs/purge.py, or register the table again with p_mode => ''mirror''.';
    END IF;
    SELECT relkind, relrowsecurity INTO STRICT v_kind, v_rls FROM pg_class WHERE oid = p_rel;
    IF v_rls THEN
        RAISE EXCEPTION 'cannot capture % of %: it has row-level security', p_cause, p_rel
            USING ERRCODE = 'feature_not_supported',
                  HINT = CASE p_cause WHEN 'TRUNCATE' THEN 'Delete the rows instead.'
                         ELSE 'Capture reads its rows as the schema owner; disable its row-level security first.' END;
    END IF;
    v_hash := t.history = 'exact' AND p_op = 'D';
    IF v_kind = 'r' THEN
        EXECUTE format('INSERT INTO coldharbor.change_log (table_id, key, op, old_hash, old_image) '
                       'SELECT %s, %s, %L, %s, %s FROM %s o',
                       p_table_id, coldharbor.key_sql(p_table_id, 'o'), p_op,
                       CASE WHEN v_hash THEN 'hash_record_extended(o.*, 0)' ELSE 'NULL::bigint' END,
                       CASE WHEN v_hash AND t.old_images THEN 'row_to_json(o.*)' ELSE 'NULL::json' END, p_rel);
    END IF;
END;
$$;

-- (Re)creates the capture triggers of one relation of registered table p_table_id's tree (the table
-- or a partition of it), and its eviction guard when the table is tiered. The schema owner needs
-- TRIGGER and SELECT on it, which registration (or, for a later partition, the grant event trigger)
-- gave; a foreign table cannot be captured: its rows change where no trigger sees them.
-- Since 027: with the statement guard on every relation of a lake-first table too.
CREATE OR REPLACE FUNCTION coldharbor.capture_relation(p_table_id integer, p_rel regclass)
RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    t        coldharbor.tables;
    v_prefix text := format('coldharbor.capture_%s', p_table_id);
    v_kind   "char";
BEGIN
    SELECT * INTO STRICT t FROM coldharbor.tables WHERE table_id = p_table_id;
    SELECT relkind INTO STRICT v_kind FROM pg_class WHERE oid = p_rel;
    IF v_kind NOT IN ('r', 'p') THEN
        RAISE EXCEPTION 'cannot capture %, a partition of %.%: it is not a table (relkind %), so its rows change where capture does not see them',
            p_rel, quote_ident(t.schema_name), quote_ident(t.table_name), v_kind
            USING ERRCODE = 'wrong_object_type';
    END IF;
    IF NOT (has_table_privilege(p_rel, 'TRIGGER') AND has_table_privilege(p_rel, 'SELECT')) THEN
        RAISE EXCEPTION 'cannot capture %, a partition of %.%: role coldharbor_owner lacks TRIGGER or SELECT on it',
            p_rel, quote_ident(t.schema_name), quote_ident(t.table_name)
            USING ERRCODE = 'insufficient_privilege',
                  HINT = format('Its owner runs GRANT SELECT, TRIGGER ON %s TO coldharbor_owner.', p_rel);
    END IF;
    EXECUTE format('CREATE OR REPLACE TRIGGER coldharbor_capture_ins AFTER INSERT ON %s '
                   'REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION %s_ins()', p_rel, v_prefix);
    EXECUTE format('CREATE OR REPLACE TRIGGER coldharbor_capture_upd AFTER UPDATE ON %s '
                   'REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows '
                   'FOR EACH STATEMENT EXECUTE FUNCTION %s_upd()', p_rel, v_prefix);
    EXECUTE format('CREATE OR REPLACE TRIGGER coldharbor_capture_del AFTER DELETE ON %s '
                   'REFERENCING OLD TABLE AS old_rows FOR EACH STATEMENT EXECUTE FUNCTION %s_del()', p_rel, v_prefix);
    EXECUTE format('CREATE OR REPLACE TRIGGER coldharbor_capture_trunc BEFORE TRUNCATE ON %s '
                   'FOR EACH STATEMENT EXECUTE FUNCTION %s_trunc()', p_rel, v_prefix);
    -- A tiered table's writes must not race an eviction unnoticed; a lake-first table's updates and
    -- deletes are refused (evict_guard, below).
    IF t.hot_retention IS NOT NULL OR t.mode = 'lake_first' THEN
        EXECUTE format('CREATE OR REPLACE TRIGGER coldharbor_evict_guard BEFORE UPDATE OR DELETE ON %s '
                       'FOR EACH STATEMENT EXECUTE FUNCTION coldharbor.evict_guard(%L)', p_rel, p_table_id);
    ELSIF EXISTS (SELECT 1 FROM pg_trigger WHERE tgrelid = p_rel AND tgname = 'coldharbor_evict_guard') THEN
        EXECUTE format('CREATE OR REPLACE TRIGGER coldharbor_evict_guard BEFORE UPDATE OR DELETE ON %s '
                       'FOR EACH STATEMENT EXECUTE FUNCTION coldharbor.capture_off()', p_rel);
    END IF;
END;
$$;

-- Makes the coldharbor triggers of a relation that left a registered table's tree inert (the schema
-- owner cannot drop them; the relation's owner may).
CREATE OR REPLACE FUNCTION coldharbor.release_relation(p_rel regclass)
RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    r record;
BEGIN
    FOR r IN SELECT tg.tgname,
                    CASE WHEN tg.tgtype & 32 <> 0 THEN 'BEFORE TRUNCATE'       -- TRIGGER_TYPE_TRUNCATE
                         WHEN tg.tgname = 'coldharbor_evict_guard' THEN 'BEFORE UPDATE OR DELETE'
                         WHEN tg.tgtype & 4 <> 0 THEN 'AFTER INSERT'           -- TRIGGER_TYPE_INSERT
                         WHEN tg.tgtype & 16 <> 0 THEN 'AFTER UPDATE'          -- TRIGGER_TYPE_UPDATE
                         ELSE 'AFTER DELETE' END AS event
               FROM pg_trigger tg JOIN pg_proc p ON p.oid = tg.tgfoid
              WHERE tg.tgrelid = p_rel AND p.pronamespace = 'coldharbor'::regnamespace
                AND (p.proname ~ '^capture_[0-9]+_(ins|upd|del|trunc)$' OR p.proname = 'evict_guard') LOOP
        EXECUTE format('CREATE OR REPLACE TRIGGER %I %s ON %s FOR EACH STATEMENT EXECUTE FUNCTION coldharbor.capture_off()',
                       r.tgname, r.event, p_rel);
    END LOOP;
END;
$$;

-- Brings the capture of registered table p_table_id up to its partition tree after DDL changed it
-- (the ddl_command_end event trigger): relations attached or created since get the triggers and
-- their rows are logged as inserts (a new partition has none); relations detached since have their
-- rows logged as deletes and their triggers made inert. The log and the DDL commit together.
CREATE OR REPLACE FUNCTION coldharbor.capture_partitions(p_table_id integer)
RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    t      coldharbor.tables;
    v_tree oid[];
    v_rel  oid;
BEGIN
    SELECT * INTO STRICT t FROM coldharbor.tables WHERE table_id = p_table_id;
    -- A table created again under a registered name is not captured until it is registered again.
    IF NOT coalesce(to_regclass(format('%I.%I', t.schema_name, t.table_name))::oid = ANY (t.capture_relations), false) THEN
        RETURN;
    END IF;
    v_tree := ARRAY(SELECT m FROM coldharbor.capture_tree(p_table_id) AS m ORDER BY m);   -- sorted: compared below
    FOR v_rel IN SELECT m FROM unnest(v_tree) AS m WHERE m <> ALL (t.capture_relations) LOOP
        PERFORM coldharbor.capture_relation(p_table_id, v_rel::regclass);
        PERFORM coldharbor.log_rows(p_table_id, v_rel::regclass, 'I', 'ATTACH PARTITION');
    END LOOP;
    FOR v_rel IN SELECT m FROM unnest(t.capture_relations) AS m
                  WHERE m <> ALL (v_tree) AND EXISTS (SELECT 1 FROM pg_class WHERE oid = m) LOOP
        PERFORM coldharbor.log_rows(p_table_id, v_rel::regclass, 'D', 'DETACH PARTITION');
        PERFORM coldharbor.release_relation(v_rel::regclass);
    END LOOP;
    IF v_tree IS DISTINCT FROM t.capture_relations THEN
        UPDATE coldharbor.tables SET capture_relations = v_tree WHERE table_id = p_table_id;
    END IF;
END;
$$;

-- Turns on old images for registered table p_table_id (exact history only); the serve job's, the
-- first time it refreshes an incremental report over the table. Returns whether they were on already.
CREATE OR REPLACE FUNCTION coldharbor.keep_old_images(p_table_id integer)
RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    t coldharbor.tables;
BEGIN
    SELECT * INTO STRICT t FROM coldharbor.tables WHERE table_id = p_table_id FOR UPDATE;
    IF t.old_images THEN
        RETURN true;
    END IF;
    IF t.history <> 'exact' OR t.source_kind <> 'table' THEN
        RAISE EXCEPTION 'cannot keep old images of %.%: it does not keep exact history',
            quote_ident(t.schema_name), quote_ident(t.table_name)
            USING ERRCODE = 'feature_not_supported';
    END IF;
    UPDATE coldharbor.tables SET old_images = true WHERE table_id = p_table_id;
    PERFORM coldharbor.install_capture(p_table_id);
    RETURN false;
END;
$$;

-- Verified images (issue 26): a change's logged image is the state its transaction left only if
-- nothing else in the transaction changed the row after it; capture logs in the order statements
-- *finish*, not the order rows change. An application's AFTER ROW trigger (or a statement trigger
-- sorting before coldharbor_capture_*) that writes the row again runs a nested statement whose
-- capture fires first, and so does a volatile function called inside a statement that writes rows
-- the statement wrote earlier: the outer statement's older image is then logged last. pg_trigger_depth()
-- cannot tell the second case from an ordinary upsert, so capture proves the order instead.
--
-- For a table with exact history, an update or delete logs the hash of the row *before* it
-- (`old_hash`, hash_record_extended of the old row). The export hashes each logged image the same
-- way and accepts a key's images only when its logged changes chain, each one's row after equal to
-- the next one's row before (an insert follows only a delete): a chain in the wrong order breaks
-- somewhere, and a key whose chain breaks keeps its changes of that export as one span, refused
-- inside, as for any table (`hot_reader.exact_images_query`). Values equal under their type's
-- equality but printed differently (-0 and 0 in a float, 1.0 and 1.00 inside a jsonb) hash alike;
-- a chain in the wrong order can hide behind them only where the nested write changed nothing else.
-- Tables with the default history log no hash, exactly as before.

ALTER TABLE coldharbor.change_log ADD COLUMN old_hash bigint;   -- exact history: the row before an update or delete

-- As 021's, logging the hash of the row before each update and delete for a table with exact history.
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
BEGIN
    SELECT * INTO STRICT t FROM coldharbor.tables WHERE table_id = p_table_id;
    v_prefix := format('coldharbor.capture_%s', t.table_id);
    v_key_n := coldharbor.key_sql(p_table_id, 'n');
    v_key_o := coldharbor.key_sql(p_table_id, 'o');
    SELECT string_agg(format('n.%I = o.%I', c, c), ' AND ') INTO v_join FROM unnest(t.key_columns) AS c;
    v_first := quote_ident(t.key_columns[1]);
    v_image := CASE t.history WHEN 'exact' THEN 'row_to_json(n.*)' ELSE 'NULL::json' END;  -- n.*: a column may be named n
    v_old := CASE t.history WHEN 'exact' THEN 'hash_record_extended(o.*, 0)' ELSE 'NULL::bigint' END;

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
            INSERT INTO coldharbor.change_log (table_id, key, op, old_hash)
            SELECT %s, %s, 'D', %s FROM old_rows o;
            RETURN NULL;
        END $b$$f$, v_prefix, t.table_id, t.table_id, v_key_o, v_old);

    -- An UPDATE that changes a key logs a delete of the old key and an insert of the new one.
    EXECUTE format($f$
        CREATE OR REPLACE FUNCTION %s_upd() RETURNS trigger
        LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp SET extra_float_digits = 3 AS $b$
        BEGIN
            INSERT INTO coldharbor.change_log (table_id, key, op, image, old_hash)
            SELECT %s,
                   CASE WHEN n.%s IS NULL THEN %s ELSE %s END,
                   CASE WHEN o.%s IS NULL THEN 'I' WHEN n.%s IS NULL THEN 'D' ELSE 'U' END,
                   CASE WHEN n.%s IS NOT NULL THEN %s END,
                   CASE WHEN o.%s IS NOT NULL THEN %s END
            FROM new_rows n FULL JOIN old_rows o ON %s;
            RETURN NULL;
        END $b$$f$, v_prefix, t.table_id, v_first, v_key_o, v_key_n, v_first, v_first, v_first, v_image,
                    v_first, v_old, v_join);

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

-- As 013's, logging the hash of each row a TRUNCATE or DETACH removes from a table with exact history.
CREATE OR REPLACE FUNCTION coldharbor.log_rows(p_table_id integer, p_rel regclass, p_op "char", p_cause text)
RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_kind "char";
    v_rls  boolean;
    v_hash boolean;     -- log the hash of each row removed (exact history)
BEGIN
    SELECT relkind, relrowsecurity INTO STRICT v_kind, v_rls FROM pg_class WHERE oid = p_rel;
    IF v_rls THEN
        RAISE EXCEPTION 'cannot capture % of %: it has row-level security', p_cause, p_rel
            USING ERRCODE = 'feature_not_supported',
                  HINT = CASE p_cause WHEN 'TRUNCATE' THEN 'Delete the rows instead.'
                         ELSE 'Capture reads its rows as the schema owner; disable its row-level security first.' END;
    END IF;
    SELECT history = 'exact' AND p_op = 'D' INTO STRICT v_hash FROM coldharbor.tables WHERE table_id = p_table_id;
    IF v_kind = 'r' THEN
        EXECUTE format('INSERT INTO coldharbor.change_log (table_id, key, op, old_hash) SELECT %s, %s, %L, %s FROM %s o',
                       p_table_id, coldharbor.key_sql(p_table_id, 'o'), p_op,
                       CASE WHEN v_hash THEN 'hash_record_extended(o.*, 0)' ELSE 'NULL::bigint' END, p_rel);
    END IF;
END;
$$;

-- Tables with exact history registered before this migration log the hash from now on; changes
-- logged before it have none, so their export keeps them as one span (refused inside) once.
DO $$
DECLARE
    t record;
BEGIN
    FOR t IN SELECT tb.table_id, to_regclass(format('%I.%I', tb.schema_name, tb.table_name)) AS rel
               FROM coldharbor.tables tb
              WHERE tb.source_kind = 'table' AND tb.history = 'exact' LOOP
        CONTINUE WHEN t.rel IS NULL;
        BEGIN
            PERFORM coldharbor.install_capture(t.table_id);
        EXCEPTION WHEN wrong_object_type OR insufficient_privilege OR feature_not_supported THEN
            RAISE WARNING '%: %; its capture stays as it was until that is fixed and it is registered again',
                t.rel, SQLERRM;
        END;
    END LOOP;
END
$$;

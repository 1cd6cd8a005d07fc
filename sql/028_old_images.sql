-- Old images (issue 23, part 2: incremental reports). A report refreshed incrementally applies each
-- change's own contribution: the row a change removed counts negative, the row it left positive.
-- Exact history (sql/021) logs the row after each insert and update; a table read by an
-- incremental report also logs the row *before* each update and delete (`change_log.old_image`,
-- row_to_json of the old row), so a key's contribution before a window of changes is its first
-- change's old image, and after it its last change's image, without reading the lake. The serve
-- job turns it on (coldharbor.keep_old_images) the first time it refreshes such a report; changes
-- logged before that have none, and the report is refreshed in full until its window is past them.

ALTER TABLE coldharbor.change_log ADD COLUMN old_image json;   -- the row before an update or delete
ALTER TABLE coldharbor.tables ADD COLUMN old_images boolean NOT NULL DEFAULT false;

-- As 024's, logging the row before each update and delete of a table with exact history and old images.
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


-- As 024's, logging the row each TRUNCATE or DETACH PARTITION removes from a table with exact history
-- and old images, and refusing both for a lake-first table (sql/027): they would remove only the rows
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

-- Turns on old images for registered table p_table_id (exact history only); the serve job's, the
-- first time it refreshes an incremental report over the table. Returns whether they were on already.
CREATE FUNCTION coldharbor.keep_old_images(p_table_id integer)
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

REVOKE ALL ON FUNCTION coldharbor.keep_old_images(integer) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION coldharbor.keep_old_images(integer) TO coldharbor_pipeline;
SELECT coldharbor.apply_privileges();

-- DDL on registered tables: what sends a table back to its initial load (a rebase), renames,
-- and changes of its key columns.
-- (Definitions: each object here only, CREATE OR REPLACE; see sql/README.md.)

-- What defines the values a table's columns hold beyond the rows written, per attnum: its name (the
-- lake's identity of the column) and a generated column's kind and expression. (Enum types do not
-- round-trip to the lake and cannot be registered, so no label is followed here.)
CREATE OR REPLACE FUNCTION coldharbor.column_values_signature(p_rel oid)
RETURNS jsonb
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $$
    SELECT coalesce(jsonb_object_agg(a.attnum::text, jsonb_build_object(
               'name', a.attname,
               'generated', CASE WHEN a.attgenerated <> '' THEN a.attgenerated::text || ' ' || pg_get_expr(d.adbin, d.adrelid) END)), '{}')
      FROM pg_attribute a
      LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
     WHERE a.attrelid = p_rel AND a.attnum > 0 AND NOT a.attisdropped
$$;

-- What `columns_seen` becomes after DDL: the columns now, and every column seen before that is gone,
-- marked dropped (the lake keeps a dropped column's values in its older rows, under its name).
CREATE OR REPLACE FUNCTION coldharbor.columns_seen_after(p_seen jsonb, p_rel oid)
RETURNS jsonb
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $$
    WITH now_sig AS (SELECT coldharbor.column_values_signature(p_rel) AS sig)
    SELECT coalesce((SELECT jsonb_object_agg(o.key, o.value || '{"dropped": true}')
                       FROM jsonb_each(coalesce(p_seen, '{}')) o WHERE NOT (now_sig.sig ? o.key)), '{}') || now_sig.sig
      FROM now_sig
$$;

-- Whether column p_name of p_rel (or of any leaf of its partition tree) holds a value for rows
-- that existed before it was added (a fast default: atthasmissing).
CREATE OR REPLACE FUNCTION coldharbor.column_has_missing_value(p_rel oid, p_name name)
RETURNS boolean
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $$
    SELECT EXISTS (SELECT 1 FROM (SELECT p_rel UNION SELECT relid FROM pg_partition_tree(p_rel::regclass)) p(relid)
                     JOIN pg_attribute a ON a.attrelid = p.relid AND a.attname = p_name AND NOT a.attisdropped
                    WHERE a.atthasmissing)
$$;

-- When the oldest change of table p_table_id that is not in the lake yet committed, as the export
-- will stamp it; changes of the calling transaction (not committed yet) are left out.
CREATE OR REPLACE FUNCTION coldharbor.oldest_dirty_change_at(p_table_id integer)
RETURNS timestamptz
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $$
    SELECT min(CASE WHEN current_setting('track_commit_timestamp')::boolean
                    THEN coalesce(pg_xact_commit_timestamp(c.xmin), c.created_at) ELSE c.created_at END)
      FROM coldharbor.change_log c
     WHERE c.table_id = p_table_id AND c.flushed_at IS NULL
       AND c.xmin::text IS DISTINCT FROM (pg_current_xact_id_if_assigned()::text::numeric % 4294967296)::text
$$;

-- Whether a column of table p_table_id has another name now than `columns_seen` records for it.
CREATE OR REPLACE FUNCTION coldharbor.column_renamed(p_table_id integer)
RETURNS boolean
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $$
    SELECT EXISTS (SELECT 1 FROM coldharbor.tables t,
                          jsonb_each(coldharbor.column_values_signature(t.relid)) n
                     JOIN jsonb_each(t.columns_seen) o ON o.key = n.key
                    WHERE t.table_id = p_table_id AND t.relid IS NOT NULL
                      AND NOT coalesce((o.value ->> 'dropped')::boolean, false)
                      AND (n.value ->> 'name') IS DISTINCT FROM (o.value ->> 'name'))
$$;

-- Sends a registered table back to 'pending' (sql/migrations/014). The table's lake rows stay until the
-- new base outranks them.
-- Since 016: the request records where its window starts and whether it is a rename
-- (called before rebase_on_ddl moves `columns_seen` on).
CREATE OR REPLACE FUNCTION coldharbor.request_rebase(p_table_id integer, p_reason text)
RETURNS void
LANGUAGE sql SET search_path = pg_catalog, pg_temp AS $$
    WITH asked AS (
        UPDATE coldharbor.tables
           SET load_state = 'pending', rebase_serial = rebase_serial + 1, rebase_reason = p_reason
         WHERE table_id = p_table_id
     RETURNING table_id, rebase_serial)
    INSERT INTO coldharbor.rebases (table_id, serial, reason, requested_at, dirty_since, renames_column)
    SELECT table_id, rebase_serial, p_reason, clock_timestamp(),
           coldharbor.oldest_dirty_change_at(table_id), coldharbor.column_renamed(table_id)
      FROM asked;
$$;

-- Why the rows of table p_table_id changed beyond capture since `columns_seen`, or NULL.
CREATE OR REPLACE FUNCTION coldharbor.rebase_reason_for(p_table_id integer)
RETURNS text
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    t   record;
    now_sig jsonb;
    k   text;
    was jsonb;
    col jsonb;
BEGIN
    SELECT * INTO t FROM coldharbor.tables WHERE table_id = p_table_id;
    IF t.relid IS NULL OR t.columns_seen IS NULL THEN
        RETURN NULL;
    END IF;
    now_sig := coldharbor.column_values_signature(t.relid);
    FOR k, col IN SELECT * FROM jsonb_each(now_sig) LOOP
        was := t.columns_seen -> k;
        IF was IS NULL THEN
            IF EXISTS (SELECT 1 FROM jsonb_each(t.columns_seen) o
                        WHERE o.key <> k AND o.value ->> 'name' = col ->> 'name') THEN
                RETURN format('column %s was added under the name of a dropped column, whose values the lake '
                              'still holds', quote_ident(col ->> 'name'));
            ELSIF col ->> 'generated' IS NOT NULL THEN
                RETURN format('column %s was added as a generated column', quote_ident(col ->> 'name'));
            ELSIF coldharbor.column_has_missing_value(t.relid, (col ->> 'name')::name) THEN
                RETURN format('column %s was added with a default, which every existing row holds',
                              quote_ident(col ->> 'name'));
            END IF;
        ELSIF (col ->> 'name') IS DISTINCT FROM (was ->> 'name') THEN
            -- the lake knows the column by its name: older rows would read NULL under the new one
            RETURN format('column %s was renamed to %s', quote_ident(was ->> 'name'), quote_ident(col ->> 'name'));
        ELSIF (col ->> 'generated') IS DISTINCT FROM (was ->> 'generated') THEN
            RETURN format('the generation expression of column %s changed', quote_ident(col ->> 'name'));
        END IF;
    END LOOP;
    RETURN NULL;
END;
$$;

-- The registered tables a DDL command touched: the relation itself or any partition below it; a
-- registration whose relation was dropped (`dropped_at`) owns none, even if PostgreSQL gave its oid
-- to a new relation (sql/migrations/019, 2.).
CREATE OR REPLACE FUNCTION coldharbor.registered_tables_of(p_rel oid)
RETURNS SETOF integer
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $$
    SELECT t.table_id FROM coldharbor.tables t
     WHERE t.source_kind = 'table' AND t.relid IS NOT NULL AND t.dropped_at IS NULL
       AND (t.relid = p_rel OR t.relid IN (SELECT a FROM pg_partition_ancestors(p_rel::regclass) a))
$$;

-- ddl_command_end of ALTER TABLE: compares the touched registered tables' columns with what was
-- seen; table_rewrite: a rewrite of a registered table (or of a partition of one) may have changed
-- every row. Either way the DDL itself goes through.
-- Since 018: on every DDL command, not only ALTER TABLE; since 019: the typed tables of a type the
-- command touched too (ddl_touched_tables).
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

-- A table goes from pending to loaded when a base (or, with no rebase open, an empty table's
-- settling) answers it: the open requests up to its serial are closed with the base, and the reason
-- is cleared. The pipeline records bases but may not write rebase_reason: this runs as the owner.
CREATE OR REPLACE FUNCTION coldharbor.settle_rebases()
RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF OLD.load_state = 'pending' AND NEW.load_state = 'loaded' THEN
        NEW.rebase_reason := NULL;
        UPDATE coldharbor.rebases
           SET settled_at = coalesce(NEW.base_at, clock_timestamp()), settled_version = NEW.base_version
         WHERE table_id = NEW.table_id AND settled_at IS NULL AND serial <= NEW.rebase_serial;
    END IF;
    RETURN NEW;
END;
$$;

-- sql_drop: a registered table (not a partition of one: its parent stays) was dropped.
CREATE OR REPLACE FUNCTION coldharbor.note_registered_drop()
RETURNS event_trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    UPDATE coldharbor.tables t SET dropped_at = clock_timestamp()
      FROM pg_event_trigger_dropped_objects() d
     WHERE d.classid = 'pg_class'::regclass AND d.objsubid = 0 AND d.objid = t.relid
       AND t.source_kind = 'table' AND t.dropped_at IS NULL;
END;
$$;

-- The registered tables the DDL command being ended touched: relations it names (a partition's
-- registered ancestor included), and the typed tables (CREATE TABLE ... OF type) of a composite type
-- it altered (`ALTER TYPE ... CASCADE` reports the type alone, not the tables it rewrites).
CREATE OR REPLACE FUNCTION coldharbor.ddl_touched_tables()
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

-- What a statement may change under table p_table_id, from the catalog alone: its relation files
-- (every leaf of a partitioned table; a rewrite gives a relation a new one) and each key column's
-- catalog row (a new row version when its definition changed), type and modifier.
CREATE OR REPLACE FUNCTION coldharbor.key_watch(p_table_id integer)
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
CREATE OR REPLACE FUNCTION coldharbor.key_cast_keeps_values(p_from oid, p_from_mod integer, p_to oid, p_to_mod integer)
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
CREATE OR REPLACE FUNCTION coldharbor.is_plain_type_change(p_sql text)
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

-- Sends back to pending every table whose columns differ from `columns_seen` in a way that needs
-- a base (rebase_reason_for), and moves `columns_seen` on; returns how many it sent back.
CREATE OR REPLACE FUNCTION coldharbor.reconcile_columns_seen()
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

CREATE OR REPLACE TRIGGER settle_rebases BEFORE UPDATE OF load_state ON coldharbor.tables
    FOR EACH ROW EXECUTE FUNCTION coldharbor.settle_rebases();

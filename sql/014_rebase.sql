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
    ADD COLUMN columns_seen  jsonb,                      -- per attnum, what defines its values (below)
    ADD COLUMN rebase_serial bigint NOT NULL DEFAULT 0,  -- how many rebases were requested
    ADD COLUMN rebase_reason text;                       -- why the newest one was

-- What defines the values a table's columns hold beyond the rows written, per attnum: its name (the
-- lake's identity of the column) and a generated column's kind and expression. (Enum types do not
-- round-trip to the lake and cannot be registered, so no label is followed here.)
CREATE FUNCTION coldharbor.column_values_signature(p_rel oid)
RETURNS jsonb
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $$
    SELECT coalesce(jsonb_object_agg(a.attnum::text, jsonb_build_object(
               'name', a.attname,
               'generated', CASE WHEN a.attgenerated <> '' THEN a.attgenerated::text || ' ' || pg_get_expr(d.adbin, d.adrelid) END)), '{}')
      FROM pg_attribute a
      LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
     WHERE a.attrelid = p_rel AND a.attnum > 0 AND NOT a.attisdropped
$$;

-- Whether column p_name of p_rel (or of any leaf of its partition tree) holds a value for rows
-- that existed before it was added (a fast default: atthasmissing).
CREATE FUNCTION coldharbor.column_has_missing_value(p_rel oid, p_name name)
RETURNS boolean
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $$
    SELECT EXISTS (SELECT 1 FROM (SELECT p_rel UNION SELECT relid FROM pg_partition_tree(p_rel::regclass)) p(relid)
                     JOIN pg_attribute a ON a.attrelid = p.relid AND a.attname = p_name AND NOT a.attisdropped
                    WHERE a.atthasmissing)
$$;

-- Sends a registered table back to 'pending' (see above). The table's lake rows stay until the
-- new base outranks them.
CREATE FUNCTION coldharbor.request_rebase(p_table_id integer, p_reason text)
RETURNS void
LANGUAGE sql SET search_path = pg_catalog, pg_temp AS $$
    UPDATE coldharbor.tables
       SET load_state = 'pending', rebase_serial = rebase_serial + 1, rebase_reason = p_reason
     WHERE table_id = p_table_id;
$$;

-- Why the rows of table p_table_id changed beyond capture since `columns_seen`, or NULL.
CREATE FUNCTION coldharbor.rebase_reason_for(p_table_id integer)
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
            IF col ->> 'generated' IS NOT NULL THEN
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

-- Registration records the relation and its columns; registering a name again whose relation is
-- another one (the table was dropped and created anew) sends the table back to 'pending'.
CREATE FUNCTION coldharbor.track_registered_relation()
RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_rel oid := to_regclass(format('%I.%I', NEW.schema_name, NEW.table_name));
BEGIN
    IF NEW.source_kind <> 'table' THEN
        RETURN NEW;
    END IF;
    IF TG_OP = 'UPDATE' AND OLD.relid IS DISTINCT FROM v_rel THEN
        NEW.load_state := 'pending';
        NEW.rebase_serial := OLD.rebase_serial + 1;
        NEW.rebase_reason := 'registered again after the table was dropped and created anew: '
                             'the lake holds the old table''s rows';
    END IF;
    NEW.relid := v_rel;
    NEW.columns_seen := coldharbor.column_values_signature(v_rel);
    RETURN NEW;
END;
$$;

CREATE TRIGGER track_registered_relation
    BEFORE INSERT OR UPDATE OF key_columns, lake_location, partition_by, sort_by, hot_retention ON coldharbor.tables
    FOR EACH ROW EXECUTE FUNCTION coldharbor.track_registered_relation();

UPDATE coldharbor.tables
   SET relid = to_regclass(format('%I.%I', schema_name, table_name)),
       columns_seen = coldharbor.column_values_signature(to_regclass(format('%I.%I', schema_name, table_name)))
 WHERE source_kind = 'table';

-- The registered tables a DDL command touched: the relation itself or any partition below it.
CREATE FUNCTION coldharbor.registered_tables_of(p_rel oid)
RETURNS SETOF integer
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $$
    SELECT t.table_id FROM coldharbor.tables t
     WHERE t.source_kind = 'table' AND t.relid IS NOT NULL
       AND (t.relid = p_rel OR t.relid IN (SELECT a FROM pg_partition_ancestors(p_rel::regclass) a))
$$;

-- ddl_command_end of ALTER TABLE: compares the touched registered tables' columns with what was
-- seen; table_rewrite: a rewrite of a registered table (or of a partition of one) may have changed
-- every row. Either way the DDL itself goes through.
CREATE FUNCTION coldharbor.rebase_on_ddl()
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
    FOR v_table IN
        SELECT DISTINCT coldharbor.registered_tables_of(c.objid)
          FROM pg_event_trigger_ddl_commands() c
         WHERE c.classid = 'pg_class'::regclass
    LOOP
        v_reason := coldharbor.rebase_reason_for(v_table);
        IF v_reason IS NOT NULL THEN
            PERFORM coldharbor.request_rebase(v_table, v_reason);
        END IF;
        UPDATE coldharbor.tables SET columns_seen = coldharbor.column_values_signature(relid)
         WHERE table_id = v_table;
    END LOOP;
END;
$$;

-- Like the capture guard, event triggers need a superuser; without one the rebase is left to
-- jobs/resync.py and the README says so.
DO $rebase$
BEGIN
    IF (SELECT rolsuper FROM pg_catalog.pg_roles WHERE rolname = current_user) THEN
        CREATE EVENT TRIGGER coldharbor_rebase_ddl ON ddl_command_end
            WHEN TAG IN ('ALTER TABLE')
            EXECUTE FUNCTION coldharbor.rebase_on_ddl();
        CREATE EVENT TRIGGER coldharbor_rebase_rewrite ON table_rewrite
            EXECUTE FUNCTION coldharbor.rebase_on_ddl();
    ELSE
        RAISE WARNING 'not a superuser: the event triggers that send a table back to its initial load after '
                      'ALTER TABLE changed its rows were not created; run jobs/resync.py after such a change';
    END IF;
END
$rebase$;

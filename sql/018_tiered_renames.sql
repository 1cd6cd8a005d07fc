-- DDL a tiered table's evicted rows cannot follow (issue 18, the known gap of sql/016).
--
-- Rows evicted from the hot tier live in the lake alone, and a base (written from PostgreSQL) never
-- rewrites them. The lake knows a column by its name and holds its values in one lake type, so
-- three kinds of DDL would make those rows read wrong values, silently, or strand them:
--   - a column renamed (ALTER TABLE ... RENAME COLUMN, and its other spellings ALTER TYPE ...
--     RENAME ATTRIBUTE, ALTER VIEW / MATERIALIZED VIEW / FOREIGN TABLE ... RENAME COLUMN, which
--     PostgreSQL accepts on a table): an evicted row holds its value under the old name, and reads
--     NULL under the new one;
--   - a column added under a dropped column's name: an evicted row holds the dropped column's value
--     under that name, and shows it as the new column's;
--   - a type change the lake cannot widen its column to (numeric(12,2) -> numeric(12,0), int ->
--     text, ...): the export refuses the table until the lake table is moved aside and resynced,
--     which would lose the evicted rows.
-- Once a table has evicted rows, an event trigger refuses all three, in one line naming the column,
-- and the DDL is rolled back. Any other DDL keeps its meaning for evicted rows: a column added later
-- reads NULL in them (they were evicted before it existed), a dropped column is no longer read, and
-- a type change the lake can widen to (int -> bigint, real -> double precision) widens them.
--
-- `tables.evicted_at` is when the newest eviction that deleted rows committed (set by a trigger on
-- coldharbor.evictions, which evict() writes then). Registering another relation under the name
-- (sql/017) leaves no evicted row behind: its base marks the old relation's keys deleted, so that
-- registration clears `evicted_at`. `tables.lake_types` is each column's lake
-- type (per attnum) at registration or after the last DDL, what a type change is checked against.
--
-- sql/014's rebase trigger fired on the ALTER TABLE tag only, so the other spellings of a rename
-- reached neither it nor a rebase: every registered table's lake kept the old name and reports read
-- NULL under the new one. Both triggers now look at every DDL command and pick the registered tables
-- out of what it touched.

ALTER TABLE coldharbor.tables ADD COLUMN evicted_at timestamptz;

CREATE FUNCTION coldharbor.note_eviction()
RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    UPDATE coldharbor.tables SET evicted_at = now() WHERE table_id = NEW.table_id;
    RETURN NEW;
END;
$$;

CREATE TRIGGER note_eviction AFTER INSERT OR UPDATE ON coldharbor.evictions
    FOR EACH ROW EXECUTE FUNCTION coldharbor.note_eviction();

-- Evictions made before this migration: recorded by sql/011's evict() (no time kept: now), or
-- before that in a cleanup run's figures.
UPDATE coldharbor.tables t
   SET evicted_at = coalesce(
           (SELECT max(m.finished_at) FROM coldharbor.maintenance_runs m
             WHERE m.table_id = t.table_id AND m.kind = 'cleanup' AND m.state = 'succeeded'
               AND coalesce((m.detail ->> 'dry_run')::boolean, false) = false
               AND coalesce((m.detail ->> 'evicted_rows')::bigint, 0) > 0),
           CASE WHEN EXISTS (SELECT 1 FROM coldharbor.evictions e WHERE e.table_id = t.table_id) THEN now() END);
UPDATE coldharbor.tables t SET evicted_at = NULL
 WHERE EXISTS (SELECT 1 FROM coldharbor.rebases r
                WHERE r.table_id = t.table_id AND r.new_relation AND r.requested_at >= t.evicted_at);

-- Each live column's lake type (NULL for a type the lake cannot hold), per attnum.
CREATE FUNCTION coldharbor.column_lake_types(p_rel oid)
RETURNS jsonb
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $$
    SELECT coalesce(jsonb_object_agg(a.attnum::text, coldharbor.lake_type(b.base_type, b.base_typmod)), '{}')
      FROM pg_attribute a, LATERAL coldharbor.base_type(a.atttypid, a.atttypmod) b
     WHERE a.attrelid = p_rel AND a.attnum > 0 AND NOT a.attisdropped
$$;

ALTER TABLE coldharbor.tables ADD COLUMN lake_types jsonb;
UPDATE coldharbor.tables SET lake_types = coldharbor.column_lake_types(relid)
 WHERE source_kind = 'table' AND relid IS NOT NULL;

-- Registration (a new relation under the name included) records its columns' lake types; it runs
-- after track_registered_relation (triggers fire in name order), which sets relid.
CREATE FUNCTION coldharbor.track_registered_types()
RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF NEW.source_kind = 'table' AND NEW.relid IS NOT NULL
       AND (TG_OP = 'INSERT' OR NEW.relid IS DISTINCT FROM OLD.relid OR NEW.lake_types IS NULL) THEN
        NEW.lake_types := coldharbor.column_lake_types(NEW.relid);
    END IF;
    IF TG_OP = 'UPDATE' AND NEW.relid IS DISTINCT FROM OLD.relid THEN
        NEW.evicted_at := NULL;  -- another relation: it evicted nothing (its base marks the old keys deleted)
    END IF;
    RETURN NEW;
END;
$$;

CREATE TRIGGER track_registered_types BEFORE INSERT OR UPDATE ON coldharbor.tables
    FOR EACH ROW EXECUTE FUNCTION coldharbor.track_registered_types();

-- Lake type changes every value survives, as export's lake.SAFE_WIDENINGS (the lake widens its column).
CREATE FUNCTION coldharbor.lake_widens(p_from text, p_to text)
RETURNS boolean
LANGUAGE sql IMMUTABLE AS $$
    SELECT p_from = p_to OR (p_from, p_to) IN (('SHORT', 'INT'), ('SHORT', 'LONG'), ('SHORT', 'DOUBLE'),
                                               ('INT', 'LONG'), ('INT', 'DOUBLE'), ('LONG', 'DOUBLE'),
                                               ('FLOAT', 'DOUBLE'))
$$;

-- Why the DDL just made to table p_table_id would make its evicted rows read wrong values, or NULL
-- (called by guard_evicted_rows before `columns_seen` moves on).
CREATE FUNCTION coldharbor.evicted_rows_refusal(p_table_id integer)
RETURNS text
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    t       record;
    now_sig jsonb;
    now_types jsonb;
    k       text;
    col     jsonb;
    was     jsonb;
BEGIN
    SELECT * INTO t FROM coldharbor.tables WHERE table_id = p_table_id;
    IF t.evicted_at IS NULL OR t.relid IS NULL OR t.columns_seen IS NULL THEN
        RETURN NULL;
    END IF;
    now_sig := coldharbor.column_values_signature(t.relid);
    now_types := coldharbor.column_lake_types(t.relid);
    FOR k, col IN SELECT * FROM jsonb_each(now_sig) LOOP
        was := t.columns_seen -> k;
        IF was IS NOT NULL AND NOT coalesce((was ->> 'dropped')::boolean, false)
           AND (col ->> 'name') IS DISTINCT FROM (was ->> 'name') THEN
            RETURN format('cannot rename column %s of %I.%I to %s: rows evicted from its hot tier (last at %s) '
                          'live in the lake alone, holding the column under its name %s, and would read NULL '
                          'under the new one', quote_ident(was ->> 'name'), t.schema_name, t.table_name,
                          quote_ident(col ->> 'name'), t.evicted_at, quote_ident(was ->> 'name'));
        ELSIF was IS NULL AND EXISTS (SELECT 1 FROM jsonb_each(t.columns_seen) o
                                       WHERE o.key <> k AND o.value ->> 'name' = col ->> 'name') THEN
            RETURN format('cannot add column %s to %I.%I: rows evicted from its hot tier (last at %s) live in the '
                          'lake alone, holding the values of the dropped column %s, and would show them as '
                          'the new column''s', quote_ident(col ->> 'name'), t.schema_name, t.table_name,
                          t.evicted_at, quote_ident(col ->> 'name'));
        ELSIF t.lake_types ? k AND t.lake_types ->> k IS NOT NULL
              AND NOT coalesce(coldharbor.lake_widens(t.lake_types ->> k, now_types ->> k), false) THEN
            RETURN format('cannot change the type of column %s of %I.%I to %s: rows evicted from its hot tier (last at %s) '
                          'live in the lake alone, as %s, and the lake cannot widen them to %s (it widens smallint, '
                          'integer and bigint to a wider integer or double precision, real to double precision)',
                          quote_ident(col ->> 'name'), t.schema_name, t.table_name,
                          (SELECT format_type(a.atttypid, a.atttypmod) FROM pg_attribute a
                            WHERE a.attrelid = t.relid AND a.attnum = k::smallint),
                          t.evicted_at, t.lake_types ->> k,
                          coalesce(now_types ->> k, 'a lake type (none holds it)'));
        END IF;
    END LOOP;
    RETURN NULL;
END;
$$;

-- ddl_command_end of any DDL: refuses DDL the touched registered tables' evicted rows cannot
-- follow (the whole statement rolls back). Event triggers of one event fire in the order of their
-- names, so this one runs before coldharbor_rebase_ddl moves `columns_seen` on.
CREATE FUNCTION coldharbor.guard_evicted_rows()
RETURNS event_trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_table  integer;
    v_reason text;
BEGIN
    FOR v_table IN
        SELECT DISTINCT coldharbor.registered_tables_of(c.objid)
          FROM pg_event_trigger_ddl_commands() c
         WHERE c.classid = 'pg_class'::regclass
    LOOP
        v_reason := coldharbor.evicted_rows_refusal(v_table);
        IF v_reason IS NOT NULL THEN
            RAISE EXCEPTION '%', v_reason
                USING ERRCODE = 'feature_not_supported',
                      HINT = 'Rows evicted from the hot tier keep the names and lake types they were evicted with; '
                             'a view can show a column under another name or type.';
        END IF;
        UPDATE coldharbor.tables SET lake_types = coldharbor.column_lake_types(relid)
         WHERE table_id = v_table AND lake_types IS DISTINCT FROM coldharbor.column_lake_types(relid);
    END LOOP;
END;
$$;

-- Like sql/014's event triggers, it needs a superuser (without one, the README says what to avoid).
-- Every DDL command, not a list of tags: a column of a table is renamed under four of them.
DO $guard$
BEGIN
    IF (SELECT rolsuper FROM pg_catalog.pg_roles WHERE rolname = current_user) THEN
        CREATE EVENT TRIGGER coldharbor_evicted_rows_guard ON ddl_command_end
            EXECUTE FUNCTION coldharbor.guard_evicted_rows();
        IF EXISTS (SELECT 1 FROM pg_event_trigger WHERE evtname = 'coldharbor_rebase_ddl') THEN
            DROP EVENT TRIGGER coldharbor_rebase_ddl;
            CREATE EVENT TRIGGER coldharbor_rebase_ddl ON ddl_command_end
                EXECUTE FUNCTION coldharbor.rebase_on_ddl();
        END IF;
    END IF;
END
$guard$;

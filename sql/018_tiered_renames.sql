-- DDL a tiered table's evicted rows cannot follow (issue 18, the known gap of sql/016).
--
-- Rows evicted from the hot tier live in the lake alone, and a base (written from PostgreSQL) never
-- rewrites them. The lake knows a column by its name, so two kinds of DDL would make those rows read
-- wrong values, silently:
--   - RENAME COLUMN a TO b: an evicted row holds its value under a, and reads NULL under b;
--   - ADD COLUMN a after a column a was dropped: an evicted row holds the dropped column's value
--     under a, and shows it as the new column's.
-- Once a table has evicted rows, its event trigger refuses both, in one line naming the column, and
-- the DDL is rolled back. Any other DDL keeps its meaning for evicted rows: a column added later
-- reads NULL in them (they were evicted before it existed), a dropped column is no longer read, and
-- a type change widens the lake column (or the export refuses it, naming both types).
--
-- `tables.evicted_at` is when the newest eviction that deleted rows committed (set by a trigger on
-- coldharbor.evictions, which evict() writes then). Registering another relation under the name
-- (sql/017) leaves no evicted row behind: its base marks the old relation's keys deleted, so an
-- eviction older than that registration does not count.

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

-- Why the DDL just made to table p_table_id would make its evicted rows read wrong values, or NULL
-- (called by guard_evicted_rows before `columns_seen` moves on).
CREATE FUNCTION coldharbor.evicted_rows_refusal(p_table_id integer)
RETURNS text
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    t       record;
    now_sig jsonb;
    k       text;
    col     jsonb;
    was     jsonb;
BEGIN
    SELECT * INTO t FROM coldharbor.tables WHERE table_id = p_table_id;
    IF t.evicted_at IS NULL OR t.relid IS NULL OR t.columns_seen IS NULL
       OR EXISTS (SELECT 1 FROM coldharbor.rebases r
                   WHERE r.table_id = p_table_id AND r.new_relation AND r.requested_at >= t.evicted_at) THEN
        RETURN NULL;
    END IF;
    now_sig := coldharbor.column_values_signature(t.relid);
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
        END IF;
    END LOOP;
    RETURN NULL;
END;
$$;

-- ddl_command_end of ALTER TABLE: refuses DDL the touched registered tables' evicted rows cannot
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
                      HINT = 'Keep the name (a view can show the column under another one); the lake holds '
                             'evicted rows by column name.';
        END IF;
    END LOOP;
END;
$$;

-- Like sql/014's event triggers, it needs a superuser (without one, the README says what to avoid).
DO $guard$
BEGIN
    IF (SELECT rolsuper FROM pg_catalog.pg_roles WHERE rolname = current_user) THEN
        CREATE EVENT TRIGGER coldharbor_evicted_rows_guard ON ddl_command_end
            WHEN TAG IN ('ALTER TABLE')
            EXECUTE FUNCTION coldharbor.guard_evicted_rows();
    END IF;
END
$guard$;

-- The event triggers that keep a table owner from dropping or disabling capture, and that watch
-- DDL on registered tables.
-- (Definitions: each object here only, CREATE OR REPLACE; see sql/README.md.)

-- Capture is protected against other sessions and settings by its SECURITY DEFINER functions and
-- owner-only state (sql/definitions/020_capture.sql). Against the owner of a
-- registered table, who may alter its own table, event triggers (only a superuser can create,
-- alter or drop one) refuse the DDL that would stop capture: dropping, disabling or replacing a
-- capture trigger, or renaming or moving the table away from its registration. They also keep
-- schema reports, where the pipeline may create tables, free of anything that runs code.
-- Since 013: with partitions: after CREATE TABLE or ALTER TABLE of a relation of a registered table's
-- tree, capture follows the tree (capture_partitions); a registered table may not become a partition;
-- the checks of capture triggers cover the eviction guard and partitions too.
CREATE OR REPLACE FUNCTION coldharbor.guard_capture()
RETURNS event_trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    r          record;
    v_table_id integer;
BEGIN
    IF TG_EVENT = 'sql_drop' THEN
        PERFORM coldharbor.guard_capture_drops();
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

    IF TG_TAG IN ('CREATE TABLE', 'CREATE FOREIGN TABLE', 'ALTER TABLE') THEN
        -- Writes through a parent fire none of a partition's statement triggers.
        SELECT m.relid::regclass AS registered, c.objid::regclass AS parent INTO r
          FROM pg_event_trigger_ddl_commands() c
          CROSS JOIN LATERAL pg_partition_tree(c.objid) m
          JOIN pg_class k ON k.oid = m.relid AND k.relispartition
          JOIN pg_namespace n ON n.oid = k.relnamespace
          JOIN coldharbor.tables t ON t.source_kind = 'table' AND t.schema_name = n.nspname AND t.table_name = k.relname
         WHERE c.classid = 'pg_class'::regclass AND m.relid <> c.objid
         LIMIT 1;
        IF FOUND THEN
            RAISE EXCEPTION '% is registered with coldharbor and cannot be a partition of %: writes through % would bypass its capture',
                r.registered, r.parent, r.parent
                USING ERRCODE = 'insufficient_privilege';
        END IF;
        FOR v_table_id IN SELECT DISTINCT coldharbor.registration_of(c.objid) FROM pg_event_trigger_ddl_commands() c
                           WHERE c.classid = 'pg_class'::regclass AND c.object_type IN ('table', 'foreign table') LOOP
            IF v_table_id IS NOT NULL THEN
                PERFORM coldharbor.capture_partitions(v_table_id);
            END IF;
        END LOOP;
    END IF;

    PERFORM coldharbor.guard_capture_triggers();
END;
$$;

-- The sql_drop half of guard_capture. A capture trigger or a tiered table's eviction guard may go
-- only with its table; a relation capture covers may be dropped only with the registered table.
CREATE OR REPLACE FUNCTION coldharbor.guard_capture_drops()
RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    r record;
BEGIN
    SELECT d.object_identity, t.schema_name, t.table_name INTO r
      FROM pg_event_trigger_dropped_objects() d
      JOIN coldharbor.tables t
        ON t.table_id = coldharbor.registration_of(to_regclass(format('%I.%I', d.address_names[1], d.address_names[2])))
     WHERE d.object_type = 'trigger'
       AND (d.address_names[3] ~ '^coldharbor_capture_(ins|upd|del|trunc)$'
            OR (d.address_names[3] = 'coldharbor_evict_guard' AND t.hot_retention IS NOT NULL))
     LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'cannot drop trigger %: it captures the changes of %.%, which is registered with coldharbor',
            r.object_identity, quote_ident(r.schema_name), quote_ident(r.table_name)
            USING ERRCODE = 'insufficient_privilege',
                  HINT = 'Capture is part of the table''s registration; see README, "Roles and privileges".';
    END IF;

    -- (The dropped capture trigger confirms the oid is the covered relation's, not a later table's.)
    SELECT d.object_identity, t.schema_name, t.table_name INTO r
      FROM pg_event_trigger_dropped_objects() d
      JOIN coldharbor.tables t ON d.objid = ANY (t.capture_relations)
     WHERE d.object_type IN ('table', 'partitioned table', 'foreign table')
       AND to_regclass(format('%I.%I', t.schema_name, t.table_name)) IS NOT NULL
       AND EXISTS (SELECT 1 FROM pg_event_trigger_dropped_objects() g
                    WHERE g.object_type = 'trigger' AND g.address_names[1:2] = d.address_names[1:2]
                      AND g.address_names[3] = 'coldharbor_capture_ins')
     LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'cannot drop table %: it is a partition of %.%, which is registered with coldharbor, '
                        'and its rows would leave that table uncaptured', r.object_identity,
                        quote_ident(r.schema_name), quote_ident(r.table_name)
            USING ERRCODE = 'insufficient_privilege',
                  HINT = format('Detach it first (ALTER TABLE %I.%I DETACH PARTITION %s): the rows it holds are then '
                                'captured as deletes, and it can be dropped.', r.schema_name, r.table_name, r.object_identity);
    END IF;
END;
$$;

-- Refuses DDL that would stop capture or the eviction guard of a registered table, or its partitions:
-- dropping, disabling or replacing one of their triggers, renaming or moving the registered table.
CREATE OR REPLACE FUNCTION coldharbor.guard_capture_triggers()
RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    r record;
BEGIN
    FOR r IN
        -- The triggers the command made or changed, and every trigger of a table it altered. (Only the
        -- former for a trigger command: a table leaving the tree has its triggers made inert one by one.)
        WITH touched AS (
            SELECT tg.oid FROM pg_event_trigger_ddl_commands() c JOIN pg_trigger tg ON tg.tgrelid = c.objid
             WHERE c.classid = 'pg_class'::regclass
            UNION
            SELECT c.objid FROM pg_event_trigger_ddl_commands() c WHERE c.classid = 'pg_trigger'::regclass),
        triggers AS (
            SELECT tg.tgname, tg.tgenabled, tg.tgrelid::regclass AS rel,
                   CASE WHEN p.pronamespace = 'coldharbor'::regnamespace
                        THEN substring(p.proname FROM '^capture_([0-9]+)_(?:ins|upd|del|trunc)$')::integer END AS fn_table_id,
                   CASE WHEN p.pronamespace = 'coldharbor'::regnamespace
                        THEN coalesce(substring(p.proname FROM '^capture_[0-9]+_(ins|upd|del|trunc)$'),
                                      CASE p.proname WHEN 'evict_guard' THEN 'evict_guard' WHEN 'capture_off' THEN 'off' END)
                   END AS fn_kind,
                   coalesce(substring(tg.tgname FROM '^coldharbor_capture_(ins|upd|del|trunc)$'),
                            CASE WHEN tg.tgname = 'coldharbor_evict_guard' THEN 'evict_guard' END) AS tg_kind,
                   coldharbor.registration_of(tg.tgrelid) AS here
              FROM touched
              JOIN pg_trigger tg ON tg.oid = touched.oid AND NOT tg.tgisinternal
              JOIN pg_proc p ON p.oid = tg.tgfoid)
        SELECT g.*, owner.schema_name AS owner_schema, owner.table_name AS owner_table
          FROM triggers g
          LEFT JOIN coldharbor.tables owner ON owner.table_id = g.fn_table_id
         WHERE g.fn_kind IS NOT NULL OR (g.tg_kind IS NOT NULL AND g.here IS NOT NULL)
    LOOP
        IF r.fn_table_id IS NOT NULL AND r.here IS DISTINCT FROM r.fn_table_id THEN
            RAISE EXCEPTION 'cannot rename or move table %.%: it is registered with coldharbor under that name',
                quote_ident(r.owner_schema), quote_ident(r.owner_table)
                USING ERRCODE = 'insufficient_privilege';
        END IF;
        IF r.tgenabled NOT IN ('O', 'A') AND r.fn_kind IS DISTINCT FROM 'off' THEN
            RAISE EXCEPTION 'cannot disable trigger % on %: it captures the changes of a table registered with coldharbor',
                quote_ident(r.tgname), r.rel
                USING ERRCODE = 'insufficient_privilege';
        END IF;
        IF r.here IS NOT NULL
           AND NOT coalesce((r.tg_kind = r.fn_kind AND r.fn_table_id = r.here)
                             OR (r.tg_kind = 'evict_guard' AND r.fn_kind IN ('evict_guard', 'off')), false) THEN
            RAISE EXCEPTION 'cannot change trigger % on %: it captures the changes of a table registered with coldharbor',
                quote_ident(r.tgname), r.rel
                USING ERRCODE = 'insufficient_privilege';
        END IF;
    END LOOP;
END;
$$;

-- The event triggers that are missing, created when a superuser migrates (only a superuser may
-- create one); the names of those it could not create otherwise.
-- Since 027: with guard_concurrent_detach (sql/definitions/050_tiering.sql) among them.
CREATE OR REPLACE FUNCTION coldharbor.install_ddl_triggers()
RETURNS text[]
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_wanted  text[][] := ARRAY[
        ['coldharbor_guard_capture_ddl', 'ddl_command_end', 'coldharbor.guard_capture'],
        ['coldharbor_guard_capture_drop', 'sql_drop', 'coldharbor.guard_capture'],
        ['coldharbor_grant_partition_capture', 'ddl_command_end', 'coldharbor.grant_partition_capture'],
        ['coldharbor_rebase_ddl', 'ddl_command_end', 'coldharbor.rebase_on_ddl'],
        ['coldharbor_rebase_rewrite', 'table_rewrite', 'coldharbor.rebase_on_ddl'],
        ['coldharbor_evicted_rows_guard', 'ddl_command_end', 'coldharbor.guard_evicted_rows'],
        ['coldharbor_evicted_keys_watch', 'ddl_command_start', 'coldharbor.watch_evicted_keys'],
        ['coldharbor_note_registered_drop', 'sql_drop', 'coldharbor.note_registered_drop'],
        ['coldharbor_guard_concurrent_detach', 'ddl_command_start', 'coldharbor.guard_concurrent_detach']];
    v_missing text[] := '{}';
    i         integer;
BEGIN
    FOR i IN 1 .. array_length(v_wanted, 1) LOOP
        CONTINUE WHEN EXISTS (SELECT 1 FROM pg_event_trigger WHERE evtname = v_wanted[i][1]);
        IF (SELECT rolsuper FROM pg_roles WHERE rolname = current_user) THEN
            EXECUTE format('CREATE EVENT TRIGGER %I ON %s EXECUTE FUNCTION %s()',
                           v_wanted[i][1], v_wanted[i][2], v_wanted[i][3]);
        ELSE
            v_missing := v_missing || v_wanted[i][1];
        END IF;
    END LOOP;
    RETURN v_missing;
END;
$$;

-- The event triggers above, created when a superuser migrates (only a superuser can); another role is
-- warned, and a superuser can run SELECT coldharbor.install_ddl_triggers() later.
DO $triggers$
DECLARE
    v_missing text[] := coldharbor.install_ddl_triggers();
BEGIN
    IF cardinality(v_missing) > 0 THEN
        RAISE WARNING 'not a superuser: event triggers % were not created; run SELECT coldharbor.install_ddl_triggers() '
                      'as a superuser for DDL on registered tables to be seen', array_to_string(v_missing, ', ');
    END IF;
END
$triggers$;

-- Freshness promises (issue 25, part 3): each registered table promises how far behind PostgreSQL
-- its lake may fall (`register_table(..., p_freshness => '5 minutes')`; 5 minutes unless asked).
-- When its oldest dirty change is older than that, the coldharbor_cdc DAG's check_freshness task
-- fails naming the table and its lag (the alert: Airflow's failure callbacks and notifiers), and
-- the health page shows the table red, with the rule.

ALTER TABLE coldharbor.tables ADD COLUMN freshness interval NOT NULL DEFAULT '5 minutes'
    CONSTRAINT tables_freshness_check CHECK (freshness > '0'::interval AND freshness <= '30 days'::interval
                                             AND extract(month FROM freshness) = 0 AND extract(year FROM freshness) = 0);

-- Sets the freshness a registered table promises, as the schema owner, for a caller who may
-- register it.
CREATE FUNCTION coldharbor.set_freshness_as_owner(p_table regclass, p_freshness interval)
RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM coldharbor.check_may_register(p_table, session_user);
    -- Months and years have no fixed length: the page, the metrics and the alert all count seconds.
    IF p_freshness IS NULL OR p_freshness <= '0'::interval OR p_freshness > '30 days'::interval
       OR extract(month FROM p_freshness) <> 0 OR extract(year FROM p_freshness) <> 0 THEN
        RAISE EXCEPTION 'cannot register %: p_freshness must be an interval above 0 and at most 30 days, in days, hours, minutes or seconds (not months), not %',
            p_table, coalesce(quote_literal(p_freshness::text), 'NULL')
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'How far behind PostgreSQL the lake may fall before the table counts as lagging, '
                      || 'e.g. p_freshness => ''5 minutes''.';
    END IF;
    UPDATE coldharbor.tables SET freshness = p_freshness WHERE source_kind = 'table' AND relid = p_table::oid;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'cannot set the freshness of %: it is not a registered table', p_table
            USING ERRCODE = 'undefined_object',
                  HINT = 'Register it with coldharbor.register_table(..., p_freshness => ...).';
    END IF;
END;
$$;

-- As 021's, with p_freshness (NULL: a new registration promises 5 minutes, a registration again
-- keeps what the table had).
DROP FUNCTION coldharbor.register_table(regclass, text, text[], text[], interval, text);
CREATE FUNCTION coldharbor.register_table(
    p_table         regclass,
    p_lake_location text     DEFAULT NULL,
    p_partition_by  text[]   DEFAULT '{}',
    p_sort_by       text[]   DEFAULT '{}',
    p_hot_retention interval DEFAULT NULL,
    p_history       text     DEFAULT NULL,
    p_freshness     interval DEFAULT NULL)
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
    IF p_freshness IS NOT NULL THEN
        PERFORM coldharbor.set_freshness_as_owner(p_table, p_freshness);
    END IF;
    RETURN v_id;
END;
$$;

-- As 021's, except that the application's entry points are granted by name (every signature of
-- each, as pg_proc holds them), so a parameter added to one needs no new copy of this function.
-- (The list is APP_ENTRY_POINTS in tests/integration/test_roles.py.)
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
    FOR r IN SELECT p.oid::regprocedure AS fn FROM pg_proc p
              WHERE p.pronamespace = 'coldharbor'::regnamespace
                AND p.proname IN ('register_table', 'register_table_as_owner', 'set_history_as_owner',
                                  'set_freshness_as_owner', 'check_may_register', 'grant_capture_privileges',
                                  'put_entity', 'delete_entity') LOOP
        EXECUTE format('GRANT EXECUTE ON FUNCTION %s TO coldharbor_app', r.fn);
    END LOOP;

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

-- Ownership and privileges of everything in the schema (invariant 14).
-- (Definitions: each object here only, CREATE OR REPLACE; see sql/README.md.)

-- (Re)applies ownership and privileges; idempotent. migrate.py runs it after every migration, so
-- whatever a later migration creates is owned by coldharbor_owner and has no PUBLIC EXECUTE.
--   functions  no PUBLIC EXECUTE on any. The pipeline may execute every function that runs with
--              its caller's privileges (SECURITY INVOKER: it can do nothing through one that it
--              could not do itself) except trigger functions; of the SECURITY DEFINER ones, only
--              those granted to it by name (evict, purge_rows). coldharbor_app: register_table,
--              put_entity, delete_entity.
--   tables     the pipeline reads every table of the schema and writes the jobs' own state; the
--              tables that define what is captured and registered are the owner's alone.
-- Since 011: with evict_guard among the triggers that may run when the schema owner deletes
-- (owner_delete_refusal) and coldharbor.evictions among the tables only the owner writes.
-- Since 021: granting register_table and set_history_as_owner (sql/definitions/030_registration.sql).
-- Since 022: except that the application's entry points are granted by name (every signature of
-- each, as pg_proc holds them), so a parameter added to one needs no new copy of this function.
-- (The list is APP_ENTRY_POINTS in tests/integration/capture/test_roles.py.)
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
    -- The registry, the entity store, capture's own state and the migration logs are written only by
    -- the owner's functions (and set-up). change_log: the pipeline marks (UPDATE) and prunes
    -- (DELETE); only capture inserts. The registry: the pipeline only advances batch ids
    REVOKE INSERT, UPDATE, DELETE ON coldharbor.tables, coldharbor.entity_schemas, coldharbor.entity_main,
                                     coldharbor.eav_data, coldharbor.schema_migrations, coldharbor.schema_definitions,
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

-- Objects the owner creates while running (capture functions, entity views) get the same.
ALTER DEFAULT PRIVILEGES FOR ROLE coldharbor_owner REVOKE EXECUTE ON FUNCTIONS FROM PUBLIC;

ALTER DEFAULT PRIVILEGES FOR ROLE coldharbor_owner IN SCHEMA coldharbor
    GRANT SELECT ON TABLES TO coldharbor_pipeline;

ALTER DEFAULT PRIVILEGES FOR ROLE coldharbor_owner IN SCHEMA entities
    GRANT SELECT ON TABLES TO coldharbor_pipeline, coldharbor_app;

REVOKE ALL ON FUNCTION coldharbor.install_ddl_triggers() FROM PUBLIC;

REVOKE ALL ON FUNCTION coldharbor.reconcile_columns_seen() FROM PUBLIC;

-- An entry point of the application's that apply_privileges does not grant by name, and the export's.
REVOKE ALL ON FUNCTION coldharbor.set_mode_as_owner(regclass, text), coldharbor.remove_landed(integer),
                       coldharbor.landing_rows(integer) FROM PUBLIC;

GRANT EXECUTE ON FUNCTION coldharbor.set_mode_as_owner(regclass, text) TO coldharbor_app;

GRANT EXECUTE ON FUNCTION coldharbor.remove_landed(integer), coldharbor.landing_rows(integer) TO coldharbor_pipeline;

REVOKE ALL ON FUNCTION coldharbor.keep_old_images(integer) FROM PUBLIC;

GRANT EXECUTE ON FUNCTION coldharbor.keep_old_images(integer) TO coldharbor_pipeline;

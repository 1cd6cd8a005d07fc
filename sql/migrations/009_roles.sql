-- Least privilege in PostgreSQL (invariant 14).
--
--   coldharbor_owner     NOLOGIN. Owns the schemas coldharbor, entities and reports and every object in
--                        coldharbor and entities. Capture, registration, eviction and purge run as it,
--                        through SECURITY DEFINER functions with a fixed search_path.
--   coldharbor_pipeline  LOGIN, the jobs' role (no superuser; its password is set by set-up, never
--                        here). Reads the schema and the registered tables, writes the jobs' own
--                        state, owns the report tables, may call evict() and purge_rows().
--   coldharbor_app       NOLOGIN group for applications that register their own tables or write
--                        entities: register_table, put_entity, delete_entity. An application that
--                        only writes its registered tables needs nothing: capture runs as the owner.
--
-- Capture used to be suspended by the session setting coldharbor.evicting, which any session could
-- set. It is now suspended only for a (transaction, table) pair recorded in the owner-only table
-- coldharbor.capture_suspended, which only evict() and purge_rows() write, inside their own body.
--
-- Privileges are (re)applied by coldharbor.apply_privileges(), which migrate.py runs after every
-- migration, so objects later migrations create are owned by coldharbor_owner and have no PUBLIC
-- EXECUTE either.
DO $roles$
DECLARE
    r record;
BEGIN
    -- Roles are cluster-wide: another database of the cluster may have created them already.
    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = 'coldharbor_owner') THEN
        CREATE ROLE coldharbor_owner NOLOGIN;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = 'coldharbor_pipeline') THEN
        CREATE ROLE coldharbor_pipeline LOGIN;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = 'coldharbor_app') THEN
        CREATE ROLE coldharbor_app NOLOGIN;
    END IF;
    -- Roles found with more power than they are meant to have are refused, not silently kept.
    FOR r IN SELECT rolname FROM pg_catalog.pg_roles
              WHERE rolname IN ('coldharbor_owner', 'coldharbor_pipeline', 'coldharbor_app')
                AND (rolsuper OR rolcreaterole OR rolcreatedb OR rolreplication OR rolbypassrls) LOOP
        RAISE EXCEPTION 'role % exists with superuser, createrole, createdb, replication or bypassrls; '
                        'coldharbor needs it without', r.rolname
            USING ERRCODE = 'insufficient_privilege',
                  HINT = format('ALTER ROLE %I NOSUPERUSER NOCREATEROLE NOCREATEDB NOREPLICATION NOBYPASSRLS', r.rolname);
    END LOOP;
    IF pg_catalog.pg_has_role('coldharbor_pipeline', 'coldharbor_owner', 'MEMBER')
       OR pg_catalog.pg_has_role('coldharbor_app', 'coldharbor_owner', 'MEMBER') THEN
        RAISE EXCEPTION 'coldharbor_pipeline and coldharbor_app must not be members of coldharbor_owner'
            USING ERRCODE = 'insufficient_privilege';
    END IF;
END
$roles$;

-- One row per transaction and table whose deletes evict() or purge_rows() is making right now.
-- Only the owner may write it; rows live for one statement of one transaction (UNLOGGED: after a
-- crash there is nothing to keep). xid8 never wraps, so a row can never match another transaction.
CREATE UNLOGGED TABLE coldharbor.capture_suspended (
    xact     xid8    NOT NULL,
    table_id integer NOT NULL,
    PRIMARY KEY (xact, table_id)
);

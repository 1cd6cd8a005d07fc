-- Partitions are captured, and the eviction guard is protected (issue 20, attack findings 1 and 2).
--
-- A statement-level trigger on a partitioned table fires only for statements that name that table:
-- INSERT, UPDATE, DELETE or TRUNCATE naming a partition fired none of the registered table's capture
-- triggers, nor its eviction guard. Now every relation of a registered table's partition tree (the
-- table, its partitions, theirs) carries the same triggers, calling the same functions. A statement
-- fires the statement triggers of the relation it names only, so each change is logged once:
--   INSERT/UPDATE/DELETE  by the triggers of the relation the statement names (its transition
--                         tables hold every row it changed, in that relation or below it);
--   TRUNCATE              fires the truncate triggers of every relation it empties, so each plain
--                         table (leaf) logs its own rows and a partitioned one logs none (log_rows).
-- The tree changes with DDL, which event triggers see (created only by a superuser, as in 009):
--   CREATE TABLE ... PARTITION OF   the new partition gets the triggers (it holds no rows);
--   ATTACH PARTITION                the attached table (and its partitions) get the triggers, and the
--                                   rows it brings into the registered table are logged as inserts;
--   DETACH PARTITION                the rows that leave are logged as deletes, and the detached
--                                   table's triggers are made inert (capture_off: the schema owner may
--                                   create triggers on a table, not drop them; its owner may drop them);
--   DROP TABLE of a partition       refused while its registered table remains: its rows would leave
--                                   uncaptured (DROP fires no trigger and reads nothing). Detach first.
-- coldharbor.tables.capture_relations records the relations capture covers, so the event trigger
-- knows what was attached, detached or dropped. A registered table must be the root of its tree:
-- registering a partition, or attaching a registered table under another, is refused (writes through
-- the parent would not fire its triggers).
--
-- New partitions must let the schema owner create triggers on them and read them (TRUNCATE, ATTACH,
-- DETACH capture read their rows). Only the partition's owner can grant that, so a second event
-- trigger, running as whoever ran the DDL (the owner of the new partition), grants SELECT and TRIGGER
-- on partitions of tables the schema owner already captures; it fires first (event triggers fire in
-- name order: coldharbor_grant... before coldharbor_guard...).
--
-- The eviction guard (011) is protected as the capture triggers are: it cannot be dropped, disabled,
-- renamed or replaced while its table is tiered. Removing a table's hot retention makes it inert
-- (it used to be dropped, which the schema owner may not do: registering again failed).

ALTER TABLE coldharbor.tables ADD COLUMN capture_relations oid[] NOT NULL DEFAULT '{}';

-- What a capture trigger the schema owner can no longer drop runs: nothing.
CREATE FUNCTION coldharbor.capture_off()
RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    RETURN NULL;
END;
$$;

-- The table_id of the registered table whose partition tree holds relation p_rel (p_rel itself or
-- its nearest registered ancestor), or NULL.
CREATE FUNCTION coldharbor.registration_of(p_rel oid)
RETURNS integer
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    SELECT t.table_id
      FROM (SELECT p_rel AS relid, 0::bigint AS depth
            UNION ALL
            SELECT a.relid, a.depth FROM pg_partition_ancestors(p_rel) WITH ORDINALITY AS a(relid, depth)) a
      JOIN pg_class c ON c.oid = a.relid
      JOIN pg_namespace n ON n.oid = c.relnamespace
      JOIN coldharbor.tables t ON t.source_kind = 'table' AND t.schema_name = n.nspname AND t.table_name = c.relname
     ORDER BY a.depth
     LIMIT 1
$$;

-- The relations of registered table p_table_id's partition tree: the table and its partitions, at any depth.
CREATE FUNCTION coldharbor.capture_tree(p_table_id integer)
RETURNS SETOF oid
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    WITH root AS (
        SELECT to_regclass(format('%I.%I', schema_name, table_name)) AS relid
          FROM coldharbor.tables WHERE table_id = p_table_id AND source_kind = 'table')
    SELECT relid FROM root WHERE relid IS NOT NULL
    UNION
    SELECT m.relid FROM root CROSS JOIN LATERAL pg_partition_tree(root.relid) m
$$;

-- Logs every row relation p_rel holds as a change p_op of registered table p_table_id: the rows a
-- TRUNCATE removes, an ATTACH brings in, a DETACH takes away (p_cause names which). A partitioned
-- table holds no rows of its own: its partitions are logged one by one. The rows are read as the
-- schema owner, whom row-level security policies would filter (and whose privileges they would
-- run with): a relation with row-level security is refused.
CREATE FUNCTION coldharbor.log_rows(p_table_id integer, p_rel regclass, p_op "char", p_cause text)
RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_kind "char";
    v_rls  boolean;
BEGIN
    SELECT relkind, relrowsecurity INTO STRICT v_kind, v_rls FROM pg_class WHERE oid = p_rel;
    IF v_rls THEN
        RAISE EXCEPTION 'cannot capture % of %: it has row-level security', p_cause, p_rel
            USING ERRCODE = 'feature_not_supported',
                  HINT = CASE p_cause WHEN 'TRUNCATE' THEN 'Delete the rows instead.'
                         ELSE 'Capture reads its rows as the schema owner; disable its row-level security first.' END;
    END IF;
    IF v_kind = 'r' THEN
        EXECUTE format('INSERT INTO coldharbor.change_log (table_id, key, op) SELECT %s, %s, %L FROM %s o',
                       p_table_id, coldharbor.key_sql(p_table_id, 'o'), p_op, p_rel);
    END IF;
END;
$$;

-- (Re)creates the capture triggers of one relation of registered table p_table_id's tree (the table
-- or a partition of it), and its eviction guard when the table is tiered. The schema owner needs
-- TRIGGER and SELECT on it, which registration (or, for a later partition, the grant event trigger)
-- gave; a foreign table cannot be captured: its rows change where no trigger sees them.
CREATE FUNCTION coldharbor.capture_relation(p_table_id integer, p_rel regclass)
RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    t        coldharbor.tables;
    v_prefix text := format('coldharbor.capture_%s', p_table_id);
    v_kind   "char";
BEGIN
    SELECT * INTO STRICT t FROM coldharbor.tables WHERE table_id = p_table_id;
    SELECT relkind INTO STRICT v_kind FROM pg_class WHERE oid = p_rel;
    IF v_kind NOT IN ('r', 'p') THEN
        RAISE EXCEPTION 'cannot capture %, a partition of %.%: it is not a table (relkind %), so its rows change where capture does not see them',
            p_rel, quote_ident(t.schema_name), quote_ident(t.table_name), v_kind
            USING ERRCODE = 'wrong_object_type';
    END IF;
    IF NOT (has_table_privilege(p_rel, 'TRIGGER') AND has_table_privilege(p_rel, 'SELECT')) THEN
        RAISE EXCEPTION 'cannot capture %, a partition of %.%: role coldharbor_owner lacks TRIGGER or SELECT on it',
            p_rel, quote_ident(t.schema_name), quote_ident(t.table_name)
            USING ERRCODE = 'insufficient_privilege',
                  HINT = format('Its owner runs GRANT SELECT, TRIGGER ON %s TO coldharbor_owner.', p_rel);
    END IF;
    EXECUTE format('CREATE OR REPLACE TRIGGER coldharbor_capture_ins AFTER INSERT ON %s '
                   'REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION %s_ins()', p_rel, v_prefix);
    EXECUTE format('CREATE OR REPLACE TRIGGER coldharbor_capture_upd AFTER UPDATE ON %s '
                   'REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows '
                   'FOR EACH STATEMENT EXECUTE FUNCTION %s_upd()', p_rel, v_prefix);
    EXECUTE format('CREATE OR REPLACE TRIGGER coldharbor_capture_del AFTER DELETE ON %s '
                   'REFERENCING OLD TABLE AS old_rows FOR EACH STATEMENT EXECUTE FUNCTION %s_del()', p_rel, v_prefix);
    EXECUTE format('CREATE OR REPLACE TRIGGER coldharbor_capture_trunc BEFORE TRUNCATE ON %s '
                   'FOR EACH STATEMENT EXECUTE FUNCTION %s_trunc()', p_rel, v_prefix);
    -- A tiered table's writes must not race an eviction unnoticed (evict_guard, 011).
    IF t.hot_retention IS NOT NULL THEN
        EXECUTE format('CREATE OR REPLACE TRIGGER coldharbor_evict_guard BEFORE UPDATE OR DELETE ON %s '
                       'FOR EACH STATEMENT EXECUTE FUNCTION coldharbor.evict_guard(%L)', p_rel, p_table_id);
    ELSIF EXISTS (SELECT 1 FROM pg_trigger WHERE tgrelid = p_rel AND tgname = 'coldharbor_evict_guard') THEN
        EXECUTE format('CREATE OR REPLACE TRIGGER coldharbor_evict_guard BEFORE UPDATE OR DELETE ON %s '
                       'FOR EACH STATEMENT EXECUTE FUNCTION coldharbor.capture_off()', p_rel);
    END IF;
END;
$$;

-- Makes the coldharbor triggers of a relation that left a registered table's tree inert (the schema
-- owner cannot drop them; the relation's owner may).
CREATE FUNCTION coldharbor.release_relation(p_rel regclass)
RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    r record;
BEGIN
    FOR r IN SELECT tg.tgname,
                    CASE WHEN tg.tgtype & 32 <> 0 THEN 'BEFORE TRUNCATE'       -- TRIGGER_TYPE_TRUNCATE
                         WHEN tg.tgname = 'coldharbor_evict_guard' THEN 'BEFORE UPDATE OR DELETE'
                         WHEN tg.tgtype & 4 <> 0 THEN 'AFTER INSERT'           -- TRIGGER_TYPE_INSERT
                         WHEN tg.tgtype & 16 <> 0 THEN 'AFTER UPDATE'          -- TRIGGER_TYPE_UPDATE
                         ELSE 'AFTER DELETE' END AS event
               FROM pg_trigger tg JOIN pg_proc p ON p.oid = tg.tgfoid
              WHERE tg.tgrelid = p_rel AND p.pronamespace = 'coldharbor'::regnamespace
                AND (p.proname ~ '^capture_[0-9]+_(ins|upd|del|trunc)$' OR p.proname = 'evict_guard') LOOP
        EXECUTE format('CREATE OR REPLACE TRIGGER %I %s ON %s FOR EACH STATEMENT EXECUTE FUNCTION coldharbor.capture_off()',
                       r.tgname, r.event, p_rel);
    END LOOP;
END;
$$;

-- (Re)creates the capture of one registered table: four trigger functions owned by the schema owner
-- (SECURITY DEFINER, fixed search_path, no EXECUTE for anyone else) and, on the table and every
-- partition of it, the statement-level triggers calling them (capture_relation). Records the
-- relations it covers; one that left the tree since (detached while no event trigger watched) gets
-- inert triggers. Logs no rows: rows a table held at registration reach the lake by its initial load.
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
BEGIN
    SELECT * INTO STRICT t FROM coldharbor.tables WHERE table_id = p_table_id;
    v_prefix := format('coldharbor.capture_%s', t.table_id);
    v_key_n := coldharbor.key_sql(p_table_id, 'n');
    v_key_o := coldharbor.key_sql(p_table_id, 'o');
    SELECT string_agg(format('n.%I = o.%I', c, c), ' AND ') INTO v_join FROM unnest(t.key_columns) AS c;
    v_first := quote_ident(t.key_columns[1]);

    EXECUTE format($f$
        CREATE OR REPLACE FUNCTION %s_ins() RETURNS trigger
        LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $b$
        BEGIN
            INSERT INTO coldharbor.change_log (table_id, key, op)
            SELECT %s, %s, 'I' FROM new_rows n;
            RETURN NULL;
        END $b$$f$, v_prefix, t.table_id, v_key_n);

    -- Eviction is not deletion (invariant 10): deletes that evict() or purge_rows() make log nothing.
    EXECUTE format($f$
        CREATE OR REPLACE FUNCTION %s_del() RETURNS trigger
        LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $b$
        BEGIN
            IF EXISTS (SELECT 1 FROM coldharbor.capture_suspended
                        WHERE xact = pg_current_xact_id() AND table_id = %s) THEN
                RETURN NULL;
            END IF;
            INSERT INTO coldharbor.change_log (table_id, key, op)
            SELECT %s, %s, 'D' FROM old_rows o;
            RETURN NULL;
        END $b$$f$, v_prefix, t.table_id, t.table_id, v_key_o);

    -- An UPDATE that changes a key logs a delete of the old key and an insert of the new one.
    EXECUTE format($f$
        CREATE OR REPLACE FUNCTION %s_upd() RETURNS trigger
        LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $b$
        BEGIN
            INSERT INTO coldharbor.change_log (table_id, key, op)
            SELECT %s,
                   CASE WHEN n.%s IS NULL THEN %s ELSE %s END,
                   CASE WHEN o.%s IS NULL THEN 'I' WHEN n.%s IS NULL THEN 'D' ELSE 'U' END
            FROM new_rows n FULL JOIN old_rows o ON %s;
            RETURN NULL;
        END $b$$f$, v_prefix, t.table_id, v_first, v_key_o, v_key_n, v_first, v_first, v_join);

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

-- Brings the capture of registered table p_table_id up to its partition tree after DDL changed it
-- (the ddl_command_end event trigger): relations attached or created since get the triggers and
-- their rows are logged as inserts (a new partition has none); relations detached since have their
-- rows logged as deletes and their triggers made inert. The log and the DDL commit together.
CREATE FUNCTION coldharbor.capture_partitions(p_table_id integer)
RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    t      coldharbor.tables;
    v_tree oid[];
    v_rel  oid;
BEGIN
    SELECT * INTO STRICT t FROM coldharbor.tables WHERE table_id = p_table_id;
    -- A table created again under a registered name is not captured until it is registered again.
    IF NOT coalesce(to_regclass(format('%I.%I', t.schema_name, t.table_name))::oid = ANY (t.capture_relations), false) THEN
        RETURN;
    END IF;
    v_tree := ARRAY(SELECT m FROM coldharbor.capture_tree(p_table_id) AS m ORDER BY m);   -- sorted: compared below
    FOR v_rel IN SELECT m FROM unnest(v_tree) AS m WHERE m <> ALL (t.capture_relations) LOOP
        PERFORM coldharbor.capture_relation(p_table_id, v_rel::regclass);
        PERFORM coldharbor.log_rows(p_table_id, v_rel::regclass, 'I', 'ATTACH PARTITION');
    END LOOP;
    FOR v_rel IN SELECT m FROM unnest(t.capture_relations) AS m
                  WHERE m <> ALL (v_tree) AND EXISTS (SELECT 1 FROM pg_class WHERE oid = m) LOOP
        PERFORM coldharbor.log_rows(p_table_id, v_rel::regclass, 'D', 'DETACH PARTITION');
        PERFORM coldharbor.release_relation(v_rel::regclass);
    END LOOP;
    IF v_tree IS DISTINCT FROM t.capture_relations THEN
        UPDATE coldharbor.tables SET capture_relations = v_tree WHERE table_id = p_table_id;
    END IF;
END;
$$;

-- The sql_drop half of guard_capture. A capture trigger or a tiered table's eviction guard may go
-- only with its table; a relation capture covers may be dropped only with the registered table.
CREATE FUNCTION coldharbor.guard_capture_drops()
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
CREATE FUNCTION coldharbor.guard_capture_triggers()
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

-- As 009's, with partitions: after CREATE TABLE or ALTER TABLE of a relation of a registered table's
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

-- Runs as whoever ran CREATE TABLE ... PARTITION OF or ALTER TABLE ... ATTACH PARTITION (the owner
-- of the new partition, who alone can grant on it): the schema owner gets SELECT and TRIGGER on the
-- partitions of a table it captures (it holds TRIGGER on the root), so guard_capture can capture
-- them. A grant that cannot be made is left to guard_capture, which refuses naming it.
CREATE FUNCTION coldharbor.grant_partition_capture()
RETURNS event_trigger
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_rel regclass;
BEGIN
    IF TG_TAG NOT IN ('CREATE TABLE', 'CREATE FOREIGN TABLE', 'ALTER TABLE') THEN
        RETURN;
    END IF;
    FOR v_rel IN
        SELECT DISTINCT m.relid
          FROM pg_event_trigger_ddl_commands() c
          CROSS JOIN LATERAL pg_partition_root(c.objid) AS root(relid)
          CROSS JOIN LATERAL pg_partition_tree(root.relid) m
         WHERE c.classid = 'pg_class'::regclass AND c.object_type IN ('table', 'foreign table')
           AND has_table_privilege('coldharbor_owner', root.relid, 'TRIGGER')
           AND NOT (has_table_privilege('coldharbor_owner', m.relid, 'TRIGGER')
                    AND has_table_privilege('coldharbor_owner', m.relid, 'SELECT'))
    LOOP
        BEGIN
            EXECUTE format('GRANT SELECT, TRIGGER ON %s TO coldharbor_owner', v_rel);
        EXCEPTION WHEN insufficient_privilege THEN
            NULL;   -- said by guard_capture, with the way out
        END;
    END LOOP;
END;
$$;

DO $guard$
BEGIN
    IF (SELECT rolsuper FROM pg_catalog.pg_roles WHERE rolname = current_user) THEN
        CREATE EVENT TRIGGER coldharbor_grant_partition_capture ON ddl_command_end
            EXECUTE FUNCTION coldharbor.grant_partition_capture();
    ELSE
        RAISE WARNING 'not a superuser: the event trigger that lets partitions created or attached later be captured '
                      'was not created; a superuser can create it later (see README)';
    END IF;
END
$guard$;

-- As 009's, and the same on every partition of the table: what capture_relation needs there.
CREATE OR REPLACE FUNCTION coldharbor.grant_capture_privileges(p_table regclass)
RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_schema oid;
    v_keys   text;
    v_part   regclass;
BEGIN
    FOR v_schema IN SELECT DISTINCT c.relnamespace FROM pg_class c
                     WHERE c.oid = p_table OR c.oid IN (SELECT relid FROM pg_partition_tree(p_table)) LOOP
        IF NOT (has_schema_privilege('coldharbor_owner', v_schema, 'USAGE')
                AND has_schema_privilege('coldharbor_pipeline', v_schema, 'USAGE')) THEN
            BEGIN
                EXECUTE format('GRANT USAGE ON SCHEMA %s TO coldharbor_owner, coldharbor_pipeline', v_schema::regnamespace);
            EXCEPTION WHEN insufficient_privilege THEN
                NULL;   -- said below, with the way out
            END;
            IF NOT (has_schema_privilege('coldharbor_owner', v_schema, 'USAGE')
                    AND has_schema_privilege('coldharbor_pipeline', v_schema, 'USAGE')) THEN
                RAISE EXCEPTION 'cannot register %: roles coldharbor_owner and coldharbor_pipeline need USAGE on schema %, '
                                'which only its owner can grant', p_table, v_schema::regnamespace
                    USING ERRCODE = 'insufficient_privilege',
                          HINT = format('GRANT USAGE ON SCHEMA %s TO coldharbor_owner, coldharbor_pipeline;', v_schema::regnamespace);
            END IF;
        END IF;
    END LOOP;
    EXECUTE format('GRANT SELECT ON %s TO coldharbor_pipeline', p_table);
    EXECUTE format('GRANT SELECT, DELETE, TRIGGER ON %s TO coldharbor_owner', p_table);
    SELECT string_agg(quote_ident(a.attname), ', ') INTO v_keys
      FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY (i.indkey)
     WHERE i.indrelid = p_table AND i.indisprimary;
    IF v_keys IS NOT NULL THEN   -- without a key the registration itself refuses the table
        EXECUTE format('GRANT UPDATE (%s) ON %s TO coldharbor_owner', v_keys, p_table);
    END IF;
    FOR v_part IN SELECT relid FROM pg_partition_tree(p_table) WHERE relid <> p_table LOOP
        BEGIN
            EXECUTE format('GRANT SELECT, TRIGGER ON %s TO coldharbor_owner', v_part);
        EXCEPTION WHEN insufficient_privilege THEN
            NULL;   -- another role's partition: capture_relation names it and the grant its owner runs
        END;
    END LOOP;
END;
$$;

-- As 009's, and a partition cannot be registered: writes through its parent would fire none of its
-- capture triggers.
CREATE OR REPLACE FUNCTION coldharbor.register_table_as_owner(
    p_table         regclass,
    p_lake_location text,
    p_partition_by  text[],
    p_sort_by       text[],
    p_hot_retention interval)
RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_root regclass;
BEGIN
    -- session_user: the login that called, whatever this function runs as.
    PERFORM coldharbor.check_may_register(p_table, session_user);
    SELECT pg_partition_root(p_table) INTO v_root FROM pg_class WHERE oid = p_table AND relispartition;
    IF v_root IS NOT NULL THEN
        RAISE EXCEPTION 'cannot register %: it is a partition of %, and writes through % would bypass its capture',
            p_table, v_root, v_root
            USING ERRCODE = 'wrong_object_type',
                  HINT = format('Register %s: every partition of it is captured.', v_root);
    END IF;
    IF p_lake_location IS NOT NULL AND NOT pg_has_role(session_user, 'coldharbor_owner', 'USAGE')
       AND p_lake_location IS DISTINCT FROM (
           SELECT t.lake_location FROM coldharbor.tables t JOIN pg_class c ON c.relname = t.table_name
             JOIN pg_namespace n ON n.oid = c.relnamespace AND n.nspname = t.schema_name
            WHERE c.oid = p_table) THEN
        RAISE EXCEPTION 'cannot register %: only an administrator may choose its lake location', p_table
            USING ERRCODE = 'insufficient_privilege',
                  HINT = 'Leave p_lake_location out: the table goes to <lake root>/<schema>/<table>, a place no other table has.';
    END IF;
    IF NOT (has_table_privilege('coldharbor_owner', p_table, 'TRIGGER')
            AND has_table_privilege('coldharbor_pipeline', p_table, 'SELECT')) THEN
        RAISE EXCEPTION 'cannot register %: its owner has not granted what capture and export need', p_table
            USING ERRCODE = 'insufficient_privilege',
                  HINT = 'Register it with coldharbor.register_table(...), which grants them.';
    END IF;
    RETURN coldharbor.register_table_unchecked(p_table, p_lake_location, p_partition_by, p_sort_by, p_hot_retention);
END;
$$;

-- As 011's, with capture_off (an inert trigger) among the triggers that may run when the schema
-- owner deletes.
CREATE OR REPLACE FUNCTION coldharbor.owner_delete_refusal(p_table regclass)
RETURNS text
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $$
    WITH RECURSIVE members(relid) AS (
        SELECT p_table::oid
        UNION
        SELECT i.inhrelid FROM pg_inherits i JOIN members m ON i.inhparent = m.relid)
    SELECT coalesce(
        coldharbor.read_refusal(p_table),
        (SELECT format('%s has row-level security', c.oid::regclass)
           FROM members m JOIN pg_class c ON c.oid = m.relid WHERE c.relrowsecurity LIMIT 1),
        (SELECT format('trigger %s on %s runs on DELETE', quote_ident(t.tgname), t.tgrelid::regclass)
           FROM members m JOIN pg_trigger t ON t.tgrelid = m.relid
          WHERE NOT t.tgisinternal AND (t.tgtype & 8) <> 0     -- TRIGGER_TYPE_DELETE
            AND t.tgfoid NOT IN (SELECT oid FROM pg_proc WHERE pronamespace = 'coldharbor'::regnamespace
                                    AND (proname ~ '^capture_[0-9]+_(ins|upd|del|trunc)$'
                                         OR proname IN ('evict_guard', 'capture_off')))
          LIMIT 1),
        (SELECT format('rule %s on %s runs on DELETE', quote_ident(r.rulename), r.ev_class::regclass)
           FROM members m JOIN pg_rewrite r ON r.ev_class = m.relid WHERE r.ev_type = '4' LIMIT 1))
$$;

-- As 011's, but a row is named by its relation and ctid: a ctid is unique within one relation only,
-- and the partitions of a table each have their own (an eviction from a partitioned table deleted,
-- in every partition, the rows at the candidates' ctids, candidates or not).
CREATE OR REPLACE FUNCTION coldharbor.evict(p_table_id integer, p_cutoff timestamptz, p_dry_run boolean DEFAULT false)
RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    t        coldharbor.tables;
    v_rel    text;
    v_key_t  text;
    v_ctids  tid[];
    v_rels   oid[];
    v_count  bigint;
    v_try    integer;
BEGIN
    SELECT * INTO STRICT t FROM coldharbor.tables WHERE table_id = p_table_id;
    v_rel := format('%I.%I', t.schema_name, t.table_name);
    v_key_t := coldharbor.key_sql(p_table_id, 't');
    PERFORM coldharbor.lock_for_owner_delete(v_rel::regclass);

    -- 0. Writers' transactions on the table hold the eviction lock shared (evict_guard). Try for about
    --    5 s, without queueing (later writers never wait behind eviction), else evict nothing this run.
    IF NOT p_dry_run THEN
        FOR v_try IN 1..50 LOOP
            EXIT WHEN pg_try_advisory_xact_lock(1128792071, p_table_id);   -- 0x43480007: eviction
            IF v_try = 50 THEN
                RAISE NOTICE '%: writers kept the table busy; nothing evicted this run', v_rel;
                RETURN 0;
            END IF;
            PERFORM pg_sleep(0.1);
        END LOOP;
    END IF;

    -- 1. Lock the candidates. A row being written right now is skipped, not waited for.
    EXECUTE format($q$
        SELECT array_agg(ctid), array_agg(tableoid) FROM (
            SELECT t.ctid, t.tableoid FROM %s t
              JOIN (SELECT key FROM coldharbor.change_log WHERE table_id = %s GROUP BY key
                    HAVING bool_and(flushed_at IS NOT NULL) AND max(flushed_at) < $1 AND max(created_at) < $1) c
                ON c.key = %s
            FOR UPDATE OF t SKIP LOCKED) locked$q$, v_rel, t.table_id, v_key_t)
      INTO v_ctids, v_rels USING p_cutoff;
    IF v_ctids IS NULL THEN
        RETURN 0;
    END IF;

    -- 2. The rows are locked, so no write can reach them any more; a fresh snapshot (a new
    --    statement) sees every change that committed before the locks were taken. Re-check.
    IF NOT p_dry_run THEN
        INSERT INTO coldharbor.capture_suspended (xact, table_id) VALUES (pg_current_xact_id(), t.table_id);
    END IF;
    EXECUTE format($q$
        %s FROM %s t WHERE t.ctid = ANY ($1)
           AND (t.tableoid, t.ctid) IN (SELECT * FROM unnest($3::oid[], $1::tid[]))
           AND NOT EXISTS (SELECT 1 FROM coldharbor.change_log c
                            WHERE c.table_id = %s AND c.key = %s
                              AND (c.flushed_at IS NULL OR c.flushed_at >= $2 OR c.created_at >= $2))$q$,
        CASE WHEN p_dry_run THEN 'SELECT 1' ELSE 'DELETE' END, v_rel, t.table_id, v_key_t)
      USING v_ctids, p_cutoff, v_rels;
    GET DIAGNOSTICS v_count = ROW_COUNT;
    DELETE FROM coldharbor.capture_suspended WHERE xact = pg_current_xact_id() AND table_id = t.table_id;
    IF v_count > 0 AND NOT p_dry_run THEN   -- writers whose snapshot misses this commit get 40001
        INSERT INTO coldharbor.evictions (table_id, xact) VALUES (t.table_id, pg_current_xact_id())
            ON CONFLICT (table_id) DO UPDATE SET xact = EXCLUDED.xact;
    END IF;
    RETURN v_count;
END;
$$;

SELECT coldharbor.apply_privileges();

-- Tables registered before this migration: their partitions get the grants and the triggers. Rows
-- written straight to a partition before now were not captured: verify such a table (jobs/verify.py)
-- and resync it if they differ. A registered partition, or a partition capture cannot cover, is named.
DO $upgrade$
DECLARE
    t record;
BEGIN
    FOR t IN SELECT tb.*, c.oid::regclass AS rel, c.relispartition
               FROM coldharbor.tables tb
               JOIN pg_class c ON c.oid = to_regclass(format('%I.%I', tb.schema_name, tb.table_name))
              WHERE tb.source_kind = 'table' LOOP
        IF t.relispartition THEN
            RAISE WARNING '% is registered but is a partition of %: writes through % are not captured; '
                          'register % instead', t.rel, pg_partition_root(t.rel), pg_partition_root(t.rel),
                          pg_partition_root(t.rel);
        END IF;
        BEGIN
            PERFORM coldharbor.grant_capture_privileges(t.rel);
            PERFORM coldharbor.install_capture(t.table_id);
        EXCEPTION WHEN wrong_object_type OR insufficient_privilege OR feature_not_supported THEN
            RAISE WARNING '%: %; its capture stays as it was until that is fixed and it is registered again',
                t.rel, SQLERRM;
        END;
    END LOOP;
END
$upgrade$;

-- Lake-first tables (issue 23, part 3): `register_table(..., p_mode => 'lake_first')` for data whose
-- home is the lake (events, logs). PostgreSQL is only their landing zone:
--   * it accepts inserts, captured as any table's; UPDATE, DELETE, TRUNCATE and DETACH PARTITION are
--     refused with an error naming the table (an upsert, INSERT ... ON CONFLICT DO UPDATE, is an
--     UPDATE: refused too; ON CONFLICT DO NOTHING is an insert);
--   * once a row's insert is in the lake (its change flushed, or the row in the initial load), the
--     export removes it from PostgreSQL (coldharbor.remove_landed), logging no change: as eviction
--     does, it records the removal in coldharbor.evictions, so `tables.evicted_at` marks that rows
--     live in the lake alone and every guard of a table with evicted rows holds (DDL that would need
--     PostgreSQL to hold every row is refused, a base keeps the lake's rows, verify compares only
--     what PostgreSQL holds);
--   * reports read it as any table: the lake's rows, minus the keys with unexported changes, plus
--     PostgreSQL's images of those.
-- The refusal runs in evict_guard, the BEFORE UPDATE OR DELETE statement trigger of tiered tables,
-- which every relation of a lake-first table carries (and whose protection against being dropped,
-- disabled or replaced is sql/013's), and in log_rows, which TRUNCATE and DETACH PARTITION call
-- (restated once, with sql/028's old images).

ALTER TABLE coldharbor.tables ADD COLUMN mode text NOT NULL DEFAULT 'mirror'
    CONSTRAINT tables_mode_check CHECK (mode IN ('mirror', 'lake_first'));

-- Why removing landed rows of p_table would do more than remove them, or NULL: what refuses an
-- eviction (sql/013: a DELETE trigger or rule of the application's, row-level security), or a
-- foreign key referencing it (its ON DELETE action would run, or fail every removal).
CREATE FUNCTION coldharbor.lake_first_refusal(p_table regclass)
RETURNS text
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $$
    WITH RECURSIVE members(relid) AS (
        SELECT p_table::oid
        UNION
        SELECT i.inhrelid FROM pg_inherits i JOIN members m ON i.inhparent = m.relid)
    SELECT coalesce(
        coldharbor.owner_delete_refusal(p_table),
        (SELECT format('foreign key %s of %s references it', quote_ident(c.conname), c.conrelid::regclass)
           FROM members m JOIN pg_constraint c ON c.confrelid = m.relid
          WHERE c.contype = 'f' LIMIT 1))
$$;

-- As 013's, with the statement guard on every relation of a lake-first table too.
CREATE OR REPLACE FUNCTION coldharbor.capture_relation(p_table_id integer, p_rel regclass)
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
    -- A tiered table's writes must not race an eviction unnoticed; a lake-first table's updates and
    -- deletes are refused (evict_guard, below).
    IF t.hot_retention IS NOT NULL OR t.mode = 'lake_first' THEN
        EXECUTE format('CREATE OR REPLACE TRIGGER coldharbor_evict_guard BEFORE UPDATE OR DELETE ON %s '
                       'FOR EACH STATEMENT EXECUTE FUNCTION coldharbor.evict_guard(%L)', p_rel, p_table_id);
    ELSIF EXISTS (SELECT 1 FROM pg_trigger WHERE tgrelid = p_rel AND tgname = 'coldharbor_evict_guard') THEN
        EXECUTE format('CREATE OR REPLACE TRIGGER coldharbor_evict_guard BEFORE UPDATE OR DELETE ON %s '
                       'FOR EACH STATEMENT EXECUTE FUNCTION coldharbor.capture_off()', p_rel);
    END IF;
END;
$$;

-- As 011's, refusing every UPDATE and DELETE statement on a lake-first table but the removal's own
-- (and a purge's), which suspend its capture.
CREATE OR REPLACE FUNCTION coldharbor.evict_guard()
RETURNS trigger
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF (SELECT mode FROM coldharbor.tables WHERE table_id = TG_ARGV[0]::integer) = 'lake_first'
       AND NOT coldharbor.capture_is_suspended(TG_ARGV[0]::integer) THEN
        RAISE EXCEPTION 'cannot % %: it is a lake-first table, whose rows live in the lake; PostgreSQL only accepts '
                        'inserts into it', lower(TG_OP), TG_RELID::regclass
            USING ERRCODE = 'feature_not_supported',
                  HINT = 'Insert a new row instead (an insert of a key already in the lake replaces it there), or '
                      || 'register the table again with p_mode => ''mirror''.';
    END IF;
    IF coldharbor.evicted_since(TG_ARGV[0]::integer, pg_current_snapshot()) THEN
        RAISE EXCEPTION 'could not % %: rows of it were evicted from the hot tier while this statement ran',
            lower(TG_OP), TG_RELID::regclass
            USING ERRCODE = 'serialization_failure',
                  HINT = 'Retry the transaction. Evicted rows are in the lake only: an UPDATE or DELETE of them '
                      || 'changes nothing, an INSERT of their key writes a new version.';
    END IF;
    RETURN NULL;
END;
$$;

-- Sets where a registered table's rows live, as the schema owner, for a caller who may register it:
-- 'mirror' (PostgreSQL holds every row, the lake a copy) or 'lake_first'; NULL keeps what the table
-- has, and checks again that it still may be lake-first.
CREATE FUNCTION coldharbor.set_mode_as_owner(p_table regclass, p_mode text)
RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    t         coldharbor.tables;
    v_mode    text;
    v_refusal text;
BEGIN
    PERFORM coldharbor.check_may_register(p_table, session_user);
    IF p_mode IS NOT NULL AND p_mode NOT IN ('mirror', 'lake_first') THEN
        RAISE EXCEPTION 'cannot register %: p_mode must be ''mirror'' or ''lake_first'', not %', p_table,
            quote_literal(p_mode)
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = '''lake_first'' is for rows whose home is the lake (events, logs): PostgreSQL accepts '
                      || 'inserts and hands each row to the lake; ''mirror'' (the default) keeps every row in both.';
    END IF;
    SELECT * INTO t FROM coldharbor.tables WHERE source_kind = 'table' AND relid = p_table::oid;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'cannot set the mode of %: it is not a registered table', p_table
            USING ERRCODE = 'undefined_object',
                  HINT = 'Register it with coldharbor.register_table(..., p_mode => ...).';
    END IF;
    v_mode := coalesce(p_mode, t.mode);
    IF v_mode = 'lake_first' THEN
        IF t.hot_retention IS NOT NULL THEN
            RAISE EXCEPTION 'cannot register % as lake-first with a hot retention (%): its rows leave PostgreSQL as '
                            'soon as they are in the lake', p_table, t.hot_retention
                USING ERRCODE = 'invalid_parameter_value',
                      HINT = 'Register it without p_hot_retention.';
        END IF;
        v_refusal := coldharbor.lake_first_refusal(p_table);
        IF v_refusal IS NOT NULL THEN
            RAISE EXCEPTION 'cannot register % as lake-first: %, and rows leave it by a DELETE as the schema owner',
                p_table, v_refusal
                USING ERRCODE = 'feature_not_supported',
                      HINT = 'Drop it, or register the table with p_mode => ''mirror''.';
        END IF;
    END IF;
    IF v_mode IS DISTINCT FROM t.mode THEN
        UPDATE coldharbor.tables SET mode = v_mode WHERE table_id = t.table_id;
        PERFORM coldharbor.install_capture(t.table_id);
    END IF;
END;
$$;

-- As 026's, with p_mode (NULL: a new registration is a mirror, a registration again keeps the mode).
DROP FUNCTION coldharbor.register_table(regclass, text, text[], text[], interval, text, interval);
CREATE FUNCTION coldharbor.register_table(
    p_table         regclass,
    p_lake_location text     DEFAULT NULL,
    p_partition_by  text[]   DEFAULT '{}',
    p_sort_by       text[]   DEFAULT '{}',
    p_hot_retention interval DEFAULT NULL,
    p_history       text     DEFAULT NULL,
    p_freshness     interval DEFAULT NULL,
    p_mode          text     DEFAULT NULL)
RETURNS integer
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_id integer;
BEGIN
    PERFORM coldharbor.check_may_register(p_table, current_user);
    PERFORM coldharbor.grant_capture_privileges(p_table);
    v_id := coldharbor.register_table_as_owner(p_table, p_lake_location, p_partition_by, p_sort_by, p_hot_retention);
    PERFORM coldharbor.set_history_as_owner(p_table, p_history);
    IF p_freshness IS NOT NULL THEN
        PERFORM coldharbor.set_freshness_as_owner(p_table, p_freshness);
    END IF;
    PERFORM coldharbor.set_mode_as_owner(p_table, p_mode);
    RETURN v_id;
END;
$$;

-- Removes from lake-first table p_table_id every row the lake holds: each row whose key has no
-- change still to export, once the table's initial load (or a rebase's new base) is in the lake.
-- A row is either there from before registration (then in the load) or was inserted since (then
-- its insert is logged in the same transaction: dirty until a batch holding it is in the lake).
-- As eviction does (cleanup.eviction_cutoff), it keeps what a report still running may need: a
-- report pins a lake version and then reads PostgreSQL, so a row whose batch (or base) landed
-- after such a report started stays, or the report would read its key as flushed after its
-- version and find no row. A row another transaction holds locked is skipped, not waited for.
-- The delete suspends capture (no change is logged) and is recorded as an eviction. Returns the
-- rows removed. Run by the export after each batch; idempotent, so what a run left the next takes.
CREATE FUNCTION coldharbor.remove_landed(p_table_id integer)
RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    t         coldharbor.tables;
    v_rel     regclass;
    v_refusal text;
    v_count   bigint;
    v_cutoff  timestamptz;
    v_version bigint;   -- the newest lake version that landed before v_cutoff
    v_recent  text;     -- keys whose batch landed since v_cutoff: they stay
BEGIN
    SELECT * INTO STRICT t FROM coldharbor.tables WHERE table_id = p_table_id;
    v_rel := to_regclass(format('%I.%I', t.schema_name, t.table_name));
    IF t.mode <> 'lake_first' OR t.source_kind <> 'table' OR v_rel IS NULL OR v_rel::oid IS DISTINCT FROM t.relid
       OR t.load_state <> 'loaded' THEN
        RETURN 0;   -- PostgreSQL alone holds rows no change names until the load or new base lands
    END IF;
    v_refusal := coldharbor.lake_first_refusal(v_rel);
    IF v_refusal IS NOT NULL THEN
        RAISE EXCEPTION 'cannot remove the exported rows of lake-first table %: %, and the removal deletes as the '
                        'schema owner', v_rel, v_refusal
            USING ERRCODE = 'feature_not_supported',
                  HINT = 'Drop it, or register the table again with p_mode => ''mirror'' (its rows then stay in PostgreSQL).';
    END IF;
    PERFORM coldharbor.lock_for_owner_delete(v_rel);
    v_cutoff := (SELECT min(started_at) FROM coldharbor.report_runs WHERE state = 'running');
    v_recent := 'false';
    IF v_cutoff IS NOT NULL THEN
        IF EXISTS (SELECT 1 FROM coldharbor.export_batches WHERE table_id = t.table_id AND state = 'flushed'
                      AND kind <> 'changes' AND finished_at >= v_cutoff) THEN
            RETURN 0;   -- the base landed while a report ran: every row may be one it reads
        END IF;
        v_version := coalesce((SELECT max(lake_version) FROM coldharbor.export_batches
                                WHERE table_id = t.table_id AND state = 'flushed' AND finished_at < v_cutoff), -1);
        v_recent := format('EXISTS (SELECT 1 FROM coldharbor.change_log r WHERE r.table_id = %s AND r.lake_version > %s '
                           'AND r.key = %s)', t.table_id, v_version, coldharbor.key_sql(p_table_id, 't'));
    END IF;
    INSERT INTO coldharbor.capture_suspended (xact, table_id) VALUES (pg_current_xact_id(), t.table_id);
    EXECUTE format($q$
        DELETE FROM %s d WHERE (d.tableoid, d.ctid) IN (
            SELECT t.tableoid, t.ctid FROM %s t
             WHERE NOT EXISTS (SELECT 1 FROM coldharbor.change_log c
                                WHERE c.table_id = %s AND c.flushed_at IS NULL AND c.key = %s)
               AND NOT %s
               FOR UPDATE OF t SKIP LOCKED)$q$,
        v_rel, v_rel, t.table_id, coldharbor.key_sql(p_table_id, 't'), v_recent);
    GET DIAGNOSTICS v_count = ROW_COUNT;
    DELETE FROM coldharbor.capture_suspended WHERE xact = pg_current_xact_id() AND table_id = t.table_id;
    IF v_count > 0 THEN
        INSERT INTO coldharbor.evictions (table_id, xact) VALUES (t.table_id, pg_current_xact_id())
            ON CONFLICT (table_id) DO UPDATE SET xact = EXCLUDED.xact;
    END IF;
    RETURN v_count;
END;
$$;

-- DETACH PARTITION ... CONCURRENTLY commits its first step (the partition leaves reads) before any
-- trigger can see it; a partition of a lake-first table would take its landing rows out of both
-- tiers. So it is refused before it starts (ddl_command_start, which has no parsed target: the
-- statement is refused when it names, as a whole word, a relation of a lake-first table's tree;
-- a DETACH without CONCURRENTLY is checked as ever).
CREATE FUNCTION coldharbor.guard_concurrent_detach()
RETURNS event_trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_query text := lower(current_query());
    v_named text;
BEGIN
    IF TG_TAG <> 'ALTER TABLE' OR v_query !~ '\mdetach\M.*\mconcurrently\M' THEN
        RETURN;
    END IF;
    SELECT format('%I.%I', t.schema_name, t.table_name) INTO v_named
      FROM coldharbor.tables t CROSS JOIN LATERAL unnest(t.capture_relations) AS r(oid)
      JOIN pg_class c ON c.oid = r.oid
     WHERE t.mode = 'lake_first'
       AND v_query ~ ('(^|[^a-z0-9_$])' || regexp_replace(lower(c.relname), '([.^$*+?()\[\]{}|\\-])', '\\\1', 'g')
                      || '($|[^a-z0-9_$])')
     LIMIT 1;
    IF v_named IS NOT NULL THEN
        RAISE EXCEPTION 'DETACH PARTITION ... CONCURRENTLY of lake-first table % is refused: its first step commits '
                        'before its rows can be checked, and they live in the lake', v_named
            USING ERRCODE = 'feature_not_supported',
                  HINT = 'A lake-first table''s partitions stay attached; register it with p_mode => ''mirror'' first.';
    END IF;
END;
$$;

-- As 019's, with the guard above among the event triggers a superuser's migration installs.
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

REVOKE ALL ON FUNCTION coldharbor.install_ddl_triggers() FROM PUBLIC;

DO $triggers$
DECLARE
    v_missing text[] := coldharbor.install_ddl_triggers();
BEGIN
    IF cardinality(v_missing) > 0 THEN
        RAISE WARNING 'not a superuser: event triggers % were not created; run the migration as a superuser '
                      '(or SELECT coldharbor.install_ddl_triggers() as one) for DDL on registered tables to be seen',
                      array_to_string(v_missing, ', ');
    END IF;
END
$triggers$;

-- The rows lake-first table p_table_id holds in PostgreSQL, its landing backlog (rows whose insert is
-- not in the lake yet, and rows the next export removes), or NULL for another table or one it cannot
-- read safely (read_refusal); for the health page and the metrics.
CREATE FUNCTION coldharbor.landing_rows(p_table_id integer)
RETURNS bigint
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    t       coldharbor.tables;
    v_rel   regclass;
    v_count bigint;
BEGIN
    SELECT * INTO t FROM coldharbor.tables WHERE table_id = p_table_id;
    IF NOT FOUND OR t.mode <> 'lake_first' THEN
        RETURN NULL;
    END IF;
    v_rel := to_regclass(format('%I.%I', t.schema_name, t.table_name));
    IF v_rel IS NULL OR v_rel::oid IS DISTINCT FROM t.relid OR coldharbor.read_refusal(v_rel) IS NOT NULL THEN
        RETURN NULL;
    END IF;
    EXECUTE format('SELECT count(*) FROM %s', v_rel) INTO v_count;
    RETURN v_count;
END;
$$;

-- The application's entry point (apply_privileges grants the names of 022's list; this one is new)
-- and the export's.
REVOKE ALL ON FUNCTION coldharbor.set_mode_as_owner(regclass, text), coldharbor.remove_landed(integer),
                       coldharbor.landing_rows(integer) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION coldharbor.set_mode_as_owner(regclass, text) TO coldharbor_app;
GRANT EXECUTE ON FUNCTION coldharbor.remove_landed(integer), coldharbor.landing_rows(integer) TO coldharbor_pipeline;
SELECT coldharbor.apply_privileges();

-- Eviction, purge and lake-first tables: deleting from the hot tier without logging a deletion
-- (invariant 10), and the guards that keep the evicted rows answerable.
-- (Definitions: each object here only, CREATE OR REPLACE; see sql/README.md.)

-- Evicts from the hot tier the rows of one table whose every change is flushed, and was made and
-- flushed before p_cutoff; returns how many rows went (or would go, with p_dry_run). It runs as the
-- schema owner and suspends the capture of this table for its own delete only (capture_suspended).
-- Keys are compared in canonical form (key_sql), and writers racing it are refused (evict_guard).
-- Since 013: a row is named by its relation and ctid: a ctid is unique within one relation only,
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

-- Why reading p_table could run code of its owner's as the reader, or NULL: a view runs its functions,
-- and row-level security policies are evaluated, as whoever reads. The pipeline reads registered
-- tables (export, reports, purge) and the schema owner reads them (TRUNCATE capture, eviction), so a
-- registered name must stay a table without row-level security. Readers lock the table first
-- (ACCESS SHARE conflicts with enabling row-level security, creating policies, dropping the table),
-- so the answer holds for their transaction.
CREATE OR REPLACE FUNCTION coldharbor.read_refusal(p_table regclass)
RETURNS text
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $$
    SELECT CASE WHEN c.relkind NOT IN ('r', 'p') THEN format('%s is not a table (relkind %s)', c.oid::regclass, c.relkind)
                WHEN c.relrowsecurity THEN format('%s has row-level security', c.oid::regclass)
                -- Rows of an inheritance child read as the table's but are written past its capture
                -- triggers; a rule can route a write elsewhere (an outside review wrote uncaptured rows so).
                WHEN EXISTS (SELECT 1 FROM pg_inherits i JOIN pg_class k ON k.oid = i.inhrelid
                              WHERE i.inhparent = c.oid AND NOT k.relispartition)
                    THEN format('%s has inheritance children, whose rows capture does not see', c.oid::regclass)
                WHEN EXISTS (SELECT 1 FROM pg_rewrite r WHERE r.ev_class = c.oid AND r.rulename <> '_RETURN')
                    THEN format('%s has a rule, which can route writes around capture', c.oid::regclass) END
      FROM pg_class c WHERE c.oid = p_table
$$;

-- The relations a delete from p_table reaches or answers to: p_table and its inheritance children at any
-- depth (partitions included), whose triggers, rules, policies and referencing foreign keys
-- owner_delete_refusal and lake_first_refusal look at.
CREATE OR REPLACE FUNCTION coldharbor.relation_members(p_table regclass)
RETURNS SETOF oid
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $$
    WITH RECURSIVE members(relid) AS (
        SELECT p_table::oid
        UNION
        SELECT i.inhrelid FROM pg_inherits i JOIN members m ON i.inhparent = m.relid)
    SELECT relid FROM members
$$;

-- Why the schema owner must not delete rows of p_table (eviction, purge), or NULL. Triggers and rules
-- run as the user whose statement fires them, and row-level security policies are evaluated as the
-- querying user: a trigger or rule on DELETE, or a policy, that the table's owner put on the table
-- (or on a partition or child of it) would run its code with the schema owner's privileges. Only the
-- capture triggers may run there. Callers lock the table first (SHARE UPDATE EXCLUSIVE, which
-- conflicts with creating, enabling or replacing triggers, rules and policies and with attaching
-- partitions), so the answer holds until they commit.
-- Since 011: evict_guard (which only reads) is among the triggers that may run when the schema
-- owner deletes.
-- Since 013: with capture_off (an inert trigger) among the triggers that may run when the schema
-- owner deletes.
CREATE OR REPLACE FUNCTION coldharbor.owner_delete_refusal(p_table regclass)
RETURNS text
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $$
    SELECT coalesce(
        coldharbor.read_refusal(p_table),
        (SELECT format('%s has row-level security', c.oid::regclass)
           FROM coldharbor.relation_members(p_table) m(relid) JOIN pg_class c ON c.oid = m.relid
          WHERE c.relrowsecurity LIMIT 1),
        (SELECT format('trigger %s on %s runs on DELETE', quote_ident(t.tgname), t.tgrelid::regclass)
           FROM coldharbor.relation_members(p_table) m(relid) JOIN pg_trigger t ON t.tgrelid = m.relid
          WHERE NOT t.tgisinternal AND (t.tgtype & 8) <> 0     -- TRIGGER_TYPE_DELETE
            AND t.tgfoid NOT IN (SELECT oid FROM pg_proc WHERE pronamespace = 'coldharbor'::regnamespace
                                    AND (proname ~ '^capture_[0-9]+_(ins|upd|del|trunc)$'
                                         OR proname IN ('evict_guard', 'capture_off')))
          LIMIT 1),
        (SELECT format('rule %s on %s runs on DELETE', quote_ident(r.rulename), r.ev_class::regclass)
           FROM coldharbor.relation_members(p_table) m(relid) JOIN pg_rewrite r ON r.ev_class = m.relid
          WHERE r.ev_type = '4' LIMIT 1))
$$;

-- Raises unless the schema owner may delete rows of p_table (see owner_delete_refusal); takes the lock
-- that keeps it so.
CREATE OR REPLACE FUNCTION coldharbor.lock_for_owner_delete(p_table regclass)
RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_refusal text;
BEGIN
    EXECUTE format('LOCK TABLE %s IN SHARE UPDATE EXCLUSIVE MODE', p_table);
    v_refusal := coldharbor.owner_delete_refusal(p_table);
    IF v_refusal IS NOT NULL THEN
        RAISE EXCEPTION 'cannot evict from or purge %: %, and eviction and purge delete as the schema owner, '
                        'whose privileges that code would run with', p_table, v_refusal
            USING ERRCODE = 'insufficient_privilege',
                  HINT = 'Drop it, or give the table no hot retention and purge it by hand as its owner.';
    END IF;
END;
$$;

-- Purge's PostgreSQL delete: removes, logging no change, the rows of one registered table or entity
-- schema that are still exactly as the purge job read them. p_rows is a JSON array of row images
-- (to_jsonb of each row of the table, or of the entity view, read by the caller in its own
-- transaction); a row changed since it was read is left alone (the purge then finds it and says so).
-- Returns the 1-based positions in p_rows of the rows it deleted. No SQL text crosses this call:
-- the predicate is evaluated by the caller, with the caller's privileges.
CREATE OR REPLACE FUNCTION coldharbor.purge_rows(p_table_id integer, p_rows jsonb)
RETURNS SETOF bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    t        coldharbor.tables;
    v_rel    text;
    v_match  text;
BEGIN
    SELECT * INTO STRICT t FROM coldharbor.tables WHERE table_id = p_table_id;
    IF jsonb_typeof(p_rows) IS DISTINCT FROM 'array' THEN
        RAISE EXCEPTION 'purge_rows: p_rows must be a JSON array of row images, got %', coalesce(jsonb_typeof(p_rows), 'NULL')
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    v_rel := format('%I.%I', t.schema_name, t.table_name);
    SELECT string_agg(format('t.%I = k.%I', c, c), ' AND ') INTO v_match FROM unnest(t.key_columns) AS c;
    IF t.source_kind <> 'entity' THEN
        PERFORM coldharbor.lock_for_owner_delete(v_rel::regclass);
    END IF;
    INSERT INTO coldharbor.capture_suspended (xact, table_id) VALUES (pg_current_xact_id(), t.table_id);
    IF t.source_kind = 'entity' THEN
        RETURN QUERY EXECUTE format($q$
            DELETE FROM coldharbor.entity_main m USING (
                SELECT r.n, t.row_id
                  FROM jsonb_array_elements($1) WITH ORDINALITY AS r(img, n)
                 CROSS JOIN LATERAL jsonb_populate_record(NULL::%1$s, r.img) AS k
                  JOIN %1$s t ON %2$s AND to_jsonb(t) = r.img) s
             WHERE m.row_id = s.row_id
            RETURNING s.n$q$, v_rel, v_match) USING p_rows;
    ELSE
        RETURN QUERY EXECUTE format($q$
            DELETE FROM %1$s t
             USING jsonb_array_elements($1) WITH ORDINALITY AS r(img, n)
             CROSS JOIN LATERAL jsonb_populate_record(NULL::%1$s, r.img) AS k
             WHERE %2$s AND to_jsonb(t) = r.img
            RETURNING r.n$q$, v_rel, v_match) USING p_rows;
    END IF;
    DELETE FROM coldharbor.capture_suspended WHERE xact = pg_current_xact_id() AND table_id = t.table_id;
END;
$$;

-- Whether an eviction of p_table_id committed that p_snapshot does not see. Waits for an eviction in
-- progress and keeps new ones out until the caller's transaction ends (the shared lock). VOLATILE:
-- its query takes a new snapshot, which sees an eviction that committed while it waited.
CREATE OR REPLACE FUNCTION coldharbor.evicted_since(p_table_id integer, p_snapshot pg_snapshot)
RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM pg_advisory_xact_lock_shared(1128792071, p_table_id);   -- 0x43480007: eviction
    RETURN EXISTS (SELECT 1 FROM coldharbor.evictions
                    WHERE table_id = p_table_id AND NOT pg_visible_in_snapshot(xact, p_snapshot)
                      AND xact IS DISTINCT FROM pg_current_xact_id_if_assigned());
END;
$$;

-- The BEFORE UPDATE OR DELETE statement trigger of a tiered table (TG_ARGV[0]: its table id).
-- STABLE, so pg_current_snapshot() is the snapshot of the statement that fired it.
-- Since 027: refusing every UPDATE and DELETE statement on a lake-first table but the removal's own
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

CREATE OR REPLACE FUNCTION coldharbor.note_eviction()
RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    UPDATE coldharbor.tables SET evicted_at = now() WHERE table_id = NEW.table_id;
    RETURN NEW;
END;
$$;

-- Why the DDL just made to table p_table_id would make its evicted rows read wrong values, or NULL
-- (called by guard_evicted_rows before `columns_seen` moves on).
CREATE OR REPLACE FUNCTION coldharbor.evicted_rows_refusal(p_table_id integer)
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
-- Since 019: a rewrite of a key column is refused unless it keeps every key (key_watch,
-- key_cast_keeps_values, is_plain_type_change; sql/migrations/019, 1.).
CREATE OR REPLACE FUNCTION coldharbor.guard_evicted_rows()
RETURNS event_trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_table  integer;
    v_reason text;
    v_before jsonb;
BEGIN
    FOR v_table IN SELECT coldharbor.ddl_touched_tables() LOOP
        v_reason := coldharbor.evicted_rows_refusal(v_table);
        IF v_reason IS NULL AND (SELECT evicted_at IS NOT NULL FROM coldharbor.tables WHERE table_id = v_table) THEN
            SELECT b.tables -> v_table::text INTO v_before
              FROM coldharbor.ddl_keys_before b WHERE b.backend_pid = pg_backend_pid();
            -- none: the table had no evicted rows when the statement began
            v_reason := coldharbor.evicted_keys_refusal(v_table, v_before);
        END IF;
        IF v_reason IS NOT NULL THEN
            RAISE EXCEPTION '%', v_reason
                USING ERRCODE = 'feature_not_supported',
                      HINT = 'Rows evicted from the hot tier keep the names, lake types and keys they were evicted '
                             'with; a view can show a column under another name or type, and an UPDATE of a key '
                             'is logged as a delete and an insert.';
        END IF;
        UPDATE coldharbor.tables SET lake_types = coldharbor.column_lake_types(relid)
         WHERE table_id = v_table AND lake_types IS DISTINCT FROM coldharbor.column_lake_types(relid);
    END LOOP;
END;
$$;

-- Why the statement that just ran must not change table p_table_id's keys, or NULL; p_before is
-- key_watch(p_table_id) when the statement began (NULL: the table had no evicted rows then).
CREATE OR REPLACE FUNCTION coldharbor.evicted_keys_refusal(p_table_id integer, p_before jsonb)
RETURNS text
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    t     record;
    v_now jsonb;
    k     text;
    was   jsonb;
    cur   jsonb;
BEGIN
    SELECT * INTO t FROM coldharbor.tables WHERE table_id = p_table_id;
    IF p_before IS NULL THEN
        -- No picture: nothing was evicted and no retention set when the statement began. Rows were
        -- evicted since (while it waited for its lock): refused if it changed a key column.
        IF EXISTS (SELECT 1 FROM pg_attribute a
                    WHERE a.attrelid = t.relid AND a.attname = ANY (t.key_columns)
                      AND a.xmin = pg_current_xact_id()::xid) THEN
            RETURN format('cannot change key column %s of %I.%I now: rows were evicted from its hot tier (at %s) '
                          'while the statement waited for its lock; run it again, and it is checked against them',
                          (SELECT string_agg(quote_ident(k), ', ') FROM unnest(t.key_columns) k),
                          t.schema_name, t.table_name, t.evicted_at);
        END IF;
        RETURN NULL;
    END IF;
    v_now := coldharbor.key_watch(p_table_id);
    IF (v_now ->> 'files') IS NOT DISTINCT FROM (p_before ->> 'files') THEN
        RETURN NULL;  -- nothing rewritten: no stored value changed
    END IF;
    FOR k, was IN SELECT * FROM jsonb_each(p_before -> 'keys') LOOP
        cur := v_now -> 'keys' -> k;
        CONTINUE WHEN cur IS NOT NULL AND (cur ->> 'row') = (was ->> 'row');
        IF cur IS NULL OR NOT coldharbor.is_plain_type_change(current_query())
           OR NOT coldharbor.key_cast_keeps_values((was ->> 'base')::oid, (was ->> 'base_typmod')::integer,
                                                   (cur ->> 'base')::oid, (cur ->> 'base_typmod')::integer) THEN
            RETURN format('cannot rewrite key column %s of %I.%I (%s to %s): rows evicted from its hot tier (last '
                          'at %s) live in the lake alone under their keys, and a base cannot tell them from keys '
                          'the rewrite took away, so every old key would stay in reports beside its new one; '
                          'accepted on such a table: one plain ALTER TABLE ... ALTER COLUMN %s TYPE, sent on '
                          'its own without USING, to a type its keys cast to unchanged (a wider integer, text '
                          'no shorter or unbounded, the same type with no smaller modifier)',
                          quote_ident(k), t.schema_name, t.table_name, was ->> 'type',
                          coalesce(cur ->> 'type', 'nothing'), t.evicted_at, quote_ident(k));
        END IF;
    END LOOP;
    RETURN NULL;
END;
$$;

-- ddl_command_start of any DDL (catalog reads only; a row written only while some table has
-- evicted rows or a hot retention: an eviction may commit while the statement waits for its lock).
CREATE OR REPLACE FUNCTION coldharbor.watch_evicted_keys()
RETURNS event_trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    -- Nothing evicted: the table is not touched (a row left from before is read only for a table
    -- with evicted rows, which writes a new one first).
    IF NOT EXISTS (SELECT 1 FROM coldharbor.tables WHERE evicted_at IS NOT NULL OR hot_retention IS NOT NULL) THEN
        RETURN;
    END IF;
    DELETE FROM coldharbor.ddl_keys_before WHERE backend_pid = pg_backend_pid();
    INSERT INTO coldharbor.ddl_keys_before (backend_pid, tables)
    SELECT pg_backend_pid(), coalesce(jsonb_object_agg(t.table_id::text, coldharbor.key_watch(t.table_id)), '{}')
      FROM coldharbor.tables t
     WHERE (t.evicted_at IS NOT NULL OR t.hot_retention IS NOT NULL) AND t.source_kind = 'table'
       AND t.dropped_at IS NULL AND EXISTS (SELECT 1 FROM pg_class c WHERE c.oid = t.relid);
END;
$$;

-- Why removing landed rows of p_table would do more than remove them, or NULL: what refuses an
-- eviction (sql/migrations/013: a DELETE trigger or rule of the application's, row-level security), or a
-- foreign key referencing it (its ON DELETE action would run, or fail every removal).
CREATE OR REPLACE FUNCTION coldharbor.lake_first_refusal(p_table regclass)
RETURNS text
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $$
    SELECT coalesce(
        coldharbor.owner_delete_refusal(p_table),
        (SELECT format('foreign key %s of %s references it', quote_ident(c.conname), c.conrelid::regclass)
           FROM coldharbor.relation_members(p_table) m(relid) JOIN pg_constraint c ON c.confrelid = m.relid
          WHERE c.contype = 'f' LIMIT 1))
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
CREATE OR REPLACE FUNCTION coldharbor.remove_landed(p_table_id integer)
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
CREATE OR REPLACE FUNCTION coldharbor.guard_concurrent_detach()
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

-- The rows lake-first table p_table_id holds in PostgreSQL, its landing backlog (rows whose insert is
-- not in the lake yet, and rows the next export removes), or NULL for another table or one it cannot
-- read safely (read_refusal); for the health page and the metrics.
CREATE OR REPLACE FUNCTION coldharbor.landing_rows(p_table_id integer)
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

CREATE OR REPLACE TRIGGER note_eviction AFTER INSERT OR UPDATE ON coldharbor.evictions
    FOR EACH ROW EXECUTE FUNCTION coldharbor.note_eviction();

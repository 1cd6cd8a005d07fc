-- Registration: register_table and what it checks, grants and records, and the triggers on
-- coldharbor.tables that keep its relation, columns, types and key.
-- (Definitions: each object here only, CREATE OR REPLACE; see sql/README.md.)

-- The first of p_names that is not one of p_allowed, or NULL: the partition or sort column a
-- registration refuses.
CREATE OR REPLACE FUNCTION coldharbor.first_not_in(p_names text[], p_allowed text[])
RETURNS text
LANGUAGE sql IMMUTABLE SET search_path = pg_catalog, pg_temp AS $$
    SELECT n FROM unnest(p_names) WITH ORDINALITY AS u(n, i) WHERE NOT n = ANY (p_allowed) ORDER BY i LIMIT 1
$$;

-- The registration itself (009 renamed 002's register_table to this): executable by the schema owner
-- alone, called by register_table_as_owner once the caller may register the table.
-- Registers a table for capture and export; returns its table_id. Registering again updates the
-- settings and reinstalls the triggers. Fails, naming the problem, when the table has no primary
-- key, a column type does not round-trip, or a partition or sort column is not allowed.
CREATE OR REPLACE FUNCTION coldharbor.register_table_unchecked(
    p_table         regclass,
    p_lake_location text     DEFAULT NULL,
    p_partition_by  text[]   DEFAULT '{}',
    p_sort_by       text[]   DEFAULT '{}',
    p_hot_retention interval DEFAULT NULL)
RETURNS integer
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_schema   text;
    v_name     text;
    v_kind     "char";
    v_keys     text[];
    v_columns  text[];
    v_col      text;
    v_table_id integer;
BEGIN
    SELECT n.nspname, c.relname, c.relkind INTO v_schema, v_name, v_kind
      FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
     WHERE c.oid = p_table;
    IF v_kind NOT IN ('r', 'p') THEN
        RAISE EXCEPTION 'cannot register %: only ordinary and partitioned tables can be registered', p_table
            USING ERRCODE = 'wrong_object_type';
    END IF;
    IF v_schema IN ('coldharbor', 'reports', 'pg_catalog', 'information_schema') OR v_schema LIKE 'pg\_%' THEN
        RAISE EXCEPTION 'cannot register %: tables in schema % cannot be registered', p_table, quote_ident(v_schema)
            USING ERRCODE = 'invalid_schema_name';
    END IF;

    SELECT array_agg(column_name ORDER BY key_position) FILTER (WHERE key_position IS NOT NULL),
           array_agg(column_name)
      INTO v_keys, v_columns
      FROM coldharbor.lake_columns(p_table);
    IF v_keys IS NULL THEN
        RAISE EXCEPTION 'cannot register %: it has no primary key', p_table
            USING ERRCODE = 'invalid_table_definition',
                  HINT = 'Last-write-wins in the lake is per primary key; add one with ALTER TABLE ... ADD PRIMARY KEY.';
    END IF;

    -- A delete marker knows only the key, so it can land in the right partition only when the
    -- partition columns are part of the key (which also keeps a key from moving partitions).
    v_col := coldharbor.first_not_in(p_partition_by, v_keys);
    IF v_col IS NOT NULL THEN
        RAISE EXCEPTION 'cannot register %: partition column % is not part of the primary key (%)',
            p_table, quote_ident(v_col), array_to_string(v_keys, ', ')
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    v_col := coldharbor.first_not_in(p_sort_by, v_columns);
    IF v_col IS NOT NULL THEN
        RAISE EXCEPTION 'cannot register %: sort column % does not exist', p_table, quote_ident(v_col)
            USING ERRCODE = 'undefined_column';
    END IF;
    IF p_hot_retention IS NOT NULL AND p_hot_retention <= interval '0' THEN
        RAISE EXCEPTION 'cannot register %: hot retention must be positive, got %', p_table, p_hot_retention
            USING ERRCODE = 'invalid_parameter_value';
    END IF;

    INSERT INTO coldharbor.tables AS t
           (schema_name, table_name, key_columns, lake_location, partition_by, sort_by, hot_retention)
    VALUES (v_schema, v_name, v_keys, p_lake_location, coalesce(p_partition_by, '{}'),
            coalesce(p_sort_by, '{}'), p_hot_retention)
    ON CONFLICT (schema_name, table_name) DO UPDATE
       SET key_columns = EXCLUDED.key_columns, lake_location = EXCLUDED.lake_location,
           partition_by = EXCLUDED.partition_by, sort_by = EXCLUDED.sort_by,
           hot_retention = EXCLUDED.hot_retention
    RETURNING t.table_id INTO v_table_id;

    PERFORM coldharbor.install_capture(v_table_id);
    RETURN v_table_id;
END;
$$;

-- Registers a table for capture and export; returns its table_id. Registering again updates the
-- settings and reinstalls the triggers. Fails, naming the problem, when the caller does not own the
-- table, the table has no primary key, a column type does not round-trip, or a partition or sort
-- column is not allowed; nothing is granted then either (one statement).
-- Since 026: always passing p_history on (NULL: keep, and check, what the table has).
CREATE OR REPLACE FUNCTION coldharbor.register_table(
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

-- At the commit of a registration, a table found empty needs no load: capture was installed earlier
-- in the same transaction, whose lock on the table waited for every writer before it, so a fresh
-- look at commit sees every row capture will not carry. A registration in a REPEATABLE READ or
-- SERIALIZABLE transaction cannot look afresh and stays pending (the export settles an empty
-- table's load without Spark). An entity schema needs none: its registration logs every record.
-- It fires at commit as whoever registered, so it runs as the schema's owner (who alone writes the
-- registry); a table with row-level security is not read here (its policies would run as the owner):
-- it stays pending, and the jobs refuse such a table by name.
CREATE OR REPLACE FUNCTION coldharbor.settle_load_at_registration() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_has_rows boolean;
BEGIN
    IF NEW.source_kind <> 'entity' THEN
        IF current_setting('transaction_isolation') <> 'read committed'
           OR (SELECT c.relrowsecurity OR c.relforcerowsecurity FROM pg_catalog.pg_class c
                WHERE c.oid = format('%I.%I', NEW.schema_name, NEW.table_name)::regclass) THEN
            RETURN NULL;
        END IF;
        EXECUTE format('SELECT EXISTS (SELECT 1 FROM %I.%I)', NEW.schema_name, NEW.table_name) INTO v_has_rows;
        IF v_has_rows THEN
            RETURN NULL;
        END IF;
    END IF;
    UPDATE coldharbor.tables SET load_state = 'loaded', base_rows = 0
     WHERE table_id = NEW.table_id AND load_state = 'pending';
    RETURN NULL;
END;
$$;

-- Raises unless p_role may act as the owner of p_table.
CREATE OR REPLACE FUNCTION coldharbor.check_may_register(p_table regclass, p_role name)
RETURNS void
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_owner name;
BEGIN
    SELECT pg_get_userbyid(relowner) INTO STRICT v_owner FROM pg_class WHERE oid = p_table;
    IF NOT pg_has_role(p_role, v_owner, 'USAGE') THEN
        RAISE EXCEPTION 'cannot register %: role % does not own it (its owner is %)', p_table, p_role, v_owner
            USING ERRCODE = 'insufficient_privilege',
                  HINT = 'Only the owner of a table (or a superuser) may register it.';
    END IF;
END;
$$;

-- Grants what the jobs and capture need on one table: SELECT to the pipeline (export, reports,
-- purge's read); SELECT, DELETE, TRIGGER and UPDATE of the key columns to the schema owner
-- (capture triggers, TRUNCATE capture, eviction's row locks and deletes, purge's delete); USAGE on
-- the table's schema to both. Runs as its caller, who must be able to grant them (the table's
-- owner, or a superuser).
-- Since 013: the same on every partition of the table: what capture_relation needs there.
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

-- Since 013: a partition cannot be registered: writes through its parent would fire none of its
-- capture triggers.
-- Since 017: a table with inheritance children is refused: a read of it includes the children's rows,
-- which no trigger of its own captures (sql/migrations/017, 3.).
CREATE OR REPLACE FUNCTION coldharbor.register_table_as_owner(
    p_table         regclass,
    p_lake_location text,
    p_partition_by  text[],
    p_sort_by       text[],
    p_hot_retention interval)
RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_root     regclass;
    v_children text;
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
    SELECT string_agg(i.inhrelid::regclass::text, ', ' ORDER BY i.inhrelid::regclass::text) INTO v_children
      FROM pg_inherits i JOIN pg_class c ON c.oid = p_table AND c.relkind = 'r'
     WHERE i.inhparent = p_table;
    IF v_children IS NOT NULL THEN
        RAISE EXCEPTION 'cannot register %: it has inheritance children (%), whose rows a read of it includes but '
                        'whose writes its capture does not see', p_table, v_children
            USING ERRCODE = 'wrong_object_type',
                  HINT = 'Detach them (ALTER TABLE child NO INHERIT parent) and register each table on its own, '
                      || 'or make the table partitioned.';
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

-- Runs as whoever ran CREATE TABLE ... PARTITION OF or ALTER TABLE ... ATTACH PARTITION (the owner
-- of the new partition, who alone can grant on it): the schema owner gets SELECT and TRIGGER on the
-- partitions of a table it captures (it holds TRIGGER on the root), so guard_capture can capture
-- them. A grant that cannot be made is left to guard_capture, which refuses naming it.
CREATE OR REPLACE FUNCTION coldharbor.grant_partition_capture()
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

-- Registration records the relation and its columns; registering a name again whose relation is
-- another one (the table was dropped and created anew) sends the table back to 'pending'.
-- Since 015: a registration whose relation was dropped (`dropped_at`) is another relation
-- even under the same oid; the window of its rebase opens when the old one was dropped (without the
-- event trigger, at the newest base: earlier than the drop, never later).
-- Since 017: with 016's dirty_since, and registering another relation retires the old one's change_log
-- rows and finished batches (sql/migrations/017, 1.).
CREATE OR REPLACE FUNCTION coldharbor.track_registered_relation()
RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_rel oid := to_regclass(format('%I.%I', NEW.schema_name, NEW.table_name));
    v_other boolean;
    v_unexported timestamptz;
BEGIN
    IF NEW.source_kind <> 'table' THEN
        RETURN NEW;
    END IF;
    v_other := TG_OP = 'UPDATE' AND (OLD.relid IS DISTINCT FROM v_rel OR OLD.dropped_at IS NOT NULL);
    IF v_other THEN
        -- The old table's changes that never reached the lake: as-of instants from the oldest of
        -- them on cannot be answered (sql/016's dirty_since), and they go with the rest.
        v_unexported := coldharbor.oldest_dirty_change_at(NEW.table_id);
        DELETE FROM coldharbor.change_log WHERE table_id = NEW.table_id;
        DELETE FROM coldharbor.export_batches WHERE table_id = NEW.table_id AND state <> 'pending';
        NEW.load_state := 'pending';
        NEW.rebase_serial := OLD.rebase_serial + 1;
        NEW.rebase_reason := 'registered again after the table was dropped and created anew: '
                             'the lake holds the old table''s rows';
        INSERT INTO coldharbor.rebases (table_id, serial, reason, requested_at, dirty_since, new_relation)
        VALUES (NEW.table_id, NEW.rebase_serial, NEW.rebase_reason,
                coalesce(OLD.dropped_at, OLD.base_at, OLD.loaded_at, '-infinity'), v_unexported, true);
    END IF;
    NEW.columns_seen := CASE WHEN TG_OP = 'UPDATE' AND NOT v_other
                             THEN coldharbor.columns_seen_after(OLD.columns_seen, v_rel)
                             ELSE coldharbor.column_values_signature(v_rel) END;
    NEW.relid := v_rel;
    NEW.dropped_at := NULL;
    RETURN NEW;
END;
$$;

-- Registration (a new relation under the name included) records its columns' lake types; it runs
-- after track_registered_relation (triggers fire in name order), which sets relid.
CREATE OR REPLACE FUNCTION coldharbor.track_registered_types()
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

CREATE OR REPLACE FUNCTION coldharbor.track_registered_key()
RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_unexported timestamptz;
BEGIN
    -- Another relation under the name (track_registered_relation, which fired first) is rebased
    -- as such already.
    -- The same columns in another order are the same key (a change_log key is a jsonb object).
    IF NEW.source_kind <> 'table' OR (NEW.key_columns @> OLD.key_columns AND NEW.key_columns <@ OLD.key_columns)
       OR NEW.relid IS DISTINCT FROM OLD.relid OR OLD.dropped_at IS NOT NULL THEN
        RETURN NEW;
    END IF;
    IF OLD.evicted_at IS NOT NULL THEN
        RAISE EXCEPTION 'cannot register %.% again with primary key (%): rows evicted from it live in the lake '
                        'alone, keyed by (%), and cannot be keyed again from PostgreSQL',
            quote_ident(NEW.schema_name), quote_ident(NEW.table_name), array_to_string(NEW.key_columns, ', '),
            array_to_string(OLD.key_columns, ', ')
            USING ERRCODE = 'feature_not_supported',
                  HINT = format('Restore the primary key (%s); the jobs refuse the table until it matches.',
                                array_to_string(OLD.key_columns, ', '));
    END IF;
    v_unexported := coldharbor.oldest_dirty_change_at(NEW.table_id);
    DELETE FROM coldharbor.change_log WHERE table_id = NEW.table_id;
    DELETE FROM coldharbor.export_batches WHERE table_id = NEW.table_id AND state <> 'pending';
    NEW.load_state := 'pending';
    NEW.rebase_serial := OLD.rebase_serial + 1;
    NEW.rebase_reason := format('registered again with primary key (%s) where it was (%s): the lake''s rows are '
                                'keyed by the old key', array_to_string(NEW.key_columns, ', '),
                                array_to_string(OLD.key_columns, ', '));
    INSERT INTO coldharbor.rebases (table_id, serial, reason, requested_at, dirty_since, new_relation, replaces_lake)
    VALUES (NEW.table_id, NEW.rebase_serial, NEW.rebase_reason, clock_timestamp(), v_unexported, false, true);
    RETURN NEW;
END;
$$;

-- Raises, naming the column, when a column of p_table cannot be captured as an image exactly.
CREATE OR REPLACE FUNCTION coldharbor.check_exact_history(p_table regclass)
RETURNS void
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    r record;
BEGIN
    -- The first column an image cannot hold, and why (a virtual generated column: NULL in a
    -- statement's transition table; json: the spaces around a value are lost; a nullable jsonb:
    -- SQL NULL and JSON null print alike).
    SELECT a.attname::text AS name, format_type(b.base_type, b.base_typmod) AS pg_type,
           CASE WHEN a.attgenerated = 'v' THEN 'virtual' WHEN b.base_type = 'json'::regtype THEN 'json'
                ELSE 'nullable' END AS why INTO r
      FROM pg_attribute a CROSS JOIN LATERAL coldharbor.base_type(a.atttypid, a.atttypmod) b
     WHERE a.attrelid = p_table AND a.attnum > 0 AND NOT a.attisdropped
       AND (a.attgenerated = 'v' OR b.base_type = 'json'::regtype
            OR (b.base_type = 'jsonb'::regtype AND NOT a.attnotnull))
     ORDER BY a.attgenerated <> 'v', b.base_type <> 'json'::regtype, a.attnum LIMIT 1;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    IF r.why = 'virtual' THEN
        RAISE EXCEPTION 'cannot keep exact history of %: column % is a virtual generated column, which a row '
                        'image does not hold', p_table, quote_ident(r.name)
            USING ERRCODE = 'feature_not_supported',
                  HINT = 'Make it STORED, or register the table without p_history => ''exact''.';
    ELSIF r.why = 'json' THEN
        RAISE EXCEPTION 'cannot keep exact history of %: column % is json, whose text a row image does not keep '
                        'exactly (the spaces around a value are lost)', p_table, quote_ident(r.name)
            USING ERRCODE = 'feature_not_supported',
                  HINT = 'Use jsonb, or register the table without p_history => ''exact''.';
    END IF;
    RAISE EXCEPTION 'cannot keep exact history of %: column % (%) may be NULL, and a row image cannot tell '
                    'its SQL NULL from a JSON null', p_table, quote_ident(r.name), r.pg_type
        USING ERRCODE = 'feature_not_supported',
              HINT = format('Make it NOT NULL (ALTER TABLE %s ALTER COLUMN %s SET NOT NULL), or register the '
                            'table without p_history => ''exact''.', p_table, quote_ident(r.name));
END;
$$;

-- Raises unless p_value, argument p_name of a registration of p_table, is NULL (keep what the table
-- has) or one of p_choices; p_hint says what each means.
CREATE OR REPLACE FUNCTION coldharbor.check_choice(p_table regclass, p_name text, p_value text, p_choices text[],
                                                   p_hint text)
RETURNS void
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF p_value IS NOT NULL AND NOT p_value = ANY (p_choices) THEN
        RAISE EXCEPTION 'cannot register %: % must be %, not %', p_table, p_name,
            (SELECT string_agg(quote_literal(c), ' or ' ORDER BY i) FROM unnest(p_choices) WITH ORDINALITY AS u(c, i)),
            quote_literal(p_value)
            USING ERRCODE = 'invalid_parameter_value', HINT = p_hint;
    END IF;
END;
$$;

-- The registration of table p_table, whose setting p_setting (history, freshness, mode) a
-- set_*_as_owner function is about to change; raises when the table is not registered.
CREATE OR REPLACE FUNCTION coldharbor.registration_to_set(p_table regclass, p_setting text)
RETURNS coldharbor.tables
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    t coldharbor.tables;
BEGIN
    SELECT * INTO t FROM coldharbor.tables WHERE source_kind = 'table' AND relid = p_table::oid;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'cannot set the % of %: it is not a registered table', p_setting, p_table
            USING ERRCODE = 'undefined_object',
                  HINT = format('Register it with coldharbor.register_table(..., p_%s => ...).', p_setting);
    END IF;
    RETURN t;
END;
$$;

-- Sets the history a registered table keeps ('latest' or 'exact'), as the schema owner, for a
-- caller who may register it; reinstalls its capture when it changes.
-- Since 026: with p_history NULL keeping the table's history (registering it again without
-- p_history): a table that keeps exact history has its columns checked again, and is refused with
-- a hint that says how to stop keeping it.
CREATE OR REPLACE FUNCTION coldharbor.set_history_as_owner(p_table regclass, p_history text)
RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    t         coldharbor.tables;
    v_message text;
BEGIN
    PERFORM coldharbor.check_may_register(p_table, session_user);
    PERFORM coldharbor.check_choice(p_table, 'p_history', p_history, ARRAY['latest', 'exact'],
        '''exact'' keeps every change''s row image, so as-of reports are exact at any instant; '
        || '''latest'' (the default) keeps the newest image of a key per export.');
    t := coldharbor.registration_to_set(p_table, 'history');
    IF p_history IS NULL AND t.history = 'exact' THEN
        BEGIN
            PERFORM coldharbor.check_exact_history(p_table);
        EXCEPTION WHEN feature_not_supported THEN
            GET STACKED DIAGNOSTICS v_message = MESSAGE_TEXT;
            RAISE EXCEPTION '%', v_message
                USING ERRCODE = 'feature_not_supported',
                      HINT = 'The table keeps exact history, which registering it again keeps unless asked: change '
                          || 'the column, or register it with p_history => ''latest''.';
        END;
    ELSIF p_history = 'exact' THEN
        PERFORM coldharbor.check_exact_history(p_table);
    END IF;
    IF p_history IS NOT NULL AND t.history IS DISTINCT FROM p_history THEN
        UPDATE coldharbor.tables SET history = p_history WHERE table_id = t.table_id;
        PERFORM coldharbor.install_capture(t.table_id);
    END IF;
END;
$$;

-- Sets the freshness a registered table promises, as the schema owner, for a caller who may
-- register it.
CREATE OR REPLACE FUNCTION coldharbor.set_freshness_as_owner(p_table regclass, p_freshness interval)
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
    PERFORM coldharbor.registration_to_set(p_table, 'freshness');
    UPDATE coldharbor.tables SET freshness = p_freshness WHERE source_kind = 'table' AND relid = p_table::oid;
END;
$$;

-- Sets where a registered table's rows live, as the schema owner, for a caller who may register it:
-- 'mirror' (PostgreSQL holds every row, the lake a copy) or 'lake_first'; NULL keeps what the table
-- has, and checks again that it still may be lake-first.
CREATE OR REPLACE FUNCTION coldharbor.set_mode_as_owner(p_table regclass, p_mode text)
RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    t         coldharbor.tables;
    v_mode    text;
    v_refusal text;
BEGIN
    PERFORM coldharbor.check_may_register(p_table, session_user);
    PERFORM coldharbor.check_choice(p_table, 'p_mode', p_mode, ARRAY['mirror', 'lake_first'],
        '''lake_first'' is for rows whose home is the lake (events, logs): PostgreSQL accepts '
        || 'inserts and hands each row to the lake; ''mirror'' (the default) keeps every row in both.');
    t := coldharbor.registration_to_set(p_table, 'mode');
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

-- A constraint trigger has no CREATE OR REPLACE: it is made again only when it differs, since dropping
-- it locks coldharbor.tables against every reader (the jobs, evict_guard) until the definitions commit.
DO $settle$
DECLARE
    v_wanted text := 'CREATE CONSTRAINT TRIGGER settle_load_at_registration AFTER INSERT ON coldharbor.tables '
                     'DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION coldharbor.settle_load_at_registration()';
BEGIN
    IF (SELECT pg_get_triggerdef(oid) FROM pg_trigger WHERE tgrelid = 'coldharbor.tables'::regclass
          AND tgname = 'settle_load_at_registration') IS DISTINCT FROM v_wanted THEN
        DROP TRIGGER IF EXISTS settle_load_at_registration ON coldharbor.tables;
        EXECUTE v_wanted;
    END IF;
END
$settle$;

CREATE OR REPLACE TRIGGER track_registered_relation
    BEFORE INSERT OR UPDATE OF key_columns, lake_location, partition_by, sort_by, hot_retention ON coldharbor.tables
    FOR EACH ROW EXECUTE FUNCTION coldharbor.track_registered_relation();

CREATE OR REPLACE TRIGGER track_registered_types BEFORE INSERT OR UPDATE ON coldharbor.tables
    FOR EACH ROW EXECUTE FUNCTION coldharbor.track_registered_types();

-- Named to fire after track_registered_relation (which sets relid) and before track_registered_types.
CREATE OR REPLACE TRIGGER track_registered_relation_key BEFORE UPDATE OF key_columns ON coldharbor.tables
    FOR EACH ROW EXECUTE FUNCTION coldharbor.track_registered_key();

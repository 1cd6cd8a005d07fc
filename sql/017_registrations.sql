-- Registrations (issue 18, second attack).
--
-- 1. A table dropped and created again, then registered again, keeps its table_id; the old
--    relation's change_log rows and batches stayed under it. Their keys may be of another type
--    (bigint -> text) and their lake versions of another lake (the old one moved aside), so reports
--    and verify took them for changes flushed after the pinned version and cast them to the new
--    key type. Registering another relation now retires them: the old relation's change_log rows
--    and finished batches are deleted (a pending batch stays: the next export finishes or fences it,
--    so a dead export's write of the old table can never land later). The new base rebuilds the
--    lake from the new table whatever the old one held; the rebase window opens at the oldest change
--    of the old table that never reached the lake, when that is earlier than the drop, so an as-of
--    instant whose answer needed such a change is refused rather than answered without it.
--    A tiered table's base marks deleted the lake keys the new table does not hold: the new
--    relation never evicted anything (`rebases.new_relation`).
-- 2. A column of a domain type over a supported base type is the base type to the lake (as its
--    values are): registration and the jobs see the base type (`lake_columns`, `key_sql`).
-- 3. A table with inheritance children cannot be registered: a read of it includes the children's
--    rows, whose writes its capture does not see (the jobs refused such a table after registration).

ALTER TABLE coldharbor.rebases ADD COLUMN new_relation boolean NOT NULL DEFAULT false;

-- The type a column of type p_type (with modifier p_typmod) holds values of: a domain's base type
-- (through domains over domains) with the modifier of the innermost domain, as PostgreSQL's
-- getBaseTypeAndTypmod; any other type as it is.
CREATE FUNCTION coldharbor.base_type(p_type oid, p_typmod integer, OUT base_type oid, OUT base_typmod integer)
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $$
    WITH RECURSIVE chain(type, typmod, depth) AS (
        SELECT p_type, p_typmod, 0
        UNION ALL
        SELECT t.typbasetype, t.typtypmod, c.depth + 1
          FROM chain c JOIN pg_type t ON t.oid = c.type
         WHERE t.typtype = 'd')
    SELECT type, typmod FROM chain ORDER BY depth DESC LIMIT 1
$$;

-- As 007's, with a domain column seen as its base type (pg_type and lake_type); a domain over a type
-- that does not round-trip is refused naming the domain and its base type.
CREATE OR REPLACE FUNCTION coldharbor.lake_columns(p_table regclass)
RETURNS TABLE (column_name text, pg_type text, lake_type text, key_position integer)
LANGUAGE plpgsql STABLE AS $$
DECLARE
    r record;
BEGIN
    FOR r IN
        SELECT a.attname::text AS name,
               format_type(a.atttypid, a.atttypmod) AS declared_type,
               format_type(b.base_type, b.base_typmod) AS pg_type,
               coldharbor.lake_type(b.base_type, b.base_typmod) AS lake_type,
               array_position(i.indkey::smallint[], a.attnum) AS key_position,
               (SELECT min(o.attname::text) FROM pg_catalog.pg_attribute o
                 WHERE o.attrelid = a.attrelid AND o.attnum > 0 AND NOT o.attisdropped
                   AND o.attnum <> a.attnum AND lower(o.attname) = lower(a.attname)) AS same_name
        FROM pg_catalog.pg_attribute a
        CROSS JOIN LATERAL coldharbor.base_type(a.atttypid, a.atttypmod) b
        LEFT JOIN pg_catalog.pg_index i ON i.indrelid = a.attrelid AND i.indisprimary
        WHERE a.attrelid = p_table AND a.attnum > 0 AND NOT a.attisdropped
        ORDER BY a.attnum
    LOOP
        IF r.lake_type IS NULL THEN
            RAISE EXCEPTION 'column % of table % has type %, which does not round-trip to the lake',
                quote_ident(r.name), p_table,
                CASE WHEN r.declared_type = r.pg_type THEN r.pg_type
                     ELSE format('%s (a domain over %s)', r.declared_type, r.pg_type) END
                USING ERRCODE = 'feature_not_supported',
                      HINT = 'Supported: smallint, integer, bigint, real, double precision, numeric(p,s) with p <= 38, '
                          || 'boolean, text, varchar, char, date, timestamp, timestamptz, uuid, bytea, json, jsonb, '
                          || 'and domains over them.';
        END IF;
        IF lower(r.name) LIKE '\_ch\_%' THEN
            RAISE EXCEPTION 'column % of table % uses the prefix _ch_, which is reserved for lake metadata',
                quote_ident(r.name), p_table
                USING ERRCODE = 'invalid_name';
        END IF;
        IF r.name ~ '[ ,;{}()=\n\t]' THEN
            RAISE EXCEPTION 'column % of table % has a name the lake cannot store: '
                            'Delta column names cannot contain a space or any of , ; { } ( ) = newline tab',
                quote_ident(r.name), p_table
                USING ERRCODE = 'invalid_name',
                      HINT = 'Rename the column, e.g. ALTER TABLE ... RENAME COLUMN ... TO a name of letters, digits and _.';
        END IF;
        IF r.same_name IS NOT NULL THEN
            RAISE EXCEPTION 'columns % and % of table % differ only in case, and the lake (Spark) matches '
                            'column names case-insensitively', quote_ident(r.name), quote_ident(r.same_name), p_table
                USING ERRCODE = 'invalid_name';
        END IF;
        column_name := r.name;
        pg_type := r.pg_type;
        lake_type := r.lake_type;
        key_position := r.key_position;
        RETURN NEXT;
    END LOOP;
END;
$$;

-- As 011's, with a key column of a domain type keyed as its base type.
CREATE OR REPLACE FUNCTION coldharbor.key_sql(p_table_id integer, p_alias text)
RETURNS text
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    t       coldharbor.tables;
    r       record;
    v_parts text[] := '{}';
    v_elem  text;
BEGIN
    SELECT * INTO STRICT t FROM coldharbor.tables WHERE table_id = p_table_id;
    FOR r IN SELECT k.name, (coldharbor.base_type(a.atttypid, a.atttypmod)).base_type::regtype AS type
               FROM unnest(t.key_columns) WITH ORDINALITY AS k(name, n)
               JOIN pg_attribute a ON a.attrelid = format('%I.%I', t.schema_name, t.table_name)::regclass
                                  AND a.attname = k.name AND NOT a.attisdropped
              ORDER BY k.n LOOP
        v_elem := coldharbor.key_element_sql(r.type, format('%I.%I', p_alias, r.name));
        IF v_elem IS NULL THEN
            RAISE EXCEPTION 'cannot register %.%: key column % has type %, whose values have no canonical identity',
                quote_ident(t.schema_name), quote_ident(t.table_name), quote_ident(r.name), r.type
                USING ERRCODE = 'feature_not_supported',
                      HINT = 'Key columns may be smallint, integer, bigint, numeric(p,s), boolean, text, varchar, char, '
                          || 'date, timestamp, timestamptz, uuid or bytea (or a domain over one of them).';
        END IF;
        v_parts := v_parts || format('%L, %s', r.name, v_elem);
    END LOOP;
    RETURN 'jsonb_build_object(' || array_to_string(v_parts, ', ') || ')';
END;
$$;

-- As 015's, with 016's dirty_since, and registering another relation retires the old one's change_log rows and finished
-- batches (see 1. above).
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

-- As 013's, and a table with inheritance children is refused (see 3. above).
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

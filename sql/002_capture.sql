-- Type validation, registration and the capture triggers.

-- The lake type of one PostgreSQL column, or NULL when the type does not round-trip exactly
-- (see the type table in DESIGN.md).
CREATE OR REPLACE FUNCTION coldharbor.lake_type(p_type oid, p_typmod integer)
RETURNS text
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    v_precision integer;
    v_scale     integer;
BEGIN
    IF p_type = 'numeric'::regtype THEN
        IF p_typmod < 4 THEN
            RETURN NULL;                       -- numeric without (p,s)
        END IF;
        v_precision := ((p_typmod - 4) >> 16) & 65535;
        v_scale := (((p_typmod - 4) & 2047) # 1024) - 1024;   -- PostgreSQL 15+ allows negative scales
        IF v_precision > 38 OR v_scale < 0 OR v_scale > v_precision THEN
            RETURN NULL;
        END IF;
        RETURN format('DECIMAL(%s,%s)', v_precision, v_scale);
    END IF;
    RETURN CASE p_type
        WHEN 'smallint'::regtype                    THEN 'SHORT'
        WHEN 'integer'::regtype                     THEN 'INT'
        WHEN 'bigint'::regtype                      THEN 'LONG'
        WHEN 'real'::regtype                        THEN 'FLOAT'
        WHEN 'double precision'::regtype            THEN 'DOUBLE'
        WHEN 'boolean'::regtype                     THEN 'BOOLEAN'
        WHEN 'text'::regtype                        THEN 'STRING'
        WHEN 'character varying'::regtype           THEN 'STRING'
        WHEN 'character'::regtype                   THEN 'STRING'
        WHEN 'date'::regtype                        THEN 'DATE'
        WHEN 'timestamp without time zone'::regtype THEN 'TIMESTAMP_NTZ'
        WHEN 'timestamp with time zone'::regtype    THEN 'TIMESTAMP'
        WHEN 'uuid'::regtype                        THEN 'STRING'
        WHEN 'bytea'::regtype                       THEN 'BINARY'
        WHEN 'json'::regtype                        THEN 'STRING'
        WHEN 'jsonb'::regtype                       THEN 'STRING'
    END;
END;
$$;

-- The columns of a table as the lake sees them, in table order; raises naming the first column
-- whose type cannot round-trip, or whose name collides with the lake's metadata columns.
CREATE OR REPLACE FUNCTION coldharbor.lake_columns(p_table regclass)
RETURNS TABLE (column_name text, pg_type text, lake_type text, key_position integer)
LANGUAGE plpgsql STABLE AS $$
DECLARE
    r record;
BEGIN
    FOR r IN
        SELECT a.attname::text AS name,
               format_type(a.atttypid, a.atttypmod) AS pg_type,
               coldharbor.lake_type(a.atttypid, a.atttypmod) AS lake_type,
               array_position(i.indkey::smallint[], a.attnum) AS key_position
        FROM pg_catalog.pg_attribute a
        LEFT JOIN pg_catalog.pg_index i ON i.indrelid = a.attrelid AND i.indisprimary
        WHERE a.attrelid = p_table AND a.attnum > 0 AND NOT a.attisdropped
        ORDER BY a.attnum
    LOOP
        IF r.lake_type IS NULL THEN
            RAISE EXCEPTION 'column % of table % has type %, which does not round-trip to the lake',
                quote_ident(r.name), p_table, r.pg_type
                USING ERRCODE = 'feature_not_supported',
                      HINT = 'Supported: smallint, integer, bigint, real, double precision, numeric(p,s) with p <= 38, '
                          || 'boolean, text, varchar, char, date, timestamp, timestamptz, uuid, bytea, json, jsonb.';
        END IF;
        IF r.name LIKE '\_ch\_%' THEN
            RAISE EXCEPTION 'column % of table % uses the prefix _ch_, which is reserved for lake metadata',
                quote_ident(r.name), p_table
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

-- (Re)creates the statement-level capture triggers of one registered table. Each trigger reads
-- its transition table once, so a bulk statement pays one trigger call, not one per row.
CREATE OR REPLACE FUNCTION coldharbor.install_capture(p_table_id integer)
RETURNS void
LANGUAGE plpgsql AS $install$
DECLARE
    t        coldharbor.tables;
    v_rel    text;
    v_prefix text;
    v_key_n  text;      -- jsonb key built from alias n
    v_key_o  text;      -- jsonb key built from alias o
    v_join   text;
    v_first  text;
BEGIN
    SELECT * INTO STRICT t FROM coldharbor.tables WHERE table_id = p_table_id;
    v_rel := format('%I.%I', t.schema_name, t.table_name);
    v_prefix := format('coldharbor.capture_%s', t.table_id);
    SELECT 'jsonb_build_object(' || string_agg(format('%L, n.%I', c, c), ', ') || ')',
           'jsonb_build_object(' || string_agg(format('%L, o.%I', c, c), ', ') || ')',
           string_agg(format('n.%I = o.%I', c, c), ' AND ')
      INTO v_key_n, v_key_o, v_join
      FROM unnest(t.key_columns) AS c;
    v_first := quote_ident(t.key_columns[1]);

    EXECUTE format($f$
        CREATE OR REPLACE FUNCTION %s_ins() RETURNS trigger
        LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $b$
        BEGIN
            INSERT INTO coldharbor.change_log (table_id, key, op)
            SELECT %s, %s, 'I' FROM new_rows n;
            RETURN NULL;
        END $b$$f$, v_prefix, t.table_id, v_key_n);

    EXECUTE format($f$
        CREATE OR REPLACE FUNCTION %s_del() RETURNS trigger
        LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $b$
        BEGIN
            INSERT INTO coldharbor.change_log (table_id, key, op)
            SELECT %s, %s, 'D' FROM old_rows o;
            RETURN NULL;
        END $b$$f$, v_prefix, t.table_id, v_key_o);

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

    -- TRUNCATE fires no row-level work; log a delete for every key it is about to remove.
    EXECUTE format($f$
        CREATE OR REPLACE FUNCTION %s_trunc() RETURNS trigger
        LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $b$
        BEGIN
            INSERT INTO coldharbor.change_log (table_id, key, op)
            SELECT %s, %s, 'D' FROM %s o;
            RETURN NULL;
        END $b$$f$, v_prefix, t.table_id, v_key_o, v_rel);

    EXECUTE format('DROP TRIGGER IF EXISTS coldharbor_capture_ins ON %s', v_rel);
    EXECUTE format('DROP TRIGGER IF EXISTS coldharbor_capture_upd ON %s', v_rel);
    EXECUTE format('DROP TRIGGER IF EXISTS coldharbor_capture_del ON %s', v_rel);
    EXECUTE format('DROP TRIGGER IF EXISTS coldharbor_capture_trunc ON %s', v_rel);
    EXECUTE format('CREATE TRIGGER coldharbor_capture_ins AFTER INSERT ON %s '
                   'REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION %s_ins()',
                   v_rel, v_prefix);
    EXECUTE format('CREATE TRIGGER coldharbor_capture_upd AFTER UPDATE ON %s '
                   'REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows '
                   'FOR EACH STATEMENT EXECUTE FUNCTION %s_upd()', v_rel, v_prefix);
    EXECUTE format('CREATE TRIGGER coldharbor_capture_del AFTER DELETE ON %s '
                   'REFERENCING OLD TABLE AS old_rows FOR EACH STATEMENT EXECUTE FUNCTION %s_del()',
                   v_rel, v_prefix);
    EXECUTE format('CREATE TRIGGER coldharbor_capture_trunc BEFORE TRUNCATE ON %s '
                   'FOR EACH STATEMENT EXECUTE FUNCTION %s_trunc()', v_rel, v_prefix);
END;
$install$;

-- Registers a table for capture and export; returns its table_id. Registering again updates the
-- settings and reinstalls the triggers. Fails, naming the problem, when the table has no primary
-- key, a column type does not round-trip, or a partition or sort column is not allowed.
CREATE OR REPLACE FUNCTION coldharbor.register_table(
    p_table         regclass,
    p_lake_location text     DEFAULT NULL,
    p_partition_by  text[]   DEFAULT '{}',
    p_sort_by       text[]   DEFAULT '{}',
    p_hot_retention interval DEFAULT NULL)
RETURNS integer
LANGUAGE plpgsql AS $$
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
    FOREACH v_col IN ARRAY coalesce(p_partition_by, '{}') LOOP
        IF NOT v_col = ANY (v_keys) THEN
            RAISE EXCEPTION 'cannot register %: partition column % is not part of the primary key (%)',
                p_table, quote_ident(v_col), array_to_string(v_keys, ', ')
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
    END LOOP;
    FOREACH v_col IN ARRAY coalesce(p_sort_by, '{}') LOOP
        IF NOT v_col = ANY (v_columns) THEN
            RAISE EXCEPTION 'cannot register %: sort column % does not exist', p_table, quote_ident(v_col)
                USING ERRCODE = 'undefined_column';
        END IF;
    END LOOP;
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

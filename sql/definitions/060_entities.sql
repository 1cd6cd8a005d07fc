-- Entity schemas: JSON Schema records stored in two shared tables, their checks, flattened views
-- and capture.
-- (Definitions: each object here only, CREATE OR REPLACE; see sql/README.md.)

-- The attribute kinds, the PostgreSQL type each is stored and exported as, and its slot columns.
CREATE OR REPLACE FUNCTION coldharbor.entity_kind_type(p_kind text)
RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE p_kind
        WHEN 'text' THEN 'text' WHEN 'integer' THEN 'bigint' WHEN 'number' THEN 'double precision'
        WHEN 'boolean' THEN 'boolean' WHEN 'date' THEN 'date' WHEN 'timestamp' THEN 'timestamp with time zone'
        WHEN 'json' THEN 'jsonb' END
$$;

CREATE OR REPLACE FUNCTION coldharbor.entity_slots(p_kind text)
RETURNS text[]
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE
        WHEN p_kind IN ('text', 'integer', 'number') THEN
            ARRAY[p_kind || '_01', p_kind || '_02', p_kind || '_03', p_kind || '_04', p_kind || '_05']
        WHEN p_kind IN ('boolean', 'date', 'timestamp') THEN ARRAY[p_kind || '_01', p_kind || '_02', p_kind || '_03']
        ELSE '{}'::text[] END
$$;

-- Attribute names become lake column names: lower-case SQL identifiers, none of the view's own.
CREATE OR REPLACE FUNCTION coldharbor.entity_check_name(p_what text, p_name text)
RETURNS void
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    IF p_name IS NULL OR p_name !~ '^[a-z_][a-z0-9_]{0,62}$' THEN
        RAISE EXCEPTION '% % is not a valid identifier (lower-case letters, digits and _, starting with a letter or _, at most 63 characters)',
            p_what, coalesce(quote_literal(p_name), 'NULL') USING ERRCODE = 'invalid_name';
    END IF;
    IF p_what = 'attribute' AND (p_name IN ('row_id', 'schema_version', 'updated_at') OR p_name LIKE '\_ch\_%') THEN
        RAISE EXCEPTION 'attribute % is reserved (row_id, schema_version, updated_at and the prefix _ch_ are the lake''s own)',
            p_name USING ERRCODE = 'invalid_name';
    END IF;
END;
$$;

-- The kind of one JSON Schema property, or an error naming the attribute when it cannot round-trip.
CREATE OR REPLACE FUNCTION coldharbor.entity_compile_attribute(p_schema text, p_attr text, p_prop jsonb)
RETURNS jsonb
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    v_types    text[];
    v_type     text;
    v_nullable boolean;
    v_kind     text;
    v_format   text := p_prop ->> 'format';
BEGIN
    PERFORM coldharbor.entity_check_name('attribute', p_attr);
    IF jsonb_typeof(p_prop) IS DISTINCT FROM 'object' THEN
        RAISE EXCEPTION 'attribute % of schema %: its definition must be a JSON object', p_attr, p_schema
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    CASE jsonb_typeof(p_prop -> 'type')
        WHEN 'string' THEN v_types := ARRAY[p_prop ->> 'type'];
        WHEN 'array' THEN SELECT array_agg(t) INTO v_types FROM jsonb_array_elements_text(p_prop -> 'type') AS t;
        ELSE v_types := '{}';
    END CASE;
    v_nullable := 'null' = ANY (v_types);
    v_types := array_remove(v_types, 'null');
    IF cardinality(v_types) <> 1 THEN
        RAISE EXCEPTION 'attribute % of schema % has type %: exactly one type (optionally with "null") round-trips to a lake column',
            p_attr, p_schema, coalesce((p_prop -> 'type')::text, 'none') USING ERRCODE = 'feature_not_supported';
    END IF;
    v_type := v_types[1];
    v_kind := CASE v_type
        WHEN 'string' THEN CASE v_format WHEN 'date' THEN 'date' WHEN 'date-time' THEN 'timestamp' ELSE 'text' END
        WHEN 'integer' THEN 'integer' WHEN 'number' THEN 'number' WHEN 'boolean' THEN 'boolean'
        WHEN 'object' THEN 'json' WHEN 'array' THEN 'json' END;
    IF v_kind IS NULL THEN
        RAISE EXCEPTION 'attribute % of schema % has type %, which does not round-trip to the lake',
            p_attr, p_schema, quote_literal(v_type) USING ERRCODE = 'feature_not_supported',
            HINT = 'Supported: string (formats date and date-time become DATE and TIMESTAMP), integer, number, boolean, object and array (JSON text).';
    END IF;
    IF p_prop ? 'enum' AND jsonb_typeof(p_prop -> 'enum') IS DISTINCT FROM 'array' THEN
        RAISE EXCEPTION 'attribute % of schema %: enum must be an array', p_attr, p_schema
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    RETURN jsonb_strip_nulls(jsonb_build_object('kind', v_kind, 'type', v_type, 'nullable', v_nullable,
                                                'enum', p_prop -> 'enum'));
END;
$$;

-- Validates one attribute value against its compiled definition; raises naming the attribute.
CREATE OR REPLACE FUNCTION coldharbor.entity_check_value(p_schema text, p_attr text, p_def jsonb, p_value jsonb)
RETURNS void
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    v_kind  text := p_def ->> 'kind';
    v_type  text := p_def ->> 'type';
    v_jtype text := jsonb_typeof(p_value);
    v_ok    boolean;
    v_num   numeric;
BEGIN
    IF v_jtype = 'null' THEN
        IF NOT (p_def ->> 'nullable')::boolean THEN
            RAISE EXCEPTION 'attribute % of schema % must be %, got null', p_attr, p_schema, v_type
                USING ERRCODE = 'not_null_violation';
        END IF;
        RETURN;
    END IF;
    v_ok := CASE v_type
        WHEN 'string' THEN v_jtype = 'string'
        WHEN 'integer' THEN v_jtype = 'number'
        WHEN 'number' THEN v_jtype = 'number'
        WHEN 'boolean' THEN v_jtype = 'boolean'
        WHEN 'object' THEN v_jtype = 'object'
        WHEN 'array' THEN v_jtype = 'array' END;
    IF NOT v_ok THEN
        RAISE EXCEPTION 'attribute % of schema % must be %, got % %', p_attr, p_schema, v_type, v_jtype, left(p_value::text, 80)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    BEGIN
        CASE v_kind
            WHEN 'integer' THEN
                v_num := p_value::numeric;
                IF v_num <> trunc(v_num) OR v_num NOT BETWEEN -9223372036854775808 AND 9223372036854775807 THEN
                    RAISE EXCEPTION USING ERRCODE = 'numeric_value_out_of_range';
                END IF;
            WHEN 'number' THEN PERFORM p_value::double precision;
            WHEN 'date' THEN
                IF (p_value #>> '{}') !~ '^\d{4}-\d{2}-\d{2}$' THEN
                    RAISE EXCEPTION USING ERRCODE = 'invalid_datetime_format';
                END IF;
                PERFORM (p_value #>> '{}')::date;
            WHEN 'timestamp' THEN
                IF (p_value #>> '{}') !~ '^\d{4}-\d{2}-\d{2}[Tt ]\d{2}:\d{2}:\d{2}(\.\d+)?([Zz]|[+-]\d{2}:\d{2})$' THEN
                    RAISE EXCEPTION USING ERRCODE = 'invalid_datetime_format';
                END IF;
                PERFORM (p_value #>> '{}')::timestamptz;
            ELSE NULL;
        END CASE;
    EXCEPTION WHEN data_exception THEN
        RAISE EXCEPTION 'attribute % of schema % must be %, got %', p_attr, p_schema,
            CASE v_kind WHEN 'integer' THEN 'an integer within 64 bits' WHEN 'number' THEN 'a number within double precision'
                        WHEN 'date' THEN 'a date (YYYY-MM-DD)'
                        WHEN 'timestamp' THEN 'a date-time with a time zone offset (RFC 3339)' END,
            left(p_value::text, 80) USING ERRCODE = 'invalid_parameter_value';
    END;
    IF p_def -> 'enum' IS NOT NULL AND jsonb_typeof(p_def -> 'enum') = 'array'
       AND NOT (p_def -> 'enum') @> jsonb_build_array(p_value) THEN
        RAISE EXCEPTION 'attribute % of schema % must be one of %, got %', p_attr, p_schema, p_def -> 'enum', p_value
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
END;
$$;

-- Defines the next version of an entity schema from a JSON Schema document; returns its schema_id.
-- Hot attributes get typed slot columns in entity_main (a B-tree index each); the rest live in
-- eav_data. A new version may add and drop attributes; an attribute's type may change only by
-- widening integer to number. When the name is registered, its view (and so the lake table) widens.
CREATE OR REPLACE FUNCTION coldharbor.define_entity_schema(p_name text, p_document jsonb, p_hot_attributes text[] DEFAULT '{}')
RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_prev       coldharbor.entity_schemas;
    v_attrs      jsonb := '{}';
    v_hot        jsonb := '{}';
    v_required   text[] := '{}';
    v_attr       text;
    v_prop       jsonb;
    v_def        jsonb;
    v_old_kind   text;
    v_slot       text;
    v_schema_id  integer;
    v_version    integer;
    v_enum_value jsonb;
BEGIN
    PERFORM coldharbor.entity_check_name('schema name', p_name);
    PERFORM pg_advisory_xact_lock(hashtext('coldharbor.entity_schemas'), hashtext(p_name));
    IF jsonb_typeof(p_document) IS DISTINCT FROM 'object'
       OR coalesce(p_document ->> 'type', 'object') <> 'object'
       OR jsonb_typeof(p_document -> 'properties') IS DISTINCT FROM 'object' THEN
        RAISE EXCEPTION 'schema %: the document must be a JSON Schema object with "properties"', p_name
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    SELECT * INTO v_prev FROM coldharbor.entity_schemas WHERE name = p_name ORDER BY version DESC LIMIT 1;

    FOR v_attr, v_prop IN SELECT key, value FROM jsonb_each(p_document -> 'properties') LOOP
        v_def := coldharbor.entity_compile_attribute(p_name, v_attr, v_prop);
        FOR v_enum_value IN SELECT jsonb_array_elements(CASE jsonb_typeof(v_def -> 'enum') WHEN 'array' THEN v_def -> 'enum' ELSE '[]' END) LOOP
            PERFORM coldharbor.entity_check_value(p_name, v_attr, v_def - 'enum', v_enum_value);
        END LOOP;
        v_old_kind := v_prev.attributes -> v_attr ->> 'kind';
        IF v_old_kind IS NOT NULL AND v_old_kind <> v_def ->> 'kind'
           AND NOT (v_old_kind = 'integer' AND v_def ->> 'kind' = 'number') THEN
            RAISE EXCEPTION 'schema % version %: attribute % changes from % to %, which is not a safe widening (only integer to number is)',
                p_name, v_prev.version + 1, v_attr, v_old_kind, v_def ->> 'kind'
                USING ERRCODE = 'feature_not_supported',
                      HINT = 'Add a new attribute instead; the lake keeps the old one.';
        END IF;
        v_attrs := v_attrs || jsonb_build_object(v_attr, v_def);
    END LOOP;

    IF p_document ? 'required' THEN
        IF jsonb_typeof(p_document -> 'required') <> 'array' THEN
            RAISE EXCEPTION 'schema %: "required" must be an array of attribute names', p_name
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
        SELECT coalesce(array_agg(r), '{}') INTO v_required FROM jsonb_array_elements_text(p_document -> 'required') AS r;
        FOREACH v_attr IN ARRAY v_required LOOP
            IF NOT v_attrs ? v_attr THEN
                RAISE EXCEPTION 'schema %: required attribute % is not among its properties', p_name, v_attr
                    USING ERRCODE = 'invalid_parameter_value';
            END IF;
        END LOOP;
    END IF;

    -- Hot attributes: keep the slot the previous version gave the attribute, else the first free one.
    FOREACH v_attr IN ARRAY coalesce(p_hot_attributes, '{}') LOOP
        IF NOT v_attrs ? v_attr THEN
            RAISE EXCEPTION 'schema %: hot attribute % is not among its properties', p_name, v_attr
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
        v_def := v_attrs -> v_attr;
        IF cardinality(coldharbor.entity_slots(v_def ->> 'kind')) = 0 THEN
            RAISE EXCEPTION 'schema %: attribute % is an %, which has no hot slot; only scalar attributes can be hot',
                p_name, v_attr, v_def ->> 'type' USING ERRCODE = 'feature_not_supported';
        END IF;
        v_slot := v_prev.hot_slots ->> v_attr;
        IF v_slot IS NULL OR NOT v_slot = ANY (coldharbor.entity_slots(v_def ->> 'kind'))
           OR EXISTS (SELECT 1 FROM jsonb_each_text(v_hot) h WHERE h.value = v_slot) THEN
            SELECT s INTO v_slot FROM unnest(coldharbor.entity_slots(v_def ->> 'kind')) AS s
             WHERE NOT EXISTS (SELECT 1 FROM jsonb_each_text(v_hot) h WHERE h.value = s)
               AND NOT EXISTS (SELECT 1 FROM jsonb_each_text(v_prev.hot_slots) p
                                WHERE p.value = s AND p.key = ANY (p_hot_attributes) AND p.key <> v_attr)
             ORDER BY s LIMIT 1;
        END IF;
        IF v_slot IS NULL THEN
            RAISE EXCEPTION 'schema %: no free % slot for hot attribute % (entity_main has %)', p_name,
                v_def ->> 'kind', v_attr, array_to_string(coldharbor.entity_slots(v_def ->> 'kind'), ', ')
                USING ERRCODE = 'program_limit_exceeded';
        END IF;
        v_hot := v_hot || jsonb_build_object(v_attr, v_slot);
        v_attrs := jsonb_set(v_attrs, ARRAY[v_attr, 'slot'], to_jsonb(v_slot));
        IF to_regclass('coldharbor.entity_main_' || v_slot) IS NULL THEN
            EXECUTE format('CREATE INDEX %I ON coldharbor.entity_main (schema_id, %I)', 'entity_main_' || v_slot, v_slot);
        END IF;
    END LOOP;

    v_version := coalesce(v_prev.version, 0) + 1;
    INSERT INTO coldharbor.entity_schemas (name, version, document, attributes, hot_slots, required, table_id)
    VALUES (p_name, v_version, p_document, v_attrs, v_hot, v_required, v_prev.table_id)
    RETURNING schema_id INTO v_schema_id;
    IF v_prev.table_id IS NOT NULL THEN
        PERFORM coldharbor.entity_refresh_view(p_name);
    END IF;
    RETURN v_schema_id;
END;
$$;

-- The SELECT that flattens the records of one schema into typed wide rows: row_id,
-- schema_version, updated_at, then every attribute of every version (first version first, then
-- by name), each read from its slot or its eav_data row per version and cast to its latest
-- (widest) type. Without p_row_ids it reads every record, one LATERAL aggregate per record (the
-- view: cheap for the few records a filter or a join picks). With p_row_ids, a subquery yielding
-- uuids, it reads only those records and aggregates their eav_data rows in one grouped pass
-- (what the export uses for a batch: no per-record work).
CREATE OR REPLACE FUNCTION coldharbor.entity_flatten_sql(p_name text, p_row_ids text DEFAULT NULL)
RETURNS text
LANGUAGE plpgsql STABLE AS $$
DECLARE
    v_ids      text;
    v_version  text;
    v_columns  text := '';
    v_eav      text := '';
    r          record;
    g          record;
    v_expr     text;
    v_cases    text;
BEGIN
    SELECT string_agg(schema_id::text, ', ' ORDER BY version),
           'CASE m.schema_id ' || string_agg(format('WHEN %s THEN %s', schema_id, version), ' ' ORDER BY version) || ' END'
      INTO v_ids, v_version
      FROM coldharbor.entity_schemas WHERE name = p_name;
    IF v_ids IS NULL THEN
        RAISE EXCEPTION 'unknown entity schema %', coalesce(quote_literal(p_name), 'NULL') USING ERRCODE = 'undefined_object';
    END IF;

    FOR r IN
        SELECT e.key AS attr, (array_agg(e.value ->> 'kind' ORDER BY s.version DESC))[1] AS kind,
               bool_or(e.value ->> 'slot' IS NULL) AS any_eav
          FROM coldharbor.entity_schemas s, jsonb_each(s.attributes) e
         WHERE s.name = p_name
         GROUP BY e.key ORDER BY min(s.version), e.key
    LOOP
        -- Each storage place (a slot, or eav_data) with the versions that keep the attribute there;
        -- one place used by every version needs no CASE.
        v_cases := '';
        v_expr := NULL;
        FOR g IN
            SELECT coalesce(e.value ->> 'slot', '') AS slot, string_agg(s.schema_id::text, ', ') AS ids,
                   count(*) = (SELECT count(*) FROM coldharbor.entity_schemas WHERE name = p_name) AS everywhere
              FROM coldharbor.entity_schemas s, jsonb_each(s.attributes) e
             WHERE s.name = p_name AND e.key = r.attr
             GROUP BY 1
        LOOP
            v_expr := CASE WHEN g.slot = '' THEN format('e.%I', r.attr) ELSE format('m.%I', g.slot) END;
            v_cases := v_cases || format(' WHEN m.schema_id IN (%s) THEN %s', g.ids, v_expr);
            IF NOT g.everywhere THEN
                v_expr := NULL;
            END IF;
        END LOOP;
        IF v_expr IS NULL THEN
            v_expr := 'CASE' || v_cases || ' END';
        END IF;
        v_columns := v_columns || format(', (%s)::%s AS %I', v_expr, coldharbor.entity_kind_type(r.kind), r.attr);
        IF r.any_eav THEN
            v_eav := v_eav || format(', any_value(%s) FILTER (WHERE e.attribute = %L) AS %I',
                CASE r.kind WHEN 'number' THEN 'coalesce(e.value_number, e.value_integer::double precision)'
                            ELSE 'e.value_' || r.kind END, r.attr, r.attr);
        END IF;
    END LOOP;

    RETURN format('SELECT m.row_id, (%s)::integer AS schema_version, m.updated_at%s FROM coldharbor.entity_main m%s '
                  'WHERE m.schema_id IN (%s)%s',
        v_version, v_columns,
        CASE WHEN v_eav = '' THEN ''
             WHEN p_row_ids IS NULL THEN format(
                 ' LEFT JOIN LATERAL (SELECT %s FROM coldharbor.eav_data e WHERE e.row_id = m.row_id) e ON true',
                 substr(v_eav, 3))
             ELSE format(' LEFT JOIN (SELECT e.row_id AS _ch_row_id%s FROM coldharbor.eav_data e '
                         'WHERE e.row_id IN (%s) GROUP BY e.row_id) e ON e._ch_row_id = m.row_id', v_eav, p_row_ids) END,
        v_ids,
        CASE WHEN p_row_ids IS NULL THEN '' ELSE format(' AND m.row_id IN (%s)', p_row_ids) END);
END;
$$;

-- (Re)creates the view entities.<name> over every record of the schema.
CREATE OR REPLACE FUNCTION coldharbor.entity_refresh_view(p_name text)
RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_select text := coldharbor.entity_flatten_sql(p_name);
BEGIN
    IF to_regclass(format('entities.%I', p_name)) IS NOT NULL THEN
        EXECUTE format('DROP VIEW entities.%I', p_name);
    END IF;
    EXECUTE format('CREATE VIEW entities.%I AS %s', p_name, v_select);
    -- Deleting from the view deletes the records (the purge job deletes through it).
    EXECUTE format('CREATE TRIGGER entity_delete INSTEAD OF DELETE ON entities.%I '
                   'FOR EACH ROW EXECUTE FUNCTION coldharbor.entity_view_delete()', p_name);
    EXECUTE format('COMMENT ON VIEW entities.%I IS %L', p_name,
                   format('Records of entity schema %s flattened to one row each; generated by coldharbor.entity_refresh_view', p_name));
END;
$$;

CREATE OR REPLACE FUNCTION coldharbor.entity_view_delete()
RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM coldharbor.entity_main WHERE row_id = OLD.row_id;
    RETURN OLD;
END;
$$;

-- Creates or replaces a record from one JSON document, validated against the latest version of
-- the schema first (types, formats, enums, required attributes, no unknown attributes); returns
-- its row_id. Nothing is written when the document is refused.
CREATE OR REPLACE FUNCTION coldharbor.put_entity(p_schema text, p_document jsonb, p_row_id uuid DEFAULT NULL)
RETURNS uuid
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    s       coldharbor.entity_schemas;
    v_attr  text;
    v_value jsonb;
    v_row   uuid := coalesce(p_row_id, gen_random_uuid());
    v_owner text;
    v_slots jsonb := '{}';
BEGIN
    SELECT * INTO s FROM coldharbor.entity_schemas WHERE name = p_schema ORDER BY version DESC LIMIT 1;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'unknown entity schema %', coalesce(quote_literal(p_schema), 'NULL')
            USING ERRCODE = 'undefined_object', HINT = 'Define it with coldharbor.define_entity_schema(...).';
    END IF;
    IF jsonb_typeof(p_document) IS DISTINCT FROM 'object' THEN
        RAISE EXCEPTION 'a record of schema % must be a JSON object, got %', p_schema, coalesce(jsonb_typeof(p_document), 'NULL')
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    FOR v_attr, v_value IN SELECT key, value FROM jsonb_each(p_document) LOOP
        IF NOT s.attributes ? v_attr THEN
            RAISE EXCEPTION 'attribute % is not in schema % (version %)', quote_literal(v_attr), p_schema, s.version
                USING ERRCODE = 'undefined_column';
        END IF;
        PERFORM coldharbor.entity_check_value(p_schema, v_attr, s.attributes -> v_attr, v_value);
        IF s.hot_slots ? v_attr THEN
            v_slots := v_slots || jsonb_build_object(s.hot_slots ->> v_attr, v_value);
        END IF;
    END LOOP;
    FOREACH v_attr IN ARRAY s.required LOOP
        IF jsonb_typeof(p_document -> v_attr) IS NULL OR jsonb_typeof(p_document -> v_attr) = 'null' THEN
            RAISE EXCEPTION 'attribute % is required by schema % (version %)', v_attr, p_schema, s.version
                USING ERRCODE = 'not_null_violation';
        END IF;
    END LOOP;
    SELECT o.name INTO v_owner FROM coldharbor.entity_main m JOIN coldharbor.entity_schemas o USING (schema_id)
     WHERE m.row_id = v_row;
    IF v_owner IS NOT NULL AND v_owner <> p_schema THEN
        RAISE EXCEPTION 'record % belongs to schema %, not %', v_row, v_owner, p_schema
            USING ERRCODE = 'invalid_parameter_value';
    END IF;

    INSERT INTO coldharbor.entity_main AS m (
        row_id, schema_id, text_01, text_02, text_03, text_04, text_05,
        integer_01, integer_02, integer_03, integer_04, integer_05,
        number_01, number_02, number_03, number_04, number_05, boolean_01, boolean_02, boolean_03,
        date_01, date_02, date_03, timestamp_01, timestamp_02, timestamp_03)
    SELECT v_row, s.schema_id, r.text_01, r.text_02, r.text_03, r.text_04, r.text_05,
           r.integer_01, r.integer_02, r.integer_03, r.integer_04, r.integer_05,
           r.number_01, r.number_02, r.number_03, r.number_04, r.number_05, r.boolean_01, r.boolean_02, r.boolean_03,
           r.date_01, r.date_02, r.date_03, r.timestamp_01, r.timestamp_02, r.timestamp_03
      FROM jsonb_populate_record(NULL::coldharbor.entity_main, v_slots) r
    ON CONFLICT (row_id) DO UPDATE SET
        schema_id = EXCLUDED.schema_id, updated_at = now(),
        text_01 = EXCLUDED.text_01, text_02 = EXCLUDED.text_02, text_03 = EXCLUDED.text_03,
        text_04 = EXCLUDED.text_04, text_05 = EXCLUDED.text_05,
        integer_01 = EXCLUDED.integer_01, integer_02 = EXCLUDED.integer_02, integer_03 = EXCLUDED.integer_03,
        integer_04 = EXCLUDED.integer_04, integer_05 = EXCLUDED.integer_05,
        number_01 = EXCLUDED.number_01, number_02 = EXCLUDED.number_02, number_03 = EXCLUDED.number_03,
        number_04 = EXCLUDED.number_04, number_05 = EXCLUDED.number_05,
        boolean_01 = EXCLUDED.boolean_01, boolean_02 = EXCLUDED.boolean_02, boolean_03 = EXCLUDED.boolean_03,
        date_01 = EXCLUDED.date_01, date_02 = EXCLUDED.date_02, date_03 = EXCLUDED.date_03,
        timestamp_01 = EXCLUDED.timestamp_01, timestamp_02 = EXCLUDED.timestamp_02,
        timestamp_03 = EXCLUDED.timestamp_03;

    -- The record is replaced as a whole: attributes absent from the document are removed.
    DELETE FROM coldharbor.eav_data WHERE row_id = v_row;
    INSERT INTO coldharbor.eav_data (row_id, attribute, value_text, value_integer, value_number, value_boolean,
                                     value_date, value_timestamp, value_json)
    SELECT v_row, d.key,
           CASE k.kind WHEN 'text' THEN d.value #>> '{}' END,
           CASE k.kind WHEN 'integer' THEN d.value::bigint END,
           CASE k.kind WHEN 'number' THEN d.value::double precision END,
           CASE k.kind WHEN 'boolean' THEN d.value::boolean END,
           CASE k.kind WHEN 'date' THEN (d.value #>> '{}')::date END,
           CASE k.kind WHEN 'timestamp' THEN (d.value #>> '{}')::timestamptz END,
           CASE k.kind WHEN 'json' THEN d.value END
      FROM jsonb_each(p_document) d
     CROSS JOIN LATERAL (SELECT s.attributes -> d.key ->> 'kind' AS kind) k
     WHERE NOT s.hot_slots ? d.key AND jsonb_typeof(d.value) <> 'null';
    RETURN v_row;
END;
$$;

-- Deletes a record (its entity_main row and, through capture, its eav_data rows); returns whether it existed.
CREATE OR REPLACE FUNCTION coldharbor.delete_entity(p_row_id uuid)
RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    DELETE FROM coldharbor.entity_main WHERE row_id = p_row_id;
    RETURN FOUND;
END;
$$;

-- Capture: statement-level triggers on both tables log one change per record and transaction.
-- p_rows: (row_id, schema_id) of the records a statement touched. A record whose schema is not
-- registered as a source logs nothing.
CREATE OR REPLACE FUNCTION coldharbor.entity_log(p_op "char", p_row_ids uuid[], p_schema_ids integer[])
RETURNS void
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    INSERT INTO coldharbor.change_log (table_id, key, op, xact)
    SELECT DISTINCT ON (s.table_id, r.row_id) s.table_id, jsonb_build_object('row_id', r.row_id), p_op,
           pg_current_xact_id()
      FROM unnest(p_row_ids, p_schema_ids) AS r(row_id, schema_id)
      JOIN coldharbor.entity_schemas s ON s.schema_id = r.schema_id AND s.table_id IS NOT NULL
    ON CONFLICT (table_id, key, xact) WHERE xact IS NOT NULL DO NOTHING
$$;

CREATE OR REPLACE FUNCTION coldharbor.capture_entity_main_ins() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM coldharbor.entity_log('I', array_agg(row_id), array_agg(schema_id)) FROM new_rows;
    RETURN NULL;
END;
$$;

-- A record that moves to another schema name logs a change for both sources (a delete in the old one).
CREATE OR REPLACE FUNCTION coldharbor.capture_entity_main_upd() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM old_rows o WHERE NOT EXISTS (SELECT 1 FROM new_rows n WHERE n.row_id = o.row_id)) THEN
        RAISE EXCEPTION 'the row_id of an entity record cannot change; delete the record and create a new one'
            USING ERRCODE = 'feature_not_supported';
    END IF;
    PERFORM coldharbor.entity_log('U', array_agg(row_id), array_agg(schema_id))
       FROM (SELECT row_id, schema_id FROM new_rows UNION SELECT row_id, schema_id FROM old_rows) r;
    RETURN NULL;
END;
$$;

-- Entity records: deleting records deletes their eav_data rows; a purge's delete logs nothing.
CREATE OR REPLACE FUNCTION coldharbor.capture_entity_main_del() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    DELETE FROM coldharbor.eav_data e USING old_rows o WHERE e.row_id = o.row_id;
    PERFORM coldharbor.entity_log('D', array_agg(o.row_id), array_agg(o.schema_id))
       FROM old_rows o JOIN coldharbor.entity_schemas s USING (schema_id)
      WHERE s.table_id IS NULL OR NOT coldharbor.capture_is_suspended(s.table_id);
    RETURN NULL;
END;
$$;

-- eav_data rows belong to a record: an insert or update for a record that does not exist is
-- refused; a delete whose record is already gone (the cascade above) logs nothing more.
CREATE OR REPLACE FUNCTION coldharbor.entity_check_orphans(p_row_ids uuid[])
RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    v_orphan uuid;
BEGIN
    SELECT r INTO v_orphan FROM unnest(p_row_ids) AS r
     WHERE NOT EXISTS (SELECT 1 FROM coldharbor.entity_main m WHERE m.row_id = r) LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'eav_data row for record %, which is not in entity_main', v_orphan
            USING ERRCODE = 'foreign_key_violation', HINT = 'Write records with coldharbor.put_entity(...).';
    END IF;
END;
$$;

-- Logs a change for each existing record among p_row_ids.
CREATE OR REPLACE FUNCTION coldharbor.entity_log_records(p_op "char", p_row_ids uuid[])
RETURNS void
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    SELECT coldharbor.entity_log(p_op, array_agg(m.row_id), array_agg(m.schema_id))
      FROM coldharbor.entity_main m WHERE m.row_id = ANY (p_row_ids)
$$;

CREATE OR REPLACE FUNCTION coldharbor.capture_eav_data_ins() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_ids uuid[] := (SELECT array_agg(DISTINCT row_id) FROM new_rows);
BEGIN
    PERFORM coldharbor.entity_check_orphans(v_ids);
    PERFORM coldharbor.entity_log_records('U', v_ids);
    RETURN NULL;
END;
$$;

CREATE OR REPLACE FUNCTION coldharbor.capture_eav_data_upd() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM coldharbor.entity_check_orphans((SELECT array_agg(DISTINCT row_id) FROM new_rows));
    PERFORM coldharbor.entity_log_records('U', (SELECT array_agg(row_id) FROM
                                                (SELECT row_id FROM new_rows UNION SELECT row_id FROM old_rows) r));
    RETURN NULL;
END;
$$;

CREATE OR REPLACE FUNCTION coldharbor.capture_eav_data_del() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM coldharbor.entity_log_records('U', (SELECT array_agg(DISTINCT row_id) FROM old_rows));
    RETURN NULL;
END;
$$;

CREATE OR REPLACE FUNCTION coldharbor.entity_no_truncate() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'TRUNCATE of coldharbor.% is not captured; delete the records instead', TG_TABLE_NAME
        USING ERRCODE = 'feature_not_supported';
END;
$$;

-- Registers an entity schema (all its versions) as a pipeline source exported to the lake table
-- of entities.<name>; returns its table_id. The first registration logs every existing record,
-- so the first export carries them. Registering again updates the settings.
CREATE OR REPLACE FUNCTION coldharbor.register_entity_schema(p_name text, p_lake_location text DEFAULT NULL,
                                                  p_sort_by text[] DEFAULT '{}')
RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_table_id integer;
    v_new      boolean;
    v_col      text;
    v_columns  text[];
BEGIN
    PERFORM pg_advisory_xact_lock(hashtext('coldharbor.entity_schemas'), hashtext(p_name));
    IF NOT EXISTS (SELECT 1 FROM coldharbor.entity_schemas WHERE name = p_name) THEN
        RAISE EXCEPTION 'unknown entity schema %', coalesce(quote_literal(p_name), 'NULL')
            USING ERRCODE = 'undefined_object', HINT = 'Define it with coldharbor.define_entity_schema(...).';
    END IF;
    PERFORM coldharbor.entity_refresh_view(p_name);
    SELECT array_agg(column_name) INTO v_columns
      FROM coldharbor.lake_columns(format('entities.%I', p_name)::regclass);
    v_col := coldharbor.first_not_in(p_sort_by, v_columns);
    IF v_col IS NOT NULL THEN
        RAISE EXCEPTION 'cannot register entity schema %: sort column % is not one of its attributes', p_name, quote_ident(v_col)
            USING ERRCODE = 'undefined_column';
    END IF;

    SELECT NOT EXISTS (SELECT 1 FROM coldharbor.tables WHERE schema_name = 'entities' AND table_name = p_name) INTO v_new;
    INSERT INTO coldharbor.tables AS t (schema_name, table_name, key_columns, lake_location, sort_by, source_kind)
    VALUES ('entities', p_name, '{row_id}', p_lake_location, coalesce(p_sort_by, '{}'), 'entity')
    ON CONFLICT (schema_name, table_name) DO UPDATE
       SET lake_location = EXCLUDED.lake_location, sort_by = EXCLUDED.sort_by
    RETURNING t.table_id INTO v_table_id;
    UPDATE coldharbor.entity_schemas SET table_id = v_table_id WHERE name = p_name;
    IF v_new THEN
        PERFORM coldharbor.entity_log('I', array_agg(m.row_id), array_agg(m.schema_id))
           FROM coldharbor.entity_main m JOIN coldharbor.entity_schemas s USING (schema_id)
          WHERE s.name = p_name;
    END IF;
    RETURN v_table_id;
END;
$$;

-- The capture of both record tables: the same statement triggers on each, calling that table's
-- capture_<table>_ins, _upd and _del, and entity_no_truncate.
DO $entity_capture$
DECLARE
    v_table text;
    r       record;
BEGIN
    FOREACH v_table IN ARRAY ARRAY['entity_main', 'eav_data'] LOOP
        FOR r IN VALUES ('ins', 'AFTER INSERT', 'REFERENCING NEW TABLE AS new_rows'),
                        ('upd', 'AFTER UPDATE', 'REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows'),
                        ('del', 'AFTER DELETE', 'REFERENCING OLD TABLE AS old_rows') LOOP
            EXECUTE format('CREATE OR REPLACE TRIGGER capture_%s %s ON coldharbor.%I %s '
                           'FOR EACH STATEMENT EXECUTE FUNCTION coldharbor.capture_%s_%s()',
                           r.column1, r.column2, v_table, r.column3, v_table, r.column1);
        END LOOP;
        EXECUTE format('CREATE OR REPLACE TRIGGER no_truncate BEFORE TRUNCATE ON coldharbor.%I '
                       'FOR EACH STATEMENT EXECUTE FUNCTION coldharbor.entity_no_truncate()', v_table);
    END LOOP;
END
$entity_capture$;

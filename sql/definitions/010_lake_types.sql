-- The lake type of a column, the columns of a table as the lake sees them, and the canonical key
-- of a row (key_sql, invariant 15).
-- (Definitions: each object here only, CREATE OR REPLACE; see sql/README.md.)

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

-- Column names the lake can store (bad input at registration, not at the first export).
--
-- A Delta table without column mapping refuses column names containing a space or any of
-- , ; { } ( ) = newline tab, and Spark resolves names case-insensitively, so "Amount" and "amount"
-- are one column there and "_CH_SEQ" collides with the metadata column _ch_seq. PostgreSQL accepts
-- all of these. Before migration 007 (of the single-directory layout) such a table registered and captured changes, and its first export
-- failed inside Spark with Delta's message. Now registration refuses it, naming the column, and an
-- export of a table registered earlier fails with the same message before it reads or marks
-- anything.
-- Since 017: with a domain column seen as its base type (pg_type and lake_type); a domain over a type
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

-- The canonical key element of an expression of type p_type, or NULL when that type may not be
-- part of a key (an allow-list).
CREATE OR REPLACE FUNCTION coldharbor.key_element_sql(p_type regtype, p_expr text)
RETURNS text
LANGUAGE sql IMMUTABLE SET search_path = pg_catalog, pg_temp AS $$
    SELECT CASE p_type
        WHEN 'smallint'::regtype                    THEN p_expr
        WHEN 'integer'::regtype                     THEN p_expr
        WHEN 'bigint'::regtype                      THEN p_expr
        WHEN 'boolean'::regtype                     THEN p_expr
        WHEN 'text'::regtype                        THEN p_expr
        WHEN 'character varying'::regtype           THEN p_expr
        WHEN 'uuid'::regtype                        THEN p_expr
        WHEN 'date'::regtype                        THEN p_expr
        WHEN 'timestamp without time zone'::regtype THEN p_expr
        WHEN 'character'::regtype                   THEN format('(%s)::text', p_expr)
        WHEN 'numeric'::regtype                     THEN format('trim_scale(%s)', p_expr)
        WHEN 'bytea'::regtype                       THEN format('(''\x'' || encode(%s, ''hex''))', p_expr)
        WHEN 'timestamp with time zone'::regtype    THEN
            format('((to_jsonb((%1$s) AT TIME ZONE ''UTC'') #>> ''{}'') || CASE WHEN isfinite(%1$s) THEN ''+00:00'' ELSE '''' END)',
                   p_expr)
    END
$$;

-- The SQL expression of the canonical key of table p_table_id's row under alias p_alias: the one
-- place key identity is produced (capture, eviction, purge). Raises, naming the column, when a key
-- column's type may not be part of a key.
-- Since 017: with a key column of a domain type keyed as its base type.
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

-- The type a column of type p_type (with modifier p_typmod) holds values of: a domain's base type
-- (through domains over domains) with the modifier of the innermost domain, as PostgreSQL's
-- getBaseTypeAndTypmod; any other type as it is.
CREATE OR REPLACE FUNCTION coldharbor.base_type(p_type oid, p_typmod integer, OUT base_type oid, OUT base_typmod integer)
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $$
    WITH RECURSIVE chain(type, typmod, depth) AS (
        SELECT p_type, p_typmod, 0
        UNION ALL
        SELECT t.typbasetype, t.typtypmod, c.depth + 1
          FROM chain c JOIN pg_type t ON t.oid = c.type
         WHERE t.typtype = 'd')
    SELECT type, typmod FROM chain ORDER BY depth DESC LIMIT 1
$$;

-- Each live column's lake type (NULL for a type the lake cannot hold), per attnum.
CREATE OR REPLACE FUNCTION coldharbor.column_lake_types(p_rel oid)
RETURNS jsonb
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $$
    SELECT coalesce(jsonb_object_agg(a.attnum::text, coldharbor.lake_type(b.base_type, b.base_typmod)), '{}')
      FROM pg_attribute a, LATERAL coldharbor.base_type(a.atttypid, a.atttypmod) b
     WHERE a.attrelid = p_rel AND a.attnum > 0 AND NOT a.attisdropped
$$;

-- Lake type changes every value survives, as export's lake.SAFE_WIDENINGS (the lake widens its column).
CREATE OR REPLACE FUNCTION coldharbor.lake_widens(p_from text, p_to text)
RETURNS boolean
LANGUAGE sql IMMUTABLE AS $$
    SELECT p_from = p_to OR (p_from, p_to) IN (('SHORT', 'INT'), ('SHORT', 'LONG'), ('SHORT', 'DOUBLE'),
                                               ('INT', 'LONG'), ('INT', 'DOUBLE'), ('LONG', 'DOUBLE'),
                                               ('FLOAT', 'DOUBLE'))
$$;

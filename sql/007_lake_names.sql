-- Column names the lake can store (bad input at registration, not at the first export).
--
-- A Delta table without column mapping refuses column names containing a space or any of
-- , ; { } ( ) = newline tab, and Spark resolves names case-insensitively, so "Amount" and "amount"
-- are one column there and "_CH_SEQ" collides with the metadata column _ch_seq. PostgreSQL accepts
-- all of these. Before this file such a table registered and captured changes, and its first export
-- failed inside Spark with Delta's message. Now registration refuses it, naming the column, and an
-- export of a table registered earlier fails with the same message before it reads or marks
-- anything.
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
               array_position(i.indkey::smallint[], a.attnum) AS key_position,
               (SELECT min(b.attname::text) FROM pg_catalog.pg_attribute b
                 WHERE b.attrelid = a.attrelid AND b.attnum > 0 AND NOT b.attisdropped
                   AND b.attnum <> a.attnum AND lower(b.attname) = lower(a.attname)) AS same_name
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

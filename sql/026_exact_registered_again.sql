-- Registering a table again without p_history keeps the history it had (sql/021). A table keeping
-- exact history that gained a column exact history refuses (json, a virtual generated column, a
-- nullable jsonb) went on silently with every image unusable (issue 26's cold attack): registering
-- it again now checks its columns as registering it with p_history => 'exact' does, and refuses in
-- one line, naming the column, with nothing changed.

-- As 021's, with p_history NULL keeping the table's history (registering it again without
-- p_history): a table that keeps exact history has its columns checked again, and is refused with
-- a hint that says how to stop keeping it.
CREATE OR REPLACE FUNCTION coldharbor.set_history_as_owner(p_table regclass, p_history text)
RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_id      integer;
    v_history text;
    v_message text;
BEGIN
    PERFORM coldharbor.check_may_register(p_table, session_user);
    IF p_history IS NOT NULL AND p_history NOT IN ('latest', 'exact') THEN
        RAISE EXCEPTION 'cannot register %: p_history must be ''latest'' or ''exact'', not %', p_table,
            quote_literal(p_history)
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = '''exact'' keeps every change''s row image, so as-of reports are exact at any instant; '
                      || '''latest'' (the default) keeps the newest image of a key per export.';
    END IF;
    SELECT table_id, history INTO v_id, v_history FROM coldharbor.tables
     WHERE source_kind = 'table' AND relid = p_table::oid;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'cannot set the history of %: it is not a registered table', p_table
            USING ERRCODE = 'undefined_object',
                  HINT = 'Register it with coldharbor.register_table(..., p_history => ...).';
    END IF;
    IF p_history IS NULL AND v_history = 'exact' THEN
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
    IF p_history IS NOT NULL AND v_history IS DISTINCT FROM p_history THEN
        UPDATE coldharbor.tables SET history = p_history WHERE table_id = v_id;
        PERFORM coldharbor.install_capture(v_id);
    END IF;
END;
$$;

-- As 022's, always passing p_history on (NULL: keep, and check, what the table has).
CREATE OR REPLACE FUNCTION coldharbor.register_table(
    p_table         regclass,
    p_lake_location text     DEFAULT NULL,
    p_partition_by  text[]   DEFAULT '{}',
    p_sort_by       text[]   DEFAULT '{}',
    p_hot_retention interval DEFAULT NULL,
    p_history       text     DEFAULT NULL,
    p_freshness     interval DEFAULT NULL)
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
    RETURN v_id;
END;
$$;

-- A table registered again with another primary key (issue 22's review, left open until now).
--
-- The jobs refuse a table whose primary key no longer matches its registration ("register it
-- again"), and registering it again took the new key with nothing else: the lake's rows stayed
-- keyed by the old key, so last-write-wins ranked versions of different rows as one key. With
-- primary key (a) changed to (a, b), the rows the table gained under the new key never reached the
-- lake (the changes logged under the old key have no b); with (a, b) changed to (a), an as-of report
-- before the change was answered with the rows (1, 1) and (1, 2) ranked as one key 1.
--
-- Registering the same relation again with another key (other columns: the same ones in another
-- order are the same key) now asks for a base that replaces the lake's
-- rows (`rebases.replaces_lake`), as a new relation's does when the keys cannot stand beside each
-- other (sql/017): the old key's changes and finished batches are retired, and as-of history
-- starts again at the base (an instant before it is refused: the lake's rows before it are keyed by
-- what no longer identifies a row). A table whose rows were evicted is refused instead: those rows
-- live in the lake alone, under the old key, and a base from PostgreSQL cannot rewrite them.

ALTER TABLE coldharbor.rebases ADD COLUMN replaces_lake boolean NOT NULL DEFAULT false;

CREATE FUNCTION coldharbor.track_registered_key()
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

-- Named to fire after track_registered_relation (which sets relid) and before track_registered_types.
CREATE TRIGGER track_registered_relation_key BEFORE UPDATE OF key_columns ON coldharbor.tables
    FOR EACH ROW EXECUTE FUNCTION coldharbor.track_registered_key();

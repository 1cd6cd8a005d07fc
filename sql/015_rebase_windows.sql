-- Rebase windows and replaced tables (issue 18, after review of sql/014).
--
-- 1. A rebase (sql/014) is a time when PostgreSQL held values the lake did not: from the request
--    (the DDL that changed rows without writing them) until the base that answered it landed. An
--    as-of report for an instant in between would read the pre-DDL rows, so every request is now
--    kept in coldharbor.rebases with its time and, once settled, the base's snapshot time and Delta
--    version; reports refuse as-of instants inside a window (serve.check_as_of).
-- 2. A registered table dropped and created again under its name, but not registered again, has no
--    capture triggers: its writes are not captured. The jobs refuse it by comparing the relation
--    registered (`relid`) with the one the name resolves to; an sql_drop event trigger records the
--    drop too (`dropped_at`), so the refusal holds even if the new table were given the old oid,
--    and registering again opens the rebase window at the drop, when PostgreSQL's rows changed.
-- 3. The base that settles a table clears its `rebase_reason` (the history stays in rebases).

ALTER TABLE coldharbor.tables ADD COLUMN dropped_at timestamptz;  -- the registered relation was dropped then

CREATE TABLE coldharbor.rebases (
    table_id        integer     NOT NULL REFERENCES coldharbor.tables ON DELETE CASCADE,
    serial          bigint      NOT NULL,   -- the table's rebase_serial after this request
    reason          text        NOT NULL,
    requested_at    timestamptz NOT NULL,   -- inside the requesting transaction: never after its commit
    settled_at      timestamptz,            -- snapshot time of the base that answered it
    settled_version bigint,                 -- that base's Delta version
    PRIMARY KEY (table_id, serial)
);

-- Requests made before this migration and still open: the request came after the newest base's
-- snapshot (else that base would have answered it), so the window starts there at the latest.
INSERT INTO coldharbor.rebases (table_id, serial, reason, requested_at)
SELECT table_id, rebase_serial, rebase_reason, coalesce(base_at, loaded_at, '-infinity')
  FROM coldharbor.tables WHERE load_state = 'pending' AND rebase_reason IS NOT NULL;

CREATE OR REPLACE FUNCTION coldharbor.request_rebase(p_table_id integer, p_reason text)
RETURNS void
LANGUAGE sql SET search_path = pg_catalog, pg_temp AS $$
    WITH asked AS (
        UPDATE coldharbor.tables
           SET load_state = 'pending', rebase_serial = rebase_serial + 1, rebase_reason = p_reason
         WHERE table_id = p_table_id
     RETURNING table_id, rebase_serial)
    INSERT INTO coldharbor.rebases (table_id, serial, reason, requested_at)
    SELECT table_id, rebase_serial, p_reason, clock_timestamp() FROM asked;
$$;

-- As in sql/014, and: a registration whose relation was dropped (`dropped_at`) is another relation
-- even under the same oid; the window of its rebase opens when the old one was dropped (without the
-- event trigger, at the newest base: earlier than the drop, never later).
CREATE OR REPLACE FUNCTION coldharbor.track_registered_relation()
RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_rel oid := to_regclass(format('%I.%I', NEW.schema_name, NEW.table_name));
    v_other boolean;
BEGIN
    IF NEW.source_kind <> 'table' THEN
        RETURN NEW;
    END IF;
    v_other := TG_OP = 'UPDATE' AND (OLD.relid IS DISTINCT FROM v_rel OR OLD.dropped_at IS NOT NULL);
    IF v_other THEN
        NEW.load_state := 'pending';
        NEW.rebase_serial := OLD.rebase_serial + 1;
        NEW.rebase_reason := 'registered again after the table was dropped and created anew: '
                             'the lake holds the old table''s rows';
        INSERT INTO coldharbor.rebases (table_id, serial, reason, requested_at)
        VALUES (NEW.table_id, NEW.rebase_serial, NEW.rebase_reason,
                coalesce(OLD.dropped_at, OLD.base_at, OLD.loaded_at, '-infinity'));
    END IF;
    NEW.columns_seen := CASE WHEN TG_OP = 'UPDATE' AND NOT v_other
                             THEN coldharbor.columns_seen_after(OLD.columns_seen, v_rel)
                             ELSE coldharbor.column_values_signature(v_rel) END;
    NEW.relid := v_rel;
    NEW.dropped_at := NULL;
    RETURN NEW;
END;
$$;

-- A table goes from pending to loaded when a base (or, with no rebase open, an empty table's
-- settling) answers it: the open requests up to its serial are closed with the base, and the reason
-- is cleared. The pipeline records bases but may not write rebase_reason: this runs as the owner.
CREATE FUNCTION coldharbor.settle_rebases()
RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF OLD.load_state = 'pending' AND NEW.load_state = 'loaded' THEN
        NEW.rebase_reason := NULL;
        UPDATE coldharbor.rebases
           SET settled_at = coalesce(NEW.base_at, clock_timestamp()), settled_version = NEW.base_version
         WHERE table_id = NEW.table_id AND settled_at IS NULL AND serial <= NEW.rebase_serial;
    END IF;
    RETURN NEW;
END;
$$;

CREATE TRIGGER settle_rebases BEFORE UPDATE OF load_state ON coldharbor.tables
    FOR EACH ROW EXECUTE FUNCTION coldharbor.settle_rebases();

-- Tables loaded again before this migration kept their reason; their requests are history.
UPDATE coldharbor.tables SET rebase_reason = NULL WHERE load_state = 'loaded' AND rebase_reason IS NOT NULL;

-- sql_drop: a registered table (not a partition of one: its parent stays) was dropped.
CREATE FUNCTION coldharbor.note_registered_drop()
RETURNS event_trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    UPDATE coldharbor.tables t SET dropped_at = clock_timestamp()
      FROM pg_event_trigger_dropped_objects() d
     WHERE d.classid = 'pg_class'::regclass AND d.objsubid = 0 AND d.objid = t.relid
       AND t.source_kind = 'table' AND t.dropped_at IS NULL;
END;
$$;

-- Like sql/014's, the event trigger needs a superuser; without it the jobs still compare relid with
-- the relation the name resolves to.
DO $drop$
BEGIN
    IF (SELECT rolsuper FROM pg_catalog.pg_roles WHERE rolname = current_user) THEN
        CREATE EVENT TRIGGER coldharbor_note_registered_drop ON sql_drop
            EXECUTE FUNCTION coldharbor.note_registered_drop();
    ELSE
        RAISE WARNING 'not a superuser: the event trigger that records the drop of a registered table was not '
                      'created; the jobs still refuse a table dropped and created again by its oid';
    END IF;
END
$drop$;

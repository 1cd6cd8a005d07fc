-- Rebase windows: where they start, and renames (issue 18, after an attack on sql/015's windows).
--
-- 1. A change committed before the DDL and not yet exported when it ran is exported afterwards:
--    its image is read from PostgreSQL after the DDL (holding the values the DDL left: 'LON' for
--    'LONGVALUE-new' after a TYPE ... USING left(v, 3), a column default in every row) but stamped
--    with the change's own, earlier commit time. As of an instant between that change and the DDL
--    the lake holds no true image of the key, so the window starts at the oldest change that was
--    dirty when the DDL ran (`dirty_since`), not at the request. Exact: a change exported before
--    the DDL was read before it (an export's readers hold ACCESS SHARE on the table, which the DDL
--    waits for), and every lake row written after the DDL is stamped at or after `dirty_since`
--    (dirty then) or after the request (later changes, bases). A change whose export was under way
--    at the DDL counts as dirty: the window may start a little early, never late. The commit time
--    is the export's (`hot_reader.change_time`): the commit timestamp, else the transaction's
--    start, which is earlier. The DDL's own transaction's changes commit after the request and are
--    inside the window anyway: they are left out.
-- 2. A rename (`column a was renamed to b`): lake rows written before it hold the column under its
--    old name, and an as-of read before it would find NULL under the new one. `renames_column`
--    marks such a request; serve refuses as-of instants before its base.
-- 3. A table registered again after it was dropped and created anew: as 1, for the old table's
--    changes still dirty (sql/017's track_registered_relation records its dirty_since).

ALTER TABLE coldharbor.rebases
    ADD COLUMN dirty_since    timestamptz,                   -- oldest change not exported at the request
    ADD COLUMN renames_column boolean NOT NULL DEFAULT false; -- the request came from RENAME COLUMN

-- When the oldest change of table p_table_id that is not in the lake yet committed, as the export
-- will stamp it; changes of the calling transaction (not committed yet) are left out.
CREATE FUNCTION coldharbor.oldest_dirty_change_at(p_table_id integer)
RETURNS timestamptz
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $$
    SELECT min(CASE WHEN current_setting('track_commit_timestamp')::boolean
                    THEN coalesce(pg_xact_commit_timestamp(c.xmin), c.created_at) ELSE c.created_at END)
      FROM coldharbor.change_log c
     WHERE c.table_id = p_table_id AND c.flushed_at IS NULL
       AND c.xmin::text IS DISTINCT FROM (pg_current_xact_id_if_assigned()::text::numeric % 4294967296)::text
$$;

-- Whether a column of table p_table_id has another name now than `columns_seen` records for it.
CREATE FUNCTION coldharbor.column_renamed(p_table_id integer)
RETURNS boolean
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $$
    SELECT EXISTS (SELECT 1 FROM coldharbor.tables t,
                          jsonb_each(coldharbor.column_values_signature(t.relid)) n
                     JOIN jsonb_each(t.columns_seen) o ON o.key = n.key
                    WHERE t.table_id = p_table_id AND t.relid IS NOT NULL
                      AND NOT coalesce((o.value ->> 'dropped')::boolean, false)
                      AND (n.value ->> 'name') IS DISTINCT FROM (o.value ->> 'name'))
$$;

-- As in sql/015, and the request records where its window starts and whether it is a rename
-- (called before rebase_on_ddl moves `columns_seen` on).
CREATE OR REPLACE FUNCTION coldharbor.request_rebase(p_table_id integer, p_reason text)
RETURNS void
LANGUAGE sql SET search_path = pg_catalog, pg_temp AS $$
    WITH asked AS (
        UPDATE coldharbor.tables
           SET load_state = 'pending', rebase_serial = rebase_serial + 1, rebase_reason = p_reason
         WHERE table_id = p_table_id
     RETURNING table_id, rebase_serial)
    INSERT INTO coldharbor.rebases (table_id, serial, reason, requested_at, dirty_since, renames_column)
    SELECT table_id, rebase_serial, p_reason, clock_timestamp(),
           coldharbor.oldest_dirty_change_at(table_id), coldharbor.column_renamed(table_id)
      FROM asked;
$$;

-- Requests made before this migration. Still dirty now and older than the request: dirty then.
-- Exported since: a batch of changes begun after the request holds its oldest change's
-- transaction start (`oldest_change_at`, never later than its commit). Renames: by their reason,
-- which sql/014 wrote as 'column a was renamed to b' (a column named like that text makes a
-- request look like a rename: refused more, never less).
UPDATE coldharbor.rebases r
   SET dirty_since = (SELECT min(s.at) FROM (
                        SELECT min(c.created_at) AS at FROM coldharbor.change_log c
                         WHERE c.table_id = r.table_id AND c.flushed_at IS NULL AND c.created_at < r.requested_at
                        UNION ALL
                        SELECT min(b.oldest_change_at) FROM coldharbor.export_batches b
                         WHERE b.table_id = r.table_id AND b.kind = 'changes' AND b.started_at >= r.requested_at
                           AND b.oldest_change_at < r.requested_at) s),
       renames_column = r.reason LIKE 'column % was renamed to %';

-- Rebase windows: where they start, and renames (issue 18, after an attack on sql/migrations/015's windows).
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
--    changes still dirty (track_registered_relation, sql/definitions/030_registration.sql,
--    records its dirty_since).
ALTER TABLE coldharbor.rebases
    ADD COLUMN dirty_since    timestamptz,                   -- oldest change not exported at the request
    ADD COLUMN renames_column boolean NOT NULL DEFAULT false;

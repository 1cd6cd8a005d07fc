-- Not an object: runs last whenever the definitions are applied. The capture of every registered table
-- is made again by the install_capture and grants just defined, so a change to them reaches the tables
-- registered before it (their per-table trigger functions are generated at registration). A table that
-- cannot be captured any more keeps its capture as it was, with a warning naming it.
DO $refresh$
DECLARE
    t record;
BEGIN
    FOR t IN SELECT tb.table_id, c.oid::regclass AS rel, c.relispartition
               FROM coldharbor.tables tb
               JOIN pg_class c ON c.oid = to_regclass(format('%I.%I', tb.schema_name, tb.table_name))
              WHERE tb.source_kind = 'table' AND tb.dropped_at IS NULL AND c.oid = tb.relid LOOP
        IF t.relispartition THEN
            RAISE WARNING '% is registered but is a partition of %: writes through % are not captured; '
                          'register % instead', t.rel, pg_partition_root(t.rel), pg_partition_root(t.rel),
                          pg_partition_root(t.rel);
        END IF;
        BEGIN
            PERFORM coldharbor.grant_capture_privileges(t.rel);
            PERFORM coldharbor.install_capture(t.table_id);
        EXCEPTION WHEN wrong_object_type OR insufficient_privilege OR feature_not_supported THEN
            RAISE WARNING '%: %; its capture stays as it was until that is fixed and it is registered again',
                t.rel, SQLERRM;
        END;
    END LOOP;
END
$refresh$;

SELECT coldharbor.apply_privileges();

-- Maintenance: the log of compaction/cleanup/purge runs, and hot-tier eviction.

-- One row per job run and table: what the health page shows as "last compaction/cleanup".
CREATE TABLE coldharbor.maintenance_runs (
    run_id        text        NOT NULL,
    table_id      integer     NOT NULL,
    kind          text        NOT NULL CHECK (kind IN ('compact', 'cleanup', 'purge')),
    state         text        NOT NULL DEFAULT 'running'
                              CHECK (state IN ('running', 'succeeded', 'failed', 'skipped')),
    lake_version  bigint,                      -- the Delta version the run committed, if any
    detail        jsonb,                       -- the run's figures (files, bytes, rows, markers, ...)
    error         text,
    started_at    timestamptz NOT NULL DEFAULT now(),
    finished_at   timestamptz,
    PRIMARY KEY (run_id, table_id, kind)
);
CREATE INDEX maintenance_runs_recent ON coldharbor.maintenance_runs (table_id, kind, started_at DESC);

-- Eviction is not deletion (invariant 10): the delete trigger logs nothing while the
-- transaction-local setting coldharbor.evicting is on, which only coldharbor.evict() sets.
-- install_capture keeps generating the insert/update/truncate triggers; the delete trigger
-- function is replaced by one that honours the setting.
ALTER FUNCTION coldharbor.install_capture(integer) RENAME TO install_capture_v1;

CREATE FUNCTION coldharbor.install_capture(p_table_id integer)
RETURNS void
LANGUAGE plpgsql AS $install$
DECLARE
    t       coldharbor.tables;
    v_key_o text;
BEGIN
    PERFORM coldharbor.install_capture_v1(p_table_id);
    SELECT * INTO STRICT t FROM coldharbor.tables WHERE table_id = p_table_id;
    SELECT 'jsonb_build_object(' || string_agg(format('%L, o.%I', c, c), ', ') || ')'
      INTO v_key_o FROM unnest(t.key_columns) AS c;
    EXECUTE format($f$
        CREATE OR REPLACE FUNCTION coldharbor.capture_%s_del() RETURNS trigger
        LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $b$
        BEGIN
            IF current_setting('coldharbor.evicting', true) = 'on' THEN
                RETURN NULL;
            END IF;
            INSERT INTO coldharbor.change_log (table_id, key, op)
            SELECT %s, %s, 'D' FROM old_rows o;
            RETURN NULL;
        END $b$$f$, t.table_id, t.table_id, v_key_o);
END;
$install$;

SELECT coldharbor.install_capture(table_id) FROM coldharbor.tables;

-- Evicts from the hot tier the rows of one table whose every change is flushed, and was made and
-- flushed before p_cutoff; returns how many rows went (or would go, with p_dry_run).
-- Rows with no change_log row at all (never captured, or their history pruned) are never evicted:
-- nothing proves the lake holds them.
CREATE FUNCTION coldharbor.evict(p_table_id integer, p_cutoff timestamptz, p_dry_run boolean DEFAULT false)
RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    t        coldharbor.tables;
    v_rel    text;
    v_key_t  text;
    v_ctids  tid[];
    v_count  bigint;
BEGIN
    SELECT * INTO STRICT t FROM coldharbor.tables WHERE table_id = p_table_id;
    v_rel := format('%I.%I', t.schema_name, t.table_name);
    SELECT 'jsonb_build_object(' || string_agg(format('%L, t.%I', c, c), ', ') || ')'
      INTO v_key_t FROM unnest(t.key_columns) AS c;

    -- 1. Lock the candidates. A row being written right now is skipped, not waited for.
    EXECUTE format($q$
        SELECT array_agg(ctid) FROM (
            SELECT t.ctid FROM %s t
              JOIN (SELECT key FROM coldharbor.change_log WHERE table_id = %s GROUP BY key
                    HAVING bool_and(flushed_at IS NOT NULL) AND max(flushed_at) < $1 AND max(created_at) < $1) c
                ON c.key = %s
            FOR UPDATE OF t SKIP LOCKED) locked$q$, v_rel, t.table_id, v_key_t)
      INTO v_ctids USING p_cutoff;
    IF v_ctids IS NULL THEN
        RETURN 0;
    END IF;

    -- 2. The rows are locked, so no write can reach them any more; a fresh snapshot (a new
    --    statement) sees every change that committed before the locks were taken. Re-check.
    PERFORM set_config('coldharbor.evicting', 'on', true);
    EXECUTE format($q$
        %s FROM %s t WHERE t.ctid = ANY ($1)
           AND NOT EXISTS (SELECT 1 FROM coldharbor.change_log c
                            WHERE c.table_id = %s AND c.key = %s
                              AND (c.flushed_at IS NULL OR c.flushed_at >= $2 OR c.created_at >= $2))$q$,
        CASE WHEN p_dry_run THEN 'SELECT 1' ELSE 'DELETE' END, v_rel, t.table_id, v_key_t)
      USING v_ctids, p_cutoff;
    GET DIAGNOSTICS v_count = ROW_COUNT;
    PERFORM set_config('coldharbor.evicting', 'off', true);
    RETURN v_count;
END;
$$;

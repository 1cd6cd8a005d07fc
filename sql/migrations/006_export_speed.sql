-- Cheaper capture and marking (issue: foundation, the write path's throughput).
--
-- change_log kept two B-trees that every captured row pays: the primary key on id and the partial
-- dirty index. Only the dirty index is needed on the write path: the mark finds its change ids
-- through it (they are all dirty until marked), and every other reader goes by table and dirty
-- state, key, or lake version. ids stay unique (bigserial; only the capture triggers insert).
-- Dropping the primary key saves one index insertion per captured change and per marked change.
ALTER TABLE coldharbor.change_log DROP CONSTRAINT change_log_pkey;

-- The read path finds the changes flushed by batches committed after its pinned lake version by
-- `lake_version > V`. Marked rows are appended in mark order, so a BRIN index over the lake
-- version stays small and costs the mark next to nothing.
CREATE INDEX change_log_lake_version ON coldharbor.change_log USING brin (table_id, lake_version);

-- A batch's change ids are bigints with little to compress; storing them uncompressed makes the
-- intent of a batch of a million changes a tenth of the cost.
ALTER TABLE coldharbor.export_batches ALTER COLUMN change_ids SET STORAGE EXTERNAL;

-- Issue 20, item 5: a token per export batch, recorded at intent and written into the batch's Delta
-- commit metadata. After PostgreSQL is restored to an earlier point while the lake kept later
-- commits, batch ids are reused; the commit found by (app id, batch id) then carries another token
-- and the export refuses instead of marking changes flushed that never reached the lake.
-- Batches recorded before this migration keep a NULL token (their commits carry none); the default
-- is set after the column is added so those rows are not given one.
ALTER TABLE coldharbor.export_batches ADD COLUMN commit_token uuid;

ALTER TABLE coldharbor.export_batches ALTER COLUMN commit_token SET DEFAULT gen_random_uuid();

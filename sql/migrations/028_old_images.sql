-- Old images (issue 23, part 2: incremental reports). A report refreshed incrementally applies each
-- change's own contribution: the row a change removed counts negative, the row it left positive.
-- Exact history (sql/migrations/021) logs the row after each insert and update; a table read by an
-- incremental report also logs the row *before* each update and delete (`change_log.old_image`,
-- row_to_json of the old row), so a key's contribution before a window of changes is its first
-- change's old image, and after it its last change's image, without reading the lake. The serve
-- job turns it on (coldharbor.keep_old_images) the first time it refreshes such a report; changes
-- logged before that have none, and the report is refreshed in full until its window is past them.
ALTER TABLE coldharbor.change_log ADD COLUMN old_image json;   -- the row before an update or delete

ALTER TABLE coldharbor.tables ADD COLUMN old_images boolean NOT NULL DEFAULT false;

-- Exact history (issue 26, part 1): a table registered with p_history => 'exact' keeps the row
-- image of every insert and update in its change_log row, so the export can write one lake row per
-- change (not one per key per batch) and an as-of report can be answered for any instant inside the
-- history window, however often a key changed between two exports.
--
-- The image is row_to_json(n.*) of the row as the statement's transition table holds it, kept as json (not
-- jsonb): json keeps each value's text as PostgreSQL printed it (floats with extra_float_digits = 3,
-- set on the logging functions: the writer's session may have fewer), and the export reads it back
-- through the column type's input function (`(image ->> 'c')::type`), which gives the same value
-- for every type the lake accepts (a float's -0, NaN and infinities, dates before Christ). What an
-- image cannot hold, exact history refuses at registration, naming the column: a virtual generated
-- column (a transition table holds NULL there), a json column (the spaces around its value are
-- lost), and a nullable jsonb column (SQL NULL and JSON null both print null). The export treats an
-- image as none when such a column appeared since (`image_sql._image_usable`).
--
-- 'latest' (the default, and every table registered before) logs no image, exactly as before.
-- Changing a table's history reinstalls its capture; images logged before a rebase request (DDL
-- that changed rows without writing them, a rename) are not used: they hold the old shape.
ALTER TABLE coldharbor.tables ADD COLUMN history text NOT NULL DEFAULT 'latest'
    CONSTRAINT tables_history_check CHECK (history IN ('latest', 'exact'));

ALTER TABLE coldharbor.change_log ADD COLUMN image json;

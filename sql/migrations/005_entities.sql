-- Flexible entities: records described by JSON Schema documents, stored as
--   coldharbor.entity_main  one row per record: identity, schema version, typed "hot" slot columns
--   coldharbor.eav_data     one row per other attribute: entity-attribute-value, typed value columns
-- and exported like a registered table through a generated view, entities.<schema name>, that
-- flattens each record into one typed wide row. Writes go through coldharbor.put_entity() and
-- coldharbor.delete_entity(), which validate the document against its schema first.
CREATE SCHEMA IF NOT EXISTS entities;

-- 'table': a registered PostgreSQL table; 'entity': an entity schema exported through its view.
ALTER TABLE coldharbor.tables
    ADD COLUMN source_kind text NOT NULL DEFAULT 'table' CHECK (source_kind IN ('table', 'entity'));

-- A record written in both tables, or several times, in one transaction logs one change:
-- entity capture records its transaction and skips a key already logged by that transaction.
ALTER TABLE coldharbor.change_log ADD COLUMN xact xid8;

CREATE UNIQUE INDEX change_log_entity_xact ON coldharbor.change_log (table_id, key, xact) WHERE xact IS NOT NULL;

-- One row per version of a schema. `attributes` is the document compiled once at definition:
-- attribute -> {kind, type, nullable, enum, slot}. `hot_slots` maps hot attributes to slot columns.
CREATE TABLE coldharbor.entity_schemas (
    schema_id   serial      PRIMARY KEY,
    name        text        NOT NULL,
    version     integer     NOT NULL,
    document    jsonb       NOT NULL,
    attributes  jsonb       NOT NULL,
    hot_slots   jsonb       NOT NULL DEFAULT '{}',
    required    text[]      NOT NULL DEFAULT '{}',
    table_id    integer,                -- the pipeline source of this schema name, once registered
    created_at  timestamptz NOT NULL DEFAULT now(),
    UNIQUE (name, version)
);

CREATE TABLE coldharbor.entity_main (
    row_id        uuid        PRIMARY KEY DEFAULT gen_random_uuid(),
    schema_id     integer     NOT NULL REFERENCES coldharbor.entity_schemas,
    created_at    timestamptz NOT NULL DEFAULT now(),
    updated_at    timestamptz NOT NULL DEFAULT now(),
    text_01 text, text_02 text, text_03 text, text_04 text, text_05 text,
    integer_01 bigint, integer_02 bigint, integer_03 bigint, integer_04 bigint, integer_05 bigint,
    number_01 double precision, number_02 double precision, number_03 double precision,
    number_04 double precision, number_05 double precision,
    boolean_01 boolean, boolean_02 boolean, boolean_03 boolean,
    date_01 date, date_02 date, date_03 date,
    timestamp_01 timestamptz, timestamp_02 timestamptz, timestamp_03 timestamptz
);

CREATE INDEX entity_main_schema ON coldharbor.entity_main (schema_id);

-- Slot indexes, (schema_id, slot), are created when a schema version first uses the slot.
CREATE TABLE coldharbor.eav_data (
    row_id          uuid   NOT NULL,
    attribute       text   NOT NULL,
    value_text      text,
    value_integer   bigint,
    value_number    double precision,
    value_boolean   boolean,
    value_date      date,
    value_timestamp timestamptz,
    value_json      jsonb,
    PRIMARY KEY (row_id, attribute)
);

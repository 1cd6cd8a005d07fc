-- Freshness promises (issue 25, part 3): each registered table promises how far behind PostgreSQL
-- its lake may fall (`register_table(..., p_freshness => '5 minutes')`; 5 minutes unless asked).
-- When its oldest dirty change is older than that, the coldharbor_cdc DAG's check_freshness task
-- fails naming the table and its lag (the alert: Airflow's failure callbacks and notifiers), and
-- the health page shows the table red, with the rule.
ALTER TABLE coldharbor.tables ADD COLUMN freshness interval NOT NULL DEFAULT '5 minutes'
    CONSTRAINT tables_freshness_check CHECK (freshness > '0'::interval AND freshness <= '30 days'::interval
                                             AND extract(month FROM freshness) = 0 AND extract(year FROM freshness) = 0);

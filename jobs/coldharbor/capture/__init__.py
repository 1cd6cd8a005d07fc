"""The PostgreSQL side of capture as the jobs see it: the registry of captured tables, their columns
and key, and the privileges a job checks before it works (`registry`, invariant 14), a table's names
as the jobs take and print them and the lake folder a name may be (`table_names`), the runner of
sql/migrations and sql/definitions (`migrate`, which recognises a database migrated before that
split by the checksums in `legacy_layout`), the roles' logins (`roles`) and the connections of a job
over one table (`table_job`, which looks the table up before Spark starts). The triggers that log
every change in its transaction, the canonical key (invariant 15) and the roles' grants live in
sql/definitions."""

"""The PostgreSQL side of capture as the jobs see it: the registry of captured tables, their columns
and key (`registry`; key identity, invariant 15), the sql/ migrations runner (`migrate`), the roles
(`roles`, invariant 14) and the connections of a job over one table (`table_job`). The triggers that
log every change in its transaction live in sql/, not here."""

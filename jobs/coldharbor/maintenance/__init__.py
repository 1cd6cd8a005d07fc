"""Keeping the lake small and true: compaction with last-write-wins (`compaction`; what each
partition gets, `compaction_plan`; one partition's rewrite or merge, `compaction_rewrite`; the
guards of its commits, `compaction_commits`; invariants 5 and 7), cleanup of markers, files and
pruned change log, and eviction from the hot tier (`cleanup`; what it removes from PostgreSQL,
`pruning`; invariants 8 and 10), purge (`purge`; its steps on keys and the lake and its final
check, `purge_steps`; `purge_predicate`), `resync`, and verify's proof that the unified view
equals PostgreSQL (`verify`, `verify_digests`, `row_digest`; where the sides differ,
`verify_samples`). Each run is logged (`maintenance_runs`)."""

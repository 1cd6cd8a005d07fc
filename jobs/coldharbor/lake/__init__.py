"""The cold tier: reading a Delta table (`delta`: versions, history, snapshots, conflicts), writing
one (`writes`: the writability probe, the idempotent append with txnAppId, invariant 4, statistics,
schema changes), a table's export batches in it (`commits`: commit lookup for the publish order,
invariant 3, the fence of a dead export's batch), the lake's row layout and last-write-wins by
change sequence (`lake_rows`, invariant 5), the values it holds exactly (`lake_values`), its files
read without a JVM (`lake_store`), its copy of the registry (`registry_cache`) and the dirty-set
anti-join (`unified`, invariant 6)."""

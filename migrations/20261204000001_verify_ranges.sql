-- A full reconciliation's `verify` partitions are `_id` ranges read at every location at once
-- (each location once per range, however many source locations share a target), not copies
-- of the backfill's per-location partitions: they name no location ('*'). Partitions of the
-- other tasks always name theirs.
ALTER TABLE partitions ADD CONSTRAINT partitions_location_named
    CHECK (task = 'verify' OR (source_shard <> '*' AND source_collection <> '*'));

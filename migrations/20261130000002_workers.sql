-- Workers: processes that run backfill (later verification, cleanup, revert) partitions.
-- Each registers per migration it serves, heartbeats a lease, and reports what its throttle
-- applies, so the configured rate can be shared among the live workers and `status` can show
-- applied against configured rates, overloads and retries.
CREATE TABLE workers (
    id                    uuid NOT NULL,
    migration_id          bigint NOT NULL REFERENCES migrations (id),
    name                  text NOT NULL,
    host                  text NOT NULL,
    pid                   integer NOT NULL,
    started_at            timestamptz NOT NULL DEFAULT now(),
    heartbeat_at          timestamptz NOT NULL DEFAULT now(),
    lease_expires_at      timestamptz NOT NULL,
    stopped_at            timestamptz,
    applied_docs_per_sec  double precision NOT NULL DEFAULT 0,
    docs_per_sec          double precision NOT NULL DEFAULT 0,
    documents             bigint NOT NULL DEFAULT 0,
    batches               bigint NOT NULL DEFAULT 0,
    overloads             bigint NOT NULL DEFAULT 0,
    retries               bigint NOT NULL DEFAULT 0,
    rate_cuts             bigint NOT NULL DEFAULT 0,
    PRIMARY KEY (id, migration_id)
);
CREATE INDEX workers_by_migration ON workers (migration_id, lease_expires_at);

-- Documents a scan met that are not source documents: tombstones, and documents of the
-- target layout in a collection both layouts share. Shown to the operator; not in the ledger.
ALTER TABLE partitions ADD COLUMN skipped_foreign bigint NOT NULL DEFAULT 0;
-- The source location a dead letter was read from, so `deadletter retry` can read it again.
ALTER TABLE dead_letters ADD COLUMN source_shard text, ADD COLUMN source_collection text;

-- Cleanup partitions count what they deleted and what they kept (documents that never moved),
-- and the ledger balances over those too.
ALTER TABLE partitions ADD COLUMN deleted bigint NOT NULL DEFAULT 0,
                       ADD COLUMN kept bigint NOT NULL DEFAULT 0;
ALTER TABLE partitions DROP CONSTRAINT partitions_check;
ALTER TABLE partitions ADD CONSTRAINT partitions_ledger
    CHECK (scanned = inserted + already_present + stamped + dead_lettered + deleted + kept);

-- Reconciliation findings: the stratum they were sampled in, and what repair did.
ALTER TABLE reconciliation_findings ADD COLUMN stratum text,
                                    ADD COLUMN resolution text;

-- When the target's tombstones were purged (after every router acknowledged `completed`).
ALTER TABLE migrations ADD COLUMN tombstones_purged_at timestamptz;

-- A full reconciliation is partitioned and leased like backfill: its `verify` partitions copy
-- the backfill's ranges and belong to one run; `outcomes` counts what the checks found
-- (copied, superseded, deleted, stayed, ... per kind), and `scanned = kept` for them.
ALTER TABLE partitions ADD COLUMN run_id bigint REFERENCES reconciliation_runs (id),
                       ADD COLUMN outcomes jsonb NOT NULL DEFAULT '{}'::jsonb;

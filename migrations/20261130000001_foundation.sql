-- reshard's state store. Never edit this file once applied: add a new migration instead.

-- A shard is a named MongoDB location: a connection URI plus a database.
CREATE TABLE shards (
    name        text PRIMARY KEY CHECK (name ~ '^[A-Za-z0-9_.-]{1,64}$'),
    uri         text NOT NULL,
    database    text NOT NULL CHECK (database <> ''),
    created_at  timestamptz NOT NULL DEFAULT now()
);

-- Routing versions are immutable and numbered per collection from 1.
CREATE TABLE routing_versions (
    collection       text NOT NULL,
    version          integer NOT NULL CHECK (version >= 1),
    layout           text NOT NULL CHECK (layout IN ('hashed', 'fanout', 'tenant_table')),
    virtual_buckets  integer CHECK (virtual_buckets IS NULL OR virtual_buckets > 0),
    spec             jsonb NOT NULL,
    source_text      text NOT NULL,
    created_at       timestamptz NOT NULL DEFAULT now(),
    created_by       text NOT NULL,
    PRIMARY KEY (collection, version)
);

-- Which shards a version uses, so that a shard in use cannot be removed.
CREATE TABLE routing_version_shards (
    collection  text NOT NULL,
    version     integer NOT NULL,
    shard       text NOT NULL REFERENCES shards (name),
    PRIMARY KEY (collection, version, shard),
    FOREIGN KEY (collection, version) REFERENCES routing_versions (collection, version)
);

CREATE TABLE migrations (
    id              bigserial PRIMARY KEY,
    collection      text NOT NULL,
    from_version    integer NOT NULL,
    to_version      integer NOT NULL,
    phase           text NOT NULL DEFAULT 'planned' CHECK (phase IN (
                        'planned', 'dual_read', 'write_switch', 'new_writes', 'backfill',
                        'reconcile', 'new_reads', 'cleanup', 'completed',
                        'reverting', 'revert_switch', 'rolled_back')),
    epoch           bigint NOT NULL DEFAULT 1 CHECK (epoch >= 1),
    paused          boolean NOT NULL DEFAULT false,
    failure_reason  text,
    settings        jsonb NOT NULL DEFAULT '{}'::jsonb,
    -- Set by the backfill planner once every partition is stored; the backfill gate needs it,
    -- so that an unplanned backfill (zero partitions) can never count as complete.
    backfill_planned_at    timestamptz,
    backfill_completed_at  timestamptz,
    cleanup_planned_at     timestamptz,
    revert_planned_at      timestamptz,
    created_at      timestamptz NOT NULL DEFAULT now(),
    updated_at      timestamptz NOT NULL DEFAULT now(),
    finished_at     timestamptz,
    FOREIGN KEY (collection, from_version) REFERENCES routing_versions (collection, version),
    FOREIGN KEY (collection, to_version) REFERENCES routing_versions (collection, version),
    CHECK (from_version <> to_version)
);

-- One active migration per collection.
CREATE UNIQUE INDEX migrations_one_active_per_collection
    ON migrations (collection) WHERE phase NOT IN ('completed', 'rolled_back');

-- The audit log: who moved what, when, from where to where, and why. Append-only.
CREATE TABLE migration_events (
    id            bigserial PRIMARY KEY,
    migration_id  bigint NOT NULL REFERENCES migrations (id),
    at            timestamptz NOT NULL DEFAULT now(),
    actor         text NOT NULL,
    kind          text NOT NULL,
    from_phase    text,
    to_phase      text,
    epoch         bigint NOT NULL,
    reason        text,
    details       jsonb NOT NULL DEFAULT '{}'::jsonb
);
CREATE INDEX migration_events_by_migration ON migration_events (migration_id, id);

CREATE FUNCTION reshard_refuse_change() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION '% is append-only', TG_TABLE_NAME;
END $$;

CREATE TRIGGER migration_events_append_only
    BEFORE UPDATE OR DELETE ON migration_events
    FOR EACH ROW EXECUTE FUNCTION reshard_refuse_change();

-- Routers embedded in applications: registration, heartbeat lease, acknowledged epoch.
CREATE TABLE routers (
    id                uuid PRIMARY KEY,
    collection        text NOT NULL,
    name              text NOT NULL,
    host              text NOT NULL,
    pid               integer NOT NULL,
    registered_at     timestamptz NOT NULL DEFAULT now(),
    heartbeat_at      timestamptz NOT NULL DEFAULT now(),
    lease_expires_at  timestamptz NOT NULL,
    migration_id      bigint REFERENCES migrations (id),
    acked_epoch       bigint,
    stats             jsonb NOT NULL DEFAULT '{}'::jsonb
);
CREATE INDEX routers_by_collection ON routers (collection, lease_expires_at);

-- Backfill and cleanup work units: one `_id` range of one BSON type on one source location.
CREATE TABLE partitions (
    id                bigserial PRIMARY KEY,
    migration_id      bigint NOT NULL REFERENCES migrations (id),
    task              text NOT NULL DEFAULT 'backfill' CHECK (task IN ('backfill', 'verify', 'cleanup', 'revert')),
    source_shard      text NOT NULL,
    source_collection text NOT NULL,
    id_type           text NOT NULL,
    lower_bound       bytea,
    upper_bound       bytea,
    tenant_filter     jsonb,
    state             text NOT NULL DEFAULT 'pending' CHECK (state IN ('pending', 'leased', 'done')),
    lease_token       uuid,
    lease_owner       text,
    lease_expires_at  timestamptz,
    last_id           bytea,
    scanned           bigint NOT NULL DEFAULT 0,
    inserted          bigint NOT NULL DEFAULT 0,
    already_present   bigint NOT NULL DEFAULT 0,
    stamped           bigint NOT NULL DEFAULT 0,
    dead_lettered     bigint NOT NULL DEFAULT 0,
    approx_documents  bigint,
    attempts          integer NOT NULL DEFAULT 0,
    created_at        timestamptz NOT NULL DEFAULT now(),
    started_at        timestamptz,
    finished_at       timestamptz,
    CHECK (scanned = inserted + already_present + stamped + dead_lettered)
);
CREATE INDEX partitions_claimable ON partitions (migration_id, task, state, lease_expires_at);

CREATE TABLE dead_letters (
    id            bigserial PRIMARY KEY,
    migration_id  bigint NOT NULL REFERENCES migrations (id),
    partition_id  bigint REFERENCES partitions (id),
    doc_id        bytea NOT NULL,
    doc_id_text   text NOT NULL,
    target        text,
    code          integer,
    code_name     text,
    message       text NOT NULL,
    attempts      integer NOT NULL DEFAULT 1,
    status        text NOT NULL DEFAULT 'open' CHECK (status IN ('open', 'retried', 'skipped')),
    resolution    text,
    created_at    timestamptz NOT NULL DEFAULT now(),
    resolved_at   timestamptz
);
CREATE INDEX dead_letters_open ON dead_letters (migration_id) WHERE status = 'open';

CREATE TABLE reconciliation_runs (
    id            bigserial PRIMARY KEY,
    migration_id  bigint NOT NULL REFERENCES migrations (id),
    mode          text NOT NULL CHECK (mode IN ('sample', 'full')),
    settings      jsonb NOT NULL DEFAULT '{}'::jsonb,
    started_at    timestamptz NOT NULL DEFAULT now(),
    finished_at   timestamptz,
    passed        boolean,
    summary       jsonb NOT NULL DEFAULT '{}'::jsonb
);

CREATE TABLE reconciliation_findings (
    id        bigserial PRIMARY KEY,
    run_id    bigint NOT NULL REFERENCES reconciliation_runs (id),
    kind      text NOT NULL CHECK (kind IN ('missing', 'mismatched', 'misplaced', 'count')),
    doc_id    bytea,
    doc_id_text text,
    details   jsonb NOT NULL DEFAULT '{}'::jsonb,
    repaired_at timestamptz
);

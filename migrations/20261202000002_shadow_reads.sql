-- Shadow reads (issue 14): routers compare a share of their reads with the other side and
-- report here.

-- Reads compared and mismatches found, per migration and router, as each router counted them
-- since it started following the migration (written with its heartbeats; a value replaces the
-- last one, so a repeated write counts nothing twice). Not tied to `routers`: the counts stay
-- when a router deregisters.
CREATE TABLE shadow_read_counts (
    migration_id  bigint NOT NULL REFERENCES migrations (id),
    router_id     uuid NOT NULL,
    router_name   text NOT NULL,
    compared      bigint NOT NULL DEFAULT 0 CHECK (compared >= 0),
    mismatches    bigint NOT NULL DEFAULT 0 CHECK (mismatches >= 0 AND mismatches <= compared),
    updated_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (migration_id, router_id)
);

-- A pristine copy in the target that differed from its source document when a router read
-- both. One open row per document (reports counts the reads that saw it); the reconcile gate
-- stays closed while any is open, and `reshard repair` resolves them.
CREATE TABLE shadow_mismatches (
    id               bigserial PRIMARY KEY,
    migration_id     bigint NOT NULL REFERENCES migrations (id),
    doc_id           bytea NOT NULL,
    doc_id_text      text NOT NULL,
    source_location  text NOT NULL,
    target_location  text NOT NULL,
    fields           jsonb NOT NULL DEFAULT '[]'::jsonb,
    router_name      text NOT NULL,
    reports          bigint NOT NULL DEFAULT 1,
    first_seen_at    timestamptz NOT NULL DEFAULT now(),
    last_seen_at     timestamptz NOT NULL DEFAULT now(),
    resolved_at      timestamptz,
    resolution       text,
    CHECK ((resolved_at IS NULL) = (resolution IS NULL))
);
CREATE UNIQUE INDEX shadow_mismatches_open ON shadow_mismatches (migration_id, doc_id)
    WHERE resolved_at IS NULL;

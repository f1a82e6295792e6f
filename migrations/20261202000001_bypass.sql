-- Writes that bypass the router: every location a migration touches is watched with a change
-- stream from the moment the driver leaves `planned`; the resume token is kept here so that a
-- watch resumes where it stopped, whoever runs it.
CREATE TABLE bypass_watches (
    migration_id   bigint NOT NULL REFERENCES migrations (id),
    shard          text NOT NULL,
    collection     text NOT NULL,
    -- What the location is to the migration: a source, a target, or both (a shared collection).
    role           text NOT NULL CHECK (role IN ('source', 'target', 'shared')),
    -- The change stream's resume token (BSON).
    resume_token   bytea,
    -- Past the write switch for this location's source role: a plain write is a bypass.
    switched       boolean NOT NULL DEFAULT false,
    events_seen    bigint NOT NULL DEFAULT 0,
    started_at     timestamptz NOT NULL DEFAULT now(),
    -- The last time the watch read its stream to the end.
    caught_up_at   timestamptz,
    PRIMARY KEY (migration_id, shard, collection)
);

CREATE TABLE bypasses (
    id            bigserial PRIMARY KEY,
    migration_id  bigint NOT NULL REFERENCES migrations (id),
    shard         text NOT NULL,
    collection    text NOT NULL,
    -- The document's `_id`, encoded (NULL for a gap) and as text.
    doc_id        bytea,
    doc_id_text   text,
    operation     text NOT NULL CHECK (operation IN ('insert', 'update', 'replace', 'delete', 'gap')),
    phase         text NOT NULL,
    -- When the server made the write (the change event's wall time, else its cluster time).
    happened_at   timestamptz NOT NULL,
    seen_at       timestamptz NOT NULL DEFAULT now(),
    details       jsonb NOT NULL DEFAULT '{}',
    resolution    text CHECK (resolution IN ('recopy', 'ignore')),
    resolved_at   timestamptz,
    resolved_by   text,
    reason        text,
    CHECK ((resolution IS NULL) = (resolved_at IS NULL))
);
CREATE INDEX bypasses_open ON bypasses (migration_id) WHERE resolved_at IS NULL;

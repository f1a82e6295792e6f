-- Hooks (issue 15): commands a migration runs on its events, with the event as JSON on stdin.

CREATE TABLE migration_hooks (
    id                 bigserial PRIMARY KEY,
    migration_id       bigint NOT NULL REFERENCES migrations (id),
    name               text NOT NULL,
    -- Event classes (`phase_change`, `failure`, `capacity_signal`, `approval_gate`, `all`)
    -- or event kinds.
    on_events          text[] NOT NULL CHECK (cardinality(on_events) > 0),
    command            text NOT NULL CHECK (command <> ''),
    -- A blocking hook that fails pauses the migration, and its event is delivered again
    -- after the resume; any other failing hook is logged and passed.
    blocking           boolean NOT NULL DEFAULT false,
    timeout_ms         bigint NOT NULL CHECK (timeout_ms > 0),
    -- Who declared it: `cli` or `playbook` (a playbook run keeps its own hooks in step
    -- with the file, and leaves the others alone).
    origin             text NOT NULL DEFAULT 'cli' CHECK (origin IN ('cli', 'playbook')),
    -- The hook's position in the migration's event log: every event up to this id was
    -- delivered to it, or was not for it. Starts at the log's end when the hook is added.
    delivered_through  bigint NOT NULL,
    deliveries         bigint NOT NULL DEFAULT 0,
    failures           bigint NOT NULL DEFAULT 0,
    last_error         text,
    last_failed_at     timestamptz,
    -- The event a blocking hook failed on (the migration was paused for it).
    held_at_event      bigint,
    created_at         timestamptz NOT NULL DEFAULT now(),
    UNIQUE (migration_id, name)
);

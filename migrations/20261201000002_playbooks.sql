-- Playbooks (`reshard run`): the migration a playbook drives, its pinned normalized content,
-- the steps done, approvals, and who runs it now.
CREATE TABLE playbooks (
    name          text PRIMARY KEY,
    migration_id  bigint NOT NULL UNIQUE REFERENCES migrations (id),
    content       jsonb NOT NULL,
    created_at    timestamptz NOT NULL DEFAULT now(),
    updated_at    timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE playbook_steps (
    playbook     text NOT NULL REFERENCES playbooks (name),
    position     integer NOT NULL,
    name         text NOT NULL,
    started_at   timestamptz,
    finished_at  timestamptz,
    approved_by  text,
    approved_at  timestamptz,
    outcome      jsonb NOT NULL DEFAULT '{}'::jsonb,
    PRIMARY KEY (playbook, position)
);

-- Who runs a playbook now. The lock itself is a session advisory lock held by the runner's
-- connection (released when the process dies); this row only names the holder.
CREATE TABLE playbook_drivers (
    playbook    text PRIMARY KEY,
    host        text NOT NULL,
    pid         integer NOT NULL,
    started_at  timestamptz NOT NULL DEFAULT now()
);

-- The removal of the target layout after a rollback, like tombstones_purged_at after
-- `completed`: a driver killed between the last move and it finishes it on the next run.
ALTER TABLE migrations ADD COLUMN target_removed_at timestamptz;

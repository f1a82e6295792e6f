-- What a partition's holders learnt about it, kept across takeovers (issue 29):
-- * `batch_limit`: the most documents one of its batches may carry. A holder whose command ran
--   out of the time its lease left halves it, and whoever works on the partition next (the
--   same holder, or a worker that takes it over) starts from there rather than from the
--   configured batch size, which met the same deadline again.
-- * `timeouts`: how many of its commands ran out of that time.
-- * `stalls`: attempts in a row that recorded nothing (a claim or a restart adds one, a
--   checkpoint resets it): a partition lost again and again is reported, not retried in
--   silence.
-- * `last_failure`: why its last attempt ended before the partition did.
ALTER TABLE partitions
    ADD COLUMN batch_limit integer CHECK (batch_limit > 0),
    ADD COLUMN timeouts integer NOT NULL DEFAULT 0,
    ADD COLUMN stalls integer NOT NULL DEFAULT 0,
    ADD COLUMN last_failure text;

-- The deletes a cleanup holder has sent and not yet checkpointed, one row per batch, written
-- (fenced by the lease token) before the batch's delete command is sent and removed by the
-- checkpoint that records the batch. A source document is gone once deleted, so a holder that
-- takes the partition over (or the same holder starting again from its checkpoint) cannot
-- count those deletions from its own scan: it counts the ids here that the source no longer
-- holds, and the ledger stays exact.
CREATE TABLE pending_deletes (
    partition_id bigint NOT NULL REFERENCES partitions (id) ON DELETE CASCADE,
    lease_token  uuid NOT NULL,
    seq          bigint NOT NULL,
    ids          bytea[] NOT NULL,
    PRIMARY KEY (partition_id, lease_token, seq)
);

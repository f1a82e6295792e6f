-- Leases fence every step of a router's operations (ARCHITECTURE.md, "Leases fence every
-- step"): a router stops sending commands a fence margin before its lease runs out, and the
-- driver counts a silent router out only a fence margin after it ran out. The margin is the
-- router's own setting, recorded with each renewal.
ALTER TABLE routers ADD COLUMN fence_margin interval NOT NULL DEFAULT interval '1 second';

-- The same for workers: a leased partition is taken over only a fence margin after its lease
-- ran out; the margin is its holder's, recorded with the claim.
ALTER TABLE partitions ADD COLUMN fence_margin interval NOT NULL DEFAULT interval '0';

-- A source document that cannot be routed is a finding of its own (it was a `missing` one).
ALTER TABLE reconciliation_findings DROP CONSTRAINT reconciliation_findings_kind_check;
ALTER TABLE reconciliation_findings ADD CONSTRAINT reconciliation_findings_kind_check
    CHECK (kind IN ('missing', 'mismatched', 'misplaced', 'count', 'unroutable'));

-- Leases fence every step of a router's operations (ARCHITECTURE.md, "Leases fence every
-- step"): a router stops sending commands a fence margin before its lease runs out, and the
-- driver counts a silent router out only a fence margin after it ran out. The margin is the
-- router's own setting, recorded with each renewal.
ALTER TABLE routers ADD COLUMN fence_margin interval NOT NULL DEFAULT interval '1 second';

-- A rolled-back migration is sealed once every router acknowledged `rolled_back`: until then
-- deletes leave source tombstones (a router still in `revert_switch` may carry an older target
-- image back to the source); once every router acknowledged the seal they delete plainly and
-- the driver purges the source tombstones.
ALTER TABLE migrations ADD COLUMN sealed_at timestamptz;

-- Until when a step of a router whose lease lapsed may have landed (its lease's end plus its
-- fence margin), recorded by the renewal that finds the lapse. A lapse after the copy back to
-- the source began outdates that copy: the router may have written the target without
-- mirroring, behind the copier.
ALTER TABLE routers ADD COLUMN lapsed_until timestamptz;

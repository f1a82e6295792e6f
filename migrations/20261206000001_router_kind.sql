-- What a router row is (the library embedded in an application, or a `reshard front`), and
-- how often it heartbeats: a router whose heartbeat is three intervals late is silent, and the
-- driver waits for a silent router to be counted out before a write switch holds writes.
ALTER TABLE routers
    ADD COLUMN kind text NOT NULL DEFAULT 'library' CHECK (kind IN ('library', 'front')),
    ADD COLUMN heartbeat_interval interval;

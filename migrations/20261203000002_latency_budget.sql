-- The application sets the pace (issue 16): the p99 its routers reported when the backfill
-- was planned, the base of a relative latency budget (`throttle set --latency-budget 1.3x`).
ALTER TABLE migrations ADD COLUMN app_p99_baseline_ms double precision;

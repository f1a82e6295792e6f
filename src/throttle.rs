//! How fast the copy may write: the adaptive rate and its token bucket.
//!
//! This module owns the rate arithmetic of DESIGN.md's throttle, and nothing else: no clock
//! (every method takes `now`), no I/O, no settings storage. The applied rate starts at the
//! configured maximum; an overload rejection or a batch slower than the target latency halves
//! it (down to a floor); every healthy interval without either adds a step back, up to the
//! maximum. Overload that persists longer than a window is a capacity signal for the operator
//! ([`AdaptiveRate::overload_window_exceeded`]), not something to hide by retrying. Callers
//! ask [`AdaptiveRate::permit`] before sending a batch and sleep for the answer.

use std::time::{Duration, Instant};

/// Per-migration throttle settings (stored with the migration, changeable while it runs).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ThrottleSettings {
    /// Documents per second across all workers; the ceiling of the applied rate.
    pub max_docs_per_sec: f64,
    /// The applied rate never drops below this.
    pub min_docs_per_sec: f64,
    /// What each healthy interval adds back to the applied rate.
    pub step_docs_per_sec: f64,
    /// How long a stretch without overload or slow batches must last to add a step.
    pub healthy_interval: Duration,
    /// A batch slower than this halves the rate.
    pub target_batch_latency: Duration,
    /// Decreases closer together than this count as one: a batch fans out to every target
    /// shard, and its shards rejecting together is one signal, not one per shard.
    pub decrease_gap: Duration,
    /// Overload lasting longer than this is reported as a capacity signal.
    pub overload_window: Duration,
    /// How many seconds of the applied rate may be sent in a burst after a quiet period.
    pub burst: Duration,
    /// Commands in flight per target shard (used by the writer, not by the arithmetic here).
    pub max_in_flight_per_shard: usize,
    /// Documents read and written per batch (used by the copier).
    pub batch_size: usize,
}

impl Default for ThrottleSettings {
    fn default() -> Self {
        ThrottleSettings {
            max_docs_per_sec: 5_000.0,
            min_docs_per_sec: 50.0,
            step_docs_per_sec: 250.0,
            healthy_interval: Duration::from_secs(5),
            target_batch_latency: Duration::from_secs(2),
            decrease_gap: Duration::from_secs(1),
            overload_window: Duration::from_secs(300),
            burst: Duration::from_secs(1),
            max_in_flight_per_shard: 2,
            batch_size: 1_000,
        }
    }
}

/// The applied rate and the token bucket that enforces it, driven by an injected clock.
#[derive(Clone, Debug, PartialEq)]
pub struct AdaptiveRate {
    settings: ThrottleSettings,
    applied: f64,
    /// When the current healthy stretch started (the last decrease, or the last step added).
    healthy_since: Instant,
    last_decrease: Option<Instant>,
    /// The first overload of the current run of overloads, and the latest one.
    overload_since: Option<Instant>,
    last_overload: Option<Instant>,
    /// Tokens (documents) available; negative when callers have reserved ahead.
    tokens: f64,
    refilled_at: Instant,
}

impl AdaptiveRate {
    /// A rate at the configured maximum with a full bucket.
    pub fn new(settings: ThrottleSettings, now: Instant) -> Self {
        let settings = normalised(settings);
        let applied = settings.max_docs_per_sec;
        AdaptiveRate {
            settings,
            applied,
            healthy_since: now,
            last_decrease: None,
            overload_since: None,
            last_overload: None,
            tokens: applied * settings.burst.as_secs_f64(),
            refilled_at: now,
        }
    }

    /// The settings in force.
    pub fn settings(&self) -> &ThrottleSettings {
        &self.settings
    }

    /// The documents per second currently allowed.
    pub fn applied(&self) -> f64 {
        self.applied
    }

    /// A command was rejected for overload: halve the rate and note the overload.
    /// Returns whether the rate changed.
    pub fn on_overload(&mut self, now: Instant) -> bool {
        self.overload_since.get_or_insert(now);
        self.last_overload = Some(now);
        self.decrease(now)
    }

    /// A batch took `latency`: over the target halves the rate. Returns whether the rate
    /// changed.
    pub fn on_batch(&mut self, latency: Duration, now: Instant) -> bool {
        if latency > self.settings.target_batch_latency {
            self.decrease(now)
        } else {
            false
        }
    }

    /// Adds a step for every healthy interval completed since the last change, up to the
    /// maximum, and forgets an overload that has been quiet for a healthy interval. Returns
    /// the applied rate.
    pub fn tick(&mut self, now: Instant) -> f64 {
        let interval = self.settings.healthy_interval;
        if let Some(last) = self.last_overload {
            if now.saturating_duration_since(last) >= interval {
                self.overload_since = None;
                self.last_overload = None;
            }
        }
        let elapsed = now.saturating_duration_since(self.healthy_since);
        let steps = (elapsed.as_nanos() / interval.as_nanos()) as u32;
        if steps > 0 {
            self.refill(now);
            self.applied = (self.applied + f64::from(steps) * self.settings.step_docs_per_sec)
                .min(self.settings.max_docs_per_sec);
            self.healthy_since += interval * steps;
        }
        self.applied
    }

    /// Whether overload has gone on, without a healthy interval's pause, for at least
    /// `window`: the target needs more capacity (or a lower maximum), and the operator should
    /// be told.
    pub fn overload_window_exceeded(&self, now: Instant, window: Duration) -> bool {
        match (self.overload_since, self.last_overload) {
            (Some(since), Some(last)) => {
                now.saturating_duration_since(last) < self.settings.healthy_interval
                    && now.saturating_duration_since(since) >= window
            }
            _ => false,
        }
    }

    /// The operator changed the maximum: the applied rate never exceeds it from now on; a
    /// higher maximum is reached step by step.
    pub fn set_max(&mut self, max_docs_per_sec: f64, now: Instant) {
        self.refill(now);
        self.settings.max_docs_per_sec = max_docs_per_sec;
        self.settings = normalised(self.settings);
        self.applied = self.applied.min(self.settings.max_docs_per_sec);
    }

    /// Reserves `docs` documents and returns how long to wait before sending them (zero when
    /// the bucket holds enough). Reservations queue up: a caller that reserves after another
    /// waits behind it.
    pub fn permit(&mut self, docs: u64, now: Instant) -> Duration {
        self.refill(now);
        self.tokens -= docs as f64;
        if self.tokens >= 0.0 {
            Duration::ZERO
        } else {
            Duration::from_secs_f64(-self.tokens / self.applied)
        }
    }

    /// The application's routers report latency over its budget (or errors): halve the rate,
    /// like an overload, but without counting towards a capacity signal. Returns whether the
    /// rate changed.
    pub fn on_app_over_budget(&mut self, now: Instant) -> bool {
        self.decrease(now)
    }

    fn refill(&mut self, now: Instant) {
        let elapsed = now
            .saturating_duration_since(self.refilled_at)
            .as_secs_f64();
        let capacity = self.applied * self.settings.burst.as_secs_f64();
        self.tokens = (self.tokens + elapsed * self.applied).min(capacity);
        self.refilled_at = self.refilled_at.max(now);
    }

    fn decrease(&mut self, now: Instant) -> bool {
        // A decrease restarts the healthy stretch even when it is merged with the previous one.
        self.healthy_since = now;
        if let Some(last) = self.last_decrease {
            if now.saturating_duration_since(last) < self.settings.decrease_gap {
                return false;
            }
        }
        self.refill(now);
        self.last_decrease = Some(now);
        let halved = (self.applied / 2.0).max(self.settings.min_docs_per_sec);
        let changed = halved != self.applied;
        self.applied = halved;
        changed
    }
}

/// The batch size the application's latency allows. A batch holds a server for as long as it
/// takes to write, and a read that arrives meanwhile waits for it: the rate decides how often
/// that happens, the batch size how long each wait is. So while routers report the
/// application over its latency budget the batch is halved (down to [`AdaptiveBatch::FLOOR`])
/// along with the rate, and each healthy interval doubles it back, up to the configured size.
/// With a budget the backfill starts at the floor and grows (a slow start), so its first
/// batches do not hit the application before a router could report.
#[derive(Clone, Debug, PartialEq)]
pub struct AdaptiveBatch {
    configured: usize,
    applied: usize,
    /// The last change (or the start), from which a healthy interval counts.
    since: Instant,
    interval: Duration,
}

impl AdaptiveBatch {
    /// The smallest batch the application's latency cuts to.
    pub const FLOOR: usize = 16;

    /// At the configured size, or (`slow_start`) at the floor.
    pub fn new(configured: usize, slow_start: bool, interval: Duration, now: Instant) -> Self {
        let configured = configured.max(1);
        AdaptiveBatch {
            configured,
            applied: if slow_start {
                Self::FLOOR.min(configured)
            } else {
                configured
            },
            since: now,
            interval,
        }
    }

    /// The batch size to read now.
    pub fn applied(&self) -> usize {
        self.applied
    }

    /// The application is over its budget: halve. Returns whether the size changed.
    pub fn on_app_over_budget(&mut self, now: Instant) -> bool {
        self.since = now;
        let halved = (self.applied / 2).max(Self::FLOOR.min(self.configured));
        let changed = halved != self.applied;
        self.applied = halved;
        changed
    }

    /// Doubles the size once per healthy interval since the last change, up to the
    /// configured size. Returns the size.
    pub fn tick(&mut self, now: Instant) -> usize {
        while self.applied < self.configured
            && now.saturating_duration_since(self.since) >= self.interval
        {
            self.applied = (self.applied * 2).min(self.configured);
            self.since += self.interval;
        }
        if self.applied >= self.configured {
            self.since = now;
        }
        self.applied
    }

    /// The configured size changed (`throttle set --batch-size`).
    pub fn set_configured(&mut self, configured: usize) {
        self.configured = configured.max(1);
        self.applied = self.applied.min(self.configured);
    }
}

/// What one router reported for its last heartbeat interval (all operations together).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RouterReport {
    pub p99_ms: Option<f64>,
    pub count: u64,
    pub errors: u64,
}

/// The application's health against its latency budget, as its routers report it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum AppHealth {
    /// No budget, or no router reported enough operations to judge.
    Unknown,
    /// Every router that reported enough operations is within the budget.
    Within { p99_ms: f64, budget_ms: f64 },
    /// A router's p99 is over the budget, or its error rate over [`MAX_APP_ERROR_RATE`].
    Over {
        p99_ms: f64,
        budget_ms: f64,
        error_rate: f64,
    },
}

/// A router whose operations fail more often than this in an interval counts as over budget.
pub const MAX_APP_ERROR_RATE: f64 = 0.01;

/// A router's interval counts only with at least this many operations (a p99 of a handful is
/// noise).
pub const MIN_APP_SAMPLES: u64 = 20;

/// The p99 budget in milliseconds: the absolute one when set (> 0), else `factor` times the
/// p99 routers reported before the backfill started (when both are known); `None`: no budget.
pub fn latency_budget_ms(absolute_ms: f64, factor: f64, baseline_ms: Option<f64>) -> Option<f64> {
    if absolute_ms > 0.0 {
        return Some(absolute_ms);
    }
    match baseline_ms {
        Some(b) if factor > 0.0 && b > 0.0 => Some(factor * b),
        _ => None,
    }
}

/// Judges the routers' last reports against `budget_ms`: the worst router decides (the
/// application is as slow as its slowest instance).
pub fn judge_app(reports: &[RouterReport], budget_ms: Option<f64>) -> AppHealth {
    let Some(budget_ms) = budget_ms else {
        return AppHealth::Unknown;
    };
    let mut worst_p99: Option<f64> = None;
    let mut worst_errors = 0.0_f64;
    for r in reports.iter().filter(|r| r.count >= MIN_APP_SAMPLES) {
        if let Some(p) = r.p99_ms {
            worst_p99 = Some(worst_p99.map_or(p, |w| w.max(p)));
        }
        worst_errors = worst_errors.max(r.errors as f64 / r.count as f64);
    }
    let Some(p99_ms) = worst_p99 else {
        return AppHealth::Unknown;
    };
    if p99_ms > budget_ms || worst_errors > MAX_APP_ERROR_RATE {
        AppHealth::Over {
            p99_ms,
            budget_ms,
            error_rate: worst_errors,
        }
    } else {
        AppHealth::Within { p99_ms, budget_ms }
    }
}

/// The p99 to remember as the application's "before": the worst router's, over the routers
/// that reported enough operations.
pub fn app_baseline_ms(reports: &[RouterReport]) -> Option<f64> {
    reports
        .iter()
        .filter(|r| r.count >= MIN_APP_SAMPLES)
        .filter_map(|r| r.p99_ms)
        .reduce(f64::max)
}

/// Settings the arithmetic can work with: a positive maximum, a floor not above it, a
/// non-zero healthy interval.
fn normalised(mut settings: ThrottleSettings) -> ThrottleSettings {
    settings.max_docs_per_sec = settings.max_docs_per_sec.max(1.0);
    settings.min_docs_per_sec = settings
        .min_docs_per_sec
        .clamp(1.0, settings.max_docs_per_sec);
    settings.step_docs_per_sec = settings.step_docs_per_sec.max(0.0);
    settings.healthy_interval = settings.healthy_interval.max(Duration::from_millis(1));
    settings
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_batch_halves_while_the_application_is_over_budget_and_doubles_back_when_healthy() {
        let t0 = Instant::now();
        let s = Duration::from_secs(1);
        let mut b = AdaptiveBatch::new(1_000, true, 2 * s, t0);
        assert_eq!(b.applied(), AdaptiveBatch::FLOOR);
        // Slow start: doubles every healthy interval up to the configured size.
        assert_eq!(b.tick(t0 + s), 16);
        assert_eq!(b.tick(t0 + 2 * s), 32);
        assert_eq!(b.tick(t0 + 7 * s), 128);
        assert_eq!(b.tick(t0 + 20 * s), 1_000);
        // Over budget: halved each time, not below the floor.
        assert!(b.on_app_over_budget(t0 + 21 * s));
        assert_eq!(b.applied(), 500);
        for k in 0..10 {
            b.on_app_over_budget(t0 + (22 + k) * s);
        }
        assert_eq!(b.applied(), AdaptiveBatch::FLOOR);
        assert!(!b.on_app_over_budget(t0 + 33 * s));
        // A healthy interval after the last cut doubles it again.
        assert_eq!(b.tick(t0 + 34 * s), 16);
        assert_eq!(b.tick(t0 + 35 * s), 32);
        // The operator lowers the size: applied follows at once.
        b.set_configured(20);
        assert_eq!(b.applied(), 20);
        // Without a budget it starts at the configured size; a tiny configured size is its
        // own floor.
        assert_eq!(AdaptiveBatch::new(1_000, false, 2 * s, t0).applied(), 1_000);
        let mut tiny = AdaptiveBatch::new(5, true, 2 * s, t0);
        assert_eq!(tiny.applied(), 5);
        assert!(!tiny.on_app_over_budget(t0));
    }

    fn report(p99_ms: f64, count: u64, errors: u64) -> RouterReport {
        RouterReport {
            p99_ms: Some(p99_ms),
            count,
            errors,
        }
    }

    #[test]
    fn the_budget_is_absolute_or_relative_to_the_baseline() {
        assert_eq!(latency_budget_ms(25.0, 1.3, Some(10.0)), Some(25.0));
        assert_eq!(latency_budget_ms(0.0, 1.3, Some(10.0)), Some(13.0));
        assert_eq!(latency_budget_ms(0.0, 1.3, None), None);
        assert_eq!(latency_budget_ms(0.0, 0.0, Some(10.0)), None);
    }

    #[test]
    fn the_worst_router_with_enough_samples_decides() {
        let within = [report(9.0, 100, 0), report(12.0, 50, 0)];
        assert_eq!(
            judge_app(&within, Some(13.0)),
            AppHealth::Within {
                p99_ms: 12.0,
                budget_ms: 13.0
            }
        );
        let over = [report(9.0, 100, 0), report(14.0, 50, 0)];
        assert!(matches!(
            judge_app(&over, Some(13.0)),
            AppHealth::Over { p99_ms, .. } if p99_ms == 14.0
        ));
        // Too few operations to judge: a p99 of three samples is noise.
        let few = [report(9.0, 100, 0), report(500.0, 3, 0)];
        assert!(matches!(
            judge_app(&few, Some(13.0)),
            AppHealth::Within { .. }
        ));
        assert_eq!(
            judge_app(&[report(500.0, 3, 0)], Some(13.0)),
            AppHealth::Unknown
        );
        assert_eq!(judge_app(&over, None), AppHealth::Unknown);
        // Errors count too: 2 of 100 is over 1 %.
        assert!(matches!(
            judge_app(&[report(1.0, 100, 2)], Some(13.0)),
            AppHealth::Over { error_rate, .. } if error_rate == 0.02
        ));
        assert_eq!(app_baseline_ms(&over), Some(14.0));
        assert_eq!(app_baseline_ms(&[report(500.0, 3, 0)]), None);
    }

    #[test]
    fn an_app_over_budget_halves_the_rate_and_recovery_steps_it_back() {
        let t0 = Instant::now();
        let settings = ThrottleSettings {
            max_docs_per_sec: 400.0,
            step_docs_per_sec: 250.0,
            ..ThrottleSettings::default()
        };
        let mut rate = AdaptiveRate::new(settings, t0);
        assert!(rate.on_app_over_budget(t0));
        assert_eq!(rate.applied(), 200.0);
        // Reports within the decrease gap are one signal.
        assert!(!rate.on_app_over_budget(t0 + Duration::from_millis(500)));
        assert!(rate.on_app_over_budget(t0 + Duration::from_secs(2)));
        assert_eq!(rate.applied(), 100.0);
        // Not a capacity signal: the targets did not refuse anything.
        assert!(!rate.overload_window_exceeded(t0 + Duration::from_secs(2), Duration::ZERO));
        // Healthy again: a step per healthy interval, up to the maximum.
        assert_eq!(rate.tick(t0 + Duration::from_secs(7)), 350.0);
        assert_eq!(rate.tick(t0 + Duration::from_secs(12)), 400.0);
    }

    /// A fake clock: instants are offsets from a fixed origin.
    struct Clock(Instant);

    impl Clock {
        fn new() -> Self {
            Clock(Instant::now())
        }
        fn at(&self, millis: u64) -> Instant {
            self.0 + Duration::from_millis(millis)
        }
    }

    fn settings() -> ThrottleSettings {
        ThrottleSettings {
            max_docs_per_sec: 1_000.0,
            min_docs_per_sec: 100.0,
            step_docs_per_sec: 100.0,
            healthy_interval: Duration::from_secs(10),
            target_batch_latency: Duration::from_millis(500),
            decrease_gap: Duration::from_secs(1),
            overload_window: Duration::from_secs(60),
            burst: Duration::from_secs(1),
            ..ThrottleSettings::default()
        }
    }

    #[test]
    fn overload_halves_down_to_the_floor() {
        let clock = Clock::new();
        let mut rate = AdaptiveRate::new(settings(), clock.at(0));
        let mut got = Vec::new();
        for second in 1..=5 {
            rate.on_overload(clock.at(second * 1_000));
            got.push(rate.applied());
        }
        assert_eq!(got, vec![500.0, 250.0, 125.0, 100.0, 100.0]);
    }

    #[test]
    fn overloads_within_the_gap_count_once() {
        let clock = Clock::new();
        let mut rate = AdaptiveRate::new(settings(), clock.at(0));
        assert!(rate.on_overload(clock.at(100)));
        assert!(!rate.on_overload(clock.at(150)));
        assert!(!rate.on_overload(clock.at(900)));
        assert_eq!(rate.applied(), 500.0);
        assert!(rate.on_overload(clock.at(1_100)));
        assert_eq!(rate.applied(), 250.0);
    }

    #[test]
    fn slow_batches_halve_and_fast_ones_do_not() {
        let clock = Clock::new();
        let mut rate = AdaptiveRate::new(settings(), clock.at(0));
        assert!(!rate.on_batch(Duration::from_millis(500), clock.at(1_000)));
        assert_eq!(rate.applied(), 1_000.0);
        assert!(rate.on_batch(Duration::from_millis(501), clock.at(2_000)));
        assert_eq!(rate.applied(), 500.0);
    }

    #[test]
    fn each_healthy_interval_adds_a_step_up_to_the_maximum() {
        let clock = Clock::new();
        let mut rate = AdaptiveRate::new(settings(), clock.at(0));
        rate.on_overload(clock.at(0));
        rate.on_overload(clock.at(1_000));
        assert_eq!(rate.applied(), 250.0);
        // Not a whole interval since the last decrease yet.
        assert_eq!(rate.tick(clock.at(10_999)), 250.0);
        assert_eq!(rate.tick(clock.at(11_000)), 350.0);
        assert_eq!(rate.tick(clock.at(20_999)), 350.0);
        // Three intervals at once add three steps.
        assert_eq!(rate.tick(clock.at(41_000)), 650.0);
        assert_eq!(rate.tick(clock.at(200_000)), 1_000.0);
    }

    #[test]
    fn a_slow_batch_restarts_the_healthy_interval() {
        let clock = Clock::new();
        let mut rate = AdaptiveRate::new(settings(), clock.at(0));
        rate.on_overload(clock.at(0));
        rate.on_batch(Duration::from_secs(1), clock.at(5_000));
        assert_eq!(rate.applied(), 250.0);
        assert_eq!(rate.tick(clock.at(10_000)), 250.0);
        assert_eq!(rate.tick(clock.at(15_000)), 350.0);
    }

    #[test]
    fn sustained_overload_is_a_capacity_signal() {
        let clock = Clock::new();
        let mut rate = AdaptiveRate::new(settings(), clock.at(0));
        let window = Duration::from_secs(60);
        assert!(!rate.overload_window_exceeded(clock.at(0), window));
        // Rejections every 5 s for 70 s.
        for second in (0..=70).step_by(5) {
            rate.on_overload(clock.at(second * 1_000));
            rate.tick(clock.at(second * 1_000));
        }
        assert!(!rate.overload_window_exceeded(clock.at(59_000), window));
        assert!(rate.overload_window_exceeded(clock.at(70_000), window));
        // A healthy interval without rejections ends the run.
        rate.tick(clock.at(80_000));
        assert!(!rate.overload_window_exceeded(clock.at(80_000), window));
        rate.on_overload(clock.at(81_000));
        assert!(!rate.overload_window_exceeded(clock.at(81_000), window));
    }

    #[test]
    fn overload_stops_counting_as_ongoing_after_a_quiet_interval() {
        let clock = Clock::new();
        let mut rate = AdaptiveRate::new(settings(), clock.at(0));
        rate.on_overload(clock.at(0));
        rate.on_overload(clock.at(65_000));
        // 65 s since the first, but the run was broken by a quiet stretch only if tick saw it;
        // without a tick, the last rejection 10 s ago still ends the run.
        assert!(!rate.overload_window_exceeded(clock.at(75_000), Duration::from_secs(60)));
    }

    #[test]
    fn operator_lowers_and_raises_the_maximum() {
        let clock = Clock::new();
        let mut rate = AdaptiveRate::new(settings(), clock.at(0));
        rate.set_max(300.0, clock.at(0));
        assert_eq!(rate.applied(), 300.0);
        rate.set_max(2_000.0, clock.at(0));
        assert_eq!(rate.applied(), 300.0);
        assert_eq!(rate.tick(clock.at(10_000)), 400.0);
        // A maximum below the floor lowers the floor.
        rate.set_max(50.0, clock.at(10_000));
        rate.on_overload(clock.at(10_000));
        assert_eq!(rate.settings().min_docs_per_sec, 50.0);
        assert_eq!(rate.applied(), 50.0);
    }

    #[test]
    fn permits_queue_behind_the_bucket() {
        let clock = Clock::new();
        let mut rate = AdaptiveRate::new(settings(), clock.at(0));
        // A full bucket holds one second at 1,000 docs/s.
        assert_eq!(rate.permit(1_000, clock.at(0)), Duration::ZERO);
        assert_eq!(rate.permit(500, clock.at(0)), Duration::from_millis(500));
        // A second caller queues behind the first.
        assert_eq!(rate.permit(500, clock.at(0)), Duration::from_secs(1));
        // Two seconds later the debt is paid and nothing accumulated beyond it.
        assert_eq!(rate.permit(0, clock.at(2_000)), Duration::ZERO);
        assert_eq!(rate.permit(1_000, clock.at(3_000)), Duration::ZERO);
    }

    #[test]
    fn permits_slow_down_with_the_applied_rate() {
        let clock = Clock::new();
        let mut rate = AdaptiveRate::new(settings(), clock.at(0));
        assert_eq!(rate.permit(1_000, clock.at(0)), Duration::ZERO);
        rate.on_overload(clock.at(0));
        // 500 docs/s now: 1,000 more documents take two seconds.
        assert_eq!(rate.permit(1_000, clock.at(0)), Duration::from_secs(2));
    }

    #[test]
    fn a_quiet_bucket_holds_at_most_a_burst() {
        let clock = Clock::new();
        let mut rate = AdaptiveRate::new(settings(), clock.at(0));
        assert_eq!(rate.permit(0, clock.at(3_600_000)), Duration::ZERO);
        assert_eq!(
            rate.permit(2_000, clock.at(3_600_000)),
            Duration::from_secs(1)
        );
    }
}

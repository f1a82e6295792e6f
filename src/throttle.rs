//! How fast the copy may write: the adaptive rate and its token bucket.
//!
//! This module owns the rate arithmetic of the throttle in the project's design document, and nothing else: no clock
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
    /// Until the first decrease, the rate grows only when the application is judged within
    /// its budget, and then doubles ([`AdaptiveRate::with_slow_start`]).
    slow_start: bool,
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
            slow_start: false,
        }
    }

    /// A rate that starts at an eighth of the maximum and doubles each time the application
    /// is judged within its budget ([`AdaptiveRate::on_app_within_budget`]) until the first
    /// decrease, from when it adds steps with time like any other (TCP's slow start): a
    /// backfill held to the application's latency budget starts gently, since its first
    /// batches reach the application before any router could report them, and still finds
    /// its pace in a few windows. Time alone does not grow it: a backfill that has not
    /// written yet (a server preparing a scan's first batch) has shown nothing.
    pub fn with_slow_start(settings: ThrottleSettings, now: Instant) -> Self {
        let mut rate = AdaptiveRate::new(settings, now);
        let s = rate.settings;
        rate.applied = (s.max_docs_per_sec / SLOW_START_FRACTION)
            .max(s.min_docs_per_sec)
            .min(s.max_docs_per_sec);
        rate.tokens = rate.applied * s.burst.as_secs_f64();
        rate.slow_start = true;
        rate
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
        if steps > 0 && !self.slow_start {
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

    /// The application's routers report latency within its budget over a window of the
    /// backfill's writes: during a slow start the rate doubles (at most once per healthy
    /// interval). Returns whether the rate changed; after the slow start, time grows it
    /// ([`AdaptiveRate::tick`]).
    pub fn on_app_within_budget(&mut self, now: Instant) -> bool {
        if !self.slow_start
            || now.saturating_duration_since(self.healthy_since) < self.settings.healthy_interval
        {
            return false;
        }
        self.refill(now);
        self.healthy_since = now;
        let doubled = (self.applied * 2.0).min(self.settings.max_docs_per_sec);
        let changed = doubled != self.applied;
        self.applied = doubled;
        changed
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
        self.slow_start = false;
        let halved = (self.applied / 2.0).max(self.settings.min_docs_per_sec);
        let changed = halved != self.applied;
        self.applied = halved;
        changed
    }
}

/// A slow start begins at this fraction of the maximum ([`AdaptiveRate::with_slow_start`]).
pub const SLOW_START_FRACTION: f64 = 8.0;

/// The smallest batch a latency budget cuts a backfill's batches to.
pub const BATCH_FLOOR: usize = 16;

/// How much of the applied rate one batch carries while a latency budget is set: a tenth of a
/// second's worth, so ten batches a second whatever the rate.
pub const BATCH_PERIOD: Duration = Duration::from_millis(100);

/// The batch size while the application's latency budget holds the backfill: a batch holds a
/// server for as long as it takes to write, and a read that arrives meanwhile waits for it,
/// so the rate decides how often the application waits and the batch size how long. Under a
/// budget the same rate goes in more, smaller batches ([`BATCH_PERIOD`]'s worth, at least
/// [`BATCH_FLOOR`], at most the configured size); without one, the configured size.
pub fn batch_size(applied_docs_per_sec: f64, configured: usize, budgeted: bool) -> usize {
    let configured = configured.max(1);
    if !budgeted {
        return configured;
    }
    let per_period = (applied_docs_per_sec * BATCH_PERIOD.as_secs_f64()).floor();
    (per_period as usize).clamp(BATCH_FLOOR.min(configured), configured)
}

/// Latencies counted in log-spaced buckets, eight per doubling from 100 µs (each bucket about
/// 9 % wide), so that what several routers reported over several intervals adds up and one
/// percentile can be read over all of it. A percentile of a single one-second interval (a few
/// hundred operations) is mostly noise: its p99 is the third-slowest operation.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LatencyHistogram {
    /// Count per bucket index; only buckets that hold something.
    counts: std::collections::BTreeMap<u16, u64>,
}

impl LatencyHistogram {
    /// The smallest latency told apart, in microseconds: bucket 0 holds everything up to it.
    const FLOOR_MICROS: f64 = 100.0;
    const PER_DOUBLING: f64 = 8.0;
    /// Buckets past 100 µs × 2^25 (about 56 minutes) are the last one.
    const LAST: u16 = 200;

    fn bucket_of(micros: u64) -> u16 {
        if (micros as f64) <= Self::FLOOR_MICROS {
            return 0;
        }
        let b = ((micros as f64 / Self::FLOOR_MICROS).log2() * Self::PER_DOUBLING).ceil();
        (b as u16).clamp(1, Self::LAST)
    }

    /// The largest latency bucket `b` holds, in milliseconds.
    fn upper_ms(b: u16) -> f64 {
        Self::FLOOR_MICROS * 2f64.powf(f64::from(b) / Self::PER_DOUBLING) / 1000.0
    }

    pub fn record(&mut self, micros: u64) {
        *self.counts.entry(Self::bucket_of(micros)).or_default() += 1;
    }

    /// Adds what `other` counted.
    pub fn add(&mut self, other: &LatencyHistogram) {
        for (b, n) in &other.counts {
            *self.counts.entry(*b).or_default() += n;
        }
    }

    pub fn count(&self) -> u64 {
        self.counts.values().sum()
    }

    /// The nearest-rank percentile `p` (0 to 100), as the upper bound of the bucket that holds
    /// it (at most about 9 % above the exact value); `None` when empty.
    pub fn percentile_ms(&self, p: f64) -> Option<f64> {
        let total = self.count();
        if total == 0 {
            return None;
        }
        let rank = ((p / 100.0) * total as f64).ceil().max(1.0) as u64;
        let mut seen = 0;
        for (b, n) in &self.counts {
            seen += n;
            if seen >= rank {
                return Some(Self::upper_ms(*b));
            }
        }
        self.counts.keys().last().map(|b| Self::upper_ms(*b))
    }

    /// `[[bucket, count], ...]`, as routers report it with their heartbeat.
    pub fn to_pairs(&self) -> Vec<(u16, u64)> {
        self.counts.iter().map(|(b, n)| (*b, *n)).collect()
    }

    /// The histogram of [`LatencyHistogram::to_pairs`]; out-of-range buckets count as the last.
    pub fn from_pairs(pairs: impl IntoIterator<Item = (u16, u64)>) -> Self {
        let mut h = LatencyHistogram::default();
        for (b, n) in pairs {
            *h.counts.entry(b.min(Self::LAST)).or_default() += n;
        }
        h
    }
}

/// What one router reported with one heartbeat, over all its operations of the interval.
#[derive(Clone, Debug, PartialEq)]
pub struct RouterReport {
    /// The router, and when it reported: a report is the same report until both change.
    pub router: String,
    pub reported_at: i64,
    pub p99_ms: Option<f64>,
    pub count: u64,
    pub errors: u64,
    /// The interval's latencies (routers of older versions do not send it).
    pub histogram: Option<LatencyHistogram>,
    /// The router's p99 over its last [`RECENT`] of intervals, when it sent one.
    pub recent_p99_ms: Option<f64>,
    /// How many operations that recent p99 is over.
    pub recent_count: u64,
}

/// How far back a worker pools the routers' reports to judge the application against its
/// budget: a few heartbeat intervals (2 s by default), a few thousand operations.
pub const APP_WINDOW: Duration = Duration::from_secs(5);

/// How far back a router's "recent" p99 reaches: the baseline a relative budget starts from.
pub const RECENT: Duration = Duration::from_secs(30);

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

/// A router whose operations fail more often than this in a window counts as over budget.
pub const MAX_APP_ERROR_RATE: f64 = 0.01;

/// A router's window counts only with at least this many operations: the p99 of a hundred is
/// its second-slowest, of fewer mostly noise. An application slowed to a few dozen
/// operations a second still fills a window in a few seconds.
pub const MIN_APP_SAMPLES: u64 = 100;

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

/// The routers' reports of the last few seconds, each router's pooled, judged against the
/// budget: the application's signal over a window rather than one heartbeat interval. After
/// a cut the window starts again ([`AppWindow::restart`]): only what routers report once the
/// cut had a chance to act says whether it was enough, so one slow stretch is one cut, not one
/// per report that still covers it.
#[derive(Clone, Debug)]
pub struct AppWindow {
    span: Duration,
    /// Per router: when each report in the window was seen, and the report.
    window: std::collections::BTreeMap<String, std::collections::VecDeque<(Instant, RouterReport)>>,
    /// Each live router's last report time: a report is taken once.
    last_seen: std::collections::BTreeMap<String, i64>,
    /// Since the last restart, the routers whose first report came (and was skipped: it
    /// covers time before the restart). `None` before any restart.
    fresh: Option<std::collections::BTreeSet<String>>,
}

impl AppWindow {
    pub fn new(span: Duration) -> Self {
        AppWindow {
            span,
            window: Default::default(),
            last_seen: Default::default(),
            fresh: None,
        }
    }

    /// Takes the routers' latest reports, keeping those not seen before (a router reports
    /// once per heartbeat interval; this is asked more often), and forgets what is older than
    /// the span and routers that no longer report. Returns whether anything new came.
    pub fn observe(&mut self, latest: &[RouterReport], now: Instant) -> bool {
        let live: std::collections::BTreeSet<&str> =
            latest.iter().map(|r| r.router.as_str()).collect();
        self.last_seen.retain(|k, _| live.contains(k.as_str()));
        self.window.retain(|k, _| live.contains(k.as_str()));
        let mut new = false;
        for r in latest {
            if self.last_seen.get(&r.router) == Some(&r.reported_at) {
                continue;
            }
            self.last_seen.insert(r.router.clone(), r.reported_at);
            if let Some(fresh) = &mut self.fresh {
                if fresh.insert(r.router.clone()) {
                    continue;
                }
            }
            self.window
                .entry(r.router.clone())
                .or_default()
                .push_back((now, r.clone()));
            new = true;
        }
        for seen in self.window.values_mut() {
            while seen
                .front()
                .is_some_and(|(at, _)| now.saturating_duration_since(*at) > self.span)
            {
                seen.pop_front();
            }
        }
        self.window.retain(|_, seen| !seen.is_empty());
        new
    }

    /// Forgets every report seen so far: the window fills again from each router's second
    /// report on (its first covers time before the restart).
    pub fn restart(&mut self) {
        self.window.clear();
        self.fresh = Some(Default::default());
    }

    /// The worst router with enough operations in the window decides (the application is as
    /// slow as its slowest instance): its p99 over every operation it reported in the
    /// window, and its error rate.
    pub fn judge(&self, budget_ms: Option<f64>) -> AppHealth {
        let Some(budget_ms) = budget_ms else {
            return AppHealth::Unknown;
        };
        let mut worst_p99: Option<f64> = None;
        let mut worst_errors = 0.0_f64;
        for seen in self.window.values() {
            let (count, errors) = seen
                .iter()
                .fold((0, 0), |(c, e), (_, r)| (c + r.count, e + r.errors));
            if count < MIN_APP_SAMPLES {
                continue;
            }
            let p99 = if seen.iter().all(|(_, r)| r.histogram.is_some()) {
                let mut pooled = LatencyHistogram::default();
                for (_, r) in seen {
                    pooled.add(r.histogram.as_ref().expect("checked"));
                }
                pooled.percentile_ms(99.0)
            } else {
                // A router without histograms: the worst of its intervals' p99s.
                seen.iter().filter_map(|(_, r)| r.p99_ms).reduce(f64::max)
            };
            if let Some(p) = p99 {
                worst_p99 = Some(worst_p99.map_or(p, |w| w.max(p)));
            }
            worst_errors = worst_errors.max(errors as f64 / count as f64);
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
}

/// The p99 to remember as the application's "before": the worst router's over its recent
/// intervals ([`RECENT`]), or over its last interval for a router that sends no recent one;
/// only routers that reported enough operations count.
pub fn app_baseline_ms(reports: &[RouterReport]) -> Option<f64> {
    reports
        .iter()
        .filter_map(|r| match r.recent_p99_ms {
            Some(p) if r.recent_count >= MIN_APP_SAMPLES => Some(p),
            _ if r.count >= MIN_APP_SAMPLES => r.p99_ms,
            _ => None,
        })
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
mod tests;

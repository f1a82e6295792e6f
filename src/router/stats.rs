//! Per-operation latency and error counts over the last heartbeat interval, reported with the
//! heartbeat so the driver and the workers' throttle can watch the application's own health.
//! Beside each interval's percentiles, all operations together carry the interval's latency
//! histogram (so a worker can pool several intervals into one percentile) and the p99 over
//! the router's recent intervals ([`crate::throttle::RECENT`], the baseline of a relative
//! latency budget).

use std::collections::{BTreeMap, VecDeque};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::throttle::{LatencyHistogram, RECENT};

/// Latencies and errors of one kind of operation in one interval. Latencies are counted in
/// [`LatencyHistogram`]'s buckets: memory stays bounded under any traffic without dropping
/// samples, so the count is every operation and a percentile weighs the whole interval alike
/// (a bounded list of raw samples thinned by dropping every other one kept the interval's
/// last operations at full weight and its first at a fraction, which skewed the p99 the
/// throttle acts on toward whatever happened last).
#[derive(Default, Debug, Clone)]
struct Samples {
    latency: LatencyHistogram,
    errors: u64,
}

/// Counts since the last report; [`OperationStats::take_report`] resets them.
#[derive(Default, Debug)]
pub struct OperationStats {
    by_op: BTreeMap<&'static str, Samples>,
    /// Each recent interval's histogram of all operations, with when it was reported.
    recent: VecDeque<(Instant, LatencyHistogram)>,
}

impl OperationStats {
    pub fn record(&mut self, op: &'static str, latency: Duration, ok: bool) {
        let s = self.by_op.entry(op).or_default();
        s.latency.record(latency.as_micros() as u64);
        if !ok {
            s.errors += 1;
        }
    }

    /// `{"get": {"count": n, "errors": e, "p50_ms": x, "p99_ms": y}, ..., "all": {...}}`;
    /// `all` also has `histogram` (`[[bucket, count], ...]`), `recent_p99_ms` and
    /// `recent_count`. A percentile is the upper bound of its histogram bucket (at most about
    /// 9 % above the exact value).
    pub fn take_report(&mut self) -> Value {
        self.take_report_at(Instant::now())
    }

    /// [`OperationStats::take_report`], reported at `now`.
    pub fn take_report_at(&mut self, now: Instant) -> Value {
        let mut report = serde_json::Map::new();
        let mut all = Samples::default();
        for (op, samples) in std::mem::take(&mut self.by_op) {
            all.latency.add(&samples.latency);
            all.errors += samples.errors;
            report.insert(op.to_owned(), summary(&samples));
        }
        while self
            .recent
            .front()
            .is_some_and(|(at, _)| now.saturating_duration_since(*at) >= RECENT)
        {
            self.recent.pop_front();
        }
        self.recent.push_back((now, all.latency.clone()));
        let mut recent = LatencyHistogram::default();
        for (_, h) in &self.recent {
            recent.add(h);
        }
        let mut summary_all = summary(&all);
        summary_all["histogram"] = json!(all.latency.to_pairs());
        summary_all["recent_p99_ms"] = json!(recent.percentile_ms(99.0));
        summary_all["recent_count"] = json!(recent.count());
        report.insert("all".to_owned(), summary_all);
        Value::Object(report)
    }
}

fn summary(s: &Samples) -> Value {
    json!({
        "count": s.latency.count(),
        "errors": s.errors,
        "p50_ms": s.latency.percentile_ms(50.0),
        "p99_ms": s.latency.percentile_ms(99.0),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Within the bucket that holds the exact value: at most about 9 % above it.
    fn near(reported: &Value, exact: f64) -> bool {
        let r = reported.as_f64().unwrap();
        r >= exact && r <= exact * 1.1
    }

    #[test]
    fn percentiles_are_nearest_rank_and_reset_after_a_report() {
        let mut stats = OperationStats::default();
        for ms in 1..=100 {
            stats.record("get", Duration::from_millis(ms), ms != 7);
        }
        stats.record("insert", Duration::from_millis(500), true);
        let report = stats.take_report();
        assert_eq!(report["get"]["count"], 100);
        assert_eq!(report["get"]["errors"], 1);
        assert!(near(&report["get"]["p50_ms"], 50.0), "{report}");
        assert!(near(&report["get"]["p99_ms"], 99.0), "{report}");
        assert_eq!(report["all"]["count"], 101);
        assert!(near(&report["all"]["p99_ms"], 100.0), "{report}");
        let empty = stats.take_report();
        assert_eq!(empty["all"]["count"], 0);
        assert_eq!(empty["all"]["p50_ms"], Value::Null);
    }

    /// Regression (issue 32): past 50,000 operations in an interval, every other sample was
    /// dropped, so the count was short and the interval's last operations outweighed its first:
    /// 100,000 fast reads then 900 slow ones (under 1 %) reported a p99 of the slow ones.
    #[test]
    fn a_busy_interval_counts_every_operation_and_weighs_them_alike() {
        let mut stats = OperationStats::default();
        for _ in 0..100_000 {
            stats.record("get", Duration::from_millis(1), true);
        }
        for _ in 0..900 {
            stats.record("get", Duration::from_millis(500), true);
        }
        let report = stats.take_report();
        assert_eq!(report["get"]["count"], 100_900);
        assert!(near(&report["get"]["p99_ms"], 1.0), "{report}");
        assert!(near(&report["all"]["p99_ms"], 1.0), "{report}");
    }

    #[test]
    fn all_operations_carry_the_intervals_histogram_and_the_recent_p99() {
        let t0 = Instant::now();
        let s = Duration::from_secs(1);
        let mut stats = OperationStats::default();
        for i in 0..100 {
            let ms = if i < 5 { 800 } else { 2 };
            stats.record("get", Duration::from_millis(ms), true);
        }
        let first = stats.take_report_at(t0);
        assert!(first["all"]["recent_p99_ms"].as_f64().unwrap() >= 800.0);
        let pairs: Vec<(u16, u64)> =
            serde_json::from_value(first["all"]["histogram"].clone()).unwrap();
        assert_eq!(LatencyHistogram::from_pairs(pairs).count(), 100);
        assert_eq!(first["all"]["recent_count"], 100);
        // Quiet intervals after it: 5 slow operations of 700 are under 1 % ...
        for k in 1..=5 {
            for _ in 0..100 {
                stats.record("get", Duration::from_millis(2), true);
            }
            stats.take_report_at(t0 + k * s);
        }
        for _ in 0..100 {
            stats.record("get", Duration::from_millis(2), true);
        }
        let later = stats.take_report_at(t0 + 6 * s);
        assert_eq!(later["all"]["recent_count"], 700);
        assert!(later["all"]["recent_p99_ms"].as_f64().unwrap() < 3.0);
        // ... and once RECENT has passed, only the intervals within it count.
        let much_later = stats.take_report_at(t0 + RECENT + 6 * s);
        assert_eq!(much_later["all"]["recent_count"], 0);
        assert_eq!(much_later["all"]["recent_p99_ms"], Value::Null);
    }
}

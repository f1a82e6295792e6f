//! Per-operation latency and error counts over the last heartbeat interval, reported with the
//! heartbeat so the driver (and later the throttle) can watch the application's own health.

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::{json, Value};

/// Latencies and errors of one kind of operation in one interval.
#[derive(Default, Debug, Clone)]
struct Samples {
    micros: Vec<u64>,
    errors: u64,
}

/// Counts since the last report; [`OperationStats::take_report`] resets them.
#[derive(Default, Debug)]
pub struct OperationStats {
    by_op: BTreeMap<&'static str, Samples>,
}

/// Keeps at most this many latency samples per operation and interval; beyond it, every
/// other sample is dropped so memory stays bounded under heavy traffic.
const MAX_SAMPLES: usize = 50_000;

impl OperationStats {
    pub fn record(&mut self, op: &'static str, latency: Duration, ok: bool) {
        let s = self.by_op.entry(op).or_default();
        if s.micros.len() >= MAX_SAMPLES {
            let kept: Vec<u64> = s.micros.iter().step_by(2).copied().collect();
            s.micros = kept;
        }
        s.micros.push(latency.as_micros() as u64);
        if !ok {
            s.errors += 1;
        }
    }

    /// `{"get": {"count": n, "errors": e, "p50_ms": x, "p99_ms": y}, ..., "all": {...}}`.
    pub fn take_report(&mut self) -> Value {
        let mut report = serde_json::Map::new();
        let mut all = Samples::default();
        for (op, samples) in std::mem::take(&mut self.by_op) {
            all.micros.extend_from_slice(&samples.micros);
            all.errors += samples.errors;
            report.insert(op.to_owned(), summary(samples));
        }
        report.insert("all".to_owned(), summary(all));
        Value::Object(report)
    }
}

fn summary(mut s: Samples) -> Value {
    s.micros.sort_unstable();
    json!({
        "count": s.micros.len(),
        "errors": s.errors,
        "p50_ms": percentile(&s.micros, 50.0),
        "p99_ms": percentile(&s.micros, 99.0),
    })
}

/// Nearest-rank percentile of sorted microseconds, in milliseconds; `null` when empty.
fn percentile(sorted: &[u64], p: f64) -> Option<f64> {
    if sorted.is_empty() {
        return None;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    let index = rank.clamp(1, sorted.len()) - 1;
    Some(sorted[index] as f64 / 1000.0)
}

#[cfg(test)]
mod tests {
    use super::*;

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
        assert_eq!(report["get"]["p50_ms"], 50.0);
        assert_eq!(report["get"]["p99_ms"], 99.0);
        assert_eq!(report["all"]["count"], 101);
        assert_eq!(report["all"]["p99_ms"], 100.0);
        let empty = stats.take_report();
        assert_eq!(empty["all"]["count"], 0);
        assert_eq!(empty["all"]["p50_ms"], Value::Null);
    }
}

//! A migration's tunable settings, stored as JSON with the migration and changeable while it
//! runs (`reshard throttle set`). Workers re-read them every second.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::throttle::ThrottleSettings;

/// The throttle and planning settings of one migration. Absent fields take their defaults, so
/// rows written by older versions stay readable.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MigrationSettings {
    /// Documents per second across all workers of the migration.
    pub max_docs_per_sec: f64,
    /// Write commands in flight per target shard, per worker.
    pub max_in_flight_per_shard: usize,
    /// Documents read and written per batch.
    pub batch_size: usize,
    /// A batch slower than this halves the applied rate.
    pub target_batch_latency_ms: u64,
    /// Overload lasting this long is written to the event log as a capacity signal.
    pub capacity_signal_after_secs: u64,
    /// The most documents the planner puts in one partition. Unset (the default), the
    /// planner cuts each source location into one partition per worker registered when it
    /// plans, down to 100,000 documents each, and a location with no more than one worker
    /// to keep busy is one partition, planned without reading it
    /// (`worker::plan::partition_count`).
    pub documents_per_partition: Option<u64>,
    /// Reconciliation gate: the most missing documents a passing run may find.
    pub max_missing: u64,
    /// ... mismatched pristine copies.
    pub max_mismatched: u64,
    /// ... misplaced documents.
    pub max_misplaced: u64,
    /// Cleanup waves, as cumulative percentages of the cleanup partitions: a wave starts once
    /// the previous one is done.
    pub cleanup_waves: [f64; 3],
    /// Drop a source collection that cleanup emptied (and that no target location uses).
    pub drop_empty_source: bool,
    /// Shadow reads: the percentage (0 to 100) of reads for which routers, in `dual_read`
    /// through `reconcile`, also read the other side off the application's latency path and
    /// compare ([`crate::shadow`]). 0 (the default) turns them off.
    pub shadow_read_percent: f64,
    /// The application's latency budget: while a router reports a p99 above it (or more than
    /// 1 % errors), workers halve their rate as on an overload. An absolute p99 in
    /// milliseconds; 0 (the default) leaves it to `latency_budget_factor`.
    pub latency_budget_ms: f64,
    /// The budget as a multiple of the p99 routers reported when the backfill was planned
    /// (e.g. 1.3); 0 (the default): no relative budget.
    pub latency_budget_factor: f64,
}

impl Default for MigrationSettings {
    fn default() -> Self {
        let t = ThrottleSettings::default();
        MigrationSettings {
            max_docs_per_sec: t.max_docs_per_sec,
            max_in_flight_per_shard: t.max_in_flight_per_shard,
            batch_size: t.batch_size,
            target_batch_latency_ms: t.target_batch_latency.as_millis() as u64,
            capacity_signal_after_secs: t.overload_window.as_secs(),
            documents_per_partition: None,
            max_missing: 0,
            max_mismatched: 0,
            max_misplaced: 0,
            cleanup_waves: [1.0, 10.0, 100.0],
            drop_empty_source: false,
            shadow_read_percent: 0.0,
            latency_budget_ms: 0.0,
            latency_budget_factor: 0.0,
        }
    }
}

/// The largest batch: MongoDB accepts at most 100,000 statements per write command.
pub const MAX_BATCH_SIZE: usize = 100_000;

impl MigrationSettings {
    /// Reads the settings stored with a migration (`{}` gives the defaults).
    pub fn from_json(value: &serde_json::Value) -> Result<Self, String> {
        if value.is_null() {
            return Ok(Self::default());
        }
        serde_json::from_value(value.clone()).map_err(|e| format!("stored settings: {e}"))
    }

    pub fn to_json(&self) -> serde_json::Value {
        serde_json::to_value(self).expect("settings serialise")
    }

    /// Every problem with the values, each naming the setting and what is allowed.
    pub fn problems(&self) -> Vec<String> {
        let mut problems = Vec::new();
        if !(self.max_docs_per_sec.is_finite() && self.max_docs_per_sec >= 1.0) {
            problems.push(format!(
                "max_docs_per_sec: {} is not allowed; use a number >= 1",
                self.max_docs_per_sec
            ));
        }
        if !(1..=64).contains(&self.max_in_flight_per_shard) {
            problems.push(format!(
                "max_in_flight_per_shard: {} is not allowed; use 1 to 64",
                self.max_in_flight_per_shard
            ));
        }
        if !(1..=MAX_BATCH_SIZE).contains(&self.batch_size) {
            problems.push(format!(
                "batch_size: {} is not allowed; use 1 to {MAX_BATCH_SIZE}",
                self.batch_size
            ));
        }
        if self.target_batch_latency_ms == 0 {
            problems.push("target_batch_latency_ms: 0 is not allowed; use at least 1".into());
        }
        if self.capacity_signal_after_secs == 0 {
            problems.push("capacity_signal_after_secs: 0 is not allowed; use at least 1".into());
        }
        let waves = self.cleanup_waves;
        if !(waves.iter().all(|w| *w > 0.0 && *w <= 100.0)
            && waves.windows(2).all(|w| w[0] <= w[1])
            && waves[2] == 100.0)
        {
            problems.push(format!(
                "cleanup_waves: {waves:?} is not allowed; use three increasing percentages in \
                 (0, 100], the last one 100"
            ));
        }
        if !(self.shadow_read_percent.is_finite()
            && (0.0..=100.0).contains(&self.shadow_read_percent))
        {
            problems.push(format!(
                "shadow_read_percent: {} is not allowed; use a percentage from 0 to 100",
                self.shadow_read_percent
            ));
        }
        if !(self.latency_budget_ms.is_finite() && self.latency_budget_ms >= 0.0) {
            problems.push(format!(
                "latency_budget_ms: {} is not allowed; use a duration (0 turns it off)",
                self.latency_budget_ms
            ));
        }
        if !(self.latency_budget_factor == 0.0
            || (self.latency_budget_factor.is_finite() && self.latency_budget_factor >= 1.0))
        {
            problems.push(format!(
                "latency_budget_factor: {} is not allowed; use a factor of at least 1 (e.g. \
                 1.3), or 0 to turn it off",
                self.latency_budget_factor
            ));
        }
        if self.documents_per_partition == Some(0) {
            problems.push("documents_per_partition: 0 is not allowed; use at least 1".into());
        }
        problems
    }

    /// The throttle arithmetic's settings for one of `workers` live workers: each gets an
    /// equal share of the migration's rate.
    pub fn throttle_share(&self, workers: usize) -> ThrottleSettings {
        let workers = workers.max(1) as f64;
        let max = (self.max_docs_per_sec / workers).max(1.0);
        let defaults = ThrottleSettings::default();
        ThrottleSettings {
            max_docs_per_sec: max,
            min_docs_per_sec: defaults.min_docs_per_sec.min(max),
            step_docs_per_sec: (max / 20.0).max(1.0),
            target_batch_latency: Duration::from_millis(self.target_batch_latency_ms),
            overload_window: Duration::from_secs(self.capacity_signal_after_secs),
            max_in_flight_per_shard: self.max_in_flight_per_shard,
            batch_size: self.batch_size,
            ..defaults
        }
    }
}

/// The application's latency budget as an operator writes it: a p99 (`25ms`), a multiple of
/// the p99 before the backfill (`1.3x`), or `off`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum LatencyBudget {
    Absolute(Duration),
    Factor(f64),
    Off,
}

impl LatencyBudget {
    pub fn parse(s: &str) -> Result<LatencyBudget, String> {
        if s == "off" {
            return Ok(LatencyBudget::Off);
        }
        if let Some(factor) = s.strip_suffix('x') {
            return match factor.parse::<f64>() {
                Ok(f) if f.is_finite() && f >= 1.0 => Ok(LatencyBudget::Factor(f)),
                _ => Err(format!(
                    "{s:?}: a factor is a number of at least 1 followed by x (e.g. 1.3x)"
                )),
            };
        }
        match crate::duration::parse(s) {
            Ok(d) if !d.is_zero() => Ok(LatencyBudget::Absolute(d)),
            _ => Err(format!(
                "{s:?} is not a latency budget: write a p99 (25ms), a factor of the p99 \
                 before the backfill (1.3x), or off"
            )),
        }
    }

    /// Sets the budget in `settings` (one kind at a time: the other is turned off).
    pub fn apply(self, settings: &mut MigrationSettings) {
        let (ms, factor) = match self {
            LatencyBudget::Absolute(d) => (d.as_secs_f64() * 1000.0, 0.0),
            LatencyBudget::Factor(f) => (0.0, f),
            LatencyBudget::Off => (0.0, 0.0),
        };
        settings.latency_budget_ms = ms;
        settings.latency_budget_factor = factor;
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn latency_budgets_parse_as_a_p99_a_factor_or_off() {
        let mut s = MigrationSettings::default();
        LatencyBudget::parse("25ms").unwrap().apply(&mut s);
        assert_eq!((s.latency_budget_ms, s.latency_budget_factor), (25.0, 0.0));
        LatencyBudget::parse("1.3x").unwrap().apply(&mut s);
        assert_eq!((s.latency_budget_ms, s.latency_budget_factor), (0.0, 1.3));
        LatencyBudget::parse("off").unwrap().apply(&mut s);
        assert_eq!((s.latency_budget_ms, s.latency_budget_factor), (0.0, 0.0));
        for bad in ["0.5x", "x", "25", "0ms", "fast"] {
            assert!(LatencyBudget::parse(bad).is_err(), "{bad}");
        }
        assert!(LatencyBudget::parse("25").unwrap_err().contains("25ms"));
    }

    use super::*;

    #[test]
    fn empty_json_gives_defaults_and_round_trips() {
        let s = MigrationSettings::from_json(&serde_json::json!({})).unwrap();
        assert_eq!(s, MigrationSettings::default());
        let mut changed = s;
        changed.max_docs_per_sec = 123.0;
        let back = MigrationSettings::from_json(&changed.to_json()).unwrap();
        assert_eq!(back, changed);
    }

    #[test]
    fn unknown_fields_are_refused() {
        let e = MigrationSettings::from_json(&serde_json::json!({"max_docs": 3})).unwrap_err();
        assert!(e.contains("max_docs"), "{e}");
    }

    #[test]
    fn problems_name_the_setting_and_the_allowed_range() {
        let s = MigrationSettings {
            max_docs_per_sec: 0.0,
            batch_size: 0,
            max_in_flight_per_shard: 65,
            ..MigrationSettings::default()
        };
        let p = s.problems();
        assert_eq!(p.len(), 3, "{p:?}");
        assert!(p[0].starts_with("max_docs_per_sec: 0"), "{p:?}");
        assert!(p[1].contains("1 to 64"), "{p:?}");
        assert!(p[2].contains("1 to 100000"), "{p:?}");
        assert!(MigrationSettings::default().problems().is_empty());
    }

    #[test]
    fn shadow_reads_take_a_percentage() {
        for (percent, ok) in [
            (0.0, true),
            (0.5, true),
            (100.0, true),
            (100.5, false),
            (-1.0, false),
            (f64::NAN, false),
        ] {
            let s = MigrationSettings {
                shadow_read_percent: percent,
                ..MigrationSettings::default()
            };
            let p = s.problems();
            assert_eq!(p.is_empty(), ok, "{percent}: {p:?}");
            if !ok {
                assert!(p[0].starts_with("shadow_read_percent: "), "{p:?}");
                assert!(p[0].contains("from 0 to 100"), "{p:?}");
            }
        }
        assert_eq!(MigrationSettings::default().shadow_read_percent, 0.0);
    }

    #[test]
    fn the_rate_is_shared_among_live_workers() {
        let s = MigrationSettings {
            max_docs_per_sec: 3_000.0,
            ..MigrationSettings::default()
        };
        assert_eq!(s.throttle_share(1).max_docs_per_sec, 3_000.0);
        assert_eq!(s.throttle_share(3).max_docs_per_sec, 1_000.0);
        assert_eq!(s.throttle_share(0).max_docs_per_sec, 3_000.0);
        assert_eq!(s.throttle_share(10_000).max_docs_per_sec, 1.0);
        assert!(s.throttle_share(10_000).min_docs_per_sec <= 1.0);
    }
}

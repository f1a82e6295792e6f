//! How much of a task (a backfill, a cleanup, a revert, a full reconciliation) is done and how
//! much is left, from its partitions: what each scanned, and its size as the planner estimated
//! it (`approx_documents`), which may be missing (a revert's partitions have none; an estimate
//! may come later). What status and `reshard run` show, decided once.
//!
//! A task's total is known only when every partition still running has an estimate: a
//! partition without one could hold anything, and a total made of what was scanned so far
//! reads as "done" while the task runs.

/// What the estimate needs of one partition.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PartitionSize {
    pub done: bool,
    pub scanned: i64,
    /// The planner's estimate; `None` when it has none (yet).
    pub approx: Option<i64>,
}

/// What is known of a task's (or a location's) size.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct TaskSize {
    pub partitions: i64,
    pub done: i64,
    pub scanned: i64,
    /// The documents in all: a done partition counts what it scanned, one still running its
    /// estimate (at least what it scanned so far); `None` while a running partition has no
    /// estimate.
    pub total: Option<i64>,
}

impl TaskSize {
    pub fn of(parts: impl IntoIterator<Item = PartitionSize>) -> TaskSize {
        let mut size = TaskSize {
            total: Some(0),
            ..TaskSize::default()
        };
        for p in parts {
            size.partitions += 1;
            size.done += i64::from(p.done);
            size.scanned += p.scanned;
            let known = if p.done {
                Some(p.scanned)
            } else {
                p.approx.map(|a| a.max(p.scanned))
            };
            size.total = size.total.zip(known).map(|(t, k)| t + k);
        }
        size
    }

    /// Every partition is done (and there is at least one).
    pub fn complete(&self) -> bool {
        self.partitions > 0 && self.done == self.partitions
    }

    /// Documents left; `None` while the total is unknown.
    pub fn left(&self) -> Option<i64> {
        if self.complete() {
            return Some(0);
        }
        self.total.map(|t| (t - self.scanned).max(0))
    }

    /// Seconds to go at `rate` documents per second: 0 once every partition is done; `None`
    /// while the total is unknown, nothing moves, or nothing is planned yet.
    pub fn eta(&self, rate: f64) -> Option<f64> {
        if self.complete() {
            return Some(0.0);
        }
        if self.partitions == 0 {
            return None;
        }
        match self.left() {
            Some(left) if rate > 0.5 => Some(left as f64 / rate),
            _ => None,
        }
    }
}

/// A rate or an amount as shown: never negative, so never `-0`.
pub fn not_negative(x: f64) -> f64 {
    if x > 0.0 {
        x
    } else {
        0.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn part(done: bool, scanned: i64, approx: Option<i64>) -> PartitionSize {
        PartitionSize {
            done,
            scanned,
            approx,
        }
    }

    /// Regression (issue 15): a task whose partitions have no size (a revert's) reported its
    /// total as what it had scanned, and `eta done`, while it ran.
    #[test]
    fn a_running_partition_without_a_size_leaves_the_total_and_the_eta_unknown() {
        let size = TaskSize::of([part(true, 40, None), part(false, 25, None)]);
        assert_eq!(size.total, None);
        assert_eq!(size.left(), None);
        assert_eq!(size.eta(100.0), None);

        // Once estimated, it is known: done partitions count what they scanned.
        let size = TaskSize::of([part(true, 40, Some(60)), part(false, 25, Some(100))]);
        assert_eq!(size.total, Some(140));
        assert_eq!(size.left(), Some(75));
        assert_eq!(size.eta(25.0), Some(3.0));
        assert_eq!(size.eta(0.0), None, "nothing moves");
        // A partition beyond its estimate counts what it scanned.
        assert_eq!(TaskSize::of([part(false, 120, Some(100))]).total, Some(120));

        // Every partition done: done, sizes or not.
        let size = TaskSize::of([part(true, 40, None), part(true, 2, None)]);
        assert_eq!((size.total, size.eta(0.0)), (Some(42), Some(0.0)));
        // No partitions: nothing is done, and no ETA.
        assert_eq!(TaskSize::of([]).eta(100.0), None);
    }
}

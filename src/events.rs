//! The kinds of event a migration's log records (`store::events` appends them; `hooks` is
//! told about them).

use serde::{Deserialize, Serialize};

/// What an event records. Stored as its snake_case name.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, sqlx::Type)]
#[sqlx(type_name = "text", rename_all = "snake_case")]
#[serde(rename_all = "snake_case")]
pub enum EventKind {
    /// The migration was planned.
    Create,
    /// A phase move.
    Advance,
    Pause,
    Resume,
    /// A gate or an invariant failed; the reason is the event's.
    Fail,
    BackfillPlanned,
    CleanupPlanned,
    RevertPlanned,
    /// Throttle, thresholds or cleanup settings changed (before and after in the details).
    SettingsChanged,
    DeadletterRetried,
    DeadletterSkipped,
    /// A worker halved its rate (overload or slow batches).
    RateCut,
    /// Overload lasted: the targets need capacity or a lower rate.
    CapacitySignal,
    /// A reconciliation run finished and passed (one that did not is
    /// `reconciliation_failed`).
    Reconciled,
    /// Repair rewrote what a run found.
    Repaired,
    /// After `completed`: the target's tombstones were purged.
    TombstonesPurged,
    /// After a rollback: the target layout was removed.
    TargetRemoved,
    /// After a rollback: every router acknowledged `rolled_back`, deletes stop leaving source
    /// tombstones.
    Sealed,
    /// A playbook's step finished.
    StepDone,
    /// A playbook's later steps or settings were edited (the diff in the details).
    PlaybookChanged,
    /// An operator approved a playbook's manual gate.
    Approved,
    /// A bypass watch started (or started late, for a migration moved without the driver).
    BypassWatchStarted,
    /// Writes that bypassed the router were found (count and first ids in the details).
    BypassFound,
    /// An operator resolved a bypass (recopied or ignored it).
    BypassResolved,
    /// A playbook stopped at a manual approval (`reshard approve` lets it go on).
    ApprovalRequested,
    /// A hook's command failed or timed out (`crate::hooks`).
    HookFailed,
    /// The driver waited for routers to acknowledge an epoch, and they did (the epoch, how
    /// long, the routers it waited for and the ones counted out in the details).
    BarrierWaited,
    /// Routers did not acknowledge an epoch in time: the move's barrier, or the write switch,
    /// which then goes back (the epoch, the timeout and the routers missing in the details).
    BarrierTimedOut,
    /// A write switch could not finish for another reason than a barrier (the bypass watch
    /// could not catch up, the state store failed) and went back.
    SwitchFailed,
    /// Leaving `planned` failed: the target collections, their indexes or the bypass watch
    /// could not be made.
    PrepareFailed,
    /// A reconciliation run finished and did not pass (a run that passes is `reconciled`).
    ReconciliationFailed,
    /// A playbook's soak found what it does not allow (findings, dead letters, overload,
    /// router errors).
    SoakFailed,
    /// A playbook's step failed and the run stopped, for a reason no other failure event
    /// records (dead letters left, workers that stopped, a refused move, ...).
    StepFailed,
    /// A worker took a partition over from a holder whose lease ran out (the partition, its
    /// location and range, who held it, the checkpoint it resumes from in the details).
    PartitionTakenOver,
    /// A partition's last attempts in a row recorded nothing (taken over again and again, or
    /// its commands running out of the time its lease leaves): how many, its batch limit and
    /// the last failure in the details. Reported once it stalls, and again each time the count
    /// doubles.
    PartitionStalled,
    /// A batch's checkpoint recorded documents that could not be written (how many, the
    /// partition, the first ids and the reason in the details; `deadletter list` has all).
    DeadLettered,
}

impl EventKind {
    /// Every kind, in the order of their definition.
    pub const ALL: [EventKind; 36] = [
        EventKind::Create,
        EventKind::Advance,
        EventKind::Pause,
        EventKind::Resume,
        EventKind::Fail,
        EventKind::BackfillPlanned,
        EventKind::CleanupPlanned,
        EventKind::RevertPlanned,
        EventKind::SettingsChanged,
        EventKind::DeadletterRetried,
        EventKind::DeadletterSkipped,
        EventKind::RateCut,
        EventKind::CapacitySignal,
        EventKind::Reconciled,
        EventKind::Repaired,
        EventKind::TombstonesPurged,
        EventKind::TargetRemoved,
        EventKind::Sealed,
        EventKind::StepDone,
        EventKind::PlaybookChanged,
        EventKind::Approved,
        EventKind::BypassWatchStarted,
        EventKind::BypassFound,
        EventKind::BypassResolved,
        EventKind::ApprovalRequested,
        EventKind::HookFailed,
        EventKind::BarrierWaited,
        EventKind::BarrierTimedOut,
        EventKind::SwitchFailed,
        EventKind::PrepareFailed,
        EventKind::ReconciliationFailed,
        EventKind::SoakFailed,
        EventKind::StepFailed,
        EventKind::PartitionTakenOver,
        EventKind::PartitionStalled,
        EventKind::DeadLettered,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            EventKind::Create => "create",
            EventKind::Advance => "advance",
            EventKind::Pause => "pause",
            EventKind::Resume => "resume",
            EventKind::Fail => "fail",
            EventKind::BackfillPlanned => "backfill_planned",
            EventKind::CleanupPlanned => "cleanup_planned",
            EventKind::RevertPlanned => "revert_planned",
            EventKind::SettingsChanged => "settings_changed",
            EventKind::DeadletterRetried => "deadletter_retried",
            EventKind::DeadletterSkipped => "deadletter_skipped",
            EventKind::RateCut => "rate_cut",
            EventKind::CapacitySignal => "capacity_signal",
            EventKind::Reconciled => "reconciled",
            EventKind::Repaired => "repaired",
            EventKind::TombstonesPurged => "tombstones_purged",
            EventKind::TargetRemoved => "target_removed",
            EventKind::Sealed => "sealed",
            EventKind::StepDone => "step_done",
            EventKind::PlaybookChanged => "playbook_changed",
            EventKind::Approved => "approved",
            EventKind::BypassWatchStarted => "bypass_watch_started",
            EventKind::BypassFound => "bypass_found",
            EventKind::BypassResolved => "bypass_resolved",
            EventKind::ApprovalRequested => "approval_requested",
            EventKind::HookFailed => "hook_failed",
            EventKind::BarrierWaited => "barrier_waited",
            EventKind::BarrierTimedOut => "barrier_timed_out",
            EventKind::SwitchFailed => "switch_failed",
            EventKind::PrepareFailed => "prepare_failed",
            EventKind::ReconciliationFailed => "reconciliation_failed",
            EventKind::SoakFailed => "soak_failed",
            EventKind::StepFailed => "step_failed",
            EventKind::PartitionTakenOver => "partition_taken_over",
            EventKind::PartitionStalled => "partition_stalled",
            EventKind::DeadLettered => "dead_lettered",
        }
    }

    /// Whether the event records a failure: a way a migration, or a playbook run, stopped on
    /// something going wrong (what `--on failure` hooks are told about). A hook's own failure
    /// is not one (hooks on failures would feed on themselves), nor is a pause (an operator's
    /// or a blocking hook's: the hook's failure was the news).
    pub fn is_failure(self) -> bool {
        match self {
            EventKind::Fail
            | EventKind::BarrierTimedOut
            | EventKind::SwitchFailed
            | EventKind::PrepareFailed
            | EventKind::ReconciliationFailed
            | EventKind::SoakFailed
            | EventKind::StepFailed => true,
            EventKind::Create
            | EventKind::Advance
            | EventKind::Pause
            | EventKind::Resume
            | EventKind::BackfillPlanned
            | EventKind::CleanupPlanned
            | EventKind::RevertPlanned
            | EventKind::SettingsChanged
            | EventKind::DeadletterRetried
            | EventKind::DeadletterSkipped
            | EventKind::RateCut
            | EventKind::CapacitySignal
            | EventKind::Reconciled
            | EventKind::Repaired
            | EventKind::TombstonesPurged
            | EventKind::TargetRemoved
            | EventKind::Sealed
            | EventKind::StepDone
            | EventKind::PlaybookChanged
            | EventKind::Approved
            | EventKind::BypassWatchStarted
            | EventKind::BypassFound
            | EventKind::BypassResolved
            | EventKind::ApprovalRequested
            | EventKind::HookFailed
            | EventKind::BarrierWaited
            | EventKind::PartitionTakenOver
            | EventKind::PartitionStalled
            | EventKind::DeadLettered => false,
        }
    }
}

impl std::fmt::Display for EventKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_is_listed_once_under_its_own_name() {
        let names: std::collections::BTreeSet<&str> =
            EventKind::ALL.iter().map(|k| k.as_str()).collect();
        assert_eq!(names.len(), EventKind::ALL.len());
        for kind in EventKind::ALL {
            let json = serde_json::to_value(kind).unwrap();
            assert_eq!(json, kind.as_str(), "{kind:?}");
        }
    }

    #[test]
    fn failures_are_the_ways_a_migration_or_a_run_stops_on_something_wrong() {
        let failures: Vec<&str> = EventKind::ALL
            .iter()
            .filter(|k| k.is_failure())
            .map(|k| k.as_str())
            .collect();
        assert_eq!(
            failures,
            [
                "fail",
                "barrier_timed_out",
                "switch_failed",
                "prepare_failed",
                "reconciliation_failed",
                "soak_failed",
                "step_failed"
            ]
        );
        assert!(!EventKind::HookFailed.is_failure());
        assert!(!EventKind::Pause.is_failure());
    }
}

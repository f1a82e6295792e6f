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
    /// A reconciliation run finished.
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
}

impl EventKind {
    /// Every kind, in the order of their definition.
    pub const ALL: [EventKind; 26] = [
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
        }
    }
}

impl std::fmt::Display for EventKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

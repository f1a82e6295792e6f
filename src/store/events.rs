//! The append-only event log: one kind per thing that happens to a migration.

use serde::{Deserialize, Serialize};

use super::migrations::Migration;
use super::StoreResult;
use crate::phase::Phase;

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
}

impl EventKind {
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
        }
    }
}

impl std::fmt::Display for EventKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An event to append.
#[derive(Clone, Debug)]
pub struct NewEvent<'a> {
    pub kind: EventKind,
    /// The phases of a move.
    pub from: Option<Phase>,
    pub to: Option<Phase>,
    /// Why, in the operator's words (or the failure's).
    pub reason: Option<&'a str>,
    pub details: serde_json::Value,
}

impl<'a> NewEvent<'a> {
    pub fn new(kind: EventKind, details: serde_json::Value) -> Self {
        NewEvent {
            kind,
            from: None,
            to: None,
            reason: None,
            details,
        }
    }

    pub fn reason(mut self, reason: Option<&'a str>) -> Self {
        self.reason = reason;
        self
    }

    pub fn moved(mut self, from: Phase, to: Phase) -> Self {
        self.from = Some(from);
        self.to = Some(to);
        self
    }
}

/// Appends `event` to the migration's log, at its current epoch.
///
/// One place writes every event, so the row, the log line and the metric never disagree:
/// the row is appended here, and the same call logs it (target `reshard::event`, at info) and
/// counts it (`reshard_events_total`).
pub(super) async fn insert(
    conn: &mut sqlx::PgConnection,
    migration: &Migration,
    actor: &str,
    event: &NewEvent<'_>,
) -> StoreResult<i64> {
    let id: i64 = sqlx::query_scalar(
        "INSERT INTO migration_events
             (migration_id, actor, kind, from_phase, to_phase, epoch, reason, details)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8) RETURNING id",
    )
    .bind(migration.id)
    .bind(actor)
    .bind(event.kind)
    .bind(event.from.map(|p| p.as_str()))
    .bind(event.to.map(|p| p.as_str()))
    .bind(migration.epoch)
    .bind(event.reason)
    .bind(&event.details)
    .fetch_one(conn)
    .await?;
    tracing::info!(
        target: "reshard::event",
        migration = migration.id,
        event = id,
        kind = event.kind.as_str(),
        from = event.from.map(|p| p.as_str()),
        to = event.to.map(|p| p.as_str()),
        epoch = migration.epoch,
        actor,
        reason = event.reason,
        details = %event.details,
        "{}",
        event.kind
    );
    crate::telemetry::event(migration.id, event.kind.as_str());
    Ok(id)
}

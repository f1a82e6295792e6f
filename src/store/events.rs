//! The append-only event log: one kind per thing that happens to a migration.

use super::migrations::Migration;
use super::StoreResult;
pub use crate::events::EventKind;
use crate::phase::Phase;

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
        migration_id = migration.id,
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

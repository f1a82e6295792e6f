//! Migrations and the one function that changes them: [`Store::transition`].

use chrono::{DateTime, Utc};
use serde::Serialize;
use serde_json::json;

use super::events::{self, EventKind, NewEvent};
use super::{gates, Store, StoreError, StoreResult, CHANNEL};
use crate::phase::{self, Action, Change, MigrationState, Phase};

/// A migration row.
#[derive(Clone, Debug, Serialize, sqlx::FromRow)]
pub struct Migration {
    pub id: i64,
    pub collection: String,
    pub from_version: i32,
    pub to_version: i32,
    #[sqlx(try_from = "String")]
    pub phase: Phase,
    pub epoch: i64,
    pub paused: bool,
    pub failure_reason: Option<String>,
    pub settings: serde_json::Value,
    pub backfill_planned_at: Option<DateTime<Utc>>,
    pub backfill_completed_at: Option<DateTime<Utc>>,
    pub cleanup_planned_at: Option<DateTime<Utc>>,
    pub revert_planned_at: Option<DateTime<Utc>>,
    pub tombstones_purged_at: Option<DateTime<Utc>>,
    /// After a rollback: when the target layout was removed.
    pub target_removed_at: Option<DateTime<Utc>>,
    /// After a rollback: when the migration was sealed ([`Action::Seal`]).
    pub sealed_at: Option<DateTime<Utc>>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
    pub finished_at: Option<DateTime<Utc>>,
    /// The p99 the application's routers reported when the backfill was planned (the base of
    /// a relative latency budget); `None` when no router reported enough operations.
    pub app_p99_baseline_ms: Option<f64>,
}

/// The phases an event moved between, read from their text columns (`None` for an event that
/// did not change the phase).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(transparent)]
pub struct EventPhase(pub Option<Phase>);

impl TryFrom<Option<String>> for EventPhase {
    type Error = crate::phase::UnknownPhase;
    fn try_from(s: Option<String>) -> Result<Self, Self::Error> {
        s.map(Phase::try_from).transpose().map(EventPhase)
    }
}

impl Migration {
    pub fn phase(&self) -> Phase {
        self.phase
    }

    pub fn state(&self) -> MigrationState {
        MigrationState {
            phase: self.phase(),
            epoch: self.epoch,
            paused: self.paused,
            failure: self.failure_reason.clone(),
            sealed: self.sealed_at.is_some(),
        }
    }

    /// `backfill`, `backfill (paused)`, `cleanup (failed: ...)`.
    pub fn status_text(&self) -> String {
        match (&self.failure_reason, self.paused) {
            (Some(reason), _) => format!("{} (failed: {reason})", self.phase()),
            (None, true) => format!("{} (paused)", self.phase()),
            (None, false) => self.phase().to_string(),
        }
    }
}

/// One entry of the append-only event log.
#[derive(Clone, Debug, Serialize, sqlx::FromRow)]
pub struct Event {
    pub id: i64,
    pub migration_id: i64,
    pub at: DateTime<Utc>,
    pub actor: String,
    pub kind: EventKind,
    #[sqlx(try_from = "Option<String>")]
    pub from_phase: EventPhase,
    #[sqlx(try_from = "Option<String>")]
    pub to_phase: EventPhase,
    pub epoch: i64,
    pub reason: Option<String>,
    pub details: serde_json::Value,
}

/// What a transition did, or would do under `--dry-run`.
#[derive(Clone, Debug)]
pub struct Transition {
    pub migration: Migration,
    pub change: Change,
    /// The event written; `None` for a dry run.
    pub event_id: Option<i64>,
}

pub(super) const MIGRATION_COLUMNS: &str =
    "id, collection, from_version, to_version, phase, epoch, paused,
    failure_reason, settings, backfill_planned_at, backfill_completed_at, cleanup_planned_at,
    revert_planned_at, tombstones_purged_at, target_removed_at, sealed_at, created_at,
    updated_at, finished_at, app_p99_baseline_ms";

impl Store {
    /// Plans a migration of `collection` from version `from` to version `to`. Refused while the
    /// collection has another active migration.
    pub async fn create_migration(
        &self,
        collection: &str,
        from: i32,
        to: i32,
        actor: &str,
    ) -> StoreResult<Migration> {
        if from == to {
            return Err(StoreError::Conflict(format!(
                "the collection is already at version {to}; nothing to migrate"
            )));
        }
        self.version(collection, Some(from)).await?;
        self.version(collection, Some(to)).await?;
        let mut tx = self.pool().begin().await?;
        let migration = create_in(&mut tx, collection, from, to, actor).await?;
        self.finish(tx).await?;
        Ok(migration)
    }

    pub async fn migration(&self, id: i64) -> StoreResult<Migration> {
        sqlx::query_as(&format!(
            "SELECT {MIGRATION_COLUMNS} FROM migrations WHERE id = $1"
        ))
        .bind(id)
        .fetch_optional(self.pool())
        .await?
        .ok_or_else(|| StoreError::NotFound(format!("no migration with id {id}")))
    }

    pub async fn active_migration(&self, collection: &str) -> StoreResult<Option<Migration>> {
        Ok(sqlx::query_as(&format!(
            "SELECT {MIGRATION_COLUMNS} FROM migrations
             WHERE collection = $1 AND phase NOT IN ('completed', 'rolled_back')"
        ))
        .bind(collection)
        .fetch_optional(self.pool())
        .await?)
    }

    /// The migration a collection's routers follow: the active one, or else the one that
    /// ended last (its final epoch is what routers acknowledge after `completed` or
    /// `rolled_back`); `None` when the collection never had one.
    pub async fn followed_migration(&self, collection: &str) -> StoreResult<Option<Migration>> {
        Ok(sqlx::query_as(&format!(
            "SELECT {MIGRATION_COLUMNS} FROM migrations WHERE collection = $1
             ORDER BY (phase NOT IN ('completed', 'rolled_back')) DESC,
                      finished_at DESC NULLS LAST, id DESC
             LIMIT 1"
        ))
        .bind(collection)
        .fetch_optional(self.pool())
        .await?)
    }

    pub async fn migrations(&self, include_ended: bool) -> StoreResult<Vec<Migration>> {
        Ok(sqlx::query_as(&format!(
            "SELECT {MIGRATION_COLUMNS} FROM migrations
             WHERE $1 OR phase NOT IN ('completed', 'rolled_back')
             ORDER BY id"
        ))
        .bind(include_ended)
        .fetch_all(self.pool())
        .await?)
    }

    pub async fn events(&self, migration_id: i64) -> StoreResult<Vec<Event>> {
        self.migration(migration_id).await?;
        Ok(sqlx::query_as(
            "SELECT id, migration_id, at, actor, kind, from_phase, to_phase, epoch, reason, details
             FROM migration_events WHERE migration_id = $1 ORDER BY id",
        )
        .bind(migration_id)
        .fetch_all(self.pool())
        .await?)
    }

    /// The id of the migration's latest event (0 when it has none).
    pub async fn last_event_id(&self, migration_id: i64) -> StoreResult<i64> {
        Ok(sqlx::query_scalar(
            "SELECT coalesce(max(id), 0)::bigint FROM migration_events WHERE migration_id = $1",
        )
        .bind(migration_id)
        .fetch_one(self.pool())
        .await?)
    }

    /// Whether a failure ([`EventKind::is_failure`]) was recorded after event `after`.
    pub async fn failure_recorded_since(&self, migration_id: i64, after: i64) -> StoreResult<bool> {
        let failures: Vec<&str> = EventKind::ALL
            .iter()
            .filter(|k| k.is_failure())
            .map(|k| k.as_str())
            .collect();
        Ok(sqlx::query_scalar(
            "SELECT EXISTS (SELECT 1 FROM migration_events
                            WHERE migration_id = $1 AND id > $2 AND kind = ANY($3))",
        )
        .bind(migration_id)
        .bind(after)
        .bind(failures)
        .fetch_one(self.pool())
        .await?)
    }

    /// The one path by which a migration's phase, epoch, pause or failure changes. In one
    /// transaction it locks the row, asks the phase machine whether `action` is allowed, checks
    /// the move's gates, bumps the epoch (compare-and-set on the old one), appends the event
    /// and notifies listeners. With `dry_run` it does all the checks and rolls back.
    pub async fn transition(
        &self,
        id: i64,
        action: &Action,
        actor: &str,
        reason: Option<&str>,
        dry_run: bool,
    ) -> StoreResult<Transition> {
        let mut tx = self.pool().begin().await?;
        let migration = migration_for_update(&mut tx, id).await?;
        let change = phase::plan(&migration.state(), action)?;
        for gate in change.gates {
            gates::check(&mut tx, &migration, *gate).await?;
        }
        if dry_run {
            tx.rollback().await?;
            return Ok(Transition {
                migration,
                change,
                event_id: None,
            });
        }
        let to = &change.to;
        let updated: Option<Migration> = sqlx::query_as(&format!(
            "UPDATE migrations
             SET phase = $3, epoch = $4, paused = $5, failure_reason = $6, updated_at = now(),
                 backfill_completed_at = CASE WHEN phase = 'backfill' AND $3 = 'reconcile'
                                              THEN now() ELSE backfill_completed_at END,
                 finished_at = CASE WHEN $7 THEN coalesce(finished_at, now()) ELSE finished_at END,
                 sealed_at = CASE WHEN $8 THEN coalesce(sealed_at, now()) ELSE sealed_at END
             WHERE id = $1 AND epoch = $2
             RETURNING {MIGRATION_COLUMNS}"
        ))
        .bind(id)
        .bind(migration.epoch)
        .bind(to.phase.as_str())
        .bind(to.epoch)
        .bind(to.paused)
        .bind(&to.failure)
        .bind(to.phase.is_terminal())
        .bind(to.sealed)
        .fetch_optional(&mut *tx)
        .await?;
        let updated = updated.ok_or_else(|| {
            StoreError::Lost(format!(
                "migration {id} changed while this change was checked"
            ))
        })?;
        let details = json!({
            "gates": change.gates.iter().map(|g| g.as_str()).collect::<Vec<_>>(),
            "paused": to.paused,
            "failure_reason": to.failure,
            // The old name, beside the new one until 0.2.
            "failure": to.failure,
        });
        let reason = reason.or(match action {
            Action::Fail(why) => Some(why.as_str()),
            _ => None,
        });
        let kind = match action {
            Action::Advance(_) => EventKind::Advance,
            Action::Pause => EventKind::Pause,
            Action::Resume => EventKind::Resume,
            Action::Fail(_) => EventKind::Fail,
            Action::Seal => EventKind::Sealed,
        };
        let event = NewEvent::new(kind, details)
            .moved(change.from.phase, to.phase)
            .reason(reason);
        let event_id = events::insert(&mut tx, &updated, actor, &event).await?;
        notify(&mut tx, &updated).await?;
        tx.commit().await?;
        tracing::info!(
            migration_id = id,
            collection = %updated.collection,
            action = action.kind(),
            from = %change.from.phase,
            to = %to.phase,
            epoch = to.epoch,
            actor,
            "migration changed"
        );
        Ok(Transition {
            migration: updated,
            change,
            event_id: Some(event_id),
        })
    }
}

/// Creates a migration inside `conn`'s transaction, with its `create` event and notification.
/// Refused while the collection has another active migration.
pub(super) async fn create_in(
    conn: &mut sqlx::PgConnection,
    collection: &str,
    from: i32,
    to: i32,
    actor: &str,
) -> StoreResult<Migration> {
    let active: Option<Migration> = sqlx::query_as(&format!(
        "SELECT {MIGRATION_COLUMNS} FROM migrations
         WHERE collection = $1 AND phase NOT IN ('completed', 'rolled_back')"
    ))
    .bind(collection)
    .fetch_optional(&mut *conn)
    .await?;
    let busy = |m: Option<Migration>| {
        StoreError::Conflict(match m {
            Some(m) => format!(
                "collection {collection:?} already has an active migration: {} (v{} -> v{}, \
                 {}); finish or roll it back first",
                m.id,
                m.from_version,
                m.to_version,
                m.status_text()
            ),
            None => format!("collection {collection:?} already has an active migration"),
        })
    };
    if active.is_some() {
        return Err(busy(active));
    }
    let inserted: Result<Migration, sqlx::Error> = sqlx::query_as(&format!(
        "INSERT INTO migrations (collection, from_version, to_version)
         VALUES ($1, $2, $3) RETURNING {MIGRATION_COLUMNS}"
    ))
    .bind(collection)
    .bind(from)
    .bind(to)
    .fetch_one(&mut *conn)
    .await;
    let migration = match inserted {
        Ok(m) => m,
        Err(sqlx::Error::Database(db))
            if db.constraint() == Some("migrations_one_active_per_collection") =>
        {
            return Err(busy(None));
        }
        Err(e) => return Err(e.into()),
    };
    let mut created = NewEvent::new(
        EventKind::Create,
        json!({"from_version": from, "to_version": to}),
    );
    created.to = Some(Phase::Planned);
    events::insert(&mut *conn, &migration, actor, &created).await?;
    notify(&mut *conn, &migration).await?;
    Ok(migration)
}

/// Tells listeners (routers, workers, watchers) that a migration changed. Delivered on commit.
async fn notify(conn: &mut sqlx::PgConnection, migration: &Migration) -> StoreResult<()> {
    let payload = json!({
        "id": migration.id,
        "collection": migration.collection,
        "phase": migration.phase().as_str(),
        "epoch": migration.epoch,
    });
    sqlx::query("SELECT pg_notify($1, $2)")
        .bind(CHANNEL)
        .bind(payload.to_string())
        .execute(conn)
        .await?;
    Ok(())
}

/// A migration read and locked inside a transaction: the row lock serialises every change.
pub(super) async fn migration_for_update(
    conn: &mut sqlx::PgConnection,
    id: i64,
) -> StoreResult<Migration> {
    sqlx::query_as(&format!(
        "SELECT {MIGRATION_COLUMNS} FROM migrations WHERE id = $1 FOR UPDATE"
    ))
    .bind(id)
    .fetch_optional(conn)
    .await?
    .ok_or_else(|| StoreError::NotFound(format!("no migration with id {id}")))
}

/// A migration read inside a transaction.
pub(super) async fn migration_in(conn: &mut sqlx::PgConnection, id: i64) -> StoreResult<Migration> {
    sqlx::query_as(&format!(
        "SELECT {MIGRATION_COLUMNS} FROM migrations WHERE id = $1"
    ))
    .bind(id)
    .fetch_optional(conn)
    .await?
    .ok_or_else(|| StoreError::NotFound(format!("no migration with id {id}")))
}

//! Workers: registrations, heartbeat leases and the throttle figures they report; the
//! migration settings they follow; the events they write (rate cuts, capacity signals).

use chrono::{DateTime, Utc};
use serde::Serialize;
use serde_json::json;
use uuid::Uuid;

use super::events::{self, EventKind, NewEvent};
use super::migrations::{migration_for_update, migration_in};
use super::{Store, StoreError, StoreResult};
use crate::settings::MigrationSettings;

/// What a worker reports with each heartbeat.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct WorkerFigures {
    pub applied_docs_per_sec: f64,
    pub docs_per_sec: f64,
    pub documents: i64,
    pub batches: i64,
    pub overloads: i64,
    pub retries: i64,
    pub rate_cuts: i64,
}

/// A worker row.
#[derive(Clone, Debug, Serialize, sqlx::FromRow)]
pub struct WorkerRow {
    pub id: Uuid,
    pub migration_id: i64,
    pub name: String,
    pub host: String,
    pub pid: i32,
    pub started_at: DateTime<Utc>,
    pub heartbeat_at: DateTime<Utc>,
    pub lease_expires_at: DateTime<Utc>,
    pub stopped_at: Option<DateTime<Utc>>,
    pub live: bool,
    pub applied_docs_per_sec: f64,
    pub docs_per_sec: f64,
    pub documents: i64,
    pub batches: i64,
    pub overloads: i64,
    pub retries: i64,
    pub rate_cuts: i64,
}

impl Store {
    /// Registers a worker for a migration with a lease of `ttl` (again, after it stopped
    /// serving the migration for a while: the row and its figures are kept).
    pub async fn register_worker(
        &self,
        id: Uuid,
        migration_id: i64,
        name: &str,
        host: &str,
        pid: u32,
        ttl: std::time::Duration,
    ) -> StoreResult<()> {
        sqlx::query(
            "INSERT INTO workers (id, migration_id, name, host, pid, lease_expires_at)
             VALUES ($1, $2, $3, $4, $5, now() + make_interval(secs => $6))
             ON CONFLICT (id, migration_id) DO UPDATE
             SET lease_expires_at = EXCLUDED.lease_expires_at, heartbeat_at = now(),
                 stopped_at = NULL",
        )
        .bind(id)
        .bind(migration_id)
        .bind(name)
        .bind(host)
        .bind(pid as i32)
        .bind(ttl.as_secs_f64())
        .execute(self.pool())
        .await?;
        Ok(())
    }

    /// Renews a worker's lease with its figures; returns how many workers of the migration
    /// hold a live lease (this one included), which is how the rate is shared.
    pub async fn worker_heartbeat(
        &self,
        id: Uuid,
        migration_id: i64,
        ttl: std::time::Duration,
        figures: &WorkerFigures,
    ) -> StoreResult<usize> {
        sqlx::query(
            "UPDATE workers SET heartbeat_at = now(),
                 lease_expires_at = now() + make_interval(secs => $2),
                 applied_docs_per_sec = $3, docs_per_sec = $4, documents = $5, batches = $6,
                 overloads = $7, retries = $8, rate_cuts = $9, stopped_at = NULL
             WHERE id = $1 AND migration_id = $10",
        )
        .bind(id)
        .bind(ttl.as_secs_f64())
        .bind(figures.applied_docs_per_sec)
        .bind(figures.docs_per_sec)
        .bind(figures.documents)
        .bind(figures.batches)
        .bind(figures.overloads)
        .bind(figures.retries)
        .bind(figures.rate_cuts)
        .bind(migration_id)
        .execute(self.pool())
        .await?;
        self.live_workers(migration_id).await
    }

    /// How many workers of the migration hold a live lease (at least one: the caller).
    pub async fn live_workers(&self, migration_id: i64) -> StoreResult<usize> {
        let live: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM workers
             WHERE migration_id = $1 AND stopped_at IS NULL AND lease_expires_at > now()",
        )
        .bind(migration_id)
        .fetch_one(self.pool())
        .await?;
        Ok(live.max(1) as usize)
    }

    /// A worker stopped cleanly.
    pub async fn stop_worker(&self, id: Uuid, migration_id: i64) -> StoreResult<()> {
        sqlx::query(
            "UPDATE workers SET stopped_at = now(), lease_expires_at = now(),
                 applied_docs_per_sec = 0, docs_per_sec = 0
             WHERE id = $1 AND migration_id = $2",
        )
        .bind(id)
        .bind(migration_id)
        .execute(self.pool())
        .await?;
        Ok(())
    }

    /// The workers of a migration, live ones first.
    pub async fn workers(&self, migration_id: i64) -> StoreResult<Vec<WorkerRow>> {
        Ok(sqlx::query_as(
            "SELECT id, migration_id, name, host, pid, started_at, heartbeat_at,
                    lease_expires_at, stopped_at,
                    (stopped_at IS NULL AND lease_expires_at > now()) AS live,
                    applied_docs_per_sec, docs_per_sec, documents, batches, overloads, retries,
                    rate_cuts
             FROM workers WHERE migration_id = $1
             ORDER BY (stopped_at IS NULL AND lease_expires_at > now()) DESC, started_at",
        )
        .bind(migration_id)
        .fetch_all(self.pool())
        .await?)
    }

    /// Replaces a migration's settings after checking them; writes a `settings_changed` event
    /// with the old and new values. Returns the new settings.
    pub async fn update_settings(
        &self,
        migration_id: i64,
        change: impl FnOnce(&mut MigrationSettings),
        actor: &str,
        reason: Option<&str>,
    ) -> StoreResult<(MigrationSettings, MigrationSettings)> {
        let mut tx = self.pool().begin().await?;
        let migration = migration_for_update(&mut tx, migration_id).await?;
        let before = MigrationSettings::from_json(&migration.settings)
            .map_err(|e| StoreError::Conflict(format!("migration {migration_id}: {e}")))?;
        let mut after = before;
        change(&mut after);
        let problems = after.problems();
        if !problems.is_empty() {
            return Err(StoreError::Conflict(problems.join("; ")));
        }
        sqlx::query("UPDATE migrations SET settings = $2, updated_at = now() WHERE id = $1")
            .bind(migration_id)
            .bind(after.to_json())
            .execute(&mut *tx)
            .await?;
        let event = NewEvent::new(
            EventKind::SettingsChanged,
            json!({ "before": before.to_json(), "after": after.to_json() }),
        )
        .reason(reason);
        events::insert(&mut tx, &migration, actor, &event).await?;
        sqlx::query("SELECT pg_notify($1, $2)")
            .bind(super::CHANNEL)
            .bind(json!({ "id": migration_id, "settings": true }).to_string())
            .execute(&mut *tx)
            .await?;
        self.finish(tx).await?;
        Ok((before, after))
    }

    /// Notes that the target layout was removed after a rollback.
    pub async fn mark_target_removed(&self, migration_id: i64) -> StoreResult<()> {
        sqlx::query("UPDATE migrations SET target_removed_at = now() WHERE id = $1")
            .bind(migration_id)
            .execute(self.pool())
            .await?;
        Ok(())
    }

    /// Notes that the target's tombstones were purged after `completed`.
    pub async fn mark_tombstones_purged(&self, migration_id: i64) -> StoreResult<()> {
        sqlx::query("UPDATE migrations SET tombstones_purged_at = now() WHERE id = $1")
            .bind(migration_id)
            .execute(self.pool())
            .await?;
        Ok(())
    }

    /// Appends an event that is not a phase change (rate cuts, capacity signals, ...).
    pub async fn record_event(
        &self,
        migration_id: i64,
        actor: &str,
        event: &NewEvent<'_>,
    ) -> StoreResult<i64> {
        let mut tx = self.pool().begin().await?;
        let migration = migration_in(&mut tx, migration_id).await?;
        let id = events::insert(&mut tx, &migration, actor, event).await?;
        tx.commit().await?;
        Ok(id)
    }
}

//! Routers embedded in applications: their registrations, leases and acknowledged epochs.

use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::PgConnection;

use super::migrations::Migration;
use super::{Store, StoreResult};

/// A router with a live lease that has not acknowledged a migration's current epoch.
#[derive(Clone, Debug, Serialize)]
pub struct Unacknowledged {
    pub name: String,
    pub host: String,
    pub pid: i32,
    /// The epoch it last acknowledged, `-` when none for this migration.
    pub acked: String,
}

/// Routers of the migration's collection that hold a live lease (by the database's clock) and
/// have not acknowledged its current epoch. A router whose lease expired refuses writes until
/// it refreshes, so it no longer holds up a barrier.
pub async fn unacknowledged(
    conn: &mut PgConnection,
    migration: &Migration,
) -> StoreResult<Vec<Unacknowledged>> {
    #[derive(sqlx::FromRow)]
    struct Row {
        name: String,
        host: String,
        pid: i32,
        migration_id: Option<i64>,
        acked_epoch: Option<i64>,
    }
    let rows: Vec<Row> = sqlx::query_as(
        "SELECT name, host, pid, migration_id, acked_epoch FROM routers
         WHERE collection = $1 AND lease_expires_at > now()
           AND (migration_id IS DISTINCT FROM $2 OR acked_epoch IS NULL OR acked_epoch < $3)
         ORDER BY name, host, pid",
    )
    .bind(&migration.collection)
    .bind(migration.id)
    .bind(migration.epoch)
    .fetch_all(conn)
    .await?;
    Ok(rows
        .into_iter()
        .map(|r| Unacknowledged {
            name: r.name,
            host: r.host,
            pid: r.pid,
            acked: match (r.migration_id, r.acked_epoch) {
                (Some(m), Some(e)) if m == migration.id => e.to_string(),
                _ => "-".to_owned(),
            },
        })
        .collect())
}

/// A router as `routers list` shows it.
#[derive(Clone, Debug, Serialize, sqlx::FromRow)]
pub struct RouterRow {
    pub id: uuid::Uuid,
    pub collection: String,
    pub name: String,
    pub host: String,
    pub pid: i32,
    pub migration_id: Option<i64>,
    pub acked_epoch: Option<i64>,
    pub heartbeat_at: DateTime<Utc>,
    pub lease_expires_at: DateTime<Utc>,
    pub live: bool,
    /// Seconds since the last heartbeat, by the database's clock.
    pub lease_age_secs: f64,
    /// What the router reported with its last heartbeat (latencies, error counts).
    pub stats: serde_json::Value,
}

/// What a router's heartbeat reports.
#[derive(Clone, Debug)]
pub struct Heartbeat<'a> {
    pub migration_id: Option<i64>,
    pub acked_epoch: Option<i64>,
    pub stats: &'a serde_json::Value,
}

impl Store {
    /// Registers a router (or renews a registration with the same id) with a lease of `ttl`.
    pub async fn register_router(
        &self,
        id: uuid::Uuid,
        collection: &str,
        name: &str,
        host: &str,
        pid: i32,
        ttl: std::time::Duration,
    ) -> StoreResult<()> {
        sqlx::query(
            "INSERT INTO routers (id, collection, name, host, pid, lease_expires_at)
             VALUES ($1, $2, $3, $4, $5, now() + make_interval(secs => $6))
             ON CONFLICT (id) DO UPDATE
             SET heartbeat_at = now(), lease_expires_at = EXCLUDED.lease_expires_at",
        )
        .bind(id)
        .bind(collection)
        .bind(name)
        .bind(host)
        .bind(pid)
        .bind(ttl.as_secs_f64())
        .execute(self.pool())
        .await?;
        Ok(())
    }

    /// Renews the lease and records the epoch the router applies. Returns false when the
    /// registration is gone (removed by an operator), in which case the router registers again.
    pub async fn router_heartbeat(
        &self,
        id: uuid::Uuid,
        ttl: std::time::Duration,
        beat: &Heartbeat<'_>,
    ) -> StoreResult<bool> {
        let done = sqlx::query(
            "UPDATE routers SET heartbeat_at = now(),
                    lease_expires_at = now() + make_interval(secs => $2),
                    migration_id = $3, acked_epoch = $4, stats = $5
             WHERE id = $1",
        )
        .bind(id)
        .bind(ttl.as_secs_f64())
        .bind(beat.migration_id)
        .bind(beat.acked_epoch)
        .bind(beat.stats)
        .execute(self.pool())
        .await?;
        Ok(done.rows_affected() == 1)
    }

    /// Removes a router's registration (on orderly shutdown), so it holds up no barrier.
    pub async fn deregister_router(&self, id: uuid::Uuid) -> StoreResult<()> {
        sqlx::query("DELETE FROM routers WHERE id = $1")
            .bind(id)
            .execute(self.pool())
            .await?;
        Ok(())
    }

    /// Live routers of the migration's collection that have not acknowledged its current epoch.
    pub async fn unacknowledged_routers(
        &self,
        migration: &Migration,
    ) -> StoreResult<Vec<Unacknowledged>> {
        let mut conn = self.pool().acquire().await?;
        unacknowledged(&mut conn, migration).await
    }

    pub async fn routers(&self, collection: Option<&str>) -> StoreResult<Vec<RouterRow>> {
        Ok(sqlx::query_as(
            "SELECT id, collection, name, host, pid, migration_id, acked_epoch, heartbeat_at,
                    lease_expires_at, lease_expires_at > now() AS live,
                    extract(epoch FROM now() - heartbeat_at)::float8 AS lease_age_secs, stats
             FROM routers WHERE $1::text IS NULL OR collection = $1
             ORDER BY collection, name, host, pid",
        )
        .bind(collection)
        .fetch_all(self.pool())
        .await?)
    }
}

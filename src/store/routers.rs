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
pub(super) async fn unacknowledged(
    conn: &mut PgConnection,
    migration: &Migration,
) -> StoreResult<Vec<Unacknowledged>> {
    let rows: Vec<(String, String, i32, Option<i64>, Option<i64>)> = sqlx::query_as(
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
        .map(|(name, host, pid, migration_id, acked)| Unacknowledged {
            name,
            host,
            pid,
            acked: match (migration_id, acked) {
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
}

impl Store {
    pub async fn routers(&self, collection: Option<&str>) -> StoreResult<Vec<RouterRow>> {
        Ok(sqlx::query_as(
            "SELECT id, collection, name, host, pid, migration_id, acked_epoch, heartbeat_at,
                    lease_expires_at, lease_expires_at > now() AS live
             FROM routers WHERE $1::text IS NULL OR collection = $1
             ORDER BY collection, name, host, pid",
        )
        .bind(collection)
        .fetch_all(self.pool())
        .await?)
    }
}

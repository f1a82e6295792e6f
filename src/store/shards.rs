//! Registered shards.

use chrono::{DateTime, Utc};
use serde::Serialize;

use super::{Store, StoreError, StoreResult};
use crate::redact::Redacted;

#[derive(Clone, Debug, Serialize)]
pub struct Shard {
    pub name: String,
    /// Serialised redacted; use `uri.expose()` only to connect.
    #[serde(serialize_with = "serialize_redacted")]
    pub uri: Redacted,
    pub database: String,
    pub created_at: DateTime<Utc>,
}

fn serialize_redacted<S: serde::Serializer>(r: &Redacted, s: S) -> Result<S::Ok, S::Error> {
    s.collect_str(r)
}

type ShardRow = (String, String, String, DateTime<Utc>);

fn shard_from_row((name, uri, database, created_at): ShardRow) -> Shard {
    Shard {
        name,
        uri: Redacted::new(uri),
        database,
        created_at,
    }
}

impl Store {
    pub async fn add_shard(&self, name: &str, uri: &str, database: &str) -> StoreResult<Shard> {
        let mut tx = self.pool().begin().await?;
        let row: Option<ShardRow> = sqlx::query_as(
            "INSERT INTO shards (name, uri, database) VALUES ($1, $2, $3)
             ON CONFLICT (name) DO NOTHING
             RETURNING name, uri, database, created_at",
        )
        .bind(name)
        .bind(uri)
        .bind(database)
        .fetch_optional(&mut *tx)
        .await?;
        self.finish(tx).await?;
        row.map(shard_from_row)
            .ok_or_else(|| StoreError::Conflict(format!("shard {name:?} is already registered")))
    }

    pub async fn shards(&self) -> StoreResult<Vec<Shard>> {
        let rows: Vec<ShardRow> =
            sqlx::query_as("SELECT name, uri, database, created_at FROM shards ORDER BY name")
                .fetch_all(self.pool())
                .await?;
        Ok(rows.into_iter().map(shard_from_row).collect())
    }

    pub async fn shard(&self, name: &str) -> StoreResult<Shard> {
        let row: Option<ShardRow> =
            sqlx::query_as("SELECT name, uri, database, created_at FROM shards WHERE name = $1")
                .bind(name)
                .fetch_optional(self.pool())
                .await?;
        row.map(shard_from_row)
            .ok_or_else(|| StoreError::NotFound(format!("no shard named {name:?}")))
    }

    /// Removes a shard, refusing while any routing version places documents on it.
    pub async fn remove_shard(&self, name: &str) -> StoreResult<()> {
        let mut tx = self.pool().begin().await?;
        let exists: Option<String> =
            sqlx::query_scalar("SELECT name FROM shards WHERE name = $1 FOR UPDATE")
                .bind(name)
                .fetch_optional(&mut *tx)
                .await?;
        if exists.is_none() {
            return Err(StoreError::NotFound(format!("no shard named {name:?}")));
        }
        let users: Vec<(String, i32)> = sqlx::query_as(
            "SELECT collection, version FROM routing_version_shards WHERE shard = $1
             ORDER BY collection, version",
        )
        .bind(name)
        .fetch_all(&mut *tx)
        .await?;
        if !users.is_empty() {
            let list = users
                .iter()
                .map(|(c, v)| format!("{c} v{v}"))
                .collect::<Vec<_>>()
                .join(", ");
            return Err(StoreError::Conflict(format!(
                "shard {name:?} is used by routing versions: {list}"
            )));
        }
        sqlx::query("DELETE FROM shards WHERE name = $1")
            .bind(name)
            .execute(&mut *tx)
            .await?;
        self.finish(tx).await?;
        Ok(())
    }
}

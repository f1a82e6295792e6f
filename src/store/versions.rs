//! Routing versions: immutable once stored, numbered per collection from 1.

use std::collections::BTreeSet;

use chrono::{DateTime, Utc};
use serde::Serialize;

use super::{Store, StoreError, StoreResult};
use crate::routing::RoutingVersion;

/// A stored routing version and who stored it when.
#[derive(Clone, Debug, Serialize)]
pub struct StoredVersion {
    #[serde(flatten)]
    pub version: RoutingVersion,
    pub created_at: DateTime<Utc>,
    pub created_by: String,
}

/// What validating a new version of a collection needs to know about what is already stored.
#[derive(Clone, Debug)]
pub struct VersionContext {
    pub registered_shards: BTreeSet<String>,
    pub previous_virtual_buckets: Option<u32>,
}

type VersionRow = (serde_json::Value, DateTime<Utc>, String);

fn version_from_row((spec, created_at, created_by): VersionRow) -> StoreResult<StoredVersion> {
    let version: RoutingVersion = serde_json::from_value(spec).map_err(|e| {
        StoreError::Conflict(format!("a stored routing version cannot be read: {e}"))
    })?;
    Ok(StoredVersion {
        version,
        created_at,
        created_by,
    })
}

impl Store {
    pub async fn version_context(&self, collection: &str) -> StoreResult<VersionContext> {
        let registered_shards: Vec<String> =
            sqlx::query_scalar("SELECT name FROM shards ORDER BY name")
                .fetch_all(self.pool())
                .await?;
        let previous: Option<i32> = sqlx::query_scalar(
            "SELECT virtual_buckets FROM routing_versions
             WHERE collection = $1 AND virtual_buckets IS NOT NULL
             ORDER BY version LIMIT 1",
        )
        .bind(collection)
        .fetch_optional(self.pool())
        .await?
        .flatten();
        Ok(VersionContext {
            registered_shards: registered_shards.into_iter().collect(),
            previous_virtual_buckets: previous.map(|v| v as u32),
        })
    }

    /// Stores a validated version as the collection's next number. The checks that depend on
    /// other rows (V unchanged, shards registered) are repeated under a per-collection lock, so
    /// that two concurrent creates cannot both pass on stale answers.
    pub async fn insert_version(
        &self,
        version: &RoutingVersion,
        source_text: &str,
        actor: &str,
    ) -> StoreResult<StoredVersion> {
        let mut tx = self.pool().begin().await?;
        sqlx::query("SELECT pg_advisory_xact_lock(hashtext('reshard.version.' || $1))")
            .bind(&version.collection)
            .execute(&mut *tx)
            .await?;
        let v = version.virtual_buckets();
        if let Some(v) = v {
            let previous: Option<i32> = sqlx::query_scalar(
                "SELECT virtual_buckets FROM routing_versions
                 WHERE collection = $1 AND virtual_buckets IS NOT NULL LIMIT 1",
            )
            .bind(&version.collection)
            .fetch_optional(&mut *tx)
            .await?
            .flatten();
            if let Some(previous) = previous.filter(|p| *p as u32 != v) {
                return Err(StoreError::Conflict(format!(
                    "virtual_buckets is {v} but earlier versions of {} use {previous}; \
                     V stays fixed for a collection",
                    version.collection
                )));
            }
        }
        let number: i32 = sqlx::query_scalar(
            "SELECT COALESCE(max(version), 0) + 1 FROM routing_versions WHERE collection = $1",
        )
        .bind(&version.collection)
        .fetch_one(&mut *tx)
        .await?;
        let mut stored = version.clone();
        stored.version = number;
        let spec = serde_json::to_value(&stored)
            .map_err(|e| StoreError::Conflict(format!("cannot serialise the version: {e}")))?;
        let (created_at, created_by): (DateTime<Utc>, String) = sqlx::query_as(
            "INSERT INTO routing_versions
                 (collection, version, layout, virtual_buckets, spec, source_text, created_by)
             VALUES ($1, $2, $3, $4, $5, $6, $7)
             RETURNING created_at, created_by",
        )
        .bind(&stored.collection)
        .bind(number)
        .bind(stored.layout().kind())
        .bind(v.map(|v| v as i32))
        .bind(&spec)
        .bind(source_text)
        .bind(actor)
        .fetch_one(&mut *tx)
        .await?;
        for shard in stored.shards() {
            let inserted = sqlx::query(
                "INSERT INTO routing_version_shards (collection, version, shard)
                 SELECT $1, $2, name FROM shards WHERE name = $3",
            )
            .bind(&stored.collection)
            .bind(number)
            .bind(&shard)
            .execute(&mut *tx)
            .await?;
            if inserted.rows_affected() == 0 {
                return Err(StoreError::Conflict(format!(
                    "shard {shard:?} is not registered (it was removed meanwhile?)"
                )));
            }
        }
        tx.commit().await?;
        Ok(StoredVersion {
            version: stored,
            created_at,
            created_by,
        })
    }

    pub async fn versions(&self, collection: Option<&str>) -> StoreResult<Vec<StoredVersion>> {
        let rows: Vec<VersionRow> = sqlx::query_as(
            "SELECT spec, created_at, created_by FROM routing_versions
             WHERE $1::text IS NULL OR collection = $1
             ORDER BY collection, version",
        )
        .bind(collection)
        .fetch_all(self.pool())
        .await?;
        rows.into_iter().map(version_from_row).collect()
    }

    /// The collections that have a routing version: the ones routers route.
    pub async fn routed_collections(&self) -> StoreResult<Vec<String>> {
        let rows: Vec<(String,)> =
            sqlx::query_as("SELECT DISTINCT collection FROM routing_versions ORDER BY collection")
                .fetch_all(self.pool())
                .await?;
        Ok(rows.into_iter().map(|(c,)| c).collect())
    }

    /// One version, or the latest of the collection when `version` is `None`.
    pub async fn version(
        &self,
        collection: &str,
        version: Option<i32>,
    ) -> StoreResult<StoredVersion> {
        let row: Option<VersionRow> = sqlx::query_as(
            "SELECT spec, created_at, created_by FROM routing_versions
             WHERE collection = $1 AND ($2::int IS NULL OR version = $2)
             ORDER BY version DESC LIMIT 1",
        )
        .bind(collection)
        .bind(version)
        .fetch_optional(self.pool())
        .await?;
        match row {
            Some(row) => version_from_row(row),
            None => Err(StoreError::NotFound(match version {
                Some(v) => format!("collection {collection:?} has no routing version {v}"),
                None => format!(
                    "collection {collection:?} has no routing versions; \
                     create one with `reshard version create`"
                ),
            })),
        }
    }

    /// A migration's source and target versions.
    pub async fn migration_versions(
        &self,
        m: &super::migrations::Migration,
    ) -> StoreResult<(RoutingVersion, RoutingVersion)> {
        let from = self.version(&m.collection, Some(m.from_version)).await?;
        let to = self.version(&m.collection, Some(m.to_version)).await?;
        Ok((from.version, to.version))
    }

    /// The version the collection's documents follow when no migration is active: the target
    /// of the last completed migration, the source of one rolled back, or else version 1.
    pub async fn current_version(&self, collection: &str) -> StoreResult<i32> {
        let ended: Option<i32> = sqlx::query_scalar(
            "SELECT CASE WHEN phase = 'completed' THEN to_version ELSE from_version END
             FROM migrations
             WHERE collection = $1 AND phase IN ('completed', 'rolled_back')
             ORDER BY finished_at DESC NULLS LAST, id DESC LIMIT 1",
        )
        .bind(collection)
        .fetch_optional(self.pool())
        .await?;
        match ended {
            Some(v) => Ok(v),
            None => Ok(self.version(collection, Some(1)).await?.version.version),
        }
    }
}

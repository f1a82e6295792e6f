//! Shadow reads: the counts routers report and the mismatches they found (`crate::shadow`).
//! Routers write here from their own tasks, never from an application's operation.

use chrono::{DateTime, Utc};
use serde::Serialize;
use uuid::Uuid;

use super::{Store, StoreResult};

/// A mismatch a router found: a pristine copy in the target that differs from its source.
#[derive(Clone, Debug)]
pub struct NewShadowMismatch<'a> {
    pub migration_id: i64,
    /// The `_id`, encoded ([`crate::ids::encode`]).
    pub doc_id: &'a [u8],
    pub doc_id_text: &'a str,
    pub source_location: &'a str,
    pub target_location: &'a str,
    /// The fields that differ.
    pub fields: &'a [String],
    pub router_name: &'a str,
}

/// A stored mismatch.
#[derive(Clone, Debug, Serialize, sqlx::FromRow)]
pub struct ShadowMismatch {
    pub id: i64,
    pub migration_id: i64,
    /// The document's `_id`, written as Extended JSON.
    #[serde(rename = "_id", serialize_with = "crate::ids::serialize_encoded")]
    pub doc_id: Vec<u8>,
    #[serde(rename = "id_text")]
    pub doc_id_text: String,
    pub source_location: String,
    pub target_location: String,
    pub fields: serde_json::Value,
    pub router_name: String,
    /// How many shadow reads saw it.
    pub reports: i64,
    pub first_seen_at: DateTime<Utc>,
    pub last_seen_at: DateTime<Utc>,
    pub resolved_at: Option<DateTime<Utc>>,
    pub resolution: Option<String>,
}

/// A migration's shadow reads, over every router that ever followed it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, sqlx::FromRow)]
pub struct ShadowTotals {
    /// Reads for which both sides were compared.
    pub compared: i64,
    /// Of them, the ones that differed.
    pub mismatches: i64,
    /// Documents with a mismatch not resolved yet.
    pub open: i64,
    /// Documents whose mismatch was resolved (repaired or superseded).
    pub resolved: i64,
}

const MISMATCH_COLUMNS: &str = "id, migration_id, doc_id, doc_id_text, source_location, \
     target_location, fields, router_name, reports, first_seen_at, last_seen_at, resolved_at, \
     resolution";

impl Store {
    /// Records a mismatch: a new open row, or one more report on the document's open row.
    pub async fn report_shadow_mismatch(&self, m: &NewShadowMismatch<'_>) -> StoreResult<()> {
        sqlx::query(
            "INSERT INTO shadow_mismatches (migration_id, doc_id, doc_id_text, source_location,
                 target_location, fields, router_name)
             VALUES ($1, $2, $3, $4, $5, $6, $7)
             ON CONFLICT (migration_id, doc_id) WHERE resolved_at IS NULL DO UPDATE
             SET reports = shadow_mismatches.reports + 1, last_seen_at = now(),
                 fields = EXCLUDED.fields, source_location = EXCLUDED.source_location,
                 target_location = EXCLUDED.target_location, router_name = EXCLUDED.router_name",
        )
        .bind(m.migration_id)
        .bind(m.doc_id)
        .bind(m.doc_id_text)
        .bind(m.source_location)
        .bind(m.target_location)
        .bind(serde_json::json!(m.fields))
        .bind(m.router_name)
        .execute(self.pool())
        .await?;
        Ok(())
    }

    /// Stores what a router counted since it started following the migration (replacing what
    /// it stored before).
    pub async fn record_shadow_counts(
        &self,
        migration_id: i64,
        router_id: Uuid,
        router_name: &str,
        compared: u64,
        mismatches: u64,
    ) -> StoreResult<()> {
        sqlx::query(
            "INSERT INTO shadow_read_counts (migration_id, router_id, router_name, compared,
                 mismatches)
             VALUES ($1, $2, $3, $4, $5)
             ON CONFLICT (migration_id, router_id) DO UPDATE
             SET compared = EXCLUDED.compared, mismatches = EXCLUDED.mismatches,
                 router_name = EXCLUDED.router_name, updated_at = now()",
        )
        .bind(migration_id)
        .bind(router_id)
        .bind(router_name)
        .bind(compared as i64)
        .bind(mismatches as i64)
        .execute(self.pool())
        .await?;
        Ok(())
    }

    /// A migration's shadow-read totals.
    pub async fn shadow_totals(&self, migration_id: i64) -> StoreResult<ShadowTotals> {
        Ok(sqlx::query_as(
            "SELECT
                 (SELECT coalesce(sum(compared), 0)::bigint FROM shadow_read_counts
                  WHERE migration_id = $1) AS compared,
                 (SELECT coalesce(sum(mismatches), 0)::bigint FROM shadow_read_counts
                  WHERE migration_id = $1) AS mismatches,
                 (SELECT count(*) FROM shadow_mismatches
                  WHERE migration_id = $1 AND resolved_at IS NULL) AS open,
                 (SELECT count(*) FROM shadow_mismatches
                  WHERE migration_id = $1 AND resolved_at IS NOT NULL) AS resolved",
        )
        .bind(migration_id)
        .fetch_one(self.pool())
        .await?)
    }

    /// A migration's mismatches (only the open ones with `open_only`), oldest first.
    pub async fn shadow_mismatches(
        &self,
        migration_id: i64,
        open_only: bool,
    ) -> StoreResult<Vec<ShadowMismatch>> {
        Ok(sqlx::query_as(&format!(
            "SELECT {MISMATCH_COLUMNS} FROM shadow_mismatches
             WHERE migration_id = $1 AND (NOT $2 OR resolved_at IS NULL)
             ORDER BY id"
        ))
        .bind(migration_id)
        .bind(open_only)
        .fetch_all(self.pool())
        .await?)
    }

    /// Resolves an open mismatch (repaired, or superseded by the application's write).
    pub async fn resolve_shadow_mismatch(&self, id: i64, resolution: &str) -> StoreResult<()> {
        sqlx::query(
            "UPDATE shadow_mismatches SET resolved_at = now(), resolution = $2
             WHERE id = $1 AND resolved_at IS NULL",
        )
        .bind(id)
        .bind(resolution)
        .execute(self.pool())
        .await?;
        Ok(())
    }
}

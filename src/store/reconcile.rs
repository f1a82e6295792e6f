//! Reconciliation runs and their findings.

use chrono::{DateTime, Utc};
use serde::Serialize;

use super::{Store, StoreError, StoreResult};

/// What one verified batch of a full run adds to its partition.
#[derive(Clone, Copy, Debug)]
pub struct VerifiedBatch<'a> {
    /// The last `_id` checked (encoded); `None` keeps the checkpoint.
    pub last_id: Option<&'a [u8]>,
    /// Documents checked.
    pub checked: i64,
    /// Counts per outcome so far, over the whole partition.
    pub outcomes: &'a serde_json::Value,
    pub findings: &'a [NewFinding],
    /// The partition is finished.
    pub done: bool,
}

/// A stored run.
#[derive(Clone, Debug, Serialize, sqlx::FromRow)]
pub struct Run {
    pub id: i64,
    pub migration_id: i64,
    pub mode: RunMode,
    pub settings: serde_json::Value,
    pub started_at: DateTime<Utc>,
    pub finished_at: Option<DateTime<Utc>>,
    pub passed: Option<bool>,
    pub summary: serde_json::Value,
}

/// How a run reads the source: a stratified sample, or every document (leased, resumable).
/// Stored as its name (the column's CHECK allows these two).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, sqlx::Type)]
#[sqlx(type_name = "text", rename_all = "snake_case")]
#[serde(rename_all = "snake_case")]
pub enum RunMode {
    Sample,
    Full,
}

impl RunMode {
    pub fn as_str(self) -> &'static str {
        match self {
            RunMode::Sample => "sample",
            RunMode::Full => "full",
        }
    }
}

impl std::fmt::Display for RunMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What a finding says is wrong. Stored as its snake_case name.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, sqlx::Type)]
#[sqlx(type_name = "text", rename_all = "snake_case")]
#[serde(rename_all = "snake_case")]
pub enum FindingKind {
    /// A source document that moved is not in the target (neither a copy nor a tombstone).
    Missing,
    /// A pristine copy differs from its source, or a staying document lacks its routing field.
    Mismatched,
    /// A document sits at a target location its version does not place it at.
    Misplaced,
    /// A partition's fresh count differs from its ledger.
    Count,
    /// A source document that cannot be routed and whose dead letter was not skipped.
    Unroutable,
}

impl FindingKind {
    pub fn as_str(self) -> &'static str {
        match self {
            FindingKind::Missing => "missing",
            FindingKind::Mismatched => "mismatched",
            FindingKind::Misplaced => "misplaced",
            FindingKind::Count => "count",
            FindingKind::Unroutable => "unroutable",
        }
    }
}

impl std::fmt::Display for FindingKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A finding to store.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct NewFinding {
    pub kind: FindingKind,
    /// The document's `_id` (Extended JSON), when the finding is about one document.
    #[serde(rename = "_id", serialize_with = "crate::ids::serialize_encoded_opt")]
    pub doc_id: Option<Vec<u8>>,
    #[serde(rename = "id_text")]
    pub doc_id_text: Option<String>,
    pub stratum: Option<String>,
    pub details: serde_json::Value,
}

/// A stored finding.
#[derive(Clone, Debug, Serialize, sqlx::FromRow)]
pub struct Finding {
    pub id: i64,
    pub run_id: i64,
    pub kind: FindingKind,
    /// The document's `_id` (Extended JSON), when the finding is about one document.
    #[serde(rename = "_id", serialize_with = "crate::ids::serialize_encoded_opt")]
    pub doc_id: Option<Vec<u8>>,
    #[serde(rename = "id_text")]
    pub doc_id_text: Option<String>,
    pub stratum: Option<String>,
    pub details: serde_json::Value,
    pub repaired_at: Option<DateTime<Utc>>,
    pub resolution: Option<String>,
}

impl From<&Finding> for NewFinding {
    /// A stored finding as one to check again.
    fn from(f: &Finding) -> Self {
        NewFinding {
            kind: f.kind,
            doc_id: f.doc_id.clone(),
            doc_id_text: f.doc_id_text.clone(),
            stratum: f.stratum.clone(),
            details: f.details.clone(),
        }
    }
}

const RUN_COLUMNS: &str =
    "id, migration_id, mode, settings, started_at, finished_at, passed, summary";
const FINDING_COLUMNS: &str =
    "id, run_id, kind, doc_id, doc_id_text, stratum, details, repaired_at, resolution";

impl Store {
    /// Starts a run; its start time is what the gate compares with the end of backfill.
    pub async fn start_reconciliation(
        &self,
        migration_id: i64,
        mode: RunMode,
        settings: serde_json::Value,
    ) -> StoreResult<Run> {
        Ok(sqlx::query_as(&format!(
            "INSERT INTO reconciliation_runs (migration_id, mode, settings)
             VALUES ($1, $2, $3) RETURNING {RUN_COLUMNS}"
        ))
        .bind(migration_id)
        .bind(mode)
        .bind(settings)
        .fetch_one(self.pool())
        .await?)
    }

    /// Stores a run's findings and verdict, and an event naming both (`reconciled`, or
    /// `reconciliation_failed` for a run that did not pass). A run finishes once:
    /// `NotFound` when another process finished it first.
    pub async fn finish_reconciliation(
        &self,
        run_id: i64,
        passed: bool,
        summary: serde_json::Value,
        findings: &[NewFinding],
        actor: &str,
    ) -> StoreResult<Run> {
        let mut tx = self.pool().begin().await?;
        let open: Option<i64> = sqlx::query_scalar(
            "SELECT id FROM reconciliation_runs WHERE id = $1 AND finished_at IS NULL FOR UPDATE",
        )
        .bind(run_id)
        .fetch_optional(&mut *tx)
        .await?;
        if open.is_none() {
            return Err(StoreError::NotFound(format!(
                "reconciliation run {run_id} is already finished"
            )));
        }
        insert_findings(&mut tx, run_id, findings).await?;
        let run: Run = sqlx::query_as(&format!(
            "UPDATE reconciliation_runs SET finished_at = now(), passed = $2, summary = $3
             WHERE id = $1 RETURNING {RUN_COLUMNS}"
        ))
        .bind(run_id)
        .bind(passed)
        .bind(&summary)
        .fetch_one(&mut *tx)
        .await?;
        let migration = super::migrations::migration_in(&mut tx, run.migration_id).await?;
        let kind = if passed {
            super::events::EventKind::Reconciled
        } else {
            super::events::EventKind::ReconciliationFailed
        };
        let event = super::events::NewEvent::new(
            kind,
            serde_json::json!({ "run": run_id, "passed": passed, "findings": findings.len() }),
        );
        super::events::insert(&mut tx, &migration, actor, &event).await?;
        tx.commit().await?;
        Ok(run)
    }

    /// A migration's runs, newest first.
    pub async fn reconciliation_runs(&self, migration_id: i64) -> StoreResult<Vec<Run>> {
        Ok(sqlx::query_as(&format!(
            "SELECT {RUN_COLUMNS} FROM reconciliation_runs WHERE migration_id = $1 ORDER BY id DESC"
        ))
        .bind(migration_id)
        .fetch_all(self.pool())
        .await?)
    }

    /// One run of a migration, or its latest finished one.
    pub async fn reconciliation_run(
        &self,
        migration_id: i64,
        run: Option<i64>,
    ) -> StoreResult<Run> {
        sqlx::query_as(&format!(
            "SELECT {RUN_COLUMNS} FROM reconciliation_runs
             WHERE migration_id = $1 AND ($2::bigint IS NULL OR id = $2)
               AND ($2::bigint IS NOT NULL OR finished_at IS NOT NULL)
             ORDER BY id DESC LIMIT 1"
        ))
        .bind(migration_id)
        .bind(run)
        .fetch_optional(self.pool())
        .await?
        .ok_or_else(|| {
            StoreError::NotFound(match run {
                Some(r) => format!("migration {migration_id} has no reconciliation run {r}"),
                None => format!(
                    "migration {migration_id} has no finished reconciliation run \
                     (run `reshard reconcile {migration_id}`)"
                ),
            })
        })
    }

    /// Creates the `verify` partitions of a full run ([`crate::reconcile::verify_ranges`]).
    pub async fn plan_verify(
        &self,
        run_id: i64,
        migration_id: i64,
        ranges: &[super::partitions::NewPartition],
    ) -> StoreResult<u64> {
        let mut tx = self.pool().begin().await?;
        for p in ranges {
            sqlx::query(
                "INSERT INTO partitions (migration_id, task, run_id, source_shard,
                     source_collection, id_type, lower_bound, upper_bound, tenant_filter,
                     approx_documents)
                 VALUES ($1, 'verify', $2, $3, $4, $5, $6, $7, $8, $9)",
            )
            .bind(migration_id)
            .bind(run_id)
            .bind(&p.source_shard)
            .bind(&p.source_collection)
            .bind(&p.id_type)
            .bind(&p.lower_bound)
            .bind(&p.upper_bound)
            .bind(&p.tenant_filter)
            .bind(p.approx_documents)
            .execute(&mut *tx)
            .await?;
        }
        tx.commit().await?;
        Ok(ranges.len() as u64)
    }

    /// Claims a `verify` partition of a run (pending, or its lease expired).
    pub async fn claim_verify_partition(
        &self,
        run_id: i64,
        claim: &super::partitions::Claim,
    ) -> StoreResult<Option<super::partitions::Partition>> {
        self.claim(
            super::partitions::Claimant::Run(run_id),
            super::partitions::Task::Verify,
            claim,
            None,
        )
        .await
    }

    /// Records a verified batch: resume point, counters, outcomes and findings, fenced by the
    /// lease token; `done` also ends the partition. `false`: the lease is gone.
    pub async fn checkpoint_verify(
        &self,
        partition: &super::partitions::Partition,
        token: uuid::Uuid,
        ttl: std::time::Duration,
        batch: &VerifiedBatch<'_>,
    ) -> StoreResult<bool> {
        let VerifiedBatch {
            last_id,
            checked,
            outcomes,
            findings,
            done,
        } = *batch;
        let mut tx = self.pool().begin().await?;
        let r = sqlx::query(
            "UPDATE partitions SET last_id = coalesce($3, last_id), scanned = scanned + $4,
                 kept = kept + $4, outcomes = $5,
                 lease_expires_at = now() + make_interval(secs => $6),
                 state = CASE WHEN $7 THEN 'done' ELSE state END,
                 finished_at = CASE WHEN $7 THEN now() ELSE finished_at END
             WHERE id = $1 AND lease_token = $2 AND state = 'leased'",
        )
        .bind(partition.id)
        .bind(token)
        .bind(last_id)
        .bind(checked)
        .bind(outcomes)
        .bind(ttl.as_secs_f64())
        .bind(done)
        .execute(&mut *tx)
        .await?;
        if r.rows_affected() != 1 {
            return Ok(false);
        }
        if let Some(run_id) = partition.run_id {
            insert_findings(&mut tx, run_id, findings).await?;
        }
        tx.commit().await?;
        Ok(true)
    }

    /// The `verify` partitions of a run.
    pub async fn verify_partitions(
        &self,
        run_id: i64,
    ) -> StoreResult<Vec<super::partitions::Partition>> {
        Ok(sqlx::query_as(&format!(
            "SELECT {} FROM partitions WHERE run_id = $1 AND task = 'verify' ORDER BY id",
            super::partitions::PARTITION_COLUMNS
        ))
        .bind(run_id)
        .fetch_all(self.pool())
        .await?)
    }

    pub async fn findings(&self, run_id: i64) -> StoreResult<Vec<Finding>> {
        Ok(sqlx::query_as(&format!(
            "SELECT {FINDING_COLUMNS} FROM reconciliation_findings WHERE run_id = $1 ORDER BY id"
        ))
        .bind(run_id)
        .fetch_all(self.pool())
        .await?)
    }

    /// Removes findings that cleared on re-check.
    pub async fn delete_findings(&self, ids: &[i64]) -> StoreResult<()> {
        if ids.is_empty() {
            return Ok(());
        }
        sqlx::query("DELETE FROM reconciliation_findings WHERE id = ANY($1)")
            .bind(ids)
            .execute(self.pool())
            .await?;
        Ok(())
    }

    /// Repair dealt with a finding.
    pub async fn finding_repaired(&self, id: i64, resolution: &str) -> StoreResult<()> {
        sqlx::query(
            "UPDATE reconciliation_findings SET repaired_at = now(), resolution = $2 WHERE id = $1",
        )
        .bind(id)
        .bind(resolution)
        .execute(self.pool())
        .await?;
        Ok(())
    }

    /// The `_id`s (as stored, [`crate::ids::encode`]) of a migration's skipped dead letters:
    /// documents an operator accepted will not be in the target.
    pub async fn skipped_ids(&self, migration_id: i64) -> StoreResult<Vec<Vec<u8>>> {
        Ok(sqlx::query_scalar(
            "SELECT doc_id FROM dead_letters WHERE migration_id = $1 AND status = 'skipped'",
        )
        .bind(migration_id)
        .fetch_all(self.pool())
        .await?)
    }
}

async fn insert_findings(
    conn: &mut sqlx::PgConnection,
    run_id: i64,
    findings: &[NewFinding],
) -> StoreResult<()> {
    for f in findings {
        sqlx::query(
            "INSERT INTO reconciliation_findings (run_id, kind, doc_id, doc_id_text, stratum, details)
             VALUES ($1, $2, $3, $4, $5, $6)",
        )
        .bind(run_id)
        .bind(f.kind)
        .bind(&f.doc_id)
        .bind(&f.doc_id_text)
        .bind(&f.stratum)
        .bind(&f.details)
        .execute(&mut *conn)
        .await?;
    }
    Ok(())
}

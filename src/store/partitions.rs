//! Partitions: the leased, checkpointed work units of backfill (and later of verification,
//! cleanup and revert); the dead letters their batches leave behind are in [`super::dead_letters`].
//!
//! Every write to a leased partition is fenced by its lease token: a worker whose lease was
//! taken over (it stalled past the expiry and another worker claimed the partition) finds that
//! its heartbeat or checkpoint affects zero rows, and stops touching the partition.

use chrono::{DateTime, Utc};
use serde::Serialize;
use serde_json::json;
use uuid::Uuid;

use super::dead_letters::NewDeadLetter;
use super::events::{self, EventKind, NewEvent};
use super::migrations::{migration_for_update, migration_in};
use super::{Store, StoreError, StoreResult};

/// Whose partitions a claim looks among.
#[derive(Clone, Copy, Debug)]
pub(super) enum Claimant {
    Migration(i64),
    Run(i64),
}

/// The work a partition stands for. Stored as its snake_case name.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, sqlx::Type)]
#[sqlx(type_name = "text", rename_all = "snake_case")]
#[serde(rename_all = "snake_case")]
pub enum Task {
    /// Copy source documents to the target.
    Backfill,
    /// Check source documents against the target (a full reconciliation run's partitions).
    Verify,
    /// Delete moved documents from the source.
    Cleanup,
    /// Carry the application's target writes back to the source (rollback).
    Revert,
}

impl Task {
    pub fn as_str(self) -> &'static str {
        match self {
            Task::Backfill => "backfill",
            Task::Verify => "verify",
            Task::Cleanup => "cleanup",
            Task::Revert => "revert",
        }
    }

    /// The phase in which the task runs.
    pub fn phase(self) -> crate::phase::Phase {
        match self {
            Task::Backfill => crate::phase::Phase::Backfill,
            Task::Verify => crate::phase::Phase::Reconcile,
            Task::Cleanup => crate::phase::Phase::Cleanup,
            Task::Revert => crate::phase::Phase::Reverting,
        }
    }

    /// The task whose partitions a phase works, if any: the inverse of [`Task::phase`]. The
    /// `verify` partitions of a full reconciliation are worked by `reshard reconcile`
    /// processes; the others by `reshard worker` ([`Task::for_workers`]).
    pub fn of(phase: crate::phase::Phase) -> Option<Task> {
        match phase {
            crate::phase::Phase::Backfill => Some(Task::Backfill),
            crate::phase::Phase::Reconcile => Some(Task::Verify),
            crate::phase::Phase::Cleanup => Some(Task::Cleanup),
            crate::phase::Phase::Reverting => Some(Task::Revert),
            _ => None,
        }
    }

    /// The task `reshard worker` processes run in a phase, if any.
    pub fn for_workers(phase: crate::phase::Phase) -> Option<Task> {
        Task::of(phase).filter(|t| *t != Task::Verify)
    }
}

impl std::fmt::Display for Task {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Where a partition stands. Stored as its snake_case name.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, sqlx::Type)]
#[sqlx(type_name = "text", rename_all = "snake_case")]
#[serde(rename_all = "snake_case")]
pub enum PartitionState {
    Pending,
    Leased,
    Done,
}

/// A claim's lease: who holds it, its token, how long it lasts, and the fence margin after
/// its end before another worker may take the partition over (the holder stops writing that
/// long before the end, so nothing it sent can land after the takeover).
#[derive(Clone, Debug)]
pub struct Claim {
    pub token: Uuid,
    pub owner: String,
    pub ttl: std::time::Duration,
    pub fence_margin: std::time::Duration,
}

/// The highest id claimable under cleanup waves, given `(id, done)` in id order (see
/// [`Store::claim_bound`]).
pub fn wave_bound(rows: &[(i64, bool)], waves: [f64; 3]) -> Option<i64> {
    if rows.is_empty() {
        return None;
    }
    for wave in waves {
        let allowed = ((rows.len() as f64) * wave / 100.0).ceil().max(1.0) as usize;
        let allowed = allowed.min(rows.len());
        if rows[..allowed].iter().any(|(_, done)| !done) {
            return Some(rows[allowed - 1].0);
        }
    }
    Some(rows[rows.len() - 1].0)
}

/// One partition as planned: an `_id` range of one BSON type bracket on one source location.
#[derive(Clone, Debug, PartialEq)]
pub struct NewPartition {
    pub source_shard: String,
    pub source_collection: String,
    /// `any` (a range in MongoDB's total order across every type), or the `_id` type bracket
    /// of plans made before ranges crossed types (`string`, `number`, `objectId`, `binData`):
    /// [`crate::ids::IdRange`].
    pub id_type: String,
    /// Inclusive lower bound (an encoded `_id`); `None`: the first `_id` (of the bracket).
    pub lower_bound: Option<Vec<u8>>,
    /// Exclusive upper bound; `None`: past the last `_id` (of the bracket).
    pub upper_bound: Option<Vec<u8>>,
    /// Only these tenants are scanned (a JSON array of routing keys); `None`: everything.
    pub tenant_filter: Option<serde_json::Value>,
    pub approx_documents: Option<i64>,
}

/// What a `verify` partition names as its source shard and collection: it is an `_id` range
/// read at every location ([`crate::reconcile::FullRead`]).
pub const EVERY_LOCATION: &str = "*";

impl Partition {
    /// A `verify` partition read at every location rather than at one source location.
    pub fn every_location(&self) -> bool {
        self.source_shard == EVERY_LOCATION && self.source_collection == EVERY_LOCATION
    }

    /// The location it scans.
    pub fn location(&self) -> crate::routing::Location {
        crate::routing::Location::new(self.source_shard.clone(), self.source_collection.clone())
    }

    /// The `_id`s it holds.
    pub fn range(&self) -> Result<crate::ids::IdRange, String> {
        let decode = |b: &Option<Vec<u8>>| b.as_deref().map(crate::ids::decode).transpose();
        crate::ids::IdRange::of_type(
            &self.id_type,
            decode(&self.lower_bound)?,
            decode(&self.upper_bound)?,
        )
    }
}

/// A partition row.
#[derive(Clone, Debug, Serialize, sqlx::FromRow)]
pub struct Partition {
    pub id: i64,
    pub migration_id: i64,
    pub task: Task,
    pub source_shard: String,
    pub source_collection: String,
    pub id_type: String,
    #[serde(skip)]
    pub lower_bound: Option<Vec<u8>>,
    #[serde(skip)]
    pub upper_bound: Option<Vec<u8>>,
    pub tenant_filter: Option<serde_json::Value>,
    pub state: PartitionState,
    #[serde(skip)]
    pub lease_token: Option<Uuid>,
    pub lease_owner: Option<String>,
    pub lease_expires_at: Option<DateTime<Utc>>,
    #[serde(skip)]
    pub last_id: Option<Vec<u8>>,
    pub scanned: i64,
    pub inserted: i64,
    pub already_present: i64,
    pub stamped: i64,
    pub dead_lettered: i64,
    pub skipped_foreign: i64,
    pub deleted: i64,
    pub kept: i64,
    /// The reconciliation run a `verify` partition belongs to.
    pub run_id: Option<i64>,
    /// What a `verify` partition's checks found, per outcome.
    pub outcomes: serde_json::Value,
    pub approx_documents: Option<i64>,
    pub attempts: i32,
    /// The most documents one batch of this partition may carry, cut by a holder whose command
    /// ran out of the time its lease left; `None`: the configured batch size.
    pub batch_limit: Option<i32>,
    /// Commands of this partition that ran out of the time their lease left.
    pub timeouts: i32,
    /// Attempts in a row that recorded nothing: claims and restarts add one, a checkpoint
    /// resets it ([`STALLED_AFTER`]).
    pub stalls: i32,
    /// Why the last attempt ended before the partition did.
    pub last_failure: Option<String>,
    pub created_at: DateTime<Utc>,
    pub started_at: Option<DateTime<Utc>>,
    pub finished_at: Option<DateTime<Utc>>,
    /// Set by a claim that took the partition over: who held the lease that ran out.
    #[sqlx(default)]
    #[serde(skip)]
    pub taken_over_from: Option<String>,
}

pub(super) const PARTITION_COLUMNS: &str =
    "id, migration_id, task, source_shard, source_collection, id_type,
    lower_bound, upper_bound, tenant_filter, state, lease_token, lease_owner, lease_expires_at,
    last_id, scanned, inserted, already_present, stamped, dead_lettered, skipped_foreign,
    deleted, kept, run_id, outcomes, approx_documents, attempts, batch_limit, timeouts, stalls,
    last_failure, created_at, started_at, finished_at";

/// A partition whose last this many attempts in a row recorded nothing is stalled: reported
/// (an event, `status`, a metric) rather than retried in silence.
pub const STALLED_AFTER: i32 = 3;

/// What one batch added to a partition, stored with its checkpoint.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Checkpoint {
    /// The last `_id` the batch read (encoded); the scan resumes after it.
    pub last_id: Vec<u8>,
    pub scanned: i64,
    pub inserted: i64,
    pub already_present: i64,
    pub stamped: i64,
    pub dead_lettered: i64,
    pub skipped_foreign: i64,
    /// Cleanup: source documents deleted (their target copy or tombstone was there).
    pub deleted: i64,
    /// Cleanup: source documents that never moved, left in place.
    pub kept: i64,
    pub dead_letters: Vec<NewDeadLetter>,
    /// Cleanup: the last batch (by its number within the attempt) whose pending deletes this
    /// checkpoint records; they are removed with it.
    pub pending_through: Option<u64>,
}

impl Checkpoint {
    /// Adds a later batch: its counters and dead letters, and its last `_id`, so that one
    /// checkpoint records several batches.
    pub fn absorb(&mut self, later: Checkpoint) {
        self.last_id = later.last_id;
        self.scanned += later.scanned;
        self.inserted += later.inserted;
        self.already_present += later.already_present;
        self.stamped += later.stamped;
        self.dead_lettered += later.dead_lettered;
        self.skipped_foreign += later.skipped_foreign;
        self.deleted += later.deleted;
        self.kept += later.kept;
        self.dead_letters.extend(later.dead_letters);
        self.pending_through = later.pending_through.or(self.pending_through);
    }
}

/// Progress of one task of a migration, summed over its partitions.
#[derive(Clone, Debug, Default, Serialize, sqlx::FromRow)]
pub struct TaskTotals {
    pub partitions: i64,
    pub done: i64,
    pub leased: i64,
    pub scanned: i64,
    pub inserted: i64,
    pub already_present: i64,
    pub stamped: i64,
    pub dead_lettered: i64,
    pub skipped_foreign: i64,
    pub deleted: i64,
    pub kept: i64,
    pub approx_documents: i64,
}

impl Store {
    /// Stores the partitions of a migration's backfill, once: the first planner to commit
    /// wins, and every later one (another worker that sampled at the same time) gets `false`
    /// and uses the stored plan. The plan is refused unless the migration is in `backfill`.
    pub async fn store_backfill_plan(
        &self,
        migration_id: i64,
        partitions: &[NewPartition],
        actor: &str,
        details: serde_json::Value,
    ) -> StoreResult<bool> {
        self.store_plan(migration_id, Task::Backfill, partitions, actor, details)
            .await
    }

    /// Stores the partitions of a task, once (see [`Store::store_backfill_plan`]). Cleanup
    /// partitions are the backfill's: `partitions` is ignored and the backfill's ranges are
    /// copied, so cleanup reads exactly what backfill read.
    pub async fn store_plan(
        &self,
        migration_id: i64,
        task: Task,
        partitions: &[NewPartition],
        actor: &str,
        details: serde_json::Value,
    ) -> StoreResult<bool> {
        let mut tx = self.pool().begin().await?;
        let migration = migration_for_update(&mut tx, migration_id).await?;
        let planned = match task {
            Task::Backfill => migration.backfill_planned_at,
            Task::Cleanup => migration.cleanup_planned_at,
            Task::Revert => migration.revert_planned_at,
            Task::Verify => {
                return Err(StoreError::Conflict(
                    "verify partitions are planned with their reconciliation run".into(),
                ))
            }
        };
        if planned.is_some() {
            return Ok(false);
        }
        if migration.phase() != task.phase() {
            return Err(StoreError::Conflict(format!(
                "migration {migration_id} is in {}, not {}; its {} cannot be planned",
                migration.phase(),
                task.phase(),
                task.as_str()
            )));
        }
        if task == Task::Cleanup {
            sqlx::query(
                "INSERT INTO partitions (migration_id, task, source_shard, source_collection,
                     id_type, lower_bound, upper_bound, tenant_filter, approx_documents)
                 SELECT migration_id, 'cleanup', source_shard, source_collection, id_type,
                        lower_bound, upper_bound, tenant_filter, scanned
                 FROM partitions WHERE migration_id = $1 AND task = 'backfill' ORDER BY id",
            )
            .bind(migration_id)
            .execute(&mut *tx)
            .await?;
        }
        for p in partitions.iter().filter(|_| task != Task::Cleanup) {
            sqlx::query(
                "INSERT INTO partitions (migration_id, task, source_shard, source_collection,
                     id_type, lower_bound, upper_bound, tenant_filter, approx_documents)
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)",
            )
            .bind(migration_id)
            .bind(task)
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
        sqlx::query(&format!(
            "UPDATE migrations SET {}_planned_at = now() WHERE id = $1",
            task.as_str()
        ))
        .bind(migration_id)
        .execute(&mut *tx)
        .await?;
        if task == Task::Backfill {
            // The application's "before", for a latency budget relative to it.
            let rows = super::routers::live_routers_in(&mut tx, &migration.collection).await?;
            let baseline = crate::throttle::app_baseline_ms(&super::routers::reports(&rows));
            sqlx::query("UPDATE migrations SET app_p99_baseline_ms = $2 WHERE id = $1")
                .bind(migration_id)
                .bind(baseline)
                .execute(&mut *tx)
                .await?;
        }
        let kind = match task {
            Task::Backfill => EventKind::BackfillPlanned,
            Task::Cleanup => EventKind::CleanupPlanned,
            Task::Revert => EventKind::RevertPlanned,
            Task::Verify => unreachable!("verify partitions belong to a reconciliation run"),
        };
        events::insert(&mut tx, &migration, actor, &NewEvent::new(kind, details)).await?;
        tx.commit().await?;
        Ok(true)
    }

    /// Plans the copy back to the source again when a router's lease lapsed after it began
    /// ([`super::gates`]): every revert partition starts over from its lower bound (a worker
    /// holding one loses its lease) and `revert_planned_at` moves to now, after the lapse.
    /// Only in `reverting`. Returns until when the lapsed router's last step may have landed,
    /// or `None` when the copy was current.
    pub async fn replan_revert_if_outdated(
        &self,
        migration_id: i64,
        actor: &str,
    ) -> StoreResult<Option<DateTime<Utc>>> {
        let mut tx = self.pool().begin().await?;
        let migration = migration_for_update(&mut tx, migration_id).await?;
        if migration.phase() != crate::phase::Phase::Reverting {
            return Ok(None);
        }
        let Some(lapse) = super::gates::revert_outdated(&mut tx, &migration).await? else {
            return Ok(None);
        };
        // A leased partition stays leased, under a token nobody holds: its holder's next
        // checkpoint or renewal finds the lease gone, and the claim takes the partition over
        // only once the lease and its margin ran out, when every mirror the holder sent has
        // ended (found by the protocol model: made pending at once, a late mirror of the old
        // pass could land after the new one and the seal, and bring back a deleted document).
        let reset = sqlx::query(
            "UPDATE partitions SET
                 state = CASE WHEN state = 'leased' THEN 'leased' ELSE 'pending' END,
                 lease_token = CASE WHEN state = 'leased' THEN gen_random_uuid() END,
                 lease_owner = CASE WHEN state = 'leased' THEN lease_owner END,
                 lease_expires_at = CASE WHEN state = 'leased' THEN lease_expires_at END,
                 last_id = NULL, scanned = 0, inserted = 0,
                 already_present = 0, stamped = 0, dead_lettered = 0, deleted = 0, kept = 0,
                 skipped_foreign = 0, outcomes = '{}'::jsonb, started_at = NULL,
                 finished_at = NULL
             WHERE migration_id = $1 AND task = 'revert'",
        )
        .bind(migration_id)
        .execute(&mut *tx)
        .await?
        .rows_affected();
        // The clock now, not the transaction's start: later than every lapse counted above.
        sqlx::query("UPDATE migrations SET revert_planned_at = clock_timestamp() WHERE id = $1")
            .bind(migration_id)
            .execute(&mut *tx)
            .await?;
        let details = json!({
            "again": true,
            "partitions": reset,
            "router_lapsed_until": lapse,
        });
        events::insert(
            &mut tx,
            &migration,
            actor,
            &NewEvent::new(EventKind::RevertPlanned, details),
        )
        .await?;
        tx.commit().await?;
        tracing::warn!(
            migration_id = migration_id,
            partitions = reset,
            lapsed_until = %lapse,
            "a router's lease lapsed after the copy back began: it runs again"
        );
        Ok(Some(lapse))
    }

    /// The highest partition id of `task` a worker may claim now. Cleanup goes in waves: the
    /// first `waves[0]` percent of its partitions, then up to `waves[1]` once those are done,
    /// then all; other tasks are not limited (`None`).
    pub async fn claim_bound(
        &self,
        migration_id: i64,
        task: Task,
        waves: [f64; 3],
    ) -> StoreResult<Option<i64>> {
        if task != Task::Cleanup {
            return Ok(None);
        }
        let rows: Vec<(i64, bool)> = sqlx::query_as(
            "SELECT id, state = 'done' FROM partitions
             WHERE migration_id = $1 AND task = 'cleanup' ORDER BY id",
        )
        .bind(migration_id)
        .fetch_all(self.pool())
        .await?;
        Ok(wave_bound(&rows, waves))
    }
    /// Claims one pending partition of `task` (or one whose lease and fence margin have
    /// passed) with a fresh lease. Concurrent claimers skip each other's locked rows, so each
    /// partition goes to one.
    pub async fn claim_partition(
        &self,
        migration_id: i64,
        task: Task,
        claim: &Claim,
        up_to: Option<i64>,
    ) -> StoreResult<Option<Partition>> {
        self.claim(Claimant::Migration(migration_id), task, claim, up_to)
            .await
    }

    /// The one claim statement, for a migration's partitions or a reconciliation run's. A
    /// leased partition is taken over only once its lease ran out and then its holder's fence
    /// margin passed (by `clock_timestamp()`): the holder stopped writing a margin before its
    /// lease ended, and every command it sent ended by then.
    pub(super) async fn claim(
        &self,
        of: Claimant,
        task: Task,
        claim: &Claim,
        up_to: Option<i64>,
    ) -> StoreResult<Option<Partition>> {
        let (column, key) = match of {
            Claimant::Migration(id) => ("migration_id", id),
            Claimant::Run(id) => ("run_id", id),
        };
        // `picked` keeps the expired holder's name for the log of a takeover.
        Ok(sqlx::query_as(&format!(
            "WITH picked AS (
                 SELECT id AS picked_id,
                        CASE WHEN state = 'leased' THEN lease_owner END AS taken_over_from
                 FROM partitions
                 WHERE {column} = $1 AND task = $2
                   AND (state = 'pending'
                        OR (state = 'leased'
                            AND lease_expires_at + fence_margin < clock_timestamp()))
                   AND ($6::bigint IS NULL OR id <= $6)
                 ORDER BY id LIMIT 1 FOR UPDATE SKIP LOCKED)
             UPDATE partitions SET state = 'leased', lease_token = $3, lease_owner = $4,
                 lease_expires_at = now() + make_interval(secs => $5), attempts = attempts + 1,
                 stalls = stalls + 1,
                 fence_margin = make_interval(secs => $7),
                 started_at = coalesce(started_at, now())
             FROM picked WHERE partitions.id = picked.picked_id
             RETURNING {PARTITION_COLUMNS}, picked.taken_over_from"
        ))
        .bind(key)
        .bind(task)
        .bind(claim.token)
        .bind(&claim.owner)
        .bind(claim.ttl.as_secs_f64())
        .bind(up_to)
        .bind(claim.fence_margin.as_secs_f64())
        .fetch_optional(self.pool())
        .await?)
    }

    /// Extends a lease; `false` means the lease is no longer ours.
    pub async fn extend_partition_lease(
        &self,
        id: i64,
        token: Uuid,
        ttl: std::time::Duration,
    ) -> StoreResult<bool> {
        let r = sqlx::query(
            "UPDATE partitions SET lease_expires_at = now() + make_interval(secs => $3)
             WHERE id = $1 AND lease_token = $2 AND state = 'leased'",
        )
        .bind(id)
        .bind(token)
        .bind(ttl.as_secs_f64())
        .execute(self.pool())
        .await?;
        Ok(r.rows_affected() == 1)
    }

    /// Records a batch: the resume point, the counters and the batch's dead letters, in one
    /// transaction fenced by the lease token. `false`: the lease is gone and nothing was stored.
    pub async fn checkpoint_partition(
        &self,
        partition: &Partition,
        token: Uuid,
        ttl: std::time::Duration,
        batch: &Checkpoint,
        actor: &str,
    ) -> StoreResult<bool> {
        let mut tx = self.pool().begin().await?;
        let r = sqlx::query(
            "UPDATE partitions SET last_id = $3, scanned = scanned + $4, inserted = inserted + $5,
                 already_present = already_present + $6, stamped = stamped + $7,
                 dead_lettered = dead_lettered + $8, skipped_foreign = skipped_foreign + $9,
                 lease_expires_at = now() + make_interval(secs => $10),
                 deleted = deleted + $11, kept = kept + $12, stalls = 0
             WHERE id = $1 AND lease_token = $2 AND state = 'leased'",
        )
        .bind(partition.id)
        .bind(token)
        .bind(&batch.last_id)
        .bind(batch.scanned)
        .bind(batch.inserted)
        .bind(batch.already_present)
        .bind(batch.stamped)
        .bind(batch.dead_lettered)
        .bind(batch.skipped_foreign)
        .bind(ttl.as_secs_f64())
        .bind(batch.deleted)
        .bind(batch.kept)
        .execute(&mut *tx)
        .await?;
        if r.rows_affected() != 1 {
            return Ok(false);
        }
        if let Some(through) = batch.pending_through {
            sqlx::query(
                "DELETE FROM pending_deletes
                 WHERE partition_id = $1 AND lease_token = $2 AND seq <= $3",
            )
            .bind(partition.id)
            .bind(token)
            .bind(through as i64)
            .execute(&mut *tx)
            .await?;
        }
        for d in &batch.dead_letters {
            sqlx::query(
                "INSERT INTO dead_letters (migration_id, partition_id, doc_id, doc_id_text, target,
                     source_shard, source_collection, code, code_name, message, attempts)
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)",
            )
            .bind(partition.migration_id)
            .bind(partition.id)
            .bind(&d.doc_id)
            .bind(&d.doc_id_text)
            .bind(&d.target)
            .bind(&partition.source_shard)
            .bind(&partition.source_collection)
            .bind(d.code)
            .bind(&d.code_name)
            .bind(&d.message)
            .bind(d.attempts)
            .execute(&mut *tx)
            .await?;
        }
        if let Some(first) = batch.dead_letters.first() {
            // In the same transaction as the dead letters: the event says what the rows hold.
            let migration = migration_in(&mut tx, partition.migration_id).await?;
            let event = NewEvent::new(
                EventKind::DeadLettered,
                json!({
                    "partition": partition.id,
                    "task": partition.task.as_str(),
                    "location": partition.location().to_string(),
                    "documents": batch.dead_letters.len(),
                    "first_ids": batch
                        .dead_letters
                        .iter()
                        .take(5)
                        .map(|d| crate::ids::extjson_encoded(&d.doc_id))
                        .collect::<Vec<_>>(),
                    "target": first.target,
                    "code": first.code,
                    "code_name": first.code_name,
                }),
            )
            .reason(Some(&first.message));
            events::insert(&mut tx, &migration, actor, &event).await?;
        }
        tx.commit().await?;
        Ok(true)
    }

    /// A holder's command ran out of the time its lease left: the partition's batches are cut
    /// to `batch_limit` documents for whoever works on it next, the timeout and `reason` are
    /// recorded, and the attempt counts as one that recorded nothing. The partition stays
    /// leased to `token` (the holder starts again from its checkpoint); `None` when the lease
    /// is no longer its. Returns the row as it is now (its checkpoint).
    pub async fn time_out_partition(
        &self,
        id: i64,
        token: Uuid,
        ttl: std::time::Duration,
        batch_limit: usize,
        reason: &str,
    ) -> StoreResult<Option<Partition>> {
        Ok(sqlx::query_as(&format!(
            "UPDATE partitions SET batch_limit = $3, timeouts = timeouts + 1,
                 stalls = stalls + 1, last_failure = $4,
                 lease_expires_at = now() + make_interval(secs => $5)
             WHERE id = $1 AND lease_token = $2 AND state = 'leased'
             RETURNING {PARTITION_COLUMNS}"
        ))
        .bind(id)
        .bind(token)
        .bind(batch_limit.clamp(1, i32::MAX as usize) as i32)
        .bind(reason)
        .bind(ttl.as_secs_f64())
        .fetch_optional(self.pool())
        .await?)
    }

    /// Records why an attempt on a partition ended before the partition did (kept for
    /// `status` and the stall report).
    pub async fn note_partition_failure(&self, id: i64, reason: &str) -> StoreResult<()> {
        sqlx::query("UPDATE partitions SET last_failure = $2 WHERE id = $1")
            .bind(id)
            .bind(reason)
            .execute(self.pool())
            .await?;
        Ok(())
    }

    /// Records the ids a cleanup holder is about to delete (batch `seq` of its attempt),
    /// fenced by its lease: `false` when the lease is no longer its (nothing may be sent).
    pub async fn record_pending_deletes(
        &self,
        partition: i64,
        token: Uuid,
        seq: u64,
        ids: &[Vec<u8>],
    ) -> StoreResult<bool> {
        let r = sqlx::query(
            "INSERT INTO pending_deletes (partition_id, lease_token, seq, ids)
             SELECT $1, $2, $3, $4 FROM partitions
             WHERE id = $1 AND lease_token = $2 AND state = 'leased'
             ON CONFLICT (partition_id, lease_token, seq) DO UPDATE SET ids = excluded.ids",
        )
        .bind(partition)
        .bind(token)
        .bind(seq as i64)
        .bind(ids)
        .execute(self.pool())
        .await?;
        Ok(r.rows_affected() == 1)
    }

    /// The ids of deletes sent on `partition` and never checkpointed, by any holder.
    pub async fn pending_deletes(&self, partition: i64) -> StoreResult<Vec<Vec<u8>>> {
        let rows: Vec<(Vec<Vec<u8>>,)> = sqlx::query_as(
            "SELECT ids FROM pending_deletes WHERE partition_id = $1 ORDER BY lease_token, seq",
        )
        .bind(partition)
        .fetch_all(self.pool())
        .await?;
        Ok(rows.into_iter().flat_map(|(ids,)| ids).collect())
    }

    /// Records the deletions an earlier attempt made after its last checkpoint (`gone`: the
    /// pending ids the source no longer holds) as scanned and deleted, and forgets every
    /// pending delete of the partition, in one transaction fenced by `token`. `false`: the
    /// lease is no longer ours and nothing was stored.
    pub async fn recount_pending_deletes(
        &self,
        partition: i64,
        token: Uuid,
        gone: u64,
    ) -> StoreResult<bool> {
        let mut tx = self.pool().begin().await?;
        let r = sqlx::query(
            "UPDATE partitions SET scanned = scanned + $3, deleted = deleted + $3
             WHERE id = $1 AND lease_token = $2 AND state = 'leased'",
        )
        .bind(partition)
        .bind(token)
        .bind(gone as i64)
        .execute(&mut *tx)
        .await?;
        if r.rows_affected() != 1 {
            return Ok(false);
        }
        sqlx::query("DELETE FROM pending_deletes WHERE partition_id = $1")
            .bind(partition)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(true)
    }

    /// Records the estimated size of a partition planned without reading it (progress and
    /// ETA only: the ledger does not depend on it).
    pub async fn set_partition_size(&self, id: i64, documents: u64) -> StoreResult<()> {
        sqlx::query(
            "UPDATE partitions SET approx_documents = $2 WHERE id = $1 AND approx_documents IS NULL",
        )
        .bind(id)
        .bind(documents as i64)
        .execute(self.pool())
        .await?;
        Ok(())
    }

    /// Marks a partition done; `false` when the lease is no longer ours.
    pub async fn finish_partition(&self, id: i64, token: Uuid) -> StoreResult<bool> {
        let r = sqlx::query(
            "UPDATE partitions SET state = 'done', finished_at = now(), lease_token = NULL,
                 lease_expires_at = NULL
             WHERE id = $1 AND lease_token = $2 AND state = 'leased'",
        )
        .bind(id)
        .bind(token)
        .execute(self.pool())
        .await?;
        Ok(r.rows_affected() == 1)
    }

    /// Gives a partition back (the worker is stopping or the migration paused); its
    /// checkpoint stays, so the next claimer resumes after the last recorded batch.
    pub async fn release_partition(&self, id: i64, token: Uuid) -> StoreResult<bool> {
        let r = sqlx::query(
            "UPDATE partitions SET state = 'pending', lease_token = NULL, lease_owner = NULL,
                 lease_expires_at = NULL
             WHERE id = $1 AND lease_token = $2 AND state = 'leased'",
        )
        .bind(id)
        .bind(token)
        .execute(self.pool())
        .await?;
        Ok(r.rows_affected() == 1)
    }

    /// The partitions of a migration's task, in id order.
    pub async fn partitions(&self, migration_id: i64, task: Task) -> StoreResult<Vec<Partition>> {
        Ok(sqlx::query_as(&format!(
            "SELECT {PARTITION_COLUMNS} FROM partitions
             WHERE migration_id = $1 AND task = $2 ORDER BY id"
        ))
        .bind(migration_id)
        .bind(task)
        .fetch_all(self.pool())
        .await?)
    }

    /// One partition.
    pub async fn partition(&self, id: i64) -> StoreResult<Partition> {
        sqlx::query_as(&format!(
            "SELECT {PARTITION_COLUMNS} FROM partitions WHERE id = $1"
        ))
        .bind(id)
        .fetch_optional(self.pool())
        .await?
        .ok_or_else(|| StoreError::NotFound(format!("no partition with id {id}")))
    }

    /// Sums of a task's counters.
    pub async fn task_totals(&self, migration_id: i64, task: Task) -> StoreResult<TaskTotals> {
        Ok(sqlx::query_as(
            "SELECT count(*) AS partitions,
                    count(*) FILTER (WHERE state = 'done') AS done,
                    count(*) FILTER (WHERE state = 'leased' AND lease_expires_at > now()) AS leased,
                    coalesce(sum(scanned), 0)::bigint AS scanned,
                    coalesce(sum(inserted), 0)::bigint AS inserted,
                    coalesce(sum(already_present), 0)::bigint AS already_present,
                    coalesce(sum(stamped), 0)::bigint AS stamped,
                    coalesce(sum(dead_lettered), 0)::bigint AS dead_lettered,
                    coalesce(sum(skipped_foreign), 0)::bigint AS skipped_foreign,
                    coalesce(sum(deleted), 0)::bigint AS deleted,
                    coalesce(sum(kept), 0)::bigint AS kept,
                    coalesce(sum(approx_documents), 0)::bigint AS approx_documents
             FROM partitions WHERE migration_id = $1 AND task = $2",
        )
        .bind(migration_id)
        .bind(task)
        .fetch_one(self.pool())
        .await?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_phase_s_task_and_a_task_s_phase_are_inverses() {
        let tasks = [Task::Backfill, Task::Verify, Task::Cleanup, Task::Revert];
        for task in tasks {
            assert_eq!(Task::of(task.phase()), Some(task));
        }
        for phase in crate::phase::Phase::ALL {
            if let Some(task) = Task::of(phase) {
                assert_eq!(task.phase(), phase);
            }
        }
        let worked: Vec<Task> = crate::phase::Phase::ALL
            .into_iter()
            .filter_map(Task::for_workers)
            .collect();
        assert_eq!(worked, [Task::Backfill, Task::Cleanup, Task::Revert]);
    }

    #[test]
    fn cleanup_waves_open_one_after_another() {
        let waves = [1.0, 10.0, 100.0];
        let rows = |done: usize| -> Vec<(i64, bool)> {
            (1..=200).map(|i| (i, (i as usize) <= done)).collect()
        };
        // 1% of 200 = 2 partitions first.
        assert_eq!(wave_bound(&rows(0), waves), Some(2));
        assert_eq!(wave_bound(&rows(1), waves), Some(2));
        // Then up to 10% = 20.
        assert_eq!(wave_bound(&rows(2), waves), Some(20));
        assert_eq!(wave_bound(&rows(19), waves), Some(20));
        // Then everything.
        assert_eq!(wave_bound(&rows(20), waves), Some(200));
        // A tiny plan still starts with one partition.
        assert_eq!(wave_bound(&[(7, false), (9, false)], waves), Some(7));
        assert_eq!(wave_bound(&[], waves), None);
    }
}

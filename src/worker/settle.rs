//! What a written batch settles: the writer's report becomes the partition's checkpoint
//! (counts, dead letters, the last id), and the deletes an earlier attempt on a cleanup
//! partition sent and never checkpointed are counted before this attempt scans.

use std::collections::HashSet;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use mongodb::bson::{doc, Bson};
use uuid::Uuid;

use crate::ids;
use crate::protocol::{self, CopyResult};
use crate::routing::Location;
use crate::shards::{FailureClass, StatementResult};
use crate::store::dead_letters::NewDeadLetter;
use crate::store::partitions::{Checkpoint, Partition};
use crate::store::StoreError;

use super::batch::Kind;
use super::{PartitionEnd, Shared, Worker};

impl Worker {
    /// What a written batch brings to its partition's checkpoint, from the writer's report;
    /// `Err` when the batch may not be recorded (a write past the lease's deadline, or a
    /// statement that failed transiently on every attempt).
    pub(super) fn settle(
        &self,
        shared: &Shared,
        report: crate::shards::BatchReport,
        latency: Duration,
        batch: Unsettled,
        location: &Location,
    ) -> Result<Settled, PartitionEnd> {
        let c = &shared.counters;
        c.retries
            .fetch_add(report.retries as i64, Ordering::Relaxed);
        c.overloads
            .fetch_add(report.overload_events as i64, Ordering::Relaxed);
        crate::telemetry::overloads(
            shared.migration,
            shared.task.as_str(),
            report.overload_events,
        );
        if report.counts.expired > 0 {
            // Past the lease's deadline: nothing of this batch may be recorded, and the
            // partition is not released either: what the command did is unknown until a
            // fence margin after its deadline. The lease itself is still ours (a lost one is
            // the keeper's or a checkpoint's finding).
            return Err(PartitionEnd::TimedOut {
                statements: batch.kinds.len(),
                documents: batch.documents,
                budget: batch.budget,
                location: location.clone(),
            });
        }
        let cut = shared
            .rate
            .lock()
            .unwrap()
            .on_batch(latency, Instant::now());
        if cut {
            c.rate_cuts.fetch_add(1, Ordering::Relaxed);
        }
        let applied = shared.rate.lock().unwrap().applied();
        crate::telemetry::rate(shared.migration, shared.task.as_str(), applied, cut);
        let mut checkpoint = batch.checkpoint;
        for (i, result) in report.results.iter().enumerate() {
            match result {
                StatementResult::Inserted
                | StatementResult::AlreadyPresent
                | StatementResult::DroppedDuplicate { .. } => {
                    match result
                        .insert_answer()
                        .as_ref()
                        .and_then(protocol::copy_result)
                    {
                        Some(CopyResult::Inserted) => checkpoint.inserted += 1,
                        Some(CopyResult::AlreadyPresent) => checkpoint.already_present += 1,
                        None => unreachable!("an insert's result answers the insert"),
                    }
                }
                StatementResult::Applied => match batch.kinds[i] {
                    Kind::Stamp => checkpoint.stamped += 1,
                    Kind::Delete => checkpoint.deleted += 1,
                    Kind::Copy | Kind::Mirror => checkpoint.inserted += 1,
                },
                StatementResult::Expired => unreachable!("handled above"),
                StatementResult::DeadLettered {
                    class: FailureClass::Permanent,
                    code,
                    code_name,
                    message,
                    attempts,
                    ..
                } => {
                    let id = &batch.ids[i];
                    checkpoint.dead_lettered += 1;
                    checkpoint.dead_letters.push(NewDeadLetter {
                        doc_id: ids::encode(id),
                        doc_id_text: ids::text(id),
                        target: Some(batch.targets[i].to_string()),
                        code: *code,
                        code_name: code_name.clone(),
                        message: message.clone(),
                        attempts: *attempts as i32,
                    });
                }
                StatementResult::DeadLettered {
                    code,
                    message,
                    attempts,
                    ..
                } => {
                    return Err(PartitionEnd::Retry(format!(
                        "writing to {} failed {attempts} times (code {code:?}): {message}",
                        batch.targets[i]
                    )));
                }
            }
        }
        checkpoint.last_id = ids::encode(&batch.last_id);
        Ok(Settled {
            checkpoint,
            took: batch.started.elapsed(),
        })
    }

    /// Counts the deletes an earlier attempt on a cleanup partition sent and never
    /// checkpointed ([`Store::pending_deletes`]): those whose ids the source no longer holds
    /// were applied ([`protocol::applied_pending_deletes`]) and go into the ledger as scanned
    /// and deleted; the others are still in the source, after the checkpoint, and this
    /// attempt's scan meets them. Runs once the earlier holder can write no more (a takeover
    /// comes a fence margin after its lease; a holder starting again waited as long).
    /// `Ok(false)`: the lease is no longer ours.
    pub(super) async fn recount_pending_deletes(
        &self,
        p: &Partition,
        token: Uuid,
        location: &Location,
    ) -> Result<bool, RecountError> {
        let pending = self.store.pending_deletes(p.id).await?;
        if pending.is_empty() {
            return Ok(true);
        }
        let mut sent = Vec::with_capacity(pending.len());
        for bytes in &pending {
            sent.push(ids::decode(bytes).map_err(|e| RecountError::Read(e.to_string()))?);
        }
        let mut present = HashSet::new();
        for chunk in sent.chunks(1_000) {
            let found = self
                .shards
                .find_by_ids(location, chunk, Some(doc! { "_id": 1 }))
                .await
                .map_err(|e| RecountError::Read(e.to_string()))?;
            present.extend(found.into_keys());
        }
        let keys: Vec<Vec<u8>> = sent.iter().map(ids::key).collect();
        let applied = protocol::applied_pending_deletes(&keys, &present);
        if !self
            .store
            .recount_pending_deletes(p.id, token, applied)
            .await?
        {
            return Ok(false);
        }
        tracing::info!(
            migration_id = p.migration_id,
            partition = p.id,
            location = %location,
            pending = sent.len(),
            deleted = applied,
            "counted the deletions an earlier attempt made after its last checkpoint"
        );
        Ok(true)
    }
}

/// Why the deletes of an earlier attempt could not be counted.
pub(super) enum RecountError {
    /// Reading the source failed (a failure that may pass: the partition is retried).
    Read(String),
    Store(StoreError),
}

impl From<StoreError> for RecountError {
    fn from(e: StoreError) -> Self {
        RecountError::Store(e)
    }
}

/// A batch sent, with what its checkpoint needs once the writer reports.
pub(super) struct Unsettled {
    pub(super) kinds: Vec<Kind>,
    pub(super) ids: Vec<Bson>,
    pub(super) targets: Vec<Location>,
    /// What was settled without writing.
    pub(super) checkpoint: Checkpoint,
    pub(super) last_id: Bson,
    /// When its documents were read.
    pub(super) started: Instant,
    /// The time its deadline left it when it was sent.
    pub(super) budget: Duration,
    /// Documents read for it.
    pub(super) documents: usize,
}

/// A batch that settled well: its part of the partition's checkpoint.
pub(super) struct Settled {
    pub(super) checkpoint: Checkpoint,
    /// From its read to its acknowledgement.
    pub(super) took: Duration,
}

/// Batches recorded by one checkpoint.
pub(super) struct Recorded {
    /// `false`: the lease is no longer this worker's.
    pub(super) kept: bool,
    /// When the checkpoint was sent (the lease runs from then).
    pub(super) started: Instant,
    pub(super) batches: Vec<Settled>,
}

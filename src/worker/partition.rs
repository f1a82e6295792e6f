//! The partition loop: claim a partition under a lease, read it through one cursor in `_id`
//! order with several batches in flight, settle each batch and record the checkpoints in order
//! behind them, fenced by the lease token; a lease lost stops the loop at once.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use mongodb::bson::{doc, Bson, Document, RawDocumentBuf};
use serde_json::json;
use tokio::sync::watch;
use uuid::Uuid;

use crate::envelope;
use crate::ids;
use crate::protocol;
use crate::routing::Location;
use crate::shards::read::Merge;
use crate::shards::Deadline;
use crate::store::events::{EventKind, NewEvent};
use crate::store::partitions::{Checkpoint, Claim, Partition, Task};
use crate::store::StoreError;

use super::batch::{
    place_mirrors, prepare_batch, prepare_revert, skip_mirrored, Kind, PreparedBatch,
};
use super::plan;
use super::settle::{Recorded, RecountError, Settled, Unsettled};
use super::{PartitionEnd, Shared, Worker, WorkerError};

impl Worker {
    /// Claims and works partitions one after another.
    pub(super) async fn partition_loop(
        &self,
        shared: Arc<Shared>,
        shutdown: watch::Receiver<bool>,
    ) -> Result<(), WorkerError> {
        let mut failures = 0_u32;
        while shared.runnable.load(Ordering::SeqCst) && !*shutdown.borrow() {
            let claim = Claim {
                token: Uuid::new_v4(),
                owner: self.config.name.clone(),
                ttl: self.config.lease_ttl,
                fence_margin: self.fence_margin(),
            };
            let token = claim.token;
            let waves = shared.settings.lock().unwrap().cleanup_waves;
            let bound = self
                .store
                .claim_bound(shared.migration, shared.task, waves)
                .await?;
            let claimed_at = Instant::now();
            let Some(p) = self
                .store
                .claim_partition(shared.migration, shared.task, &claim, bound)
                .await?
            else {
                return Ok(());
            };
            match &p.taken_over_from {
                // An event: its row, its log line and its metric.
                Some(holder) => {
                    let resumes = p.last_id.as_deref().map(|b| {
                        ids::decode(b).map_or_else(|e| format!("<{e}>"), |id| ids::text(&id))
                    });
                    self.store
                        .record_event(
                            shared.migration,
                            &self.config.actor,
                            &NewEvent::new(
                                EventKind::PartitionTakenOver,
                                json!({
                                    "worker": self.config.name,
                                    "task": shared.task.as_str(),
                                    "partition": p.id,
                                    "location": p.location().to_string(),
                                    "range": range_text(&p),
                                    "from": holder,
                                    "resumes_after": resumes,
                                }),
                            )
                            .reason(Some("its holder's lease ran out")),
                        )
                        .await?;
                }
                None => tracing::info!(
                    migration_id = shared.migration,
                    task = %shared.task,
                    partition = p.id,
                    location = %p.location(),
                    range = %range_text(&p),
                    resumes = p.last_id.is_some(),
                    "partition claimed"
                ),
            }
            crate::telemetry::claimed(shared.migration, shared.task.as_str(), p.attempts > 1);
            self.report_stall(&shared, &p).await?;
            let (mut p, mut claimed_at) = (p, claimed_at);
            let end = loop {
                let end = self
                    .work_partition(&shared, &p, token, claimed_at, &shutdown)
                    .await?;
                let PartitionEnd::TimedOut {
                    statements,
                    documents,
                    budget,
                    location,
                } = end
                else {
                    break end;
                };
                // The lease is still ours: the holder goes on, from its checkpoint, with
                // batches half the size of the one that ran out of time. The cut is stored
                // with the partition, so a worker that takes it over starts from it too.
                let limit = (documents / 2).max(1);
                let reason = format!(
                    "a batch of {statements} statement(s) to {location} did not finish within \
                     the {:.1}s its lease left it",
                    budget.as_secs_f64()
                );
                crate::telemetry::partition_timed_out(shared.migration, shared.task.as_str());
                tracing::warn!(
                    migration_id = shared.migration,
                    task = %shared.task,
                    partition = p.id,
                    batch_limit = limit,
                    "{reason}: the partition goes on from its checkpoint with batches of at most \
                     {limit} document(s)"
                );
                // What the timed-out command did is unknown until its deadline and a fence
                // margin have passed (the server ends it by `maxTimeMS`, counted from when it
                // arrived); every command of the attempt has settled or expired by now.
                tokio::select! {
                    _ = tokio::time::sleep(self.fence_margin()) => {}
                    _ = stopped(shutdown.clone()) => {}
                }
                let renewed = Instant::now();
                match self
                    .store
                    .time_out_partition(p.id, token, self.config.lease_ttl, limit, &reason)
                    .await?
                {
                    Some(now) => {
                        p = now;
                        claimed_at = renewed;
                    }
                    None => break PartitionEnd::LeaseLost,
                }
                self.report_stall(&shared, &p).await?;
                if !shared.runnable.load(Ordering::SeqCst) || *shutdown.borrow() {
                    self.store.release_partition(p.id, token).await?;
                    break PartitionEnd::Released;
                }
            };
            match end {
                PartitionEnd::TimedOut { .. } => unreachable!("started again above"),
                PartitionEnd::Done => {
                    failures = 0;
                    crate::telemetry::partition_done(shared.migration, shared.task.as_str());
                    shared
                        .counters
                        .partitions_done
                        .fetch_add(1, Ordering::Relaxed);
                    let done = self.store.partition(p.id).await?;
                    tracing::info!(
                        migration_id = shared.migration,
                        task = %shared.task,
                        partition = p.id,
                        location = %p.location(),
                        scanned = done.scanned,
                        inserted = done.inserted,
                        already_present = done.already_present,
                        stamped = done.stamped,
                        dead_lettered = done.dead_lettered,
                        deleted = done.deleted,
                        kept = done.kept,
                        "partition finished"
                    );
                }
                PartitionEnd::Released => {}
                PartitionEnd::LeaseLost => {
                    shared.counters.leases_lost.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(
                        migration_id = shared.migration,
                        task = %shared.task,
                        partition = p.id,
                        "lease lost: the partition's lease ran out before this worker renewed \
                         it (a state-store write that waited, or a pause of the process), and \
                         another worker may hold it now; this worker stopped writing to it"
                    );
                }
                PartitionEnd::Retry(why) => {
                    self.store.note_partition_failure(p.id, &why).await?;
                    failures += 1;
                    let wait = crate::shards::writer::backoff_ceiling(
                        failures,
                        Duration::from_millis(500),
                        Duration::from_secs(30),
                    );
                    tracing::warn!(
                        partition = p.id,
                        retry_in_ms = wait.as_millis() as u64,
                        "partition released after a failure that may pass: {why}"
                    );
                    self.store.release_partition(p.id, token).await?;
                    tokio::select! {
                        _ = tokio::time::sleep(wait) => {}
                        _ = stopped(shutdown.clone()) => {}
                    }
                }
            }
        }
        Ok(())
    }

    /// Reports a partition whose last attempts in a row recorded nothing
    /// ([`crate::store::partitions::STALLED_AFTER`]), when it stalls and again each time the
    /// count doubles: an event (its row, log line and metric), so that a partition taken over
    /// again and again, or timing out at its smallest batch, is seen rather than retried in
    /// silence.
    pub(super) async fn report_stall(
        &self,
        shared: &Shared,
        p: &Partition,
    ) -> Result<(), WorkerError> {
        let after = crate::store::partitions::STALLED_AFTER;
        if p.stalls < after
            || p.stalls % after != 0
            || !(p.stalls / after).unsigned_abs().is_power_of_two()
        {
            return Ok(());
        }
        crate::telemetry::partition_stalled(shared.migration, shared.task.as_str());
        let last = p
            .last_failure
            .as_deref()
            .unwrap_or("its holder's lease ran out");
        self.store
            .record_event(
                shared.migration,
                &self.config.actor,
                &NewEvent::new(
                    EventKind::PartitionStalled,
                    json!({
                        "worker": self.config.name,
                        "task": shared.task.as_str(),
                        "partition": p.id,
                        "location": p.location().to_string(),
                        "range": range_text(p),
                        "stalls": p.stalls,
                        "attempts": p.attempts,
                        "timeouts": p.timeouts,
                        "batch_limit": p.batch_limit,
                        "last_failure": p.last_failure,
                    }),
                )
                .reason(Some(&format!(
                    "partition {} has been attempted {} times in a row without recording \
                     anything; last: {last}",
                    p.id, p.stalls
                ))),
            )
            .await?;
        Ok(())
    }

    /// Reads one partition through one cursor and writes it with up to
    /// `max_in_flight_per_shard` batches in flight (reading, preparing and writing overlap),
    /// every write ending by the partition lease's deadline. Checkpoints follow the writes in
    /// order ([`protocol::BatchWindow`]), off the writes' path: while one is being recorded,
    /// the batches settling meanwhile wait and go into the next, one statement for several.
    /// Before the partition is released or finished, every write sent has settled.
    pub(super) async fn work_partition(
        &self,
        shared: &Arc<Shared>,
        p: &Partition,
        token: Uuid,
        claimed_at: Instant,
        shutdown: &watch::Receiver<bool>,
    ) -> Result<PartitionEnd, WorkerError> {
        let invalid = |message: String| WorkerError::Invalid {
            migration: shared.migration,
            message: format!("partition {}: {message}", p.id),
        };
        let location = p.location();
        let filter = plan::partition_filter(&shared.from, p, true).map_err(invalid)?;

        // The lease, on this worker's monotonic clock: extended by every checkpoint and, while
        // a batch takes long, by the keeper. Its deadline (a fence margin before it ends)
        // bounds every write ([`BulkWriter::write_until`]).
        let lease = Arc::new(Mutex::new(claimed_at + self.config.lease_ttl));
        let lost = Arc::new(AtomicBool::new(false));
        let keeper = {
            let (store, lost, ttl) = (self.store.clone(), lost.clone(), self.config.lease_ttl);
            let (id, lease) = (p.id, lease.clone());
            tokio::spawn(async move {
                loop {
                    tokio::time::sleep(ttl / 3).await;
                    let started = Instant::now();
                    match store.extend_partition_lease(id, token, ttl).await {
                        Ok(true) => *lease.lock().unwrap() = started + ttl,
                        Ok(false) => {
                            lost.store(true, Ordering::SeqCst);
                            return;
                        }
                        Err(e) => tracing::warn!(partition = id, "lease heartbeat failed: {e}"),
                    }
                }
            })
        };
        let _keeper = AbortOnDrop(keeper);
        // Deletes an earlier attempt sent and never checkpointed are counted first: the
        // documents they removed are no longer there for this attempt's scan to count.
        if shared.task == Task::Cleanup {
            match self.recount_pending_deletes(p, token, &location).await {
                Ok(true) => {}
                Ok(false) => return Ok(PartitionEnd::LeaseLost),
                Err(RecountError::Read(e)) => return Ok(PartitionEnd::Retry(e)),
                Err(RecountError::Store(e)) => return Err(e.into()),
            }
        }
        // The partition's batch limit (cut by a holder whose command ran out of time, and
        // grown back here while batches finish well within their time).
        let limit = Arc::new(AtomicUsize::new(
            p.batch_limit.map_or(usize::MAX, |l| l.max(1) as usize),
        ));
        let batch_size: Arc<dyn Fn() -> usize + Send + Sync> = {
            let (shared, limit) = (shared.clone(), limit.clone());
            Arc::new(move || shared.batch_size().min(limit.load(Ordering::Relaxed)))
        };
        // Cleanup looks its documents up (the protocol's lookup step, on the side it names:
        // the target) in that side's locations' own scans of the range. Every scan is opened
        // at once: a server may answer a sorted query only once it has read the whole range
        // (the local stand-in does), and those waits should overlap.
        let targets: Vec<Location> = match shared.task {
            Task::Cleanup => {
                let lookup = protocol::cleanup_lookup_step::<(), ()>();
                let side = crate::copy::steps::read_side(&lookup)
                    .expect("cleanup's lookup step is a read");
                shared
                    .layout(side)
                    .locations()
                    .into_iter()
                    .filter(|t| *t != location)
                    .collect()
            }
            _ => Vec::new(),
        };
        let projection = doc! { "_id": 1, format!("{}.deleted", envelope::META): 1 };
        let read = async {
            Ok(match shared.task {
                // The backfill copies the bytes it read: only routing fields are parsed.
                Task::Backfill => PartitionScan::Raw(
                    self.shards
                        .scan_raw(&location, filter.clone(), batch_size.clone())
                        .await?,
                ),
                _ => PartitionScan::Parsed(
                    self.shards
                        .scan(&location, filter.clone(), batch_size.clone())
                        .await?,
                ),
            })
        };
        let opened = futures::future::try_join(
            read,
            futures::future::try_join_all(targets.iter().map(|target| {
                self.shards.scan_with(
                    target,
                    filter.clone(),
                    Some(projection.clone()),
                    batch_size.clone(),
                )
            })),
        )
        .await;
        let (mut scan, mut cleanup_targets): (_, BTreeMap<Location, Merge>) = match opened {
            Ok((scan, target_scans)) => (
                scan,
                targets
                    .into_iter()
                    .zip(target_scans.into_iter().map(Merge::new))
                    .collect(),
            ),
            Err(e) => return Ok(PartitionEnd::Retry(e.to_string())),
        };

        let mut window: protocol::BatchWindow<Settled> = protocol::BatchWindow::default();
        let mut writes = futures::stream::FuturesUnordered::new();
        let mut recording: Option<tokio::task::JoinHandle<Result<Recorded, StoreError>>> = None;
        let mut unrecorded: Vec<Settled> = Vec::new();
        let mut read_all = false;
        // Why the partition stops being worked on, once it does: nothing more is sent, what
        // is in flight settles, what may be recorded is, and then this is the answer.
        let mut end: Option<PartitionEnd> = None;
        let mut failure: Option<WorkerError> = None;
        let mut record_failed = false;
        let mut missing: Option<String> = None;
        loop {
            unrecorded.extend(window.recordable());
            if record_failed {
                unrecorded.clear();
            }
            if recording.is_none() && !unrecorded.is_empty() && end_allows_recording(&end) {
                if lost.load(Ordering::SeqCst) {
                    end = Some(PartitionEnd::LeaseLost);
                    unrecorded.clear();
                } else {
                    let batches = std::mem::take(&mut unrecorded);
                    let (store, partition, ttl) =
                        (self.store.clone(), p.clone(), self.config.lease_ttl);
                    let actor = self.config.actor.clone();
                    recording = Some(tokio::spawn(async move {
                        let started = Instant::now();
                        let mut checkpoint = Checkpoint::default();
                        for b in &batches {
                            checkpoint.absorb(b.checkpoint.clone());
                        }
                        let kept = store
                            .checkpoint_partition(&partition, token, ttl, &checkpoint, &actor)
                            .await?;
                        Ok(Recorded {
                            kept,
                            started,
                            batches,
                        })
                    }));
                }
            }
            let settled_all = writes.is_empty() && recording.is_none();
            if settled_all && (unrecorded.is_empty() || !end_allows_recording(&end)) {
                if let Some(e) = failure {
                    return Err(e);
                }
                if let Some(reason) = missing {
                    self.fail_migration(shared, &reason).await?;
                    self.store.release_partition(p.id, token).await?;
                    return Ok(PartitionEnd::Released);
                }
                match end {
                    Some(PartitionEnd::Released) => {
                        self.store.release_partition(p.id, token).await?;
                        return Ok(PartitionEnd::Released);
                    }
                    Some(other) => return Ok(other),
                    None if read_all => {
                        return Ok(if self.store.finish_partition(p.id, token).await? {
                            PartitionEnd::Done
                        } else {
                            PartitionEnd::LeaseLost
                        });
                    }
                    None => {}
                }
            }
            if lost.load(Ordering::SeqCst) {
                end = Some(PartitionEnd::LeaseLost);
                unrecorded.clear();
            } else if end.is_none()
                && (!shared.runnable.load(Ordering::SeqCst) || *shutdown.borrow())
            {
                end = Some(PartitionEnd::Released);
            }
            let depth = shared
                .settings
                .lock()
                .unwrap()
                .max_in_flight_per_shard
                .max(1);
            let may_send =
                end.is_none() && !read_all && !window.broken() && window.in_flight() < depth;
            tokio::select! {
                read = scan.next_batch(), if may_send => {
                    let docs = match read {
                        Ok(docs) => docs,
                        Err(e) => {
                            PartitionEnd::outrank(&mut end, PartitionEnd::Retry(e.to_string()));
                            continue;
                        }
                    };
                    if docs.len() == 0 {
                        read_all = true;
                        continue;
                    }
                    let wait = shared
                        .rate
                        .lock()
                        .unwrap()
                        .permit(docs.len() as u64, Instant::now());
                    if !wait.is_zero() {
                        tokio::time::sleep(wait).await;
                    }
                    let last_id = docs.last_id();
                    let docs_read = docs.len();
                    let started = Instant::now();
                    let prepared = match (shared.task, docs) {
                        (Task::Backfill, ReadBatch::Raw(docs)) => {
                            prepare_batch(&shared.from, &shared.to, &location, shared.epoch, docs)
                        }
                        (Task::Backfill, ReadBatch::Parsed(docs)) => {
                            prepare_batch(&shared.from, &shared.to, &location, shared.epoch, docs)
                        }
                        (_, ReadBatch::Raw(_)) => unreachable!("only the backfill reads raw"),
                        (Task::Revert, ReadBatch::Parsed(docs)) => {
                            let mut prepared = prepare_revert(
                                &shared.from,
                                &shared.to,
                                shared.migration,
                                &location,
                                docs,
                            );
                            if let Err(e) = place_mirrors(&self.shards, &mut prepared).await {
                                PartitionEnd::outrank(&mut end, PartitionEnd::Retry(e.to_string()));
                                continue;
                            }
                            if let Err(e) =
                                skip_mirrored(&self.shards, &mut prepared, shared.migration).await
                            {
                                PartitionEnd::outrank(&mut end, PartitionEnd::Retry(e.to_string()));
                                continue;
                            }
                            prepared
                        }
                        (Task::Verify, _) => unreachable!("workers do not serve verify partitions"),
                        (Task::Cleanup, ReadBatch::Parsed(docs)) => match self
                    .prepare_cleanup(shared, &location, docs, &mut cleanup_targets)
                    .await
                {
                            Ok(Ok(prepared)) => prepared,
                            Ok(Err(reason)) => {
                                missing = Some(reason);
                                PartitionEnd::outrank(&mut end, PartitionEnd::Released);
                                continue;
                            }
                            Err(e) => {
                                failure = Some(e);
                                PartitionEnd::outrank(&mut end, PartitionEnd::Released);
                                continue;
                            }
                        },
                    };
                    // The lease's deadline, read again before each command: a batch waiting
                    // for a slow shard's permit gets the lease as renewed meanwhile.
                    let deadline = {
                        let (lease, margin) = (lease.clone(), self.fence_margin());
                        Deadline::read(move || {
                            lease
                                .lock()
                                .unwrap()
                                .checked_sub(margin)
                                .map(tokio::time::Instant::from_std)
                                .unwrap_or_else(tokio::time::Instant::now)
                        })
                    };
                    let n = window.send();
                    let documents = docs_read;
                    let PreparedBatch { statements, kinds, ids, targets, checkpoint, .. } = prepared;
                    // A cleanup batch's deletes are recorded before they are sent: once sent,
                    // the documents may be gone before any checkpoint counts them.
                    let deletes: Vec<Vec<u8>> = ids
                        .iter()
                        .zip(&kinds)
                        .filter(|(_, k)| **k == Kind::Delete)
                        .map(|(id, _)| ids::encode(id))
                        .collect();
                    if !deletes.is_empty() {
                        match self.store.record_pending_deletes(p.id, token, n, &deletes).await {
                            Ok(true) => {}
                            Ok(false) => {
                                window.settle(n, None);
                                end = Some(PartitionEnd::LeaseLost);
                                continue;
                            }
                            Err(e) => {
                                window.settle(n, None);
                                failure = Some(e.into());
                                PartitionEnd::outrank(&mut end, PartitionEnd::Released);
                                continue;
                            }
                        }
                    }
                    let writer = shared.writer();
                    let budget = deadline
                        .now()
                        .saturating_duration_since(tokio::time::Instant::now());
                    let write = tokio::spawn(async move {
                        let sent = Instant::now();
                        let report = writer.write_by(statements, Some(deadline)).await;
                        (report, sent.elapsed())
                    });
                    writes.push(async move {
                        let written = write.await;
                        (n, written, Unsettled { kinds, ids, targets, checkpoint, last_id, started, budget, documents })
                    });
                }
                Some((n, written, batch)) = futures::StreamExt::next(&mut writes), if !writes.is_empty() => {
                    let (report, latency) = match written {
                        Ok((Ok(report), latency)) => (report, latency),
                        Ok((Err(e), _)) => {
                            window.settle(n, None);
                            failure = Some(invalid(e.to_string()));
                            end.get_or_insert(PartitionEnd::Released);
                            continue;
                        }
                        Err(panicked) => {
                            window.settle(n, None);
                            failure = Some(invalid(format!("a write task failed: {panicked}")));
                            end.get_or_insert(PartitionEnd::Released);
                            continue;
                        }
                    };
                    let (documents, budget) = (batch.documents, batch.budget);
                    match self.settle(shared, report, latency, batch, &location) {
                        Ok(mut settled) => {
                            if shared.task == Task::Cleanup {
                                settled.checkpoint.pending_through = Some(n);
                            }
                            // A batch at the limit that took under a quarter of its time:
                            // the limit doubles back (a slow spell should not cut a large
                            // partition's batches for good).
                            let at = limit.load(Ordering::Relaxed);
                            if at != usize::MAX && documents >= at && latency < budget / 4 {
                                let configured = shared.settings.lock().unwrap().batch_size;
                                let grown = at.saturating_mul(2);
                                limit.store(
                                    if grown >= configured { usize::MAX } else { grown },
                                    Ordering::Relaxed,
                                );
                            }
                            window.settle(n, Some(settled))
                        }
                        Err(why) => {
                            window.settle(n, None);
                            PartitionEnd::outrank(&mut end, why);
                        }
                    }
                }
                done = async { recording.as_mut().expect("guarded").await }, if recording.is_some() => {
                    recording = None;
                    // A checkpoint that failed ends the recording: a later one would move
                    // the checkpoint past the batches it held, whose ledger and dead letters
                    // would then never be written (found reading the code with the model's
                    // batches in mind). The partition is executed again from the last one.
                    let recorded = match done {
                        Ok(Ok(recorded)) => recorded,
                        Ok(Err(e)) => {
                            failure = Some(e.into());
                            record_failed = true;
                            unrecorded.clear();
                            end.get_or_insert(PartitionEnd::Released);
                            continue;
                        }
                        Err(panicked) => {
                            failure = Some(invalid(format!("a checkpoint task failed: {panicked}")));
                            record_failed = true;
                            unrecorded.clear();
                            end.get_or_insert(PartitionEnd::Released);
                            continue;
                        }
                    };
                    if !recorded.kept || lost.load(Ordering::SeqCst) {
                        end = Some(PartitionEnd::LeaseLost);
                        unrecorded.clear();
                        continue;
                    }
                    *lease.lock().unwrap() = recorded.started + self.config.lease_ttl;
                    let c = &shared.counters;
                    for b in &recorded.batches {
                        let k = &b.checkpoint;
                        crate::telemetry::checkpointed(
                            shared.migration,
                            shared.task.as_str(),
                            &p.source_shard,
                            &crate::telemetry::Ledger {
                                scanned: k.scanned,
                                inserted: k.inserted,
                                already_present: k.already_present,
                                stamped: k.stamped,
                                dead_lettered: k.dead_lettered,
                                deleted: k.deleted,
                            },
                            b.took,
                        );
                        c.documents
                            .fetch_add(k.scanned + k.skipped_foreign, Ordering::Relaxed);
                        c.batches.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
        }
    }

    /// How long before its partition lease ends a worker stops writing (and how long after it
    /// another worker may take the partition over): a fifth of the lease.
    pub(super) fn fence_margin(&self) -> Duration {
        self.config.lease_ttl / 5
    }
}

/// Whether what settled may still be recorded: not once the lease is lost.
pub(super) fn end_allows_recording(end: &Option<PartitionEnd>) -> bool {
    !matches!(end, Some(PartitionEnd::LeaseLost))
}

/// How often a worker logs its progress (at info level; batches and documents are never
/// logged one by one there).
pub(super) const PROGRESS_EVERY: Duration = Duration::from_secs(10);

/// A partition's `_id` range as text: `[lower, upper)`, `min`/`max` where open.
pub(super) fn range_text(p: &Partition) -> String {
    let bound = |b: &Option<Vec<u8>>, open: &str| match b {
        Some(bytes) => ids::decode(bytes).map_or_else(|e| format!("<{e}>"), |id| ids::text(&id)),
        None => open.to_owned(),
    };
    format!(
        "[{}, {}) of {}",
        bound(&p.lower_bound, "min"),
        bound(&p.upper_bound, "max"),
        p.id_type
    )
}

/// Aborts a task when dropped (a partition given up mid-way stops its lease keeper).
pub(super) struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Resolves once shutdown is asked for; never, when the sender is gone without asking.
pub(super) async fn stopped(mut shutdown: watch::Receiver<bool>) {
    loop {
        if *shutdown.borrow_and_update() {
            return;
        }
        if shutdown.changed().await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}

/// A partition's scan: the backfill's reads the documents as the server sent them (its copies
/// are built from those bytes, [`steps::Scanned`]); the other tasks' parse them.
pub(super) enum PartitionScan {
    Parsed(crate::shards::read::Scan),
    Raw(crate::shards::read::Scan<RawDocumentBuf>),
}

/// A batch a [`PartitionScan`] read.
pub(super) enum ReadBatch {
    Parsed(Vec<Document>),
    Raw(Vec<RawDocumentBuf>),
}

impl PartitionScan {
    pub(super) async fn next_batch(&mut self) -> Result<ReadBatch, crate::shards::read::ReadError> {
        Ok(match self {
            PartitionScan::Parsed(scan) => ReadBatch::Parsed(scan.next_batch().await?),
            PartitionScan::Raw(scan) => ReadBatch::Raw(scan.next_batch().await?),
        })
    }
}

impl ReadBatch {
    pub(super) fn len(&self) -> usize {
        match self {
            ReadBatch::Parsed(docs) => docs.len(),
            ReadBatch::Raw(docs) => docs.len(),
        }
    }

    /// The `_id` of the last document: the checkpoint's resume point.
    pub(super) fn last_id(&self) -> Bson {
        match self {
            ReadBatch::Parsed(docs) => docs.last().and_then(|d| d.get("_id").cloned()),
            ReadBatch::Raw(docs) => docs
                .last()
                .and_then(|d| d.get("_id").ok().flatten())
                .and_then(|id| Bson::try_from(id.to_raw_bson()).ok()),
        }
        .unwrap_or(Bson::Null)
    }
}

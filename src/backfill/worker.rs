//! `reshard worker`: claims backfill partitions under leases and copies them.
//!
//! A worker serves one migration (or every migration in `backfill`). For each it registers,
//! then runs `concurrency` partition loops and one control loop:
//!
//! - a partition loop claims a partition (`FOR UPDATE SKIP LOCKED`, fresh lease token), reads
//!   it through one open cursor in `_id` order, writes each batch through the shared
//!   [`BulkWriter`], then records the checkpoint fenced by the token. A lease lost (a
//!   heartbeat or checkpoint that affects no row) stops it at once; the batch it wrote
//!   repeats harmlessly for whoever took over.
//! - the control loop, every second, re-reads the migration (phase, pause, settings),
//!   heartbeats the worker's lease with its figures, shares the configured rate among the
//!   live workers, and writes rate cuts and capacity signals to the event log.
//!
//! A batch whose writes failed transiently on every attempt (a target shard down, overload
//! that does not relent) is not dead-lettered: nothing is checkpointed, the partition is
//! released and retried later from its checkpoint. Only permanent refusals become dead letters.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::TryStreamExt;
use mongodb::bson::{doc, Bson, Document};
use mongodb::options::WriteConcern;
use mongodb::Database;
use serde_json::json;
use tokio::sync::watch;
use uuid::Uuid;

use super::plan;
use crate::copy::{
    BulkWriter, FailureClass, RetryPolicy, Statement, StatementResult, WriterOptions,
};
use crate::ids::{self, Bracket};
use crate::router::{copy_document, is_tombstone};
use crate::routing::{KeyValue, Location, RoutingVersion};
use crate::settings::MigrationSettings;
use crate::store::migrations::Migration;
use crate::store::partitions::{Checkpoint, NewDeadLetter, Partition, Task};
use crate::store::workers::WorkerFigures;
use crate::store::{Store, StoreError};
use crate::throttle::AdaptiveRate;

/// How a worker runs.
#[derive(Clone, Debug)]
pub struct WorkerConfig {
    /// Serve only this migration; `None`: every migration in `backfill`.
    pub migration: Option<i64>,
    /// Partitions worked on at once.
    pub concurrency: usize,
    /// The name shown in `status` and written in leases (`host:pid` by default).
    pub name: String,
    /// The actor written in events.
    pub actor: String,
    /// How long a partition or worker lease lasts without a heartbeat.
    pub lease_ttl: Duration,
    /// How often settings, phase and pause are re-read and the worker heartbeats.
    pub refresh: Duration,
    /// How long to wait when there is nothing to do.
    pub idle_poll: Duration,
    /// Exit once the migration's backfill is done (or, without `migration`, once no
    /// migration has backfill work left).
    pub exit_when_done: bool,
    /// Write concern of the copies; `{w: "majority", j: true}` by default.
    pub write_concern: Option<WriteConcern>,
    /// Retries of transient failures within a batch.
    pub retry: RetryPolicy,
}

impl WorkerConfig {
    pub fn new(name: impl Into<String>) -> Self {
        WorkerConfig {
            migration: None,
            concurrency: 2,
            name: name.into(),
            actor: "worker".into(),
            lease_ttl: Duration::from_secs(30),
            refresh: Duration::from_secs(1),
            idle_poll: Duration::from_secs(2),
            exit_when_done: false,
            write_concern: None,
            retry: RetryPolicy::default(),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum WorkerError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("planning the backfill of migration {migration} failed: {source}")]
    Plan {
        migration: i64,
        #[source]
        source: Box<plan::PlanError>,
    },
    #[error("migration {migration}: {message}")]
    Invalid { migration: i64, message: String },
}

/// What a worker did before it stopped.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WorkerSummary {
    pub partitions_done: u64,
    pub batches: u64,
    pub documents: u64,
    pub leases_lost: u64,
}

/// A backfill worker over a set of shard connections.
pub struct Worker {
    store: Store,
    shards: BTreeMap<String, Database>,
    config: WorkerConfig,
    /// This worker's registration id (one row per migration it serves).
    id: Uuid,
    /// Figures per migration, kept across the times the worker serves it.
    counters: Mutex<std::collections::HashMap<i64, Arc<Counters>>>,
}

#[derive(Default)]
struct Counters {
    documents: AtomicI64,
    batches: AtomicI64,
    overloads: AtomicI64,
    retries: AtomicI64,
    rate_cuts: AtomicI64,
    partitions_done: AtomicI64,
    leases_lost: AtomicI64,
}

impl Counters {
    fn summary(&self) -> WorkerSummary {
        WorkerSummary {
            partitions_done: self.partitions_done.load(Ordering::Relaxed) as u64,
            batches: self.batches.load(Ordering::Relaxed) as u64,
            documents: self.documents.load(Ordering::Relaxed) as u64,
            leases_lost: self.leases_lost.load(Ordering::Relaxed) as u64,
        }
    }
}

/// What the partition loops of one migration share.
struct Shared {
    migration: i64,
    task: Task,
    /// `_id`s (as text) of skipped dead letters: never copied, so never deleted by cleanup.
    skipped: std::collections::HashSet<String>,
    epoch: i64,
    from: RoutingVersion,
    to: RoutingVersion,
    rate: Arc<Mutex<AdaptiveRate>>,
    settings: Mutex<MigrationSettings>,
    writer: Mutex<BulkWriter>,
    counters: Arc<Counters>,
    /// Cleared when the migration leaves `backfill`, pauses or fails, or on shutdown.
    runnable: AtomicBool,
}

impl Shared {
    fn batch_size(&self) -> usize {
        self.settings.lock().unwrap().batch_size
    }
    fn writer(&self) -> BulkWriter {
        self.writer.lock().unwrap().clone()
    }
}

/// How one partition's work ended.
enum PartitionEnd {
    Done,
    Released,
    LeaseLost,
    /// Released after a failure that may pass (a shard down, overload); try again later.
    Retry(String),
}

impl Worker {
    /// A worker over connections to every registered shard. Writes are not retried by the
    /// driver: the bulk writer owns retries and must see every overload rejection.
    pub async fn connect(
        store: Store,
        config: WorkerConfig,
    ) -> Result<Worker, crate::error::Error> {
        let shards = crate::shards::databases(store.shards().await?, true)
            .await
            .map_err(|e| crate::error::Error::BadInput(e.to_string()))?;
        Ok(Worker::with_shards(store, shards, config))
    }

    pub fn with_shards(
        store: Store,
        shards: BTreeMap<String, Database>,
        config: WorkerConfig,
    ) -> Worker {
        Worker {
            store,
            shards,
            config,
            id: Uuid::new_v4(),
            counters: Mutex::default(),
        }
    }

    /// Works until `shutdown` turns true (then finishes or abandons the batches in flight and
    /// releases its leases), or, with `exit_when_done`, until the backfill is done.
    pub async fn run(&self, shutdown: watch::Receiver<bool>) -> Result<WorkerSummary, WorkerError> {
        let mut summary = WorkerSummary::default();
        loop {
            if *shutdown.borrow() {
                break;
            }
            let migrations = match self.config.migration {
                Some(id) => vec![self.store.migration(id).await?],
                None => self
                    .store
                    .migrations(false)
                    .await?
                    .into_iter()
                    .filter(|m| Task::of(m.phase()).is_some())
                    .collect(),
            };
            let mut all_done = true;
            let mut worked = false;
            for m in migrations {
                if *shutdown.borrow() {
                    break;
                }
                let Some(task) = Task::of(m.phase()) else {
                    // Before backfill: wait for it. After: nothing left for this worker.
                    if m.backfill_planned_at.is_none() && !m.phase().is_terminal() {
                        all_done = false;
                    }
                    continue;
                };
                if let Some(reason) = &m.failure_reason {
                    // Nothing to do until an operator resumes or rolls back; a worker told to
                    // exit when done does not wait for that.
                    tracing::warn!(migration = m.id, "the migration failed: {reason}");
                    if !self.config.exit_when_done {
                        all_done = false;
                    }
                    continue;
                }
                if m.paused {
                    all_done = false;
                    continue;
                }
                if !self.planned(&m, task).await? {
                    all_done = false;
                    continue;
                }
                let m = self.store.migration(m.id).await?;
                let s = self.serve(&m, task, shutdown.clone()).await?;
                worked |= s.batches > 0 || s.partitions_done > 0;
                summary.partitions_done += s.partitions_done;
                summary.batches += s.batches;
                summary.documents += s.documents;
                summary.leases_lost += s.leases_lost;
                let totals = self.store.task_totals(m.id, task.as_str()).await?;
                if totals.done < totals.partitions {
                    all_done = false;
                }
            }
            if (self.config.exit_when_done && all_done) || *shutdown.borrow() {
                break;
            }
            if !worked {
                tokio::select! {
                    _ = tokio::time::sleep(self.config.idle_poll) => {}
                    _ = stopped(shutdown.clone()) => {}
                }
            }
        }
        Ok(summary)
    }

    async fn versions(
        &self,
        m: &Migration,
    ) -> Result<(RoutingVersion, RoutingVersion), WorkerError> {
        Ok(self.store.migration_versions(m).await?)
    }

    fn settings_of(m: &Migration) -> Result<MigrationSettings, WorkerError> {
        MigrationSettings::from_json(&m.settings).map_err(|message| WorkerError::Invalid {
            migration: m.id,
            message,
        })
    }

    /// Makes sure the task is planned; `false` when it cannot be yet (the revert copier
    /// waits until every live router mirrors its writes).
    async fn planned(&self, m: &Migration, task: Task) -> Result<bool, WorkerError> {
        let planned_at = match task {
            Task::Backfill => m.backfill_planned_at,
            Task::Cleanup => m.cleanup_planned_at,
            Task::Revert => m.revert_planned_at,
        };
        if planned_at.is_some() {
            return Ok(true);
        }
        match task {
            Task::Backfill => self.plan(m).await?,
            Task::Cleanup => {
                self.store
                    .store_plan(m.id, Task::Cleanup, &[], &self.config.actor, json!({}))
                    .await?;
            }
            Task::Revert => {
                // A router still in an earlier epoch writes the target without mirroring; the
                // copier may have passed its id already. Start only once all acknowledged.
                let missing = self.store.unacknowledged_routers(m).await?;
                if !missing.is_empty() {
                    tracing::info!(
                        migration = m.id,
                        routers = missing.len(),
                        "revert copy waits for every live router to acknowledge reverting"
                    );
                    return Ok(false);
                }
                let (_, to) = self.versions(m).await?;
                let partitions = plan::plan_revert(&to, &self.shards)
                    .await
                    .map_err(|source| WorkerError::Plan {
                        migration: m.id,
                        source: Box::new(source),
                    })?;
                self.store
                    .store_plan(
                        m.id,
                        Task::Revert,
                        &partitions,
                        &self.config.actor,
                        json!({ "partitions": partitions.len() }),
                    )
                    .await?;
            }
        }
        Ok(true)
    }

    /// Samples the source and stores the partitions (first planner wins).
    async fn plan(&self, m: &Migration) -> Result<(), WorkerError> {
        let (from, to) = self.versions(m).await?;
        let settings = Self::settings_of(m)?;
        let plans = plan::plan(&from, &to, &self.shards, &settings)
            .await
            .map_err(|source| WorkerError::Plan {
                migration: m.id,
                source: Box::new(source),
            })?;
        let partitions: Vec<_> = plans.iter().flat_map(|p| p.partitions.clone()).collect();
        let stored = self
            .store
            .store_backfill_plan(
                m.id,
                &partitions,
                &self.config.actor,
                plan::plan_details(&plans),
            )
            .await?;
        if stored {
            tracing::info!(
                migration = m.id,
                partitions = partitions.len(),
                "backfill planned"
            );
        }
        Ok(())
    }

    fn writer_for(
        &self,
        settings: &MigrationSettings,
        rate: &Arc<Mutex<AdaptiveRate>>,
        counters: &Arc<Counters>,
    ) -> BulkWriter {
        let mut options = WriterOptions {
            max_in_flight_per_shard: settings.max_in_flight_per_shard,
            retry: self.config.retry,
            ..WriterOptions::default()
        };
        if let Some(wc) = &self.config.write_concern {
            options.write_concern = wc.clone();
        }
        let (rate, counters) = (rate.clone(), counters.clone());
        let sink = move |_shard: &str| {
            if rate.lock().unwrap().on_overload(Instant::now()) {
                counters.rate_cuts.fetch_add(1, Ordering::Relaxed);
            }
        };
        BulkWriter::new(
            self.shards.iter().map(|(n, d)| (n.clone(), d.clone())),
            options,
        )
        .with_overload_sink(Arc::new(sink))
    }

    /// Works on one migration until its partitions run out, it stops being runnable, or
    /// shutdown.
    async fn serve(
        &self,
        m: &Migration,
        task: Task,
        shutdown: watch::Receiver<bool>,
    ) -> Result<WorkerSummary, WorkerError> {
        let skipped = self.store.skipped_ids(m.id).await?.into_iter().collect();
        let (from, to) = self.versions(m).await?;
        let settings = Self::settings_of(m)?;
        let worker_id = self.id;
        let ttl = self.config.lease_ttl;
        self.store
            .register_worker(
                worker_id,
                m.id,
                &self.config.name,
                &super::host(),
                std::process::id(),
                ttl,
            )
            .await?;
        let live = self
            .store
            .worker_heartbeat(worker_id, m.id, ttl, &WorkerFigures::default())
            .await?;
        let rate = Arc::new(Mutex::new(AdaptiveRate::new(
            settings.throttle_share(live),
            Instant::now(),
        )));
        let counters = self
            .counters
            .lock()
            .unwrap()
            .entry(m.id)
            .or_default()
            .clone();
        let before = counters.summary();
        let writer = self.writer_for(&settings, &rate, &counters);
        let shared = Arc::new(Shared {
            migration: m.id,
            task,
            skipped,
            epoch: m.epoch,
            from,
            to,
            rate,
            settings: Mutex::new(settings),
            writer: Mutex::new(writer),
            counters,
            runnable: AtomicBool::new(true),
        });

        let stop_control = Arc::new(tokio::sync::Notify::new());
        let control = self.control_loop(
            worker_id,
            live,
            shared.clone(),
            shutdown.clone(),
            stop_control.clone(),
        );
        let loops = (0..self.config.concurrency.max(1))
            .map(|_| self.partition_loop(shared.clone(), shutdown.clone()));
        let work = async {
            let results = futures::future::join_all(loops).await;
            stop_control.notify_one();
            results
        };
        let (results, control_result) = tokio::join!(work, control);
        let stopped = self.store.stop_worker(worker_id, m.id).await;
        control_result?;
        for r in results {
            r?;
        }
        stopped?;
        let after = shared.counters.summary();
        Ok(WorkerSummary {
            partitions_done: after.partitions_done - before.partitions_done,
            batches: after.batches - before.batches,
            documents: after.documents - before.documents,
            leases_lost: after.leases_lost - before.leases_lost,
        })
    }

    /// Re-reads the migration, heartbeats, shares the rate, reports rate cuts and capacity.
    async fn control_loop(
        &self,
        worker_id: Uuid,
        mut live: usize,
        shared: Arc<Shared>,
        shutdown: watch::Receiver<bool>,
        stop: Arc<tokio::sync::Notify>,
    ) -> Result<(), WorkerError> {
        let ttl = self.config.lease_ttl;
        let mut last_documents = 0_i64;
        let mut last_tick = Instant::now();
        let mut reported_cuts = 0_i64;
        let mut last_cut_event: Option<Instant> = None;
        let mut last_capacity_event: Option<Instant> = None;
        let mut last_log = Instant::now();
        loop {
            tokio::select! {
                _ = stop.notified() => return Ok(()),
                _ = tokio::time::sleep(self.config.refresh) => {}
            }
            if *shutdown.borrow() {
                shared.runnable.store(false, Ordering::SeqCst);
            }
            let now = Instant::now();
            let m = self.store.migration(shared.migration).await?;
            if m.phase() != shared.task.phase() || m.paused || m.failure_reason.is_some() {
                shared.runnable.store(false, Ordering::SeqCst);
            }
            let settings = Self::settings_of(&m)?;
            let c = &shared.counters;
            let documents = c.documents.load(Ordering::Relaxed);
            let elapsed = now.duration_since(last_tick).as_secs_f64().max(1e-3);
            let docs_per_sec = (documents - last_documents) as f64 / elapsed;
            let (applied, max) = {
                let mut rate = shared.rate.lock().unwrap();
                rate.tick(now);
                (rate.applied(), rate.settings().max_docs_per_sec)
            };
            let figures = WorkerFigures {
                applied_docs_per_sec: applied,
                docs_per_sec,
                documents,
                batches: c.batches.load(Ordering::Relaxed),
                overloads: c.overloads.load(Ordering::Relaxed),
                retries: c.retries.load(Ordering::Relaxed),
                rate_cuts: c.rate_cuts.load(Ordering::Relaxed),
            };
            let now_live = self
                .store
                .worker_heartbeat(worker_id, shared.migration, ttl, &figures)
                .await?;
            last_documents = documents;
            last_tick = now;

            let before = *shared.settings.lock().unwrap();
            if settings != before || now_live != live {
                let share = settings.throttle_share(now_live);
                {
                    let mut rate = shared.rate.lock().unwrap();
                    let replaced = AdaptiveRate::new(share, now);
                    if settings.target_batch_latency_ms != before.target_batch_latency_ms
                        || settings.capacity_signal_after_secs != before.capacity_signal_after_secs
                    {
                        // Other knobs changed: restart the arithmetic from the current rate.
                        let applied = rate.applied().min(share.max_docs_per_sec);
                        *rate = replaced;
                        rate.set_max(applied, now);
                        rate.set_max(share.max_docs_per_sec, now);
                    } else {
                        rate.set_max(share.max_docs_per_sec, now);
                    }
                }
                if settings.max_in_flight_per_shard != before.max_in_flight_per_shard {
                    let writer = self.writer_for(&settings, &shared.rate, &shared.counters);
                    *shared.writer.lock().unwrap() = writer;
                }
                *shared.settings.lock().unwrap() = settings;
                live = now_live;
                tracing::info!(
                    migration = shared.migration,
                    workers = live,
                    max_docs_per_sec = share.max_docs_per_sec,
                    batch_size = settings.batch_size,
                    max_in_flight_per_shard = settings.max_in_flight_per_shard,
                    "throttle settings applied"
                );
            }

            let cuts = figures.rate_cuts;
            if cuts > reported_cuts
                && last_cut_event.is_none_or(|t| now.duration_since(t) >= Duration::from_secs(10))
            {
                self.store
                    .record_event(
                        shared.migration,
                        &self.config.actor,
                        "rate_cut",
                        None,
                        json!({
                            "worker": self.config.name,
                            "cuts": cuts - reported_cuts,
                            "applied_docs_per_sec": applied,
                            "max_docs_per_sec": max,
                            "overloads": figures.overloads,
                            "retries": figures.retries,
                        }),
                    )
                    .await?;
                reported_cuts = cuts;
                last_cut_event = Some(now);
            }
            let window = Duration::from_secs(settings.capacity_signal_after_secs);
            let overloaded = shared
                .rate
                .lock()
                .unwrap()
                .overload_window_exceeded(now, window);
            if overloaded && last_capacity_event.is_none_or(|t| now.duration_since(t) >= window) {
                let reason = format!(
                    "target shards rejected writes for overload for over {}s; applied rate \
                     {applied:.0} of {max:.0} docs/s for this worker: add capacity or lower \
                     max_docs_per_sec",
                    window.as_secs()
                );
                tracing::warn!(migration = shared.migration, "{reason}");
                self.store
                    .record_event(
                        shared.migration,
                        &self.config.actor,
                        "capacity_signal",
                        Some(&reason),
                        json!({
                            "worker": self.config.name,
                            "applied_docs_per_sec": applied,
                            "overloads": figures.overloads,
                        }),
                    )
                    .await?;
                last_capacity_event = Some(now);
            }
            if now.duration_since(last_log) >= Duration::from_secs(10) {
                tracing::info!(
                    migration = shared.migration,
                    documents,
                    docs_per_sec = format!("{docs_per_sec:.0}"),
                    applied_docs_per_sec = format!("{applied:.0}"),
                    "backfill progress"
                );
                last_log = now;
            }
        }
    }

    /// Cleanup's batch: deletes of the moved documents whose target holds a copy or a
    /// tombstone. `Err(reason)` names a moved document the target does not hold: deleting it
    /// would lose it, so cleanup stops there and nothing of the batch is deleted.
    async fn prepare_cleanup(
        &self,
        shared: &Shared,
        location: &Location,
        docs: Vec<Document>,
    ) -> Result<Result<PreparedBatch, String>, WorkerError> {
        let (checkpoint, moved) =
            cleanup_candidates(&shared.from, &shared.to, location, &shared.skipped, &docs);
        let mut by_target: BTreeMap<Location, Vec<Bson>> = BTreeMap::new();
        for (id, target) in &moved {
            by_target
                .entry(target.clone())
                .or_default()
                .push(id.clone());
        }
        let mut present: std::collections::HashSet<Vec<u8>> = std::collections::HashSet::new();
        for (target, wanted) in by_target {
            let Some(db) = self.shards.get(&target.shard) else {
                return Ok(Err(format!(
                    "target shard {:?} has no connection",
                    target.shard
                )));
            };
            let found: Vec<Document> = match db
                .collection::<Document>(&target.collection)
                .find(doc! { "_id": { "$in": wanted } })
                .projection(doc! { "_id": 1 })
                .await
            {
                Ok(cursor) => match cursor.try_collect().await {
                    Ok(found) => found,
                    Err(e) => return Err(self.read_failure(shared, &target, e)),
                },
                Err(e) => return Err(self.read_failure(shared, &target, e)),
            };
            present.extend(found.iter().filter_map(|d| d.get("_id").map(ids::encode)));
        }
        let mut batch = PreparedBatch {
            checkpoint,
            ..PreparedBatch::default()
        };
        for (id, target) in moved {
            if !present.contains(&ids::encode(&id)) {
                return Ok(Err(format!(
                    "cleanup stopped: _id {} at {location} is missing from its target {target}; \
                     nothing of its batch was deleted (reconcile and repair, then resume)",
                    ids::text(&id)
                )));
            }
            batch
                .statements
                .push(Statement::delete(location.clone(), id.clone()));
            batch.kinds.push(Kind::Delete);
            batch.ids.push(id);
            batch.targets.push(location.clone());
        }
        Ok(Ok(batch))
    }

    fn read_failure(
        &self,
        shared: &Shared,
        at: &Location,
        e: mongodb::error::Error,
    ) -> WorkerError {
        WorkerError::Invalid {
            migration: shared.migration,
            message: format!("reading {at}: {e}"),
        }
    }

    /// Fails the migration with `reason` (an invariant would break); workers stop, the
    /// operator decides.
    async fn fail_migration(&self, shared: &Shared, reason: &str) -> Result<(), WorkerError> {
        tracing::error!(migration = shared.migration, "{reason}");
        shared.runnable.store(false, Ordering::SeqCst);
        match self
            .store
            .transition(
                shared.migration,
                &crate::phase::Action::Fail(reason.to_owned()),
                &self.config.actor,
                None,
                false,
            )
            .await
        {
            Ok(_) => Ok(()),
            // Another worker failed it first.
            Err(StoreError::Move(_)) | Err(StoreError::Lost(_)) => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    /// Claims and works partitions one after another.
    async fn partition_loop(
        &self,
        shared: Arc<Shared>,
        shutdown: watch::Receiver<bool>,
    ) -> Result<(), WorkerError> {
        let mut failures = 0_u32;
        while shared.runnable.load(Ordering::SeqCst) && !*shutdown.borrow() {
            let token = Uuid::new_v4();
            let waves = shared.settings.lock().unwrap().cleanup_waves;
            let bound = self
                .store
                .claim_bound(shared.migration, shared.task, waves)
                .await?;
            let Some(p) = self
                .store
                .claim_partition(
                    shared.migration,
                    shared.task.as_str(),
                    token,
                    &self.config.name,
                    self.config.lease_ttl,
                    bound,
                )
                .await?
            else {
                return Ok(());
            };
            tracing::debug!(partition = p.id, source = %p.source_shard, "partition claimed");
            match self.work_partition(&shared, &p, token, &shutdown).await? {
                PartitionEnd::Done => {
                    failures = 0;
                    shared
                        .counters
                        .partitions_done
                        .fetch_add(1, Ordering::Relaxed);
                }
                PartitionEnd::Released => {}
                PartitionEnd::LeaseLost => {
                    shared.counters.leases_lost.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(
                        partition = p.id,
                        "lease lost; another worker owns the partition"
                    );
                }
                PartitionEnd::Retry(why) => {
                    failures += 1;
                    let wait = crate::copy::writer::backoff_ceiling(
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

    /// Reads one partition through one cursor and copies it batch by batch.
    async fn work_partition(
        &self,
        shared: &Arc<Shared>,
        p: &Partition,
        token: Uuid,
        shutdown: &watch::Receiver<bool>,
    ) -> Result<PartitionEnd, WorkerError> {
        let invalid = |message: String| WorkerError::Invalid {
            migration: shared.migration,
            message: format!("partition {}: {message}", p.id),
        };
        let bracket = Bracket::parse(&p.id_type)
            .ok_or_else(|| invalid(format!("unknown _id type {:?}", p.id_type)))?;
        let decode =
            |b: &Option<Vec<u8>>| b.as_deref().map(ids::decode).transpose().map_err(invalid);
        let lower = decode(&p.lower_bound)?;
        let upper = decode(&p.upper_bound)?;
        let mut resume = decode(&p.last_id)?;
        let location = Location::new(p.source_shard.clone(), p.source_collection.clone());
        let Some(db) = self.shards.get(&p.source_shard) else {
            return Err(invalid(format!(
                "source shard {:?} has no connection",
                p.source_shard
            )));
        };
        let mut filter = match &p.tenant_filter {
            // The revert copier reads what reshard wrote in a target location.
            _ if shared.task == Task::Revert => doc! { crate::router::META: { "$exists": true } },
            Some(tenants) => {
                let tenants: Vec<KeyValue> = serde_json::from_value(tenants.clone())
                    .map_err(|e| invalid(format!("tenant filter unreadable: {e}")))?;
                plan::tenant_filter(&shared.from.tenant_key, &tenants)
            }
            None => Document::new(),
        };
        filter.extend(ids::range_filter(
            bracket,
            lower.as_ref(),
            resume.as_ref(),
            upper.as_ref(),
        ));

        // The lease is extended by every checkpoint and, while a batch takes long, by this.
        let lost = Arc::new(AtomicBool::new(false));
        let keeper = {
            let (store, lost, ttl) = (self.store.clone(), lost.clone(), self.config.lease_ttl);
            let id = p.id;
            tokio::spawn(async move {
                loop {
                    tokio::time::sleep(ttl / 3).await;
                    match store.extend_partition_lease(id, token, ttl).await {
                        Ok(true) => {}
                        Ok(false) => {
                            lost.store(true, Ordering::SeqCst);
                            return;
                        }
                        Err(e) => tracing::warn!(partition = id, "lease heartbeat failed: {e}"),
                    }
                }
            })
        };
        let end = self
            .copy_partition(
                shared,
                p,
                token,
                &location,
                db,
                filter,
                &mut resume,
                &lost,
                shutdown,
            )
            .await;
        keeper.abort();
        end
    }

    #[allow(clippy::too_many_arguments)]
    async fn copy_partition(
        &self,
        shared: &Arc<Shared>,
        p: &Partition,
        token: Uuid,
        location: &Location,
        db: &Database,
        filter: Document,
        resume: &mut Option<Bson>,
        lost: &AtomicBool,
        shutdown: &watch::Receiver<bool>,
    ) -> Result<PartitionEnd, WorkerError> {
        let coll = db.collection::<Document>(&location.collection);
        let batch_size = shared.batch_size();
        let cursor = match coll
            .find(filter)
            .sort(doc! { "_id": 1 })
            .batch_size(batch_size.min(u32::MAX as usize) as u32)
            .await
        {
            Ok(c) => c,
            Err(e) => return Ok(PartitionEnd::Retry(format!("reading {location}: {e}"))),
        };
        // Read-ahead: the next batch is read while this one is written. One batch ahead at
        // most, so memory stays at two batches per partition loop.
        let (tx, mut rx) = tokio::sync::mpsc::channel::<Result<Vec<Document>, String>>(1);
        let reader = {
            let shared = shared.clone();
            let location = location.clone();
            tokio::spawn(async move {
                let mut cursor = cursor;
                loop {
                    let batch_size = shared.batch_size();
                    let mut docs = Vec::with_capacity(batch_size);
                    let mut failed = None;
                    while docs.len() < batch_size {
                        match cursor.try_next().await {
                            Ok(Some(d)) => docs.push(d),
                            Ok(None) => break,
                            Err(e) => {
                                failed = Some(format!("reading {location}: {e}"));
                                break;
                            }
                        }
                    }
                    let end = docs.len() < batch_size || failed.is_some();
                    if !docs.is_empty() && tx.send(Ok(docs)).await.is_err() {
                        return;
                    }
                    if let Some(e) = failed {
                        let _ = tx.send(Err(e)).await;
                        return;
                    }
                    if end {
                        return;
                    }
                }
            })
        };
        let _reader = AbortOnDrop(reader);
        loop {
            let docs = match rx.recv().await {
                Some(Ok(docs)) => docs,
                Some(Err(e)) => return Ok(PartitionEnd::Retry(e)),
                None => Vec::new(),
            };
            if docs.is_empty() {
                return Ok(if self.store.finish_partition(p.id, token).await? {
                    PartitionEnd::Done
                } else {
                    PartitionEnd::LeaseLost
                });
            }
            let wait = shared
                .rate
                .lock()
                .unwrap()
                .permit(docs.len() as u64, Instant::now());
            if !wait.is_zero() {
                tokio::time::sleep(wait).await;
            }
            let last_id = docs
                .last()
                .and_then(|d| d.get("_id").cloned())
                .unwrap_or(Bson::Null);
            let prepared = match shared.task {
                Task::Backfill => {
                    prepare_batch(&shared.from, &shared.to, location, shared.epoch, docs)
                }
                Task::Revert => {
                    prepare_revert(&shared.from, &shared.to, shared.migration, location, docs)
                }
                Task::Cleanup => match self.prepare_cleanup(shared, location, docs).await? {
                    Ok(prepared) => prepared,
                    Err(missing) => {
                        self.fail_migration(shared, &missing).await?;
                        self.store.release_partition(p.id, token).await?;
                        return Ok(PartitionEnd::Released);
                    }
                },
            };
            let started = Instant::now();
            let report = shared
                .writer()
                .write(prepared.statements)
                .await
                .map_err(|e| WorkerError::Invalid {
                    migration: shared.migration,
                    message: e.to_string(),
                })?;
            let latency = started.elapsed();
            let c = &shared.counters;
            c.retries
                .fetch_add(report.retries as i64, Ordering::Relaxed);
            c.overloads
                .fetch_add(report.overload_events as i64, Ordering::Relaxed);
            if shared
                .rate
                .lock()
                .unwrap()
                .on_batch(latency, Instant::now())
            {
                c.rate_cuts.fetch_add(1, Ordering::Relaxed);
            }
            let mut checkpoint = prepared.checkpoint;
            for (i, result) in report.results.iter().enumerate() {
                match result {
                    StatementResult::Inserted => checkpoint.inserted += 1,
                    StatementResult::Applied => match prepared.kinds[i] {
                        Kind::Stamp => checkpoint.stamped += 1,
                        Kind::Delete => checkpoint.deleted += 1,
                        Kind::Copy | Kind::Mirror => checkpoint.inserted += 1,
                    },
                    StatementResult::AlreadyPresent | StatementResult::DroppedDuplicate { .. } => {
                        checkpoint.already_present += 1
                    }
                    StatementResult::DeadLettered {
                        class: FailureClass::Permanent,
                        code,
                        code_name,
                        message,
                        attempts,
                        ..
                    } => {
                        let id = &prepared.ids[i];
                        checkpoint.dead_lettered += 1;
                        checkpoint.dead_letters.push(NewDeadLetter {
                            doc_id: ids::encode(id),
                            doc_id_text: ids::text(id),
                            target: Some(prepared.targets[i].to_string()),
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
                        return Ok(PartitionEnd::Retry(format!(
                            "writing to {} failed {attempts} times (code {code:?}): {message}",
                            prepared.targets[i]
                        )));
                    }
                }
            }
            checkpoint.last_id = ids::encode(&last_id);
            if lost.load(Ordering::SeqCst)
                || !self
                    .store
                    .checkpoint_partition(p, token, self.config.lease_ttl, &checkpoint)
                    .await?
            {
                return Ok(PartitionEnd::LeaseLost);
            }
            *resume = Some(last_id);
            c.documents.fetch_add(
                checkpoint.scanned + checkpoint.skipped_foreign,
                Ordering::Relaxed,
            );
            c.batches.fetch_add(1, Ordering::Relaxed);
            if !shared.runnable.load(Ordering::SeqCst) || *shutdown.borrow() {
                self.store.release_partition(p.id, token).await?;
                return Ok(PartitionEnd::Released);
            }
        }
    }
}

/// Aborts a task when dropped (a partition given up mid-way stops its reader).
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Resolves once shutdown is asked for; never, when the sender is gone without asking.
async fn stopped(mut shutdown: watch::Receiver<bool>) {
    loop {
        if *shutdown.borrow_and_update() {
            return;
        }
        if shutdown.changed().await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}

/// What a statement of a batch does, for the ledger.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// Insert a copy into the target (inserted / already present).
    Copy,
    /// Stamp the routing field on a document that stays (stamped).
    Stamp,
    /// Delete a moved document from the source (cleanup: deleted).
    Delete,
    /// Carry a target document back to the source by revision (revert: inserted / already
    /// present when the source is as new).
    Mirror,
}

/// A batch ready to write: the statements, the id and target of each, and what was settled
/// without writing (documents that stay without stamping, foreign documents, documents that
/// cannot be routed).
#[derive(Debug, Default)]
pub struct PreparedBatch {
    pub statements: Vec<Statement>,
    /// What each statement is, for the ledger.
    pub kinds: Vec<Kind>,
    pub ids: Vec<Bson>,
    pub targets: Vec<Location>,
    pub checkpoint: Checkpoint,
}

/// Decides, for each document read at `location`, what the backfill does with it. Pure.
///
/// - a tombstone, or a document the source version does not place here (the target layout's
///   own documents in a collection both layouts share): not a source document, not counted in
///   the ledger (`skipped_foreign`);
/// - a document the target version places elsewhere: an insert of its copy there;
/// - a document that stays: its routing field stamped when missing or different, else
///   nothing to do (`already_present`);
/// - a document that cannot be routed (no tenant key, an unsupported key type): a dead letter.
pub fn prepare_batch(
    from: &RoutingVersion,
    to: &RoutingVersion,
    location: &Location,
    epoch: i64,
    docs: Vec<Document>,
) -> PreparedBatch {
    let mut batch = PreparedBatch::default();
    for doc in docs {
        let id = doc.get("_id").cloned().unwrap_or(Bson::Null);
        if is_tombstone(&doc) {
            batch.checkpoint.skipped_foreign += 1;
            continue;
        }
        let routed = route(from, to, &doc);
        let (source_here, target) = match routed {
            Ok(r) => r,
            Err(message) => {
                batch.checkpoint.scanned += 1;
                batch.checkpoint.dead_lettered += 1;
                batch.checkpoint.dead_letters.push(NewDeadLetter {
                    doc_id: ids::encode(&id),
                    doc_id_text: ids::text(&id),
                    target: None,
                    code: None,
                    code_name: None,
                    message,
                    attempts: 1,
                });
                continue;
            }
        };
        let (target_location, located) = target;
        if !source_here.contains(location) {
            batch.checkpoint.skipped_foreign += 1;
            continue;
        }
        batch.checkpoint.scanned += 1;
        if &target_location == location {
            match to.routing_field() {
                Some(field) if doc.get(field) != Some(&Bson::Int32(located.sub_bucket as i32)) => {
                    let set = doc! { "$set": { field: located.sub_bucket as i32 } };
                    batch.statements.push(Statement::update(
                        target_location.clone(),
                        id.clone(),
                        set,
                        false,
                    ));
                    batch.kinds.push(Kind::Stamp);
                    batch.ids.push(id);
                    batch.targets.push(target_location);
                }
                _ => batch.checkpoint.already_present += 1,
            }
            continue;
        }
        let copy = copy_document(doc, to, &located, epoch);
        batch.statements.push(Statement::new(
            target_location.clone(),
            id.clone(),
            crate::copy::WriteOp::Insert(copy),
        ));
        batch.kinds.push(Kind::Copy);
        batch.ids.push(id);
        batch.targets.push(target_location);
    }
    batch
}

/// The revert copier's batch: what reshard wrote at target location `location` goes back to
/// the source. A pristine copy needs nothing (the source holds the original); a document the
/// application wrote, or a tombstone, replaces the source document when it is newer by
/// revision (a router mirroring the same write may have been first). Pure.
pub fn prepare_revert(
    from: &RoutingVersion,
    to: &RoutingVersion,
    migration: i64,
    location: &Location,
    docs: Vec<Document>,
) -> PreparedBatch {
    let meta = crate::router::META;
    let mut batch = PreparedBatch::default();
    for doc in docs {
        let id = doc.get("_id").cloned().unwrap_or(Bson::Null);
        let routed = to.document_keys(&doc).ok().and_then(|(tenant, key)| {
            Some((
                to.locate(&tenant, &key).ok()?,
                from.locate(&tenant, &key).ok()?,
            ))
        });
        let Some((target, source)) = routed else {
            batch.checkpoint.skipped_foreign += 1;
            continue;
        };
        if !target.locations.contains(location) {
            batch.checkpoint.skipped_foreign += 1;
            continue;
        }
        batch.checkpoint.scanned += 1;
        let src = doc
            .get_document(meta)
            .ok()
            .and_then(|m| m.get_str("src").ok().map(str::to_owned));
        if src.as_deref() == Some("copy") && !is_tombstone(&doc) {
            batch.checkpoint.already_present += 1;
            continue;
        }
        let (filter, doc) =
            crate::router::mirror_write(doc, migration, from, to, source.sub_bucket);
        let back = source.locations[0].clone();
        batch.statements.push(Statement::new(
            back.clone(),
            id.clone(),
            crate::copy::WriteOp::Update {
                filter,
                update: crate::copy::writer::Modification::Document(doc),
                upsert: true,
            },
        ));
        batch.kinds.push(Kind::Mirror);
        batch.ids.push(id);
        batch.targets.push(back);
    }
    batch
}

/// Cleanup's decision for the documents of one batch, before the target is consulted: which
/// are source documents that moved (and where to), and what is settled without a lookup
/// (documents that never move are kept; skipped dead letters are kept; foreign documents are
/// outside the ledger). Pure.
pub fn cleanup_candidates(
    from: &RoutingVersion,
    to: &RoutingVersion,
    location: &Location,
    skipped: &std::collections::HashSet<String>,
    docs: &[Document],
) -> (Checkpoint, Vec<(Bson, Location)>) {
    let mut checkpoint = Checkpoint::default();
    let mut moved = Vec::new();
    for doc in docs {
        let id = doc.get("_id").cloned().unwrap_or(Bson::Null);
        if is_tombstone(doc) {
            checkpoint.skipped_foreign += 1;
            continue;
        }
        let Ok((source_here, (target, _))) = route(from, to, doc) else {
            // It could not be routed, so it was never copied: it stays.
            checkpoint.scanned += 1;
            checkpoint.kept += 1;
            continue;
        };
        if !source_here.contains(location) {
            checkpoint.skipped_foreign += 1;
            continue;
        }
        checkpoint.scanned += 1;
        if &target == location || skipped.contains(&ids::text(&id)) {
            checkpoint.kept += 1;
            continue;
        }
        moved.push((id, target));
    }
    (checkpoint, moved)
}

type Routed = (Vec<Location>, (Location, crate::routing::Located));

fn route(from: &RoutingVersion, to: &RoutingVersion, doc: &Document) -> Result<Routed, String> {
    let (tenant, id) = from.document_keys(doc)?;
    let source = from.locate(&tenant, &id).map_err(|e| e.to_string())?;
    let target = to.locate(&tenant, &id).map_err(|e| e.to_string())?;
    let first = target
        .locations
        .first()
        .cloned()
        .ok_or_else(|| "the target version names no location".to_owned())?;
    Ok((source.locations, (first, target)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::routing::{Layout, PlacementRange, TenantBuckets};

    fn version(
        hot_buckets: u32,
        placement: &[(u32, u32, &str)],
        field: Option<&str>,
    ) -> RoutingVersion {
        RoutingVersion::new(
            "orders",
            "customerId",
            Layout::Hashed {
                virtual_buckets: 1024,
                default_buckets: 1,
                tenant_buckets: vec![TenantBuckets {
                    tenant: KeyValue::String("hot".into()),
                    buckets: hot_buckets,
                }],
                placement: placement
                    .iter()
                    .map(|(start, end, shard)| PlacementRange {
                        start: *start,
                        end: *end,
                        shard: (*shard).into(),
                    })
                    .collect(),
                routing_field: field.map(String::from),
            },
        )
    }

    const TWO: &[(u32, u32, &str)] = &[(0, 512, "s1"), (512, 1024, "s2")];

    /// A source document of `tenant` with an id chosen so that it moves (or stays).
    fn doc_that(
        from: &RoutingVersion,
        to: &RoutingVersion,
        tenant: &str,
        moves: bool,
    ) -> (Document, Location) {
        for i in 0.. {
            let id = format!("o-{i}");
            let t = KeyValue::String(tenant.into());
            let k = KeyValue::String(id.clone());
            let a = from.locate(&t, &k).unwrap().locations[0].clone();
            let b = to.locate(&t, &k).unwrap().locations[0].clone();
            if (a != b) == moves {
                return (doc! { "_id": id, "customerId": tenant, "total": 5 }, a);
            }
        }
        unreachable!()
    }

    #[test]
    fn moving_documents_are_copied_with_the_routing_field_and_copy_metadata() {
        let (from, to) = (version(1, TWO, None), version(16, TWO, Some("bucket")));
        let (d, here) = doc_that(&from, &to, "hot", true);
        let b = prepare_batch(&from, &to, &here, 7, vec![d.clone()]);
        assert_eq!(b.statements.len(), 1);
        assert_eq!(b.checkpoint.scanned, 1);
        let crate::copy::WriteOp::Insert(copy) = &b.statements[0].op else {
            panic!("{:?}", b.statements[0].op)
        };
        assert_eq!(copy.get_str("_id").unwrap(), d.get_str("_id").unwrap());
        assert!(copy.get_i32("bucket").unwrap() > 0);
        assert_eq!(
            copy.get_document("_reshard").unwrap(),
            &doc! { "src": "copy", "epoch": 7_i64, "rev": 0_i64 }
        );
        assert_ne!(b.targets[0], here);
    }

    #[test]
    fn staying_documents_are_stamped_only_when_the_field_is_missing_or_wrong() {
        let (from, to) = (version(1, TWO, None), version(16, TWO, Some("bucket")));
        let (mut d, here) = doc_that(&from, &to, "hot", false);
        let b = prepare_batch(&from, &to, &here, 1, vec![d.clone()]);
        assert_eq!(b.statements.len(), 1);
        assert!(matches!(
            b.statements[0].op,
            crate::copy::WriteOp::Update { upsert: false, .. }
        ));
        assert_eq!(b.targets[0], here);
        let sub = to
            .locate(
                &KeyValue::String("hot".into()),
                &KeyValue::from_bson(d.get("_id").unwrap()).unwrap(),
            )
            .unwrap()
            .sub_bucket;
        d.insert("bucket", sub as i32);
        let b = prepare_batch(&from, &to, &here, 1, vec![d]);
        assert!(b.statements.is_empty());
        assert_eq!((b.checkpoint.scanned, b.checkpoint.already_present), (1, 1));
    }

    #[test]
    fn foreign_documents_and_tombstones_are_outside_the_ledger_and_unroutable_ones_dead_letter() {
        let (from, to) = (version(1, TWO, None), version(16, TWO, Some("bucket")));
        let (d, here) = doc_that(&from, &to, "hot", true);
        let elsewhere = if here.shard == "s1" {
            from.location_on("s2")
        } else {
            from.location_on("s1")
        };
        let tomb = doc! { "_id": "t", "customerId": "hot", "_reshard": { "deleted": true } };
        let no_tenant = doc! { "_id": "x", "total": 1 };
        let b = prepare_batch(&from, &to, &elsewhere, 1, vec![d, tomb, no_tenant]);
        assert!(b.statements.is_empty());
        assert_eq!(b.checkpoint.skipped_foreign, 2);
        assert_eq!((b.checkpoint.scanned, b.checkpoint.dead_lettered), (1, 1));
        let dl = &b.checkpoint.dead_letters[0];
        assert_eq!(dl.doc_id_text, "x");
        assert!(dl.message.contains("customerId"), "{}", dl.message);
    }
}

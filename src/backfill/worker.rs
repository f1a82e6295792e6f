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

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use mongodb::bson::{doc, Bson, Document, RawDocumentBuf};
use mongodb::options::WriteConcern;
use serde_json::json;
use tokio::sync::watch;
use uuid::Uuid;

use super::plan;
use crate::copy::steps;
use crate::copy::{
    BulkWriter, Deadline, FailureClass, RetryPolicy, Statement, StatementResult, WriterOptions,
};
use crate::disposition::{self, Disposition};
use crate::envelope;
use crate::ids;
use crate::protocol::{
    self, BackfillAction, CleanupAction, CleanupDecision, Found, RevertAction, Side, Step,
};
use crate::routing::{Location, RoutingVersion};
use crate::settings::MigrationSettings;
use crate::shards::read::Merge;
use crate::shards::Shards;
use crate::store::events::{EventKind, NewEvent};
use crate::store::migrations::Migration;
use crate::store::partitions::{Checkpoint, Claim, NewDeadLetter, Partition, Task};
use crate::store::workers::WorkerFigures;
use crate::store::{Store, StoreError};
use crate::throttle::{AdaptiveRate, AppHealth};

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
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct WorkerSummary {
    pub partitions_done: u64,
    pub batches: u64,
    pub documents: u64,
    pub leases_lost: u64,
    /// Why a worker told to exit when done found nothing to do in a migration that is not
    /// over (no task in its phase, and none until an operator acts), one line per migration.
    pub nothing_to_do: Vec<String>,
}

/// A backfill worker over a set of shard connections.
pub struct Worker {
    store: Store,
    shards: Shards,
    config: WorkerConfig,
    /// This worker's registration id (one row per migration it serves).
    id: Uuid,
    /// Figures per migration, kept across the times the worker serves it.
    counters: Mutex<std::collections::HashMap<i64, Arc<Counters>>>,
    /// What the worker last said of each migration it waits on, so that a wait is logged
    /// once when it starts, not on every poll.
    said: Mutex<std::collections::HashMap<i64, String>>,
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
            nothing_to_do: Vec::new(),
        }
    }
}

/// What the partition loops of one migration share.
struct Shared {
    migration: i64,
    task: Task,
    /// [`ids::key`]s of the `_id`s of skipped dead letters: never copied, so never deleted by
    /// cleanup.
    skipped: std::collections::HashSet<Vec<u8>>,
    epoch: i64,
    from: RoutingVersion,
    to: RoutingVersion,
    rate: Arc<Mutex<AdaptiveRate>>,
    /// A latency budget holds the backfill: batches follow the rate ([`throttle::batch_size`]).
    budgeted: AtomicBool,
    settings: Mutex<MigrationSettings>,
    writer: Mutex<BulkWriter>,
    counters: Arc<Counters>,
    /// Cleared when the migration leaves `backfill`, pauses or fails, or on shutdown.
    runnable: AtomicBool,
}

impl Shared {
    /// The batch size to read now: the configured one, or under a latency budget a tenth of
    /// a second of the applied rate ([`crate::throttle::batch_size`]).
    fn batch_size(&self) -> usize {
        let configured = self.settings.lock().unwrap().batch_size;
        let applied = self.rate.lock().unwrap().applied();
        crate::throttle::batch_size(applied, configured, self.budgeted.load(Ordering::Relaxed))
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
    /// A command ran out of the time the lease left it: the lease is still ours, but what the
    /// command did is unknown until its deadline and a fence margin have passed. The holder
    /// cuts the partition's batches and starts again from its checkpoint (what the timed-out
    /// batch did, and what later batches did, is written again harmlessly).
    TimedOut {
        /// Statements in the batch that timed out.
        statements: usize,
        /// Documents read for it.
        documents: usize,
        /// The time its deadline left it when it was sent.
        budget: Duration,
        location: Location,
    },
}

impl PartitionEnd {
    /// Which end wins when several reasons to stop meet: a lost lease forbids recording
    /// anything; a timed-out command forbids releasing the partition before a fence margin
    /// has passed; a failure that may pass is worth its message; a plain release is the
    /// weakest.
    fn rank(&self) -> u8 {
        match self {
            PartitionEnd::Released => 0,
            PartitionEnd::Retry(_) => 1,
            PartitionEnd::TimedOut { .. } => 2,
            PartitionEnd::LeaseLost => 3,
            PartitionEnd::Done => 4,
        }
    }

    /// `end` after `why` met it: the stronger of the two.
    fn outrank(end: &mut Option<PartitionEnd>, why: PartitionEnd) {
        if end.as_ref().is_none_or(|e| why.rank() > e.rank()) {
            *end = Some(why);
        }
    }
}

impl Worker {
    /// A worker over connections to every registered shard. Writes are not retried by the
    /// driver: the bulk writer owns retries and must see every overload rejection.
    pub async fn connect(
        store: Store,
        config: WorkerConfig,
    ) -> Result<Worker, crate::error::Error> {
        let shards = Shards::connect(&store.shards().await?, true)
            .await
            .map_err(|e| crate::error::Error::BadInput(e.to_string()))?;
        Ok(Worker::with_shards(store, shards, config))
    }

    pub fn with_shards(store: Store, shards: impl Into<Shards>, config: WorkerConfig) -> Worker {
        Worker {
            store,
            shards: shards.into(),
            config,
            id: Uuid::new_v4(),
            counters: Mutex::default(),
            said: Mutex::default(),
        }
    }

    /// Works until `shutdown` turns true (then finishes or abandons the batches in flight and
    /// releases its leases), or, with `exit_when_done`, until the backfill is done.
    pub async fn run(&self, shutdown: watch::Receiver<bool>) -> Result<WorkerSummary, WorkerError> {
        let mut summary = WorkerSummary::default();
        // Migrations this worker registered for while waiting for their backfill.
        let mut waiting = std::collections::BTreeSet::new();
        let result = self.work(shutdown, &mut summary, &mut waiting).await;
        for id in waiting {
            // Counted out at once rather than when the registration's lease runs out.
            self.store.stop_worker(self.id, id).await?;
        }
        result.map(|()| summary)
    }

    async fn work(
        &self,
        shutdown: watch::Receiver<bool>,
        summary: &mut WorkerSummary,
        waiting: &mut std::collections::BTreeSet<i64>,
    ) -> Result<(), WorkerError> {
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
            let mut nothing_to_do = Vec::new();
            for m in migrations {
                if *shutdown.borrow() {
                    break;
                }
                if let Some(reason) = &m.failure_reason {
                    // Nothing to do until an operator resumes or rolls back; a worker told to
                    // exit when done does not wait for that.
                    if self.say_once(m.id, reason) {
                        tracing::warn!(migration_id = m.id, "the migration failed: {reason}");
                    }
                    if self.config.exit_when_done {
                        nothing_to_do.push(format!(
                            "migration {} failed ({reason}): nothing to do until an operator \
                             resumes it or rolls it back",
                            m.id
                        ));
                    } else {
                        all_done = false;
                    }
                    continue;
                }
                // What the worker waits for, when it has nothing to do in this migration now
                // and the migration is not over.
                let waits_for = match Task::of(m.phase()) {
                    // Before backfill: the worker waits for it, registered, so that the
                    // planner cuts the backfill for this worker too. After: nothing is left
                    // for this worker.
                    None if m.backfill_planned_at.is_none() && !m.phase().is_terminal() => {
                        Some(format!(
                            "migration {} is in {}: workers have a task once it is advanced to \
                             backfill",
                            m.id,
                            m.phase()
                        ))
                    }
                    None => continue,
                    Some(_) if m.paused => Some(format!(
                        "migration {} is paused: its workers resume with `reshard migration \
                         resume {}`",
                        m.id, m.id
                    )),
                    Some(_) => None,
                };
                if let Some(why) = waits_for {
                    // A worker told to exit when done waits only for what comes without an
                    // operator: the next moves of a playbook that drives the migration now.
                    let playbook = self.store.playbook_driving(m.id).await?;
                    if self.config.exit_when_done && playbook.is_none() {
                        nothing_to_do.push(format!(
                            "{why}, and no playbook drives it: nothing to do until an operator \
                             acts"
                        ));
                        continue;
                    }
                    all_done = false;
                    if Task::of(m.phase()).is_none() {
                        self.register(m.id).await?;
                        waiting.insert(m.id);
                    }
                    if self.say_once(m.id, &why) {
                        match &playbook {
                            Some(name) => tracing::info!(
                                migration_id = m.id,
                                "{why}; waiting (playbook {name} drives it)"
                            ),
                            None => tracing::info!(migration_id = m.id, "{why}; waiting"),
                        }
                    }
                    continue;
                }
                let Some(task) = Task::of(m.phase()) else {
                    continue;
                };
                // A shard registered after this worker started is connected before the task
                // that names it is planned or worked on.
                if let Err(why) = self.connect_shards(&m).await? {
                    all_done = false;
                    if self.say_once(m.id, &why) {
                        tracing::warn!(migration_id = m.id, "{why}; waiting");
                    }
                    continue;
                }
                if !self.planned(&m, task).await? {
                    all_done = false;
                    continue;
                }
                let m = self.store.migration(m.id).await?;
                // Working again: a later wait is news again.
                self.said.lock().unwrap().remove(&m.id);
                let s = self.serve(&m, task, shutdown.clone()).await?;
                worked |= s.batches > 0 || s.partitions_done > 0;
                summary.partitions_done += s.partitions_done;
                summary.batches += s.batches;
                summary.documents += s.documents;
                summary.leases_lost += s.leases_lost;
                let totals = self.store.task_totals(m.id, task).await?;
                if totals.done < totals.partitions {
                    all_done = false;
                }
            }
            if self.config.exit_when_done && all_done {
                for line in &nothing_to_do {
                    tracing::info!("{line}; exiting (--exit-when-done)");
                }
                summary.nothing_to_do = nothing_to_do;
                break;
            }
            if *shutdown.borrow() {
                break;
            }
            if !worked {
                tokio::select! {
                    _ = tokio::time::sleep(self.config.idle_poll) => {}
                    _ = stopped(shutdown.clone()) => {}
                }
            }
        }
        Ok(())
    }

    /// Connects every shard the migration's versions name that this worker has no
    /// connection for yet (registered after it started). `Ok(Err(why))`: one is not
    /// registered, or does not answer; the task waits for it.
    async fn connect_shards(&self, m: &Migration) -> Result<Result<(), String>, WorkerError> {
        let (from, to) = self.versions(m).await?;
        let mut wanted = from.shards();
        wanted.extend(to.shards());
        if wanted.iter().all(|s| self.shards.contains(s)) {
            return Ok(Ok(()));
        }
        let registered = self.store.shards().await?;
        Ok(match self.shards.ensure(&wanted, &registered).await {
            Ok(connected) => {
                for shard in connected {
                    tracing::info!(
                        migration_id = m.id,
                        shard,
                        "connected to a shard registered since this worker started"
                    );
                }
                Ok(())
            }
            Err(e) => Err(e.to_string()),
        })
    }

    /// Whether `what` is news about the migration (not what the worker said of it last).
    fn say_once(&self, migration: i64, what: &str) -> bool {
        let mut said = self.said.lock().unwrap();
        if said.get(&migration).is_some_and(|s| s == what) {
            return false;
        }
        said.insert(migration, what.to_owned());
        true
    }

    /// Registers (or renews) this worker for a migration.
    async fn register(&self, migration: i64) -> Result<(), WorkerError> {
        self.store
            .register_worker(
                self.id,
                migration,
                &self.config.name,
                &crate::identity::hostname(),
                std::process::id(),
                self.config.lease_ttl,
            )
            .await?;
        Ok(())
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
            // A full reconciliation plans its own partitions (`reshard reconcile --full`).
            Task::Verify => return Ok(false),
        };
        if planned_at.is_some() {
            if task == Task::Revert {
                // A router that lapsed behind the copier outdates it: it starts over.
                self.store
                    .replan_revert_if_outdated(m.id, &self.config.actor)
                    .await?;
            }
            return Ok(true);
        }
        match task {
            Task::Verify => return Ok(false),
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
                    if self.say_once(m.id, "revert waits for routers") {
                        tracing::info!(
                            migration_id = m.id,
                            routers = missing.len(),
                            "revert copy waits for every live router to acknowledge reverting"
                        );
                    }
                    return Ok(false);
                }
                let (from, to) = self.versions(m).await?;
                let partitions = plan::plan_revert(&to);
                if self
                    .store
                    .store_plan(
                        m.id,
                        Task::Revert,
                        &partitions,
                        &self.config.actor,
                        json!({ "partitions": partitions.len() }),
                    )
                    .await?
                {
                    self.size_unread_partitions(m.id, Task::Revert, from);
                }
            }
        }
        Ok(true)
    }

    /// Sizes (and where needed samples) the source and stores the partitions, cut for the
    /// workers registered for the migration (first planner wins).
    async fn plan(&self, m: &Migration) -> Result<(), WorkerError> {
        let (from, to) = self.versions(m).await?;
        let settings = Self::settings_of(m)?;
        self.register(m.id).await?;
        let workers = self.store.live_workers(m.id).await?;
        let plans = plan::plan(&from, &to, &self.shards, &settings, workers)
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
                migration_id = m.id,
                partitions = partitions.len(),
                "backfill planned"
            );
            self.size_unread_partitions(m.id, Task::Backfill, from);
        }
        Ok(())
    }

    /// Estimates, off the copy's path, the size of the partitions planned without reading
    /// their location (progress and ETA only).
    fn size_unread_partitions(&self, migration: i64, task: Task, from: RoutingVersion) {
        let (store, shards) = (self.store.clone(), self.shards.clone());
        tokio::spawn(async move {
            let partitions = match store.partitions(migration, task).await {
                Ok(partitions) => partitions,
                Err(e) => {
                    return tracing::warn!(
                        migration_id = migration,
                        "sizing the {task} failed: {e}"
                    )
                }
            };
            for p in partitions.iter().filter(|p| p.approx_documents.is_none()) {
                let sized = match plan::size_of(&from, &shards, p).await {
                    Ok(n) => store
                        .set_partition_size(p.id, n)
                        .await
                        .map_err(|e| e.to_string()),
                    Err(e) => Err(e.to_string()),
                };
                if let Err(e) = sized {
                    tracing::warn!(
                        migration_id = migration,
                        partition = p.id,
                        "sizing the {task} failed: {e}"
                    );
                }
            }
        });
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
        BulkWriter::new(self.shards.entries(), options).with_overload_sink(Arc::new(sink))
    }

    /// Works on one migration until its partitions run out, it stops being runnable, or
    /// shutdown.
    async fn serve(
        &self,
        m: &Migration,
        task: Task,
        shutdown: watch::Receiver<bool>,
    ) -> Result<WorkerSummary, WorkerError> {
        let skipped = ids::keys_of_encoded(&self.store.skipped_ids(m.id).await?);
        let (from, to) = self.versions(m).await?;
        let settings = Self::settings_of(m)?;
        let worker_id = self.id;
        let ttl = self.config.lease_ttl;
        self.register(m.id).await?;
        let live = self
            .store
            .worker_heartbeat(worker_id, m.id, ttl, &WorkerFigures::default())
            .await?;
        // With a latency budget the rate starts slow and doubles while the application keeps
        // within it (its first batches reach the application before a router can report).
        let budgeted = crate::throttle::latency_budget_ms(
            settings.latency_budget_ms,
            settings.latency_budget_factor,
            m.app_p99_baseline_ms,
        )
        .is_some();
        let share = settings.throttle_share(live);
        let rate = Arc::new(Mutex::new(if budgeted {
            AdaptiveRate::with_slow_start(share, Instant::now())
        } else {
            AdaptiveRate::new(share, Instant::now())
        }));
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
            budgeted: AtomicBool::new(budgeted),
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
            nothing_to_do: Vec::new(),
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
        let mut app_window = crate::throttle::AppWindow::new(crate::throttle::APP_WINDOW);
        let mut app_over = false;
        let mut last_app_event: Option<Instant> = None;
        let mut last_floor_warning: Option<Instant> = None;
        let first_documents = shared.counters.documents.load(Ordering::Relaxed);
        let mut copying = false;
        let mut last_log = Instant::now();
        let mut last_logged_documents = shared.counters.documents.load(Ordering::Relaxed);
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
                    migration_id = shared.migration,
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
                        &NewEvent::new(
                            EventKind::RateCut,
                            json!({
                                "worker": self.config.name,
                                "cuts": cuts - reported_cuts,
                                "applied_docs_per_sec": applied,
                                "max_docs_per_sec": max,
                                "overloads": figures.overloads,
                                "retries": figures.retries,
                            }),
                        ),
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
                tracing::warn!(migration_id = shared.migration, "{reason}");
                self.store
                    .record_event(
                        shared.migration,
                        &self.config.actor,
                        &NewEvent::new(
                            EventKind::CapacitySignal,
                            json!({
                                "worker": self.config.name,
                                "applied_docs_per_sec": applied,
                                "overloads": figures.overloads,
                            }),
                        )
                        .reason(Some(&reason)),
                    )
                    .await?;
                last_capacity_event = Some(now);
            }
            // The application sets the pace: its routers' latency against its budget.
            let budget = crate::throttle::latency_budget_ms(
                settings.latency_budget_ms,
                settings.latency_budget_factor,
                m.app_p99_baseline_ms,
            );
            shared.budgeted.store(budget.is_some(), Ordering::Relaxed);
            // The application is judged from this worker's first recorded batch on: before
            // it, nothing the worker wrote can be the cause, and cutting cannot help (the
            // local stand-in answers nothing for seconds while it prepares a scan's first
            // batch; MongoDB streams an index scan).
            if !copying && documents > first_documents {
                copying = true;
                app_window.restart();
            }
            if budget.is_some() && copying {
                let reports = self.store.app_reports(&m.collection).await?;
                // Judged when a router reported (routers report every heartbeat interval,
                // this loop runs more often), over the window of their recent reports.
                if app_window.observe(&reports, now) {
                    let health = app_window.judge(budget);
                    if let AppHealth::Over {
                        p99_ms,
                        budget_ms,
                        error_rate,
                    } = health
                    {
                        let cut = shared.rate.lock().unwrap().on_app_over_budget(now);
                        // What routers report from now on says whether the cut was enough.
                        app_window.restart();
                        if cut {
                            let applied = shared.rate.lock().unwrap().applied();
                            shared.counters.rate_cuts.fetch_add(1, Ordering::Relaxed);
                            crate::telemetry::rate(
                                shared.migration,
                                shared.task.as_str(),
                                applied,
                                true,
                            );
                            // Reported here with its cause, not again as a plain cut.
                            reported_cuts += 1;
                            // Announced when it starts, and again every 10 s while it lasts.
                            if !app_over
                                || last_app_event.is_none_or(|t| {
                                    now.duration_since(t) >= Duration::from_secs(10)
                                })
                            {
                                last_app_event = Some(now);
                                let batch = shared.batch_size();
                                let reason = format!(
                                    "the application's p99 is {p99_ms:.1} ms (budget \
                                     {budget_ms:.1} ms, errors {:.1} %): rate cut to \
                                     {applied:.0} docs/s and batches to {batch} documents \
                                     for this worker",
                                    error_rate * 100.0
                                );
                                tracing::warn!(migration_id = shared.migration, "{reason}");
                                self.store
                                    .record_event(
                                        shared.migration,
                                        &self.config.actor,
                                        &NewEvent::new(
                                            EventKind::RateCut,
                                            json!({
                                                "worker": self.config.name,
                                                "cause": "app_latency",
                                                "app_p99_ms": p99_ms,
                                                "latency_budget_ms": budget_ms,
                                                "app_error_rate": error_rate,
                                                "applied_docs_per_sec": applied,
                                                "max_docs_per_sec": max,
                                                "batch_size": batch,
                                            }),
                                        )
                                        .reason(Some(&reason)),
                                    )
                                    .await?;
                            }
                        } else if last_floor_warning
                            .is_none_or(|t| now.duration_since(t) >= Duration::from_secs(60))
                        {
                            // Nothing left to cut: the budget may be tighter than the
                            // application keeps without a backfill, or the slowness is not
                            // the backfill's.
                            last_floor_warning = Some(now);
                            tracing::warn!(
                                migration_id = shared.migration,
                                app_p99_ms = p99_ms,
                                latency_budget_ms = budget_ms,
                                applied_docs_per_sec = shared.rate.lock().unwrap().applied(),
                                "the application is over its latency budget with this worker \
                                 at its slowest"
                            );
                        }
                        app_over = true;
                    } else if let AppHealth::Within { p99_ms, budget_ms } = health {
                        if app_over {
                            tracing::info!(
                                migration_id = shared.migration,
                                app_p99_ms = p99_ms,
                                latency_budget_ms = budget_ms,
                                "the application is back within its latency budget: the rate \
                                 steps back up"
                            );
                        }
                        app_over = false;
                        // A slow start grows only on this evidence; what routers report
                        // from now on judges the new rate.
                        if shared.rate.lock().unwrap().on_app_within_budget(now) {
                            app_window.restart();
                        }
                    }
                }
            }
            let since_log = now.duration_since(last_log);
            if since_log >= PROGRESS_EVERY {
                let totals = self
                    .store
                    .task_totals(shared.migration, shared.task)
                    .await?;
                let rate = (documents - last_logged_documents) as f64 / since_log.as_secs_f64();
                tracing::info!(
                    migration_id = shared.migration,
                    task = %shared.task,
                    documents,
                    docs_per_sec = format!("{rate:.0}"),
                    applied_docs_per_sec = format!("{applied:.0}"),
                    partitions_done = totals.done,
                    partitions = totals.partitions,
                    "progress"
                );
                last_log = now;
                last_logged_documents = documents;
            }
        }
    }

    /// Cleanup's batch: deletes of the moved documents whose target holds a copy or a
    /// tombstone. `Err(reason)` names a moved document the target does not hold: deleting it
    /// would lose it, so cleanup stops there and nothing of the batch is deleted.
    ///
    /// The lookup step ([`protocol::cleanup_lookup_step`]) is a step of a merge with each
    /// target location's own scan of the partition's range (`targets`), in `_id` order: each
    /// document of either side is read once, rather than an `$in` per batch and target. A
    /// scan only reports what it read, so it can stop cleanup wrongly (a copy that landed
    /// behind it) but never let it delete what the target lacks.
    async fn prepare_cleanup(
        &self,
        shared: &Shared,
        location: &Location,
        docs: Vec<Document>,
        targets: &mut BTreeMap<Location, Merge>,
    ) -> Result<Result<PreparedBatch, String>, WorkerError> {
        let (checkpoint, moved) =
            cleanup_candidates(&shared.from, &shared.to, location, &shared.skipped, &docs);
        let mut found: HashMap<Vec<u8>, Document> = HashMap::new();
        for (id, d) in &moved {
            let Disposition::Moves { target, .. } = d else {
                continue;
            };
            let Some(merge) = targets.get_mut(target) else {
                continue;
            };
            match merge.seek(Some(id), |_| {}).await {
                Ok(Some(doc)) => {
                    found.insert(ids::key(id), doc.clone());
                }
                Ok(None) => {}
                Err(e) => {
                    return Err(WorkerError::Invalid {
                        migration: shared.migration,
                        message: e.to_string(),
                    })
                }
            }
        }
        let context = steps::Context {
            from: &shared.from,
            to: &shared.to,
            migration: shared.migration,
            epoch: shared.epoch,
        };
        let mut batch = PreparedBatch {
            checkpoint,
            ..PreparedBatch::default()
        };
        for (id, d) in moved {
            let target = match &d {
                Disposition::Moves { target, .. } => target.clone(),
                _ => unreachable!("only documents that move are looked up"),
            };
            let in_target = match found.get(&ids::key(&id)) {
                None => Found::Absent,
                Some(t) if envelope::is_tombstone(t) => Found::Tombstone,
                Some(t) => Found::Live(t.clone()),
            };
            match protocol::cleanup_decision(&in_target) {
                CleanupDecision::Missing => {
                    return Ok(Err(format!(
                        "cleanup stopped: _id {} at {location} is missing from its target \
                         {target}; nothing of its batch was deleted (reconcile and repair, then \
                         resume)",
                        ids::text(&id)
                    )));
                }
                CleanupDecision::DeleteSource => batch.push(
                    protocol::cleanup_delete_step::<Document, Document>(),
                    Kind::Delete,
                    &id,
                    location,
                    &d,
                    None,
                    &context,
                ),
            }
        }
        Ok(Ok(batch))
    }

    /// Fails the migration with `reason` (an invariant would break); workers stop, the
    /// operator decides.
    async fn fail_migration(&self, shared: &Shared, reason: &str) -> Result<(), WorkerError> {
        tracing::error!(migration_id = shared.migration, "{reason}");
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

    /// Reports a partition whose last attempts in a row recorded nothing
    /// ([`crate::store::partitions::STALLED_AFTER`]), when it stalls and again each time the
    /// count doubles: an event (its row, log line and metric), so that a partition taken over
    /// again and again, or timing out at its smallest batch, is seen rather than retried in
    /// silence.
    async fn report_stall(&self, shared: &Shared, p: &Partition) -> Result<(), WorkerError> {
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
    async fn work_partition(
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
        // Cleanup looks its documents up in the target locations' own scans of the range.
        // Every scan is opened at once: a server may answer a sorted query only once it has
        // read the whole range (the local stand-in does), and those waits should overlap.
        let targets: Vec<Location> = match shared.task {
            Task::Cleanup => shared
                .to
                .locations()
                .into_iter()
                .filter(|t| *t != location)
                .collect(),
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

    /// What a written batch brings to its partition's checkpoint, from the writer's report;
    /// `Err` when the batch may not be recorded (a write past the lease's deadline, or a
    /// statement that failed transiently on every attempt).
    fn settle(
        &self,
        shared: &Shared,
        report: crate::copy::BatchReport,
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
                StatementResult::Inserted => checkpoint.inserted += 1,
                StatementResult::Applied => match batch.kinds[i] {
                    Kind::Stamp => checkpoint.stamped += 1,
                    Kind::Delete => checkpoint.deleted += 1,
                    Kind::Copy | Kind::Mirror => checkpoint.inserted += 1,
                },
                StatementResult::AlreadyPresent | StatementResult::DroppedDuplicate { .. } => {
                    checkpoint.already_present += 1
                }
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
    async fn recount_pending_deletes(
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
        let mut present = std::collections::HashSet::new();
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

    /// How long before its partition lease ends a worker stops writing (and how long after it
    /// another worker may take the partition over): a fifth of the lease.
    fn fence_margin(&self) -> Duration {
        self.config.lease_ttl / 5
    }
}

/// Why the deletes of an earlier attempt could not be counted.
enum RecountError {
    /// Reading the source failed (a failure that may pass: the partition is retried).
    Read(String),
    Store(StoreError),
}

impl From<StoreError> for RecountError {
    fn from(e: StoreError) -> Self {
        RecountError::Store(e)
    }
}

/// Whether what settled may still be recorded: not once the lease is lost.
fn end_allows_recording(end: &Option<PartitionEnd>) -> bool {
    !matches!(end, Some(PartitionEnd::LeaseLost))
}

/// A batch sent, with what its checkpoint needs once the writer reports.
struct Unsettled {
    kinds: Vec<Kind>,
    ids: Vec<Bson>,
    targets: Vec<Location>,
    /// What was settled without writing.
    checkpoint: Checkpoint,
    last_id: Bson,
    /// When its documents were read.
    started: Instant,
    /// The time its deadline left it when it was sent.
    budget: Duration,
    /// Documents read for it.
    documents: usize,
}

/// A batch that settled well: its part of the partition's checkpoint.
struct Settled {
    checkpoint: Checkpoint,
    /// From its read to its acknowledgement.
    took: Duration,
}

/// Batches recorded by one checkpoint.
struct Recorded {
    /// `false`: the lease is no longer this worker's.
    kept: bool,
    /// When the checkpoint was sent (the lease runs from then).
    started: Instant,
    batches: Vec<Settled>,
}

/// How often a worker logs its progress (at info level; batches and documents are never
/// logged one by one there).
const PROGRESS_EVERY: Duration = Duration::from_secs(10);

/// A partition's `_id` range as text: `[lower, upper)`, `min`/`max` where open.
fn range_text(p: &Partition) -> String {
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

/// A partition's scan: the backfill's reads the documents as the server sent them (its copies
/// are built from those bytes, [`steps::Scanned`]); the other tasks' parse them.
enum PartitionScan {
    Parsed(crate::shards::read::Scan),
    Raw(crate::shards::read::Scan<RawDocumentBuf>),
}

/// A batch a [`PartitionScan`] read.
enum ReadBatch {
    Parsed(Vec<Document>),
    Raw(Vec<RawDocumentBuf>),
}

impl PartitionScan {
    async fn next_batch(&mut self) -> Result<ReadBatch, crate::shards::read::ReadError> {
        Ok(match self {
            PartitionScan::Parsed(scan) => ReadBatch::Parsed(scan.next_batch().await?),
            PartitionScan::Raw(scan) => ReadBatch::Raw(scan.next_batch().await?),
        })
    }
}

impl ReadBatch {
    fn len(&self) -> usize {
        match self {
            ReadBatch::Parsed(docs) => docs.len(),
            ReadBatch::Raw(docs) => docs.len(),
        }
    }

    /// The `_id` of the last document: the checkpoint's resume point.
    fn last_id(&self) -> Bson {
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
    /// Mirrors whose source version lists several locations for their id (a `fanout`
    /// source): statement index and the listed locations. Each goes where the id's source
    /// document is, looked up before the batch is written ([`place_mirrors`]).
    pub lookups: Vec<(usize, Vec<Location>)>,
    /// The revert copier's mirrors: statement index and the revision of the target image it
    /// carries. Those a router already mirrored are left out before the batch is written
    /// ([`skip_mirrored`]).
    pub mirrors: Vec<(usize, i64)>,
}

impl PreparedBatch {
    /// Adds the statement of a protocol step. A step that does not fit its document is a bug
    /// in the decisions: it becomes a dead letter naming it, so nothing is written blindly
    /// and the ledger still balances.
    #[allow(clippy::too_many_arguments)]
    fn push<D: steps::Scanned>(
        &mut self,
        step: Step<D, Document>,
        kind: Kind,
        id: &Bson,
        scanned: &Location,
        d: &Disposition,
        image: Option<&Document>,
        context: &steps::Context<'_>,
    ) {
        match steps::statement(step, id, scanned, d, image, context) {
            Ok(statement) => {
                self.targets.push(statement.location.clone());
                self.statements.push(statement);
                self.kinds.push(kind);
                self.ids.push(id.clone());
            }
            Err(e) => {
                self.checkpoint.dead_lettered += 1;
                self.checkpoint.dead_letters.push(NewDeadLetter {
                    doc_id: ids::encode(id),
                    doc_id_text: ids::text(id),
                    target: None,
                    code: None,
                    code_name: None,
                    message: e.to_string(),
                    attempts: 1,
                });
            }
        }
    }
}

/// The backfill's batch: for each document read at `location`, its disposition
/// ([`disposition::of`]) and the protocol's decision ([`protocol::backfill_action`]), the
/// step it asks for turned into a statement ([`crate::copy::steps::statement`]). Pure.
///
/// - a document that moves: the insert-if-absent of its pristine copy at its target;
/// - a document that stays: its routing field stamped when missing or different, else
///   nothing to do (`already_present`);
/// - a tombstone, or a document of the other layout in a collection both share: not a source
///   document, outside the ledger (`skipped_foreign`);
/// - a document that cannot be routed: a dead letter.
pub fn prepare_batch<D: steps::Scanned>(
    from: &RoutingVersion,
    to: &RoutingVersion,
    location: &Location,
    epoch: i64,
    docs: Vec<D>,
) -> PreparedBatch {
    let context = steps::Context {
        from,
        to,
        migration: 0,
        epoch,
    };
    let mut batch = PreparedBatch::default();
    for doc in docs {
        // What routing reads, parsed (a raw document's other fields are copied unparsed).
        let (id, d) = match doc.head(from, to) {
            Ok(head) => (
                head.get("_id").cloned().unwrap_or(Bson::Null),
                disposition::of(Side::Source, from, to, location, &head),
            ),
            Err(reason) => (Bson::Null, Disposition::Unroutable { reason }),
        };
        if d.is_source_document() {
            batch.checkpoint.scanned += 1;
        }
        match protocol::backfill_action(&d, doc, envelope::stamp) {
            BackfillAction::Write(step) => {
                let kind = match step {
                    Step::UpdateLive(..) => Kind::Stamp,
                    _ => Kind::Copy,
                };
                batch.push(step, kind, &id, location, &d, None, &context);
            }
            BackfillAction::InPlace => batch.checkpoint.already_present += 1,
            BackfillAction::Skip => batch.checkpoint.skipped_foreign += 1,
            BackfillAction::DeadLetter(message) => {
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
            }
        }
    }
    batch
}

/// The revert copier's batch: what reshard wrote at target location `location` goes back to
/// the source ([`protocol::revert_action`]): a pristine copy needs nothing (the source holds
/// the original); a document the application wrote, or a tombstone, replaces the source
/// document when it is newer by revision (a router mirroring the same write may have been
/// first). Pure.
pub fn prepare_revert(
    from: &RoutingVersion,
    to: &RoutingVersion,
    migration: i64,
    location: &Location,
    docs: Vec<Document>,
) -> PreparedBatch {
    let context = steps::Context {
        from,
        to,
        migration,
        epoch: 0,
    };
    let mut batch = PreparedBatch::default();
    for doc in docs {
        let id = doc.get("_id").cloned().unwrap_or(Bson::Null);
        let d = disposition::of(Side::Target, from, to, location, &doc);
        match protocol::revert_action::<Document, Document>(&d, location) {
            RevertAction::Write(step) => {
                batch.checkpoint.scanned += 1;
                let at = batch.statements.len();
                batch.push(step, Kind::Mirror, &id, location, &d, Some(&doc), &context);
                if batch.statements.len() > at {
                    batch.mirrors.push((at, envelope::revision(&doc)));
                }
                let listed = from
                    .document_keys(&doc)
                    .ok()
                    .and_then(|(t, i)| from.locate(&t, &i).ok())
                    .map(|l| l.locations)
                    .unwrap_or_default();
                if batch.statements.len() > at && listed.len() > 1 {
                    batch.lookups.push((at, listed));
                }
            }
            RevertAction::InPlace => {
                batch.checkpoint.scanned += 1;
                batch.checkpoint.already_present += 1;
            }
            RevertAction::Skip => batch.checkpoint.skipped_foreign += 1,
        }
    }
    batch
}

/// Sends each mirror of `batch` whose source version lists several locations for its id (a
/// `fanout` source, [`PreparedBatch::lookups`]) to where the id's source document is: the
/// first listed location that holds it, as a router's read finds it, or the first listed when
/// none does (an id created since the switch). Writing to the first listed location
/// regardless would leave the source document beside a new one: after the rollback a read
/// could find the older one, and a mirrored delete would not remove it. One `$in` query per
/// listed location.
pub async fn place_mirrors(
    shards: &crate::shards::Shards,
    batch: &mut PreparedBatch,
) -> Result<(), crate::shards::read::ReadError> {
    let lookups = std::mem::take(&mut batch.lookups);
    let mut wanted: BTreeMap<Location, Vec<Bson>> = BTreeMap::new();
    for (i, listed) in &lookups {
        for l in listed {
            wanted
                .entry(l.clone())
                .or_default()
                .push(batch.ids[*i].clone());
        }
    }
    let mut held: BTreeMap<Location, std::collections::HashSet<Vec<u8>>> = BTreeMap::new();
    for (location, ids) in wanted {
        let found = shards
            .find_by_ids(&location, &ids, Some(doc! { "_id": 1 }))
            .await?;
        held.insert(location, found.into_keys().collect());
    }
    for (i, listed) in lookups {
        let key = ids::key(&batch.ids[i]);
        let holds: Vec<bool> = listed
            .iter()
            .map(|l| held.get(l).is_some_and(|h| h.contains(&key)))
            .collect();
        if let Some(holder) = protocol::mirror_location(&listed, &holds) {
            batch.statements[i].location = holder.clone();
            batch.targets[i] = holder.clone();
        }
    }
    Ok(())
}

/// Leaves out the mirrors of `batch` that would change nothing: the source document each
/// would replace (where [`place_mirrors`] put it) already holds this migration's mirror of an
/// equal or newer revision ([`protocol::mirror_is_newer`]), because a router in `reverting`
/// mirrored the write before it answered. Their upserts would be refused, now and later (only
/// newer mirrors write the source meanwhile), and each costs the source's primary a write (and
/// its write concern) for nothing; they count as already present, as a refused upsert does.
/// One `$in` query per location.
pub async fn skip_mirrored(
    shards: &crate::shards::Shards,
    batch: &mut PreparedBatch,
    migration: i64,
) -> Result<(), crate::shards::read::ReadError> {
    let mirrors = std::mem::take(&mut batch.mirrors);
    if mirrors.is_empty() {
        return Ok(());
    }
    let mut wanted: BTreeMap<Location, Vec<Bson>> = BTreeMap::new();
    for (i, _) in &mirrors {
        wanted
            .entry(batch.statements[*i].location.clone())
            .or_default()
            .push(batch.ids[*i].clone());
    }
    let meta = envelope::META;
    let mut found: BTreeMap<Location, HashMap<Vec<u8>, Document>> = BTreeMap::new();
    for (location, ids) in wanted {
        let projection = doc! { "_id": 1, format!("{meta}.mig"): 1, format!("{meta}.rev"): 1 };
        found.insert(
            location.clone(),
            shards
                .find_by_ids(&location, &ids, Some(projection))
                .await?,
        );
    }
    let mut keep = vec![true; batch.statements.len()];
    for (i, image_rev) in mirrors {
        let held = found
            .get(&batch.statements[i].location)
            .and_then(|f| f.get(&ids::key(&batch.ids[i])));
        let source = match held.map(|d| d.get_document(meta).ok()) {
            None => protocol::MirrorSource::Absent,
            Some(meta) => match meta {
                Some(m) if m.get("mig").and_then(bson_i64) == Some(migration) => {
                    protocol::MirrorSource::Mirrored(m.get("rev").and_then(bson_i64))
                }
                _ => protocol::MirrorSource::Unmirrored,
            },
        };
        if !protocol::mirror_is_newer(source, image_rev) {
            keep[i] = false;
            batch.checkpoint.already_present += 1;
        }
    }
    retain_kept(&mut batch.statements, &keep);
    retain_kept(&mut batch.kinds, &keep);
    retain_kept(&mut batch.ids, &keep);
    retain_kept(&mut batch.targets, &keep);
    Ok(())
}

/// Keeps the entries of `v` whose `keep` flag (by position) is set.
fn retain_kept<T>(v: &mut Vec<T>, keep: &[bool]) {
    let mut flags = keep.iter();
    v.retain(|_| *flags.next().expect("one flag per entry"));
}

/// An integer field, whatever its width.
fn bson_i64(b: &Bson) -> Option<i64> {
    match b {
        Bson::Int32(v) => Some(i64::from(*v)),
        Bson::Int64(v) => Some(*v),
        _ => None,
    }
}

/// Cleanup's decision for the documents of one batch, before the target is consulted
/// ([`protocol::cleanup_action`]): which are source documents that moved (and where to), and
/// what is settled without a lookup (documents that never move, cannot be routed, or whose
/// dead letter an operator skipped are kept; tombstones and the other layout's documents are
/// outside the ledger). Pure.
pub fn cleanup_candidates(
    from: &RoutingVersion,
    to: &RoutingVersion,
    location: &Location,
    skipped: &std::collections::HashSet<Vec<u8>>,
    docs: &[Document],
) -> (Checkpoint, Vec<(Bson, Disposition)>) {
    let mut checkpoint = Checkpoint::default();
    let mut moved = Vec::new();
    for doc in docs {
        let id = doc.get("_id").cloned().unwrap_or(Bson::Null);
        let d = disposition::of(Side::Source, from, to, location, doc);
        match protocol::cleanup_action(&d, !skipped.is_empty() && skipped.contains(&ids::key(&id)))
        {
            CleanupAction::LookUp => {
                checkpoint.scanned += 1;
                moved.push((id, d));
            }
            CleanupAction::Keep => {
                checkpoint.scanned += 1;
                checkpoint.kept += 1;
            }
            CleanupAction::Skip => checkpoint.skipped_foreign += 1,
        }
    }
    (checkpoint, moved)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::routing::{KeyValue, Layout, PlacementRange, TenantBuckets};

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

    /// A skipped dead letter is matched by value: skipping the int `_id` N keeps the int and
    /// the double N (one document to MongoDB) and not the string "N", which moves and is
    /// looked up (found when skips were matched by their text, where 7 and "7" are alike).
    #[test]
    fn a_skipped_int_id_keeps_its_numbers_and_not_the_string_that_reads_alike() {
        let (from, to) = (version(1, TWO, None), version(16, TWO, Some("bucket")));
        let t = KeyValue::String("hot".into());
        let (n, here) = (0..)
            .find_map(|n: i64| {
                let at = |k: KeyValue, v: &RoutingVersion| {
                    v.locate(&t, &k).unwrap().locations[0].clone()
                };
                let (int, text) = (KeyValue::Int(n), KeyValue::String(n.to_string()));
                let here = at(int.clone(), &from);
                (here == at(text.clone(), &from) && here != at(int, &to) && here != at(text, &to))
                    .then_some((n, here))
            })
            .unwrap();
        let docs = [
            doc! { "_id": n as i32, "customerId": "hot" },
            doc! { "_id": n as f64, "customerId": "hot" },
            doc! { "_id": n.to_string(), "customerId": "hot" },
        ];
        let skipped = ids::keys_of_encoded(&[ids::encode(&Bson::Int64(n))]);
        let (checkpoint, moved) = cleanup_candidates(&from, &to, &here, &skipped, &docs);
        assert_eq!((checkpoint.scanned, checkpoint.kept), (3, 2));
        assert_eq!(moved.len(), 1, "{moved:?}");
        assert_eq!(moved[0].0, Bson::String(n.to_string()));
        let (checkpoint, moved) = cleanup_candidates(&from, &to, &here, &Default::default(), &docs);
        assert_eq!((checkpoint.kept, moved.len()), (0, 3));
    }

    /// The backfill reads raw documents and copies their bytes; what it decides and writes
    /// must be exactly what it would from the parsed documents.
    #[test]
    fn raw_and_parsed_batches_make_the_same_statements_and_ledger() {
        let (from, to) = (version(1, TWO, None), version(16, TWO, Some("bucket")));
        let (moves, here) = doc_that(&from, &to, "hot", true);
        let mut moves_written = moves.clone();
        moves_written.insert("bucket", 3);
        moves_written.insert("_reshard", doc! { "src": "app", "epoch": 2, "rev": 5 });
        moves_written.insert("nested", doc! { "a": [1, "two", { "b": 3.5 }] });
        let mut docs = vec![moves, moves_written];
        for tenant in ["hot", "a", "b", "c"] {
            for i in 0..30 {
                let id = format!("{tenant}-{i}");
                let at = from
                    .locate(
                        &KeyValue::String(tenant.into()),
                        &KeyValue::String(id.clone()),
                    )
                    .unwrap()
                    .locations[0]
                    .clone();
                if at == here {
                    docs.push(doc! { "_id": id, "customerId": tenant, "total": i });
                }
            }
        }
        docs.push(doc! { "_id": "t", "customerId": "hot", "_reshard": { "deleted": true } });
        docs.push(doc! { "_id": "x", "total": 1 });
        let raw: Vec<RawDocumentBuf> = docs
            .iter()
            .map(|d| RawDocumentBuf::from_document(d).unwrap())
            .collect();
        let parsed = prepare_batch(&from, &to, &here, 9, docs);
        let unparsed = prepare_batch(&from, &to, &here, 9, raw);
        assert!(parsed.statements.len() > 4, "{parsed:?}");
        let encoded = |b: &PreparedBatch| -> Vec<(Location, Bson, Vec<u8>)> {
            b.statements
                .iter()
                .map(|st| {
                    let bytes = match &st.op {
                        crate::copy::WriteOp::Insert(d) => {
                            RawDocumentBuf::from_document(d).unwrap().into_bytes()
                        }
                        crate::copy::WriteOp::InsertRaw(r) => r.as_bytes().to_vec(),
                        other => format!("{other:?}").into_bytes(),
                    };
                    (st.location.clone(), st.id.clone(), bytes)
                })
                .collect()
        };
        assert_eq!(encoded(&parsed), encoded(&unparsed));
        assert!(unparsed
            .statements
            .iter()
            .any(|st| matches!(st.op, crate::copy::WriteOp::InsertRaw(_))));
        assert_eq!(parsed.kinds, unparsed.kinds);
        assert_eq!(parsed.targets, unparsed.targets);
        assert_eq!(parsed.checkpoint, unparsed.checkpoint);
    }
}

//! `reshard worker`: claims the partitions of a migration's task (the backfill, cleanup, the
//! copy back of a rollback) under leases and works them. The plan is stored in Postgres as
//! partitions ([`plan`]); any number of worker processes lease them.
//!
//! This file holds the process (its configuration, registration, shards and writer);
//! `control` serves one migration with its control loop, `partition` works one partition, and
//! `batch` decides what each batch does, through disposition and protocol.
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

mod batch;
mod control;
mod partition;
pub mod plan;
mod settle;

pub use batch::{
    cleanup_candidates, place_mirrors, prepare_batch, prepare_revert, skip_mirrored, Kind,
    PreparedBatch,
};

use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use mongodb::options::WriteConcern;
use serde_json::json;
use tokio::sync::watch;
use uuid::Uuid;

use crate::routing::{Location, RoutingVersion};
use crate::settings::MigrationSettings;
use crate::shards::Shards;
use crate::shards::{BulkWriter, RetryPolicy, WriterOptions};
use crate::store::migrations::Migration;
use crate::store::partitions::Task;
use crate::store::{Store, StoreError};
use crate::throttle::AdaptiveRate;

use partition::stopped;

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
    /// The layout of one side of the migration.
    fn layout(&self, side: crate::protocol::Side) -> &RoutingVersion {
        match side {
            crate::protocol::Side::Source => &self.from,
            crate::protocol::Side::Target => &self.to,
        }
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
                    .filter(|m| Task::for_workers(m.phase()).is_some())
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
                let waits_for = match Task::for_workers(m.phase()) {
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
                    if Task::for_workers(m.phase()).is_none() {
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
                let Some(task) = Task::for_workers(m.phase()) else {
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
        BulkWriter::over(&self.shards, options).with_overload_sink(Arc::new(sink))
    }
}

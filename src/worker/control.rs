//! The worker's serving of one migration and its control loop: every second it re-reads the
//! migration (phase, pause, settings), heartbeats the worker's lease with its figures, shares
//! the configured rate among the live workers, writes rate cuts and capacity signals to the
//! event log, and prepares cleanup's waves.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use mongodb::bson::Document;
use serde_json::json;
use tokio::sync::watch;
use uuid::Uuid;

use crate::copy::steps;
use crate::disposition::Disposition;
use crate::envelope;
use crate::ids;
use crate::protocol::{self, CleanupDecision, Found};
use crate::routing::Location;
use crate::shards::read::Merge;
use crate::store::events::{EventKind, NewEvent};
use crate::store::migrations::Migration;
use crate::store::partitions::Task;
use crate::store::workers::WorkerFigures;
use crate::store::StoreError;
use crate::throttle::{AdaptiveRate, AppHealth};

use super::batch::{cleanup_candidates, Kind, PreparedBatch};
use super::partition::PROGRESS_EVERY;
use super::{Shared, Worker, WorkerError, WorkerSummary};

impl Worker {
    /// Works on one migration until its partitions run out, it stops being runnable, or
    /// shutdown.
    pub(super) async fn serve(
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
    pub(super) async fn control_loop(
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
    pub(super) async fn prepare_cleanup(
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
    pub(super) async fn fail_migration(
        &self,
        shared: &Shared,
        reason: &str,
    ) -> Result<(), WorkerError> {
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
}

//! The steps of a playbook, each run to its end and idempotent against the migration's state:
//! an advance, a task its workers run, a reconciliation, a rollback.

use std::time::{Duration, Instant};

use serde_json::json;
use tokio::sync::watch;

use crate::driver::{Driver, MoveOptions, TaskProgress};
use crate::error::{Error, Result};
use crate::phase::Phase;
use crate::reconcile::{ReconcileOptions, Stratify};
use crate::spec::playbook::{forward_rank, Action, Playbook, Reconcile, StrataDoc, Workers};
use crate::store::partitions::Task;
use crate::worker::{Worker, WorkerConfig};

use super::*;

/// Runs one step to its end; `Ok(None)` when asked to stop.
pub(super) async fn execute(
    driver: &Driver,
    pb: &Playbook,
    id: i64,
    step: &crate::spec::playbook::Step,
    options: &RunOptions,
    started_at: Option<chrono::DateTime<chrono::Utc>>,
) -> Result<Option<Outcome>> {
    let action = &step.action;
    let moves = |timeout: Duration, switch_timeout: Duration| MoveOptions {
        dry_run: false,
        reason: Some(format!("playbook {}", pb.doc.name)),
        timeout,
        switch_timeout,
    };
    let default_moves = moves(Duration::from_secs(60), Duration::from_secs(5));
    match action {
        Action::Advance {
            to,
            timeout,
            switch_timeout,
        } => {
            let phase = advance_to(driver, id, *to, &moves(*timeout, *switch_timeout)).await?;
            Ok(Some(json!({ "phase": phase })))
        }
        Action::Backfill(w) => {
            advance_to(driver, id, Phase::Backfill, &default_moves).await?;
            run_task(driver, pb, id, Task::Backfill, w, options).await
        }
        Action::Reconcile(r) => {
            advance_to(driver, id, Phase::Reconcile, &default_moves).await?;
            reconcile(driver, pb, id, r).await.map(Some)
        }
        Action::Soak(s) => soak(driver, id, &step.name, s, started_at, options).await,
        Action::Approve { .. } => unreachable!("approvals are handled by the run"),
        Action::Cleanup(w) => {
            advance_to(driver, id, Phase::Cleanup, &default_moves).await?;
            run_task(driver, pb, id, Task::Cleanup, w, options).await
        }
        Action::Complete { timeout } => {
            let opts = moves(*timeout, Duration::from_secs(5));
            let phase = advance_to(driver, id, Phase::Completed, &opts).await?;
            driver.finalize(id, *timeout).await?;
            Ok(Some(json!({ "phase": phase })))
        }
        Action::Rollback(w) => rollback(driver, pb, id, w, options).await,
    }
}

/// Moves the migration forward to `to` through every phase before it, each with its barrier
/// (the write switch lands in `new_writes`). A migration already there or past it is left
/// alone. Returns the phase reached.
pub(super) async fn advance_to(
    driver: &Driver,
    id: i64,
    to: Phase,
    options: &MoveOptions,
) -> Result<Phase> {
    let goal = if to == Phase::WriteSwitch {
        Phase::NewWrites
    } else {
        to
    };
    loop {
        let m = driver.store.migration(id).await?;
        let at = m.phase();
        if let Some(reason) = &m.failure_reason {
            return Err(Error::failed(format!(
                "migration {id} failed in {at}: {reason}; fix the cause and `reshard migration \
                 resume {id}`, or roll back, then run the playbook again"
            )));
        }
        if m.paused {
            return Err(Error::failed(format!(
                "migration {id} is paused in {at}; `reshard migration resume {id}`, then run the \
                 playbook again"
            )));
        }
        if matches!(
            at,
            Phase::Reverting | Phase::RevertSwitch | Phase::RolledBack
        ) {
            return Err(Error::bad_input(format!(
                "migration {id} is rolling back ({at}); a forward step cannot run"
            )));
        }
        if forward_rank(at) >= forward_rank(goal) && at != Phase::WriteSwitch {
            return Ok(at);
        }
        let next = match at {
            Phase::Planned => Phase::DualRead,
            Phase::DualRead => Phase::WriteSwitch,
            Phase::WriteSwitch | Phase::NewWrites => Phase::Backfill,
            Phase::Backfill => Phase::Reconcile,
            Phase::Reconcile => Phase::NewReads,
            Phase::NewReads => Phase::Cleanup,
            Phase::Cleanup => Phase::Completed,
            Phase::Completed | Phase::Reverting | Phase::RevertSwitch | Phase::RolledBack => {
                return Ok(at)
            }
        };
        let next = if at == Phase::WriteSwitch {
            // Finish the switch a stopped driver left (forward, or back to dual_read).
            Phase::NewWrites
        } else {
            next
        };
        driver.advance(id, next, options).await?;
        if next == Phase::Completed {
            return Ok(next);
        }
    }
}

/// Runs a task's workers in this process (or waits for workers elsewhere) until its
/// partitions are done, reporting progress; then checks what the task leaves open.
pub(super) async fn run_task(
    driver: &Driver,
    pb: &Playbook,
    id: i64,
    task: Task,
    w: &Workers,
    options: &RunOptions,
) -> Result<Option<Outcome>> {
    apply_step_settings(driver, id, w).await?;
    let count = w.workers.unwrap_or(options.workers);
    let (stop_tx, stop_rx) = watch::channel(false);
    let worker = if count > 0 {
        let mut config = WorkerConfig::new(format!(
            "{}:{} (playbook {})",
            crate::identity::hostname(),
            std::process::id(),
            pb.doc.name
        ));
        config.migration = Some(id);
        config.concurrency = count;
        config.exit_when_done = true;
        config.lease_ttl = w.lease_ttl;
        config.actor = driver.actor.clone();
        let worker = Worker::connect(driver.store.clone(), config).await?;
        Some(tokio::spawn(async move { worker.run(stop_rx).await }))
    } else {
        driver.progress().note(&format!(
            "{task} runs on external workers: start `reshard worker {id}` anywhere"
        ));
        None
    };
    let mut shutdown = options.shutdown.clone();
    // The rate over the last 15 s: progress arrives a batch at a time, so a shorter window
    // would flicker between 0 and bursts.
    let mut samples: std::collections::VecDeque<(Instant, i64)> = Default::default();
    let started = Instant::now();
    let result = loop {
        // The migration first, then the partitions: a plan stores its partitions and its
        // time in one transaction, so a plan seen here has its partitions in the totals read
        // next (the other order took a plan made in between for an empty one).
        let m = driver.store.migration(id).await?;
        if let Some(reason) = &m.failure_reason {
            break Err(Error::failed(format!("migration {id} failed: {reason}")));
        }
        let planned = match task {
            Task::Backfill => m.backfill_planned_at.is_some(),
            Task::Cleanup => m.cleanup_planned_at.is_some(),
            Task::Revert => m.revert_planned_at.is_some(),
            Task::Verify => true,
        };
        let totals = driver.store.task_totals(id, task).await?;
        let now = Instant::now();
        samples.push_back((now, totals.scanned));
        while samples.len() > 2 && now.duration_since(samples[0].0) > Duration::from_secs(15) {
            samples.pop_front();
        }
        let (t0, n0) = samples[0];
        let rate = (totals.scanned - n0) as f64 / now.duration_since(t0).as_secs_f64().max(1e-3);
        let size =
            crate::estimate::TaskSize::of(driver.store.partitions(id, task).await?.iter().map(
                |p| crate::estimate::PartitionSize {
                    done: p.state == crate::store::partitions::PartitionState::Done,
                    scanned: p.scanned,
                    approx: p.approx_documents,
                },
            ));
        driver.progress().task(&TaskProgress {
            migration: id,
            task,
            partitions: totals.partitions,
            done: totals.done,
            documents: totals.scanned,
            approx_documents: size.total,
            docs_per_sec: rate,
        });
        if planned && totals.partitions >= 0 && totals.done == totals.partitions {
            break Ok(totals);
        }
        if let Some(handle) = &worker {
            if handle.is_finished() {
                // The workers stopped with partitions left: a failure that passes, or a
                // migration that stopped being runnable; look again shortly.
                tokio::time::sleep(Duration::from_millis(500)).await;
                let totals = driver.store.task_totals(id, task).await?;
                if totals.done < totals.partitions {
                    break Err(Error::failed(format!(
                        "the {task} workers stopped with {} of {} partitions done",
                        totals.done, totals.partitions
                    )));
                }
                continue;
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_secs(1)) => {}
            _ = shutdown.changed() => {}
        }
        if *shutdown.borrow() {
            let _ = stop_tx.send(true);
            if let Some(handle) = worker {
                let _ = handle.await;
            }
            return Ok(None);
        }
    };
    let _ = stop_tx.send(true);
    if let Some(handle) = worker {
        match handle.await {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => return Err(Error::failed(format!("{task} worker: {e}"))),
            Err(e) => return Err(Error::failed(format!("{task} worker: {e}"))),
        }
    }
    let totals = result?;
    if task == Task::Backfill {
        let open = driver.store.dead_letters(id, false).await?;
        if !open.is_empty() {
            return Err(Error::failed(format!(
                "the backfill left {} dead letter(s): see `reshard deadletter list {id}`, retry \
                 or skip them, then run the playbook again",
                open.len()
            )));
        }
    }
    Ok(Some(json!({
        "partitions": totals.partitions,
        "documents": totals.scanned,
        "inserted": totals.inserted,
        "already_present": totals.already_present,
        "stamped": totals.stamped,
        "deleted": totals.deleted,
        "kept": totals.kept,
        "seconds": started.elapsed().as_secs_f64(),
    })))
}

/// A step's throttle overrides, applied to the migration's settings.
pub(super) async fn apply_step_settings(driver: &Driver, id: i64, w: &Workers) -> Result<()> {
    if w.batch_size.is_none()
        && w.max_docs_per_sec.is_none()
        && w.max_in_flight_per_shard.is_none()
        && w.target_batch_latency.is_none()
        && w.cleanup_waves.is_none()
    {
        return Ok(());
    }
    driver
        .store
        .update_settings(
            id,
            |s| {
                if let Some(v) = w.batch_size {
                    s.batch_size = v;
                }
                if let Some(v) = w.max_docs_per_sec {
                    s.max_docs_per_sec = v;
                }
                if let Some(v) = w.max_in_flight_per_shard {
                    s.max_in_flight_per_shard = v;
                }
                // Whole milliseconds: the playbook's check refuses anything else.
                if let Some(v) = w.target_batch_latency {
                    s.target_batch_latency_ms = v.as_millis() as u64;
                }
                if let Some(v) = w.cleanup_waves {
                    s.cleanup_waves = v;
                }
            },
            &driver.actor,
            Some("playbook step settings"),
        )
        .await?;
    Ok(())
}

/// Reconciliation runs until one passes, repairing in between when the step says so.
pub(super) async fn reconcile(
    driver: &Driver,
    pb: &Playbook,
    id: i64,
    r: &Reconcile,
) -> Result<Outcome> {
    if r.max_missing.is_some() || r.max_mismatched.is_some() || r.max_misplaced.is_some() {
        driver
            .store
            .update_settings(
                id,
                |s| {
                    if let Some(v) = r.max_missing {
                        s.max_missing = v;
                    }
                    if let Some(v) = r.max_mismatched {
                        s.max_mismatched = v;
                    }
                    if let Some(v) = r.max_misplaced {
                        s.max_misplaced = v;
                    }
                },
                &driver.actor,
                Some("playbook reconcile thresholds"),
            )
            .await?;
    }
    let request = crate::driver::reconcile::RunRequest {
        options: ReconcileOptions {
            sample: r.sample,
            full: r.full,
            stratify: match r.stratify {
                StrataDoc::Shard => Stratify::Shard,
                StrataDoc::Tenant => Stratify::Tenant,
                StrataDoc::Bucket => Stratify::Bucket,
            },
            recheck_delay: r.recheck_delay,
            ..ReconcileOptions::default()
        },
        resume: None,
        concurrency: 2,
        lease_ttl: Duration::from_secs(30),
        owner: format!(
            "{}:{} (playbook {})",
            crate::identity::hostname(),
            std::process::id(),
            pb.doc.name
        ),
    };
    let mut runs = Vec::new();
    for attempt in 1..=r.attempts {
        let outcome = crate::driver::reconcile::run(driver, id, request.clone()).await?;
        runs.push(
            json!({ "run": outcome.run.id, "passed": outcome.passed, "findings": outcome.found }),
        );
        if outcome.passed {
            // Shadow reads' mismatches hold the gate shut too: a step that repairs repairs them.
            if r.repair && !driver.store.shadow_mismatches(id, true).await?.is_empty() {
                let repaired =
                    crate::driver::reconcile::repair(driver, id, Some(outcome.run.id)).await?;
                driver.progress().note(&format!(
                    "repaired {} shadow read mismatch(es), {} still wrong",
                    repaired.shadow.len(),
                    repaired.still_wrong_count()
                ));
            }
            return Ok(json!({ "runs": runs }));
        }
        if r.repair && attempt < r.attempts {
            let repaired =
                crate::driver::reconcile::repair(driver, id, Some(outcome.run.id)).await?;
            driver.progress().note(&format!(
                "reconciliation run {} found {} problem(s); repaired {}, {} still wrong; running \
                 again",
                outcome.run.id,
                outcome.found,
                repaired.done.len(),
                repaired.still_wrong.len()
            ));
            continue;
        }
        return Err(Error::failed(format!(
            "reconciliation run {} found {} problem(s) (`reshard reconcile show {id} --run {}`){}",
            outcome.run.id,
            outcome.found,
            outcome.run.id,
            if r.repair {
                format!("; still after {} run(s) with repair", r.attempts)
            } else {
                format!("; `reshard repair {id}`, or set repair: true in the step")
            }
        )));
    }
    unreachable!("attempts is at least 1")
}

/// Rolls the migration back from where it stands, to `rolled_back`: the rollback path, the
/// revert copy in this process (or elsewhere), the revert switch, and the removal of the
/// target.
pub(super) async fn rollback(
    driver: &Driver,
    pb: &Playbook,
    id: i64,
    w: &Workers,
    options: &RunOptions,
) -> Result<Option<Outcome>> {
    let moves = MoveOptions {
        reason: Some(format!("playbook {} rollback", pb.doc.name)),
        ..MoveOptions::default()
    };
    // A router whose lease lapses behind the copy back sends it round again (the switch goes
    // back to `reverting`); a few rounds are expected at most.
    let mut rounds = 0;
    let again = |e: Error, rounds: &mut u32| -> Result<()> {
        *rounds += 1;
        if *rounds > 5 {
            return Err(e);
        }
        driver.progress().note(&format!("{e}"));
        Ok(())
    };
    loop {
        let m = driver.store.migration(id).await?;
        match m.phase() {
            Phase::RolledBack => {
                driver.finalize(id, moves.timeout).await?;
                return Ok(Some(json!({ "phase": Phase::RolledBack })));
            }
            Phase::Reverting => {
                driver
                    .store
                    .replan_revert_if_outdated(id, &driver.actor)
                    .await?;
                let outcome = run_task(driver, pb, id, Task::Revert, w, options).await?;
                if outcome.is_none() {
                    return Ok(None);
                }
                if let Err(e) = driver.advance(id, Phase::RevertSwitch, &moves).await {
                    let replanned = driver
                        .store
                        .replan_revert_if_outdated(id, &driver.actor)
                        .await?;
                    if replanned.is_none() {
                        return Err(e);
                    }
                    again(e, &mut rounds)?;
                }
            }
            Phase::RevertSwitch => {
                if let Err(e) = driver.advance(id, Phase::RolledBack, &moves).await {
                    if driver.store.migration(id).await?.phase() != Phase::Reverting {
                        return Err(e);
                    }
                    again(e, &mut rounds)?;
                }
            }
            Phase::Cleanup | Phase::Completed => {
                return Err(Error::bad_input(format!(
                    "migration {id} is in {}: cleanup has deleted moved documents from the \
                     source, so it cannot roll back",
                    m.phase()
                )))
            }
            _ => {
                driver.rollback(id, &moves).await?;
            }
        }
    }
}

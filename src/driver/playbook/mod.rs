//! `reshard run`: executes what remains of a playbook, from the state stored in PostgreSQL.
//!
//! A run takes the playbook's lock (one runner per playbook: a second is refused, naming the
//! holder), registers what the playbook declares and the store lacks (shards, versions), finds
//! the playbook's migration or creates it, and checks the playbook against what it pinned: an
//! edit of a step already done is refused with a diff, an edit of later steps or of the
//! settings is accepted and logged. Then each step that is not done runs to its end. Every
//! step is idempotent against the migration's state — an `advance` to a phase the migration is
//! past is done, a backfill whose partitions are done is done — so a run killed anywhere
//! continues where it stopped when run again, and repeats nothing harmful.
//!
//! This file holds the run from start to end and its dry run; `admission` whether the playbook
//! may run against what the store holds, `steps` each step, `soak` the soak step.

use serde_json::json;
use tokio::sync::watch;

use super::{Driver, StepState};
use crate::error::{Error, Result};
use crate::phase::Phase;
use crate::spec::playbook::{forward_rank, Action, Playbook};
use crate::store::events::{EventKind, NewEvent};
use crate::store::migrations::Migration;

mod admission;
mod soak;
mod steps;

pub use admission::diff;
use admission::*;
use soak::*;
use steps::*;

/// How a run goes.
#[derive(Clone, Debug)]
pub struct RunOptions {
    /// Print what would run from the current state; change nothing.
    pub dry_run: bool,
    /// Workers a step runs in this process when the playbook does not say.
    pub workers: usize,
    /// Asked to stop (Ctrl-C): workers release their leases and the run ends, resumable.
    pub shutdown: watch::Receiver<bool>,
}

/// How a run ended.
#[derive(Clone, Debug, PartialEq)]
pub enum RunEnd {
    /// Every step is done; the migration is in `phase`.
    Done { migration: i64, phase: Phase },
    /// A manual gate waits: the run stops here (exit 0) until someone approves.
    WaitingForApproval {
        migration: i64,
        step: String,
        command: String,
        message: Option<String>,
    },
    /// `--dry-run`: what each step would do.
    DryRun {
        migration: Option<i64>,
        steps: Vec<(String, String)>,
    },
    /// Asked to stop; run again to continue.
    Interrupted { migration: i64, step: String },
}

/// What a step came to.
type Outcome = serde_json::Value;

/// Runs the playbook.
pub async fn run(driver: &Driver, pb: &Playbook, options: &RunOptions) -> Result<RunEnd> {
    let name = &pb.doc.name;
    let _lock = if options.dry_run {
        None
    } else {
        let host = crate::identity::hostname();
        match driver
            .store
            .lock_playbook(name, &host, std::process::id() as i32)
            .await?
        {
            Ok(lock) => Some(lock),
            Err(holder) => {
                return Err(Error::failed(format!(
                    "playbook {name:?} is being run by {} (pid {}) since {}; wait for it to \
                     end or stop it, then run again",
                    holder.host,
                    holder.pid,
                    holder.started_at.to_rfc3339()
                )))
            }
        }
    };
    let content = normalized(pb);
    let existing = driver.store.playbook(name).await?;
    let migration = match &existing {
        Some(row) => {
            let m = driver.store.migration(row.migration_id).await?;
            check_identity(driver, pb, &m).await?;
            check_edits(driver, pb, row, &content, options.dry_run).await?;
            Some(m)
        }
        None => {
            check_new(driver, pb).await?;
            None
        }
    };
    if options.dry_run {
        return dry_run(driver, pb, migration.as_ref()).await;
    }
    let migration = match migration {
        Some(m) => m,
        None => create(driver, pb, &content).await?,
    };
    let id = migration.id;
    // The hooks first, so that they hear about every step this run takes.
    driver
        .store
        .sync_playbook_hooks(id, &pb.hooks, &driver.actor)
        .await?;
    driver.deliver_hooks(id).await?;
    let done = driver.store.playbook_steps(name).await?;
    let count = pb.steps.len();
    for (position, step) in pb.steps.iter().enumerate() {
        let record = done.iter().find(|r| r.position == position as i32);
        if record.is_some_and(|r| r.finished_at.is_some()) {
            driver
                .progress()
                .step(position, count, &step.name, &StepState::AlreadyDone);
            continue;
        }
        if *options.shutdown.borrow() {
            return Ok(RunEnd::Interrupted {
                migration: id,
                step: step.name.clone(),
            });
        }
        if let Action::Approve { message } = &step.action {
            if record.is_some_and(|r| r.approved_at.is_some()) {
                let by = record
                    .and_then(|r| r.approved_by.clone())
                    .unwrap_or_default();
                driver
                    .store
                    .step_done(
                        name,
                        position as i32,
                        &step.name,
                        &json!({ "approved_by": by }),
                        &driver.actor,
                    )
                    .await?;
                driver.progress().step(
                    position,
                    count,
                    &step.name,
                    &StepState::Done(json!({ "approved_by": by })),
                );
                continue;
            }
            let command = format!("reshard approve {id} --step {}", step.name);
            driver
                .store
                .request_approval(id, &step.name, message.as_deref(), &command, &driver.actor)
                .await?;
            driver.deliver_hooks(id).await?;
            driver.progress().step(
                position,
                count,
                &step.name,
                &StepState::Waiting(format!("waits for approval: run `{command}`")),
            );
            return Ok(RunEnd::WaitingForApproval {
                migration: id,
                step: step.name.clone(),
                command,
                message: message.clone(),
            });
        }
        driver
            .store
            .step_started(name, position as i32, &step.name)
            .await?;
        driver
            .progress()
            .step(position, count, &step.name, &StepState::Started);
        let started_at = driver
            .store
            .playbook_steps(name)
            .await?
            .into_iter()
            .find(|r| r.position == position as i32)
            .and_then(|r| r.started_at);
        let before = driver.store.last_event_id(id).await?;
        let result = execute(driver, pb, id, step, options, started_at).await;
        match result {
            Ok(Some(outcome)) => {
                driver
                    .store
                    .step_done(name, position as i32, &step.name, &outcome, &driver.actor)
                    .await?;
                driver
                    .progress()
                    .step(position, count, &step.name, &StepState::Done(outcome));
            }
            Ok(None) => {
                return Ok(RunEnd::Interrupted {
                    migration: id,
                    step: step.name.clone(),
                })
            }
            Err(e) => {
                driver.progress().step(
                    position,
                    count,
                    &step.name,
                    &StepState::Failed(e.to_string()),
                );
                record_step_failure(driver, pb, id, position, &step.name, before, &e).await;
                return Err(e);
            }
        }
    }
    let m = driver.store.migration(id).await?;
    Ok(RunEnd::Done {
        migration: id,
        phase: m.phase(),
    })
}

/// Records that a step failed and the run stopped (`step_failed`), unless the failure is
/// recorded already by what failed (a reconciliation run, a soak, a barrier, a worker that
/// failed the migration, ...): one event per thing that happened, so that a failure hook
/// pages once. A store that fails here costs the event (logged), never the step's error.
async fn record_step_failure(
    driver: &Driver,
    pb: &Playbook,
    id: i64,
    position: usize,
    step: &str,
    before: i64,
    error: &Error,
) {
    match driver.store.failure_recorded_since(id, before).await {
        Ok(true) => return,
        Ok(false) => {}
        Err(e) => tracing::warn!(
            migration_id = id,
            "cannot tell whether the failure is recorded: {e}"
        ),
    }
    let message = error.to_string();
    let event = NewEvent::new(
        EventKind::StepFailed,
        json!({
            "playbook": pb.doc.name,
            "step": step,
            "position": position + 1,
            "error": message,
        }),
    )
    .reason(Some(&message));
    if let Err(e) = driver.store.record_event(id, &driver.actor, &event).await {
        tracing::warn!(migration_id = id, step, "step_failed not recorded: {e}");
    }
}

/// The playbook as pinned: the document with every step named, as JSON.
pub fn normalized(pb: &Playbook) -> serde_json::Value {
    serde_json::to_value(&pb.doc).expect("a playbook serialises")
}

/// What each step would do now.
async fn dry_run(driver: &Driver, pb: &Playbook, m: Option<&Migration>) -> Result<RunEnd> {
    let done = match m {
        Some(_) => driver.store.playbook_steps(&pb.doc.name).await?,
        None => Vec::new(),
    };
    let phase = m.map_or(Phase::Planned, |m| m.phase());
    let mut steps = Vec::new();
    if m.is_none() {
        steps.push((
            "(plan)".to_owned(),
            format!(
                "register {} shard(s) if missing, the versions, and plan the migration of {}",
                pb.doc.shards.len(),
                pb.doc.collection
            ),
        ));
    }
    for (i, s) in pb.steps.iter().enumerate() {
        let record = done.iter().find(|r| r.position == i as i32);
        let what = if record.is_some_and(|r| r.finished_at.is_some()) {
            "done".to_owned()
        } else {
            match &s.action {
                Action::Approve { .. } if record.is_some_and(|r| r.approved_at.is_some()) => {
                    "approved; would be recorded".into()
                }
                Action::Approve { .. } => format!(
                    "would stop and wait for `reshard approve {} --step {}`",
                    m.map_or_else(|| "MIGRATION_ID".to_owned(), |m| m.id.to_string()),
                    s.name
                ),
                other => match other.reaches() {
                    Some(to)
                        if forward_rank(phase) >= forward_rank(to) && to != Phase::RolledBack =>
                    {
                        format!("would check its work ({phase} reached)")
                    }
                    Some(to) => format!("would run: {phase} -> {to}"),
                    None => "would run".into(),
                },
            }
        };
        steps.push((s.name.clone(), what));
    }
    Ok(RunEnd::DryRun {
        migration: m.map(|m| m.id),
        steps,
    })
}

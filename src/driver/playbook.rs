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

use std::time::{Duration, Instant};

use serde_json::json;
use tokio::sync::watch;

use super::{Driver, MoveOptions, StepState, TaskProgress};
use crate::error::{Error, Result};
use crate::phase::Phase;
use crate::reconcile::{ReconcileOptions, Stratify};
use crate::routing::RoutingVersion;
use crate::settings::MigrationSettings;
use crate::spec::playbook::{
    forward_rank, Action, Playbook, Reconcile, Soak, Source, StrataDoc, Workers,
};
use crate::store::events::{EventKind, NewEvent};
use crate::store::migrations::Migration;
use crate::store::partitions::Task;
use crate::store::playbooks::NewPlaybook;
use crate::store::StoreError;
use crate::worker::{Worker, WorkerConfig};

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

/// A migration that exists must be the playbook's: same collection and versions.
async fn check_identity(driver: &Driver, pb: &Playbook, m: &Migration) -> Result<()> {
    let (from, to) = driver.store.migration_versions(m).await?;
    let source_same = match &pb.source {
        Source::Version(v) => *v == m.from_version,
        Source::Spec(spec) => spec.same_layout(&from),
    };
    if m.collection != pb.doc.collection || !source_same || !pb.target.same_layout(&to) {
        return Err(Error::bad_input(format!(
            "playbook {:?} drives migration {} of {} (v{} -> v{}), which this playbook no \
             longer describes: its collection, source or target changed. A migration that has \
             started keeps its versions; give the changed playbook a new name to plan a new \
             migration once this one has ended",
            pb.doc.name, m.id, m.collection, m.from_version, m.to_version
        )));
    }
    Ok(())
}

/// Edits against the pinned content: refused for steps already done (with a diff), accepted
/// and logged for the rest.
async fn check_edits(
    driver: &Driver,
    pb: &Playbook,
    row: &crate::store::playbooks::PlaybookRow,
    content: &serde_json::Value,
    dry_run: bool,
) -> Result<()> {
    if &row.content == content {
        return Ok(());
    }
    let steps = driver.store.playbook_steps(&pb.doc.name).await?;
    let pinned: Vec<serde_json::Value> =
        row.content["steps"].as_array().cloned().unwrap_or_default();
    let now: Vec<serde_json::Value> = content["steps"].as_array().cloned().unwrap_or_default();
    for s in steps.iter().filter(|s| s.finished_at.is_some()) {
        let i = s.position as usize;
        if pinned.get(i) != now.get(i) {
            return Err(Error::bad_input(format!(
                "playbook {:?}: step {} ({:?}) is done, and this playbook changes it; a step \
                 that ran cannot be edited (revert the edit, or start a new playbook):\n{}",
                pb.doc.name,
                i + 1,
                s.name,
                diff(&pretty(pinned.get(i)), &pretty(now.get(i)))
            )));
        }
    }
    let described = diff(&pretty(Some(&row.content)), &pretty(Some(content)));
    if !dry_run {
        driver
            .store
            .update_playbook(&pb.doc.name, content, &described, &driver.actor)
            .await?;
        driver
            .store
            .update_settings(
                row.migration_id,
                |s| *s = pb.settings,
                &driver.actor,
                Some("playbook edited"),
            )
            .await?;
    }
    driver
        .progress()
        .note(&format!("playbook edited since the last run:\n{described}"));
    Ok(())
}

fn pretty(value: Option<&serde_json::Value>) -> String {
    match value {
        Some(v) => serde_json::to_string_pretty(v).unwrap_or_default(),
        None => "(none)".into(),
    }
}

/// A line diff: `-` for lines only in `a`, `+` for lines only in `b`, two lines of context.
pub fn diff(a: &str, b: &str) -> String {
    let a: Vec<&str> = a.lines().collect();
    let b: Vec<&str> = b.lines().collect();
    // Longest common subsequence, small inputs.
    let mut lcs = vec![vec![0usize; b.len() + 1]; a.len() + 1];
    for i in (0..a.len()).rev() {
        for j in (0..b.len()).rev() {
            lcs[i][j] = if a[i] == b[j] {
                lcs[i + 1][j + 1] + 1
            } else {
                lcs[i + 1][j].max(lcs[i][j + 1])
            };
        }
    }
    let mut lines: Vec<(char, &str)> = Vec::new();
    let (mut i, mut j) = (0, 0);
    while i < a.len() || j < b.len() {
        if i < a.len() && j < b.len() && a[i] == b[j] {
            lines.push((' ', a[i]));
            i += 1;
            j += 1;
        } else if j < b.len() && (i == a.len() || lcs[i][j + 1] > lcs[i + 1][j]) {
            lines.push(('+', b[j]));
            j += 1;
        } else {
            lines.push(('-', a[i]));
            i += 1;
        }
    }
    let changed: Vec<usize> = lines
        .iter()
        .enumerate()
        .filter(|(_, (k, _))| *k != ' ')
        .map(|(n, _)| n)
        .collect();
    let near = |n: usize| changed.iter().any(|c| c.abs_diff(n) <= 2);
    let mut out = String::new();
    let mut skipped = false;
    for (n, (kind, line)) in lines.iter().enumerate() {
        if near(n) {
            out.push_str(&format!("{kind} {line}\n"));
            skipped = false;
        } else if !skipped {
            out.push_str("  ...\n");
            skipped = true;
        }
    }
    out
}

/// Before a new playbook creates anything: its shards must not clash with registered ones,
/// and its versions must be valid against the shards there will be. Nothing is written.
async fn check_new(driver: &Driver, pb: &Playbook) -> Result<()> {
    let registered = driver.store.shards().await?;
    let mut names: std::collections::BTreeSet<String> =
        registered.iter().map(|s| s.name.clone()).collect();
    for s in &pb.doc.shards {
        if let Some(r) = registered.iter().find(|r| r.name == s.name) {
            if r.uri.expose() != s.uri || r.database != s.database {
                return Err(Error::bad_input(format!(
                    "shard {:?} is registered as {} (database {:?}); the playbook says {} \
                     (database {:?}); use another name or change the playbook",
                    s.name,
                    r.uri,
                    r.database,
                    crate::redact::Redacted::new(&s.uri),
                    s.database
                )));
            }
        } else {
            crate::shards::resolve_uri(&s.uri).map_err(|e| Error::bad_input(e.to_string()))?;
        }
        names.insert(s.name.clone());
    }
    let ctx = driver.store.version_context(&pb.doc.collection).await?;
    let check = |v: &RoutingVersion, what: &str| -> Result<()> {
        let context = crate::routing::ValidationContext {
            registered_shards: &names,
            previous_virtual_buckets: ctx.previous_virtual_buckets,
        };
        v.validate(&context).map_err(|errors| {
            Error::bad_input(
                errors
                    .iter()
                    .map(|e| {
                        format!(
                            "playbook {:?}: {what}.{}: {}",
                            pb.doc.name, e.path, e.message
                        )
                    })
                    .collect::<Vec<_>>()
                    .join("\n"),
            )
        })
    };
    if let Source::Spec(v) = &pb.source {
        check(v, "source.spec")?;
    } else if let Source::Version(n) = &pb.source {
        driver.store.version(&pb.doc.collection, Some(*n)).await?;
    }
    check(&pb.target, "target")
}

/// Registers what the playbook declares and the store lacks, then creates its migration.
async fn create(driver: &Driver, pb: &Playbook, content: &serde_json::Value) -> Result<Migration> {
    for s in &pb.doc.shards {
        match driver.store.add_shard(&s.name, &s.uri, &s.database).await {
            Ok(_) => {}
            // Registered since the check (or by an earlier, killed run): the same one.
            Err(StoreError::Conflict(_)) => {}
            Err(e) => return Err(e.into()),
        }
    }
    let from = match &pb.source {
        Source::Version(n) => *n,
        Source::Spec(v) => {
            let spec = pb
                .doc
                .source
                .spec
                .as_ref()
                .expect("a spec source has its spec");
            version_number(driver, v, &crate::spec::spec_text(spec)).await?
        }
    };
    let to = version_number(driver, &pb.target, &crate::spec::spec_text(&pb.doc.target)).await?;
    let m = driver
        .store
        .create_playbook_migration(
            &NewPlaybook {
                name: &pb.doc.name,
                collection: &pb.doc.collection,
                from_version: from,
                to_version: to,
                content,
                settings: &pb.settings,
            },
            &driver.actor,
        )
        .await?;
    driver.progress().note(&format!(
        "playbook {:?} planned migration {} of {}: v{from} -> v{to}",
        pb.doc.name, m.id, m.collection
    ));
    Ok(m)
}

/// The number of the collection's version with this layout, registered if none has it.
async fn version_number(driver: &Driver, v: &RoutingVersion, text: &str) -> Result<i32> {
    for stored in driver.store.versions(Some(&v.collection)).await? {
        if stored.version.same_layout(v) {
            return Ok(stored.version.version);
        }
    }
    Ok(driver
        .store
        .insert_version(v, text, &driver.actor)
        .await?
        .version
        .version)
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

/// Runs one step to its end; `Ok(None)` when asked to stop.
async fn execute(
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
async fn advance_to(driver: &Driver, id: i64, to: Phase, options: &MoveOptions) -> Result<Phase> {
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
async fn run_task(
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
async fn apply_step_settings(driver: &Driver, id: i64, w: &Workers) -> Result<()> {
    if w.batch_size.is_none()
        && w.rate.is_none()
        && w.in_flight.is_none()
        && w.latency_target.is_none()
        && w.waves.is_none()
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
                if let Some(v) = w.rate {
                    s.max_docs_per_sec = v;
                }
                if let Some(v) = w.in_flight {
                    s.max_in_flight_per_shard = v;
                }
                // Whole milliseconds: the playbook's check refuses anything else.
                if let Some(v) = w.latency_target {
                    s.target_batch_latency_ms = v.as_millis() as u64;
                }
                if let Some(v) = w.waves {
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
async fn reconcile(driver: &Driver, pb: &Playbook, id: i64, r: &Reconcile) -> Result<Outcome> {
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
    let request = super::reconcile::RunRequest {
        options: ReconcileOptions {
            sample: r.sample,
            full: r.full,
            stratify: match r.strata {
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
        let outcome = super::reconcile::run(driver, id, request.clone()).await?;
        runs.push(
            json!({ "run": outcome.run.id, "passed": outcome.passed, "findings": outcome.found }),
        );
        if outcome.passed {
            // Shadow reads' mismatches hold the gate shut too: a step that repairs repairs them.
            if r.repair && !driver.store.shadow_mismatches(id, true).await?.is_empty() {
                let repaired = super::reconcile::repair(driver, id, Some(outcome.run.id)).await?;
                driver.progress().note(&format!(
                    "repaired {} shadow read mismatch(es), {} still wrong",
                    repaired.shadow.len(),
                    repaired.still_wrong_count()
                ));
            }
            return Ok(json!({ "runs": runs }));
        }
        if r.repair && attempt < r.attempts {
            let repaired = super::reconcile::repair(driver, id, Some(outcome.run.id)).await?;
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

/// Waits out the soak (from its first start), failing on what the step does not allow; a
/// failure is recorded as a `soak_failed` event (what was found, what was allowed).
async fn soak(
    driver: &Driver,
    id: i64,
    step: &str,
    s: &Soak,
    started_at: Option<chrono::DateTime<chrono::Utc>>,
    options: &RunOptions,
) -> Result<Option<Outcome>> {
    let started = started_at.unwrap_or_else(chrono::Utc::now);
    let until = started + chrono::Duration::from_std(s.duration).unwrap_or_default();
    let mut shutdown = options.shutdown.clone();
    let mut router_errors: std::collections::BTreeMap<(uuid::Uuid, i64), u64> = Default::default();
    loop {
        let m = driver.store.migration(id).await?;
        // New findings: reconciliation runs that finished failing since the soak started.
        let findings: u64 = driver
            .store
            .reconciliation_runs(id)
            .await?
            .iter()
            .filter(|r| r.finished_at.is_some_and(|f| f >= started) && r.passed == Some(false))
            .map(|r| {
                r.summary["findings"]
                    .as_object()
                    .map_or(0, |o| o.values().filter_map(|v| v.as_u64()).sum())
            })
            .sum();
        let letters = driver.store.dead_letters(id, false).await?.len() as u64;
        let overload = driver
            .store
            .events(id)
            .await?
            .into_iter()
            .filter(|e| e.kind == EventKind::CapacitySignal && e.at >= started)
            .count();
        let signal_window = MigrationSettings::from_json(&m.settings)
            .map(|st| Duration::from_secs(st.capacity_signal_after_secs))
            .unwrap_or(Duration::from_secs(30));
        let lasting = match s.overload_for {
            None => overload > 0,
            // Each capacity signal stands for a window of overload.
            Some(limit) => signal_window * overload as u32 >= limit,
        };
        for r in driver.store.routers(Some(&m.collection)).await? {
            if r.heartbeat_at >= started {
                let errors = r.stats["errors"].as_u64().unwrap_or(0);
                router_errors.insert((r.id, r.heartbeat_at.timestamp_millis()), errors);
            }
        }
        let errors: u64 = router_errors.values().sum();
        let failed = if findings > s.max_findings {
            Some(SoakFailure {
                limit: "findings",
                found: findings,
                allowed: Some(s.max_findings),
                message: format!(
                    "soak: reconciliation found {findings} problem(s) since it started (at most \
                     {} allowed)",
                    s.max_findings
                ),
            })
        } else if letters > s.max_dead_letters {
            Some(SoakFailure {
                limit: "dead_letters",
                found: letters,
                allowed: Some(s.max_dead_letters),
                message: format!(
                    "soak: {letters} open dead letter(s) (at most {} allowed)",
                    s.max_dead_letters
                ),
            })
        } else if lasting {
            Some(SoakFailure {
                limit: "overload",
                found: overload as u64,
                allowed: None,
                message: format!(
                    "soak: the targets were overloaded ({overload} capacity signal(s) since it \
                     started); add capacity or lower the rate"
                ),
            })
        } else if errors > s.max_router_errors {
            Some(SoakFailure {
                limit: "router_errors",
                found: errors,
                allowed: Some(s.max_router_errors),
                message: format!(
                    "soak: routers reported {errors} error(s) since it started (at most {} \
                     allowed)",
                    s.max_router_errors
                ),
            })
        } else {
            None
        };
        if let Some(f) = failed {
            let event = NewEvent::new(
                EventKind::SoakFailed,
                json!({
                    "step": step,
                    "limit": f.limit,
                    "found": f.found,
                    "allowed": f.allowed,
                    "since": started,
                }),
            )
            .reason(Some(&f.message));
            if let Err(e) = driver.store.record_event(id, &driver.actor, &event).await {
                tracing::warn!(migration_id = id, step, "soak_failed not recorded: {e}");
            }
            return Err(Error::failed(f.message));
        }
        let now = chrono::Utc::now();
        if now >= until {
            return Ok(Some(json!({
                "seconds": s.duration.as_secs_f64(),
                "findings": findings,
                "dead_letters": letters,
                "router_errors": errors,
            })));
        }
        driver.progress().note(&format!(
            "soak: {}s left",
            (until - now).num_seconds().max(0)
        ));
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_secs(1)) => {}
            _ = shutdown.changed() => {}
        }
        if *shutdown.borrow() {
            return Ok(None);
        }
    }
}

/// What a soak found that it does not allow.
struct SoakFailure {
    /// Which limit: `findings`, `dead_letters`, `overload`, `router_errors`.
    limit: &'static str,
    found: u64,
    /// The most allowed (`None`: none, for overload without `overload_for`).
    allowed: Option<u64>,
    message: String,
}

/// Rolls the migration back from where it stands, to `rolled_back`: the rollback path, the
/// revert copy in this process (or elsewhere), the revert switch, and the removal of the
/// target.
async fn rollback(
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn diffs_show_what_changed_with_context() {
        let d = diff("a\nb\nc\nd\ne\nf\ng", "a\nb\nc\nX\ne\nf\ng");
        assert!(d.contains("- d\n+ X\n"), "{d}");
        assert!(d.contains("  c\n"), "{d}");
        assert_eq!(diff("same", "same"), "  ...\n");
    }
}

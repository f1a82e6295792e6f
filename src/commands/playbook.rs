//! `reshard playbook validate|schema`, `reshard run`, `reshard approve`, `reshard plan`.

use std::io::IsTerminal;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressStyle};
use serde_json::json;

use crate::cli::{OutputFormat, PlanArgs, PlaybookCommand, RunArgs};
use crate::commands::Ctx;
use crate::driver::playbook::{RunEnd, RunOptions};
use crate::driver::{Driver, Progress, StepState, TaskProgress};
use crate::error::{Error, Result};
use crate::output;
use crate::spec::playbook::{parse_playbook, schema, Action, Playbook};
use crate::store::partitions::Task;
use crate::store::playbooks::PlaybookRow;

/// Reads and checks a playbook file: every problem at once, exit 2.
pub fn read(file: &Path) -> Result<Playbook> {
    let shown = file.display().to_string();
    let text = std::fs::read_to_string(file)
        .map_err(|e| Error::bad_input(format!("{shown}: cannot read: {e}")))?;
    let pb = parse_playbook(&shown, &text).map_err(|errors| {
        Error::bad_input(
            errors
                .iter()
                .map(|e| e.to_string())
                .collect::<Vec<_>>()
                .join("\n"),
        )
    })?;
    for old in &pb.deprecations {
        tracing::warn!(deprecated = %old.path, "{old}");
    }
    Ok(pb)
}

pub fn run(format: OutputFormat, cmd: PlaybookCommand) -> Result<()> {
    match cmd {
        PlaybookCommand::Schema => output::json(&schema()),
        PlaybookCommand::Validate { file } => {
            let pb = read(&file)?;
            let steps: Vec<_> = pb
                .steps
                .iter()
                .map(|s| json!({ "name": s.name, "action": describe(&s.action) }))
                .collect();
            let value = json!({
                "file": file.display().to_string(),
                "valid": true,
                "name": pb.doc.name,
                "collection": pb.doc.collection,
                "steps": steps,
            });
            output::emit(format, &value, || {
                println!(
                    "{} is valid: playbook {:?} moves {} in {} step(s):",
                    file.display(),
                    pb.doc.name,
                    pb.doc.collection,
                    pb.steps.len()
                );
                for (i, s) in pb.steps.iter().enumerate() {
                    println!("  {:>2}. {:<20} {}", i + 1, s.name, describe(&s.action));
                }
            })
        }
    }
}

/// One line for a step.
fn describe(action: &Action) -> String {
    match action {
        Action::Advance { to, .. } => format!("advance to {to}"),
        Action::Backfill(w) => format!("backfill ({})", workers(w.workers)),
        Action::Reconcile(r) => format!(
            "reconcile ({}{})",
            if r.full {
                "full".to_owned()
            } else {
                format!("{} samples per stratum", r.sample)
            },
            if r.repair { ", repair" } else { "" }
        ),
        Action::Soak(s) => format!("soak for {}", humantime::format_duration(s.duration)),
        Action::Approve { .. } => "wait for an approval".into(),
        Action::Cleanup(w) => format!("cleanup ({})", workers(w.workers)),
        Action::Complete { .. } => "complete".into(),
        Action::Rollback(w) => format!("roll back ({})", workers(w.workers)),
    }
}

fn workers(n: Option<usize>) -> String {
    match n {
        None => "workers from --workers".into(),
        Some(0) => "external workers".into(),
        Some(n) => format!("{n} worker(s) here"),
    }
}

pub async fn run_file(ctx: &Ctx, args: RunArgs) -> Result<()> {
    let pb = read(&args.file)?;
    if let Some(addr) = args.metrics.metrics_addr {
        super::exporter::serve(addr).await?;
    }
    let progress = Arc::new(Screen::new(ctx.output));
    let driver = Driver::new(ctx.store.clone(), ctx.actor.clone(), progress.clone());
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    // Ctrl-C (or SIGTERM): workers release their leases, the run ends; run again to continue.
    tokio::spawn(async move {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .expect("a SIGTERM handler");
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        }
        let _ = stop_tx.send(true);
    });
    let options = RunOptions {
        dry_run: args.dry_run,
        workers: args.workers as usize,
        shutdown: stop_rx,
    };
    // Events that in-process workers record (a capacity signal, a failure) reach the hooks
    // while the run goes on, and whatever is left when it ends, before it exits.
    let follow = (!args.dry_run).then(|| {
        tokio::spawn(crate::driver::hooks::follow(
            ctx.store.clone(),
            None,
            ctx.actor.clone(),
            std::time::Duration::from_secs(1),
            options.shutdown.clone(),
        ))
    });
    let end = crate::driver::playbook::run(&driver, &pb, &options).await;
    progress.clear();
    if let Some(follow) = follow {
        follow.abort();
        if let Ok(Some(row)) = ctx.store.playbook(&pb.doc.name).await {
            if let Err(e) = driver.deliver_hooks(row.migration_id).await {
                tracing::warn!("hooks: {e}");
            }
        }
    }
    let end = end?;
    let name = &pb.doc.name;
    match &end {
        RunEnd::Done { migration, phase } => {
            let value = crate::vocabulary::with_old_names(
                json!({ "playbook": name, "migration_id": migration, "end": "done", "phase": phase }),
            );
            output::emit(ctx.output, &value, || {
                println!("playbook {name:?}: every step done; migration {migration} is {phase}")
            })
        }
        RunEnd::WaitingForApproval {
            migration,
            step,
            command,
            message,
        } => {
            let value = crate::vocabulary::with_old_names(json!({
                "playbook": name, "migration_id": migration, "end": "waiting_for_approval",
                "step": step, "command": command, "message": message,
            }));
            output::emit(ctx.output, &value, || {
                println!("playbook {name:?} stops at step {step:?}, which waits for an approval.");
                if let Some(m) = message {
                    println!("  {m}");
                }
                println!("To go on: {command}");
                println!(
                    "then run the playbook again: reshard run {}",
                    args.file.display()
                );
            })
        }
        RunEnd::DryRun { migration, steps } => {
            let value = crate::vocabulary::with_old_names(json!({
                "playbook": name, "migration_id": migration, "end": "dry_run",
                "steps": steps.iter().map(|(s, w)| json!({ "step": s, "would": w })).collect::<Vec<_>>(),
            }));
            output::emit(ctx.output, &value, || {
                println!(
                    "dry run of playbook {name:?} ({}); nothing changed:",
                    match migration {
                        Some(m) => format!("migration {m}"),
                        None => "not started yet".into(),
                    }
                );
                for (s, w) in steps {
                    println!("  {s:<20} {w}");
                }
            })
        }
        RunEnd::Interrupted { migration, step } => {
            let value = crate::vocabulary::with_old_names(json!({
                "playbook": name, "migration_id": migration, "end": "interrupted", "step": step,
            }));
            output::emit(ctx.output, &value, || {
                println!("playbook {name:?} stopped in step {step:?}; run it again to continue")
            })?;
            Err(Error::failed(format!("stopped in step {step:?}")))
        }
    }
}

/// The playbook `approve` names: by the migration it drives, or (deprecated) by its name.
async fn approved_playbook(ctx: &Ctx, given: &str) -> Result<PlaybookRow> {
    let id = given.parse::<i64>();
    if let Ok(id) = id {
        if let Some(row) = ctx.store.playbook_of(id).await? {
            return Ok(row);
        }
    }
    if let Some(row) = ctx.store.playbook(given).await? {
        let (old, _) = crate::vocabulary::renamed_command("approve PLAYBOOK_NAME");
        let new = format!("approve {} --step ...", row.migration_id);
        super::warn_deprecated(old, &format!("approve {given}"), &new);
        return Ok(row);
    }
    Err(match id {
        Ok(id) => Error::bad_input(format!(
            "no playbook drives migration {id} (`reshard run FILE` starts one; `reshard migration \
             list` shows the migrations)"
        )),
        Err(_) => Error::bad_input(format!(
            "no playbook named {given:?} has run yet (`reshard run FILE` starts it); `approve` \
             takes the migration's id"
        )),
    })
}

pub async fn approve(
    ctx: &Ctx,
    given: &str,
    step: &str,
    reason: Option<String>,
    dry_run: bool,
) -> Result<()> {
    let row = approved_playbook(ctx, given).await?;
    let name = row.name.as_str();
    let steps = row.content["steps"].as_array().cloned().unwrap_or_default();
    let approvals: Vec<(usize, String)> = steps
        .iter()
        .enumerate()
        .filter(|(_, s)| s.get("approve").is_some())
        .map(|(i, s)| (i, s["name"].as_str().unwrap_or_default().to_owned()))
        .collect();
    let Some((position, _)) = approvals.iter().find(|(_, n)| n == step) else {
        return Err(Error::bad_input(format!(
            "playbook {name:?} has no approval step {step:?}; its approval steps: {}",
            if approvals.is_empty() {
                "none".to_owned()
            } else {
                approvals
                    .iter()
                    .map(|(_, n)| n.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            }
        )));
    };
    ctx.store
        .approve_step(name, *position as i32, step, &ctx.actor, reason.as_deref())
        .await?;
    let value = json!({
        "migration_id": row.migration_id, "playbook": name, "step": step,
        "approved_by": ctx.actor,
    });
    output::emit_change(
        ctx.output,
        dry_run,
        &value,
        || {
            println!(
                "step {step:?} of playbook {name:?} approved by {}; run the playbook again to go on",
                ctx.actor
            )
        },
        || {
            format!(
                "approve step {step:?} of playbook {name:?} as {}",
                ctx.actor
            )
        },
    )
}

pub async fn plan(ctx: &Ctx, args: PlanArgs) -> Result<()> {
    let pb = read(&args.file)?;
    let driver = Driver::new(
        ctx.store.clone(),
        ctx.actor.clone(),
        Arc::new(crate::driver::Quiet),
    );
    let report = crate::driver::capacity::plan(&driver, &pb).await?;
    output::emit(ctx.output, &report, || {
        super::capacity::print(&report, args.all)
    })
}

/// The run's progress on stderr: a line per step, a bar per task on a terminal (log lines
/// otherwise).
struct Screen {
    output: OutputFormat,
    terminal: bool,
    bar: Mutex<Option<(Task, ProgressBar)>>,
    last_line: Mutex<Option<Instant>>,
}

impl Screen {
    fn new(output: OutputFormat) -> Self {
        Screen {
            output,
            terminal: std::io::stderr().is_terminal(),
            bar: Mutex::default(),
            last_line: Mutex::default(),
        }
    }

    fn clear(&self) {
        if let Some((_, bar)) = self.bar.lock().expect("bar lock").take() {
            bar.finish_and_clear();
        }
    }

    fn line(&self, text: &str) {
        match self.bar.lock().expect("bar lock").as_ref() {
            Some((_, bar)) => bar.println(text),
            None => eprintln!("{text}"),
        }
    }
}

impl Progress for Screen {
    fn moved(&self, t: &crate::store::migrations::Transition, dry_run: bool) {
        if self.output == OutputFormat::Text && !dry_run {
            let (from, to) = (&t.change.from, &t.change.to);
            self.line(&format!(
                "      migration {}: {} -> {} (epoch {})",
                t.migration.id, from.phase, to.phase, to.epoch
            ));
        }
    }

    fn waiting(
        &self,
        migration: &crate::store::migrations::Migration,
        routers: &[crate::store::routers::Unacknowledged],
    ) {
        let names: Vec<String> = routers.iter().map(|r| r.label()).collect();
        self.line(&format!(
            "      waiting for {} router(s) to acknowledge epoch {}: {}",
            routers.len(),
            migration.epoch,
            names.join(", ")
        ));
    }

    fn silent(&self, to: crate::phase::Phase, routers: &[crate::store::routers::SilentRouter]) {
        if routers.is_empty() {
            self.line(&format!(
                "      no silent router is counted any more: the {to} begins"
            ));
            return;
        }
        let names: Vec<String> = routers.iter().map(|r| r.label()).collect();
        self.line(&format!(
            "      before the {to}: waiting for {} router(s) that stopped heartbeating to be \
             counted out (writes flow meanwhile): {}",
            routers.len(),
            names.join("; ")
        ));
    }

    fn counted_out(&self, r: &crate::store::routers::Unacknowledged) {
        self.line(&format!(
            "      router {} counted out: its lease ran out at {}",
            r.label(),
            r.lease_expires_at.to_rfc3339()
        ));
    }

    fn finished(
        &self,
        migration: i64,
        kind: crate::store::events::EventKind,
        details: &serde_json::Value,
    ) {
        self.line(&format!("      migration {migration}: {kind}: {details}"));
    }

    fn note(&self, message: &str) {
        let mut last = self.last_line.lock().expect("line lock");
        // Notes that repeat every second (a soak's countdown) are thinned out.
        if message.starts_with("soak:")
            && last.is_some_and(|t| t.elapsed() < Duration::from_secs(10))
        {
            return;
        }
        *last = Some(Instant::now());
        drop(last);
        self.line(&format!("      {message}"));
    }

    fn step(&self, position: usize, count: usize, name: &str, state: &StepState) {
        self.clear();
        let at = format!("[{}/{count}] {name}", position + 1);
        let text = match state {
            StepState::AlreadyDone => format!("{at}: done earlier"),
            StepState::Started => format!("{at} ..."),
            StepState::Done(outcome) => format!("{at}: done {outcome}"),
            StepState::Waiting(why) => format!("{at}: {why}"),
            StepState::Failed(why) => format!("{at}: FAILED: {why}"),
        };
        eprintln!("{text}");
    }

    fn task(&self, p: &TaskProgress) {
        let size = crate::estimate::TaskSize {
            partitions: p.partitions,
            done: p.done,
            scanned: p.documents,
            total: p.approx_documents,
        };
        let eta = match (size.total, size.eta(p.docs_per_sec)) {
            (None, None) => "- (total unknown)".to_owned(),
            (_, Some(s)) => format!("{s:.0}s"),
            (_, None) => "-".to_owned(),
        };
        if self.terminal {
            let mut bar = self.bar.lock().expect("bar lock");
            if bar.as_ref().is_none_or(|(t, _)| *t != p.task) {
                let b = ProgressBar::new(0);
                b.set_prefix(p.task.to_string());
                *bar = Some((p.task, b));
            }
            let (_, b) = bar.as_ref().expect("set above");
            // Without a total there is no bar to fill: the documents done and the rest.
            let template = match size.total {
                Some(_) => "      {prefix:9} [{bar:30}] {pos}/{len} docs  {msg}",
                None => "      {prefix:9} {pos} docs (total unknown)  {msg}",
            };
            b.set_style(
                ProgressStyle::with_template(template)
                    .unwrap_or_else(|_| ProgressStyle::default_bar())
                    .progress_chars("=> "),
            );
            b.set_length(size.total.unwrap_or(0).max(p.documents).max(1) as u64);
            b.set_position(p.documents.max(0) as u64);
            b.set_message(format!(
                "{:.0} docs/s, partitions {}/{}, ETA {eta}",
                crate::output::not_negative(p.docs_per_sec),
                p.done,
                p.partitions
            ));
            return;
        }
        let mut last = self.last_line.lock().expect("line lock");
        if last.is_some_and(|t| t.elapsed() < Duration::from_secs(5)) {
            return;
        }
        *last = Some(Instant::now());
        let of = size
            .total
            .map_or("(total unknown)".to_owned(), |t| format!("of ~{t}"));
        eprintln!(
            "      {}: {} {of} documents, partitions {}/{}, {:.0} docs/s, ETA {eta}",
            p.task,
            p.documents,
            p.done,
            p.partitions,
            crate::output::not_negative(p.docs_per_sec)
        );
    }
}

//! `reshard migration`: planning migrations and moving them through their phases.

use serde_json::json;
use std::sync::Arc;

use crate::cli::MigrationCommand;
use crate::commands::Ctx;
use crate::driver::wait::Outcome;
use crate::driver::{Driver, MoveOptions};
use crate::error::{Error, Result};
use crate::output;
use crate::phase::{Action, Phase};
use crate::store::migrations::{Migration, Transition};

pub async fn run(ctx: &Ctx, cmd: MigrationCommand) -> Result<()> {
    match cmd {
        MigrationCommand::Create {
            collection,
            to,
            from,
            dry_run,
        } => {
            let from = match from {
                Some(v) => v,
                None => ctx.store.current_version(&collection).await?,
            };
            let m = ctx
                .store
                .create_migration(&collection, from, to, &ctx.actor)
                .await?;
            let what = || {
                format!(
                    "{} v{} -> v{} (phase {}, epoch {})",
                    m.collection,
                    m.from_version,
                    m.to_version,
                    m.phase(),
                    m.epoch
                )
            };
            output::emit_change(
                ctx.output,
                dry_run,
                &m,
                || println!("migration {} planned: {}", m.id, what()),
                || format!("plan a migration of {}", what()),
            )
        }
        MigrationCommand::List { all } => {
            let list = ctx.store.migrations(all).await?;
            output::emit(ctx.output, &list, || {
                output::table(
                    &[
                        "id",
                        "collection",
                        "from",
                        "to",
                        "phase",
                        "epoch",
                        "updated",
                    ],
                    list.iter().map(|m| {
                        [
                            m.id.to_string(),
                            m.collection.clone(),
                            format!("v{}", m.from_version),
                            format!("v{}", m.to_version),
                            m.status_text(),
                            m.epoch.to_string(),
                            m.updated_at.to_rfc3339(),
                        ]
                    }),
                )
            })
        }
        MigrationCommand::Show(id) => {
            let m = ctx.store.migration(id.id).await?;
            output::emit(ctx.output, &m, || show(&m))
        }
        MigrationCommand::Advance {
            id,
            to,
            dry_run,
            reason,
            timeout,
            switch_timeout,
        } => {
            let options = MoveOptions {
                dry_run,
                reason,
                timeout,
                switch_timeout,
            };
            let (driver, moves) = driver(ctx);
            let result = driver.advance(id, to, &options).await;
            moves.finish(ctx, result)
        }
        MigrationCommand::Rollback {
            id,
            dry_run,
            reason,
            timeout,
            switch_timeout,
        } => {
            let options = MoveOptions {
                dry_run,
                reason,
                timeout,
                switch_timeout,
            };
            let (driver, moves) = driver(ctx);
            let result = driver.rollback(id, &options).await;
            if let Ok(Phase::Reverting) = result {
                if !dry_run {
                    eprintln!(
                        "migration {id} is reverting: routers mirror their writes to the source; \
                         run `reshard worker {id} --exit-when-done` to copy the \
                         application's writes back, then `reshard migration advance {id} --to \
                         revert_switch` (it holds writes for a moment and ends in rolled_back)"
                    );
                }
            }
            moves.finish(ctx, result.map(|_| ()))
        }
        MigrationCommand::Pause {
            id,
            reason,
            dry_run,
        } => {
            let t = ctx
                .store
                .transition(id, &Action::Pause, &ctx.actor, reason.as_deref(), dry_run)
                .await?;
            report(ctx, &t, dry_run)
        }
        MigrationCommand::Resume {
            id,
            reason,
            dry_run,
        } => {
            let t = ctx
                .store
                .transition(id, &Action::Resume, &ctx.actor, reason.as_deref(), dry_run)
                .await?;
            report(ctx, &t, dry_run)
        }
        MigrationCommand::Configure {
            id,
            max_missing,
            max_mismatched,
            max_misplaced,
            cleanup_waves,
            drop_empty_source,
            shadow_read_percent,
            shadow_reads,
            keep_empty_source,
            documents_per_partition,
            reason,
            dry_run,
        } => {
            // The old flag warns with the other old names (`cli::Command::deprecated_words`).
            let shadow_read_percent = shadow_read_percent.or(shadow_reads);
            if documents_per_partition.is_some() {
                let m = ctx.store.migration(id).await?;
                if let Some(at) = m.backfill_planned_at {
                    return Err(Error::bad_input(format!(
                        "--documents-per-partition: migration {id}'s backfill was planned at {}; \
                         its partitions are cut, so a new size would change nothing",
                        at.format("%Y-%m-%d %H:%M:%S UTC")
                    )));
                }
            }
            let drop_empty_source = match (drop_empty_source, keep_empty_source) {
                (true, _) => Some(true),
                (_, true) => Some(false),
                _ => None,
            };
            let waves = match cleanup_waves {
                Some(w) => Some(<[f64; 3]>::try_from(w).map_err(|w| {
                    Error::bad_input(format!(
                        "--cleanup-waves: give three percentages, not {}",
                        w.len()
                    ))
                })?),
                None => None,
            };
            let (before, after) = ctx
                .store
                .update_settings(
                    id,
                    |s| {
                        if let Some(v) = max_missing {
                            s.max_missing = v;
                        }
                        if let Some(v) = max_mismatched {
                            s.max_mismatched = v;
                        }
                        if let Some(v) = max_misplaced {
                            s.max_misplaced = v;
                        }
                        if let Some(v) = waves {
                            s.cleanup_waves = v;
                        }
                        if let Some(v) = drop_empty_source {
                            s.drop_empty_source = v;
                        }
                        if let Some(v) = shadow_read_percent {
                            s.shadow_read_percent = v;
                        }
                        if let Some(v) = documents_per_partition {
                            s.documents_per_partition = Some(v);
                        }
                    },
                    &ctx.actor,
                    reason.as_deref(),
                )
                .await?;
            let mut value = crate::vocabulary::with_old_names(
                json!({ "migration_id": id, "before": before, "after": after }),
            );
            if dry_run {
                value["dry_run"] = json!(true);
            }
            output::emit(ctx.output, &value, || {
                if dry_run {
                    println!("dry run: would store these settings; nothing changed");
                }
                output::fields(&[
                    ("max missing", after.max_missing.to_string()),
                    ("max mismatched", after.max_mismatched.to_string()),
                    ("max misplaced", after.max_misplaced.to_string()),
                    ("cleanup waves", format!("{:?} %", after.cleanup_waves)),
                    ("drop empty source", after.drop_empty_source.to_string()),
                    (
                        "shadow reads",
                        format!("{} % of reads", after.shadow_read_percent),
                    ),
                    (
                        "documents per partition",
                        documents_per_partition_text(after.documents_per_partition),
                    ),
                ])
            })
        }
        MigrationCommand::Wait { id, until, timeout } => wait(ctx, id, until, timeout).await,
        MigrationCommand::Status {
            id,
            watch,
            partitions,
        } => super::status::run(ctx, id, watch, partitions).await,
        MigrationCommand::History(id) => {
            let events = ctx.store.events(id.id).await?;
            output::emit(ctx.output, &events, || {
                output::table(
                    &["#", "at", "actor", "what", "from", "to", "epoch", "reason"],
                    events.iter().map(|e| {
                        [
                            e.id.to_string(),
                            e.at.to_rfc3339(),
                            e.actor.clone(),
                            e.kind.to_string(),
                            output::or_dash(e.from_phase.0.map(Phase::as_str)),
                            output::or_dash(e.to_phase.0.map(Phase::as_str)),
                            e.epoch.to_string(),
                            output::or_dash(e.reason.as_ref()),
                        ]
                    }),
                )
            })
        }
    }
}

/// `migration wait`: exit 0 when reached, 1 when time ran out or it will not be reached.
async fn wait(
    ctx: &Ctx,
    id: i64,
    until: crate::cli::Until,
    timeout: Option<std::time::Duration>,
) -> Result<()> {
    let what = until.as_str();
    let progress = WaitProgress;
    match crate::driver::wait::wait(&ctx.store, id, until, timeout, &progress).await? {
        Outcome::Reached(m) => {
            let value = json!({ "id": id, "until": what, "reached": true, "phase": m.phase() });
            output::emit(ctx.output, &value, || {
                println!("migration {id}: {what} reached (phase {})", m.status_text())
            })
        }
        Outcome::Never(m) => Err(Error::failed(format!(
            "migration {id} is in {}: it will not reach {what}",
            m.status_text()
        ))),
        Outcome::TimedOut { missing, .. } => Err(Error::failed(format!(
            "timed out after {} waiting for migration {id} to reach {what}; it is {missing}",
            humantime::format_duration(timeout.unwrap_or_default())
        ))),
    }
}

/// What `migration wait` still waits for, on stderr whatever the log level (stdout carries the
/// result).
struct WaitProgress;

impl crate::driver::Progress for WaitProgress {
    fn note(&self, message: &str) {
        eprintln!("{message}");
    }
}

fn show(m: &Migration) {
    let phase = m.phase();
    output::fields(&[
        ("id", m.id.to_string()),
        ("collection", m.collection.clone()),
        (
            "versions",
            format!("v{} -> v{}", m.from_version, m.to_version),
        ),
        ("phase", m.status_text()),
        ("epoch", m.epoch.to_string()),
        ("router reads", format!("{:?}", phase.read_path())),
        ("router writes", format!("{:?}", phase.write_path())),
        (
            "next",
            phase
                .next()
                .iter()
                .map(|p| p.as_str())
                .collect::<Vec<_>>()
                .join(", "),
        ),
        ("created", m.created_at.to_rfc3339()),
        ("updated", m.updated_at.to_rfc3339()),
        (
            "finished",
            output::or_dash(m.finished_at.map(|t| t.to_rfc3339())),
        ),
    ]);
}

fn report(ctx: &Ctx, t: &Transition, dry_run: bool) -> Result<()> {
    output::emit(ctx.output, &move_json(t, dry_run), || {
        print_move(t, dry_run)
    })
}

/// The driver for one command, reporting to stderr, and the moves it made (printed as text as
/// they happen, and as one JSON object at the end in JSON mode).
fn driver(ctx: &Ctx) -> (Driver, Arc<super::progress::Stderr>) {
    let progress = Arc::new(super::progress::Stderr::new(ctx.output));
    (
        Driver::new(ctx.store.clone(), ctx.actor.clone(), progress.clone()),
        progress,
    )
}

pub(super) fn move_json(t: &Transition, dry_run: bool) -> serde_json::Value {
    let (from, to) = (&t.change.from, &t.change.to);
    let gates: Vec<&str> = t.change.gates.iter().map(|g| g.as_str()).collect();
    json!({
        "id": t.migration.id,
        "dry_run": dry_run,
        "from": { "phase": from.phase, "epoch": from.epoch, "paused": from.paused },
        "to": { "phase": to.phase, "epoch": to.epoch, "paused": to.paused },
        "gates": gates,
        "event_id": t.event_id,
        "routers_must_acknowledge": from.phase.changes_router_behaviour(to.phase),
    })
}

pub(super) fn print_move(t: &Transition, dry_run: bool) {
    let (from, to) = (&t.change.from, &t.change.to);
    let gates: Vec<&str> = t.change.gates.iter().map(|g| g.as_str()).collect();
    let what = if from.phase != to.phase {
        format!("{} -> {}", from.phase, to.phase)
    } else if to.paused != from.paused {
        format!(
            "{} {}",
            to.phase,
            if to.paused { "paused" } else { "resumed" }
        )
    } else {
        format!("{} resumed", to.phase)
    };
    if dry_run {
        println!(
            "dry run: migration {} may move {what}; gates hold: {}; nothing changed",
            t.migration.id,
            if gates.is_empty() {
                "none needed".to_owned()
            } else {
                gates.join(", ")
            }
        );
    } else {
        println!(
            "migration {}: {what} (epoch {} -> {})",
            t.migration.id, from.epoch, to.epoch
        );
        if from.phase.changes_router_behaviour(to.phase) {
            println!(
                "routers change behaviour in {}: waiting for every live router to acknowledge \
                 epoch {}",
                to.phase, to.epoch
            );
        }
    }
}

/// A partition size as `migration configure` and `throttle show` print it.
pub fn documents_per_partition_text(size: Option<u64>) -> String {
    size.map_or_else(
        || "chosen by the planner (one per worker, at least 100000 each)".to_owned(),
        |n| n.to_string(),
    )
}

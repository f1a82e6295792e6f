//! `reshard migration`: planning migrations and moving them through their phases.

use std::time::{Duration, Instant};

use serde_json::json;

use crate::cli::MigrationCommand;
use crate::commands::Ctx;
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
        } => {
            let from = match from {
                Some(v) => v,
                None => ctx.store.current_version(&collection).await?,
            };
            let m = ctx
                .store
                .create_migration(&collection, from, to, &ctx.actor)
                .await?;
            output::emit(ctx.output, &m, || {
                println!(
                    "migration {} planned: {} v{} -> v{} (phase {}, epoch {})",
                    m.id,
                    m.collection,
                    m.from_version,
                    m.to_version,
                    m.phase(),
                    m.epoch
                )
            })
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
            let steps = Steps {
                dry_run,
                reason,
                timeout: Duration::from_secs(timeout),
                switch_timeout: Duration::from_secs(switch_timeout),
            };
            let mut moves = Moves::new(ctx, dry_run);
            let result = advance(ctx, &mut moves, id, to, &steps).await;
            moves.finish(result)
        }
        MigrationCommand::Rollback {
            id,
            dry_run,
            reason,
            timeout,
            switch_timeout,
        } => {
            let m = ctx.store.migration(id).await?;
            let path: &[Phase] = match m.phase() {
                Phase::Planned => &[Phase::RolledBack],
                Phase::DualRead => &[Phase::Planned],
                Phase::WriteSwitch => &[Phase::DualRead, Phase::Planned],
                Phase::NewWrites | Phase::Backfill | Phase::Reconcile | Phase::NewReads => {
                    &[Phase::Reverting]
                }
                Phase::Cleanup | Phase::Completed => {
                    return Err(Error::bad_input(format!(
                        "migration {id} is in {}: cleanup has deleted moved documents from the \
                         source, so a rollback would lose them; it is refused",
                        m.phase()
                    )))
                }
                Phase::Reverting | Phase::RevertSwitch | Phase::RolledBack => {
                    return Err(Error::bad_input(format!(
                        "migration {id} is already rolling back ({}); continue with \
                         `reshard migration advance {id} --to {}`",
                        m.phase(),
                        m.phase().next().first().map_or("-", |p| p.as_str())
                    )))
                }
            };
            let steps = Steps {
                dry_run,
                reason,
                timeout: Duration::from_secs(timeout),
                switch_timeout: Duration::from_secs(switch_timeout),
            };
            let mut moves = Moves::new(ctx, dry_run);
            let mut result = Ok(());
            for to in path {
                result = advance(ctx, &mut moves, id, *to, &steps).await;
                if result.is_err() || dry_run {
                    break;
                }
            }
            if result.is_ok() && !dry_run && path.last() == Some(&Phase::Reverting) {
                eprintln!(
                    "migration {id} is reverting: routers mirror their writes to the source; \
                     run `reshard worker --migration {id} --exit-when-done` to copy the \
                     application's writes back, then `reshard migration advance {id} --to \
                     revert_switch` (it holds writes for a moment and ends in rolled_back)"
                );
            }
            moves.finish(result)
        }
        MigrationCommand::Pause { id, reason } => {
            let t = ctx
                .store
                .transition(id, &Action::Pause, &ctx.actor, reason.as_deref(), false)
                .await?;
            report(ctx, &t, false)
        }
        MigrationCommand::Resume { id, reason } => {
            let t = ctx
                .store
                .transition(id, &Action::Resume, &ctx.actor, reason.as_deref(), false)
                .await?;
            report(ctx, &t, false)
        }
        MigrationCommand::Configure {
            id,
            max_missing,
            max_mismatched,
            max_misplaced,
            cleanup_waves,
            drop_empty_source,
            reason,
        } => {
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
                    },
                    &ctx.actor,
                    reason.as_deref(),
                )
                .await?;
            let value = json!({ "migration": id, "before": before, "after": after });
            output::emit(ctx.output, &value, || {
                output::fields(&[
                    ("max missing", after.max_missing.to_string()),
                    ("max mismatched", after.max_mismatched.to_string()),
                    ("max misplaced", after.max_misplaced.to_string()),
                    ("cleanup waves", format!("{:?} %", after.cleanup_waves)),
                    ("drop empty source", after.drop_empty_source.to_string()),
                ])
            })
        }
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
                            e.kind.clone(),
                            output::or_dash(e.from_phase.as_ref()),
                            output::or_dash(e.to_phase.as_ref()),
                            e.epoch.to_string(),
                            output::or_dash(e.reason.as_ref()),
                        ]
                    }),
                )
            })
        }
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

/// How `advance` and `rollback` move.
struct Steps {
    dry_run: bool,
    reason: Option<String>,
    timeout: Duration,
    switch_timeout: Duration,
}

/// One move with everything around it: preparation before `dual_read`, the router barrier or
/// the write switch, and the final steps of `completed`, `rolled_back` and a return to
/// `planned`.
async fn advance(
    ctx: &Ctx,
    moves: &mut Moves<'_>,
    id: i64,
    to: Phase,
    steps: &Steps,
) -> Result<()> {
    let current = ctx.store.migration(id).await?;
    if current.phase() == Phase::Planned && to == Phase::DualRead {
        prepare(ctx, &current, steps.dry_run).await?;
    }
    let t = ctx
        .store
        .transition(
            id,
            &Action::Advance(to),
            &ctx.actor,
            steps.reason.as_deref(),
            steps.dry_run,
        )
        .await?;
    moves.record(&t);
    if steps.dry_run {
        return Ok(());
    }
    if t.change.from.phase.changes_router_behaviour(to) {
        if matches!(to, Phase::WriteSwitch | Phase::RevertSwitch) {
            write_switch(ctx, moves, &t, steps.switch_timeout, steps.timeout).await?;
        } else {
            barrier(ctx, &t.migration, steps.timeout).await?;
        }
    }
    // The revert switch moves on to rolled_back by itself once every router acknowledged.
    let reached = ctx.store.migration(id).await?;
    if matches!(
        reached.phase(),
        Phase::Completed | Phase::RolledBack | Phase::Planned
    ) && reached.phase() != current.phase()
    {
        // Nothing may be purged or dropped while a router could still act on the old phase.
        barrier(ctx, &reached, steps.timeout).await?;
        finish(ctx, &reached, reached.phase()).await?;
    }
    Ok(())
}

/// Purges after `completed`; removes the target layout after a rollback.
async fn finish(ctx: &Ctx, m: &Migration, to: Phase) -> Result<()> {
    let (from, target) = ctx.store.migration_versions(m).await?;
    let shards = super::shard_databases(ctx, false).await?;
    let failed =
        |e: crate::finish::FinishError| Error::failed(crate::redact::redact_uri(&e.to_string()));
    let (kind, details) = if to == Phase::Completed {
        let settings =
            crate::settings::MigrationSettings::from_json(&m.settings).map_err(Error::failed)?;
        let d = crate::finish::purge_completed(&from, &target, &shards, settings.drop_empty_source)
            .await
            .map_err(failed)?;
        ctx.store.mark_tombstones_purged(m.id).await?;
        ("tombstones_purged", d)
    } else {
        let d = crate::finish::remove_target_layout(&from, &target, &shards)
            .await
            .map_err(failed)?;
        ("target_removed", d)
    };
    ctx.store
        .record_event(m.id, &ctx.actor, kind, None, details.clone())
        .await?;
    eprintln!("migration {}: {kind}: {details}", m.id);
    Ok(())
}

/// Creates the target collections and indexes before routers start reading the target.
async fn prepare(ctx: &Ctx, m: &Migration, dry_run: bool) -> Result<()> {
    let (from, to) = ctx.store.migration_versions(m).await?;
    let shards = super::shard_databases(ctx, false).await?;
    let done = crate::prepare::prepare(&from, &to, &shards, dry_run)
        .await
        .map_err(|e| Error::failed(crate::redact::redact_uri(&e.to_string())))?;
    for p in &done {
        tracing::info!(location = %p.location, dry_run, "prepare: {}", p.action);
    }
    Ok(())
}

fn report(ctx: &Ctx, t: &Transition, dry_run: bool) -> Result<()> {
    output::emit(ctx.output, &move_json(t, dry_run), || {
        print_move(t, dry_run)
    })
}

/// Moves made by one `advance` (the write switch makes two, or goes back): printed as text as
/// they happen, and as one JSON object at the end: the last move's fields plus `moves`.
struct Moves<'a> {
    ctx: &'a Ctx,
    dry_run: bool,
    json: Vec<serde_json::Value>,
}

impl<'a> Moves<'a> {
    fn new(ctx: &'a Ctx, dry_run: bool) -> Self {
        Moves {
            ctx,
            dry_run,
            json: Vec::new(),
        }
    }

    fn record(&mut self, t: &Transition) {
        match self.ctx.output {
            crate::cli::OutputFormat::Text => print_move(t, self.dry_run),
            crate::cli::OutputFormat::Json => self.json.push(move_json(t, self.dry_run)),
        }
    }

    /// Prints the JSON summary (in JSON mode), then passes `result` on.
    fn finish(self, result: Result<()>) -> Result<()> {
        if let Some(last) = self.json.last() {
            let mut summary = last.clone();
            summary["moves"] = serde_json::Value::Array(self.json.clone());
            output::json(&summary)?;
        }
        result
    }
}

fn move_json(t: &Transition, dry_run: bool) -> serde_json::Value {
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

fn print_move(t: &Transition, dry_run: bool) {
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

/// Waits until every router that still counts has acknowledged the migration's epoch. A router
/// is counted out a fence margin after its lease ran out: it sends no command after that, and
/// it loads the phase again before it serves. The routers counted out while the barrier waited
/// for them are named, with why.
async fn barrier(ctx: &Ctx, migration: &Migration, timeout: Duration) -> Result<()> {
    let started = Instant::now();
    let mut last_report = None;
    let mut waited_for = std::collections::BTreeSet::new();
    loop {
        let behind = ctx.store.routers_behind(migration).await?;
        let (counted_out, missing): (Vec<_>, Vec<_>) =
            behind.into_iter().partition(|r| r.counted_out);
        if missing.is_empty() {
            let gone: Vec<_> = counted_out
                .iter()
                .filter(|r| waited_for.contains(&r.label()))
                .collect();
            for r in &gone {
                eprintln!(
                    "router {} counted out: its lease ran out at {} and a fence margin has \
                     passed, so none of its operations can land any more; it loads the phase \
                     again before it serves",
                    r.label(),
                    r.lease_expires_at.to_rfc3339()
                );
            }
            if last_report.is_some() {
                eprintln!(
                    "every router still counted acknowledged epoch {} after {:.1}s{}",
                    migration.epoch,
                    started.elapsed().as_secs_f64(),
                    if gone.is_empty() {
                        String::new()
                    } else {
                        format!("; {} counted out (above)", gone.len())
                    }
                );
            }
            return Ok(());
        }
        waited_for.extend(missing.iter().map(|r| r.label()));
        let names = missing
            .iter()
            .map(|r| r.label())
            .collect::<Vec<_>>()
            .join(", ");
        if started.elapsed() >= timeout {
            return Err(Error::failed(format!(
                "{} router(s) did not acknowledge epoch {} of migration {} within {}s: {names}; \
                 the phase is {} and the next move waits for them",
                missing.len(),
                migration.epoch,
                migration.id,
                timeout.as_secs(),
                migration.phase()
            )));
        }
        if last_report.is_none_or(|at: Instant| at.elapsed() >= Duration::from_secs(2)) {
            eprintln!(
                "waiting for {} router(s) to acknowledge epoch {}: {names}",
                missing.len(),
                migration.epoch
            );
            last_report = Some(Instant::now());
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The write switch: once every live router holds its writes and has drained, no one writes
/// the old side, and the migration moves on at once. If the acknowledgements do not all arrive
/// in time, the migration goes back and nothing was lost.
async fn write_switch(
    ctx: &Ctx,
    moves: &mut Moves<'_>,
    entered: &Transition,
    switch_timeout: Duration,
    timeout: Duration,
) -> Result<()> {
    let (forward, back) = match entered.change.to.phase {
        Phase::RevertSwitch => (Phase::RolledBack, Phase::Reverting),
        _ => (Phase::NewWrites, Phase::DualRead),
    };
    let id = entered.migration.id;
    match barrier(ctx, &entered.migration, switch_timeout).await {
        Ok(()) => {
            let t = ctx
                .store
                .transition(
                    id,
                    &Action::Advance(forward),
                    &ctx.actor,
                    Some("write switch acknowledged"),
                    false,
                )
                .await?;
            moves.record(&t);
            barrier(ctx, &t.migration, timeout).await
        }
        Err(waited) => {
            let why = format!("write switch timed out: {waited}");
            let t = ctx
                .store
                .transition(id, &Action::Advance(back), &ctx.actor, Some(&why), false)
                .await?;
            moves.record(&t);
            Err(Error::failed(format!(
                "{why}; migration {id} went back to {back}, nothing was lost"
            )))
        }
    }
}

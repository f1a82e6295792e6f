//! `reshard migration status`: where a migration stands and how fast it moves.
//!
//! The JSON output uses the names operators know from MongoDB's `$currentOp` for resharding
//! where they fit (`documentsCopied`, `approxDocumentsToCopy`,
//! `remainingOperationTimeEstimatedSecs`).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use indicatif::{MultiProgress, ProgressBar, ProgressStyle};
use serde::Serialize;
use serde_json::json;

use crate::commands::Ctx;
use crate::error::{Error, Result};
use crate::output;
use crate::phase::Phase;
use crate::settings::MigrationSettings;
use crate::store::events::EventKind;
use crate::store::partitions::{Partition, PartitionState, Task, TaskTotals};
use crate::store::workers::WorkerRow;

/// At most this many open shadow-read mismatches are listed.
const SHOWN_MISMATCHES: usize = 20;

/// Per source location, summed over its partitions.
/// Keys are snake_case like every JSON reshard prints, but for the names that mirror
/// MongoDB's `$currentOp` resharding metrics (`approxDocumentsToCopy`, `documentsCopied`,
/// `remainingOperationTimeEstimatedSecs`).
#[derive(Clone, Debug, Default, Serialize)]
struct ShardProgress {
    source_shard: String,
    source_collection: String,
    partitions: i64,
    partitions_done: i64,
    scan: String,
    #[serde(rename = "approxDocumentsToCopy")]
    approx_documents_to_copy: i64,
    documents_scanned: i64,
    #[serde(rename = "documentsCopied")]
    documents_copied: i64,
    documents_already_present: i64,
    documents_stamped: i64,
    documents_dead_lettered: i64,
}

struct Snapshot {
    value: serde_json::Value,
    shards: Vec<ShardProgress>,
    totals: TaskTotals,
    phase: Phase,
    docs_per_sec: f64,
    eta: Option<f64>,
}

async fn snapshot(ctx: &Ctx, id: i64) -> Result<(Snapshot, Vec<Partition>, Vec<WorkerRow>)> {
    let m = ctx.store.migration(id).await?;
    let settings = MigrationSettings::from_json(&m.settings).map_err(Error::failed)?;
    let partitions = ctx.store.partitions(id, Task::Backfill).await?;
    let totals = ctx.store.task_totals(id, Task::Backfill).await?;
    let cleanup = ctx.store.task_totals(id, Task::Cleanup).await?;
    let revert = ctx.store.task_totals(id, Task::Revert).await?;
    let workers = ctx.store.workers(id).await?;
    let open_dead_letters = ctx.store.dead_letters(id, false).await?.len();
    let bypasses = ctx.store.bypass_summary(id).await?;
    let shadow = ctx.store.shadow_totals(id).await?;
    let mut open_mismatches = ctx.store.shadow_mismatches(id, true).await?;
    open_mismatches.truncate(SHOWN_MISMATCHES);
    let events = ctx.store.events(id).await?;
    let capacity: Vec<_> = events
        .iter()
        .filter(|e| e.kind == EventKind::CapacitySignal)
        .collect();
    let rate_cut_events = events
        .iter()
        .filter(|e| e.kind == EventKind::RateCut)
        .count();

    let mut shards: BTreeMap<(String, String), ShardProgress> = BTreeMap::new();
    for p in &partitions {
        let s = shards
            .entry((p.source_shard.clone(), p.source_collection.clone()))
            .or_insert_with(|| ShardProgress {
                source_shard: p.source_shard.clone(),
                source_collection: p.source_collection.clone(),
                scan: if p.tenant_filter.is_some() {
                    "tenants"
                } else {
                    "everything"
                }
                .into(),
                ..ShardProgress::default()
            });
        s.partitions += 1;
        s.partitions_done += i64::from(p.state == PartitionState::Done);
        s.approx_documents_to_copy += p.approx_documents.unwrap_or(0);
        s.documents_scanned += p.scanned;
        s.documents_copied += p.inserted;
        s.documents_already_present += p.already_present;
        s.documents_stamped += p.stamped;
        s.documents_dead_lettered += p.dead_lettered;
    }
    let shards: Vec<ShardProgress> = shards.into_values().collect();
    let live: Vec<&WorkerRow> = workers.iter().filter(|w| w.live).collect();
    let docs_per_sec: f64 = live.iter().map(|w| w.docs_per_sec).sum();
    let applied: f64 = live.iter().map(|w| w.applied_docs_per_sec).sum();
    let sum = |f: fn(&WorkerRow) -> i64| workers.iter().map(f).sum::<i64>();
    let remaining = (totals.approx_documents - totals.scanned).max(0) as f64;
    let eta = if totals.partitions > 0 && totals.done == totals.partitions {
        Some(0.0)
    } else if docs_per_sec > 0.5 {
        Some(remaining / docs_per_sec)
    } else {
        None
    };
    let mut tasks = serde_json::Map::new();
    for (name, task_partitions) in [
        ("backfill", partitions.clone()),
        ("verify", latest_full_run_partitions(ctx, id).await?),
        ("cleanup", ctx.store.partitions(id, Task::Cleanup).await?),
        ("revert", ctx.store.partitions(id, Task::Revert).await?),
    ] {
        tasks.insert(name.to_owned(), task_progress(&task_partitions));
    }
    let routers: Vec<serde_json::Value> = ctx
        .store
        .routers(Some(&m.collection))
        .await?
        .into_iter()
        .filter(|r| r.live)
        .map(|r| {
            json!({
                "name": r.name,
                "host": r.host,
                "pid": r.pid,
                "acknowledged_epoch": r.acked_epoch,
                "lease_age_secs": r.lease_age_secs,
                "p99_ms": r.stats["all"]["p99_ms"],
                "errors": r.stats["all"]["errors"],
            })
        })
        .collect();
    let findings_open = open_findings(ctx, id).await?;
    let value = json!({
        "migration": m.id,
        "collection": m.collection,
        "phase": m.phase().as_str(),
        "state": m.status_text(),
        "epoch": m.epoch,
        "paused": m.paused,
        "failure": m.failure_reason,
        "from_version": m.from_version,
        "to_version": m.to_version,
        "backfill": {
            "planned": m.backfill_planned_at.is_some(),
            "planned_at": m.backfill_planned_at,
            "completed_at": m.backfill_completed_at,
            "partitions": totals.partitions,
            "partitions_done": totals.done,
            "partitions_leased": totals.leased,
            "approxDocumentsToCopy": totals.approx_documents,
            "documents_scanned": totals.scanned,
            "documentsCopied": totals.inserted,
            "documents_already_present": totals.already_present,
            "documents_stamped": totals.stamped,
            "documents_dead_lettered": totals.dead_lettered,
            "documents_skipped_foreign": totals.skipped_foreign,
            "dead_letters_open": open_dead_letters,
            "docs_per_sec": docs_per_sec,
            "remainingOperationTimeEstimatedSecs": eta.map(|s| s.round() as i64),
            "shards": shards,
        },
        "throttle": {
            "configured_docs_per_sec": settings.max_docs_per_sec,
            "applied_docs_per_sec": applied,
            "latency_budget_ms": crate::throttle::latency_budget_ms(
                settings.latency_budget_ms,
                settings.latency_budget_factor,
                m.app_p99_baseline_ms,
            ),
            "app_p99_baseline_ms": m.app_p99_baseline_ms,
            "batch_size": settings.batch_size,
            "max_in_flight_per_shard": settings.max_in_flight_per_shard,
            "overloads": sum(|w| w.overloads),
            "retries": sum(|w| w.retries),
            "rate_cuts": sum(|w| w.rate_cuts),
            "rate_cut_events": rate_cut_events,
            "capacity_signals": capacity.len(),
            "last_capacity_signal": capacity.last().map(|e| json!({ "at": e.at, "reason": e.reason })),
        },
        "cleanup": {
            "planned": m.cleanup_planned_at.is_some(),
            "partitions": cleanup.partitions,
            "partitions_done": cleanup.done,
            "documents_scanned": cleanup.scanned,
            "documents_deleted": cleanup.deleted,
            "documents_kept": cleanup.kept,
            "tombstones_purged_at": m.tombstones_purged_at,
        },
        "revert": {
            "planned": m.revert_planned_at.is_some(),
            "partitions": revert.partitions,
            "partitions_done": revert.done,
            "documents_scanned": revert.scanned,
            "documents_written_back": revert.inserted,
            "documents_already_in_source": revert.already_present,
        },
        "bypasses": {
            "open": bypasses.open,
            "total": bypasses.total,
            "watches": bypasses.watches.iter().map(|w| json!({
                "location": w.location().to_string(),
                "role": w.role,
                "switched": w.switched,
                "events_seen": w.events_seen,
                "caught_up_at": w.caught_up_at,
            })).collect::<Vec<_>>(),
        },
        "shadow_reads": {
            "percent": settings.shadow_read_percent,
            "reads_compared": shadow.compared,
            "mismatches": shadow.mismatches,
            "open_mismatches": shadow.open,
            "resolved_mismatches": shadow.resolved,
            "open": open_mismatches,
        },
        "workers": live,
        "active_task": active_task(m.phase()),
        "tasks": tasks,
        "routers": routers,
        "findings_open": findings_open,
    });
    Ok((
        Snapshot {
            value,
            shards,
            totals,
            phase: m.phase(),
            docs_per_sec,
            eta,
        },
        partitions,
        workers,
    ))
}

pub async fn run(ctx: &Ctx, id: i64, watch: bool, with_partitions: bool) -> Result<()> {
    if watch {
        return watch_progress(ctx, id).await;
    }
    let (snap, partitions, workers) = snapshot(ctx, id).await?;
    let mut value = snap.value.clone();
    if with_partitions || matches!(ctx.output, crate::cli::OutputFormat::Json) {
        value["partitions"] = serde_json::to_value(&partitions).unwrap_or_default();
    }
    output::emit(ctx.output, &value, || {
        print_text(&snap, &workers);
        if with_partitions {
            print_partitions(&partitions);
        }
    })
}

/// The task whose workers the phase runs, if any.
fn active_task(phase: Phase) -> Option<&'static str> {
    match phase {
        Phase::Backfill => Some("backfill"),
        Phase::Reconcile => Some("verify"),
        Phase::Cleanup => Some("cleanup"),
        Phase::Reverting => Some("revert"),
        _ => None,
    }
}

/// The `verify` partitions of the latest full reconciliation run.
async fn latest_full_run_partitions(ctx: &Ctx, id: i64) -> Result<Vec<Partition>> {
    let runs = ctx.store.reconciliation_runs(id).await?;
    match runs
        .iter()
        .filter(|r| r.mode == "full")
        .max_by_key(|r| r.id)
    {
        Some(run) => Ok(ctx.store.verify_partitions(run.id).await?),
        None => Ok(Vec::new()),
    }
}

/// Findings of the latest finished reconciliation run, when it did not pass.
async fn open_findings(ctx: &Ctx, id: i64) -> Result<usize> {
    let runs = ctx.store.reconciliation_runs(id).await?;
    match runs
        .iter()
        .filter(|r| r.finished_at.is_some())
        .max_by_key(|r| r.id)
    {
        Some(run) if run.passed != Some(true) => Ok(ctx.store.findings(run.id).await?.len()),
        _ => Ok(0),
    }
}

/// One task's progress: totals and, per source location, what is left (its lag).
fn task_progress(partitions: &[Partition]) -> serde_json::Value {
    let mut per: BTreeMap<String, (i64, i64, i64, i64)> = BTreeMap::new();
    for p in partitions {
        let e = per
            .entry(format!("{}/{}", p.source_shard, p.source_collection))
            .or_default();
        e.0 += 1;
        e.1 += i64::from(p.state == PartitionState::Done);
        e.2 += p.scanned;
        e.3 += p.approx_documents.unwrap_or(0);
    }
    let shards: Vec<serde_json::Value> = per
        .iter()
        .map(|(location, (n, done, scanned, approx))| {
            json!({
                "location": location,
                "partitions": n,
                "partitions_done": done,
                "documents_scanned": scanned,
                "approx_documents": approx.max(scanned),
                "documents_left": if done == n { 0 } else { (approx - scanned).max(0) },
            })
        })
        .collect();
    let sum = |f: fn(&(i64, i64, i64, i64)) -> i64| per.values().map(f).sum::<i64>();
    json!({
        "partitions": sum(|e| e.0),
        "partitions_done": sum(|e| e.1),
        "documents_scanned": sum(|e| e.2),
        "approx_documents": sum(|e| e.3.max(e.2)),
        "shards": shards,
    })
}

/// `2 open of 3 (5 locations watched, caught up 4 s ago)`, or why nothing is watched.
fn bypass_text(b: &serde_json::Value) -> String {
    let watches = b["watches"].as_array().map(Vec::len).unwrap_or(0);
    if watches == 0 {
        return "not watched (the driver starts watching when it leaves `planned`)".into();
    }
    let oldest = b["watches"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|w| {
            w["caught_up_at"]
                .as_str()
                .and_then(|t| chrono::DateTime::parse_from_rfc3339(t).ok())
        })
        .min();
    let caught_up = match oldest {
        Some(Some(t)) => {
            let ago = (chrono::Utc::now() - t.with_timezone(&chrono::Utc))
                .num_seconds()
                .max(0);
            format!("caught up {ago} s ago")
        }
        _ => "not caught up yet".into(),
    };
    format!(
        "{} open of {} ({watches} locations watched, {caught_up})",
        b["open"], b["total"]
    )
}

fn eta_text(eta: Option<f64>) -> String {
    match eta {
        Some(s) if s <= 0.0 => "done".into(),
        Some(s) => humantime(Duration::from_secs_f64(s)),
        None => "-".into(),
    }
}

/// A rate as shown: never negative (a rate computed over a window can come out as -0).
fn not_negative(rate: f64) -> f64 {
    if rate > 0.0 {
        rate
    } else {
        0.0
    }
}

fn humantime(d: Duration) -> String {
    let s = d.as_secs();
    match s {
        0..=59 => format!("{s}s"),
        60..=3599 => format!("{}m{:02}s", s / 60, s % 60),
        _ => format!("{}h{:02}m", s / 3600, (s % 3600) / 60),
    }
}

fn print_text(snap: &Snapshot, workers: &[WorkerRow]) {
    let v = &snap.value;
    let b = &v["backfill"];
    let t = &v["throttle"];
    let pct = if snap.totals.approx_documents > 0 {
        format!(
            " ({:.1}% of ~{})",
            100.0 * snap.totals.scanned as f64 / snap.totals.approx_documents as f64,
            snap.totals.approx_documents
        )
    } else {
        String::new()
    };
    output::fields(&[
        (
            "migration",
            format!(
                "{} ({} v{} -> v{})",
                v["migration"],
                v["collection"].as_str().unwrap_or(""),
                v["from_version"],
                v["to_version"]
            ),
        ),
        ("state", v["state"].as_str().unwrap_or("").to_owned()),
        ("epoch", v["epoch"].to_string()),
        (
            "partitions",
            if b["planned"].as_bool() == Some(true) {
                format!(
                    "{} done, {} leased, of {}",
                    snap.totals.done, snap.totals.leased, snap.totals.partitions
                )
            } else {
                match v["phase"].as_str().unwrap_or("") {
                    "planned" | "dual_read" | "write_switch" | "new_writes" | "backfill" => {
                        "not planned yet (a worker plans when the migration is in backfill)".into()
                    }
                    _ => "none (no backfill was planned in this migration)".into(),
                }
            },
        ),
        ("scanned", format!("{}{pct}", snap.totals.scanned)),
        (
            "copied / present / stamped / dead",
            format!(
                "{} / {} / {} / {}",
                snap.totals.inserted,
                snap.totals.already_present,
                snap.totals.stamped,
                snap.totals.dead_lettered
            ),
        ),
        ("open dead letters", b["dead_letters_open"].to_string()),
        ("docs/s", format!("{:.0}", not_negative(snap.docs_per_sec))),
        ("eta", eta_text(snap.eta)),
        (
            "rate (applied / configured)",
            format!(
                "{:.0} / {:.0} docs/s",
                not_negative(t["applied_docs_per_sec"].as_f64().unwrap_or(0.0)),
                t["configured_docs_per_sec"].as_f64().unwrap_or(0.0)
            ),
        ),
        (
            "overloads / retries / rate cuts",
            format!("{} / {} / {}", t["overloads"], t["retries"], t["rate_cuts"]),
        ),
        ("capacity signals", t["capacity_signals"].to_string()),
        ("bypasses", bypass_text(&v["bypasses"])),
    ]);
    let sh = &v["shadow_reads"];
    let compared = sh["reads_compared"].as_i64().unwrap_or(0);
    let percent = sh["percent"].as_f64().unwrap_or(0.0);
    if percent > 0.0 || compared > 0 || sh["open_mismatches"].as_i64().unwrap_or(0) > 0 {
        output::fields(&[(
            "shadow reads",
            format!(
                "{percent}% of reads; {compared} compared, {} mismatches ({} documents open, {} \
                 resolved)",
                sh["mismatches"], sh["open_mismatches"], sh["resolved_mismatches"]
            ),
        )]);
    }
    if let Some(open) = sh["open"].as_array().filter(|o| !o.is_empty()) {
        output::table(
            &[
                "shadow mismatch _id",
                "source",
                "target",
                "fields",
                "reads",
                "last seen",
            ],
            open.iter().map(|m| {
                [
                    m["_id"].as_str().unwrap_or("").to_owned(),
                    m["source_location"].as_str().unwrap_or("").to_owned(),
                    m["target_location"].as_str().unwrap_or("").to_owned(),
                    m["fields"]
                        .as_array()
                        .map(|f| {
                            f.iter()
                                .filter_map(|x| x.as_str())
                                .collect::<Vec<_>>()
                                .join(", ")
                        })
                        .unwrap_or_default(),
                    m["reports"].to_string(),
                    m["last_seen_at"].as_str().unwrap_or("").to_owned(),
                ]
            }),
        );
    }
    let c = &v["cleanup"];
    if c["partitions"].as_i64().unwrap_or(0) > 0 {
        output::fields(&[(
            "cleanup",
            format!(
                "{}/{} partitions, {} deleted, {} kept (never moved)",
                c["partitions_done"], c["partitions"], c["documents_deleted"], c["documents_kept"]
            ),
        )]);
    }
    let r = &v["revert"];
    if r["partitions"].as_i64().unwrap_or(0) > 0 {
        output::fields(&[(
            "revert copy",
            format!(
                "{}/{} partitions, {} written back, {} already in the source",
                r["partitions_done"],
                r["partitions"],
                r["documents_written_back"],
                r["documents_already_in_source"]
            ),
        )]);
    }
    if !snap.shards.is_empty() {
        output::table(
            &[
                "source",
                "scan",
                "partitions",
                "scanned",
                "~total",
                "copied",
                "present",
                "stamped",
                "dead",
            ],
            snap.shards.iter().map(|s| {
                [
                    format!("{}/{}", s.source_shard, s.source_collection),
                    s.scan.clone(),
                    format!("{}/{}", s.partitions_done, s.partitions),
                    s.documents_scanned.to_string(),
                    s.approx_documents_to_copy.to_string(),
                    s.documents_copied.to_string(),
                    s.documents_already_present.to_string(),
                    s.documents_stamped.to_string(),
                    s.documents_dead_lettered.to_string(),
                ]
            }),
        );
    }
    let live: Vec<_> = workers.iter().filter(|w| w.live).collect();
    if !live.is_empty() {
        output::table(
            &[
                "worker",
                "host",
                "pid",
                "docs/s",
                "applied docs/s",
                "overloads",
                "retries",
            ],
            live.iter().map(|w| {
                [
                    w.name.clone(),
                    w.host.clone(),
                    w.pid.to_string(),
                    format!("{:.0}", w.docs_per_sec),
                    format!("{:.0}", w.applied_docs_per_sec),
                    w.overloads.to_string(),
                    w.retries.to_string(),
                ]
            }),
        );
    }
}

fn print_partitions(partitions: &[Partition]) {
    output::table(
        &[
            "id", "source", "_id type", "state", "owner", "scanned", "copied", "present",
            "stamped", "dead", "attempts",
        ],
        partitions.iter().map(|p| {
            [
                p.id.to_string(),
                format!("{}/{}", p.source_shard, p.source_collection),
                p.id_type.clone(),
                format!("{:?}", p.state).to_lowercase(),
                output::or_dash(p.lease_owner.clone()),
                p.scanned.to_string(),
                p.inserted.to_string(),
                p.already_present.to_string(),
                p.stamped.to_string(),
                p.dead_lettered.to_string(),
                p.attempts.to_string(),
            ]
        }),
    );
}

/// The one status screen, refreshed every second until the migration ends (or Ctrl-C): bars
/// for the task the phase runs (backfill, full reconciliation, cleanup waves, revert) per
/// source location and overall, with docs/s and ETA; below them the throttle, routers, dead
/// letters, findings and bypasses. With `--output json`: one JSON object per refresh, one
/// per line (NDJSON), the same object `status --output json` prints.
async fn watch_progress(ctx: &Ctx, id: i64) -> Result<()> {
    if matches!(ctx.output, crate::cli::OutputFormat::Json) {
        loop {
            let (snap, _, _) = snapshot(ctx, id).await?;
            {
                use std::io::Write;
                let mut out = std::io::stdout().lock();
                let line =
                    serde_json::to_string(&snap.value).map_err(|e| Error::failed(e.to_string()))?;
                if writeln!(out, "{line}").and_then(|_| out.flush()).is_err() {
                    // The reader went away (a closed pipe): nothing more to say.
                    return Ok(());
                }
            }
            if snap.phase.is_terminal() {
                return Ok(());
            }
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                _ = tokio::signal::ctrl_c() => return Ok(()),
            }
        }
    }
    let multi = MultiProgress::new();
    let style = ProgressStyle::with_template("{prefix:>28} [{bar:36}] {pos}/{len} {msg}")
        .map_err(|e| Error::failed(e.to_string()))?
        .progress_chars("=> ");
    let overall = multi.add(ProgressBar::new(0).with_style(style.clone()));
    let facts = multi.add(ProgressBar::new_spinner());
    let mut bars: BTreeMap<String, ProgressBar> = BTreeMap::new();
    let mut shown_task: Option<String> = None;
    let mut last: Option<(Instant, i64)> = None;
    loop {
        let (snap, _, _) = snapshot(ctx, id).await?;
        let v = &snap.value;
        let task = v["active_task"]
            .as_str()
            .map(str::to_owned)
            .or_else(|| shown_task.clone())
            .unwrap_or_else(|| "backfill".to_owned());
        let task = task.as_str();
        if shown_task.as_deref() != Some(task) {
            // A new task: new bars.
            for bar in std::mem::take(&mut bars).into_values() {
                bar.finish_and_clear();
                multi.remove(&bar);
            }
            overall.reset();
            shown_task = Some(task.to_owned());
            last = None;
        }
        let t = &v["tasks"][task];
        let scanned = t["documents_scanned"].as_i64().unwrap_or(0);
        let total = t["approx_documents"].as_i64().unwrap_or(0).max(scanned);
        // docs/s from what the task checkpointed since the last refresh (every task), or the
        // workers' reports for the backfill.
        let now = Instant::now();
        let rate = match last {
            Some((at, before)) if task != "backfill" => {
                (scanned - before).max(0) as f64 / now.duration_since(at).as_secs_f64().max(0.1)
            }
            _ => not_negative(snap.docs_per_sec),
        };
        last = Some((now, scanned));
        let eta = if rate > 0.5 {
            Some((total - scanned).max(0) as f64 / rate)
        } else {
            None
        };
        overall.set_prefix(format!("{task} (all)"));
        overall.set_length(total as u64);
        overall.set_position(scanned as u64);
        overall.set_message(format!(
            "{:.0} docs/s, eta {}, {}/{} partitions, {}",
            rate,
            eta_text(eta),
            t["partitions_done"],
            t["partitions"],
            v["state"].as_str().unwrap_or("")
        ));
        for shard in t["shards"].as_array().into_iter().flatten() {
            let key = shard["location"].as_str().unwrap_or("").to_owned();
            let bar = bars.entry(key.clone()).or_insert_with(|| {
                multi.insert_before(
                    &facts,
                    ProgressBar::new(0)
                        .with_style(style.clone())
                        .with_prefix(key),
                )
            });
            let done = shard["documents_scanned"].as_i64().unwrap_or(0);
            bar.set_length(shard["approx_documents"].as_i64().unwrap_or(0).max(done) as u64);
            bar.set_position(done as u64);
            bar.set_message(format!(
                "{}/{} partitions, {} left",
                shard["partitions_done"], shard["partitions"], shard["documents_left"]
            ));
        }
        facts.set_message(facts_line(v));
        facts.tick();
        if snap.phase.is_terminal() {
            overall.finish();
            for bar in bars.values() {
                bar.finish();
            }
            facts.finish();
            return Ok(());
        }
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_secs(1)) => {}
            _ = tokio::signal::ctrl_c() => return Ok(()),
        }
    }
}

/// The line under the bars: throttle, routers, dead letters, findings, bypasses.
fn facts_line(v: &serde_json::Value) -> String {
    let t = &v["throttle"];
    let routers = v["routers"].as_array().cloned().unwrap_or_default();
    let epoch = v["epoch"].as_i64();
    let behind = routers
        .iter()
        .filter(|r| r["acknowledged_epoch"].as_i64() != epoch)
        .count();
    let p99 = routers
        .iter()
        .filter_map(|r| r["p99_ms"].as_f64())
        .fold(None, |m: Option<f64>, x| Some(m.map_or(x, |m| m.max(x))));
    format!(
        "rate {:.0}/{:.0} docs/s | routers {} ({} behind epoch {}), p99 {} | dead letters {} | findings {} | bypasses {}",
        not_negative(t["applied_docs_per_sec"].as_f64().unwrap_or(0.0)),
        t["configured_docs_per_sec"].as_f64().unwrap_or(0.0),
        routers.len(),
        behind,
        v["epoch"],
        p99.map_or("-".to_owned(), |p| format!("{p:.1} ms")),
        v["backfill"]["dead_letters_open"],
        v["findings_open"],
        v["bypasses"]["open"],
    )
}

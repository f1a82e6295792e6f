//! `reshard migration status`: where a migration stands and how fast it moves: the phase, the
//! task its workers run (backfill, full reconciliation, cleanup waves, revert) with its
//! progress, rate and ETA, the throttle, routers (acknowledged epoch, lease, p99), and what is
//! open (findings, dead letters, bypasses, shadow-read mismatches); once, or refreshed every
//! second with `--watch`.
//!
//! A partition's size is the planner's estimate (`approx_documents`), which may be missing (a
//! revert's partitions, or an estimate not made yet): a task whose total is not known shows
//! what is done and the rate, and no ETA, until it is.
//!
//! The JSON output's keys are snake_case with units in their names, one name per concept:
//! what MongoDB's `$currentOp` calls `approxDocumentsToCopy`, `documentsCopied` and
//! `remainingOperationTimeEstimatedSecs` are `approx_documents`, `documents_copied` and
//! `eta_secs` here, as in `progress` (`tests/vocabulary.rs`).

use std::collections::BTreeMap;
use std::io::IsTerminal;
use std::time::{Duration, Instant};

use indicatif::{MultiProgress, ProgressBar, ProgressStyle};
use serde::Serialize;
use serde_json::json;

use crate::commands::Ctx;
use crate::error::{Error, Result};
use crate::estimate::{PartitionSize, TaskSize};
use crate::output::{self, not_negative};
use crate::phase::Phase;
use crate::settings::MigrationSettings;
use crate::store::events::EventKind;
use crate::store::partitions::{
    wave_bound, Partition, PartitionState, Task, TaskTotals, STALLED_AFTER,
};
use crate::store::routers::RouterRow;
use crate::store::workers::WorkerRow;

/// At most this many open shadow-read mismatches are listed.
const SHOWN_MISMATCHES: usize = 20;

/// Per source location, summed over its partitions.
#[derive(Clone, Debug, Default, Serialize)]
struct ShardProgress {
    source_shard: String,
    source_collection: String,
    partitions: i64,
    partitions_done: i64,
    scan: String,
    approx_documents: Option<i64>,
    documents_scanned: i64,
    documents_copied: i64,
    documents_already_present: i64,
    documents_stamped: i64,
    documents_dead_lettered: i64,
}

/// What the estimate needs of a partition.
fn part_size(p: &Partition) -> PartitionSize {
    PartitionSize {
        done: p.state == PartitionState::Done,
        scanned: p.scanned,
        approx: p.approx_documents,
    }
}

fn size_of(parts: impl IntoIterator<Item = PartitionSize>) -> TaskSize {
    TaskSize::of(parts)
}

/// A task's size as status prints it.
fn size_json(size: &TaskSize) -> serde_json::Value {
    json!({
        "partitions": size.partitions,
        "partitions_done": size.done,
        "documents_scanned": size.scanned,
        "approx_documents": size.total,
        "documents_left": size.left(),
    })
}

/// Which cleanup wave is open, by the rule that limits the claims (`wave_bound`): the first
/// wave whose last partition is the claims' bound now.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Wave {
    /// 1-based.
    number: usize,
    of: usize,
    percent: f64,
    /// Every partition is done.
    done: bool,
}

/// `rows`: each cleanup partition's `(id, done)`, in id order.
fn open_wave(rows: &[(i64, bool)], waves: [f64; 3]) -> Option<Wave> {
    let bound = wave_bound(rows, waves)?;
    let pending: Vec<(i64, bool)> = rows.iter().map(|(id, _)| (*id, false)).collect();
    let number = waves
        .iter()
        .position(|w| wave_bound(&pending, [*w; 3]) == Some(bound))
        .unwrap_or(waves.len() - 1);
    Some(Wave {
        number: number + 1,
        of: waves.len(),
        percent: waves[number],
        done: rows.iter().all(|(_, done)| *done),
    })
}

impl Wave {
    fn text(&self) -> String {
        if self.done {
            format!("all {} waves done", self.of)
        } else {
            format!("wave {} of {} ({}%)", self.number, self.of, self.percent)
        }
    }
}

struct Snapshot {
    value: serde_json::Value,
    shards: Vec<ShardProgress>,
    totals: TaskTotals,
    /// The backfill's size.
    backfill: TaskSize,
    phase: Phase,
    /// What the live workers report, documents per second.
    docs_per_sec: f64,
    /// The task the phase runs, its size.
    active: Option<(&'static str, TaskSize)>,
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
        s.documents_scanned += p.scanned;
        s.documents_copied += p.inserted;
        s.documents_already_present += p.already_present;
        s.documents_stamped += p.stamped;
        s.documents_dead_lettered += p.dead_lettered;
    }
    for s in shards.values_mut() {
        s.approx_documents = size_of(
            partitions
                .iter()
                .filter(|p| {
                    p.source_shard == s.source_shard && p.source_collection == s.source_collection
                })
                .map(part_size),
        )
        .total;
    }
    let shards: Vec<ShardProgress> = shards.into_values().collect();
    let live: Vec<&WorkerRow> = workers.iter().filter(|w| w.live).collect();
    let docs_per_sec = not_negative(live.iter().map(|w| w.docs_per_sec).sum());
    let applied = not_negative(live.iter().map(|w| w.applied_docs_per_sec).sum());
    let sum = |f: fn(&WorkerRow) -> i64| workers.iter().map(f).sum::<i64>();
    let active_name = active_task(m.phase());
    let backfill = size_of(partitions.iter().map(part_size));
    // The workers' rate is the active task's: a finished backfill's ETA is 0, an idle one's
    // unknown.
    let backfill_eta = backfill.eta(if active_name == Some("backfill") {
        docs_per_sec
    } else {
        0.0
    });
    let cleanup_partitions = ctx.store.partitions(id, Task::Cleanup).await?;
    let mut wave_rows: Vec<(i64, bool)> = cleanup_partitions
        .iter()
        .map(|p| (p.id, p.state == PartitionState::Done))
        .collect();
    wave_rows.sort_unstable();
    let wave = open_wave(&wave_rows, settings.cleanup_waves);
    let mut tasks = serde_json::Map::new();
    let mut active = None;
    let mut stalled = Vec::new();
    for (name, task_partitions) in [
        ("backfill", partitions.clone()),
        ("verify", latest_full_run_partitions(ctx, id).await?),
        ("cleanup", cleanup_partitions),
        ("revert", ctx.store.partitions(id, Task::Revert).await?),
    ] {
        if active_name == Some(name) {
            active = Some((name, size_of(task_partitions.iter().map(part_size))));
        }
        tasks.insert(name.to_owned(), task_progress(&task_partitions));
        stalled.extend(
            task_partitions
                .iter()
                .filter(|p| p.state != PartitionState::Done && p.stalls >= STALLED_AFTER)
                .map(|p| {
                    json!({
                        "task": name,
                        "partition": p.id,
                        "location": format!("{}/{}", p.source_shard, p.source_collection),
                        "stalls": p.stalls,
                        "attempts": p.attempts,
                        "timeouts": p.timeouts,
                        "batch_limit": p.batch_limit,
                        "last_failure": p.last_failure,
                    })
                }),
        );
    }
    let progress = active.map(|(task, size)| {
        let mut p = size_json(&size);
        p["task"] = json!(task);
        p["docs_per_sec"] = json!(docs_per_sec);
        p["eta_secs"] = json!(size.eta(docs_per_sec).map(|s| s.round() as i64));
        p
    });
    let routers: Vec<serde_json::Value> = ctx
        .store
        .routers(Some(&m.collection))
        .await?
        .iter()
        .map(|r| router_json(r, m.epoch))
        .collect();
    let findings_open = open_findings(ctx, id).await?;
    let value = json!({
        "migration_id": m.id,
        "collection": m.collection,
        "phase": m.phase().as_str(),
        "state": m.status_text(),
        "epoch": m.epoch,
        "paused": m.paused,
        "failure_reason": m.failure_reason,
        "from_version": m.from_version,
        "to_version": m.to_version,
        "backfill": {
            "planned": m.backfill_planned_at.is_some(),
            "planned_at": m.backfill_planned_at,
            "completed_at": m.backfill_completed_at,
            "partitions": totals.partitions,
            "partitions_done": totals.done,
            "partitions_leased": totals.leased,
            "approx_documents": backfill.total,
            "documents_scanned": totals.scanned,
            "documents_copied": totals.inserted,
            "documents_already_present": totals.already_present,
            "documents_stamped": totals.stamped,
            "documents_dead_lettered": totals.dead_lettered,
            "documents_skipped_foreign": totals.skipped_foreign,
            "dead_letters_open": open_dead_letters,
            "docs_per_sec": docs_per_sec,
            "eta_secs": backfill_eta.map(|s| s.round() as i64),
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
            "waves": settings.cleanup_waves,
            "wave": wave.map(|w| json!({
                "number": w.number,
                "of": w.of,
                "percent": w.percent,
                "done": w.done,
            })),
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
        "active_task": active_name,
        "progress": progress,
        "tasks": tasks,
        "routers": routers,
        "findings_open": findings_open,
        "stalled_partitions": stalled,
    });
    Ok((
        Snapshot {
            value: crate::vocabulary::with_old_names(value),
            shards,
            totals,
            backfill,
            phase: m.phase(),
            docs_per_sec,
            active,
        },
        partitions,
        workers,
    ))
}

/// A router as status shows it: its epoch against the migration's, its lease, its p99.
fn router_json(r: &RouterRow, epoch: i64) -> serde_json::Value {
    json!({
        "name": r.name,
        "kind": r.kind,
        "host": r.host,
        "pid": r.pid,
        "live": r.live,
        "acknowledged_epoch": r.acked_epoch,
        "behind": r.acked_epoch != Some(epoch),
        "lease_expires_at": r.lease_expires_at,
        "lease_left_secs": r.lease_left_secs,
        "lease_age_secs": r.lease_age_secs,
        "p99_ms": r.stats["all"]["p99_ms"],
        "errors": r.stats["all"]["errors"],
    })
}

/// What `migration status --output json` prints of migration `id` (without its partitions):
/// what the exporter reads its gauges from.
pub(super) async fn value(ctx: &Ctx, id: i64) -> Result<serde_json::Value> {
    Ok(snapshot(ctx, id).await?.0.value)
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

/// One task's progress: totals and, per source location, what is left (its lag; unknown
/// while a running partition has no size).
fn task_progress(partitions: &[Partition]) -> serde_json::Value {
    let mut per: BTreeMap<String, Vec<PartitionSize>> = BTreeMap::new();
    for p in partitions {
        per.entry(format!("{}/{}", p.source_shard, p.source_collection))
            .or_default()
            .push(part_size(p));
    }
    let shards: Vec<serde_json::Value> = per
        .iter()
        .map(|(location, parts)| {
            let mut v = size_json(&size_of(parts.iter().copied()));
            v["location"] = json!(location);
            v
        })
        .collect();
    let mut v = size_json(&size_of(partitions.iter().map(part_size)));
    v["shards"] = json!(shards);
    v
}

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

/// The ETA of a task of `size` at `rate`, as shown: unknown when its total is.
fn eta_of(size: &TaskSize, rate: f64) -> String {
    match (size.total, size.eta(rate)) {
        (None, None) => "- (total unknown)".into(),
        (_, eta) => eta_text(eta),
    }
}

/// `1234 of ~5000 (24.7%)`, or `1234 (total unknown)`.
fn scanned_text(size: &TaskSize) -> String {
    match size.total {
        Some(total) if total > 0 => format!(
            "{} of ~{total} ({:.1}%)",
            size.scanned,
            100.0 * size.scanned as f64 / total as f64
        ),
        Some(_) => size.scanned.to_string(),
        None => format!("{} (total unknown)", size.scanned),
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

/// `in 9m58s` for a lease that runs, `expired 3s ago` for one that ran out.
fn lease_text(left_secs: f64) -> String {
    if left_secs >= 0.0 {
        format!("in {}", humantime(Duration::from_secs_f64(left_secs)))
    } else {
        format!(
            "expired {} ago",
            humantime(Duration::from_secs_f64(-left_secs))
        )
    }
}

/// `2 live (1 behind epoch 7, heartbeats within 1.2s), 1 lease expired`: the routers and
/// their leases in a phrase.
fn routers_text(v: &serde_json::Value) -> String {
    let routers = v["routers"].as_array().cloned().unwrap_or_default();
    let live: Vec<&serde_json::Value> = routers.iter().filter(|r| r["live"] == true).collect();
    let behind = live.iter().filter(|r| r["behind"] == true).count();
    let expired = routers.len() - live.len();
    let oldest = live
        .iter()
        .filter_map(|r| r["lease_age_secs"].as_f64())
        .fold(None, |m: Option<f64>, x| Some(m.map_or(x, |m| m.max(x))));
    let mut text = format!("{} live", live.len());
    if !live.is_empty() {
        text.push_str(&format!(
            " ({behind} behind epoch {}, heartbeats within {:.1}s)",
            v["epoch"],
            oldest.unwrap_or(0.0)
        ));
    }
    if expired > 0 {
        text.push_str(&format!(", {expired} with an expired lease"));
    }
    text
}

/// The worst p99 the live routers reported.
fn worst_p99(v: &serde_json::Value) -> Option<f64> {
    v["routers"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|r| r["live"] == true)
        .filter_map(|r| r["p99_ms"].as_f64())
        .fold(None, |m: Option<f64>, x| Some(m.map_or(x, |m| m.max(x))))
}

fn print_text(snap: &Snapshot, workers: &[WorkerRow]) {
    let v = &snap.value;
    let b = &v["backfill"];
    let t = &v["throttle"];
    let mut fields = vec![
        (
            "migration",
            format!(
                "{} ({} v{} -> v{})",
                v["migration_id"],
                v["collection"].as_str().unwrap_or(""),
                v["from_version"],
                v["to_version"]
            ),
        ),
        ("state", v["state"].as_str().unwrap_or("").to_owned()),
        ("epoch", v["epoch"].to_string()),
    ];
    if let Some((task, size)) = &snap.active {
        fields.push((
            "task",
            format!(
                "{task}: {} documents, {}/{} partitions",
                scanned_text(size),
                size.done,
                size.partitions
            ),
        ));
        fields.push(("docs/s", format!("{:.0}", snap.docs_per_sec)));
        fields.push(("eta", eta_of(size, snap.docs_per_sec)));
    }
    fields.extend([
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
        ("scanned", scanned_text(&snap.backfill)),
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
        (
            "open findings / dead letters / bypasses",
            format!(
                "{} / {} / {}",
                v["findings_open"], b["dead_letters_open"], v["bypasses"]["open"]
            ),
        ),
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
        (
            "routers",
            format!(
                "{}{}",
                routers_text(v),
                worst_p99(v).map_or(String::new(), |p| format!(", worst p99 {p:.1} ms"))
            ),
        ),
    ]);
    for p in v["stalled_partitions"].as_array().into_iter().flatten() {
        fields.push((
            "stalled",
            format!(
                "partition {} ({} at {}): {} attempts in a row recorded nothing ({} timed out, \
                 batches of at most {}); last: {}",
                p["partition"],
                p["task"].as_str().unwrap_or(""),
                p["location"].as_str().unwrap_or(""),
                p["stalls"],
                p["timeouts"],
                p["batch_limit"]
                    .as_i64()
                    .map_or("the configured size".to_owned(), |l| l.to_string()),
                p["last_failure"]
                    .as_str()
                    .unwrap_or("its holder's lease ran out"),
            ),
        ));
    }
    output::fields(&fields);
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
        let wave = c["wave"]
            .as_object()
            .map(|w| {
                let wave = Wave {
                    number: w["number"].as_u64().unwrap_or(0) as usize,
                    of: w["of"].as_u64().unwrap_or(0) as usize,
                    percent: w["percent"].as_f64().unwrap_or(0.0),
                    done: w["done"] == true,
                };
                format!("{}: ", wave.text())
            })
            .unwrap_or_default();
        output::fields(&[(
            "cleanup",
            format!(
                "{wave}{}/{} partitions, {} deleted, {} kept (never moved)",
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
                    output::or_dash(s.approx_documents),
                    s.documents_copied.to_string(),
                    s.documents_already_present.to_string(),
                    s.documents_stamped.to_string(),
                    s.documents_dead_lettered.to_string(),
                ]
            }),
        );
    }
    if let Some(routers) = v["routers"].as_array().filter(|r| !r.is_empty()) {
        output::table(
            &[
                "router", "host", "pid", "epoch", "lease", "p99 ms", "errors",
            ],
            routers.iter().map(|r| {
                [
                    r["name"].as_str().unwrap_or("").to_owned(),
                    r["host"].as_str().unwrap_or("").to_owned(),
                    r["pid"].to_string(),
                    match r["acknowledged_epoch"].as_i64() {
                        Some(e) if r["behind"] == false => format!("{e} (current)"),
                        Some(e) => format!("{e} (behind {})", v["epoch"]),
                        None => format!("- (behind {})", v["epoch"]),
                    },
                    lease_text(r["lease_left_secs"].as_f64().unwrap_or(0.0)),
                    r["p99_ms"]
                        .as_f64()
                        .map_or_else(|| "-".to_owned(), |p| format!("{p:.1}")),
                    r["errors"]
                        .as_u64()
                        .map_or_else(|| "-".to_owned(), |e| e.to_string()),
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
                    format!("{:.0}", not_negative(w.docs_per_sec)),
                    format!("{:.0}", not_negative(w.applied_docs_per_sec)),
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

/// What the watch follows from one refresh to the next: the task shown and its rate.
#[derive(Default)]
struct Follow {
    task: Option<String>,
    last: Option<(Instant, i64)>,
}

/// One refresh of the watch: the task the phase runs (or the last one shown), its size and
/// its rate.
struct Refresh {
    task: String,
    /// Whether the task changed since the last refresh (new bars).
    new_task: bool,
    size: TaskSize,
    rate: f64,
}

impl Follow {
    fn refresh(&mut self, snap: &Snapshot) -> Refresh {
        let v = &snap.value;
        let task = v["active_task"]
            .as_str()
            .map(str::to_owned)
            .or_else(|| self.task.clone())
            .unwrap_or_else(|| "backfill".to_owned());
        let new_task = self.task.as_deref() != Some(task.as_str());
        if new_task {
            self.task = Some(task.clone());
            self.last = None;
        }
        let t = &v["tasks"][task.as_str()];
        let size = TaskSize {
            partitions: t["partitions"].as_i64().unwrap_or(0),
            done: t["partitions_done"].as_i64().unwrap_or(0),
            scanned: t["documents_scanned"].as_i64().unwrap_or(0),
            total: t["approx_documents"].as_i64(),
        };
        // docs/s from what the task checkpointed since the last refresh (every task), or the
        // workers' reports for the backfill.
        let now = Instant::now();
        let rate = match self.last {
            Some((at, before)) if task != "backfill" => {
                (size.scanned - before).max(0) as f64
                    / now.duration_since(at).as_secs_f64().max(0.1)
            }
            _ => snap.docs_per_sec,
        };
        self.last = Some((now, size.scanned));
        Refresh {
            task,
            new_task,
            size,
            rate,
        }
    }
}

/// The one status screen, refreshed every second until the migration ends (or Ctrl-C): bars
/// for the task the phase runs (backfill, full reconciliation, cleanup waves, revert) per
/// source location and overall, with docs/s and ETA; below them the throttle, routers, dead
/// letters, findings and bypasses. Without a terminal, a plain line per refresh. With
/// `--output json`: one JSON object per refresh, one per line (NDJSON), the same object
/// `status --output json` prints.
async fn watch_progress(ctx: &Ctx, id: i64) -> Result<()> {
    if matches!(ctx.output, crate::cli::OutputFormat::Json) {
        return watch_lines(ctx, id, |snap, _| output::json_line(&snap.value)).await;
    }
    if !std::io::stdout().is_terminal() {
        // Bars need a terminal; a log or a pipe gets what they would show, a line at a time.
        return watch_lines(ctx, id, |snap, r| Ok(plain_line(snap, r))).await;
    }
    let multi = MultiProgress::new();
    let style = ProgressStyle::with_template("{prefix:>28} [{bar:36}] {pos}/{len} {msg}")
        .map_err(|e| Error::failed(e.to_string()))?
        .progress_chars("=> ");
    // Without a total there is no bar to fill: the documents done and the rest of the line.
    let no_total = ProgressStyle::with_template("{prefix:>28} {pos} documents {msg}")
        .map_err(|e| Error::failed(e.to_string()))?;
    let overall = multi.add(ProgressBar::new(0).with_style(style.clone()));
    let facts = multi.add(ProgressBar::new_spinner());
    let mut bars: BTreeMap<String, ProgressBar> = BTreeMap::new();
    let mut follow = Follow::default();
    loop {
        let (snap, _, _) = snapshot(ctx, id).await?;
        let v = &snap.value;
        let r = follow.refresh(&snap);
        if r.new_task {
            for bar in std::mem::take(&mut bars).into_values() {
                bar.finish_and_clear();
                multi.remove(&bar);
            }
            overall.reset();
        }
        let t = &v["tasks"][r.task.as_str()];
        let shape = |bar: &ProgressBar, size: &TaskSize| match size.total {
            Some(total) => {
                bar.set_style(style.clone());
                bar.set_length(total.max(size.scanned) as u64);
            }
            None => bar.set_style(no_total.clone()),
        };
        overall.set_prefix(format!("{} (all)", r.task));
        shape(&overall, &r.size);
        overall.set_position(r.size.scanned as u64);
        overall.set_message(format!(
            "{:.0} docs/s, eta {}, {}/{} partitions, {}",
            r.rate,
            eta_of(&r.size, r.rate),
            r.size.done,
            r.size.partitions,
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
            let size = TaskSize {
                partitions: shard["partitions"].as_i64().unwrap_or(0),
                done: shard["partitions_done"].as_i64().unwrap_or(0),
                scanned: shard["documents_scanned"].as_i64().unwrap_or(0),
                total: shard["approx_documents"].as_i64(),
            };
            shape(bar, &size);
            bar.set_position(size.scanned as u64);
            bar.set_message(format!(
                "{}/{} partitions, {}",
                size.done,
                size.partitions,
                size.left()
                    .map_or("total unknown".to_owned(), |left| format!("{left} left"))
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

/// The watch as lines on stdout, one per refresh (`line` makes it), until the migration ends,
/// Ctrl-C, or the reader goes away.
async fn watch_lines(
    ctx: &Ctx,
    id: i64,
    line: impl Fn(&Snapshot, &Refresh) -> Result<String>,
) -> Result<()> {
    let mut follow = Follow::default();
    loop {
        let (snap, _, _) = snapshot(ctx, id).await?;
        let refresh = follow.refresh(&snap);
        let text = line(&snap, &refresh)?;
        {
            use std::io::Write;
            let mut out = std::io::stdout().lock();
            if writeln!(out, "{text}").and_then(|_| out.flush()).is_err() {
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

/// `12:00:01 backfill: 1234 of ~5000 (24.7%) documents, 300 docs/s, eta 12s, 2/8 partitions,
/// backfill | rate ...`: what the bars show, as one line.
fn plain_line(snap: &Snapshot, r: &Refresh) -> String {
    let v = &snap.value;
    format!(
        "{} {}: {} documents, {:.0} docs/s, eta {}, {}/{} partitions, {} | {}",
        chrono::Utc::now().format("%H:%M:%S"),
        r.task,
        scanned_text(&r.size),
        r.rate,
        eta_of(&r.size, r.rate),
        r.size.done,
        r.size.partitions,
        v["state"].as_str().unwrap_or(""),
        facts_line(v)
    )
}

/// The line under the bars: throttle, routers and their leases, dead letters, findings,
/// bypasses.
fn facts_line(v: &serde_json::Value) -> String {
    let t = &v["throttle"];
    format!(
        "rate {:.0}/{:.0} docs/s | routers {}, p99 {} | dead letters {} | findings {} | bypasses {}",
        not_negative(t["applied_docs_per_sec"].as_f64().unwrap_or(0.0)),
        t["configured_docs_per_sec"].as_f64().unwrap_or(0.0),
        routers_text(v),
        worst_p99(v).map_or("-".to_owned(), |p| format!("{p:.1} ms")),
        v["backfill"]["dead_letters_open"],
        v["findings_open"],
        v["bypasses"]["open"],
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn part(done: bool, scanned: i64, approx: Option<i64>) -> PartitionSize {
        PartitionSize {
            done,
            scanned,
            approx,
        }
    }

    #[test]
    fn a_task_without_a_total_says_so_rather_than_done() {
        let size = size_of([part(true, 40, None), part(false, 25, None)]);
        assert_eq!(eta_of(&size, 100.0), "- (total unknown)");
        assert_eq!(scanned_text(&size), "65 (total unknown)");
        let size = size_of([part(true, 40, Some(60)), part(false, 25, Some(100))]);
        assert_eq!(scanned_text(&size), "65 of ~140 (46.4%)");
        assert_eq!(eta_of(&size, 25.0), "3s");
        assert_eq!(eta_of(&size_of([part(true, 2, None)]), 0.0), "done");
    }

    #[test]
    fn the_open_cleanup_wave_is_the_one_that_bounds_the_claims() {
        let waves = [1.0, 10.0, 100.0];
        // 200 partitions: waves of 2, 20 and 200.
        let rows = |done: usize| -> Vec<(i64, bool)> {
            (0..200).map(|i| (i as i64 + 1, i < done)).collect()
        };
        let number = |done| open_wave(&rows(done), waves).map(|w| (w.number, w.done));
        assert_eq!(number(0), Some((1, false)));
        assert_eq!(number(1), Some((1, false)));
        assert_eq!(number(2), Some((2, false)));
        assert_eq!(number(19), Some((2, false)));
        assert_eq!(number(20), Some((3, false)));
        assert_eq!(number(200), Some((3, true)));
        let w = open_wave(&rows(5), waves).unwrap();
        assert_eq!(w.text(), "wave 2 of 3 (10%)");
        assert_eq!(
            open_wave(&rows(200), waves).unwrap().text(),
            "all 3 waves done"
        );
        // Waves that round to the same partitions: the first open one is named.
        let few: Vec<(i64, bool)> = vec![(1, true), (2, false), (3, false)];
        assert_eq!(open_wave(&few, waves).unwrap().number, 3);
        assert_eq!(open_wave(&[], waves), None);
    }

    #[test]
    fn leases_read_as_time_left_or_since() {
        assert_eq!(lease_text(598.0), "in 9m58s");
        assert_eq!(lease_text(-3.2), "expired 3s ago");
    }

    #[test]
    fn the_routers_phrase_counts_lease_states() {
        let v = json!({
            "epoch": 7,
            "routers": [
                {"live": true, "behind": false, "lease_age_secs": 0.4, "p99_ms": 2.0},
                {"live": true, "behind": true, "lease_age_secs": 1.2, "p99_ms": 9.5},
                {"live": false, "behind": true, "lease_age_secs": 900.0, "p99_ms": 50.0},
            ],
        });
        assert_eq!(
            routers_text(&v),
            "2 live (1 behind epoch 7, heartbeats within 1.2s), 1 with an expired lease"
        );
        assert_eq!(worst_p99(&v), Some(9.5));
        assert_eq!(routers_text(&json!({"epoch": 1, "routers": []})), "0 live");
    }
}

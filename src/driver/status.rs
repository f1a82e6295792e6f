//! What `reshard migration status` shows, gathered from the state store: the phase, the task
//! its workers run with its progress and size, the throttle, routers, cleanup's open wave, and
//! what is open (findings, dead letters, bypasses, shadow-read mismatches). The command line
//! renders a [`Snapshot`]; nothing here prints.

use std::collections::BTreeMap;

use serde::Serialize;
use serde_json::json;

use crate::error::{Error, Result};
use crate::estimate::{not_negative, PartitionSize, TaskSize};
use crate::phase::Phase;
use crate::settings::MigrationSettings;
use crate::store::events::EventKind;
use crate::store::partitions::{
    wave_bound, Partition, PartitionState, Task, TaskTotals, STALLED_AFTER,
};
use crate::store::reconcile::RunMode;
use crate::store::routers::RouterRow;
use crate::store::workers::WorkerRow;
use crate::store::Store;

/// At most this many open shadow-read mismatches are listed.
pub const SHOWN_MISMATCHES: usize = 20;

/// Per source location, summed over its partitions.
#[derive(Clone, Debug, Default, Serialize)]
pub struct ShardProgress {
    pub source_shard: String,
    pub source_collection: String,
    pub partitions: i64,
    pub partitions_done: i64,
    pub scan: String,
    pub approx_documents: Option<i64>,
    pub documents_scanned: i64,
    pub documents_copied: i64,
    pub documents_already_present: i64,
    pub documents_stamped: i64,
    pub documents_dead_lettered: i64,
}

/// What the estimate needs of a partition.
pub fn part_size(p: &Partition) -> PartitionSize {
    PartitionSize {
        done: p.state == PartitionState::Done,
        scanned: p.scanned,
        approx: p.approx_documents,
    }
}

/// A task's size as status prints it.
pub fn size_json(size: &TaskSize) -> serde_json::Value {
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
pub struct Wave {
    /// 1-based.
    pub number: usize,
    pub of: usize,
    pub percent: f64,
    /// Every partition is done.
    pub done: bool,
}

/// `rows`: each cleanup partition's `(id, done)`, in id order.
pub fn open_wave(rows: &[(i64, bool)], waves: [f64; 3]) -> Option<Wave> {
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
    pub fn text(&self) -> String {
        if self.done {
            format!("all {} waves done", self.of)
        } else {
            format!("wave {} of {} ({}%)", self.number, self.of, self.percent)
        }
    }
}

pub struct Snapshot {
    pub value: serde_json::Value,
    pub shards: Vec<ShardProgress>,
    pub totals: TaskTotals,
    /// The backfill's size.
    pub backfill: TaskSize,
    pub phase: Phase,
    /// What the live workers report, documents per second.
    pub docs_per_sec: f64,
    /// The task the phase runs, its size.
    pub active: Option<(&'static str, TaskSize)>,
}

pub async fn snapshot(
    store: &Store,
    id: i64,
) -> Result<(Snapshot, Vec<Partition>, Vec<WorkerRow>)> {
    let m = store.migration(id).await?;
    let settings = MigrationSettings::from_json(&m.settings).map_err(Error::failed)?;
    let partitions = store.partitions(id, Task::Backfill).await?;
    let totals = store.task_totals(id, Task::Backfill).await?;
    let cleanup = store.task_totals(id, Task::Cleanup).await?;
    let revert = store.task_totals(id, Task::Revert).await?;
    let workers = store.workers(id).await?;
    let open_dead_letters = store.dead_letters(id, false).await?.len();
    let bypasses = store.bypass_summary(id).await?;
    let shadow = store.shadow_totals(id).await?;
    let mut open_mismatches = store.shadow_mismatches(id, true).await?;
    open_mismatches.truncate(SHOWN_MISMATCHES);
    let events = store.events(id).await?;
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
        s.approx_documents = TaskSize::of(
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
    let active_name = Task::of(m.phase()).map(Task::as_str);
    let backfill = TaskSize::of(partitions.iter().map(part_size));
    // The workers' rate is the active task's: a finished backfill's ETA is 0, an idle one's
    // unknown.
    let backfill_eta = backfill.eta(if active_name == Some("backfill") {
        docs_per_sec
    } else {
        0.0
    });
    let cleanup_partitions = store.partitions(id, Task::Cleanup).await?;
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
        ("verify", latest_full_run_partitions(store, id).await?),
        ("cleanup", cleanup_partitions),
        ("revert", store.partitions(id, Task::Revert).await?),
    ] {
        if active_name == Some(name) {
            active = Some((name, TaskSize::of(task_partitions.iter().map(part_size))));
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
    let routers: Vec<serde_json::Value> = store
        .routers(Some(&m.collection))
        .await?
        .iter()
        .map(|r| router_json(r, m.epoch))
        .collect();
    let findings_open = open_findings(store, id).await?;
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
        // Each object that holds a renamed setting carries its old name beside it until 0.2.
        "throttle": crate::vocabulary::with_old_names(json!({
            "max_docs_per_sec": settings.max_docs_per_sec,
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
        })),
        "cleanup": crate::vocabulary::with_old_names(json!({
            "planned": m.cleanup_planned_at.is_some(),
            "partitions": cleanup.partitions,
            "partitions_done": cleanup.done,
            "documents_scanned": cleanup.scanned,
            "documents_deleted": cleanup.deleted,
            "documents_kept": cleanup.kept,
            "cleanup_waves": settings.cleanup_waves,
            "wave": wave.map(|w| json!({
                "number": w.number,
                "of": w.of,
                "percent": w.percent,
                "done": w.done,
            })),
            "tombstones_purged_at": m.tombstones_purged_at,
        })),
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
        "shadow_reads": crate::vocabulary::with_old_names(json!({
            "shadow_read_percent": settings.shadow_read_percent,
            "reads_compared": shadow.compared,
            "mismatches": shadow.mismatches,
            "open_mismatches": shadow.open,
            "resolved_mismatches": shadow.resolved,
            "open": open_mismatches,
        })),
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
pub fn router_json(r: &RouterRow, epoch: i64) -> serde_json::Value {
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
pub async fn value(store: &Store, id: i64) -> Result<serde_json::Value> {
    Ok(snapshot(store, id).await?.0.value)
}

/// The `verify` partitions of the latest full reconciliation run.
pub async fn latest_full_run_partitions(store: &Store, id: i64) -> Result<Vec<Partition>> {
    let runs = store.reconciliation_runs(id).await?;
    match runs
        .iter()
        .filter(|r| r.mode == RunMode::Full)
        .max_by_key(|r| r.id)
    {
        Some(run) => Ok(store.verify_partitions(run.id).await?),
        None => Ok(Vec::new()),
    }
}

/// Findings of the latest finished reconciliation run, when it did not pass.
pub async fn open_findings(store: &Store, id: i64) -> Result<usize> {
    let runs = store.reconciliation_runs(id).await?;
    match runs
        .iter()
        .filter(|r| r.finished_at.is_some())
        .max_by_key(|r| r.id)
    {
        Some(run) if run.passed != Some(true) => Ok(store.findings(run.id).await?.len()),
        _ => Ok(0),
    }
}

/// One task's progress: totals and, per source location, what is left (its lag; unknown
/// while a running partition has no size).
pub fn task_progress(partitions: &[Partition]) -> serde_json::Value {
    let mut per: BTreeMap<String, Vec<PartitionSize>> = BTreeMap::new();
    for p in partitions {
        per.entry(format!("{}/{}", p.source_shard, p.source_collection))
            .or_default()
            .push(part_size(p));
    }
    let shards: Vec<serde_json::Value> = per
        .iter()
        .map(|(location, parts)| {
            let mut v = size_json(&TaskSize::of(parts.iter().copied()));
            v["location"] = json!(location);
            v
        })
        .collect();
    let mut v = size_json(&TaskSize::of(partitions.iter().map(part_size)));
    v["shards"] = json!(shards);
    v
}

#[cfg(test)]
mod tests {
    use super::*;

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
}

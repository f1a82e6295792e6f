//! A reconciliation run from start to verdict, and repair: the orchestration around the checks
//! of [`crate::reconcile`].
//!
//! A sampled run checks counts, samples and placement in this process. A full run first
//! creates `verify` partitions (the backfill's ranges); any number of processes claim them
//! ([`crate::reconcile::verify_leased`], resumable with the run's id), and the process that
//! finds every partition done runs the counts and placement checks, re-checks every finding
//! after the delay (removing the ones that cleared) and stores the verdict, once.

use std::collections::{BTreeMap, HashSet};
use std::time::Duration;

use serde_json::json;

use super::Driver;
use crate::error::{Error, Result};
use crate::ids;
use crate::phase::Phase;
use crate::reconcile::{self, ReadError, ReconcileOptions, Scene};
use crate::settings::MigrationSettings;
use crate::store::events::{EventKind, NewEvent};
use crate::store::migrations::Migration;
use crate::store::partitions::{PartitionState, Task};
use crate::store::reconcile::{Finding, FindingKind, NewFinding, Run, RunMode};

/// What a run is asked to do.
#[derive(Clone, Debug)]
pub struct RunRequest {
    pub options: ReconcileOptions,
    /// Continue this unfinished full run.
    pub resume: Option<i64>,
    /// Partitions a full run checks at once in this process.
    pub concurrency: usize,
    /// How long a claimed `verify` partition stays leased without a heartbeat.
    pub lease_ttl: Duration,
    /// Who holds the leases (host and pid).
    pub owner: String,
}

/// How a run ended.
#[derive(Clone, Debug)]
pub struct RunOutcome {
    pub run: Run,
    pub findings: Vec<Finding>,
    pub passed: bool,
    /// Findings that persisted, by kind.
    pub found: u64,
}

/// What repair did.
#[derive(Clone, Debug)]
pub struct RepairOutcome {
    /// The run whose findings were repaired; `None` when the migration has no finished run
    /// (only shadow reads' mismatches were repaired).
    pub run: Option<i64>,
    /// Per finding: what was done.
    pub done: Vec<(i64, String)>,
    /// Findings still wrong after the repair.
    pub still_wrong: Vec<NewFinding>,
    /// Per open shadow-read mismatch: its `_id` and how it ended.
    pub shadow: Vec<ShadowRepaired>,
}

/// How one shadow-read mismatch ended in a repair.
#[derive(Clone, Debug)]
pub struct ShadowRepaired {
    /// The `_id` as text output shows it ([`ids::shown`]).
    pub id_shown: String,
    /// The `_id` as Extended JSON.
    pub doc_id: serde_json::Value,
    pub result: reconcile::ShadowRepair,
}

impl RepairOutcome {
    /// Whatever is still wrong: findings and shadow-read mismatches.
    pub fn still_wrong_count(&self) -> usize {
        self.still_wrong.len()
            + self
                .shadow
                .iter()
                .filter(|x| matches!(x.result, reconcile::ShadowRepair::StillWrong(_)))
                .count()
    }
}

fn failed(e: ReadError) -> Error {
    Error::failed(crate::redact::redact_uri(&e.to_string()))
}

/// Reconciliation compares a finished backfill with the target.
pub fn check_phase(m: &Migration) -> Result<()> {
    match m.phase() {
        Phase::Reconcile | Phase::NewReads => Ok(()),
        Phase::Backfill if m.backfill_planned_at.is_some() => Ok(()),
        other => Err(Error::bad_input(format!(
            "migration {} is in {other}; reconciliation compares a finished backfill with the \
             target, in backfill (once planned), reconcile or new_reads",
            m.id
        ))),
    }
}

/// The versions, the shards and the skipped dead letters of a migration.
pub async fn scene(driver: &Driver, m: &Migration) -> Result<(Scene, MigrationSettings)> {
    let (from, to) = driver.store.migration_versions(m).await?;
    let shards = driver.shards(true).await?;
    let skipped = ids::keys_of_encoded(&driver.store.skipped_ids(m.id).await?);
    let settings = MigrationSettings::from_json(&m.settings).map_err(Error::failed)?;
    Ok((
        Scene {
            from,
            to,
            shards,
            skipped,
        },
        settings,
    ))
}

/// Runs (or, with `resume`, continues) a reconciliation of migration `id` to its verdict.
pub async fn run(driver: &Driver, id: i64, request: RunRequest) -> Result<RunOutcome> {
    let m = driver.store.migration(id).await?;
    check_phase(&m)?;
    let (scene, settings) = scene(driver, &m).await?;
    let options = ReconcileOptions {
        full: request.options.full || request.resume.is_some(),
        ..request.options.clone()
    };
    let partitions = driver.store.partitions(id, Task::Backfill).await?;
    let run = match request.resume {
        Some(r) => {
            let run = driver.store.reconciliation_run(id, Some(r)).await?;
            if run.finished_at.is_some() || run.mode != RunMode::Full {
                return Err(Error::bad_input(format!(
                    "reconciliation run {r} of migration {id} cannot be resumed: only an \
                     unfinished full run can (it is {}, {})",
                    run.mode,
                    if run.finished_at.is_some() {
                        "finished"
                    } else {
                        "unfinished"
                    }
                )));
            }
            run
        }
        None => {
            let run = driver
                .store
                .start_reconciliation(
                    id,
                    if options.full {
                        RunMode::Full
                    } else {
                        RunMode::Sample
                    },
                    json!(options),
                )
                .await?;
            if options.full {
                let ranges = reconcile::verify_ranges(&partitions);
                driver.store.plan_verify(run.id, id, &ranges).await?;
            }
            run
        }
    };
    tracing::info!(migration_id = id, run = run.id, "reconciliation started");
    let mut stored_findings = Vec::new();
    let mut full_outcomes: BTreeMap<String, u64> = BTreeMap::new();
    let mut full_strata = Vec::new();
    let mut counted = BTreeMap::new();
    if options.full {
        // Presence and content, leased partition by partition (resumable, shareable).
        loop {
            reconcile::verify_leased(
                &driver.store,
                &scene,
                &partitions,
                run.id,
                &settings,
                &request.owner,
                request.concurrency,
                request.lease_ttl,
            )
            .await
            .map_err(|e| match e {
                reconcile::VerifyError::Read(r) => failed(r),
                reconcile::VerifyError::Store(s) => Error::from(s),
            })?;
            let verify = driver.store.verify_partitions(run.id).await?;
            if verify.iter().all(|p| p.state == PartitionState::Done) {
                let mut per_location: BTreeMap<String, u64> = BTreeMap::new();
                for p in &verify {
                    let mut o: BTreeMap<String, u64> =
                        serde_json::from_value(p.outcomes.clone()).unwrap_or_default();
                    // What the partition read in each backfill partition's range is the fresh
                    // count completeness needs.
                    if let Some(read) = o.remove(reconcile::SOURCE_READ) {
                        // Planned by an earlier version: one per backfill range.
                        let key = reconcile::range_key(p);
                        if let Some(b) = partitions.iter().find(|b| reconcile::range_key(b) == key)
                        {
                            *counted.entry(b.id).or_default() += read as i64;
                        }
                    }
                    if !p.every_location() {
                        // An earlier version's partition checked one source location.
                        o.retain(|k, _| !k.starts_with("full:"));
                        *per_location
                            .entry(format!("full:{}", p.location()))
                            .or_default() += p.scanned as u64;
                    }
                    // The checks of each source location and the placement checks of each
                    // target location are strata of the run.
                    o.retain(|k, n| {
                        if let Some(b) = k.strip_prefix(reconcile::READ_PREFIX) {
                            if let Ok(b) = b.parse::<i64>() {
                                *counted.entry(b).or_default() += *n as i64;
                            }
                            false
                        } else if k.starts_with("placement:") || k.starts_with("full:") {
                            *per_location.entry(k.clone()).or_default() += *n;
                            false
                        } else {
                            true
                        }
                    });
                    for (k, n) in o {
                        *full_outcomes.entry(k).or_default() += n;
                    }
                }
                full_strata = per_location.into_iter().collect();
                break;
            }
            // Another process holds the rest; wait for it, or for its lease to expire.
            driver
                .progress()
                .note("waiting for verify partitions another process holds");
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        stored_findings = driver.store.findings(run.id).await?;
    }
    let options = ReconcileOptions {
        presence_done: options.full,
        counted,
        ..options
    };
    let mut result = reconcile::run(&scene, &partitions, &settings, &options)
        .await
        .map_err(failed)?;
    for (name, samples) in full_strata {
        let defects = stored_findings
            .iter()
            .filter(|f| f.stratum.as_deref() == Some(name.as_str()))
            .count() as u64;
        result.strata.push(reconcile::Stratum {
            bound: if defects == 0 {
                reconcile::defect_bound(samples)
            } else {
                None
            },
            name,
            samples,
            defects,
        });
    }
    for (k, n) in full_outcomes {
        *result.counts.entry(k).or_default() += n;
    }
    // Findings stored by the partitions are checked again like the others; the cleared ones
    // are removed from the run.
    let stored: Vec<_> = stored_findings.iter().map(NewFinding::from).collect();
    // One document found wrong by a partition and again by a placement sample is one defect.
    let known: HashSet<(FindingKind, Vec<u8>)> = stored
        .iter()
        .filter_map(|f| Some((f.kind, f.doc_id.clone()?)))
        .collect();
    result.findings.retain(|f| match &f.doc_id {
        Some(id) => !known.contains(&(f.kind, id.clone())),
        None => true,
    });
    let mut all = stored.clone();
    all.append(&mut result.findings);
    let kept = if all.is_empty() {
        all
    } else {
        tokio::time::sleep(options.recheck_delay).await;
        let (kept, gone) = reconcile::recheck(&scene, &partitions, all)
            .await
            .map_err(failed)?;
        result.rechecked_away = gone;
        let cleared: Vec<i64> = stored_findings
            .iter()
            .zip(&stored)
            .filter(|(_, n)| !kept.contains(n))
            .map(|(f, _)| f.id)
            .collect();
        driver.store.delete_findings(&cleared).await?;
        kept
    };
    let (passed, by_kind) = reconcile::verdict(&kept, &settings);
    // The stored ones that persist stay stored; the new ones are stored with the verdict.
    result.findings = kept.into_iter().filter(|f| !stored.contains(f)).collect();
    let summary = json!({
        "passed": passed,
        "findings": by_kind,
        "rechecked_away": result.rechecked_away,
        "outcomes": result.counts,
        "strata": result.strata,
        "counts": result.counts_checked,
        "thresholds": {
            "max_missing": settings.max_missing,
            "max_mismatched": settings.max_mismatched,
            "max_misplaced": settings.max_misplaced,
        },
    });
    let run = driver
        .store
        .finish_reconciliation(run.id, passed, summary, &result.findings, &driver.actor)
        .await?;
    let findings = driver.store.findings(run.id).await?;
    Ok(RunOutcome {
        run,
        findings,
        passed,
        found: by_kind.values().sum(),
    })
}

/// Repairs what run `run` (default: the latest) of migration `id` found and the open
/// mismatches of shadow reads, then checks the repaired documents again. Without a finished
/// run (and none asked for), only the shadow reads' mismatches are repaired.
/// What `repair` would copy again, with the same refusals, reading only the state store:
/// the open shadow-read mismatches and the run's findings not repaired yet that name a
/// document.
pub async fn repair_plan(driver: &Driver, id: i64, run: Option<i64>) -> Result<serde_json::Value> {
    let m = driver.store.migration(id).await?;
    check_phase(&m)?;
    let mismatches = driver.store.shadow_mismatches(id, true).await?;
    let run = match driver.store.reconciliation_run(id, run).await {
        Ok(r) => Some(r),
        Err(crate::store::StoreError::NotFound(_)) if run.is_none() && !mismatches.is_empty() => {
            None
        }
        Err(e) => return Err(e.into()),
    };
    let findings = match &run {
        Some(run) => driver
            .store
            .findings(run.id)
            .await?
            .into_iter()
            .filter(|f| f.repaired_at.is_none() && f.doc_id.is_some())
            .collect(),
        None => Vec::new(),
    };
    Ok(serde_json::json!({
        "run": run.map(|r| r.id),
        "findings": findings.iter().map(|f| serde_json::json!({
            "finding": f.id, "kind": f.kind,
            "_id": f.doc_id.as_deref().map(ids::extjson_encoded),
        })).collect::<Vec<_>>(),
        "shadow_mismatches": mismatches.iter().map(|x| serde_json::json!({
            "_id": ids::extjson_encoded(&x.doc_id),
            "source": x.source_location, "target": x.target_location,
        })).collect::<Vec<_>>(),
    }))
}

pub async fn repair(driver: &Driver, id: i64, run: Option<i64>) -> Result<RepairOutcome> {
    let m = driver.store.migration(id).await?;
    check_phase(&m)?;
    let mismatches = driver.store.shadow_mismatches(id, true).await?;
    let run = match driver.store.reconciliation_run(id, run).await {
        Ok(r) => Some(r),
        Err(crate::store::StoreError::NotFound(_)) if run.is_none() && !mismatches.is_empty() => {
            None
        }
        Err(e) => return Err(e.into()),
    };
    let (scene, _) = scene(driver, &m).await?;
    let mut shadow = Vec::new();
    for mismatch in &mismatches {
        let result = reconcile::repair_shadow_mismatch(&scene, m.epoch, mismatch)
            .await
            .map_err(failed)?;
        let resolution = match &result {
            reconcile::ShadowRepair::Repaired(what) => Some(format!("repaired: {what}")),
            reconcile::ShadowRepair::Superseded(why) => {
                Some(format!("superseded: {}", why.as_str()))
            }
            reconcile::ShadowRepair::StillWrong(_) => None,
        };
        if let Some(resolution) = resolution {
            driver
                .store
                .resolve_shadow_mismatch(mismatch.id, &resolution)
                .await?;
        }
        shadow.push(ShadowRepaired {
            id_shown: ids::shown_encoded(&mismatch.doc_id, &mismatch.doc_id_text),
            doc_id: ids::extjson_encoded(&mismatch.doc_id),
            result,
        });
    }
    let Some(run) = run else {
        record_repair(driver, id, None, 0, 0, &shadow).await?;
        return Ok(RepairOutcome {
            run: None,
            done: Vec::new(),
            still_wrong: Vec::new(),
            shadow,
        });
    };
    let findings: Vec<_> = driver
        .store
        .findings(run.id)
        .await?
        .into_iter()
        .filter(|f| f.repaired_at.is_none() && f.doc_id.is_some())
        .collect();
    let done = reconcile::repair(&scene, m.epoch, &findings)
        .await
        .map_err(failed)?;
    for (finding, what) in &done {
        driver.store.finding_repaired(*finding, what).await?;
    }
    let new: Vec<_> = findings.iter().map(NewFinding::from).collect();
    let partitions = driver.store.partitions(id, Task::Backfill).await?;
    let (left, _) = reconcile::recheck(&scene, &partitions, new)
        .await
        .map_err(failed)?;
    record_repair(driver, id, Some(run.id), done.len(), left.len(), &shadow).await?;
    Ok(RepairOutcome {
        run: Some(run.id),
        done,
        still_wrong: left,
        shadow,
    })
}

/// The `repaired` event: what a repair did to a run's findings and to shadow mismatches.
async fn record_repair(
    driver: &Driver,
    id: i64,
    run: Option<i64>,
    repaired: usize,
    still_wrong: usize,
    shadow: &[ShadowRepaired],
) -> Result<()> {
    let shadow_left = shadow
        .iter()
        .filter(|x| matches!(x.result, reconcile::ShadowRepair::StillWrong(_)))
        .count();
    driver
        .store
        .record_event(
            id,
            &driver.actor,
            &NewEvent::new(
                EventKind::Repaired,
                json!({
                    "run": run,
                    "repaired": repaired,
                    "still_wrong": still_wrong,
                    "shadow_mismatches": shadow.len(),
                    "shadow_still_wrong": shadow_left,
                }),
            ),
        )
        .await?;
    Ok(())
}

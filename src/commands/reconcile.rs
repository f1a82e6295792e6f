//! `reshard reconcile`, `reshard reconcile show`, `reshard repair`.

use std::collections::{BTreeMap, HashSet};
use std::time::Duration;

use serde_json::json;

use crate::cli::{ReconcileArgs, ReconcileCommand, StratifyArg};
use crate::commands::Ctx;
use crate::error::{Error, Result};
use crate::output;
use crate::phase::Phase;
use crate::reconcile::{self, ReconcileOptions, Scene, Stratify};
use crate::settings::MigrationSettings;
use crate::store::migrations::Migration;

pub async fn run(ctx: &Ctx, args: ReconcileArgs) -> Result<()> {
    if let Some(ReconcileCommand::Show { id, run }) = args.command {
        return show(ctx, id, run).await;
    }
    let id = args
        .id
        .ok_or_else(|| Error::bad_input("give the migration id"))?;
    let m = ctx.store.migration(id).await?;
    check_phase(&m)?;
    let (scene, settings) = scene(ctx, &m).await?;
    let options = ReconcileOptions {
        sample: args.sample as usize,
        full: args.full || args.resume.is_some(),
        stratify: match args.stratify {
            StratifyArg::Bucket => Stratify::Bucket,
            StratifyArg::Tenant => Stratify::Tenant,
            StratifyArg::Shard => Stratify::Shard,
        },
        recheck_delay: Duration::from_millis(args.recheck_delay_ms),
        ..ReconcileOptions::default()
    };
    let partitions = ctx.store.partitions(id, "backfill").await?;
    let failed = |e: reconcile::ReadError| Error::failed(crate::redact::redact_uri(&e.to_string()));
    let run = match args.resume {
        Some(r) => {
            let run = ctx.store.reconciliation_run(id, Some(r)).await?;
            if run.finished_at.is_some() || run.mode != "full" {
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
            let run = ctx
                .store
                .start_reconciliation(
                    id,
                    if options.full { "full" } else { "sample" },
                    json!(options),
                )
                .await?;
            if options.full {
                ctx.store.plan_verify(run.id, id).await?;
            }
            run
        }
    };
    tracing::info!(migration = id, run = run.id, "reconciliation started");
    let mut stored_findings = Vec::new();
    let mut full_outcomes: BTreeMap<String, u64> = BTreeMap::new();
    let mut full_strata = Vec::new();
    if options.full {
        // Presence and content, leased partition by partition (resumable, shareable).
        let owner = format!("{}:{} (reconcile)", super::hostname(), std::process::id());
        loop {
            reconcile::verify_leased(
                &ctx.store,
                &scene,
                run.id,
                &settings,
                &owner,
                args.concurrency as usize,
                Duration::from_secs(args.lease_ttl_secs),
            )
            .await
            .map_err(|e| match e {
                reconcile::VerifyError::Read(r) => failed(r),
                reconcile::VerifyError::Store(s) => Error::from(s),
            })?;
            let verify = ctx.store.verify_partitions(run.id).await?;
            if verify.iter().all(|p| p.state == "done") {
                let mut per_location: BTreeMap<String, u64> = BTreeMap::new();
                for p in &verify {
                    *per_location
                        .entry(format!("full:{}/{}", p.source_shard, p.source_collection))
                        .or_default() += p.scanned as u64;
                    let o: BTreeMap<String, u64> =
                        serde_json::from_value(p.outcomes.clone()).unwrap_or_default();
                    for (k, n) in o {
                        *full_outcomes.entry(k).or_default() += n;
                    }
                }
                full_strata = per_location.into_iter().collect();
                break;
            }
            // Another process holds the rest; wait for it, or for its lease to expire.
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        stored_findings = ctx.store.findings(run.id).await?;
    }
    let options = ReconcileOptions {
        presence_done: options.full,
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
    let stored: Vec<_> = stored_findings
        .iter()
        .map(crate::store::reconcile::NewFinding::from)
        .collect();
    // One document found wrong by a partition and again by a placement sample is one defect.
    let known: HashSet<(String, Vec<u8>)> = stored
        .iter()
        .filter_map(|f| Some((f.kind.clone(), f.doc_id.clone()?)))
        .collect();
    result.findings.retain(|f| match &f.doc_id {
        Some(id) => !known.contains(&(f.kind.clone(), id.clone())),
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
        // Stored findings that cleared are removed from the run.
        let cleared: Vec<i64> = stored_findings
            .iter()
            .zip(&stored)
            .filter(|(_, n)| !kept.contains(n))
            .map(|(f, _)| f.id)
            .collect();
        ctx.store.delete_findings(&cleared).await?;
        kept
    };
    let (passed, by_kind) = reconcile::verdict(&kept, &settings);
    // The stored ones that persist stay stored; the new ones are stored with the verdict.
    result.findings = kept.into_iter().filter(|f| !stored.contains(f)).collect();
    finish(ctx, id, &run, passed, by_kind, &result, &settings).await
}

async fn finish(
    ctx: &Ctx,
    id: i64,
    run: &crate::store::reconcile::Run,
    passed: bool,
    by_kind: BTreeMap<String, u64>,
    result: &reconcile::RunResult,
    settings: &MigrationSettings,
) -> Result<()> {
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
    let run = ctx
        .store
        .finish_reconciliation(run.id, passed, summary, &result.findings, &ctx.actor)
        .await?;
    let found: u64 = by_kind.values().sum();
    print_run(ctx, &run, &ctx.store.findings(run.id).await?)?;
    if passed {
        Ok(())
    } else {
        Err(Error::failed(format!(
            "reconciliation run {} found {found} problem(s); see `reshard reconcile show {id} --run {}`, \
             fix with `reshard repair {id}`",
            run.id, run.id
        )))
    }
}

fn check_phase(m: &Migration) -> Result<()> {
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

async fn scene(ctx: &Ctx, m: &Migration) -> Result<(Scene, MigrationSettings)> {
    let (from, to) = ctx.store.migration_versions(m).await?;
    let shards = super::shard_databases(ctx, true).await?;
    let skipped: HashSet<String> = ctx.store.skipped_ids(m.id).await?.into_iter().collect();
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

async fn show(ctx: &Ctx, id: i64, run: Option<i64>) -> Result<()> {
    let run = ctx.store.reconciliation_run(id, run).await?;
    let findings = ctx.store.findings(run.id).await?;
    print_run(ctx, &run, &findings)
}

fn print_run(
    ctx: &Ctx,
    run: &crate::store::reconcile::Run,
    findings: &[crate::store::reconcile::Finding],
) -> Result<()> {
    let value = json!({ "run": run, "findings": findings });
    output::emit(ctx.output, &value, || {
        let s = &run.summary;
        output::fields(&[
            (
                "run",
                format!(
                    "{} ({}) of migration {}",
                    run.id, run.mode, run.migration_id
                ),
            ),
            ("started", run.started_at.to_rfc3339()),
            (
                "verdict",
                match run.passed {
                    Some(true) => "passed".to_owned(),
                    Some(false) => "FAILED".to_owned(),
                    None => "running".to_owned(),
                },
            ),
            ("findings", s["findings"].to_string()),
            ("outcomes", s["outcomes"].to_string()),
            ("cleared on re-check", s["rechecked_away"].to_string()),
        ]);
        if let Some(strata) = s["strata"].as_array() {
            output::table(
                &["stratum", "samples", "defects", "defect rate < (95%)"],
                strata.iter().map(|st| {
                    [
                        st["name"].as_str().unwrap_or("").to_owned(),
                        st["samples"].to_string(),
                        st["defects"].to_string(),
                        st["bound"]
                            .as_f64()
                            .map_or_else(|| "-".to_owned(), |b| format!("{:.2}%", b * 100.0)),
                    ]
                }),
            );
        }
        if !findings.is_empty() {
            output::table(
                &["#", "kind", "_id", "stratum", "details", "repaired"],
                findings.iter().map(|f| {
                    [
                        f.id.to_string(),
                        f.kind.clone(),
                        output::or_dash(f.doc_id_text.clone()),
                        output::or_dash(f.stratum.clone()),
                        f.details.to_string(),
                        output::or_dash(f.resolution.clone()),
                    ]
                }),
            );
        }
    })
}

pub async fn repair(ctx: &Ctx, id: i64, run: Option<i64>) -> Result<()> {
    let m = ctx.store.migration(id).await?;
    check_phase(&m)?;
    let run = ctx.store.reconciliation_run(id, run).await?;
    let findings: Vec<_> = ctx
        .store
        .findings(run.id)
        .await?
        .into_iter()
        .filter(|f| f.repaired_at.is_none() && f.doc_id.is_some())
        .collect();
    let (scene, _) = scene(ctx, &m).await?;
    let failed = |e: reconcile::ReadError| Error::failed(crate::redact::redact_uri(&e.to_string()));
    let done = reconcile::repair(&scene, m.epoch, &findings)
        .await
        .map_err(failed)?;
    for (finding, what) in &done {
        ctx.store.finding_repaired(*finding, what).await?;
    }
    // Check the repaired documents again.
    let new: Vec<_> = findings
        .iter()
        .map(crate::store::reconcile::NewFinding::from)
        .collect();
    let partitions = ctx.store.partitions(id, "backfill").await?;
    let (left, _) = reconcile::recheck(&scene, &partitions, new)
        .await
        .map_err(failed)?;
    ctx.store
        .record_event(
            id,
            &ctx.actor,
            "repaired",
            None,
            json!({ "run": run.id, "repaired": done.len(), "still_wrong": left.len() }),
        )
        .await?;
    let value = json!({
        "run": run.id,
        "repaired": done.iter().map(|(f, w)| json!({ "finding": f, "action": w })).collect::<Vec<_>>(),
        "still_wrong": left,
    });
    output::emit(ctx.output, &value, || {
        for (f, w) in &done {
            println!("finding {f}: {w}");
        }
        println!(
            "{} finding(s) handled, {} still wrong; run `reshard reconcile {id}` for a new verdict",
            done.len(),
            left.len()
        );
    })?;
    if left.is_empty() {
        Ok(())
    } else {
        Err(Error::failed(format!(
            "{} document(s) are still wrong after repair",
            left.len()
        )))
    }
}

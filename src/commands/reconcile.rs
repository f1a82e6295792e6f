//! `reshard reconcile`, `reshard reconcile show`, `reshard repair`.

use std::sync::Arc;

use serde_json::json;

use crate::cli::{ReconcileArgs, ReconcileCommand, StratifyArg};
use crate::commands::Ctx;
use crate::driver::reconcile::RunRequest;
use crate::driver::{self, Driver};
use crate::error::{Error, Result};
use crate::identity;
use crate::output;
use crate::reconcile::{ReconcileOptions, ShadowRepair, Stratify};

pub async fn run(ctx: &Ctx, args: ReconcileArgs) -> Result<()> {
    if let Some(ReconcileCommand::Show { id, run, all }) = args.command {
        return show(ctx, id, run, all).await;
    }
    let id = args
        .id
        .ok_or_else(|| Error::bad_input("give the migration id"))?;
    if let Some(addr) = args.metrics.metrics_addr {
        if !args.full {
            return Err(Error::bad_input(
                "--metrics-addr serves a full run's metrics: add --full (a sampled run is short)",
            ));
        }
        super::exporter::serve(addr).await?;
    }
    let request = RunRequest {
        options: ReconcileOptions {
            sample: args.sample as usize,
            full: args.full,
            stratify: match args.stratify {
                StratifyArg::Bucket => Stratify::Bucket,
                StratifyArg::Tenant => Stratify::Tenant,
                StratifyArg::Shard => Stratify::Shard,
            },
            recheck_delay: args.recheck_delay,
            ..ReconcileOptions::default()
        },
        resume: args.resume,
        concurrency: args.leased.concurrency as usize,
        lease_ttl: args.leased.lease_ttl,
        owner: format!(
            "{}:{} (reconcile)",
            identity::hostname(),
            std::process::id()
        ),
    };
    let outcome = driver::reconcile::run(&driver(ctx), id, request).await?;
    print_run(ctx, &outcome.run, &outcome.findings, args.all)?;
    if outcome.passed {
        Ok(())
    } else {
        Err(Error::failed(format!(
            "reconciliation run {} found {} problem(s); see `reshard reconcile show {id} --run {}`, \
             fix with `reshard repair {id}`",
            outcome.run.id, outcome.found, outcome.run.id
        )))
    }
}

fn driver(ctx: &Ctx) -> Driver {
    Driver::new(
        ctx.store.clone(),
        ctx.actor.clone(),
        Arc::new(super::progress::Stderr::new(ctx.output)),
    )
}

async fn show(ctx: &Ctx, id: i64, run: Option<i64>, all: bool) -> Result<()> {
    let run = ctx.store.reconciliation_run(id, run).await?;
    let findings = ctx.store.findings(run.id).await?;
    print_run(ctx, &run, &findings, all)
}

fn print_run(
    ctx: &Ctx,
    run: &crate::store::reconcile::Run,
    findings: &[crate::store::reconcile::Finding],
    all: bool,
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
            // The strata with defects first: with one per tenant, the list is long.
            let mut strata: Vec<&serde_json::Value> = strata.iter().collect();
            strata.sort_by_key(|st| std::cmp::Reverse(st["defects"].as_u64().unwrap_or(0)));
            output::table_top(
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
                all,
                "strata",
            );
        }
        if !findings.is_empty() {
            output::table_top(
                &["#", "kind", "_id", "stratum", "details", "repaired"],
                findings.iter().map(|f| {
                    [
                        f.id.to_string(),
                        f.kind.to_string(),
                        output::or_dash(crate::ids::shown_stored(
                            f.doc_id.as_deref(),
                            f.doc_id_text.as_deref(),
                        )),
                        output::or_dash(f.stratum.clone()),
                        f.details.to_string(),
                        output::or_dash(f.resolution.clone()),
                    ]
                }),
                all,
                "findings",
            );
        }
    })
}

pub async fn repair(ctx: &Ctx, id: i64, run: Option<i64>, dry_run: bool) -> Result<()> {
    if dry_run {
        let plan = driver::reconcile::repair_plan(&driver(ctx), id, run).await?;
        let count = |k: &str| plan[k].as_array().map_or(0, Vec::len);
        return output::emit_change(
            ctx.output,
            true,
            &plan,
            || {},
            || {
                format!(
                "copy again the documents of {} finding(s) of run {} and {} shadow-read mismatch(es)",
                count("findings"),
                output::or_dash(plan["run"].as_i64()),
                count("shadow_mismatches")
            )
            },
        );
    }
    let outcome = driver::reconcile::repair(&driver(ctx), id, run).await?;
    let (done, left) = (&outcome.done, &outcome.still_wrong);
    let shadow: Vec<_> = outcome
        .shadow
        .iter()
        .map(|x| {
            let doc = &x.doc_id;
            match &x.result {
                ShadowRepair::Repaired(what) => {
                    json!({ "_id": doc, "resolution": "repaired", "action": what })
                }
                ShadowRepair::Superseded(why) => {
                    json!({ "_id": doc, "resolution": "superseded", "why": why })
                }
                ShadowRepair::StillWrong(fields) => {
                    json!({ "_id": doc, "resolution": "still_wrong", "fields": fields })
                }
            }
        })
        .collect();
    let value = json!({
        "run": outcome.run,
        "repaired": done.iter().map(|(f, w)| json!({ "finding": f, "action": w })).collect::<Vec<_>>(),
        "still_wrong": left,
        "shadow_mismatches": shadow,
    });
    output::emit(ctx.output, &value, || {
        for (f, w) in done {
            println!("finding {f}: {w}");
        }
        for x in &outcome.shadow {
            let doc = &x.id_shown;
            match &x.result {
                ShadowRepair::Repaired(what) => {
                    println!("shadow mismatch {doc}: repaired ({what})")
                }
                ShadowRepair::Superseded(why) => {
                    println!("shadow mismatch {doc}: superseded ({})", why.as_str())
                }
                ShadowRepair::StillWrong(fields) => {
                    println!(
                        "shadow mismatch {doc}: still differs in {}",
                        fields.join(", ")
                    )
                }
            }
        }
        println!(
            "{} finding(s) and {} shadow read mismatch(es) handled, {} still wrong; run \
             `reshard reconcile {id}` for a new verdict",
            done.len(),
            outcome.shadow.len(),
            outcome.still_wrong_count()
        );
    })?;
    let still_wrong = outcome.still_wrong_count();
    if still_wrong == 0 {
        Ok(())
    } else {
        Err(Error::failed(format!(
            "{still_wrong} document(s) are still wrong after repair"
        )))
    }
}

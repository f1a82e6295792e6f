//! `reshard throttle show|set`: a migration's throttle settings and what workers apply.

use crate::cli::ThrottleCommand;
use crate::commands::Ctx;
use crate::duration::Unit;
use crate::error::{Error, Result};
use crate::output::{self, not_negative};
use crate::settings::MigrationSettings;

pub async fn run(ctx: &Ctx, cmd: ThrottleCommand) -> Result<()> {
    match cmd {
        ThrottleCommand::Show(id) => show(ctx, id.id).await,
        ThrottleCommand::Set {
            id,
            max_docs_per_sec,
            max_in_flight_per_shard,
            batch_size,
            target_batch_latency,
            capacity_signal_after,
            latency_budget,
            reason,
            dry_run,
        } => {
            let any = max_docs_per_sec.is_some()
                || max_in_flight_per_shard.is_some()
                || batch_size.is_some()
                || target_batch_latency.is_some()
                || capacity_signal_after.is_some()
                || latency_budget.is_some();
            if !any {
                return Err(Error::bad_input(
                    "nothing to set: give at least one of --max-docs-per-sec, \
                     --max-in-flight-per-shard, --batch-size, --target-batch-latency, \
                     --capacity-signal-after, --latency-budget (the partition size is set with `reshard \
                     migration configure ID --documents-per-partition N`, before the backfill)",
                ));
            }
            // A value the stored unit cannot hold is refused at its flag, before anything
            // changes: rounding it would store another setting than the one written.
            let target_batch_latency_ms = target_batch_latency
                .map(|d| d.whole("--target-batch-latency", Unit::Milliseconds))
                .transpose()
                .map_err(Error::bad_input)?;
            let capacity_signal_after_secs = capacity_signal_after
                .map(|d| d.whole("--capacity-signal-after", Unit::Seconds))
                .transpose()
                .map_err(Error::bad_input)?;
            let (before, after) = ctx
                .store
                .update_settings(
                    id,
                    |s| {
                        if let Some(v) = max_docs_per_sec {
                            s.max_docs_per_sec = v;
                        }
                        if let Some(v) = max_in_flight_per_shard {
                            s.max_in_flight_per_shard = v;
                        }
                        if let Some(v) = batch_size {
                            s.batch_size = v;
                        }
                        // The stored settings keep their numeric fields (data, not flags).
                        if let Some(v) = target_batch_latency_ms {
                            s.target_batch_latency_ms = v;
                        }
                        if let Some(v) = capacity_signal_after_secs {
                            s.capacity_signal_after_secs = v;
                        }
                        if let Some(budget) = latency_budget {
                            budget.apply(s);
                        }
                    },
                    &ctx.actor,
                    reason.as_deref(),
                )
                .await?;
            let value = crate::vocabulary::with_old_names(
                serde_json::json!({ "migration_id": id, "before": before, "after": after }),
            );
            if dry_run {
                return output::emit_change(
                    ctx.output,
                    true,
                    &value,
                    || {},
                    || {
                        print_settings(&after);
                        format!("set migration {id}'s throttle to the settings above")
                    },
                );
            }
            output::emit(ctx.output, &value, || {
                println!("migration {id}: throttle updated; running workers apply it within 2 s");
                print_settings(&after);
            })
        }
    }
}

async fn show(ctx: &Ctx, id: i64) -> Result<()> {
    let m = ctx.store.migration(id).await?;
    let settings = MigrationSettings::from_json(&m.settings).map_err(Error::failed)?;
    let workers = ctx.store.workers(id).await?;
    let live: Vec<_> = workers.iter().filter(|w| w.live).collect();
    let applied = not_negative(live.iter().map(|w| w.applied_docs_per_sec).sum());
    let value = crate::vocabulary::with_old_names(serde_json::json!({
        "migration_id": id,
        "settings": settings,
        "applied_docs_per_sec": applied,
        "workers": live,
    }));
    output::emit(ctx.output, &value, || {
        print_settings(&settings);
        output::fields(&[(
            "applied now",
            format!("{applied:.0} docs/s across {} live worker(s)", live.len()),
        )]);
        if !live.is_empty() {
            output::table(
                &[
                    "worker",
                    "applied docs/s",
                    "docs/s",
                    "overloads",
                    "retries",
                    "rate cuts",
                ],
                live.iter().map(|w| {
                    [
                        w.name.clone(),
                        format!("{:.0}", not_negative(w.applied_docs_per_sec)),
                        format!("{:.0}", not_negative(w.docs_per_sec)),
                        w.overloads.to_string(),
                        w.retries.to_string(),
                        w.rate_cuts.to_string(),
                    ]
                }),
            );
        }
    })
}

fn print_settings(s: &MigrationSettings) {
    output::fields(&[
        ("max docs/s", format!("{}", s.max_docs_per_sec)),
        (
            "max in flight per shard",
            s.max_in_flight_per_shard.to_string(),
        ),
        ("batch size", s.batch_size.to_string()),
        (
            "target batch latency",
            format!("{} ms", s.target_batch_latency_ms),
        ),
        (
            "capacity signal after",
            format!("{} s", s.capacity_signal_after_secs),
        ),
        (
            "documents per partition",
            super::migration::documents_per_partition_text(s.documents_per_partition),
        ),
    ]);
}

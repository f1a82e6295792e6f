//! `reshard router`: the routers applications embed and the fronts, as the state store sees
//! them.

use crate::cli::{RouterCommand, RouterRemoveArgs};
use crate::commands::Ctx;
use crate::error::Result;
use crate::output;

pub async fn run(ctx: &Ctx, cmd: RouterCommand) -> Result<()> {
    let collection = match cmd {
        RouterCommand::List { collection } => collection,
        RouterCommand::Remove(RouterRemoveArgs { id, dry_run })
        | RouterCommand::Forget(RouterRemoveArgs { id, dry_run }) => {
            let gone = ctx.store.forget_router(id).await?;
            let what = || {
                format!(
                    "router {} ({}, pid {}) of {}: its lease ran out at {}",
                    gone.name,
                    gone.host,
                    gone.pid,
                    gone.collection,
                    gone.lease_expires_at.format("%Y-%m-%d %H:%M:%S UTC")
                )
            };
            return output::emit_change(
                ctx.output,
                dry_run,
                &gone,
                || println!("removed {}", what()),
                || format!("remove {}", what()),
            );
        }
    };
    let routers = ctx.store.routers(collection.as_deref()).await?;
    output::emit(ctx.output, &routers, || {
        output::table(
            &[
                "id",
                "collection",
                "name",
                "kind",
                "host",
                "pid",
                "migration",
                "epoch",
                "lease age",
                "live",
                "p99 ms",
                "errors",
            ],
            routers.iter().map(|r| {
                let all = &r.stats["all"];
                [
                    r.id.to_string(),
                    r.collection.clone(),
                    r.name.clone(),
                    r.kind.as_str().to_owned(),
                    r.host.clone(),
                    r.pid.to_string(),
                    output::or_dash(r.migration_id),
                    output::or_dash(r.acked_epoch),
                    format!("{:.1}s", r.lease_age_secs),
                    if r.live { "yes" } else { "expired" }.to_owned(),
                    all["p99_ms"]
                        .as_f64()
                        .map_or_else(|| "-".to_owned(), |v| format!("{v:.1}")),
                    all["errors"]
                        .as_u64()
                        .map_or_else(|| "-".to_owned(), |v| v.to_string()),
                ]
            }),
        )
    })
}

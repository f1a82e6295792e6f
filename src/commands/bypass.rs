//! `reshard bypass list|resolve`: writes that did not go through the router.

use std::sync::Arc;

use crate::bypass::Resolution;
use crate::cli::{BypassAction, BypassCommand};
use crate::commands::progress::Stderr;
use crate::commands::Ctx;
use crate::driver::bypass::{self, Selector};
use crate::driver::Driver;
use crate::error::{Error, Result};
use crate::ids;
use crate::output;

pub async fn run(ctx: &Ctx, cmd: BypassCommand) -> Result<()> {
    let driver = Driver::new(
        ctx.store.clone(),
        ctx.actor.clone(),
        Arc::new(Stderr::new(ctx.output)),
    );
    match cmd {
        BypassCommand::List { id, all } => {
            let m = ctx.store.migration(id).await?;
            let watched = !ctx.store.watches(id).await?.is_empty();
            // Read every stream to its end first, so that the list is the truth of now.
            if watched && !m.phase().is_terminal() {
                driver.catch_up_bypasses(&m, None).await?;
            }
            let rows = ctx.store.bypasses(id, all).await?;
            output::emit(ctx.output, &rows, || {
                if !watched {
                    println!(
                        "migration {id} is not watched for bypasses (the driver starts watching \
                         when it leaves `planned`)"
                    );
                    return;
                }
                if rows.is_empty() {
                    println!(
                        "migration {id} has no {}bypasses",
                        if all { "" } else { "open " }
                    );
                    return;
                }
                output::table(
                    &[
                        "bypass",
                        "location",
                        "_id",
                        "operation",
                        "phase",
                        "at",
                        "resolution",
                    ],
                    rows.iter().map(|b| {
                        [
                            b.id.to_string(),
                            b.location().to_string(),
                            output::or_dash(bypass::shown(b)),
                            b.operation.as_str().to_owned(),
                            b.phase.to_string(),
                            b.happened_at.format("%Y-%m-%d %H:%M:%S%.3f").to_string(),
                            match (&b.resolution, &b.reason) {
                                (Some(r), Some(why)) => format!("{r}: {why}"),
                                (Some(r), None) => r.clone(),
                                _ => "open".into(),
                            },
                        ]
                    }),
                )
            })
        }
        BypassCommand::Resolve {
            id,
            bypass: number,
            doc_id,
            action,
            reason,
            dry_run,
        } => {
            let which = match (number, doc_id) {
                (Some(n), _) => Selector::Bypass(n),
                (None, Some(x)) => {
                    Selector::Document(ids::parse_given(&x).map_err(Error::bad_input)?)
                }
                (None, None) => unreachable!("clap requires --bypass or --id"),
            };
            let resolution = match action {
                BypassAction::Recopy => Resolution::Recopy,
                BypassAction::Ignore => Resolution::Ignore,
            };
            let done = bypass::resolve(&driver, id, &which, resolution, &reason, dry_run).await?;
            let lines = || {
                done.iter()
                    .map(|r| {
                        format!(
                            "bypass {} ({}): {}",
                            r.bypass,
                            r.id_shown.as_deref().unwrap_or("-"),
                            r.outcome
                        )
                    })
                    .collect::<Vec<_>>()
            };
            output::emit_change(
                ctx.output,
                dry_run,
                &done,
                || lines().iter().for_each(|l| println!("{l}")),
                || format!("resolve {} bypass(es): {}", done.len(), lines().join("; ")),
            )
        }
    }
}

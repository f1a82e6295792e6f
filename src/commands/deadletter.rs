//! `reshard deadletter list|retry|skip`: documents the backfill could not write.

use std::sync::Arc;

use crate::cli::DeadletterCommand;
use crate::commands::Ctx;
use crate::driver::{deadletters, Driver, Quiet};
use crate::error::{Error, Result};
use crate::ids;
use crate::output;
use crate::store::dead_letters::DeadLetter;

pub async fn run(ctx: &Ctx, cmd: DeadletterCommand) -> Result<()> {
    match cmd {
        DeadletterCommand::List { id, all } => {
            ctx.store.migration(id).await?;
            let letters = ctx.store.dead_letters(id, all).await?;
            output::emit(ctx.output, &letters, || {
                if letters.is_empty() {
                    println!(
                        "migration {id} has no {}dead letters",
                        if all { "" } else { "open " }
                    );
                    return;
                }
                output::table(
                    &[
                        "id", "_id", "status", "source", "target", "code", "attempts", "message",
                    ],
                    letters.iter().map(|d| {
                        [
                            d.id.to_string(),
                            ids::shown_encoded(&d.doc_id, &d.doc_id_text),
                            d.status.to_string(),
                            format!(
                                "{}/{}",
                                d.source_shard.as_deref().unwrap_or("-"),
                                d.source_collection.as_deref().unwrap_or("-")
                            ),
                            output::or_dash(d.target.clone()),
                            match (&d.code, &d.code_name) {
                                (Some(c), Some(n)) => format!("{c} {n}"),
                                (Some(c), None) => c.to_string(),
                                _ => "-".into(),
                            },
                            d.attempts.to_string(),
                            d.message.clone(),
                        ]
                    }),
                )
            })
        }
        DeadletterCommand::Skip {
            id,
            doc_id,
            reason,
            dry_run,
        } => {
            if reason.trim().is_empty() {
                return Err(Error::bad_input(
                    "--reason must say why the document is skipped",
                ));
            }
            let given = ids::parse_given(&doc_id).map_err(Error::bad_input)?;
            let shown = ids::shown(&given);
            let letters: Vec<i64> = ctx
                .store
                .dead_letters(id, false)
                .await?
                .iter()
                .filter(|d| ids::given_matches(&given, &d.doc_id))
                .map(|d| d.id)
                .collect();
            let skipped = ctx
                .store
                .skip_dead_letters(id, &letters, &shown, &reason, &ctx.actor)
                .await
                .map_err(|e| Error::from(e).with_some_hint(ids::given_hint(&given)))?;
            let doc_id = shown;
            output::emit_change(
                ctx.output,
                dry_run,
                &skipped,
                || {
                    println!(
                        "migration {id}: _id {doc_id} skipped ({} dead letter(s)); reason recorded in the event log",
                        skipped.len()
                    )
                },
                || {
                    format!(
                        "skip _id {doc_id} of migration {id} ({} dead letter(s))",
                        skipped.len()
                    )
                },
            )
        }
        DeadletterCommand::Retry {
            id,
            all,
            doc_id,
            dry_run,
        } => {
            let given = match &doc_id {
                Some(x) => Some(ids::parse_given(x).map_err(Error::bad_input)?),
                None => None,
            };
            let open = ctx.store.dead_letters(id, false).await?;
            let chosen: Vec<DeadLetter> = open
                .into_iter()
                .filter(|d| {
                    all || given
                        .as_ref()
                        .is_some_and(|g| ids::given_matches(g, &d.doc_id))
                })
                .collect();
            if chosen.is_empty() {
                return Err(match given {
                    Some(g) => Error::bad_input(format!(
                        "migration {id} has no open dead letter for _id {} (see `reshard deadletter list {id}`)",
                        ids::shown(&g)
                    ))
                    .with_some_hint(ids::given_hint(&g)),
                    None => Error::bad_input(format!("migration {id} has no open dead letters")),
                });
            }
            if dry_run {
                // What a retry reads again from its source and writes again to its target.
                let value: Vec<_> = chosen
                    .iter()
                    .map(|d| {
                        serde_json::json!({
                            "_id": ids::extjson_encoded(&d.doc_id),
                            "source": d.source_shard.as_ref().map(|s| {
                                format!("{s}/{}", d.source_collection.as_deref().unwrap_or("?"))
                            }),
                            "target": d.target,
                            "attempts": d.attempts,
                        })
                    })
                    .collect();
                return output::emit_change(
                    ctx.output,
                    true,
                    &value,
                    || {},
                    || {
                        let shown: Vec<String> = chosen
                            .iter()
                            .map(|d| ids::shown_encoded(&d.doc_id, &d.doc_id_text))
                            .collect();
                        format!(
                            "read {} document(s) again from their source and write them to their target: {}",
                            chosen.len(),
                            shown.join(", ")
                        )
                    },
                );
            }
            let driver = Driver::new(ctx.store.clone(), ctx.actor.clone(), Arc::new(Quiet));
            let results = deadletters::retry(&driver, id, &chosen).await?;
            let fixed = results.iter().filter(|r| r.resolved).count();
            let value: Vec<_> = results
                .iter()
                .map(|r| {
                    serde_json::json!({
                        "_id": r.doc_id,
                        "resolved": r.resolved,
                        "result": r.what,
                    })
                })
                .collect();
            output::emit(ctx.output, &value, || {
                for r in &results {
                    println!(
                        "{}: {} ({})",
                        r.id,
                        if r.resolved {
                            "written"
                        } else {
                            "still failing"
                        },
                        r.what
                    );
                }
                println!("{fixed} of {} resolved", results.len());
            })?;
            if fixed < results.len() {
                return Err(Error::failed(format!(
                    "{} dead letter(s) still fail",
                    results.len() - fixed
                )));
            }
            Ok(())
        }
    }
}

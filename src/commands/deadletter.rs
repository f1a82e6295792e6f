//! `reshard deadletter list|retry|skip`: documents the backfill could not write.

use mongodb::bson::{doc, Document};

use crate::backfill::prepare_batch;
use crate::cli::DeadletterCommand;
use crate::commands::Ctx;
use crate::copy::{BulkWriter, StatementResult, WriterOptions};
use crate::error::{Error, Result};
use crate::ids;
use crate::output;
use crate::routing::Location;
use crate::store::partitions::DeadLetter;

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
                            d.doc_id_text.clone(),
                            d.status.clone(),
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
        DeadletterCommand::Skip { id, doc_id, reason } => {
            if reason.trim().is_empty() {
                return Err(Error::bad_input(
                    "--reason must say why the document is skipped",
                ));
            }
            let skipped = ctx
                .store
                .skip_dead_letters(id, &doc_id, &reason, &ctx.actor)
                .await?;
            output::emit(ctx.output, &skipped, || {
                println!(
                    "migration {id}: _id {doc_id} skipped ({} dead letter(s)); reason recorded in the event log",
                    skipped.len()
                )
            })
        }
        DeadletterCommand::Retry { id, all, doc_id } => {
            let open = ctx.store.dead_letters(id, false).await?;
            let chosen: Vec<DeadLetter> = open
                .into_iter()
                .filter(|d| all || Some(&d.doc_id_text) == doc_id.as_ref())
                .collect();
            if chosen.is_empty() {
                return Err(Error::bad_input(match doc_id {
                    Some(x) => format!(
                        "migration {id} has no open dead letter for _id {x} (see `reshard deadletter list {id}`)"
                    ),
                    None => format!("migration {id} has no open dead letters"),
                }));
            }
            let results = retry(ctx, id, &chosen).await?;
            let fixed = results.iter().filter(|(_, ok, _)| *ok).count();
            let value: Vec<_> = results
                .iter()
                .map(
                    |(d, ok, what)| serde_json::json!({ "_id": d, "resolved": ok, "result": what }),
                )
                .collect();
            output::emit(ctx.output, &value, || {
                for (d, ok, what) in &results {
                    println!(
                        "{d}: {} ({what})",
                        if *ok { "written" } else { "still failing" }
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

/// Reads each document again from its source location and writes it through the bulk writer
/// as the backfill would. Returns `(_id, resolved, what happened)` per dead letter.
async fn retry(ctx: &Ctx, id: i64, letters: &[DeadLetter]) -> Result<Vec<(String, bool, String)>> {
    let m = ctx.store.migration(id).await?;
    let (from, to) = ctx.store.migration_versions(&m).await?;
    let shards = super::shard_databases(ctx, true).await?;
    let writer = BulkWriter::new(shards.clone(), WriterOptions::default());
    let mut out = Vec::new();
    for letter in letters {
        let (Some(shard), Some(collection)) = (&letter.source_shard, &letter.source_collection)
        else {
            out.push((
                letter.doc_id_text.clone(),
                false,
                "no source location recorded".into(),
            ));
            continue;
        };
        let location = Location::new(shard.clone(), collection.clone());
        let doc_id = ids::decode(&letter.doc_id).map_err(Error::failed)?;
        let db = shards
            .get(shard)
            .ok_or_else(|| Error::failed(format!("source shard {shard:?} is not registered")))?;
        let source: Option<Document> = db
            .collection::<Document>(collection)
            .find_one(doc! { "_id": doc_id.clone() })
            .await
            .map_err(|e| Error::failed(format!("reading {location}: {e}")))?;
        let Some(source) = source else {
            // The document is gone from the source (deleted before new_writes): nothing to copy.
            ctx.store
                .resolve_dead_letter_retried(letter.id, "already_present", &ctx.actor)
                .await?;
            out.push((
                letter.doc_id_text.clone(),
                true,
                "no longer in the source".into(),
            ));
            continue;
        };
        let batch = prepare_batch(&from, &to, &location, m.epoch, vec![source]);
        let settled = if batch.checkpoint.already_present == 1 {
            Some("already_present")
        } else {
            None
        };
        if let Some(message) = batch
            .checkpoint
            .dead_letters
            .first()
            .map(|d| d.message.clone())
        {
            ctx.store
                .dead_letter_failed_again(letter.id, None, None, &message)
                .await?;
            out.push((letter.doc_id_text.clone(), false, message));
            continue;
        }
        let outcome = match settled {
            Some(o) => o.to_owned(),
            None => {
                let report = writer
                    .write(batch.statements)
                    .await
                    .map_err(|e| Error::failed(e.to_string()))?;
                match report.results.first() {
                    Some(StatementResult::Inserted) => "inserted".into(),
                    Some(StatementResult::Applied) => "stamped".into(),
                    Some(StatementResult::AlreadyPresent)
                    | Some(StatementResult::DroppedDuplicate { .. }) => "already_present".into(),
                    Some(StatementResult::DeadLettered {
                        code,
                        code_name,
                        message,
                        ..
                    }) => {
                        ctx.store
                            .dead_letter_failed_again(
                                letter.id,
                                *code,
                                code_name.as_deref(),
                                message,
                            )
                            .await?;
                        out.push((letter.doc_id_text.clone(), false, message.clone()));
                        continue;
                    }
                    None => "already_present".into(),
                }
            }
        };
        ctx.store
            .resolve_dead_letter_retried(letter.id, &outcome, &ctx.actor)
            .await?;
        out.push((letter.doc_id_text.clone(), true, outcome));
    }
    Ok(out)
}

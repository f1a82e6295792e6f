//! Retrying dead letters: each document is read again from its source location and decided
//! and written exactly as the backfill would ([`crate::worker::prepare_batch`], the bulk
//! writer), and its partition's ledger moves it from `dead_lettered` to what the write came to.

use super::Driver;
use crate::error::{Error, Result};
use crate::ids;
use crate::routing::Location;
use crate::shards::{BulkWriter, StatementResult, WriterOptions};
use crate::store::dead_letters::{DeadLetter, Refusal, RetryOutcome};
use crate::worker::prepare_batch;

/// What became of one retried dead letter.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Retried {
    /// The document's `_id`, as text output shows it ([`ids::shown`]).
    pub id: String,
    /// The document's `_id` as Extended JSON.
    pub doc_id: serde_json::Value,
    /// Whether the dead letter is resolved.
    pub resolved: bool,
    /// What the write came to, or why it still fails.
    pub what: String,
}

/// Retries `letters` of migration `id`.
pub async fn retry(driver: &Driver, id: i64, letters: &[DeadLetter]) -> Result<Vec<Retried>> {
    let m = driver.store.migration(id).await?;
    let (from, to) = driver.store.migration_versions(&m).await?;
    let shards = driver.shards(true).await?;
    let writer = BulkWriter::over(&shards, WriterOptions::default());
    let mut out = Vec::new();
    for letter in letters {
        let result = |resolved: bool, what: String| Retried {
            id: ids::shown_encoded(&letter.doc_id, &letter.doc_id_text),
            doc_id: ids::extjson_encoded(&letter.doc_id),
            resolved,
            what,
        };
        let (Some(shard), Some(collection)) = (&letter.source_shard, &letter.source_collection)
        else {
            out.push(result(false, "no source location recorded".into()));
            continue;
        };
        let location = Location::new(shard.clone(), collection.clone());
        let doc_id = ids::decode(&letter.doc_id).map_err(Error::failed)?;
        let source = shards
            .find_by_id(&location, &doc_id)
            .await
            .map_err(|e| Error::failed(e.to_string()))?;
        let Some(source) = source else {
            // The document is gone from the source (deleted before new_writes): nothing to copy.
            driver
                .store
                .resolve_dead_letter_retried(letter.id, RetryOutcome::AlreadyPresent, &driver.actor)
                .await?;
            out.push(result(true, "no longer in the source".into()));
            continue;
        };
        let batch = prepare_batch(&from, &to, &location, m.epoch, vec![source]);
        if let Some(message) = batch
            .checkpoint
            .dead_letters
            .first()
            .map(|d| d.message.clone())
        {
            driver
                .store
                .dead_letter_failed_again(letter.id, &Refusal::message(&message))
                .await?;
            out.push(result(false, message));
            continue;
        }
        let outcome = if batch.checkpoint.already_present == 1 {
            RetryOutcome::AlreadyPresent
        } else {
            let report = writer
                .write(batch.statements)
                .await
                .map_err(|e| Error::failed(e.to_string()))?;
            match report.results.first() {
                Some(StatementResult::Inserted) => RetryOutcome::Inserted,
                Some(StatementResult::Applied) => RetryOutcome::Stamped,
                Some(StatementResult::AlreadyPresent)
                | Some(StatementResult::DroppedDuplicate { .. })
                | None => RetryOutcome::AlreadyPresent,
                Some(StatementResult::Expired) => unreachable!("written without a deadline"),
                Some(StatementResult::DeadLettered {
                    code,
                    code_name,
                    message,
                    ..
                }) => {
                    let refusal = Refusal {
                        code: *code,
                        code_name: code_name.clone(),
                        message: message.clone(),
                    };
                    driver
                        .store
                        .dead_letter_failed_again(letter.id, &refusal)
                        .await?;
                    out.push(result(false, message.clone()));
                    continue;
                }
            }
        };
        driver
            .store
            .resolve_dead_letter_retried(letter.id, outcome, &driver.actor)
            .await?;
        out.push(result(true, outcome.as_str().to_owned()));
    }
    Ok(out)
}

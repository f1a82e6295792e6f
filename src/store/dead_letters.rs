//! Dead letters: documents a batch could not write, kept with the refusal until a retry copies
//! them or an operator skips them. The checkpoint that records a batch writes its dead letters
//! in the same transaction ([`Store::checkpoint_partition`]).

use chrono::{DateTime, Utc};
use serde::Serialize;
use serde_json::json;

use super::events::{self, EventKind, NewEvent};
use super::migrations::migration_in;
use super::{Store, StoreError, StoreResult};

/// A document that could not be written.
#[derive(Clone, Debug, PartialEq)]
pub struct NewDeadLetter {
    pub doc_id: Vec<u8>,
    pub doc_id_text: String,
    /// The target location, `shard/collection`.
    pub target: Option<String>,
    pub code: Option<i32>,
    pub code_name: Option<String>,
    pub message: String,
    pub attempts: i32,
}

/// What a retried dead letter's write came to: the ledger column it moves to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RetryOutcome {
    Inserted,
    AlreadyPresent,
    Stamped,
}

impl RetryOutcome {
    pub fn as_str(self) -> &'static str {
        match self {
            RetryOutcome::Inserted => "inserted",
            RetryOutcome::AlreadyPresent => "already_present",
            RetryOutcome::Stamped => "stamped",
        }
    }
}

/// Why a write was refused again.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refusal {
    pub code: Option<i32>,
    pub code_name: Option<String>,
    pub message: String,
}

impl Refusal {
    /// A refusal decided before anything was sent (no server code).
    pub fn message(message: &str) -> Refusal {
        Refusal {
            code: None,
            code_name: None,
            message: message.to_owned(),
        }
    }
}

/// A stored dead letter.
#[derive(Clone, Debug, Serialize, sqlx::FromRow)]
pub struct DeadLetter {
    pub id: i64,
    pub migration_id: i64,
    pub partition_id: Option<i64>,
    /// The document's `_id`, written as Extended JSON.
    #[serde(rename = "_id", serialize_with = "crate::ids::serialize_encoded")]
    pub doc_id: Vec<u8>,
    /// The `_id` as text when it was recorded.
    #[serde(rename = "id_text")]
    pub doc_id_text: String,
    pub target: Option<String>,
    pub source_shard: Option<String>,
    pub source_collection: Option<String>,
    pub code: Option<i32>,
    pub code_name: Option<String>,
    pub message: String,
    pub attempts: i32,
    pub status: DeadLetterStatus,
    pub resolution: Option<String>,
    pub created_at: DateTime<Utc>,
    pub resolved_at: Option<DateTime<Utc>>,
}

/// Where a dead letter stands: open until a retry copies it or an operator skips it. Stored as
/// its name (the column's CHECK allows these three).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, sqlx::Type)]
#[sqlx(type_name = "text", rename_all = "snake_case")]
#[serde(rename_all = "snake_case")]
pub enum DeadLetterStatus {
    Open,
    Retried,
    Skipped,
}

impl DeadLetterStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            DeadLetterStatus::Open => "open",
            DeadLetterStatus::Retried => "retried",
            DeadLetterStatus::Skipped => "skipped",
        }
    }
}

impl std::fmt::Display for DeadLetterStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

const DEAD_LETTER_COLUMNS: &str = "id, migration_id, partition_id, doc_id, doc_id_text, target,
    source_shard, source_collection, code, code_name, message, attempts, status, resolution,
    created_at, resolved_at";

impl Store {
    /// Dead letters of a migration; only the open ones unless `all`.
    pub async fn dead_letters(&self, migration_id: i64, all: bool) -> StoreResult<Vec<DeadLetter>> {
        Ok(sqlx::query_as(&format!(
            "SELECT {DEAD_LETTER_COLUMNS} FROM dead_letters
             WHERE migration_id = $1 AND ($2 OR status = 'open') ORDER BY id"
        ))
        .bind(migration_id)
        .bind(all)
        .fetch_all(self.pool())
        .await?)
    }

    /// A retried dead letter was written: it is resolved, and its partition's ledger moves the
    /// document from `dead_lettered` to what the write came to (`inserted`, `already_present`
    /// or `stamped`), so the ledger still balances.
    pub async fn resolve_dead_letter_retried(
        &self,
        id: i64,
        outcome: RetryOutcome,
        actor: &str,
    ) -> StoreResult<bool> {
        let column = outcome.as_str();
        let mut tx = self.pool().begin().await?;
        let letter: Option<DeadLetter> = sqlx::query_as(&format!(
            "UPDATE dead_letters SET status = 'retried', resolved_at = now(),
                 resolution = $2, attempts = attempts + 1
             WHERE id = $1 AND status = 'open' RETURNING {DEAD_LETTER_COLUMNS}"
        ))
        .bind(id)
        .bind(format!("retried: {}", outcome.as_str()))
        .fetch_optional(&mut *tx)
        .await?;
        let Some(letter) = letter else {
            return Ok(false);
        };
        if let Some(partition) = letter.partition_id {
            sqlx::query(&format!(
                "UPDATE partitions SET dead_lettered = dead_lettered - 1, {column} = {column} + 1
                 WHERE id = $1"
            ))
            .bind(partition)
            .execute(&mut *tx)
            .await?;
        }
        let migration = migration_in(&mut tx, letter.migration_id).await?;
        let event = NewEvent::new(
            EventKind::DeadletterRetried,
            json!({
                "dead_letter": id,
                "_id": crate::ids::extjson_encoded(&letter.doc_id),
                "outcome": outcome.as_str(),
            }),
        );
        events::insert(&mut tx, &migration, actor, &event).await?;
        tx.commit().await?;
        Ok(true)
    }

    /// A retry failed again: the dead letter stays open with the new failure.
    pub async fn dead_letter_failed_again(&self, id: i64, refusal: &Refusal) -> StoreResult<()> {
        sqlx::query(
            "UPDATE dead_letters SET attempts = attempts + 1, code = $2, code_name = $3,
                 message = $4
             WHERE id = $1 AND status = 'open'",
        )
        .bind(id)
        .bind(refusal.code)
        .bind(&refusal.code_name)
        .bind(&refusal.message)
        .execute(self.pool())
        .await?;
        Ok(())
    }

    /// The operator accepts that a document will not be copied; the reason goes to the event
    /// log. `letters` are the open dead letters of one `_id` (the caller matched them by
    /// value, [`crate::ids::given_matches`]), `shown` that id as the operator gave it. Returns
    /// the dead letters skipped; none still open is [`StoreError::NotFound`].
    pub async fn skip_dead_letters(
        &self,
        migration_id: i64,
        letters: &[i64],
        shown: &str,
        reason: &str,
        actor: &str,
    ) -> StoreResult<Vec<DeadLetter>> {
        let mut tx = self.pool().begin().await?;
        let skipped: Vec<DeadLetter> = sqlx::query_as(&format!(
            "UPDATE dead_letters SET status = 'skipped', resolved_at = now(), resolution = $3
             WHERE migration_id = $1 AND id = ANY($2) AND status = 'open'
             RETURNING {DEAD_LETTER_COLUMNS}"
        ))
        .bind(migration_id)
        .bind(letters)
        .bind(reason)
        .fetch_all(&mut *tx)
        .await?;
        let Some(first) = skipped.first() else {
            return Err(StoreError::NotFound(format!(
                "migration {migration_id} has no open dead letter for _id {shown} \
                 (see `reshard deadletter list {migration_id}`)"
            )));
        };
        let migration = migration_in(&mut tx, migration_id).await?;
        let event = NewEvent::new(
            EventKind::DeadletterSkipped,
            json!({
                "_id": crate::ids::extjson_encoded(&first.doc_id),
                "dead_letters": skipped.iter().map(|d| d.id).collect::<Vec<_>>(),
            }),
        )
        .reason(Some(reason));
        events::insert(&mut tx, &migration, actor, &event).await?;
        self.finish(tx).await?;
        Ok(skipped)
    }
}

//! Single-document commands that end by a deadline: what a router sends for one protocol step.
//!
//! A command can be applied by the server after the client stopped waiting for it, so a
//! router's lease fences its operations only if every command it sends ends before the lease
//! does (docs/decisions/0006-leases-fence-every-step.md). Each command here therefore
//!
//! - is not sent at all once its deadline has passed ([`CommandError::NotSent`]);
//! - carries `maxTimeMS` = the time left until the deadline, so the server gives up on it by
//!   then (MongoDB checks it on `find`, `insert`, `update` and `delete`; through `mongos` from
//!   5.0 on);
//! - is waited for only until the deadline ([`CommandError::NoAnswer`]: it may or may not
//!   have been applied, and cannot be applied later than the deadline plus the time it took
//!   to reach the server, which the router's fence margin covers);
//! - is sent as a raw command, which the driver retries only when it was certainly not
//!   applied (a connection that could not be opened, a server's overload rejection: both
//!   labelled `SystemOverloadedError`): its retryable reads and writes cover its own helpers
//!   (`find_one`, `insert_one`, ...), never `run_command`;
//! - is sent once more, on a fresh connection, when the connection failed and sending again
//!   is harmless ([`may_send_again`]: a read after any lost connection, a write only when it
//!   certainly did not reach its server), and only before the deadline, carrying the time
//!   then left. The router's steps are conditional writes, so a second send of a write whose
//!   first send never arrived is that write arriving late, which the protocol allows for
//!   (docs/decisions/0010-a-step-is-sent-again-only-when-harmless.md).

use super::At;
use mongodb::bson::{doc, Bson, Document};
use mongodb::options::WriteConcern;
use tokio::time::Instant;

use crate::shards::classify::{
    classify, delivery, failures_from_reply, may_send_again, FailureClass, FailureOrigin,
    WriteFailure,
};

#[derive(Debug, thiserror::Error)]
pub enum CommandError {
    /// The deadline had passed: nothing was sent.
    #[error("the deadline passed before the command was sent")]
    NotSent,
    /// Sent, but no answer came before the deadline: it may have been applied (by the
    /// deadline, not after).
    #[error("no answer before the deadline; the command may or may not have been applied")]
    NoAnswer,
    /// The server refused a statement (a write error) or could not confirm its write concern.
    #[error("{}", .0.describe())]
    Write(Box<WriteFailure>),
    #[error("{}", super::describe(.0))]
    Mongo(#[from] mongodb::error::Error),
}

/// What a write command answered.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Written {
    /// Applied: documents matched (`n`; for an insert, inserted) and whether an upsert
    /// inserted one.
    Applied { matched: u64, upserted: bool },
    /// A unique index already holds the key.
    DuplicateKey,
}

impl Written {
    pub fn matched(&self) -> bool {
        matches!(self, Written::Applied { matched, upserted } if *matched > 0 || *upserted)
    }
}

/// Whether a command only reads, or may change a document: it decides whether the command
/// may be sent again after its connection failed ([`may_send_again`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Effect {
    Reads,
    Writes,
}

/// Runs `command` against `at`'s database, ending by `deadline`; once more when its connection failed and
/// sending it again is harmless, if the deadline has not passed by then.
async fn run(
    at: &At,
    command: Document,
    deadline: Instant,
    effect: Effect,
) -> Result<Document, CommandError> {
    let failed = match send(at, command.clone(), deadline).await {
        Err(CommandError::Mongo(e)) => e,
        answered => return answered,
    };
    let reached = delivery(&failed);
    if !may_send_again(reached, effect == Effect::Reads) {
        return Err(CommandError::Mongo(failed));
    }
    // The driver closed the failed connection and cleared the server's pool (a network error
    // marks the server unknown until its monitor checks it again), so this send goes out on a
    // fresh connection once the server is known again, or fails by the deadline.
    tracing::warn!(
        command = command.keys().next().map(String::as_str).unwrap_or_default(),
        error = %super::describe(&failed),
        delivery = ?reached,
        "the connection failed before the command could have been applied; sending it again"
    );
    match send(at, command, deadline).await {
        // The deadline passed before the second send: the first failure is the answer.
        Err(CommandError::NotSent) => Err(CommandError::Mongo(failed)),
        again => again,
    }
}

/// Sends `command` to `at`'s database once, ending by `deadline`.
async fn send(at: &At, mut command: Document, deadline: Instant) -> Result<Document, CommandError> {
    let now = Instant::now();
    if now >= deadline {
        return Err(CommandError::NotSent);
    }
    let left = deadline - now;
    command.insert("maxTimeMS", left.as_millis().max(1) as i64);
    match tokio::time::timeout_at(deadline, at.database.run_command(command)).await {
        Err(_) => Err(CommandError::NoAnswer),
        Ok(Err(e)) => Err(CommandError::Mongo(e)),
        Ok(Ok(reply)) => Ok(reply),
    }
}

/// The first document of `at` matching `filter`.
pub async fn find_one(
    at: &At,
    filter: Document,
    deadline: Instant,
) -> Result<Option<Document>, CommandError> {
    let reply = run(
        at,
        doc! { "find": &at.location.collection, "filter": filter, "limit": 1, "singleBatch": true },
        deadline,
        Effect::Reads,
    )
    .await?;
    Ok(reply
        .get_document("cursor")
        .ok()
        .and_then(|c| c.get_array("firstBatch").ok())
        .and_then(|batch| batch.first())
        .and_then(|d| match d {
            Bson::Document(d) => Some(d.clone()),
            _ => None,
        }))
}

pub async fn insert_one(
    at: &At,
    document: Document,
    write_concern: &WriteConcern,
    deadline: Instant,
) -> Result<Written, CommandError> {
    let command = with_concern(
        doc! { "insert": &at.location.collection, "documents": [document], "ordered": true },
        write_concern,
    );
    written(run(at, command, deadline, Effect::Writes).await?)
}

/// Replaces (a document `update`) or modifies (operators or a pipeline) the first document
/// matching `filter`.
pub async fn update_one(
    at: &At,
    filter: Document,
    update: impl Into<Bson>,
    upsert: bool,
    write_concern: &WriteConcern,
    deadline: Instant,
) -> Result<Written, CommandError> {
    let statement = doc! { "q": filter, "u": update.into(), "upsert": upsert, "multi": false };
    let command = with_concern(
        doc! { "update": &at.location.collection, "updates": [statement], "ordered": true },
        write_concern,
    );
    written(run(at, command, deadline, Effect::Writes).await?)
}

pub async fn delete_one(
    at: &At,
    filter: Document,
    write_concern: &WriteConcern,
    deadline: Instant,
) -> Result<Written, CommandError> {
    let command = with_concern(
        doc! { "delete": &at.location.collection, "deletes": [{ "q": filter, "limit": 1 }], "ordered": true },
        write_concern,
    );
    written(run(at, command, deadline, Effect::Writes).await?)
}

/// The first document of `at` matching `by_id`, and whether it also matches
/// `condition`, read in one atomic step: an aggregation whose `$facet` judges the one document
/// it read, so no write can get between the document and the verdict (two finds, by id and
/// then with the condition, would judge two different versions of it).
pub async fn find_one_matching(
    at: &At,
    by_id: Document,
    condition: &Document,
    deadline: Instant,
) -> Result<Option<(Document, bool)>, CommandError> {
    let pipeline = vec![
        doc! { "$match": by_id },
        doc! { "$limit": 1 },
        doc! { "$facet": {
            "doc": [],
            "matched": [ { "$match": condition.clone() }, { "$project": { "_id": 1 } } ],
        } },
    ];
    let reply = run(
        at,
        doc! { "aggregate": &at.location.collection, "pipeline": pipeline, "cursor": {} },
        deadline,
        Effect::Reads,
    )
    .await?;
    let Some(facets) = reply
        .get_document("cursor")
        .ok()
        .and_then(|c| c.get_array("firstBatch").ok())
        .and_then(|batch| batch.first())
        .and_then(Bson::as_document)
    else {
        return Ok(None);
    };
    let found = facets
        .get_array("doc")
        .ok()
        .and_then(|d| d.first())
        .and_then(Bson::as_document)
        .cloned();
    let matched = facets
        .get_array("matched")
        .map(|m| !m.is_empty())
        .unwrap_or(false);
    Ok(found.map(|d| (d, matched)))
}

/// What a [`find_and_modify`] does to the document it finds.
#[derive(Clone, Debug, PartialEq)]
pub enum Modify {
    /// Update operators (or a replacement document) applied to it.
    Update(Bson),
    /// Remove it.
    Remove,
}

/// Modifies (or removes) the first document matching `filter` in one atomic step and returns
/// it as it was before (`after: false`) or as it is after (`after: true`, an update only);
/// `None` when nothing matched. For a router step that must hand the application the
/// document it changed (`findAndModify`): the image and the write are one server operation,
/// so no other writer gets in between.
pub async fn find_and_modify(
    at: &At,
    filter: Document,
    modify: Modify,
    after: bool,
    write_concern: &WriteConcern,
    deadline: Instant,
) -> Result<Option<Document>, CommandError> {
    let mut command = doc! { "findAndModify": &at.location.collection, "query": filter };
    match modify {
        Modify::Update(update) => {
            command.insert("update", update);
            command.insert("new", after);
        }
        Modify::Remove => {
            command.insert("remove", true);
        }
    }
    let reply = run(
        at,
        with_concern(command, write_concern),
        deadline,
        Effect::Writes,
    )
    .await?;
    // A write concern that could not be confirmed is an error, as for the other writes.
    let outcome = failures_from_reply(&reply, 1);
    if let Some((_, failure)) = outcome.failures.into_iter().next() {
        return Err(CommandError::Write(Box::new(failure)));
    }
    Ok(match reply.get("value") {
        Some(Bson::Document(d)) => Some(d.clone()),
        _ => None,
    })
}

fn with_concern(mut command: Document, write_concern: &WriteConcern) -> Document {
    if let Ok(concern) = mongodb::bson::to_document(write_concern) {
        if !concern.is_empty() {
            command.insert("writeConcern", concern);
        }
    }
    command
}

/// Reads a one-statement write reply: a duplicate key is an answer, any other write error or a
/// write concern error is an error.
fn written(reply: Document) -> Result<Written, CommandError> {
    let outcome = failures_from_reply(&reply, 1);
    if let Some((_, failure)) = outcome.failures.into_iter().next() {
        // A duplicate `_id` is an answer; a duplicate on another unique index is a refusal.
        if failure.origin == FailureOrigin::WriteError
            && classify(&failure) == FailureClass::AlreadyPresent
        {
            return Ok(Written::DuplicateKey);
        }
        return Err(CommandError::Write(Box::new(failure)));
    }
    let upserted = reply
        .get_array("upserted")
        .map(|u| !u.is_empty())
        .unwrap_or(false);
    Ok(Written::Applied {
        matched: if upserted {
            outcome.n.saturating_sub(1)
        } else {
            outcome.n
        },
        upserted,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn write_replies_read_as_answers() {
        assert_eq!(
            written(doc! { "n": 1, "ok": 1 }).unwrap(),
            Written::Applied {
                matched: 1,
                upserted: false
            }
        );
        assert_eq!(
            written(
                doc! { "n": 1, "nModified": 0, "upserted": [{ "index": 0, "_id": 5 }], "ok": 1 }
            )
            .unwrap(),
            Written::Applied {
                matched: 0,
                upserted: true
            }
        );
        assert_eq!(
            written(doc! { "n": 0, "ok": 1, "writeErrors": [
                { "index": 0, "code": 11000, "errmsg": "E11000 duplicate key" }
            ] })
            .unwrap(),
            Written::DuplicateKey
        );
        assert!(matches!(
            written(
                doc! { "n": 1, "ok": 1, "writeConcernError": { "code": 64, "errmsg": "wtimeout" } }
            ),
            Err(CommandError::Write(_))
        ));
        assert!(!Written::Applied {
            matched: 0,
            upserted: false
        }
        .matched());
    }
}

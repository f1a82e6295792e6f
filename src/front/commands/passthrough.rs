//! Commands the front does not route, sent to the passthrough location: those on collections
//! without routing versions and on other databases, and every command the front has no
//! handler for, unless it would reach a routed collection's documents another way (then it
//! is refused, naming the collection).
//!
//! A command that opens a cursor there (`find`, `aggregate`, `listCollections`,
//! `listIndexes`) gets a cursor of the front's own, which `getMore` reads on from the
//! location's.

use bson::{Bson, Document};
use futures::future::BoxFuture;

use super::routed::{engine, first_batch};
use super::{Command, Context, Reply};
use crate::front::cursors::{Open, Source};
use crate::front::engine::Engine;
use crate::front::error::{CommandError, ErrorCode};
use crate::shards::passthrough::Passthrough;

/// The commands that open a cursor, and the namespace their cursor reports.
fn cursor_namespace(command: &Command) -> Option<String> {
    if command.body.contains_key("explain") {
        return None;
    }
    match (command.name.as_str(), command.value()) {
        ("find" | "listIndexes", Bson::String(c)) => Some(format!("{}.{c}", command.database)),
        ("aggregate", Bson::String(c)) => Some(format!("{}.{c}", command.database)),
        ("aggregate", _) => Some(format!("{}.$cmd.aggregate", command.database)),
        ("listCollections", _) => Some(format!("{}.$cmd.listCollections", command.database)),
        _ => None,
    }
}

/// The first batch a cursor command asks for (`batchSize`, `cursor.batchSize`), else
/// MongoDB's 101.
fn first_batch_size(command: &Command) -> u64 {
    let size = command
        .body
        .get("batchSize")
        .or_else(|| command.body.get_document("cursor").ok()?.get("batchSize"));
    match size {
        Some(Bson::Int32(n)) if *n >= 0 => *n as u64,
        Some(Bson::Int64(n)) if *n >= 0 => *n as u64,
        Some(Bson::Double(n)) if *n >= 0.0 => *n as u64,
        _ => 101,
    }
}

/// Runs `command` at the passthrough location: its reply, a cursor of the front's for one
/// that opens a cursor there.
pub async fn forward(engine: &Engine, passthrough: &Passthrough, command: &Command) -> Document {
    let Some(namespace) = cursor_namespace(command) else {
        return passthrough.run(&command.database, &command.body).await;
    };
    let cursor = match passthrough
        .open_cursor(&command.database, &command.body)
        .await
    {
        Ok(cursor) => cursor,
        Err(reply) => return reply,
    };
    let single = matches!(command.body.get("singleBatch"), Some(Bson::Boolean(true)));
    let open = Open::new(namespace, Source::Passthrough(cursor));
    // A `batchSize` of 0 asks for the cursor alone.
    match first_batch(engine, open, first_batch_size(command).max(1), single).await {
        Ok(mut reply) => {
            reply.insert("ok", 1.0);
            reply
        }
        Err(e) => e.to_document(),
    }
}

/// Commands that can reach a collection's documents without naming it as their first field,
/// and are refused when the front's database has routed collections: they would act on the
/// passthrough's copy of the namespace only, beside the routed data.
const DATABASE_WIDE: &[&str] = &["dropDatabase", "applyOps"];

/// A command no handler answers: to the passthrough, unless it names a routed collection or
/// is one of [`DATABASE_WIDE`] on the front's database.
pub fn unknown<'a>(cx: &'a mut Context<'_>, command: &'a Command) -> BoxFuture<'a, Reply> {
    Box::pin(async move {
        let engine = engine(cx)?;
        let Some(passthrough) = engine.passthrough() else {
            return Err(CommandError::command_not_found(&command.name));
        };
        if command.database == engine.database() || command.name == "renameCollection" {
            if let Some(collection) = routed_target(engine, command).await? {
                return Err(CommandError::new(
                    ErrorCode::CommandNotSupported,
                    format!(
                        "'{}' is not run by the front on the routed collection '{}.{collection}' \
                         (its documents sit on the locations of its routing versions, not at the \
                         passthrough); run it on each location, or through reshard",
                        command.name,
                        engine.database()
                    ),
                ));
            }
        }
        Ok(forward(engine, passthrough, command).await)
    })
}

/// The routed collection a command would reach, if any.
async fn routed_target(engine: &Engine, command: &Command) -> Result<Option<String>, CommandError> {
    let routed = engine.routed_collections();
    if let Bson::String(c) = command.value() {
        if command.name == "renameCollection" {
            // `renameCollection: "db.coll", to: "db.other"`, on admin.
            let to = command.body.get_str("to").unwrap_or_default();
            for ns in [c.as_str(), to] {
                if let Some((db, coll)) = ns.split_once('.') {
                    if db == engine.database() && routed.contains(coll) {
                        return Ok(Some(coll.to_owned()));
                    }
                }
            }
            return Ok(None);
        }
        if routed.contains(c) {
            return Ok(Some(c.clone()));
        }
    }
    if DATABASE_WIDE.contains(&command.name.as_str()) && !routed.is_empty() {
        return Ok(Some(routed.into_iter().collect::<Vec<_>>().join(", ")));
    }
    Ok(None)
}

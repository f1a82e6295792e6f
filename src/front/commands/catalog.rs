//! What the front says of databases, collections and indexes, and the index and collection
//! commands on a routed collection:
//! - `listDatabases` and `listCollections` are the passthrough's, with the front's database
//!   and its routed collections added where the passthrough does not hold them;
//! - `listIndexes` of a routed collection lists a location the phase reads (every location
//!   of a version is made with the same indexes);
//! - `createIndexes` and `dropIndexes` are applied to every location of the versions in play
//!   (the migration's source and target), one after another; a failure names the location,
//!   and the locations before it keep the change (the command is idempotent: run it again);
//! - `drop` and `create` of a routed collection are refused: dropping every layout's
//!   documents mid-migration is not something a driver call should do, and the collection
//!   exists already.

use std::collections::BTreeSet;

use bson::{doc, Bson, Document};
use futures::future::BoxFuture;

use super::routed::{engine, first_batch, route, Routed};
use super::{Command, Context, Reply};
use crate::front::cursors::{Open, Source};
use crate::front::engine::Engine;
use crate::front::error::{CommandError, ErrorCode};
use crate::protocol::{query_plan, QueryPlan, Side};
use crate::router::Router;
use crate::routing::Location;

pub fn list_databases<'a>(cx: &'a mut Context<'_>, command: &'a Command) -> BoxFuture<'a, Reply> {
    Box::pin(async move {
        let engine = engine(cx)?;
        let mut reply = match engine.passthrough() {
            Some(p) => p.run(&command.database, &command.body).await,
            None => doc! { "databases": [], "totalSize": 0_i64, "ok": 1.0 },
        };
        if reply.get_f64("ok").ok() != Some(1.0) && reply.get_i32("ok").ok() != Some(1) {
            return Ok(reply);
        }
        let name_only = matches!(command.body.get("nameOnly"), Some(Bson::Boolean(true)));
        let mut databases = reply.get_array("databases").cloned().unwrap_or_default();
        let listed = databases.iter().any(|d| {
            d.as_document().and_then(|d| d.get_str("name").ok()) == Some(engine.database())
        });
        if !listed && !engine.routed_collections().is_empty() {
            databases.push(Bson::Document(if name_only {
                doc! { "name": engine.database() }
            } else {
                doc! { "name": engine.database(), "sizeOnDisk": 0_i64, "empty": false }
            }));
            reply.insert("databases", databases);
        }
        Ok(reply)
    })
}

pub fn list_collections<'a>(cx: &'a mut Context<'_>, command: &'a Command) -> BoxFuture<'a, Reply> {
    Box::pin(async move {
        let engine = engine(cx)?;
        if command.database != engine.database() {
            return match engine.passthrough() {
                Some(p) => Ok(super::passthrough::forward(engine, p, command).await),
                None => Err(super::routed::unserved(engine, &command.database, "*")),
            };
        }
        let mut entries: Vec<Document> = Vec::new();
        if let Some(p) = engine.passthrough() {
            let mut cursor = p
                .open_cursor(&command.database, &command.body)
                .await
                .map_err(|reply| super::routed::passed_error(&reply))?;
            loop {
                let batch = cursor
                    .next_batch(1000)
                    .await
                    .map_err(|reply| super::routed::passed_error(&reply))?;
                let ended = batch.len() < 1000;
                entries.extend(batch);
                if ended {
                    break;
                }
            }
        }
        let listed: BTreeSet<String> = entries
            .iter()
            .filter_map(|e| e.get_str("name").ok().map(str::to_owned))
            .collect();
        let wanted = command
            .body
            .get_document("filter")
            .ok()
            .and_then(|f| f.get_str("name").ok().map(str::to_owned));
        let name_only = matches!(command.body.get("nameOnly"), Some(Bson::Boolean(true)));
        for name in engine.routed_collections() {
            if listed.contains(&name) || wanted.as_ref().is_some_and(|w| w != &name) {
                continue;
            }
            entries.push(if name_only {
                doc! { "name": &name, "type": "collection" }
            } else {
                doc! {
                    "name": &name, "type": "collection", "options": {},
                    "info": { "readOnly": false },
                    "idIndex": { "v": 2, "key": { "_id": 1 }, "name": "_id_" },
                }
            });
        }
        let namespace = format!("{}.$cmd.listCollections", command.database);
        first_batch(
            engine,
            Open::new(namespace, Source::Computed(entries.into())),
            u64::MAX,
            false,
        )
        .await
    })
}

/// The locations of the versions a routed collection's router applies now: every location
/// the migration's source and target place documents at.
async fn locations_in_play(router: &Router) -> Vec<Location> {
    let snapshot = router.snapshot().await;
    let mut all: BTreeSet<Location> = snapshot.source.locations().into_iter().collect();
    all.extend(snapshot.target.locations());
    all.into_iter().collect()
}

pub fn list_indexes<'a>(cx: &'a mut Context<'_>, command: &'a Command) -> BoxFuture<'a, Reply> {
    Box::pin(async move {
        let (router, collection) = match route(cx, command).await? {
            Routed::To {
                router, collection, ..
            } => (router, collection),
            Routed::Answered(reply) => return Ok(reply),
        };
        let engine = engine(cx)?;
        let snapshot = router.snapshot().await;
        let version = match query_plan(snapshot.phase) {
            QueryPlan::One(Side::Source) => &snapshot.source,
            _ => &snapshot.target,
        };
        let location = version.locations().into_iter().next().ok_or_else(|| {
            CommandError::new(
                ErrorCode::NamespaceNotFound,
                format!("ns does not exist: {collection}"),
            )
        })?;
        let indexes = engine
            .shards()
            .list_indexes(&location)
            .await
            .map_err(|e| CommandError::new(ErrorCode::HostUnreachable, e.to_string()))?;
        let namespace = format!("{}.{collection}", command.database);
        first_batch(
            engine,
            Open::new(namespace, Source::Computed(indexes.into())),
            u64::MAX,
            false,
        )
        .await
    })
}

/// Applies an index command to every location in play, one after another.
async fn every_location(
    engine: &Engine,
    router: &Router,
    apply: impl Fn(
        &Engine,
        Location,
    ) -> BoxFuture<'_, Result<Document, crate::shards::collections::CollectionError>>,
) -> Result<Vec<Document>, CommandError> {
    let mut replies = Vec::new();
    for location in locations_in_play(router).await {
        let reply = apply(engine, location.clone()).await.map_err(|e| {
            CommandError::new(
                ErrorCode::OperationFailed,
                format!(
                    "{e}; the locations before {location} have the change already (running the \
                     command again is harmless)"
                ),
            )
        })?;
        replies.push(reply);
    }
    Ok(replies)
}

pub fn create_indexes<'a>(cx: &'a mut Context<'_>, command: &'a Command) -> BoxFuture<'a, Reply> {
    Box::pin(async move {
        let router = match route(cx, command).await? {
            Routed::To { router, .. } => router,
            Routed::Answered(reply) => return Ok(reply),
        };
        let engine = engine(cx)?;
        let specs: Vec<Document> = match command.body.get("indexes") {
            Some(Bson::Array(a)) => a
                .iter()
                .map(|s| {
                    s.as_document().cloned().ok_or_else(|| {
                        CommandError::type_mismatch("createIndexes", "indexes", "object")
                    })
                })
                .collect::<Result<_, _>>()?,
            Some(_) => {
                return Err(CommandError::type_mismatch(
                    "createIndexes",
                    "indexes",
                    "array",
                ))
            }
            None => return Err(CommandError::missing_field("createIndexes", "indexes")),
        };
        let replies = every_location(engine, &router, |engine, location| {
            let specs = specs.clone();
            Box::pin(async move { engine.shards().create_indexes(&location, specs).await })
        })
        .await?;
        let first = replies.first().cloned().unwrap_or_default();
        Ok(doc! {
            "numIndexesBefore": first.get("numIndexesBefore").cloned().unwrap_or(Bson::Int32(1)),
            "numIndexesAfter": first.get("numIndexesAfter").cloned().unwrap_or(Bson::Int32(1)),
            "createdCollectionAutomatically": false,
            "locations": replies.len() as i32,
        })
    })
}

pub fn drop_indexes<'a>(cx: &'a mut Context<'_>, command: &'a Command) -> BoxFuture<'a, Reply> {
    Box::pin(async move {
        let router = match route(cx, command).await? {
            Routed::To { router, .. } => router,
            Routed::Answered(reply) => return Ok(reply),
        };
        let engine = engine(cx)?;
        let which = command
            .body
            .get("index")
            .cloned()
            .ok_or_else(|| CommandError::missing_field("dropIndexes", "index"))?;
        let replies = every_location(engine, &router, |engine, location| {
            let which = which.clone();
            Box::pin(async move { engine.shards().drop_indexes(&location, which).await })
        })
        .await?;
        let first = replies.first().cloned().unwrap_or_default();
        Ok(doc! {
            "nIndexesWas": first.get("nIndexesWas").cloned().unwrap_or(Bson::Int32(1)),
            "locations": replies.len() as i32,
        })
    })
}

/// `drop` and `create` of a routed collection are refused; of any other, passed through.
pub fn collection_command<'a>(
    cx: &'a mut Context<'_>,
    command: &'a Command,
) -> BoxFuture<'a, Reply> {
    Box::pin(async move {
        let collection = match route(cx, command).await? {
            Routed::To { collection, .. } => collection,
            Routed::Answered(reply) => return Ok(reply),
        };
        Err(CommandError::new(
            ErrorCode::CommandNotSupported,
            format!(
                "'{}' of the routed collection '{}.{collection}' is refused by the front: its \
                 documents sit on every location of its routing versions; drop or create those \
                 with the shards' own tools once no migration of it is active",
                command.name, command.database
            ),
        ))
    })
}

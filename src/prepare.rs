//! What `planned` prepares before routers may read the target (DESIGN.md "Phases"): the target
//! collections with the source's indexes, and the tenant key index that tenant-scoped backfill
//! scans read through. Idempotent: what exists is left alone.

use std::collections::BTreeSet;

use futures::TryStreamExt;
use mongodb::bson::{doc, Document};
use mongodb::Database;

use crate::shards::Shards;
use serde::Serialize;

use crate::routing::{Location, MoveScope, RoutingVersion};
use crate::scope::location_scope;

/// One thing prepared (or, in a dry run, to be prepared).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Prepared {
    pub location: String,
    pub action: String,
}

/// The name of the index tenant-scoped scans use.
pub const TENANT_INDEX: &str = "reshard_tenant_id";

#[derive(Debug, thiserror::Error)]
#[error("preparing {location} failed: {}", crate::shards::describe(source))]
pub struct PrepareError {
    pub location: Location,
    #[source]
    pub source: mongodb::error::Error,
}

/// Creates what is missing; with `dry_run`, only reports it.
pub async fn prepare(
    from: &RoutingVersion,
    to: &RoutingVersion,
    shards: &Shards,
    dry_run: bool,
) -> Result<Vec<Prepared>, PrepareError> {
    let mut done = Vec::new();
    let sources = from.locations();
    let source_set: BTreeSet<&Location> = sources.iter().collect();
    let err = |location: &Location| {
        let location = location.clone();
        move |source| PrepareError { location, source }
    };
    // The indexes to carry over, from the first source location that has the collection.
    let mut template: Vec<Document> = Vec::new();
    for source in &sources {
        let Ok(db) = &shards.database(&source.shard) else {
            continue;
        };
        if !collection_exists(db, &source.collection)
            .await
            .map_err(err(source))?
        {
            continue;
        }
        let specs: Vec<Document> = db
            .collection::<Document>(&source.collection)
            .list_indexes()
            .await
            .map_err(err(source))?
            .try_collect::<Vec<_>>()
            .await
            .map_err(err(source))?
            .into_iter()
            .map(|model| mongodb::bson::to_document(&model).unwrap_or_default())
            .collect();
        template = specs
            .into_iter()
            .filter(|s| {
                s.get_str("name").ok() != Some("_id_")
                    && s.get_str("name").ok() != Some(TENANT_INDEX)
            })
            .map(|mut s| {
                // `key` and `options` flattened: keep what createIndexes accepts.
                let mut spec = Document::new();
                if let Ok(key) = s.get_document("key") {
                    spec.insert("key", key.clone());
                }
                if let Some(Ok(options)) = s
                    .remove("options")
                    .map(|o| o.as_document().cloned().ok_or(()))
                {
                    for (k, v) in options {
                        if k != "v" && k != "ns" {
                            spec.insert(k, v);
                        }
                    }
                }
                for k in [
                    "name",
                    "unique",
                    "sparse",
                    "partialFilterExpression",
                    "expireAfterSeconds",
                    "collation",
                ] {
                    if let Some(v) = s.get(k) {
                        spec.insert(k, v.clone());
                    }
                }
                spec
            })
            .collect();
        break;
    }
    for target in to.locations() {
        if source_set.contains(&target) {
            continue;
        }
        let Ok(db) = &shards.database(&target.shard) else {
            continue;
        };
        if !collection_exists(db, &target.collection)
            .await
            .map_err(err(&target))?
        {
            if !dry_run {
                db.create_collection(&target.collection)
                    .await
                    .map_err(err(&target))?;
            }
            done.push(Prepared {
                location: target.to_string(),
                action: "create collection".into(),
            });
        }
        let existing = index_names(db, &target.collection, dry_run)
            .await
            .map_err(err(&target))?;
        for spec in &template {
            let name = spec.get_str("name").unwrap_or("").to_owned();
            if existing.contains(&name) {
                continue;
            }
            if !dry_run {
                db.run_command(
                    doc! { "createIndexes": &target.collection, "indexes": [spec.clone()] },
                )
                .await
                .map_err(err(&target))?;
            }
            done.push(Prepared {
                location: target.to_string(),
                action: format!(
                    "create index {name} {}",
                    spec.get_document("key")
                        .map(|k| k.to_string())
                        .unwrap_or_default()
                ),
            });
        }
    }
    for source in &sources {
        if !matches!(location_scope(from, to, source), MoveScope::Tenants(_)) {
            continue;
        }
        let Ok(db) = &shards.database(&source.shard) else {
            continue;
        };
        if !collection_exists(db, &source.collection)
            .await
            .map_err(err(source))?
        {
            continue;
        }
        let existing = index_names(db, &source.collection, false)
            .await
            .map_err(err(source))?;
        if existing.contains(TENANT_INDEX) {
            continue;
        }
        if !dry_run {
            db.run_command(doc! {
                "createIndexes": &source.collection,
                "indexes": [{ "key": { &from.tenant_key: 1, "_id": 1 }, "name": TENANT_INDEX }],
            })
            .await
            .map_err(err(source))?;
        }
        done.push(Prepared {
            location: source.to_string(),
            action: format!(
                "create index {TENANT_INDEX} {{{}: 1, _id: 1}} for tenant-scoped backfill",
                from.tenant_key
            ),
        });
    }
    Ok(done)
}

async fn collection_exists(db: &Database, name: &str) -> mongodb::error::Result<bool> {
    Ok(!db
        .list_collection_names()
        .filter(doc! { "name": name })
        .await?
        .is_empty())
}

async fn index_names(
    db: &Database,
    collection: &str,
    may_be_missing: bool,
) -> mongodb::error::Result<BTreeSet<String>> {
    if may_be_missing && !collection_exists(db, collection).await? {
        return Ok(BTreeSet::new());
    }
    Ok(db
        .collection::<Document>(collection)
        .list_index_names()
        .await?
        .into_iter()
        .collect())
}

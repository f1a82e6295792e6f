//! What `planned` prepares before routers may read the target (the project's design document, "Phases"): the target
//! collections, created with the source's collection options ([`crate::collection_options`]
//! decides which are carried and which refuse the migration) and its indexes, and the tenant
//! key index that tenant-scoped backfill scans read through. Every location is read before
//! anything is made, so a refusal creates nothing. Idempotent: a target that exists is
//! checked against the source and kept, an index that exists is left alone.

use std::collections::BTreeSet;

use futures::future::try_join_all;
use mongodb::bson::{doc, Document};
use serde::Serialize;

use crate::collection_options::{self, Bookkeeping, Listing, Refused};
use crate::routing::{Location, MoveScope, RoutingVersion};
use crate::scope::location_scope;
use crate::shards::collections::CollectionError;
use crate::shards::Shards;

/// One thing prepared (or, in a dry run, to be prepared).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Prepared {
    pub location: String,
    pub action: String,
}

/// The name of the index tenant-scoped scans use.
pub const TENANT_INDEX: &str = "reshard_tenant_id";

#[derive(Debug, thiserror::Error)]
pub enum PrepareError {
    /// The source's collection options cannot be carried to the target (or a target that
    /// exists differs from the source): nothing was created.
    #[error(transparent)]
    Refused(#[from] Refused),
    /// A server did not answer, or refused a command.
    #[error("preparing {0}")]
    Server(#[from] CollectionError),
}

/// Creates what is missing; with `dry_run`, only reports it (and refuses as it would).
pub async fn prepare(
    from: &RoutingVersion,
    to: &RoutingVersion,
    shards: &Shards,
    dry_run: bool,
) -> Result<Vec<Prepared>, PrepareError> {
    let mut done = Vec::new();
    let sources: Vec<Location> = from
        .locations()
        .into_iter()
        .filter(|l| shards.contains(&l.shard))
        .collect();
    let source_set: BTreeSet<&Location> = sources.iter().collect();
    let targets: Vec<Location> = to
        .locations()
        .into_iter()
        .filter(|l| !source_set.contains(l) && shards.contains(&l.shard))
        .collect();

    // Every source's options and every target's, before anything is made.
    let source_listings: Vec<(Location, Listing)> = listings(shards, &sources)
        .await?
        .into_iter()
        .filter_map(|(location, listing)| listing.map(|l| (location, l)))
        .collect();
    let target_listings = listings(shards, &targets).await?;
    let create = collection_options::decide(
        &source_listings,
        &target_listings,
        &Bookkeeping::of(from, to),
    )?;

    // The indexes to carry over, from the first source location that has the collection.
    let template: Vec<Document> = match source_listings.first() {
        Some((source, _)) => index_template(shards.index_specs(source).await?),
        None => Vec::new(),
    };
    for (target, listing) in &target_listings {
        let exists = listing.is_some();
        if !exists {
            if !dry_run {
                shards.create_collection(target, &create).await?;
            }
            done.push(Prepared {
                location: target.to_string(),
                action: if create.is_empty() {
                    "create collection".to_owned()
                } else {
                    format!(
                        "create collection with {}",
                        create.keys().cloned().collect::<Vec<_>>().join(", ")
                    )
                },
            });
        }
        // In a dry run, a target to be created has no index yet.
        let existing = if exists || !dry_run {
            shards.index_names(target).await?
        } else {
            BTreeSet::new()
        };
        for spec in &template {
            let name = spec.get_str("name").unwrap_or("").to_owned();
            if existing.contains(&name) {
                continue;
            }
            if !dry_run {
                shards.create_index(target, spec.clone()).await?;
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
    for (source, _) in &source_listings {
        if !matches!(location_scope(from, to, source), MoveScope::Tenants(_)) {
            continue;
        }
        if shards.index_names(source).await?.contains(TENANT_INDEX) {
            continue;
        }
        if !dry_run {
            shards
                .create_index(
                    source,
                    doc! { "key": { &from.tenant_key: 1, "_id": 1 }, "name": TENANT_INDEX },
                )
                .await?;
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

/// What `listCollections` says of each location, read from every shard at once.
async fn listings(
    shards: &Shards,
    locations: &[Location],
) -> Result<Vec<(Location, Option<Listing>)>, CollectionError> {
    try_join_all(
        locations
            .iter()
            .map(|location| async move { Ok((location.clone(), shards.listing(location).await?)) }),
    )
    .await
}

/// The source's indexes as `createIndexes` takes them: all but `_id`'s and the tenant index.
fn index_template(specs: Vec<Document>) -> Vec<Document> {
    specs
        .into_iter()
        .filter(|s| {
            s.get_str("name").ok() != Some("_id_") && s.get_str("name").ok() != Some(TENANT_INDEX)
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
        .collect()
}

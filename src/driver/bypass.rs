//! Resolving a write that bypassed the router (`crate::bypass`): recopy it by the protocol's
//! rules, or ignore it with a reason.
//!
//! A recopy replays the bypass's effect as an application write through a router of this
//! process, so it is decided by `protocol` like any other write in the current phase: the
//! document as the bypassed location holds it now is written with `replace` (upsert), and a
//! document gone from there is deleted (a tombstone while the source may hold a copy).

use std::time::Duration;

use mongodb::bson::{doc, Bson, Document};

use super::Driver;
use crate::bypass::{Operation, Resolution, Role};
use crate::envelope;
use crate::error::{Error, Result};
use crate::ids;
use crate::phase::Phase;
use crate::protocol::{self, Side};
use crate::router::{Router, RouterConfig};
use crate::routing::{Location, RoutingVersion};
use crate::shards::Shards;
use crate::store::bypasses::Bypass;

/// What a recopy says when it removed the plain document from a target-only location.
const REMOVED: &str = "the plain copy was removed";

/// What resolving a bypass did.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Resolved {
    pub bypass: i64,
    /// The document's `_id` (Extended JSON), when the bypass named one.
    #[serde(rename = "_id", serialize_with = "ids::serialize_encoded_opt")]
    pub doc_id: Option<Vec<u8>>,
    /// The `_id` as text output shows it ([`ids::shown`]).
    #[serde(skip)]
    pub id_shown: Option<String>,
    pub resolution: Resolution,
    pub outcome: String,
}

/// Which open bypasses to resolve.
#[derive(Clone, Debug, PartialEq)]
pub enum Selector {
    /// One bypass, by its number in `reshard bypass list`.
    Bypass(i64),
    /// Every open bypass of one document, by its `_id` ([`ids::parse_given`]); matched by
    /// value, so an int 7 and a string "7" are two documents.
    Document(Bson),
}

/// Resolves the open bypasses `which` names. A document recopied once resolves every open
/// bypass of it: the recopy carries the document as it is now.
pub async fn resolve(
    driver: &Driver,
    id: i64,
    which: &Selector,
    resolution: Resolution,
    reason: &str,
    dry_run: bool,
) -> Result<Vec<Resolved>> {
    if reason.trim().is_empty() {
        return Err(Error::bad_input(
            "--reason must say why the bypass is resolved this way",
        ));
    }
    let chosen: Vec<Bypass> = driver
        .store
        .bypasses(id, false)
        .await?
        .into_iter()
        .filter(|b| match which {
            Selector::Bypass(n) => b.id == *n,
            Selector::Document(x) => b
                .doc_id
                .as_deref()
                .is_some_and(|d| ids::given_matches(x, d)),
        })
        .collect();
    let Some(first) = chosen.first().cloned() else {
        return Err(match which {
            Selector::Bypass(n) => Error::bad_input(format!(
                "migration {id} has no open bypass {n} (`reshard bypass list {id}`)"
            )),
            Selector::Document(x) => {
                let error = Error::bad_input(format!(
                    "migration {id} has no open bypass of _id {} (`reshard bypass list {id}`)",
                    ids::shown(x)
                ));
                error.with_some_hint(ids::given_hint(x))
            }
        });
    };
    let outcome = match (resolution, dry_run) {
        (Resolution::Ignore, _) => "ignored".to_owned(),
        (Resolution::Recopy, false) => recopy(driver, id, &first).await?,
        (Resolution::Recopy, true) => {
            let m = driver.store.migration(id).await?;
            if let Some(refused) = recopy_refused(id, &m, &first) {
                return Err(refused);
            }
            format!(
                "would be recopied from {} through a router in phase {}",
                first.location(),
                m.phase()
            )
        }
    };
    let mut chosen = chosen;
    if !dry_run && resolution == Resolution::Recopy && outcome.contains(REMOVED) {
        // The removal of the plain copy is itself a delete no router made: the watch records
        // it, and it is resolved with the rest.
        let m = driver.store.migration(id).await?;
        driver.catch_up_bypasses(&m, None).await?;
        let known: Vec<i64> = chosen.iter().map(|b| b.id).collect();
        chosen.extend(
            driver
                .store
                .bypasses(id, false)
                .await?
                .into_iter()
                .filter(|b| {
                    !known.contains(&b.id)
                        && b.operation == Operation::Delete
                        && b.location() == first.location()
                        && b.doc_id == first.doc_id
                }),
        );
    }
    let mut done = Vec::new();
    for b in chosen {
        driver
            .store
            .resolve_bypass(id, b.id, resolution, reason, &outcome, &driver.actor)
            .await?;
        done.push(Resolved {
            bypass: b.id,
            id_shown: shown(&b),
            doc_id: b.doc_id,
            resolution,
            outcome: outcome.clone(),
        });
    }
    Ok(done)
}

/// A bypass's `_id` as text output shows it ([`ids::shown`]), when it names one.
pub fn shown(b: &Bypass) -> Option<String> {
    ids::shown_stored(b.doc_id.as_deref(), b.doc_id_text.as_deref())
}

/// Why bypass `b` of migration `id` cannot be recopied now, if it cannot.
fn recopy_refused(id: i64, m: &crate::store::migrations::Migration, b: &Bypass) -> Option<Error> {
    if b.operation == Operation::Gap {
        return Some(Error::bad_input(format!(
            "bypass {} is a gap in the watch of {}: it names no document to recopy; check the \
             layouts (`reshard reconcile {id} --full`) and resolve it with --action ignore",
            b.id,
            b.location()
        )));
    }
    if matches!(
        m.phase(),
        Phase::Planned | Phase::Completed | Phase::RolledBack
    ) {
        return Some(Error::bad_input(format!(
            "migration {id} is in {}: there is nothing to recopy into; resolve with --action ignore",
            m.phase()
        )));
    }
    None
}

async fn recopy(driver: &Driver, id: i64, b: &Bypass) -> Result<String> {
    let m = driver.store.migration(id).await?;
    if let Some(refused) = recopy_refused(id, &m, b) {
        return Err(refused);
    }
    let Some(doc_id) = b.doc_id.as_deref().and_then(|raw| ids::decode(raw).ok()) else {
        return Err(Error::bad_input(format!(
            "bypass {} names no document id",
            b.id
        )));
    };
    let (from, to) = driver.store.migration_versions(&m).await?;
    let shards = driver.shards(false).await?;
    let here = b.location();
    let failed =
        |e: &dyn std::fmt::Display| Error::failed(format!("recopy of bypass {}: {e}", b.id));
    let current = shards
        .find_by_id(&here, &doc_id)
        .await
        .map_err(|e| failed(&e))?
        .filter(|d| !envelope::is_tombstone(d));
    let mut config = RouterConfig::named(format!("bypass-resolve-{}", b.id));
    // A short lease: if this process dies mid-way, phase moves wait for it only briefly.
    config.lease_ttl = Duration::from_secs(30);
    let router = Router::with_shards(driver.store.clone(), &m.collection, config, shards.clone())
        .await
        .map_err(|e| failed(&e))?;
    let result = async {
        match current {
            Some(doc) => {
                let written = plain(doc, &from, &to);
                router
                    .replace(written, true)
                    .await
                    .map_err(|e| failed(&e))?;
                let role = crate::bypass::locations(&from, &to)
                    .into_iter()
                    .find(|(l, _)| l == &here)
                    .map(|(_, r)| r);
                let mut outcome = format!("written through the router in {}", m.phase());
                // A collection both layouts use is judged as a source: the router's write
                // took the id's own place in it.
                let side = role.map(|r| match r {
                    Role::Target => Side::Target,
                    Role::Source | Role::Shared => Side::Source,
                });
                // The plain document stays only where the router did not put its own.
                if let Some(step) = side.and_then(protocol::bypass_leftover_step::<(), ()>) {
                    let filter = crate::copy::steps::at_location_filter(&step, &doc_id)
                        .map_err(|e| failed(&e))?;
                    let stray = shards
                        .delete_one(&here, filter)
                        .await
                        .map_err(|e| failed(&e))?;
                    if stray {
                        outcome.push_str(&format!("; {REMOVED} at {here}"));
                    }
                }
                Ok(outcome)
            }
            None => match tenant_of(&shards, &from, &to, &doc_id).await? {
                Some(tenant) => {
                    let existed = router
                        .delete(tenant, doc_id.clone())
                        .await
                        .map_err(|e| failed(&e))?;
                    Ok(if existed {
                        format!("deleted through the router in {}", m.phase())
                    } else {
                        "already deleted".to_owned()
                    })
                }
                None => Ok("nothing to do: no location holds the id".to_owned()),
            },
        }
    }
    .await;
    router.shutdown().await;
    result
}

/// The document as the application would write it: without reshard's envelope and routing
/// fields.
fn plain(mut doc: Document, from: &RoutingVersion, to: &RoutingVersion) -> Document {
    for field in envelope::bookkeeping(from, to) {
        doc.remove(field);
    }
    doc
}

/// The tenant of `id`, from a live document of it in any location of either layout.
async fn tenant_of(
    shards: &Shards,
    from: &RoutingVersion,
    to: &RoutingVersion,
    id: &Bson,
) -> Result<Option<Bson>> {
    let mut places: Vec<Location> = to.locations();
    places.extend(from.locations());
    places.dedup();
    for place in places {
        let found = shards
            .find_by_id(&place, id)
            .await
            .map_err(|e| Error::failed(e.to_string()))?;
        if let Some(d) = found.filter(|d| !envelope::is_tombstone(d)) {
            if let Some(t) = d.get(&to.tenant_key).or_else(|| d.get(&from.tenant_key)) {
                return Ok(Some(t.clone()));
            }
        }
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn the_plain_document_loses_the_envelope_and_both_routing_fields() {
        let hashed = |field: &str| crate::routing::one_shard_version(Some(field));
        let d = doc! { "_id": 1, "customerId": "c", "x": 2, "b0": 1, "b1": 3, "_reshard": { "rev": 1 } };
        assert_eq!(
            plain(d, &hashed("b0"), &hashed("b1")),
            doc! { "_id": 1, "customerId": "c", "x": 2 }
        );
    }
}

//! The last steps of a migration's two endings, run by the driver once every live router
//! acknowledged the final phase:
//!
//! - `completed`: purge the target's tombstones (nothing can copy or mirror an old version of
//!   an id any more, and no router writes tombstones), then drop source collections cleanup
//!   emptied, when the migration says so;
//! - `rolled_back` (or back to `planned` before any target write): remove the target layout —
//!   drop collections only the target uses, delete from shared collections what only the
//!   target version places there — then, once every router acknowledged the seal (deletes
//!   stop leaving source tombstones), purge the source's tombstones.

//!
//! Both purges apply [`crate::protocol::purge_tombstone_step`] to every tombstone of a side at
//! once; the removal from shared collections keeps exactly what [`disposition::of`] calls the
//! source's (everything but the documents of the other layout).

use std::collections::{BTreeMap, BTreeSet};

use mongodb::bson::doc;
use serde_json::json;

use crate::copy::steps;
use crate::disposition::{self, Disposition};
use crate::envelope::{self, META};
use crate::protocol::{self, Side};
use crate::routing::{Location, RoutingVersion};
use crate::shards::read::{QueryOptions, ReadError};
use crate::shards::Shards;

/// A read or a write of the last steps failed, and where.
pub type FinishError = ReadError;

/// What the purge of `side`'s tombstones deletes at each location: the protocol's purge step
/// ([`protocol::purge_tombstone_step`]) applied to every tombstone there at once.
fn purge(side: Side) -> mongodb::bson::Document {
    steps::purge_filter(&protocol::purge_tombstone_step::<(), ()>(side))
        .expect("the purge step is a purge")
}

/// After `completed`: purges target tombstones; drops emptied source collections when
/// `drop_empty_source`. Returns what it did.
pub async fn purge_completed(
    from: &RoutingVersion,
    to: &RoutingVersion,
    shards: &Shards,
    drop_empty_source: bool,
) -> Result<serde_json::Value, FinishError> {
    let targets: BTreeSet<Location> = to.locations().into_iter().collect();
    let mut purged = BTreeMap::new();
    let purge = purge(Side::Target);
    for t in &targets {
        purged.insert(t.to_string(), shards.delete_many(t, purge.clone()).await?);
    }
    let mut dropped = Vec::new();
    let mut kept = BTreeMap::new();
    for s in from
        .locations()
        .into_iter()
        .filter(|s| !targets.contains(s))
    {
        let left = shards.count(&s, doc! {}).await?;
        if left == 0 && drop_empty_source {
            shards.drop_collection(&s).await?;
            dropped.push(s.to_string());
        } else {
            kept.insert(s.to_string(), left);
        }
    }
    Ok(json!({ "tombstones_purged": purged, "dropped": dropped, "source_documents_left": kept }))
}

/// After a rollback: removes the target layout.
pub async fn remove_target_layout(
    from: &RoutingVersion,
    to: &RoutingVersion,
    shards: &Shards,
) -> Result<serde_json::Value, FinishError> {
    let sources: BTreeSet<Location> = from.locations().into_iter().collect();
    let mut dropped = Vec::new();
    let mut removed = BTreeMap::new();
    for t in to.locations() {
        if !sources.contains(&t) {
            shards.drop_collection(&t).await?;
            dropped.push(t.to_string());
            continue;
        }
        // A shared collection: remove what reshard wrote there for the target only, the
        // documents that are foreign to the source layout here.
        let options = QueryOptions {
            projection: Some(doc! {
                "_id": 1, &from.tenant_key: 1, &from.id_field: 1, format!("{META}.deleted"): 1,
            }),
            ..QueryOptions::default()
        };
        let mut rows = shards
            .rows(&t, envelope::written_by_reshard(), options)
            .await?;
        let mut foreign = Vec::new();
        while let Some(d) = rows.next().await? {
            if disposition::of(Side::Source, from, to, &t, &d) == Disposition::Foreign {
                foreign.extend(d.get("_id").cloned());
            }
        }
        let mut n = 0;
        for chunk in foreign.chunks(1_000) {
            n += shards
                .delete_many(&t, doc! { "_id": { "$in": chunk.to_vec() } })
                .await?;
        }
        removed.insert(t.to_string(), n);
    }
    Ok(json!({
        "dropped": dropped,
        "removed_from_shared": removed,
    }))
}

/// After a rollback, once no router leaves or mirrors tombstones any more (every router
/// acknowledged the seal): purges the source's tombstones, the mirrored deletes and the
/// deletes made while the migration was rolled back but not sealed.
pub async fn purge_source_tombstones(
    from: &RoutingVersion,
    shards: &Shards,
) -> Result<serde_json::Value, FinishError> {
    let sources: BTreeSet<Location> = from.locations().into_iter().collect();
    let mut purged = BTreeMap::new();
    let purge = purge(Side::Source);
    for s in &sources {
        purged.insert(s.to_string(), shards.delete_many(s, purge.clone()).await?);
    }
    Ok(json!({ "source_tombstones_purged": purged }))
}

//! Tenant listings: a k-way merge by `_id` over every bucket of the tenant (and the source
//! location while the phase still reads it), the target copy winning over the source copy and
//! tombstones hiding both.

use std::cmp::Ordering;
use std::collections::BTreeSet;
use std::num::NonZeroU32;

use futures::{StreamExt, TryStreamExt};
use mongodb::bson::{doc, Bson, Document};

use super::{Inner, RouterError, Snapshot};
use crate::envelope::is_tombstone;
use crate::ids;
use crate::phase::ReadPath;
use crate::protocol::Side;
use crate::routing::{vbucket, KeyValue, Layout, Location, RoutingVersion};
use crate::shards::read::{QueryOptions, Rows};

/// One page of a tenant listing.
#[derive(Debug, Clone, PartialEq)]
pub struct Page {
    pub documents: Vec<Document>,
    /// The cursor for the next page: the last `_id` returned; `None` when the listing ended.
    pub next: Option<Bson>,
}

/// Every location that can hold documents of `tenant` under `version`.
pub(super) fn tenant_locations(version: &RoutingVersion, tenant: &KeyValue) -> Vec<Location> {
    let mut out = BTreeSet::new();
    match version.layout() {
        Layout::Hashed {
            virtual_buckets, ..
        } => {
            let v = NonZeroU32::new(*virtual_buckets).expect("validated versions have V > 0");
            for s in 0..version.buckets_of(tenant) {
                if let Some(location) = version.location_of_vbucket(vbucket(tenant, s, v)) {
                    out.insert(location);
                }
            }
        }
        Layout::Fanout { .. } | Layout::TenantTable { .. } => {
            if let Ok(located) = version.locate(tenant, &KeyValue::Int(0)) {
                out.extend(located.locations);
            }
        }
    }
    out.into_iter().collect()
}

struct Stream {
    side: Side,
    location: Location,
    rows: Rows,
    head: Option<Document>,
}

impl Stream {
    async fn advance(&mut self) -> Result<(), RouterError> {
        self.head = self.rows.next().await.map_err(super::query::read_error)?;
        Ok(())
    }

    fn head_id(&self) -> Option<&Bson> {
        self.head.as_ref().and_then(|d| d.get("_id"))
    }
}

pub async fn list_tenant(
    inner: &Inner,
    snapshot: &Snapshot,
    tenant: &Bson,
    after: Option<Bson>,
    limit: usize,
    deadline: tokio::time::Instant,
) -> Result<Page, RouterError> {
    let tenant_key = KeyValue::from_bson(tenant)?;
    let mut wanted: Vec<(Side, Location)> = Vec::new();
    let read = snapshot.phase.read_path();
    if read != ReadPath::Source {
        for l in tenant_locations(&snapshot.target, &tenant_key) {
            wanted.push((Side::Target, l));
        }
    }
    if read != ReadPath::Target {
        for l in tenant_locations(&snapshot.source, &tenant_key) {
            wanted.push((Side::Source, l));
        }
    }
    let mut filter = doc! {};
    filter.insert(snapshot.target.tenant_key.clone(), tenant.clone());
    if let Some(after) = &after {
        // The next page starts after the cursor in MongoDB's order, across `_id` type
        // brackets: `$gt` alone would stop at the end of the cursor's bracket.
        filter.extend(ids::after(after).map_err(|e| RouterError::InvalidCursor(e.to_string()))?);
    }
    // Every location's cursor is opened at once, with bounded parallelism.
    let batch = (limit as u32).clamp(1, 1000);
    let mut streams: Vec<Stream> = futures::stream::iter(wanted)
        .map(|(side, location)| {
            let filter = filter.clone();
            async move {
                // The server gives up by the lease's deadline too.
                let left = deadline.saturating_duration_since(tokio::time::Instant::now());
                let options = QueryOptions {
                    sort: Some(doc! { "_id": 1 }),
                    batch_size: batch,
                    max_time: Some(left.max(std::time::Duration::from_millis(1))),
                    ..QueryOptions::default()
                };
                let rows = inner
                    .shards
                    .rows(&location, filter, options)
                    .await
                    .map_err(super::query::read_error)?;
                let mut s = Stream {
                    side,
                    location,
                    rows,
                    head: None,
                };
                s.advance().await?;
                Ok::<_, RouterError>(s)
            }
        })
        .buffer_unordered(inner.config.list_parallelism.max(1))
        .try_collect()
        .await?;

    let mut documents = Vec::with_capacity(limit);
    while documents.len() < limit {
        let Some(smallest) = streams
            .iter()
            .filter_map(|s| s.head_id())
            .min_by(|a, b| ids::compare(a, b))
            .cloned()
        else {
            return Ok(Page {
                documents,
                next: None,
            });
        };
        // Every stream positioned on this id contributes one candidate; the target's wins. A
        // location can belong to both layouts (a collection that keeps its name), so a document
        // only counts for a side when that side's version places it at this location.
        let mut chosen: Option<(Side, Document)> = None;
        let id_key = KeyValue::from_bson(&smallest)?;
        for s in streams.iter_mut() {
            if s.head_id()
                .is_none_or(|id| ids::compare(id, &smallest) != Ordering::Equal)
            {
                continue;
            }
            let doc = s.head.take().expect("head was checked");
            s.advance().await?;
            let version = match s.side {
                Side::Source => &snapshot.source,
                Side::Target => &snapshot.target,
            };
            if !version
                .locate(&tenant_key, &id_key)?
                .locations
                .contains(&s.location)
            {
                continue;
            }
            let better = match &chosen {
                None => true,
                Some((side, _)) => *side == Side::Source && s.side == Side::Target,
            };
            if better {
                chosen = Some((s.side, doc));
            }
        }
        if let Some((_, doc)) = chosen {
            if !is_tombstone(&doc) {
                documents.push(snapshot.view(doc));
            }
        }
    }
    let next = documents.last().and_then(|d| d.get("_id").cloned());
    Ok(Page { documents, next })
}

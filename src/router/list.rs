//! Tenant listings: a k-way merge by `_id` over every bucket of the tenant (and the source
//! location while the phase still reads it), the target copy winning over the source copy and
//! tombstones hiding both.

use std::cmp::Ordering;
use std::collections::BTreeSet;
use std::num::NonZeroU32;

use futures::{StreamExt, TryStreamExt};
use mongodb::bson::{doc, Bson, Document};
use mongodb::Cursor;

use super::exec::{is_tombstone, strip_metadata};
use super::{Inner, RouterError, Snapshot};
use crate::phase::ReadPath;
use crate::protocol::Side;
use crate::routing::{vbucket, KeyValue, Layout, Location, RoutingVersion};

/// One page of a tenant listing.
#[derive(Debug, Clone, PartialEq)]
pub struct Page {
    pub documents: Vec<Document>,
    /// The cursor for the next page: the last `_id` returned; `None` when the listing ended.
    pub next: Option<Bson>,
}

/// Every location that can hold documents of `tenant` under `version`.
fn tenant_locations(version: &RoutingVersion, tenant: &KeyValue) -> Vec<Location> {
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
    cursor: Cursor<Document>,
    head: Option<Document>,
}

impl Stream {
    async fn advance(&mut self) -> Result<(), RouterError> {
        self.head = self.cursor.try_next().await?;
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
        filter.insert("_id", doc! { "$gt": after.clone() });
    }
    // Every location's cursor is opened at once, with bounded parallelism.
    let batch = (limit as u32).clamp(1, 1000);
    let mut streams: Vec<Stream> = futures::stream::iter(wanted)
        .map(|(side, location)| {
            let filter = filter.clone();
            async move {
                let coll = super::exec::collection(inner, &location)?;
                let location_kept = location.clone();
                let cursor = coll
                    .find(filter)
                    .sort(doc! { "_id": 1 })
                    .batch_size(batch)
                    .await?;
                let mut s = Stream {
                    side,
                    location: location_kept,
                    cursor,
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
            .min_by(|a, b| compare_ids(a, b))
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
                .is_none_or(|id| compare_ids(id, &smallest) != Ordering::Equal)
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
                documents.push(strip_metadata(doc));
            }
        }
    }
    let next = documents.last().and_then(|d| d.get("_id").cloned());
    Ok(Page { documents, next })
}

/// MongoDB's order for the id types reshard routes: numbers, then strings, then binary data,
/// then ObjectIds; within a type, by value (binary data by length, subtype, then bytes).
pub fn compare_ids(a: &Bson, b: &Bson) -> Ordering {
    fn rank(b: &Bson) -> u8 {
        match b {
            Bson::Int32(_) | Bson::Int64(_) | Bson::Double(_) => 1,
            Bson::String(_) => 2,
            Bson::Binary(_) => 3,
            Bson::ObjectId(_) => 4,
            _ => 5,
        }
    }
    fn number(b: &Bson) -> f64 {
        match b {
            Bson::Int32(v) => *v as f64,
            Bson::Int64(v) => *v as f64,
            Bson::Double(v) => *v,
            _ => 0.0,
        }
    }
    match (a, b) {
        (Bson::Int64(x), Bson::Int64(y)) => x.cmp(y),
        (Bson::Int32(x), Bson::Int32(y)) => x.cmp(y),
        (Bson::Int32(x), Bson::Int64(y)) => (*x as i64).cmp(y),
        (Bson::Int64(x), Bson::Int32(y)) => x.cmp(&(*y as i64)),
        (Bson::String(x), Bson::String(y)) => x.as_bytes().cmp(y.as_bytes()),
        (Bson::ObjectId(x), Bson::ObjectId(y)) => x.bytes().cmp(&y.bytes()),
        (Bson::Binary(x), Bson::Binary(y)) => x
            .bytes
            .len()
            .cmp(&y.bytes.len())
            .then(u8::from(x.subtype).cmp(&u8::from(y.subtype)))
            .then(x.bytes.cmp(&y.bytes)),
        _ if rank(a) == 1 && rank(b) == 1 => number(a).total_cmp(&number(b)),
        _ => rank(a).cmp(&rank(b)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mongodb::bson::oid::ObjectId;

    #[test]
    fn ids_order_like_mongodb() {
        let oid = |n: u8| Bson::ObjectId(ObjectId::from_bytes([n; 12]));
        let ordered = [
            Bson::Int64(-5),
            Bson::Int32(2),
            Bson::Int64(3),
            Bson::String("A".into()),
            Bson::String("a".into()),
            Bson::String("ab".into()),
            oid(1),
            oid(2),
        ];
        for (i, a) in ordered.iter().enumerate() {
            for (j, b) in ordered.iter().enumerate() {
                assert_eq!(compare_ids(a, b), i.cmp(&j), "{a} vs {b}");
            }
        }
    }
}

//! Reads of many documents of a few tenants at once, with the application's filter: what the
//! front's `find`, `count`, `distinct` and `aggregate` read. Each location's server evaluates
//! the filter (with the collection's collation), the sort and the projection; this module
//! reads the locations the phase's plan names ([`protocol::query_plan`]), answers each id as
//! the router's read would ([`protocol::query_answer`]) and merges what is left in the
//! caller's order.
//!
//! In the phases that read the target and then the source, the source's matches are read
//! whole when the query opens, checked against the target (an id the target holds is answered
//! by the target's document alone), and held in memory, sorted; the target's matches then
//! stream from one cursor per location and merge with them. The source's side is bounded by
//! [`MAX_SOURCE_MATCHES`]: what the backfill has not copied yet of the tenants asked for.

use std::cmp::Ordering;
use std::collections::{HashSet, VecDeque};
use std::sync::Arc;

use mongodb::bson::{doc, Bson, Document};
use tokio::time::Instant;

use super::{list, Inner, Router, RouterError, Snapshot};
use crate::envelope;
use crate::phase::Phase;
use crate::protocol::{self, Found, QueryPlan, Side};
use crate::routing::{KeyValue, Location, RoutingVersion};
use crate::shards::read::{QueryOptions, Scan};

/// The most source documents a query holds in memory while the target and the source are
/// both read: the documents of the tenants asked for that the backfill has not copied yet and
/// that match the filter. A query past it fails with `QueryExceededMemoryLimit` (what MongoDB
/// answers when a sort needs more memory than it may use), naming the limit.
pub const MAX_SOURCE_MATCHES: usize = 100_000;

/// How documents are ordered when merged: MongoDB's comparison of the query's sort.
pub type Order = Arc<dyn Fn(&Document, &Document) -> Ordering + Send + Sync>;

/// A read of many documents: which tenants, what filter, what each location returns.
#[derive(Clone)]
pub struct Query {
    /// The values of the tenant key the filter pins: each is read at every location its
    /// buckets can be at.
    pub tenants: Vec<Bson>,
    /// The application's filter, evaluated by each location's server.
    pub filter: Document,
    /// The fields each location returns (`None`: whole documents). It must keep `_id`, the
    /// tenant key and every field `order` reads.
    pub projection: Option<Document>,
    /// The order each location returns its documents in (`None`: the server's).
    pub sort: Option<Document>,
    /// The same order, as the merge compares documents; `None` with no sort.
    pub order: Option<Order>,
    /// At most this many documents are wanted (the query's skip plus its limit): each target
    /// location is asked for no more when that cannot drop a document the merge needs.
    pub limit: Option<u64>,
    /// Documents per batch read from a location.
    pub batch_size: u32,
}

/// A query in progress: [`QueryCursor::next_batch`] until it returns an empty batch.
pub struct QueryCursor {
    /// The phase the reads were planned in: the cursor serves while the router's phase keeps
    /// the plan ([`protocol::cursor_continues`]).
    planned: Phase,
    tenant_key: String,
    /// The version the streams' documents are judged by (placed where it places them).
    version: Arc<RoutingVersion>,
    /// The snapshot the reads were planned under: it shows each document as the application
    /// sees it ([`Snapshot::view`]).
    snapshot: Snapshot,
    /// Source documents that no target document supersedes, in the merge's order.
    survivors: VecDeque<Document>,
    /// The ids of `survivors` (by [`crate::ids::key`]), and which of them were returned: a
    /// target document of one of them returned later is the same id's newer image (the
    /// target gained it meanwhile), returned instead of the survivor, or skipped when the
    /// survivor was returned already.
    survivor_ids: HashSet<Vec<u8>>,
    returned_survivors: HashSet<Vec<u8>>,
    streams: Vec<Stream>,
    order: Option<Order>,
}

struct Stream {
    location: Location,
    scan: Scan,
    buffer: VecDeque<Document>,
    ended: bool,
}

impl Stream {
    /// Fills the buffer from the scan when it is empty.
    async fn fill(&mut self, deadline: Instant) -> Result<(), RouterError> {
        while self.buffer.is_empty() && !self.ended {
            let batch = tokio::time::timeout_at(deadline, self.scan.next_batch())
                .await
                .map_err(|_| RouterError::RoutingStale)?
                .map_err(read_error)?;
            if batch.is_empty() {
                self.ended = true;
            }
            self.buffer.extend(batch);
        }
        Ok(())
    }
}

pub(super) fn read_error(e: crate::shards::read::ReadError) -> RouterError {
    match e {
        crate::shards::read::ReadError::Mongo { source, .. }
        | crate::shards::read::ReadError::Write { source, .. } => RouterError::Mongo(source),
        crate::shards::read::ReadError::UnknownShard(u) => RouterError::UnknownShard(u.0),
    }
}

impl Router {
    /// Opens a read of many documents. In `revert_switch` it waits, as writes do, for the
    /// phase to move on, up to the hold timeout ([`RouterError::ReadHeld`]).
    pub async fn query(&self, query: Query) -> Result<QueryCursor, RouterError> {
        let started = std::time::Instant::now();
        let result = self.query_held(&query).await;
        self.inner.record("query", started, result.is_ok());
        result
    }

    async fn query_held(&self, query: &Query) -> Result<QueryCursor, RouterError> {
        let wait_until = Instant::now() + self.inner.config.hold_timeout;
        let mut epochs = self.inner.epochs.subscribe();
        loop {
            self.inner.check_lease()?;
            {
                let snapshot = self.inner.snapshot.read().await;
                self.inner.check_open()?;
                let deadline = self
                    .inner
                    .step_deadline()
                    .ok_or(RouterError::RoutingStale)?;
                if let Some(cursor) = open(&self.inner, &snapshot, query, deadline).await? {
                    return Ok(cursor);
                }
            }
            epochs.borrow_and_update();
            if tokio::time::timeout_at(wait_until, epochs.changed())
                .await
                .is_err()
            {
                return Err(RouterError::ReadHeld(self.inner.config.hold_timeout));
            }
        }
    }

    /// The next at most `n` documents of `cursor` in its order, as the application sees them
    /// (without `_reshard`); an empty batch at the end. Fails with
    /// [`RouterError::CursorOutdated`] once the migration moved to a phase whose reads the
    /// cursor's plan does not match.
    pub async fn next_batch(
        &self,
        cursor: &mut QueryCursor,
        n: usize,
    ) -> Result<Vec<Document>, RouterError> {
        let started = std::time::Instant::now();
        let result = async {
            self.inner.check_lease()?;
            let snapshot = self.inner.snapshot.read().await;
            self.inner.check_open()?;
            if !protocol::cursor_continues(cursor.planned, snapshot.phase) {
                return Err(RouterError::CursorOutdated {
                    planned: cursor.planned,
                    now: snapshot.phase,
                });
            }
            let deadline = self
                .inner
                .step_deadline()
                .ok_or(RouterError::RoutingStale)?;
            cursor.take(n, deadline).await
        }
        .await;
        self.inner.record("query_more", started, result.is_ok());
        result
    }
}

/// Opens the reads of `query` under `snapshot`: `None` while the phase holds many-document
/// reads.
async fn open(
    inner: &Inner,
    snapshot: &Snapshot,
    query: &Query,
    deadline: Instant,
) -> Result<Option<QueryCursor>, RouterError> {
    let plan = protocol::query_plan(snapshot.phase);
    let (streamed, merged_source) = match plan {
        QueryPlan::Held => return Ok(None),
        QueryPlan::One(side) => (side, false),
        QueryPlan::TargetThenSource => (Side::Target, true),
    };
    let tenant_key = snapshot.target.tenant_key.clone();
    let tenants: Vec<(Bson, KeyValue)> = query
        .tenants
        .iter()
        .map(|t| Ok((t.clone(), KeyValue::from_bson(t)?)))
        .collect::<Result<_, RouterError>>()?;
    let live = crate::ids::and(query.filter.clone(), envelope::live_documents());
    let streamed_version = side_version(snapshot, streamed);

    // 1. The source's matches, whole, and 2. which of them the target holds.
    let mut survivors = Vec::new();
    if merged_source {
        let source = side_version(snapshot, Side::Source);
        let mut candidates: Vec<(KeyValue, Document)> = Vec::new();
        for (tenant, tenant_kv) in &tenants {
            for location in list::tenant_locations(&source, tenant_kv) {
                let mut scan = inner
                    .shards
                    .query(
                        &location,
                        tenant_filter(&tenant_key, tenant, &live),
                        QueryOptions {
                            sort: None,
                            ..options(query, None, deadline)
                        },
                    )
                    .await
                    .map_err(read_error)?;
                loop {
                    let batch = tokio::time::timeout_at(deadline, scan.next_batch())
                        .await
                        .map_err(|_| RouterError::RoutingStale)?
                        .map_err(read_error)?;
                    if batch.is_empty() {
                        break;
                    }
                    for doc in batch {
                        if places(&source, tenant_kv, &doc, &location) {
                            candidates.push((tenant_kv.clone(), doc));
                        }
                    }
                    if candidates.len() > MAX_SOURCE_MATCHES {
                        return Err(RouterError::QueryTooLarge(MAX_SOURCE_MATCHES));
                    }
                }
            }
        }
        let held = held_by_target(inner, snapshot, &candidates, deadline).await?;
        for (_, doc) in candidates {
            let key = doc.get("_id").map(crate::ids::key).unwrap_or_default();
            let target = if held.contains(&key) {
                Found::Unmatched
            } else {
                Found::Absent
            };
            let answer = protocol::query_answer(snapshot.phase, || target, || Found::Live(doc))?;
            survivors.extend(answer);
        }
        if let Some(order) = &query.order {
            survivors.sort_by(|a, b| order(a, b));
        }
    }

    // 3. The streamed side's matches, one cursor per location, opened after the check above.
    let streamed_locations: Vec<Location> = {
        let mut all = std::collections::BTreeSet::new();
        for (_, tenant_kv) in &tenants {
            all.extend(list::tenant_locations(&streamed_version, tenant_kv));
        }
        all.into_iter().collect()
    };
    // A location both versions use holds documents the streamed version does not place
    // there, which a limit would count: no limit then.
    let shared = merged_source && {
        let source = side_version(snapshot, Side::Source);
        tenants.iter().any(|(_, t)| {
            list::tenant_locations(&source, t)
                .iter()
                .any(|l| streamed_locations.contains(l))
        })
    };
    let limit = if shared || query.tenants.len() > 1 {
        None
    } else {
        query.limit
    };
    let tenant_values: Vec<Bson> = tenants.iter().map(|(t, _)| t.clone()).collect();
    let filter = doc! { "$and": [
        { tenant_key.clone(): { "$in": tenant_values } },
        live.clone(),
    ] };
    let mut streams = Vec::with_capacity(streamed_locations.len());
    for location in streamed_locations {
        let scan = inner
            .shards
            .query(&location, filter.clone(), options(query, limit, deadline))
            .await
            .map_err(read_error)?;
        streams.push(Stream {
            location,
            scan,
            buffer: VecDeque::new(),
            ended: false,
        });
    }
    let survivor_ids = survivors
        .iter()
        .filter_map(|d| d.get("_id").map(crate::ids::key))
        .collect();
    Ok(Some(QueryCursor {
        planned: snapshot.phase,
        tenant_key,
        version: streamed_version,
        survivors: survivors.into(),
        survivor_ids,
        returned_survivors: HashSet::new(),
        streams,
        order: query.order.clone(),
        snapshot: snapshot.clone(),
    }))
}

fn side_version(snapshot: &Snapshot, side: Side) -> Arc<RoutingVersion> {
    match side {
        Side::Source => Arc::clone(&snapshot.source),
        Side::Target => Arc::clone(&snapshot.target),
    }
}

fn tenant_filter(tenant_key: &str, tenant: &Bson, filter: &Document) -> Document {
    doc! { "$and": [ { tenant_key: tenant.clone() }, filter.clone() ] }
}

fn options(query: &Query, limit: Option<u64>, deadline: Instant) -> QueryOptions {
    QueryOptions {
        projection: query.projection.clone(),
        sort: query.sort.clone(),
        limit: limit.map(|l| l.min(i64::MAX as u64) as i64),
        batch_size: query.batch_size.max(1),
        max_time: Some(
            deadline
                .saturating_duration_since(Instant::now())
                .max(std::time::Duration::from_millis(1)),
        ),
    }
}

/// Whether `version` places `doc` (of `tenant`) at `location`: a location both versions use
/// holds documents of either, and each counts only for the version that places it there. A
/// document whose `_id` cannot be routed counts where the tenant has one location only.
fn places(
    version: &RoutingVersion,
    tenant: &KeyValue,
    doc: &Document,
    location: &Location,
) -> bool {
    let Some(id) = doc.get("_id") else {
        return false;
    };
    match KeyValue::from_bson(id) {
        Ok(id) => version
            .locate(tenant, &id)
            .is_ok_and(|l| l.locations.contains(location)),
        Err(_) => list::tenant_locations(version, tenant) == [location.clone()],
    }
}

/// Which of the source's candidates the target holds (live or tombstone) where the target
/// version places each: their keys ([`crate::ids::key`]).
async fn held_by_target(
    inner: &Inner,
    snapshot: &Snapshot,
    candidates: &[(KeyValue, Document)],
    deadline: Instant,
) -> Result<HashSet<Vec<u8>>, RouterError> {
    let mut by_location: std::collections::BTreeMap<Location, Vec<Bson>> = Default::default();
    for (tenant, doc) in candidates {
        let Some(id) = doc.get("_id") else { continue };
        let Ok(id_kv) = KeyValue::from_bson(id) else {
            continue;
        };
        for location in snapshot.target.locate(tenant, &id_kv)?.locations {
            by_location.entry(location).or_default().push(id.clone());
        }
    }
    let mut held = HashSet::new();
    for (location, ids) in by_location {
        for chunk in ids.chunks(1000) {
            let found = tokio::time::timeout_at(
                deadline,
                inner
                    .shards
                    .find_by_ids(&location, chunk, Some(doc! { "_id": 1 })),
            )
            .await
            .map_err(|_| RouterError::RoutingStale)?
            .map_err(read_error)?;
            held.extend(found.into_keys());
        }
    }
    Ok(held)
}

impl QueryCursor {
    /// The phase the cursor's reads were planned in.
    pub fn planned(&self) -> Phase {
        self.planned
    }

    async fn take(&mut self, n: usize, deadline: Instant) -> Result<Vec<Document>, RouterError> {
        let mut out = Vec::with_capacity(n.min(1024));
        while out.len() < n {
            for s in self.streams.iter_mut() {
                s.fill(deadline).await?;
            }
            let Some(from) = self.pick() else { break };
            match from {
                Pick::Survivor => {
                    let doc = self.survivors.pop_front().expect("picked");
                    if let Some(id) = doc.get("_id") {
                        self.returned_survivors.insert(crate::ids::key(id));
                    }
                    out.push(self.snapshot.view(doc));
                }
                Pick::Stream(i) => {
                    let doc = self.streams[i].buffer.pop_front().expect("picked");
                    if let Some(doc) = self.judge(i, doc) {
                        out.push(self.snapshot.view(doc));
                    }
                }
            }
        }
        Ok(out)
    }

    /// Whether a document a stream returned is in the answer: placed where it was read, and
    /// of an id no survivor was returned for (a target image that arrived after its
    /// survivor was returned); one that supersedes a survivor not yet returned takes its
    /// place.
    fn judge(&mut self, stream: usize, doc: Document) -> Option<Document> {
        let location = &self.streams[stream].location;
        let tenant = doc
            .get(&self.tenant_key)
            .and_then(|t| KeyValue::from_bson(t).ok())?;
        if !places(&self.version, &tenant, &doc, location) {
            return None;
        }
        let key = crate::ids::key(doc.get("_id")?);
        if self.survivor_ids.remove(&key) {
            if self.returned_survivors.contains(&key) {
                return None;
            }
            self.survivors
                .retain(|s| s.get("_id").map(crate::ids::key).as_ref() != Some(&key));
        }
        Some(doc)
    }

    /// Where the next document in the merge's order comes from.
    fn pick(&self) -> Option<Pick> {
        let mut best: Option<(Pick, &Document)> =
            self.survivors.front().map(|d| (Pick::Survivor, d));
        for (i, s) in self.streams.iter().enumerate() {
            let Some(head) = s.buffer.front() else {
                continue;
            };
            let better = match (&best, &self.order) {
                (None, _) => true,
                (Some((_, b)), Some(order)) => order(head, b) == Ordering::Less,
                // Without an order, the streams come first, one after the other.
                (Some((Pick::Survivor, _)), None) => true,
                (Some(_), None) => false,
            };
            if better {
                best = Some((Pick::Stream(i), head));
            }
        }
        best.map(|(p, _)| p)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Pick {
    Survivor,
    Stream(usize),
}

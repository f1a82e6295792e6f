//! A full reconciliation's reads: every source location once per `_id` range
//! ([`verify_ranges`], [`full_sources`]), each range's cursors merged by id ([`FullRead`]).

use std::collections::{BTreeMap, BTreeSet};

use mongodb::bson::{Bson, Document, RawDocumentBuf};

use crate::envelope::{self};
use crate::ids;
use crate::routing::{KeyValue, Location};
use crate::store::partitions::{NewPartition, Partition};

use super::*;

/// What a full run reads a source location as: the tenants in its scope (`None`: every
/// document) and the backfill partitions planned there, for the completeness check: each
/// source document read is counted under the one whose range holds it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SourceScope {
    pub tenants: Option<Vec<KeyValue>>,
    pub partitions: Vec<(ids::IdRange, i64)>,
}

/// The source locations a full run reads, as the backfill planned them (its partitions and
/// their tenant filter, one per location).
pub fn full_sources(backfill: &[Partition]) -> Result<BTreeMap<Location, SourceScope>, String> {
    let mut sources: BTreeMap<Location, SourceScope> = BTreeMap::new();
    for p in backfill {
        let tenants: Option<Vec<KeyValue>> = p
            .tenant_filter
            .as_ref()
            .map(|t| serde_json::from_value(t.clone()))
            .transpose()
            .map_err(|e| format!("partition {}: tenant filter unreadable: {e}", p.id))?;
        let location = p.location();
        let scope = sources
            .entry(location.clone())
            .or_insert_with(|| SourceScope {
                tenants: tenants.clone(),
                partitions: Vec::new(),
            });
        if scope.tenants != tenants {
            return Err(format!(
                "the backfill partitions of {location} scan different tenants (partition {})",
                p.id
            ));
        }
        scope.partitions.push((p.range()?, p.id));
    }
    Ok(sources)
}

/// The ranges of a full run's `verify` partitions: `_id` ranges over which every location is
/// read together ([`FullRead`]), so that each location is read once per range, not once per
/// source location sharing it. They are the backfill ranges of the source location cut into
/// the most partitions (every location's ranges cover every `_id`), each sized at its share
/// of everything the backfill read. The partitions name no location
/// ([`crate::store::partitions::EVERY_LOCATION`]).
pub fn verify_ranges(backfill: &[Partition]) -> Vec<NewPartition> {
    use crate::store::partitions::EVERY_LOCATION;
    let read = |p: &Partition| (p.scanned + p.skipped_foreign).max(0);
    let total: i64 = backfill.iter().map(read).sum();
    let mut by_location: BTreeMap<Location, Vec<&Partition>> = BTreeMap::new();
    for p in backfill {
        by_location.entry(p.location()).or_default().push(p);
    }
    let whole = || NewPartition {
        source_shard: EVERY_LOCATION.to_owned(),
        source_collection: EVERY_LOCATION.to_owned(),
        id_type: ids::ANY_TYPE.to_owned(),
        lower_bound: None,
        upper_bound: None,
        tenant_filter: None,
        approx_documents: Some(total),
    };
    let Some(donor) = by_location
        .values()
        .max_by_key(|ps| (ps.len(), ps.iter().map(|p| read(p)).sum::<i64>()))
    else {
        return Vec::new();
    };
    let ranges: Result<Vec<(ids::IdRange, &Partition)>, String> =
        donor.iter().map(|p| Ok((p.range()?, *p))).collect();
    let Ok(mut ranges) = ranges else {
        return vec![whole()];
    };
    if donor.len() == 1 || ranges.iter().any(|(r, _)| r.bracket.is_some()) {
        return vec![whole()];
    }
    ranges.sort_by(|(a, _), (b, _)| match (&a.lower, &b.lower) {
        (None, None) => std::cmp::Ordering::Equal,
        (None, _) => std::cmp::Ordering::Less,
        (_, None) => std::cmp::Ordering::Greater,
        (Some(a), Some(b)) => ids::compare(a, b),
    });
    let donor_total: i64 = donor.iter().map(|p| read(p)).sum();
    let k = ranges.len() as i64;
    ranges
        .into_iter()
        .map(|(range, p)| NewPartition {
            lower_bound: range.lower.as_ref().map(ids::encode),
            upper_bound: range.upper.as_ref().map(ids::encode),
            approx_documents: Some(if donor_total > 0 {
                (read(p) as f64 * total as f64 / donor_total as f64).round() as i64
            } else {
                total / k
            }),
            ..whole()
        })
        .collect()
}

/// One cursor of a full run's read: a location over the range, in `_id` order, read as a
/// source (its documents are checked against the target), as a target (moved documents are
/// looked up in it, and what reshard wrote there is checked for placement), or as both where
/// one filter serves both (a collection both layouts share).
pub(super) struct Lane {
    location: Location,
    source: bool,
    target: bool,
    scan: crate::shards::read::Scan<RawDocumentBuf>,
    buffer: std::collections::VecDeque<Read>,
    ended: bool,
}

/// A document a full run read: its bytes, and the fields its judgement reads (`_id`, the
/// envelope, both versions' routing fields, tenant keys and id fields), parsed. The rest is
/// compared as bytes ([`envelope::content_differences_raw`]) and parsed only when a copy
/// differs from its source.
pub(super) struct Read {
    raw: RawDocumentBuf,
    head: Document,
}

/// What a full run's read checked in one batch.
#[derive(Default)]
pub struct FullBatch {
    /// The last `_id` every location was read up to (`None`: nothing was read).
    pub last_id: Option<Bson>,
    /// Each source location's documents, judged.
    pub checked: BTreeMap<Location, Vec<(Bson, Outcome)>>,
    /// The placement of the target documents reshard wrote, judged.
    pub placement: Vec<(Location, Bson, Outcome)>,
    /// Source documents read, by the backfill partition whose range holds them.
    pub reads: BTreeMap<i64, u64>,
    /// Source documents read.
    pub source_documents: u64,
    /// Every location was read to the end of the range.
    pub done: bool,
}

/// A full run's read of one `_id` range: every source location and every target location
/// through one cursor each ([`Lane`]), all in `_id` order and merged, so that each step hands
/// over the documents with the next `_id` wherever they are. A moved document is looked up at
/// its target by stepping forward rather than by a query, and each location is read once per
/// range, however many source locations share a target: the cost of a raw read of both sides.
/// A target document is checked for placement once, when the source location it came from
/// (the first the source version lists) is another location this read checks.
pub struct FullRead {
    lanes: Vec<Lane>,
    sources: BTreeMap<Location, SourceScope>,
    /// The fields of a [`Read`]'s head ([`crate::copy::steps::head_fields`]).
    head: Vec<String>,
}

impl FullRead {
    /// Opens every cursor at once (a server may answer a sorted query only once it has read
    /// the whole range, as the local stand-in does: those waits overlap rather than add up).
    /// Source locations are read with their own tenants, target locations with every tenant
    /// any source location reads.
    pub async fn open(
        scene: &Scene,
        sources: BTreeMap<Location, SourceScope>,
        range: &ids::IdRange,
        resume: Option<&Bson>,
        batch_size: usize,
    ) -> Result<FullRead, ReadError> {
        let filter = |tenants: &Option<Vec<KeyValue>>| {
            let tenant = match tenants {
                Some(t) => crate::scope::tenant_filter(&scene.from.tenant_key, t),
                None => Document::new(),
            };
            ids::and(tenant, range.filter(resume))
        };
        let target_tenants: Option<Vec<KeyValue>> = sources
            .values()
            .map(|s| s.tenants.clone())
            .collect::<Option<Vec<Vec<KeyValue>>>>()
            .map(|all| {
                let set: BTreeSet<KeyValue> = all.into_iter().flatten().collect();
                set.into_iter().collect()
            });
        let targets: BTreeSet<Location> = scene.to.locations().into_iter().collect();
        let mut planned: Vec<(Location, bool, bool, Document)> = Vec::new();
        for (location, scope) in &sources {
            let both = targets.contains(location) && scope.tenants == target_tenants;
            planned.push((location.clone(), true, both, filter(&scope.tenants)));
        }
        for target in targets {
            let read_as_source = sources
                .get(&target)
                .is_some_and(|s| s.tenants == target_tenants);
            if !read_as_source {
                planned.push((target, false, true, filter(&target_tenants)));
            }
        }
        let size = std::sync::Arc::new(move || batch_size);
        let scans = futures::future::try_join_all(
            planned
                .iter()
                .map(|(at, _, _, f)| scene.shards.scan_raw(at, f.clone(), size.clone())),
        )
        .await?;
        let lanes = planned
            .into_iter()
            .zip(scans)
            .map(|((location, source, target, _), scan)| Lane {
                location,
                source,
                target,
                scan,
                buffer: Default::default(),
                ended: false,
            })
            .collect();
        let head = crate::copy::steps::head_fields(&scene.from, &scene.to)
            .into_iter()
            .map(str::to_owned)
            .collect();
        Ok(FullRead {
            lanes,
            sources,
            head,
        })
    }

    /// The documents with the next `_id` across every lane (lane index, document), or `None`
    /// once every lane is read.
    async fn next_column(&mut self) -> Result<Option<(Bson, Vec<(usize, Read)>)>, ReadError> {
        let fields: Vec<&str> = self.head.iter().map(String::as_str).collect();
        for lane in &mut self.lanes {
            while lane.buffer.is_empty() && !lane.ended {
                let batch = lane.scan.next_batch().await?;
                lane.ended = batch.is_empty();
                for raw in batch {
                    let head = envelope::head(&raw, &fields).map_err(|e| ReadError::Mongo {
                        location: lane.location.clone(),
                        source: mongodb::error::Error::custom(format!(
                            "a document read is not valid BSON: {e}"
                        )),
                    })?;
                    lane.buffer.push_back(Read { raw, head });
                }
            }
        }
        fn id_of(r: &Read) -> &Bson {
            const NULL: &Bson = &Bson::Null;
            r.head.get("_id").unwrap_or(NULL)
        }
        let Some(next) = self
            .lanes
            .iter()
            .filter_map(|l| l.buffer.front())
            .map(id_of)
            .min_by(|a, b| ids::compare(a, b))
            .cloned()
        else {
            return Ok(None);
        };
        let mut column = Vec::new();
        for (i, lane) in self.lanes.iter_mut().enumerate() {
            let here = lane
                .buffer
                .front()
                .is_some_and(|r| ids::compare(id_of(r), &next).is_eq());
            if here {
                column.push((i, lane.buffer.pop_front().expect("a front")));
            }
        }
        Ok(Some((next, column)))
    }

    /// Reads and checks up to about `max` documents (of either side).
    pub async fn next_batch(&mut self, scene: &Scene, max: usize) -> Result<FullBatch, ReadError> {
        let mut batch = FullBatch::default();
        let mut handled = 0;
        while handled < max.max(1) {
            let Some((id, column)) = self.next_column().await? else {
                batch.done = true;
                break;
            };
            handled += column.len();
            self.judge(scene, &column, &mut batch);
            batch.last_id = Some(id);
        }
        Ok(batch)
    }

    /// Judges one `_id`'s documents: each read as a source against the target documents
    /// beside it, each reshard wrote at a target for placement.
    fn judge(&self, scene: &Scene, column: &[(usize, Read)], batch: &mut FullBatch) {
        for (i, read) in column {
            let lane = &self.lanes[*i];
            if !lane.source {
                continue;
            }
            let location = &lane.location;
            let (id, judged) = judge_source(scene, location, &read.head);
            batch.source_documents += 1;
            let counted_under = self
                .sources
                .get(location)
                .and_then(|s| s.partitions.iter().find(|(r, _)| r.contains(&id)));
            if let Some((_, partition)) = counted_under {
                *batch.reads.entry(*partition).or_default() += 1;
            }
            let outcome = judged.unwrap_or_else(|goal| {
                let target_doc = |at: &dyn Fn(&Location) -> bool| {
                    column.iter().find(|(j, _)| {
                        let l = &self.lanes[*j];
                        l.target && at(&l.location)
                    })
                };
                match target_doc(&|l| *l == goal) {
                    Some((_, found)) => judge_found(&found.head, &goal, || {
                        envelope::content_differences_raw(
                            &read.raw,
                            &found.raw,
                            &scene.from,
                            &scene.to,
                        )
                        .unwrap_or_else(|e| vec![format!("(not valid BSON: {e})")])
                    }),
                    None => {
                        let elsewhere = target_doc(&|l| *l != goal && l != location)
                            .map(|(j, _)| self.lanes[*j].location.clone());
                        judge_absent(&goal, elsewhere, location)
                    }
                }
            });
            batch
                .checked
                .entry(location.clone())
                .or_default()
                .push((id, outcome));
        }
        for (i, Read { head: doc, .. }) in column {
            let lane = &self.lanes[*i];
            if !lane.target || !doc.contains_key(envelope::META) {
                continue;
            }
            // A document the source version puts here is a source document (checked as
            // one where it is read as a source), not a copy.
            let came_from_a_source_read_here = keys_of(&scene.from, doc)
                .and_then(|(t, i)| scene.from.locate(&t, &i).ok())
                .and_then(|l| l.locations.first().cloned())
                .is_some_and(|l| l != lane.location && self.sources.contains_key(&l));
            if !came_from_a_source_read_here {
                continue;
            }
            if let Some(outcome) = judge_placement(scene, &lane.location, doc) {
                let id = doc.get("_id").cloned().unwrap_or(Bson::Null);
                batch.placement.push((lane.location.clone(), id, outcome));
            }
        }
    }
}

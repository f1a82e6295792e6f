//! Reconciliation: evidence that the target holds everything the source held (the project's design document
//! "Reconciliation"), and repair of what it finds.
//!
//! A run checks, per source location in the backfill's scope:
//! - completeness: a fresh count of each backfill partition equals its ledger (skipped where
//!   the source collection is also a target location and still receives writes; the presence
//!   checks carry completeness there);
//! - presence and content of sampled (or, with `full`, all) source documents: a moved
//!   document exists at the location the target version computes, as a document or a
//!   tombstone; a pristine copy (`_reshard.src = "copy"`) equals its source apart from the
//!   routing fields and `_reshard`; an application-written one is counted as superseded;
//!   a document that stays has the target's routing field;
//! - placement: sampled target documents sit where the target version puts them.
//!
//! Samples are stratified (by source shard, tenant, or target bucket) so a small hot tenant is
//! not missed: with k clean samples in a stratum its defect rate is below 3/k at 95%
//! confidence (the rule of three). Findings are checked again after a short delay and only
//! the ones that persist are reported, so a write in flight is not a false alarm.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::time::{Duration, Instant};

use futures::TryStreamExt;
use mongodb::bson::{doc, Bson, Document, RawDocumentBuf};
use serde::Serialize;
use serde_json::json;

use crate::backfill::plan;
use crate::disposition::{self, Disposition};
pub use crate::envelope::content_differences;
use crate::envelope::{self, is_tombstone, Writer};
use crate::ids;
use crate::protocol::{self, Answer, Payload, Side, Step};
use crate::routing::{KeyValue, Location, MoveScope, RoutingVersion};
use crate::scope::location_scope;
use crate::settings::MigrationSettings;
pub use crate::shards::read::ReadError;
use crate::shards::Shards;
use crate::store::partitions::{Claim, NewPartition, Partition};
use crate::store::reconcile::{FindingKind, NewFinding, VerifiedBatch};
use crate::store::StoreError;
use crate::throttle::AdaptiveRate;

/// How samples are grouped.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Stratify {
    /// Per source location.
    Shard,
    /// Per tenant (the largest `max_strata` tenants each; the rest together).
    Tenant,
    /// Per target sub-bucket.
    Bucket,
}

/// How a run samples and checks.
#[derive(Clone, Debug, Serialize)]
pub struct ReconcileOptions {
    /// Samples per stratum.
    pub sample: usize,
    /// Check every source document instead of samples.
    pub full: bool,
    pub stratify: Stratify,
    /// How long to wait before checking findings again.
    #[serde(with = "millis")]
    pub recheck_delay: Duration,
    /// At most this many tenant strata per location.
    pub max_strata: usize,
    /// Skip the presence, content and placement checks (a leased full run did them
    /// partition by partition, placement in its merge with the targets); counts still run.
    #[serde(skip)]
    pub presence_done: bool,
    /// How many source documents a leased full run read, by backfill partition (with
    /// `presence_done`): the completeness check compares those with the ledger instead of
    /// counting again, and a partition the run counted nothing in held nothing.
    #[serde(skip)]
    pub counted: BTreeMap<i64, i64>,
}

/// A partition's location and `_id` range, as a key that a backfill partition and a verify
/// partition planned by an earlier version of reshard (one per backfill partition) share.
pub type RangeKey = (
    String,
    String,
    Option<Vec<u8>>,
    Option<Vec<u8>>,
    Option<String>,
);

pub fn range_key(p: &Partition) -> RangeKey {
    (
        p.location().to_string(),
        p.id_type.clone(),
        p.lower_bound.clone(),
        p.upper_bound.clone(),
        p.tenant_filter.as_ref().map(|t| t.to_string()),
    )
}

/// The key under which a verify partition planned by an earlier version of reshard counted the
/// source documents it read (its backfill partition's range, [`range_key`]).
pub const SOURCE_READ: &str = "source_documents_read";

mod millis {
    pub fn serialize<S: serde::Serializer>(
        d: &std::time::Duration,
        s: S,
    ) -> Result<S::Ok, S::Error> {
        s.serialize_u64(d.as_millis() as u64)
    }
}

impl Default for ReconcileOptions {
    fn default() -> Self {
        ReconcileOptions {
            sample: 100,
            full: false,
            stratify: Stratify::Shard,
            recheck_delay: Duration::from_secs(2),
            max_strata: 1_000,
            presence_done: false,
            counted: BTreeMap::new(),
        }
    }
}

/// What the shards are and which versions apply.
pub struct Scene {
    pub from: RoutingVersion,
    pub to: RoutingVersion,
    pub shards: Shards,
    /// [`ids::key`]s of the `_id`s of dead letters an operator skipped: known to be absent.
    pub skipped: HashSet<Vec<u8>>,
}

/// How one source document checked out.
#[derive(Clone, Debug, PartialEq)]
pub enum Outcome {
    /// Its pristine copy is in place and equal.
    Copied,
    /// The application rewrote it in the target.
    Superseded,
    /// It was deleted (a tombstone stands in the target).
    Deleted,
    /// It never moves, and carries the target's routing field.
    Stayed,
    /// Not a source document here (a tombstone, a target document in a shared collection),
    /// or a skipped dead letter.
    Ignored,
    /// A target document (written by reshard) sits where the target version puts it.
    Placed,
    /// Something is wrong.
    Finding {
        kind: FindingKind,
        details: serde_json::Value,
    },
}

fn read_err(location: &Location) -> impl Fn(mongodb::error::Error) -> ReadError + '_ {
    ReadError::at(location)
}

fn keys_of(version: &RoutingVersion, doc: &Document) -> Option<(KeyValue, KeyValue)> {
    version.document_keys(doc).ok()
}

/// What a source document read at `location` is, before the target is consulted
/// ([`disposition::of`]): settled (a tombstone or a document of the other layout is ignored,
/// as is a skipped dead letter; a document that cannot be routed is a finding; one that stays
/// must carry its routing field), or a document that moved and must be looked for at its
/// target (`Err(target)`).
fn judge_source(
    scene: &Scene,
    location: &Location,
    doc: &Document,
) -> (Bson, Result<Outcome, Location>) {
    let id = doc.get("_id").cloned().unwrap_or(Bson::Null);
    if !scene.skipped.is_empty() && scene.skipped.contains(&ids::key(&id)) {
        return (id, Ok(Outcome::Ignored));
    }
    let judged = match disposition::of(Side::Source, &scene.from, &scene.to, location, doc) {
        Disposition::Tombstone { .. } | Disposition::Foreign | Disposition::Placed { .. } => {
            Ok(Outcome::Ignored)
        }
        Disposition::Unroutable { reason } => Ok(Outcome::Finding {
            kind: FindingKind::Unroutable,
            details: json!({ "location": location.to_string(), "reason": reason }),
        }),
        Disposition::Stays {
            stamp: Some((field, _)),
        } => Ok(Outcome::Finding {
            kind: FindingKind::Mismatched,
            details: json!({
                "location": location.to_string(),
                "reason": format!("the routing field {field:?} is not stamped"),
            }),
        }),
        Disposition::Stays { stamp: None } => Ok(Outcome::Stayed),
        Disposition::Moves { target, .. } => Err(target),
    };
    (id, judged)
}

/// What a moved document's image at its target `goal` says (`found`: its envelope at least):
/// a tombstone (deleted), the application's write (superseded), or a copy that must equal the
/// source (`differences`: the fields in which it does not, [`content_differences`]).
fn judge_found(
    found: &Document,
    goal: &Location,
    differences: impl FnOnce() -> Vec<String>,
) -> Outcome {
    if is_tombstone(found) {
        return Outcome::Deleted;
    }
    match envelope::writer(found) {
        Some(Writer::App) => Outcome::Superseded,
        _ => {
            let diff = differences();
            if diff.is_empty() {
                Outcome::Copied
            } else {
                Outcome::Finding {
                    kind: FindingKind::Mismatched,
                    details: json!({ "location": goal.to_string(), "fields": diff }),
                }
            }
        }
    }
}

/// Whether a document found at target location `target` sits where the target version puts
/// it ([`Outcome::Placed`] or a misplaced finding); `None` for a document that cannot say
/// (unroutable keys). In a collection both layouts share, a source document (written
/// through the source path before the switch, so it carries `_reshard` too) stays until
/// cleanup.
fn judge_placement(scene: &Scene, target: &Location, d: &Document) -> Option<Outcome> {
    let (t, i) = keys_of(&scene.to, d)?;
    let l = scene.to.locate(&t, &i).ok()?;
    let source_here = keys_of(&scene.from, d)
        .and_then(|(t, i)| scene.from.locate(&t, &i).ok())
        .is_some_and(|s| s.locations.contains(target));
    Some(if l.locations.contains(target) || source_here {
        Outcome::Placed
    } else {
        Outcome::Finding {
            kind: FindingKind::Misplaced,
            details: json!({ "found": target.to_string(), "expected": l.locations[0].to_string() }),
        }
    })
}

/// A moved document absent from its target `goal`: misplaced when another target location
/// (`elsewhere`) holds it, else missing.
fn judge_absent(goal: &Location, elsewhere: Option<Location>, source: &Location) -> Outcome {
    match elsewhere {
        Some(at) => Outcome::Finding {
            kind: FindingKind::Misplaced,
            details: json!({ "expected": goal.to_string(), "found": at.to_string() }),
        },
        None => Outcome::Finding {
            kind: FindingKind::Missing,
            details: json!({ "expected": goal.to_string(), "source": source.to_string() }),
        },
    }
}

/// Checks source documents read at `location` against the target, by their disposition
/// ([`judge_source`]): a document that moved must be at its target, as a copy equal to it,
/// the application's write, or a tombstone. One `$in` query per target location, and one
/// more per other target location for the ids not found where they belong: the lookups of a
/// sample, scattered over the collection.
pub async fn check_batch(
    scene: &Scene,
    location: &Location,
    docs: &[Document],
) -> Result<Vec<(Bson, Outcome)>, ReadError> {
    let mut out: Vec<(Bson, Outcome)> = Vec::with_capacity(docs.len());
    let mut moved: BTreeMap<Location, Vec<usize>> = BTreeMap::new();
    for doc in docs {
        let (id, judged) = judge_source(scene, location, doc);
        let outcome = match judged {
            Ok(outcome) => outcome,
            Err(target) => {
                moved.entry(target).or_default().push(out.len());
                Outcome::Ignored
            }
        };
        out.push((id, outcome));
    }
    let all_targets = scene.to.locations();
    for (goal, indexes) in moved {
        let wanted: Vec<Bson> = indexes.iter().map(|&i| out[i].0.clone()).collect();
        let found = find_by_ids(scene, &goal, &wanted).await?;
        let mut absent: Vec<usize> = Vec::new();
        for &i in &indexes {
            match found.get(&ids::key(&out[i].0)) {
                None => absent.push(i),
                Some(t) => {
                    out[i].1 = judge_found(t, &goal, || {
                        content_differences(&docs[i], t, &scene.from, &scene.to)
                    })
                }
            }
        }
        for i in absent {
            let id = out[i].0.clone();
            let mut elsewhere = None;
            for other in all_targets.iter().filter(|l| **l != goal) {
                if other == location {
                    continue;
                }
                if !find_by_ids(scene, other, std::slice::from_ref(&id))
                    .await?
                    .is_empty()
                {
                    elsewhere = Some(other.clone());
                    break;
                }
            }
            out[i].1 = judge_absent(&goal, elsewhere, location);
        }
    }
    Ok(out)
}

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
struct Lane {
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
struct Read {
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

/// Tallies a full run's placement checks into `strata` (`placement:<target>`, created as
/// needed) and `result`.
pub fn tally_placement(
    placement: Vec<(Location, Bson, Outcome)>,
    result: &mut RunResult,
    strata: &mut BTreeMap<String, Stratum>,
) {
    for (target, id, outcome) in placement {
        let name = format!("placement:{target}");
        let stratum = strata.entry(name.clone()).or_insert_with(|| Stratum {
            name,
            ..Stratum::default()
        });
        *result
            .counts
            .entry(outcome_name(&outcome).to_owned())
            .or_default() += 1;
        stratum.samples += 1;
        // Placement findings name where the document was found, not a source: the recheck
        // looks there ([`recheck`]).
        if let Outcome::Finding { kind, details } = outcome {
            stratum.defects += 1;
            result
                .findings
                .push(finding(kind, &id, &stratum.name, details));
        }
    }
}

/// Tallies a full run's batch: each source location's checks into its stratum
/// (`full:<location>`, created as needed), and the placement checks.
pub fn tally_full(
    batch: &mut FullBatch,
    result: &mut RunResult,
    strata: &mut BTreeMap<String, Stratum>,
) {
    for (location, checked) in std::mem::take(&mut batch.checked) {
        let name = format!("full:{location}");
        let stratum = strata.entry(name.clone()).or_insert_with(|| Stratum {
            name,
            ..Stratum::default()
        });
        tally(result, stratum, checked, &location);
    }
    tally_placement(std::mem::take(&mut batch.placement), result, strata);
}

async fn find_by_ids(
    scene: &Scene,
    at: &Location,
    wanted: &[Bson],
) -> Result<std::collections::HashMap<Vec<u8>, Document>, ReadError> {
    scene.shards.find_by_ids(at, wanted, None).await
}

/// Per-stratum tally.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Stratum {
    pub name: String,
    pub samples: u64,
    pub defects: u64,
    /// Upper bound of the defect rate at 95% confidence when `defects` is 0 (3/k).
    pub bound: Option<f64>,
}

/// The rule of three: with `k` clean samples, the defect rate is below 3/k at 95% confidence.
pub fn defect_bound(k: u64) -> Option<f64> {
    (k > 0).then(|| (3.0 / k as f64).min(1.0))
}

/// The result of a run before it is stored.
#[derive(Clone, Debug, Default)]
pub struct RunResult {
    pub findings: Vec<NewFinding>,
    pub strata: Vec<Stratum>,
    pub counts: BTreeMap<String, u64>,
    pub counts_checked: Vec<serde_json::Value>,
    pub rechecked_away: u64,
}

/// Samples of one location, grouped by stratum name.
async fn sample_location(
    scene: &Scene,
    location: &Location,
    filter: &Document,
    options: &ReconcileOptions,
) -> Result<Vec<(String, Vec<Document>)>, ReadError> {
    let coll = scene.shards.collection(location)?;
    let sample = |filter: Document, size: usize| {
        let coll = coll.clone();
        async move {
            let mut pipeline = Vec::new();
            if !filter.is_empty() {
                pipeline.push(doc! { "$match": filter });
            }
            pipeline.push(doc! { "$sample": { "size": size as i64 } });
            let docs: Vec<Document> = coll.aggregate(pipeline).await?.try_collect().await?;
            Ok::<_, mongodb::error::Error>(docs)
        }
    };
    let k = options.sample.max(1);
    // Where the source collection is also a target location, copies that moved in are not
    // source documents: do not spend samples on them.
    let mut filter = filter.clone();
    if scene.to.locations().contains(location) {
        filter.insert(format!("{}.src", envelope::META), doc! { "$ne": "copy" });
    }
    let filter = &filter;
    match options.stratify {
        Stratify::Shard => Ok(vec![(
            format!("shard:{location}"),
            sample(filter.clone(), k)
                .await
                .map_err(read_err(location))?,
        )]),
        Stratify::Tenant => {
            let key = &scene.from.tenant_key;
            let mut pipeline = Vec::new();
            if !filter.is_empty() {
                pipeline.push(doc! { "$match": filter.clone() });
            }
            pipeline.push(doc! { "$sortByCount": format!("${key}") });
            let groups: Vec<Document> = coll
                .aggregate(pipeline)
                .await
                .map_err(read_err(location))?
                .try_collect()
                .await
                .map_err(read_err(location))?;
            let mut out = Vec::new();
            let mut named = Vec::new();
            for g in groups.iter().take(options.max_strata) {
                let tenant = g.get("_id").cloned().unwrap_or(Bson::Null);
                let mut f = filter.clone();
                f.insert(key.clone(), tenant.clone());
                let docs = sample(f, k).await.map_err(read_err(location))?;
                out.push((format!("tenant:{}", ids::text(&tenant)), docs));
                named.push(tenant);
            }
            if groups.len() > options.max_strata {
                let mut f = filter.clone();
                f.insert(key.clone(), doc! { "$nin": named });
                let docs = sample(f, k).await.map_err(read_err(location))?;
                out.push(("tenant:(others)".to_owned(), docs));
            }
            Ok(out)
        }
        Stratify::Bucket => {
            let docs = sample(filter.clone(), (k * 16).min(50_000))
                .await
                .map_err(read_err(location))?;
            let mut bins: BTreeMap<u32, Vec<Document>> = BTreeMap::new();
            for d in docs {
                let Some((t, i)) = keys_of(&scene.from, &d) else {
                    continue;
                };
                let Ok(l) = scene.to.locate(&t, &i) else {
                    continue;
                };
                let bin = bins.entry(l.sub_bucket).or_default();
                if bin.len() < k {
                    bin.push(d);
                }
            }
            Ok(bins
                .into_iter()
                .map(|(b, docs)| (format!("bucket:{b}"), docs))
                .collect())
        }
    }
}

fn finding(kind: FindingKind, id: &Bson, stratum: &str, details: serde_json::Value) -> NewFinding {
    NewFinding {
        kind,
        doc_id: Some(ids::encode(id)),
        doc_id_text: Some(ids::text(id)),
        stratum: Some(stratum.to_owned()),
        details,
    }
}

/// The name an outcome is counted under.
fn outcome_name(outcome: &Outcome) -> &'static str {
    match outcome {
        Outcome::Copied => "copied",
        Outcome::Superseded => "superseded",
        Outcome::Deleted => "deleted",
        Outcome::Stayed => "stayed",
        Outcome::Ignored => "ignored",
        Outcome::Placed => "placed",
        Outcome::Finding { kind, .. } => kind.as_str(),
    }
}

pub fn tally(
    result: &mut RunResult,
    stratum: &mut Stratum,
    checked: Vec<(Bson, Outcome)>,
    source: &Location,
) {
    for (id, outcome) in checked {
        *result
            .counts
            .entry(outcome_name(&outcome).to_owned())
            .or_default() += 1;
        if matches!(outcome, Outcome::Ignored) {
            continue;
        }
        stratum.samples += 1;
        if let Outcome::Finding { kind, mut details } = outcome {
            stratum.defects += 1;
            details["source"] = json!(source.to_string());
            result
                .findings
                .push(finding(kind, &id, &stratum.name, details));
        }
    }
}

/// Runs the checks (without storing anything).
pub async fn run(
    scene: &Scene,
    partitions: &[Partition],
    settings: &MigrationSettings,
    options: &ReconcileOptions,
) -> Result<RunResult, ReadError> {
    let mut result = RunResult::default();
    let targets: BTreeSet<Location> = scene.to.locations().into_iter().collect();
    let mut strata: BTreeMap<String, Stratum> = BTreeMap::new();

    // Completeness: fresh counts against the ledger.
    for p in partitions {
        let location = p.location();
        if targets.contains(&location) {
            result.counts_checked.push(json!({
                "partition": p.id, "location": location.to_string(),
                "skipped": "the source collection is also a target location",
            }));
            continue;
        }
        let filter =
            plan::partition_filter(&scene.from, p, false).map_err(|e| ReadError::Mongo {
                location: location.clone(),
                source: mongodb::error::Error::custom(e),
            })?;
        let count = match options.counted.get(&p.id) {
            Some(read) => *read,
            None if options.presence_done => 0,
            None => scene
                .shards
                .collection(&location)?
                .count_documents(filter)
                .await
                .map_err(read_err(&location))? as i64,
        };
        let ledger = p.scanned + p.skipped_foreign;
        result.counts_checked.push(json!({
            "partition": p.id, "location": location.to_string(), "count": count, "ledger": ledger,
        }));
        if count != ledger {
            result.findings.push(NewFinding {
                kind: FindingKind::Count,
                doc_id: None,
                doc_id_text: None,
                stratum: Some(format!("partition:{}", p.id)),
                details: json!({
                    "partition": p.id, "location": location.to_string(),
                    "count": count, "ledger": ledger,
                }),
            });
        }
    }

    // Presence and content: every source document of every location through one merged
    // read (full), or samples per location.
    let mut rate = AdaptiveRate::new(settings.throttle_share(1), Instant::now());
    let mut scoped: BTreeMap<Location, SourceScope> = BTreeMap::new();
    for location in scene.from.locations() {
        let tenants = match location_scope(&scene.from, &scene.to, &location) {
            MoveScope::Nothing => continue,
            MoveScope::Everything { .. } => None,
            MoveScope::Tenants(t) => Some(t),
        };
        scoped.insert(
            location,
            SourceScope {
                tenants,
                partitions: Vec::new(),
            },
        );
    }
    if options.presence_done {
        // A leased full run checked presence, content and placement partition by partition.
    } else if options.full {
        let batch_size = settings.batch_size;
        let mut read =
            FullRead::open(scene, scoped, &ids::IdRange::everything(), None, batch_size).await?;
        loop {
            let mut batch = read.next_batch(scene, batch_size).await?;
            let wait = rate.permit(batch.source_documents, Instant::now());
            tokio::time::sleep(wait).await;
            tally_full(&mut batch, &mut result, &mut strata);
            if batch.done {
                break;
            }
        }
    } else {
        for (location, scope) in scoped {
            let filter = match &scope.tenants {
                Some(t) => crate::scope::tenant_filter(&scene.from.tenant_key, t),
                None => Document::new(),
            };
            for (name, docs) in sample_location(scene, &location, &filter, options).await? {
                let mut stratum = strata.remove(&name).unwrap_or(Stratum {
                    name: name.clone(),
                    ..Stratum::default()
                });
                let checked = check_batch(scene, &location, &docs).await?;
                tally(&mut result, &mut stratum, checked, &location);
                strata.insert(name, stratum);
            }
        }
    }

    // Placement: sampled target documents written by reshard sit where the target puts them
    // (a full run checked every one in its merge).
    let sampled_placement = if options.presence_done || options.full {
        BTreeSet::new()
    } else {
        targets.clone()
    };
    for target in &sampled_placement {
        let coll = scene.shards.collection(target)?;
        let name = format!("placement:{target}");
        let mut stratum = Stratum {
            name: name.clone(),
            ..Stratum::default()
        };
        let docs = sample_written(&coll, options.sample.max(1), target).await?;
        for d in docs {
            let id = d.get("_id").cloned().unwrap_or(Bson::Null);
            let Some(outcome) = judge_placement(scene, target, &d) else {
                continue;
            };
            stratum.samples += 1;
            if let Outcome::Finding { kind, details } = outcome {
                stratum.defects += 1;
                *result.counts.entry("misplaced".to_owned()).or_default() += 1;
                result.findings.push(finding(kind, &id, &name, details));
            }
        }
        strata.insert(name, stratum);
    }
    // One document found wrong twice (by the presence check and by a placement sample) is
    // one defect.
    let mut seen = HashSet::new();
    result.findings.retain(|f| match &f.doc_id {
        Some(id) => seen.insert((f.kind, id.clone())),
        None => true,
    });
    result.strata = strata
        .into_values()
        .map(|mut s| {
            s.bound = if s.defects == 0 {
                defect_bound(s.samples)
            } else {
                None
            };
            s
        })
        .collect();
    Ok(result)
}

/// A uniform sample of `k` documents reshard wrote at a target location. `$sample` first:
/// only a first stage is served by a random cursor (a `$match` before it reads the whole
/// collection on MongoDB). A target collection holds little else, so that is the sample; only
/// where it holds too few of reshard's documents (a collection both layouts share) is the
/// sample drawn among them exactly, which reads the collection.
async fn sample_written(
    coll: &mongodb::Collection<Document>,
    k: usize,
    target: &Location,
) -> Result<Vec<Document>, ReadError> {
    let run = |pipeline: Vec<Document>| async move {
        coll.aggregate(pipeline)
            .await
            .map_err(read_err(target))?
            .try_collect::<Vec<Document>>()
            .await
            .map_err(read_err(target))
    };
    let sampled = run(vec![doc! { "$sample": { "size": k as i64 } }]).await?;
    let drawn = sampled.len();
    let written: Vec<Document> = sampled
        .into_iter()
        .filter(|d| d.contains_key(envelope::META))
        .collect();
    if written.len() == k || drawn < k {
        // Enough, or the sample was the whole collection.
        return Ok(written);
    }
    run(vec![
        doc! { "$match": envelope::written_by_reshard() },
        doc! { "$sample": { "size": k as i64 } },
    ])
    .await
}

/// Checks the findings again (after the caller waited) and keeps those that persist.
pub async fn recheck(
    scene: &Scene,
    partitions: &[Partition],
    findings: Vec<NewFinding>,
) -> Result<(Vec<NewFinding>, u64), ReadError> {
    let mut kept = Vec::new();
    let mut gone = 0;
    for f in findings {
        let still = match (f.kind, &f.doc_id) {
            (FindingKind::Count, _) => {
                let id = f.details["partition"].as_i64();
                match partitions.iter().find(|p| Some(p.id) == id) {
                    Some(p) => count_differs(scene, p).await?,
                    None => true,
                }
            }
            (_, Some(raw)) => {
                let id = ids::decode(raw).unwrap_or(Bson::Null);
                match f.details["source"].as_str().and_then(parse_location) {
                    Some(source) => match scene.shards.find_by_id(&source, &id).await? {
                        Some(d) => matches!(
                            check_batch(scene, &source, &[d]).await?.first(),
                            Some((_, Outcome::Finding { kind, .. })) if *kind == f.kind
                        ),
                        None => false,
                    },
                    // A placement finding: is the document still where it should not be?
                    None => match f.details["found"].as_str().and_then(parse_location) {
                        Some(at) => !find_by_ids(scene, &at, std::slice::from_ref(&id))
                            .await?
                            .is_empty(),
                        None => true,
                    },
                }
            }
            _ => true,
        };
        if still {
            kept.push(f);
        } else {
            gone += 1;
        }
    }
    Ok((kept, gone))
}

/// Whether a fresh count of a partition's range differs from its ledger.
async fn count_differs(scene: &Scene, p: &Partition) -> Result<bool, ReadError> {
    let location = p.location();
    let filter = plan::partition_filter(&scene.from, p, false).map_err(|e| ReadError::Mongo {
        location: location.clone(),
        source: mongodb::error::Error::custom(e),
    })?;
    let count = scene
        .shards
        .collection(&location)?
        .count_documents(filter)
        .await
        .map_err(read_err(&location))? as i64;
    Ok(count != p.scanned + p.skipped_foreign)
}

fn parse_location(text: &str) -> Option<Location> {
    let (shard, collection) = text.split_once('/')?;
    Some(Location::new(shard, collection))
}

/// Whether a run's findings are within the migration's thresholds. A count mismatch and a
/// document that cannot be routed never pass.
pub fn verdict(
    findings: &[NewFinding],
    settings: &MigrationSettings,
) -> (bool, BTreeMap<String, u64>) {
    let mut by_kind: BTreeMap<String, u64> = BTreeMap::new();
    for f in findings {
        *by_kind.entry(f.kind.to_string()).or_default() += 1;
    }
    let n = |k: FindingKind| by_kind.get(k.as_str()).copied().unwrap_or(0);
    let passed = n(FindingKind::Count) == 0
        && n(FindingKind::Unroutable) == 0
        && n(FindingKind::Missing) <= settings.max_missing
        && n(FindingKind::Mismatched) <= settings.max_mismatched
        && n(FindingKind::Misplaced) <= settings.max_misplaced;
    (passed, by_kind)
}

/// Runs a repair's protocol steps for `doc` (a source document) at its target `goal`:
/// [`protocol::repair_copy_step`], then on a duplicate key [`protocol::repair_replace_step`],
/// which replaces only a pristine copy, never the application's write or a tombstone.
async fn repair_copy(
    scene: &Scene,
    goal: &Location,
    doc: Document,
    sub_bucket: u32,
    epoch: i64,
) -> Result<&'static str, ReadError> {
    let coll = scene.shards.collection(goal)?;
    let id = doc.get("_id").cloned().unwrap_or(Bson::Null);
    let copy = |payload: &Payload<Document>| match payload {
        Payload::Copy(d) => envelope::copy(d.clone(), &scene.to, sub_bucket, epoch),
        Payload::App(_) | Payload::Tombstone => unreachable!("a repair writes copies only"),
    };
    let mut step: Step<Document, Document> = protocol::repair_copy_step(doc.clone());
    loop {
        let answer: Answer<Document> = match &step {
            Step::Insert(Side::Target, payload) => match coll.insert_one(copy(payload)).await {
                Ok(_) => Answer::Inserted,
                Err(e) if crate::copy::classify::is_duplicate_key(&e) => Answer::DuplicateKey,
                Err(e) => return Err(read_err(goal)(e)),
            },
            Step::ReplaceCopy(Side::Target, payload) => {
                let r = coll
                    .replace_one(envelope::pristine_copy_of(&id), copy(payload))
                    .await
                    .map_err(read_err(goal))?;
                Answer::Matched(r.matched_count == 1)
            }
            other => unreachable!("a repair asks for no {other:?}"),
        };
        match (&step, answer) {
            (Step::Insert(..), Answer::Inserted) => return Ok("copied again"),
            (Step::Insert(..), _) => step = protocol::repair_replace_step(doc.clone()),
            (_, Answer::Matched(true)) => return Ok("pristine copy replaced"),
            _ => return Ok("left alone: the application wrote it since"),
        }
    }
}

/// Brings the target in line with the source document of `id` at `source`: a document that
/// moves is copied again ([`repair_copy`], never over the application's write), one that stays
/// gets its routing field. Returns what was done.
async fn repair_from_source(
    scene: &Scene,
    epoch: i64,
    source: &Location,
    id: &Bson,
) -> Result<String, ReadError> {
    let Some(doc) = scene.shards.find_by_id(source, id).await? else {
        return Ok("the source document is gone".to_owned());
    };
    Ok(
        match disposition::of(Side::Source, &scene.from, &scene.to, source, &doc) {
            Disposition::Stays {
                stamp: Some((field, value)),
            } => {
                scene
                    .shards
                    .collection(source)?
                    .update_one(envelope::live(id), envelope::stamp(&field, value))
                    .await
                    .map_err(read_err(source))?;
                "routing field stamped".to_owned()
            }
            Disposition::Moves { target, sub_bucket } => {
                repair_copy(scene, &target, doc, sub_bucket, epoch)
                    .await?
                    .to_owned()
            }
            other => format!("left alone: the source document is {other:?} now"),
        },
    )
}

/// How the repair of a shadow read's mismatch ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ShadowRepair {
    /// The target's copy equals its source again (what was done).
    Repaired(String),
    /// Nothing is left to compare: the application wrote or deleted the document since, or
    /// (rarely) the source document is gone.
    Superseded(crate::shadow::Uncompared),
    /// The copy still differs (the fields).
    StillWrong(Vec<String>),
}

/// Repairs a mismatch shadow reads found: the pristine copy is copied again from its source
/// through the repair path ([`repair_from_source`]: replacing only a pristine copy), then
/// both sides are read and compared again ([`crate::shadow::compare`]).
pub async fn repair_shadow_mismatch(
    scene: &Scene,
    epoch: i64,
    mismatch: &crate::store::shadow::ShadowMismatch,
) -> Result<ShadowRepair, ReadError> {
    let id = ids::decode(&mismatch.doc_id).unwrap_or(Bson::Null);
    let (Some(source), Some(target)) = (
        parse_location(&mismatch.source_location),
        parse_location(&mismatch.target_location),
    ) else {
        return Ok(ShadowRepair::StillWrong(vec![format!(
            "unreadable locations {} / {}",
            mismatch.source_location, mismatch.target_location
        )]));
    };
    let what = repair_from_source(scene, epoch, &source, &id).await?;
    let source_doc = scene.shards.find_by_id(&source, &id).await?;
    let target_doc = scene.shards.find_by_id(&target, &id).await?;
    Ok(
        match crate::shadow::compare(
            source_doc.as_ref(),
            target_doc.as_ref(),
            &scene.from,
            &scene.to,
        ) {
            crate::shadow::Verdict::Equal => ShadowRepair::Repaired(what),
            crate::shadow::Verdict::Mismatch { fields } => ShadowRepair::StillWrong(fields),
            crate::shadow::Verdict::NotCompared(why) => ShadowRepair::Superseded(why),
        },
    )
}

/// Rewrites the documents findings name: a missing or mismatched pristine copy is copied again
/// from the source ([`repair_copy`]), a staying document gets its routing field, a misplaced
/// copy is removed from where it does not belong once the right location holds it. Returns
/// per finding what was done.
pub async fn repair(
    scene: &Scene,
    epoch: i64,
    findings: &[crate::store::reconcile::Finding],
) -> Result<Vec<(i64, String)>, ReadError> {
    let mut done = Vec::new();
    for f in findings {
        let Some(raw) = &f.doc_id else { continue };
        let id = ids::decode(raw).unwrap_or(Bson::Null);
        let source = f.details["source"].as_str().and_then(parse_location);
        let what = match (f.kind, source) {
            (FindingKind::Missing | FindingKind::Mismatched, Some(source)) => {
                repair_from_source(scene, epoch, &source, &id).await?
            }
            (FindingKind::Misplaced, source) => {
                let found = f.details["found"].as_str().and_then(parse_location);
                let expected = f.details["expected"].as_str().and_then(parse_location);
                let (Some(found), Some(expected)) = (found, expected) else {
                    continue;
                };
                let mut what = Vec::new();
                if find_by_ids(scene, &expected, std::slice::from_ref(&id))
                    .await?
                    .is_empty()
                {
                    // Only the stray exists: copy the source document where it belongs first.
                    let doc = match &source {
                        Some(source) => scene.shards.find_by_id(source, &id).await?,
                        None => None,
                    };
                    let d = match (&doc, &source) {
                        (Some(doc), Some(source)) => Some(disposition::of(
                            Side::Source,
                            &scene.from,
                            &scene.to,
                            source,
                            doc,
                        )),
                        _ => None,
                    };
                    match (doc, d) {
                        (Some(doc), Some(Disposition::Moves { target, sub_bucket }))
                            if target == expected =>
                        {
                            let w = repair_copy(scene, &expected, doc, sub_bucket, epoch).await?;
                            what.push(format!("{w} to {expected}"));
                        }
                        _ => {
                            done.push((
                                f.id,
                                format!(
                                    "left alone: {expected} does not hold it and the source \
                                     copy is gone; an operator must decide"
                                ),
                            ));
                            continue;
                        }
                    }
                }
                // Remove the stray only while it is a pristine copy: the application's own
                // write there is for an operator to look at.
                let r = scene
                    .shards
                    .collection(&found)?
                    .delete_one(envelope::pristine_copy_of(&id))
                    .await
                    .map_err(read_err(&found))?;
                if r.deleted_count == 1 {
                    what.push(format!("removed from {found}"));
                } else {
                    what.push(format!("left the application's write at {found} alone"));
                }
                what.join("; ")
            }
            _ => continue,
        };
        done.push((f.id, what));
    }
    Ok(done)
}

#[derive(Debug, thiserror::Error)]
pub enum VerifyError {
    #[error(transparent)]
    Read(#[from] ReadError),
    #[error(transparent)]
    Store(#[from] crate::store::StoreError),
}

/// The presence and content checks of a full run, partitioned and leased like backfill: every
/// process running this for the same run (`reshard reconcile ID --full`, `--resume RUN`)
/// claims `verify` partitions, reads each through one cursor in `_id` order from its
/// checkpoint, checks batch by batch at the migration's throttled rate, and stores each
/// batch's findings with its checkpoint. Returns when no partition is left to claim.
#[allow(clippy::too_many_arguments)]
pub async fn verify_leased(
    store: &crate::store::Store,
    scene: &Scene,
    backfill: &[Partition],
    run_id: i64,
    settings: &MigrationSettings,
    owner: &str,
    concurrency: usize,
    ttl: Duration,
) -> Result<(), VerifyError> {
    let sources = full_sources(backfill).map_err(|e| ReadError::Mongo {
        location: Location::new("*", "*"),
        source: mongodb::error::Error::custom(e),
    })?;
    let sources = &sources;
    let rate = std::sync::Mutex::new(AdaptiveRate::new(
        settings.throttle_share(1),
        Instant::now(),
    ));
    let one_loop = || async {
        loop {
            // Verification only reads: no fence margin is needed before a takeover.
            let claim = Claim {
                token: uuid::Uuid::new_v4(),
                owner: owner.to_owned(),
                ttl,
                fence_margin: Duration::ZERO,
            };
            let Some(p) = store.claim_verify_partition(run_id, &claim).await? else {
                return Ok::<(), VerifyError>(());
            };
            let token = claim.token;
            let keeper = {
                let (store, id) = (store.clone(), p.id);
                tokio::spawn(async move {
                    loop {
                        tokio::time::sleep(ttl / 3).await;
                        if !matches!(store.extend_partition_lease(id, token, ttl).await, Ok(true)) {
                            return;
                        }
                    }
                })
            };
            let result =
                verify_partition(store, scene, sources, &p, token, ttl, settings, &rate).await;
            keeper.abort();
            result?;
        }
    };
    let loops = (0..concurrency.max(1)).map(|_| one_loop());
    for r in futures::future::join_all(loops).await {
        r?;
    }
    Ok(())
}

/// The key of a verify partition's outcomes that counts the source documents it read in a
/// backfill partition's range (`read:<partition id>`): the fresh count completeness needs.
pub const READ_PREFIX: &str = "read:";

/// Checks one `verify` partition: its `_id` range at every location ([`FullRead`]), or, for a
/// partition planned by an earlier version of reshard, at its one source location (and every
/// target location).
#[allow(clippy::too_many_arguments)]
async fn verify_partition(
    store: &crate::store::Store,
    scene: &Scene,
    sources: &BTreeMap<Location, SourceScope>,
    p: &Partition,
    token: uuid::Uuid,
    ttl: Duration,
    settings: &MigrationSettings,
    rate: &std::sync::Mutex<AdaptiveRate>,
) -> Result<(), VerifyError> {
    let unreadable = |e: String| ReadError::Mongo {
        location: p.location(),
        source: mongodb::error::Error::custom(e),
    };
    let sources = if p.every_location() {
        sources.clone()
    } else {
        let location = p.location();
        let scope = match sources.get(&location) {
            Some(scope) => scope.clone(),
            None => SourceScope {
                tenants: p
                    .tenant_filter
                    .as_ref()
                    .map(|t| serde_json::from_value(t.clone()))
                    .transpose()
                    .map_err(|e| unreadable(format!("tenant filter unreadable: {e}")))?,
                partitions: Vec::new(),
            },
        };
        BTreeMap::from([(location, scope)])
    };
    let range = p.range().map_err(unreadable)?;
    let resume = p
        .last_id
        .as_deref()
        .map(ids::decode)
        .transpose()
        .map_err(unreadable)?;
    let mut outcomes: BTreeMap<String, u64> =
        serde_json::from_value(p.outcomes.clone()).unwrap_or_default();
    let batch_size = settings.batch_size;
    let mut read = FullRead::open(scene, sources, &range, resume.as_ref(), batch_size).await?;
    // Checkpoints are written off the checks' path, one statement at a time: what was checked
    // while one was in flight goes into the next. Verification only reads, so work checked
    // after a checkpoint that finds the lease gone is simply dropped (the new holder goes on
    // from the last checkpoint), and work lost with the process is checked again.
    let mut unrecorded = Unrecorded::default();
    let mut recording: Option<tokio::task::JoinHandle<Result<Recorded, StoreError>>> = None;
    loop {
        let mut batch = read.next_batch(scene, batch_size).await?;
        let done = batch.done;
        let wait = rate
            .lock()
            .unwrap()
            .permit(batch.source_documents, Instant::now());
        tokio::time::sleep(wait).await;
        let mut result = RunResult::default();
        let mut strata = BTreeMap::new();
        let last_id = batch.last_id.as_ref().map(ids::encode);
        for (partition, n) in std::mem::take(&mut batch.reads) {
            *outcomes
                .entry(format!("{READ_PREFIX}{partition}"))
                .or_default() += n;
        }
        tally_full(&mut batch, &mut result, &mut strata);
        // Each source location's checks and each target's placement checks are a stratum of
        // the run: the partition keeps their counts beside its outcomes.
        let mut checked = 0;
        for (name, st) in strata {
            if name.starts_with("full:") {
                checked += st.samples as i64;
            }
            *outcomes.entry(name).or_default() += st.samples;
        }
        // A document in the wrong place is found from its source and again where it sits:
        // one defect.
        let mut seen = HashSet::new();
        result.findings.retain(|f| match &f.doc_id {
            Some(id) => seen.insert((f.kind, id.clone())),
            None => true,
        });
        for (k, n) in std::mem::take(&mut result.counts) {
            *outcomes.entry(k).or_default() += n;
        }
        unrecorded.checked += checked;
        unrecorded.findings.append(&mut result.findings);
        if last_id.is_some() {
            unrecorded.last_id = last_id;
        }
        if done || recording.as_ref().is_none_or(|r| r.is_finished()) {
            if let Some(previous) = recording.take() {
                if !recorded(p, previous.await)? {
                    // The lease was taken over: whoever holds it goes on from the last
                    // checkpoint.
                    return Ok(());
                }
            }
            let batch = std::mem::take(&mut unrecorded);
            let (store, partition, outcomes) = (store.clone(), p.clone(), json!(outcomes));
            recording = Some(tokio::spawn(async move {
                let kept = store
                    .checkpoint_verify(
                        &partition,
                        token,
                        ttl,
                        &VerifiedBatch {
                            last_id: batch.last_id.as_deref(),
                            checked: batch.checked,
                            outcomes: &outcomes,
                            findings: &batch.findings,
                            done,
                        },
                    )
                    .await?;
                Ok(Recorded {
                    kept,
                    checked: batch.checked as u64,
                    findings: batch.findings.len() as u64,
                })
            }));
        }
        if done {
            let last = recording.take().expect("the last checkpoint was sent");
            recorded(p, last.await)?;
            return Ok(());
        }
    }
}

/// What a full run's partition checked since its last checkpoint was sent.
#[derive(Default)]
struct Unrecorded {
    last_id: Option<Vec<u8>>,
    checked: i64,
    findings: Vec<NewFinding>,
}

/// A verify checkpoint's answer: whether the lease was still held, and what it recorded.
struct Recorded {
    kept: bool,
    checked: u64,
    findings: u64,
}

/// Counts what a checkpoint recorded; `false` when the lease was gone.
fn recorded(
    p: &Partition,
    done: Result<Result<Recorded, StoreError>, tokio::task::JoinError>,
) -> Result<bool, StoreError> {
    let r = match done {
        Ok(r) => r?,
        Err(e) => std::panic::resume_unwind(e.into_panic()),
    };
    if r.kept {
        crate::telemetry::verified(p.migration_id, &p.source_shard, r.checked, r.findings);
    }
    Ok(r.kept)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn version(field: Option<&str>) -> RoutingVersion {
        crate::routing::one_shard_version(field)
    }

    #[test]
    fn copies_differ_only_outside_routing_fields_and_metadata() {
        let (from, to) = (version(Some("slot")), version(Some("bucket")));
        let source = doc! { "_id": 1, "customerId": "c", "total": 5, "slot": 0 };
        let copy = doc! { "_id": 1, "customerId": "c", "bucket": 3, "total": 5, "_reshard": { "src": "copy" } };
        assert!(content_differences(&source, &copy, &from, &to).is_empty());
        let changed = doc! { "_id": 1, "customerId": "c", "total": 6, "note": "x" };
        assert_eq!(
            content_differences(&source, &changed, &from, &to),
            vec!["note".to_owned(), "total".to_owned()]
        );
    }

    #[test]
    fn the_rule_of_three() {
        assert_eq!(defect_bound(0), None);
        assert_eq!(defect_bound(300), Some(0.01));
        assert_eq!(defect_bound(1), Some(1.0));
    }

    #[test]
    fn the_verdict_follows_the_thresholds() {
        let f = |kind: &str| NewFinding {
            kind: match kind {
                "missing" => FindingKind::Missing,
                "misplaced" => FindingKind::Misplaced,
                _ => FindingKind::Count,
            },
            doc_id: None,
            doc_id_text: None,
            stratum: None,
            details: json!({}),
        };
        let mut s = MigrationSettings::default();
        assert!(verdict(&[], &s).0);
        assert!(!verdict(&[f("missing")], &s).0);
        s.max_missing = 1;
        assert!(verdict(&[f("missing")], &s).0);
        assert!(!verdict(&[f("missing"), f("missing")], &s).0);
        s.max_misplaced = 5;
        assert!(
            !verdict(&[f("count")], &s).0,
            "a count mismatch never passes"
        );
    }

    /// A backfill partition of `location` over `[lower, upper)` (string ids) that read `read`.
    fn backfill(
        id: i64,
        location: &str,
        lower: Option<&str>,
        upper: Option<&str>,
        read: i64,
    ) -> Partition {
        let (shard, collection) = location.split_once('/').unwrap();
        let bound = |b: Option<&str>| b.map(|b| ids::encode(&Bson::String(b.to_owned())));
        Partition {
            id,
            migration_id: 1,
            task: crate::store::partitions::Task::Backfill,
            source_shard: shard.to_owned(),
            source_collection: collection.to_owned(),
            id_type: ids::ANY_TYPE.to_owned(),
            lower_bound: bound(lower),
            upper_bound: bound(upper),
            tenant_filter: None,
            state: crate::store::partitions::PartitionState::Done,
            lease_token: None,
            lease_owner: None,
            lease_expires_at: None,
            last_id: None,
            scanned: read,
            inserted: read,
            already_present: 0,
            stamped: 0,
            dead_lettered: 0,
            skipped_foreign: 0,
            deleted: 0,
            kept: 0,
            run_id: None,
            outcomes: json!({}),
            approx_documents: None,
            attempts: 1,
            batch_limit: None,
            timeouts: 0,
            stalls: 0,
            last_failure: None,
            created_at: chrono::Utc::now(),
            started_at: None,
            finished_at: None,
            taken_over_from: None,
        }
    }

    #[test]
    fn verify_ranges_read_every_location_over_the_ranges_of_the_most_divided_one() {
        let plan = [
            backfill(1, "s1/orders", None, None, 300),
            backfill(2, "s2/orders", None, Some("m"), 200),
            backfill(3, "s2/orders", Some("m"), Some("t"), 100),
            backfill(4, "s2/orders", Some("t"), None, 100),
            backfill(5, "s3/orders", None, Some("g"), 50),
            backfill(6, "s3/orders", Some("g"), None, 50),
        ];
        let ranges = verify_ranges(&plan);
        let bounds: Vec<(Option<Bson>, Option<Bson>)> = ranges
            .iter()
            .map(|p| {
                let d = |b: &Option<Vec<u8>>| b.as_deref().map(|b| ids::decode(b).unwrap());
                (d(&p.lower_bound), d(&p.upper_bound))
            })
            .collect();
        let s = |t: &str| Some(Bson::String(t.to_owned()));
        assert_eq!(
            bounds,
            vec![(None, s("m")), (s("m"), s("t")), (s("t"), None)],
            "s2's ranges, in order, cover every _id"
        );
        for p in &ranges {
            assert_eq!(p.source_shard, crate::store::partitions::EVERY_LOCATION);
            assert_eq!(
                p.source_collection,
                crate::store::partitions::EVERY_LOCATION
            );
            assert_eq!(p.id_type, ids::ANY_TYPE);
            assert_eq!(p.tenant_filter, None);
        }
        // Sized at each range's share of everything read (800), by s2's shares (2:1:1).
        let sizes: Vec<i64> = ranges.iter().map(|p| p.approx_documents.unwrap()).collect();
        assert_eq!(sizes, vec![400, 200, 200]);

        // One partition per location: one range, everything.
        let one = verify_ranges(&[
            backfill(1, "s1/orders", None, None, 10),
            backfill(2, "s2/orders", None, None, 20),
        ]);
        assert_eq!(one.len(), 1);
        assert_eq!((&one[0].lower_bound, &one[0].upper_bound), (&None, &None));
        assert_eq!(one[0].approx_documents, Some(30));
        assert!(verify_ranges(&[]).is_empty());
    }

    #[test]
    fn full_sources_keep_each_location_s_partitions_and_refuse_mixed_tenants() {
        let plan = [
            backfill(7, "s1/orders", None, Some("m"), 1),
            backfill(8, "s1/orders", Some("m"), None, 1),
            backfill(9, "s2/orders", None, None, 1),
        ];
        let sources = full_sources(&plan).unwrap();
        assert_eq!(sources.len(), 2);
        let s1 = &sources[&Location::new("s1", "orders")];
        assert_eq!(s1.tenants, None);
        let holder = |id: &str| {
            s1.partitions
                .iter()
                .find(|(r, _)| r.contains(&Bson::String(id.to_owned())))
                .map(|(_, p)| *p)
        };
        assert_eq!(
            (holder("a"), holder("m"), holder("z")),
            (Some(7), Some(8), Some(8))
        );

        let mut scoped = backfill(10, "s1/orders", None, Some("m"), 1);
        scoped.tenant_filter = Some(json!([{"type": "string", "value": "cust-1"}]));
        let mixed = [scoped, backfill(11, "s1/orders", Some("m"), None, 1)];
        let err = full_sources(&mixed).unwrap_err();
        assert!(
            err.contains("s1/orders") && err.contains("different tenants"),
            "{err}"
        );
    }
}

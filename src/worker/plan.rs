//! The backfill plan: what to scan at each source location, cut into partitions.
//!
//! Per source location the scope comes from [`routing::scope_at`]: nothing, some tenants (read
//! through the tenant key index, which [`crate::prepare`] creates), or everything. Documents
//! that stay where they are still have to be read when the target's routing field has to be
//! stamped on them, so a routing field the source lacks widens every location to everything.
//! A location is cut into ranges of `_id`s in MongoDB's total order across every type
//! ([`ids::IdRange`]), as many as its size and the workers ask for ([`partition_count`]): a
//! small collection is one range, read through one cursor, and costs the planner one count.

use mongodb::bson::{doc, Bson, Document};
use serde_json::json;

use crate::envelope;
use crate::ids::{self, IdRange};
use crate::routing::{KeyValue, Location, MoveScope, RoutingVersion};
pub use crate::scope::tenant_filter;
use crate::scope::{location_scope, scope_filter};
use crate::settings::MigrationSettings;
use crate::shards::read::{QueryOptions, ReadError};
use crate::shards::Shards;
use crate::store::partitions::{NewPartition, Partition, Task};

/// The filter of a partition's scan: its tenants (a scoped scan) or what reshard wrote (the
/// revert copier reads the target), and its `_id` range ([`ids::IdRange`]), whole or
/// (`from_checkpoint`) after its checkpoint. The one place a partition's range becomes a
/// query, for every task.
pub fn partition_filter(
    from: &RoutingVersion,
    p: &Partition,
    from_checkpoint: bool,
) -> Result<Document, String> {
    let filter = match &p.tenant_filter {
        _ if p.task == Task::Revert => envelope::written_by_reshard(),
        Some(tenants) => {
            let tenants: Vec<KeyValue> = serde_json::from_value(tenants.clone())
                .map_err(|e| format!("tenant filter unreadable: {e}"))?;
            tenant_filter(&from.tenant_key, &tenants)
        }
        None => Document::new(),
    };
    let resume = match &p.last_id {
        Some(bytes) if from_checkpoint => Some(ids::decode(bytes)?),
        _ => None,
    };
    Ok(ids::and(filter, p.range()?.filter(resume.as_ref())))
}

/// What the planner decided for one source location.
#[derive(Clone, Debug, PartialEq)]
pub struct LocationPlan {
    pub location: Location,
    pub scope: MoveScope,
    /// `None`: not read when planned (one partition, sized afterwards).
    pub approx_documents: Option<u64>,
    pub partitions: Vec<NewPartition>,
}

#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    #[error("source shard {0:?} has no connection")]
    UnknownShard(String),
    #[error("reading {location} failed: {}", crate::shards::describe(source))]
    Read {
        location: Location,
        #[source]
        source: mongodb::error::Error,
    },
}

impl From<ReadError> for PlanError {
    fn from(e: ReadError) -> PlanError {
        match e {
            ReadError::Mongo { location, source } | ReadError::Write { location, source } => {
                PlanError::Read { location, source }
            }
            ReadError::UnknownShard(u) => PlanError::UnknownShard(u.0),
        }
    }
}

/// The fewest documents the planner gives a partition for the sake of spreading a location
/// over more workers: below this, one more cursor costs more than it saves.
pub const MIN_PARTITION_DOCUMENTS: u64 = 100_000;

/// How many partitions a location of about `documents` documents is cut into: one for each
/// of the `workers` the location may keep busy (the workers registered when it was planned,
/// shared among the locations scanned) as long as each keeps at least
/// [`MIN_PARTITION_DOCUMENTS`], and, when the operator set `documents_per_partition`, enough
/// that none holds more; never fewer than one, so a small collection is one scan. A worker
/// keeps its targets busy from one partition (several batches in flight), so more partitions
/// only serve more workers.
pub fn partition_count(
    documents: u64,
    documents_per_partition: Option<u64>,
    workers: usize,
) -> usize {
    let by_size = documents_per_partition.map_or(1, |per| documents.div_ceil(per.max(1)));
    let by_workers = (workers as u64).min(documents / MIN_PARTITION_DOCUMENTS);
    by_size.max(by_workers).clamp(1, 10_000) as usize
}

/// Whether a location is one partition whatever its size, so that planning it reads
/// nothing: no partition size was set and no more than one worker is there to keep busy.
pub fn one_partition_unread(documents_per_partition: Option<u64>, workers: usize) -> bool {
    documents_per_partition.is_none() && workers <= 1
}

/// Whether an id may bound a partition: a value of a bracket reshard routes (every partition
/// bound compares within a class the `_id` index orders), and not NaN.
fn can_bound(id: &Bson) -> bool {
    match id {
        Bson::Double(d) => !d.is_nan(),
        Bson::Int32(_) | Bson::Int64(_) | Bson::String(_) | Bson::ObjectId(_) | Bson::Binary(_) => {
            true
        }
        _ => false,
    }
}

/// Cuts a location into `parts` ranges across every `_id` type ([`ids::IdRange`]) at the
/// sample's quantiles: the first range starts before every `_id`, the last ends after every
/// `_id`, and each begins where the one before ends, so the ranges cover every document
/// whatever its `_id`'s type. Each range's `approx_documents` is its share of the sample.
pub fn partitions_of(
    location: &Location,
    sample: Vec<Bson>,
    documents: u64,
    parts: usize,
    tenant_filter: Option<&serde_json::Value>,
) -> Vec<NewPartition> {
    let mut sample: Vec<Bson> = sample.into_iter().filter(can_bound).collect();
    sample.sort_by(ids::compare);
    let points = ids::split_points(&sample, parts);
    let mut bounds: Vec<Option<Bson>> = vec![None];
    bounds.extend(points.into_iter().map(Some));
    bounds.push(None);
    let total = sample.len().max(1) as f64;
    bounds
        .windows(2)
        .map(|w| {
            let range = IdRange {
                bracket: None,
                lower: w[0].clone(),
                upper: w[1].clone(),
            };
            let in_range = sample.iter().filter(|id| range.contains(id)).count() as f64;
            NewPartition {
                source_shard: location.shard.clone(),
                source_collection: location.collection.clone(),
                id_type: range.type_name().to_owned(),
                lower_bound: range.lower.as_ref().map(ids::encode),
                upper_bound: range.upper.as_ref().map(ids::encode),
                tenant_filter: tenant_filter.cloned(),
                approx_documents: Some(if sample.is_empty() {
                    documents as i64
                } else {
                    (documents as f64 * in_range / total).round() as i64
                }),
            }
        })
        .collect()
}

/// How many ids the planner keeps per source location to cut partitions from.
pub const MAX_SAMPLE: usize = 20_000;

/// Sampled ids per partition wanted: the quantiles cut partitions within about an eighth of
/// their size.
const SAMPLE_PER_PARTITION: usize = 64;

/// What one pass over a location's ids learns: how many there are, and a uniform sample of at
/// most `capacity` of them (reservoir sampling, seeded: the same ids in the same order give
/// the same plan). Pure: fed id by id.
#[derive(Clone, Debug)]
pub struct IdPass {
    capacity: usize,
    seen: u64,
    sample: Vec<Bson>,
    rng: rand::rngs::StdRng,
}

impl IdPass {
    pub fn new(capacity: usize) -> IdPass {
        use rand::SeedableRng;
        IdPass {
            capacity: capacity.max(1),
            seen: 0,
            sample: Vec::new(),
            rng: rand::rngs::StdRng::seed_from_u64(0x007e_5a4d),
        }
    }

    /// Takes one id.
    pub fn observe(&mut self, id: &Bson) {
        self.seen += 1;
        if self.sample.len() < self.capacity {
            self.sample.push(id.clone());
        } else {
            use rand::Rng;
            let j = self.rng.gen_range(0..self.seen);
            if (j as usize) < self.capacity {
                self.sample[j as usize] = id.clone();
            }
        }
    }

    /// Ids seen.
    pub fn count(&self) -> u64 {
        self.seen
    }

    pub fn into_sample(self) -> Vec<Bson> {
        self.sample
    }
}

/// Plans every source location of `from` for `workers` workers. Reads only: the caller
/// stores the plan.
///
/// What it reads, per location scanned (what it relies on, on MongoDB, in brackets):
/// - nothing, when the location is one partition whatever its size
///   ([`one_partition_unread`]: the default with one worker per location); its size is
///   estimated after the plan is stored, while the copy runs ([`size_of`]);
/// - otherwise a whole location's estimated size (`count` without a query: the collection's
///   metadata) and, when that asks for more than one partition, a `$sample` of the ids (a
///   random cursor while the sample is under 5 % of the collection);
/// - or, for a location scoped to some tenants, a count of the scope (an index count on the
///   tenant index `{tenant, _id}` that `prepare` creates) or, when it is cut, one pass over
///   the ids in scope, counted and sampled as they stream by (a covered scan of that index).
///
/// Nothing more: no probe per `_id` type (the ranges cross types), so on servers without
/// those index paths (the local stand-in scans for each query) planning costs at most one
/// pass over each location.
pub async fn plan(
    from: &RoutingVersion,
    to: &RoutingVersion,
    shards: &Shards,
    settings: &MigrationSettings,
    workers: usize,
) -> Result<Vec<LocationPlan>, PlanError> {
    let scanned: Vec<(Location, MoveScope, Document)> = from
        .locations()
        .into_iter()
        .filter_map(|location| {
            let scope = location_scope(from, to, &location);
            scope_filter(&from.tenant_key, &scope).map(|filter| (location, scope, filter))
        })
        .collect();
    // Each location scanned may keep its share of the workers busy.
    let workers_per_location = workers.max(1).div_ceil(scanned.len().max(1));
    let mut plans = Vec::new();
    for location in from.locations() {
        let Some((_, scope, filter)) = scanned.iter().find(|(l, _, _)| *l == location) else {
            plans.push(LocationPlan {
                scope: location_scope(from, to, &location),
                location,
                approx_documents: Some(0),
                partitions: Vec::new(),
            });
            continue;
        };
        let tenant_json = match scope {
            MoveScope::Tenants(tenants) => Some(json!(tenants)),
            _ => None,
        };
        let parts_of = |documents: u64| {
            partition_count(
                documents,
                settings.documents_per_partition,
                workers_per_location,
            )
        };
        if one_partition_unread(settings.documents_per_partition, workers_per_location) {
            // Sized afterwards, off the copy's path ([`size_of`]).
            let mut partition = whole(&location, tenant_json.as_ref(), 0);
            partition.approx_documents = None;
            plans.push(LocationPlan {
                location,
                scope: scope.clone(),
                approx_documents: None,
                partitions: vec![partition],
            });
            continue;
        }
        let estimated = shards.estimated_count(&location).await?;
        let (documents, partitions) = if parts_of(estimated) == 1 && filter.is_empty() {
            (estimated, vec![whole(&location, None, estimated)])
        } else if filter.is_empty() {
            let parts = parts_of(estimated);
            let size = (parts * SAMPLE_PER_PARTITION).min(MAX_SAMPLE) as i64;
            let sample: Vec<Bson> = shards
                .aggregate(
                    &location,
                    vec![
                        doc! { "$sample": { "size": size } },
                        doc! { "$project": { "_id": 1 } },
                    ],
                )
                .await?
                .into_iter()
                .filter_map(|d| d.get("_id").cloned())
                .collect();
            let partitions = partitions_of(&location, sample, estimated, parts, None);
            (estimated, partitions)
        } else if parts_of(estimated) == 1 {
            // The scope is no larger than the collection: one partition, sized by a count of
            // the scope (an index count on MongoDB).
            let documents = shards.count(&location, filter.clone()).await?;
            (
                documents,
                vec![whole(&location, tenant_json.as_ref(), documents)],
            )
        } else {
            let mut pass = IdPass::new(MAX_SAMPLE);
            let options = QueryOptions {
                projection: Some(doc! { "_id": 1 }),
                batch_size: 10_000,
                ..QueryOptions::default()
            };
            let mut ids = shards.rows(&location, filter.clone(), options).await?;
            while let Some(d) = ids.next().await? {
                pass.observe(d.get("_id").unwrap_or(&Bson::Null));
            }
            let documents = pass.count();
            let partitions = partitions_of(
                &location,
                pass.into_sample(),
                documents,
                parts_of(documents),
                tenant_json.as_ref(),
            );
            (documents, partitions)
        };
        plans.push(LocationPlan {
            location,
            scope: scope.clone(),
            approx_documents: Some(documents),
            partitions,
        });
    }
    Ok(plans)
}

/// One partition holding every `_id` of a location (in scope).
fn whole(
    location: &Location,
    tenant_filter: Option<&serde_json::Value>,
    documents: u64,
) -> NewPartition {
    NewPartition {
        source_shard: location.shard.clone(),
        source_collection: location.collection.clone(),
        id_type: ids::ANY_TYPE.to_owned(),
        lower_bound: None,
        upper_bound: None,
        tenant_filter: tenant_filter.cloned(),
        approx_documents: Some(documents as i64),
    }
}

/// The estimated number of documents a whole-location partition scans, for progress and
/// ETA: the collection's metadata count (what reshard wrote at a revert location is at most
/// that), or a count of the tenants in scope. Run after the plan is stored, off the copy's
/// path.
pub async fn size_of(
    from: &RoutingVersion,
    shards: &Shards,
    p: &Partition,
) -> Result<u64, PlanError> {
    let location = p.location();
    match &p.tenant_filter {
        Some(_) if p.task != Task::Revert => {
            let filter = partition_filter(from, p, false).map_err(|e| PlanError::Read {
                location: location.clone(),
                source: mongodb::error::Error::custom(e),
            })?;
            Ok(shards.count(&location, filter).await?)
        }
        _ => Ok(shards.estimated_count(&location).await?),
    }
}

/// The revert copier's partitions: one per target location, every `_id` of it (what reshard
/// wrote there, `_reshard` present, is read through one cursor), sized afterwards.
pub fn plan_revert(to: &RoutingVersion) -> Vec<NewPartition> {
    to.locations()
        .iter()
        .map(|location| NewPartition {
            approx_documents: None,
            ..whole(location, None, 0)
        })
        .collect()
}

/// The event details of a plan: per location, its scope, size and partition count.
pub fn plan_details(plans: &[LocationPlan]) -> serde_json::Value {
    let locations: Vec<serde_json::Value> = plans
        .iter()
        .map(|p| {
            let scope = match &p.scope {
                MoveScope::Nothing => json!({ "scan": "nothing" }),
                MoveScope::Tenants(t) => json!({ "scan": "tenants", "tenants": t }),
                MoveScope::Everything { reason } => {
                    json!({ "scan": "everything", "reason": reason })
                }
            };
            json!({
                "location": p.location.to_string(),
                "scope": scope,
                "approx_documents": p.approx_documents,
                "partitions": p.partitions.len(),
            })
        })
        .collect();
    json!({
        "partitions": plans.iter().map(|p| p.partitions.len()).sum::<usize>(),
        "locations": locations,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_pass_counts_every_id_and_keeps_a_bounded_uniform_sample() {
        let mut pass = IdPass::new(100);
        for i in 0..10_000_i64 {
            pass.observe(&Bson::Int64(i));
        }
        pass.observe(&Bson::Boolean(true));
        assert_eq!(pass.count(), 10_001);
        let sample = pass.into_sample();
        assert_eq!(sample.len(), 100);
        // Uniform: the kept numbers are spread over the whole range, not its start.
        let numbers: Vec<i64> = sample.iter().filter_map(|b| b.as_i64()).collect();
        let mean = numbers.iter().sum::<i64>() as f64 / numbers.len() as f64;
        assert!((3_000.0..7_000.0).contains(&mean), "{mean}");
    }

    fn loc() -> Location {
        Location::new("s1", "orders")
    }

    #[test]
    fn partition_counts_follow_the_size_and_the_workers() {
        // Small collections are one scan, whatever the workers.
        assert_eq!(partition_count(0, Some(100), 1), 1);
        assert_eq!(partition_count(60_000, None, 8), 1);
        // No partition above the size the operator set.
        assert_eq!(partition_count(100, Some(100), 1), 1);
        assert_eq!(partition_count(101, Some(100), 1), 2);
        assert_eq!(partition_count(5_000_000, Some(2_000_000), 1), 3);
        // One per worker while each keeps at least MIN_PARTITION_DOCUMENTS.
        assert_eq!(partition_count(100_000_000, None, 1), 1);
        assert_eq!(partition_count(1_000_000, None, 4), 4);
        assert_eq!(partition_count(250_000, None, 4), 2);
        assert_eq!(partition_count(1_000_000, Some(2_000_000), 4), 4);
        assert_eq!(partition_count(u64::MAX, Some(1), 1), 10_000);
        // Planning reads nothing only when a count could not change the answer.
        assert!(one_partition_unread(None, 1));
        assert!(!one_partition_unread(None, 2));
        assert!(!one_partition_unread(Some(1_000_000), 1));
    }

    #[test]
    fn a_location_is_cut_into_touching_ranges_across_types_that_cover_every_id() {
        // A sample in no order, with ids reshard cannot route (never bounds).
        let mut sample: Vec<Bson> = (0..100)
            .rev()
            .map(|i| Bson::String(format!("o-{i:03}")))
            .collect();
        sample.extend((0..50).map(Bson::Int32));
        sample.push(Bson::Boolean(true));
        sample.push(Bson::Double(f64::NAN));
        let parts = partitions_of(&loc(), sample, 1_500, 3, None);
        assert_eq!(parts.len(), 3);
        assert!(parts.iter().all(|p| p.id_type == ids::ANY_TYPE));
        assert_eq!(parts[0].lower_bound, None);
        assert_eq!(parts[2].upper_bound, None);
        for w in parts.windows(2) {
            assert_eq!(w[0].upper_bound, w[1].lower_bound, "ranges must touch");
        }
        let approx: i64 = parts.iter().map(|p| p.approx_documents.unwrap()).sum();
        assert!((1_490..=1_510).contains(&approx), "{approx}");
        // Every id, of any type, lies in exactly one range.
        let ranges: Vec<IdRange> = parts
            .iter()
            .map(|p| {
                let d = |b: &Option<Vec<u8>>| b.as_deref().map(|b| ids::decode(b).unwrap());
                IdRange::of_type(&p.id_type, d(&p.lower_bound), d(&p.upper_bound)).unwrap()
            })
            .collect();
        for id in [
            Bson::Null,
            Bson::Double(f64::NAN),
            Bson::Int32(-7),
            Bson::Int64(40),
            Bson::String("o-050".into()),
            Bson::String("zzz".into()),
            Bson::Document(doc! { "a": 1 }),
            Bson::Boolean(false),
            Bson::MaxKey,
        ] {
            let holding = ranges.iter().filter(|r| r.contains(&id)).count();
            assert_eq!(holding, 1, "{id} lies in {holding} ranges");
        }
    }

    #[test]
    fn an_unsampled_location_is_one_range_of_everything() {
        let parts = partitions_of(&loc(), vec![], 3, 4, None);
        assert_eq!(parts.len(), 1);
        assert_eq!(
            (parts[0].lower_bound.clone(), parts[0].upper_bound.clone()),
            (None, None)
        );
        assert_eq!(parts[0].approx_documents, Some(3));
    }

    #[test]
    fn a_missing_routing_field_widens_the_scope_to_everything() {
        use crate::routing::{Layout, PlacementRange, TenantBuckets};
        let version = |buckets: u32, field: Option<&str>| {
            RoutingVersion::new(
                "orders",
                "customerId",
                Layout::Hashed {
                    virtual_buckets: 64,
                    default_buckets: 1,
                    tenant_buckets: vec![TenantBuckets {
                        tenant: KeyValue::String("hot".into()),
                        buckets,
                    }],
                    placement: vec![PlacementRange {
                        start: 0,
                        end: 64,
                        shard: "s1".into(),
                    }],
                    routing_field: field.map(String::from),
                },
            )
        };
        let l = version(1, None).location_on("s1");
        assert_eq!(
            location_scope(&version(1, Some("bucket")), &version(4, Some("bucket")), &l),
            MoveScope::Tenants(vec![KeyValue::String("hot".into())])
        );
        assert!(matches!(
            location_scope(&version(1, None), &version(4, Some("bucket")), &l),
            MoveScope::Everything { .. }
        ));
        assert_eq!(
            scope_filter(
                "customerId",
                &MoveScope::Tenants(vec![KeyValue::String("hot".into())])
            ),
            Some(doc! { "customerId": { "$in": ["hot"] } })
        );
    }
}

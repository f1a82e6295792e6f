//! The backfill plan: what to scan at each source location, cut into partitions.
//!
//! Per source location the scope comes from [`routing::scope_at`]: nothing, some tenants (read
//! through the tenant key index, which [`crate::prepare`] creates), or everything. Documents
//! that stay where they are still have to be read when the target's routing field has to be
//! stamped on them, so a routing field the source lacks widens every location to everything.
//! One pass over each location's ids (`_id` only) counts each `_id` type bracket and keeps a
//! uniform sample; each bracket present is cut from its share of the sample into partitions of
//! about `documents_per_partition` documents.

use std::collections::BTreeMap;

use futures::TryStreamExt;
use mongodb::bson::{doc, Bson, Document};
use serde_json::json;

use crate::envelope;
use crate::ids::{self, Bracket};
use crate::routing::{KeyValue, Location, MoveScope, RoutingVersion};
pub use crate::scope::tenant_filter;
use crate::scope::{location_scope, scope_filter};
use crate::settings::MigrationSettings;
use crate::shards::Shards;
use crate::store::partitions::{NewPartition, Partition, Task};

/// The filter of a partition's scan: its tenants (a scoped scan) or what reshard wrote (the
/// revert copier reads the target), and its `_id` range within its bracket, whole or
/// (`from_checkpoint`) after its checkpoint. The one place a partition's range becomes a
/// query, for every task.
pub fn partition_filter(
    from: &RoutingVersion,
    p: &Partition,
    from_checkpoint: bool,
) -> Result<Document, String> {
    let bracket =
        Bracket::parse(&p.id_type).ok_or_else(|| format!("unknown _id type {:?}", p.id_type))?;
    let decode = |b: &Option<Vec<u8>>| b.as_deref().map(ids::decode).transpose();
    let mut filter = match &p.tenant_filter {
        _ if p.task == Task::Revert => envelope::written_by_reshard(),
        Some(tenants) => {
            let tenants: Vec<KeyValue> = serde_json::from_value(tenants.clone())
                .map_err(|e| format!("tenant filter unreadable: {e}"))?;
            tenant_filter(&from.tenant_key, &tenants)
        }
        None => Document::new(),
    };
    let resume = if from_checkpoint {
        decode(&p.last_id)?
    } else {
        None
    };
    filter.extend(ids::range_filter(
        bracket,
        decode(&p.lower_bound)?.as_ref(),
        resume.as_ref(),
        decode(&p.upper_bound)?.as_ref(),
    ));
    Ok(filter)
}

/// What the planner decided for one source location.
#[derive(Clone, Debug, PartialEq)]
pub struct LocationPlan {
    pub location: Location,
    pub scope: MoveScope,
    pub approx_documents: u64,
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
    #[error(
        "{location} holds documents whose _id is a {type_name} (for example {example}); \
         reshard can only route string, integer (or whole double), ObjectId and binary ids"
    )]
    UnsupportedId {
        location: Location,
        type_name: String,
        example: String,
    },
}

/// How many partitions a bracket holding `approx` documents gets.
pub fn partition_count(approx: u64, documents_per_partition: u64) -> usize {
    let per = documents_per_partition.max(1);
    (approx.div_ceil(per)).clamp(1, 10_000) as usize
}

/// Cuts one bracket's sampled ids into partitions.
pub fn partitions_of_bracket(
    location: &Location,
    bracket: Bracket,
    mut sample: Vec<Bson>,
    approx: u64,
    documents_per_partition: u64,
    tenant_filter: Option<&serde_json::Value>,
) -> Vec<NewPartition> {
    sample.sort_by(ids::compare);
    let parts = partition_count(approx, documents_per_partition);
    let points = ids::split_points(&sample, parts);
    let mut bounds: Vec<Option<Bson>> = vec![None];
    bounds.extend(points.into_iter().map(Some));
    bounds.push(None);
    let total = sample.len().max(1) as f64;
    bounds
        .windows(2)
        .map(|w| {
            let in_range = sample
                .iter()
                .filter(|id| {
                    w[0].as_ref()
                        .is_none_or(|l| ids::compare(id, l) != std::cmp::Ordering::Less)
                        && w[1]
                            .as_ref()
                            .is_none_or(|u| ids::compare(id, u) == std::cmp::Ordering::Less)
                })
                .count() as f64;
            NewPartition {
                source_shard: location.shard.clone(),
                source_collection: location.collection.clone(),
                id_type: bracket.name().to_owned(),
                lower_bound: w[0].as_ref().map(ids::encode),
                upper_bound: w[1].as_ref().map(ids::encode),
                tenant_filter: tenant_filter.cloned(),
                approx_documents: Some(if sample.is_empty() {
                    approx as i64
                } else {
                    (approx as f64 * in_range / total).round() as i64
                }),
            }
        })
        .collect()
}

/// How many ids the planner keeps per source location to cut partitions from.
pub const MAX_SAMPLE: usize = 20_000;

/// What one pass over a location's ids learns: how many there are of each `_id` type bracket,
/// the first id reshard cannot route, and a uniform sample of at most `capacity` ids (reservoir
/// sampling, seeded: the same ids in the same order give the same plan). Pure: fed id by id.
#[derive(Clone, Debug)]
pub struct IdPass {
    capacity: usize,
    seen: u64,
    per_bracket: BTreeMap<Bracket, u64>,
    sample: Vec<Bson>,
    rng: rand::rngs::StdRng,
}

impl IdPass {
    pub fn new(capacity: usize) -> IdPass {
        use rand::SeedableRng;
        IdPass {
            capacity: capacity.max(1),
            seen: 0,
            per_bracket: BTreeMap::new(),
            sample: Vec::new(),
            rng: rand::rngs::StdRng::seed_from_u64(0x007e_5a4d),
        }
    }

    /// Takes one id; `Err(id)` for an id of a type reshard cannot route (it would belong to no
    /// partition: every scan would skip it), or a NaN, which sorts below every bracket's floor.
    pub fn observe(&mut self, id: &Bson) -> Result<(), Bson> {
        let routable = match id {
            Bson::Double(d) => !d.is_nan(),
            Bson::Int32(_)
            | Bson::Int64(_)
            | Bson::String(_)
            | Bson::ObjectId(_)
            | Bson::Binary(_) => true,
            _ => false,
        };
        let bracket = Bracket::of(id)
            .filter(|_| routable)
            .ok_or_else(|| id.clone())?;
        *self.per_bracket.entry(bracket).or_default() += 1;
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
        Ok(())
    }

    /// Ids seen.
    pub fn count(&self) -> u64 {
        self.seen
    }

    /// The location's partitions: each bracket present cut from its share of the sample into
    /// partitions of about `documents_per_partition` (by its exact count).
    pub fn partitions(
        self,
        location: &Location,
        documents_per_partition: u64,
        tenant_filter: Option<&serde_json::Value>,
    ) -> Vec<NewPartition> {
        let mut by_bracket: BTreeMap<Bracket, Vec<Bson>> = BTreeMap::new();
        for id in self.sample {
            if let Some(b) = Bracket::of(&id) {
                by_bracket.entry(b).or_default().push(id);
            }
        }
        let mut out = Vec::new();
        for (bracket, count) in self.per_bracket {
            out.extend(partitions_of_bracket(
                location,
                bracket,
                by_bracket.remove(&bracket).unwrap_or_default(),
                count,
                documents_per_partition,
                tenant_filter,
            ));
        }
        out
    }
}

/// Plans every source location of `from`. Reads only: the caller stores the plan.
///
/// One pass per location: the ids in scope, `_id` only (on MongoDB a covered scan of the `_id`
/// index, or of the tenant index `{tenant, _id}` for a scoped location), counted per type
/// bracket and sampled as they stream by. Nothing else is read: no count, no `$sample`, no
/// probe per bracket.
pub async fn plan(
    from: &RoutingVersion,
    to: &RoutingVersion,
    shards: &Shards,
    settings: &MigrationSettings,
) -> Result<Vec<LocationPlan>, PlanError> {
    let mut plans = Vec::new();
    for location in from.locations() {
        let scope = location_scope(from, to, &location);
        let Some(filter) = scope_filter(&from.tenant_key, &scope) else {
            plans.push(LocationPlan {
                location,
                scope,
                approx_documents: 0,
                partitions: Vec::new(),
            });
            continue;
        };
        let coll = shards
            .collection(&location)
            .map_err(|e| PlanError::UnknownShard(e.0))?;
        let read = |source| PlanError::Read {
            location: location.clone(),
            source,
        };
        let tenant_json = match &scope {
            MoveScope::Tenants(tenants) => Some(json!(tenants)),
            _ => None,
        };
        let mut pass = IdPass::new(MAX_SAMPLE);
        // Unscoped, the `_id` index answers alone (a covered scan; without the hint MongoDB
        // would read every document); scoped, the tenant index `{tenant, _id}` does.
        let hint = filter
            .is_empty()
            .then(|| mongodb::options::Hint::Keys(doc! { "_id": 1 }));
        let options = mongodb::options::FindOptions::builder()
            .projection(doc! { "_id": 1 })
            .batch_size(10_000)
            .hint(hint)
            .build();
        let mut cursor = coll
            .find(filter)
            .with_options(options)
            .await
            .map_err(read)?;
        while let Some(d) = cursor.try_next().await.map_err(read)? {
            let id = d.get("_id").cloned().unwrap_or(Bson::Null);
            if let Err(odd) = pass.observe(&id) {
                return Err(PlanError::UnsupportedId {
                    location: location.clone(),
                    type_name: format!("{:?}", odd.element_type()),
                    example: ids::text(&odd),
                });
            }
        }
        let approx = pass.count();
        let partitions = pass.partitions(
            &location,
            settings.documents_per_partition,
            tenant_json.as_ref(),
        );
        plans.push(LocationPlan {
            location,
            scope,
            approx_documents: approx,
            partitions,
        });
    }
    Ok(plans)
}

/// The revert copier's partitions: one per `_id` bracket present at each target location
/// (what reshard wrote there, `_reshard` present, is read through one cursor each).
pub async fn plan_revert(
    to: &RoutingVersion,
    shards: &Shards,
) -> Result<Vec<NewPartition>, PlanError> {
    let mut partitions = Vec::new();
    for location in to.locations() {
        let coll = shards
            .collection(&location)
            .map_err(|e| PlanError::UnknownShard(e.0))?;
        for bracket in Bracket::ALL {
            let mut probe = envelope::written_by_reshard();
            probe.insert("_id", doc! { "$gte": bracket.floor() });
            let found = coll
                .find_one(probe)
                .projection(doc! { "_id": 1 })
                .await
                .map_err(|source| PlanError::Read {
                    location: location.clone(),
                    source,
                })?;
            if found.is_some() {
                partitions.push(NewPartition {
                    source_shard: location.shard.clone(),
                    source_collection: location.collection.clone(),
                    id_type: bracket.name().to_owned(),
                    lower_bound: None,
                    upper_bound: None,
                    tenant_filter: None,
                    approx_documents: None,
                });
            }
        }
    }
    Ok(partitions)
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
    fn one_pass_counts_brackets_refuses_unroutable_ids_and_keeps_a_bounded_uniform_sample() {
        let mut pass = IdPass::new(100);
        for i in 0..10_000_i64 {
            pass.observe(&Bson::Int64(i)).unwrap();
        }
        for i in 0..50 {
            pass.observe(&Bson::String(format!("s-{i:03}"))).unwrap();
        }
        assert_eq!(pass.count(), 10_050);
        assert_eq!(pass.sample.len(), 100);
        // Uniform: the kept numbers are spread over the whole range, not its start.
        let numbers: Vec<i64> = pass.sample.iter().filter_map(|b| b.as_i64()).collect();
        let mean = numbers.iter().sum::<i64>() as f64 / numbers.len() as f64;
        assert!((3_000.0..7_000.0).contains(&mean), "{mean}");
        for odd in [
            Bson::Double(f64::NAN),
            Bson::Null,
            Bson::Boolean(true),
            Bson::Decimal128(mongodb::bson::Decimal128::from_bytes([0; 16])),
        ] {
            // (NaN != NaN: compare what an operator is shown.)
            let refused = pass.clone().observe(&odd).unwrap_err();
            assert_eq!(format!("{refused:?}"), format!("{odd:?}"));
        }
        let parts = pass.partitions(&loc(), 2_500, None);
        let numbers: Vec<_> = parts.iter().filter(|p| p.id_type == "number").collect();
        let strings: Vec<_> = parts.iter().filter(|p| p.id_type == "string").collect();
        assert_eq!(numbers.len(), 4, "{parts:?}");
        assert_eq!(strings.len(), 1, "{parts:?}");
        let total: i64 = parts.iter().map(|p| p.approx_documents.unwrap()).sum();
        assert!((10_000..=10_100).contains(&total), "{total}");
        assert_eq!(strings[0].approx_documents, Some(50));
    }

    fn loc() -> Location {
        Location::new("s1", "orders")
    }

    #[test]
    fn partition_counts_round_up_and_are_bounded() {
        assert_eq!(partition_count(0, 100), 1);
        assert_eq!(partition_count(100, 100), 1);
        assert_eq!(partition_count(101, 100), 2);
        assert_eq!(partition_count(u64::MAX, 1), 10_000);
    }

    #[test]
    fn a_bracket_is_cut_into_contiguous_ranges_covering_it() {
        let sample: Vec<Bson> = (0..100)
            .rev()
            .map(|i| Bson::String(format!("o-{i:03}")))
            .collect();
        let parts = partitions_of_bracket(&loc(), Bracket::String, sample, 1_000, 250, None);
        assert_eq!(parts.len(), 4);
        assert_eq!(parts[0].lower_bound, None);
        assert_eq!(parts[3].upper_bound, None);
        for w in parts.windows(2) {
            assert_eq!(w[0].upper_bound, w[1].lower_bound, "ranges must touch");
        }
        let approx: i64 = parts.iter().map(|p| p.approx_documents.unwrap()).sum();
        assert_eq!(approx, 1_000);
        assert!(parts.iter().all(|p| p.id_type == "string"));
    }

    #[test]
    fn an_unsampled_bracket_is_one_partition() {
        let parts = partitions_of_bracket(&loc(), Bracket::Number, vec![], 3, 100, None);
        assert_eq!(parts.len(), 1);
        assert_eq!(
            (parts[0].lower_bound.clone(), parts[0].upper_bound.clone()),
            (None, None)
        );
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

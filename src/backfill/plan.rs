//! The backfill plan: what to scan at each source location, cut into partitions.
//!
//! Per source location the scope comes from [`routing::scope_at`]: nothing, some tenants (read
//! through the tenant key index, which [`crate::prepare`] creates), or everything. Documents
//! that stay where they are still have to be read when the target's routing field has to be
//! stamped on them, so a routing field the source lacks widens every location to everything.
//! Each `_id` type bracket present is cut from a random sample of ids into partitions of about
//! `documents_per_partition` documents.

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

/// Plans every source location of `from`. Reads only: the caller stores the plan.
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
        let approx = if filter.is_empty() {
            coll.estimated_document_count().await.map_err(read)?
        } else {
            coll.count_documents(filter.clone()).await.map_err(read)?
        };
        let tenant_json = match &scope {
            MoveScope::Tenants(tenants) => Some(json!(tenants)),
            _ => None,
        };

        // Ids of a type reshard cannot route would belong to no partition, and a NaN id
        // sorts below every bracket floor (`{$gte: -Infinity}` does not match it): either
        // would be skipped by every scan. Other unroutable numbers (a fraction) sit inside
        // the number bracket and become dead letters there.
        let mut unsupported = filter.clone();
        unsupported.insert(
            "$or",
            vec![
                doc! { "_id": { "$not": { "$type": ids::ROUTABLE_TYPES.to_vec() } } },
                doc! { "_id": f64::NAN },
            ],
        );
        if let Some(odd) = coll
            .find_one(unsupported)
            .projection(doc! { "_id": 1 })
            .await
            .map_err(read)?
        {
            let id = odd.get("_id").cloned().unwrap_or(Bson::Null);
            return Err(PlanError::UnsupportedId {
                location: location.clone(),
                type_name: format!("{:?}", id.element_type()),
                example: ids::text(&id),
            });
        }

        let wanted = partition_count(approx, settings.documents_per_partition);
        let sample_size = (wanted * 32).clamp(256, 20_000) as i64;
        let mut pipeline = Vec::new();
        if !filter.is_empty() {
            pipeline.push(doc! { "$match": filter.clone() });
        }
        pipeline.push(doc! { "$sample": { "size": sample_size } });
        pipeline.push(doc! { "$project": { "_id": 1 } });
        let sampled: Vec<Document> = coll
            .aggregate(pipeline)
            .await
            .map_err(read)?
            .try_collect()
            .await
            .map_err(read)?;
        let mut by_bracket: BTreeMap<Bracket, Vec<Bson>> = BTreeMap::new();
        for d in sampled {
            if let Some(id) = d.get("_id") {
                if let Some(b) = Bracket::of(id) {
                    by_bracket.entry(b).or_default().push(id.clone());
                }
            }
        }
        let sampled_total: usize = by_bracket.values().map(Vec::len).sum();

        let mut partitions = Vec::new();
        for bracket in Bracket::ALL {
            // A bracket the sample missed may still hold a few documents: look.
            let mut probe = filter.clone();
            probe.insert("_id", doc! { "$gte": bracket.floor() });
            let present = by_bracket.contains_key(&bracket)
                || coll
                    .find_one(probe)
                    .projection(doc! { "_id": 1 })
                    .await
                    .map_err(read)?
                    .is_some();
            if !present {
                continue;
            }
            let sample = by_bracket.remove(&bracket).unwrap_or_default();
            let share = if sampled_total == 0 {
                approx
            } else {
                (approx as f64 * sample.len() as f64 / sampled_total as f64).round() as u64
            };
            partitions.extend(partitions_of_bracket(
                &location,
                bracket,
                sample,
                share,
                settings.documents_per_partition,
                tenant_json.as_ref(),
            ));
        }
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

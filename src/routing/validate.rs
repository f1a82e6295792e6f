//! Validation of a routing version before it is stored.
//!
//! A version is immutable once stored and every document of the collection is
//! routed by it, so mistakes have to be caught before: a placement gap would
//! strand documents, an overlap would make two shards claim them, an unknown
//! shard would fail every write. Validation reports every problem at once, each
//! with the field path it concerns, so an operator can fix a spec file in one
//! pass (and `spec` can point each problem at a line of that file).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use super::{KeyValue, Layout, RoutingVersion};

/// What validation needs to know beyond the version itself.
#[derive(Clone, Copy, Debug)]
pub struct ValidationContext<'a> {
    /// The shards registered in the store.
    pub registered_shards: &'a BTreeSet<String>,
    /// `V` of the collection's earlier versions, if any; `V` stays fixed for a collection.
    pub previous_virtual_buckets: Option<u32>,
}

/// One problem with a routing version.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ValidationError {
    /// The field path, like `placement[1].vbuckets` or `tenant_buckets[0].buckets`.
    pub path: String,
    /// What is wrong, in a sentence an operator can act on.
    pub message: String,
}

/// Prints `path: message`.
impl fmt::Display for ValidationError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.path, self.message)
    }
}

impl std::error::Error for ValidationError {}

/// Collects problems in the order they are found.
struct Problems(Vec<ValidationError>);

impl Problems {
    fn add(&mut self, path: impl Into<String>, message: impl Into<String>) {
        self.0.push(ValidationError {
            path: path.into(),
            message: message.into(),
        });
    }

    fn field_name(&mut self, path: &str, name: &str) {
        if name.is_empty() {
            self.add(path, "field name must not be empty");
        } else if name.starts_with('$') {
            self.add(path, format!("field name {name:?} must not start with '$'"));
        }
    }

    fn shard(&mut self, path: impl Into<String>, shard: &str, ctx: &ValidationContext<'_>) {
        if ctx.registered_shards.contains(shard) {
            return;
        }
        let registered = if ctx.registered_shards.is_empty() {
            "no shards are registered".to_owned()
        } else {
            format!("registered shards: {}", join(ctx.registered_shards.iter()))
        };
        self.add(path, format!("unknown shard {shard:?}; {registered}"));
    }

    /// A bucket count is at least 1 and at most `V`: a tenant's sub-buckets hash onto vbuckets,
    /// so it never spreads over more than `V` of them, and buckets beyond `V` only collide
    /// (they would cost a larger scan and fan-out for nothing).
    fn bucket_count(&mut self, path: String, buckets: u32, virtual_buckets: u32) {
        if buckets == 0 {
            self.add(path, "bucket count must be at least 1");
        } else if virtual_buckets > 0 && buckets > virtual_buckets {
            self.add(
                path,
                format!(
                    "{buckets} buckets exceed virtual_buckets ({virtual_buckets}): a tenant \
                     spreads over at most {virtual_buckets} distinct vbuckets, so buckets beyond \
                     that only collide; use at most {virtual_buckets}"
                ),
            );
        }
    }

    /// Reports every tenant listed more than once, at its later entries.
    fn unique_tenants<'k>(&mut self, list: &str, tenants: impl Iterator<Item = &'k KeyValue>) {
        let mut first_seen: BTreeMap<&KeyValue, usize> = BTreeMap::new();
        for (index, tenant) in tenants.enumerate() {
            if let Some(first) = first_seen.get(tenant) {
                self.add(
                    format!("{list}[{index}].tenant"),
                    format!("tenant {tenant} is listed twice (first at {list}[{first}])"),
                );
            } else {
                first_seen.insert(tenant, index);
            }
        }
    }
}

fn join<T: fmt::Display>(items: impl Iterator<Item = T>) -> String {
    items
        .map(|item| item.to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

impl RoutingVersion {
    /// Checks the version against itself and its context, reporting every problem.
    pub fn validate(&self, ctx: &ValidationContext<'_>) -> Result<(), Vec<ValidationError>> {
        let mut problems = Problems(Vec::new());
        if let Err(rule) = crate::names::collection(&self.collection, None) {
            problems.add("collection", rule);
        }
        problems.field_name("tenant_key", &self.tenant_key);
        problems.field_name("id_field", &self.id_field);

        match self.layout() {
            Layout::Hashed {
                virtual_buckets,
                default_buckets,
                tenant_buckets,
                placement,
                routing_field,
            } => {
                let virtual_buckets = *virtual_buckets;
                if virtual_buckets == 0 {
                    problems.add("virtual_buckets", "virtual_buckets must be at least 1");
                }
                if let Some(previous) = ctx.previous_virtual_buckets {
                    if previous != virtual_buckets {
                        problems.add(
                            "virtual_buckets",
                            format!(
                                "virtual_buckets is {virtual_buckets} but earlier versions of this \
                                 collection use {previous}; V stays fixed for a collection"
                            ),
                        );
                    }
                }
                problems.bucket_count("default_buckets".into(), *default_buckets, virtual_buckets);
                for (index, entry) in tenant_buckets.iter().enumerate() {
                    problems.bucket_count(
                        format!("tenant_buckets[{index}].buckets"),
                        entry.buckets,
                        virtual_buckets,
                    );
                }
                problems.unique_tenants(
                    "tenant_buckets",
                    tenant_buckets.iter().map(|entry| &entry.tenant),
                );
                check_placement(&mut problems, placement, virtual_buckets, ctx);
                if let Some(field) = routing_field {
                    problems.field_name("routing_field", field);
                    if *field == self.tenant_key || *field == self.id_field {
                        problems.add(
                            "routing_field",
                            format!(
                                "routing_field {field:?} must differ from tenant_key and id_field"
                            ),
                        );
                    }
                }
            }
            Layout::Fanout { shards } => {
                if shards.is_empty() {
                    problems.add("shards", "a fanout layout must list at least one shard");
                }
                let mut seen = BTreeSet::new();
                for (index, shard) in shards.iter().enumerate() {
                    problems.shard(format!("shards[{index}]"), shard, ctx);
                    if !seen.insert(shard) {
                        problems.add(
                            format!("shards[{index}]"),
                            format!("shard {shard:?} is listed twice"),
                        );
                    }
                }
            }
            Layout::TenantTable {
                tenants,
                default_shard,
            } => {
                if tenants.is_empty() && default_shard.is_none() {
                    problems.add(
                        "tenants",
                        "the tenant table is empty and there is no default_shard, \
                         so no document could be located",
                    );
                }
                for (index, row) in tenants.iter().enumerate() {
                    problems.shard(format!("tenants[{index}].shard"), &row.shard, ctx);
                }
                problems.unique_tenants("tenants", tenants.iter().map(|row| &row.tenant));
                if let Some(shard) = default_shard {
                    problems.shard("default_shard", shard, ctx);
                }
            }
        }

        let used = self.shards();
        for (shard, collection) in &self.collections {
            if !used.contains(shard) {
                problems.add(
                    format!("collections.{shard}"),
                    format!(
                        "shard {shard:?} is not used by this version (it uses {})",
                        join(used.iter())
                    ),
                );
            }
            if let Err(rule) = crate::names::collection(collection, None) {
                problems.add(format!("collections.{shard}"), rule);
            }
        }

        if problems.0.is_empty() {
            Ok(())
        } else {
            Err(problems.0)
        }
    }
}

/// Checks that the placement ranges are well-formed, name registered shards and
/// cover `[0, V)` exactly once.
fn check_placement(
    problems: &mut Problems,
    placement: &[super::PlacementRange],
    virtual_buckets: u32,
    ctx: &ValidationContext<'_>,
) {
    // Well-formed ranges, clipped to [0, V), with their index, for the coverage sweep.
    let mut ranges = Vec::new();
    for (index, range) in placement.iter().enumerate() {
        let path = format!("placement[{index}].vbuckets");
        let (start, end) = (range.start, range.end);
        if start >= end {
            problems.add(
                path,
                format!("range [{start}, {end}) is empty; its start must be below its end"),
            );
        } else if end > virtual_buckets {
            problems.add(
                path,
                format!(
                    "range [{start}, {end}) ends beyond virtual_buckets ({virtual_buckets}); \
                     vbuckets run from 0 to {virtual_buckets}"
                ),
            );
            if start < virtual_buckets {
                ranges.push((start, virtual_buckets, index));
            }
        } else {
            ranges.push((start, end, index));
        }
        problems.shard(format!("placement[{index}].shard"), &range.shard, ctx);
    }
    if virtual_buckets == 0 {
        return;
    }

    ranges.sort();
    // `covered` is the end of the coverage so far; `reaching` the range that reaches it.
    let mut covered = 0u32;
    let mut reaching: Option<usize> = None;
    for (start, end, index) in ranges {
        if start > covered {
            problems.add(
                "placement",
                format!("vbuckets [{covered}, {start}) are not placed by any range"),
            );
        } else if start < covered {
            let overlap_end = end.min(covered);
            let other = reaching.expect("coverage beyond 0 comes from a range");
            problems.add(
                format!("placement[{index}].vbuckets"),
                format!(
                    "vbuckets [{start}, {overlap_end}) are placed by both placement[{other}] \
                     and placement[{index}]"
                ),
            );
        }
        if end > covered {
            covered = end;
            reaching = Some(index);
        }
    }
    if covered < virtual_buckets {
        problems.add(
            "placement",
            format!("vbuckets [{covered}, {virtual_buckets}) are not placed by any range"),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::routing::{PlacementRange, TenantBuckets, TenantShard};

    fn registered() -> BTreeSet<String> {
        ["s1", "s2", "s3"].map(String::from).into()
    }

    fn range(start: u32, end: u32, shard: &str) -> PlacementRange {
        PlacementRange {
            start,
            end,
            shard: shard.into(),
        }
    }

    fn hashed(placement: Vec<PlacementRange>) -> RoutingVersion {
        RoutingVersion::new(
            "orders",
            "customerId",
            Layout::Hashed {
                virtual_buckets: 1024,
                default_buckets: 1,
                tenant_buckets: vec![],
                placement,
                routing_field: None,
            },
        )
    }

    fn problems(version: &RoutingVersion, previous: Option<u32>) -> Vec<String> {
        let shards = registered();
        let ctx = ValidationContext {
            registered_shards: &shards,
            previous_virtual_buckets: previous,
        };
        match version.validate(&ctx) {
            Ok(()) => vec![],
            Err(errors) => errors.iter().map(ToString::to_string).collect(),
        }
    }

    #[test]
    fn a_good_version_passes() {
        let version = hashed(vec![range(512, 1024, "s2"), range(0, 512, "s1")]);
        assert_eq!(problems(&version, Some(1024)), Vec::<String>::new());
    }

    #[test]
    fn gaps_and_overlaps_are_named() {
        let version = hashed(vec![
            range(0, 512, "s1"),
            range(500, 600, "s2"),
            range(700, 1024, "s3"),
        ]);
        assert_eq!(
            problems(&version, None),
            vec![
                "placement[1].vbuckets: vbuckets [500, 512) are placed by both placement[0] and placement[1]",
                "placement: vbuckets [600, 700) are not placed by any range",
            ]
        );
        let short = hashed(vec![range(0, 512, "s1")]);
        assert_eq!(
            problems(&short, None),
            vec!["placement: vbuckets [512, 1024) are not placed by any range"]
        );
        let empty = hashed(vec![]);
        assert_eq!(
            problems(&empty, None),
            vec!["placement: vbuckets [0, 1024) are not placed by any range"]
        );
    }

    #[test]
    fn malformed_ranges_and_unknown_shards() {
        let version = hashed(vec![
            range(0, 0, "s1"),
            range(0, 1024, "s9"),
            range(1000, 2000, "s1"),
        ]);
        assert_eq!(
            problems(&version, None),
            vec![
                "placement[0].vbuckets: range [0, 0) is empty; its start must be below its end",
                "placement[1].shard: unknown shard \"s9\"; registered shards: s1, s2, s3",
                "placement[2].vbuckets: range [1000, 2000) ends beyond virtual_buckets (1024); vbuckets run from 0 to 1024",
                "placement[2].vbuckets: vbuckets [1000, 1024) are placed by both placement[1] and placement[2]",
            ]
        );
    }

    #[test]
    fn bucket_counts_and_duplicate_tenants() {
        let mut version = hashed(vec![range(0, 1024, "s1")]);
        if let Layout::Hashed {
            default_buckets,
            tenant_buckets,
            ..
        } = version.layout_mut()
        {
            *default_buckets = 0;
            let tenant = KeyValue::String("cust-1".into());
            tenant_buckets.push(TenantBuckets {
                tenant: tenant.clone(),
                buckets: 0,
            });
            tenant_buckets.push(TenantBuckets { tenant, buckets: 4 });
        }
        assert_eq!(
            problems(&version, None),
            vec![
                "default_buckets: bucket count must be at least 1",
                "tenant_buckets[0].buckets: bucket count must be at least 1",
                "tenant_buckets[1].tenant: tenant cust-1 is listed twice (first at tenant_buckets[0])",
            ]
        );
    }

    #[test]
    fn virtual_buckets_must_be_positive_and_fixed() {
        let mut zero = hashed(vec![]);
        if let Layout::Hashed {
            virtual_buckets, ..
        } = zero.layout_mut()
        {
            *virtual_buckets = 0;
        }
        assert_eq!(
            problems(&zero, None),
            vec!["virtual_buckets: virtual_buckets must be at least 1"]
        );
        let version = hashed(vec![range(0, 1024, "s1")]);
        assert_eq!(
            problems(&version, Some(2048)),
            vec![
                "virtual_buckets: virtual_buckets is 1024 but earlier versions of this collection \
                 use 2048; V stays fixed for a collection"
            ]
        );
    }

    #[test]
    fn field_names_and_collections() {
        let mut version = hashed(vec![range(0, 1024, "s1")]).with_id_field("");
        version.tenant_key = "customerId".into();
        version.collections.insert("s2".into(), "orders_v2".into());
        version.collections.insert("s1".into(), String::new());
        if let Layout::Hashed { routing_field, .. } = version.layout_mut() {
            *routing_field = Some("customerId".into());
        }
        assert_eq!(
            problems(&version, None),
            vec![
                "id_field: field name must not be empty",
                "routing_field: routing_field \"customerId\" must differ from tenant_key and id_field",
                "collections.s1: a MongoDB collection name must not be empty",
                "collections.s2: shard \"s2\" is not used by this version (it uses s1)",
            ]
        );
    }

    #[test]
    fn fanout_and_tenant_table_checks() {
        let fanout = RoutingVersion::new(
            "orders",
            "customerId",
            Layout::Fanout {
                shards: vec!["s1".into(), "s1".into(), "s7".into()],
            },
        );
        assert_eq!(
            problems(&fanout, Some(1024)),
            vec![
                "shards[1]: shard \"s1\" is listed twice",
                "shards[2]: unknown shard \"s7\"; registered shards: s1, s2, s3",
            ]
        );
        let empty_table = RoutingVersion::new(
            "orders",
            "customerId",
            Layout::TenantTable {
                tenants: vec![],
                default_shard: None,
            },
        );
        assert_eq!(
            problems(&empty_table, None),
            vec!["tenants: the tenant table is empty and there is no default_shard, so no document could be located"]
        );
        let tenant = KeyValue::Int(5);
        let table = RoutingVersion::new(
            "orders",
            "customerId",
            Layout::TenantTable {
                tenants: vec![
                    TenantShard {
                        tenant: tenant.clone(),
                        shard: "s1".into(),
                    },
                    TenantShard {
                        tenant,
                        shard: "s8".into(),
                    },
                ],
                default_shard: Some("s9".into()),
            },
        );
        assert_eq!(
            problems(&table, None),
            vec![
                "tenants[1].shard: unknown shard \"s8\"; registered shards: s1, s2, s3",
                "tenants[1].tenant: tenant int:5 is listed twice (first at tenants[0])",
                "default_shard: unknown shard \"s9\"; registered shards: s1, s2, s3",
            ]
        );
    }
}

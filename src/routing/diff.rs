//! What a migration from one routing version to another has to move.
//!
//! Backfill cost is dominated by how much of the source it has to scan. When the
//! two versions differ only in the bucket counts of some tenants, only those
//! tenants' documents can move, and the backfill scans just them (by the tenant
//! key index). Any other change — placement, the default bucket count, the key
//! fields, a layout not made by reshard — can move any document, so everything
//! is scanned. [`diff`] makes that decision once per migration; [`moves`] answers
//! it per document.

use std::collections::BTreeSet;
use std::ops::Range;

use super::{KeyValue, Layout, Location, RoutingError, RoutingVersion};

/// The result of comparing two routing versions.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VersionDiff {
    /// Which source documents may change location.
    pub scope: MoveScope,
    /// For two hashed versions with the same `V`: the vbuckets whose location
    /// (shard and collection) differs. Empty otherwise.
    pub moved_vbuckets: Vec<Range<u32>>,
    /// The target's routing field, when documents that stay in place have to
    /// get it stamped (the source does not carry it under that name).
    /// Note that this applies to every document that stays, even when `scope`
    /// is [`MoveScope::Nothing`].
    pub stamp_routing_field: Option<String>,
}

/// Which source documents may change location.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MoveScope {
    /// No document changes location.
    Nothing,
    /// Only documents of these tenants (sorted) may change location.
    Tenants(Vec<KeyValue>),
    /// Any document may change location.
    Everything {
        /// Why, for the operator.
        reason: String,
    },
}

/// Compares two routing versions of a collection.
pub fn diff(from: &RoutingVersion, to: &RoutingVersion) -> VersionDiff {
    let mut reasons = Vec::new();
    let mut moved_vbuckets = Vec::new();
    let mut tenants = BTreeSet::new();

    if from.tenant_key != to.tenant_key {
        reasons.push(format!(
            "the tenant key changes from {:?} to {:?}",
            from.tenant_key, to.tenant_key
        ));
    }
    if from.id_field != to.id_field {
        reasons.push(format!(
            "the id field changes from {:?} to {:?}",
            from.id_field, to.id_field
        ));
    }

    match (from.layout(), to.layout()) {
        (
            Layout::Hashed {
                virtual_buckets: from_v,
                default_buckets: from_default,
                tenant_buckets: from_tenants,
                ..
            },
            Layout::Hashed {
                virtual_buckets: to_v,
                default_buckets: to_default,
                tenant_buckets: to_tenants,
                ..
            },
        ) => {
            if from_v != to_v {
                reasons.push(format!("virtual_buckets changes from {from_v} to {to_v}"));
            } else {
                moved_vbuckets = moved_ranges(from, to, *to_v);
                if let Some(first) = moved_vbuckets.first() {
                    let count: u32 = moved_vbuckets
                        .iter()
                        .map(|range| range.end - range.start)
                        .sum();
                    reasons.push(format!(
                        "the placement changes for {count} of {to_v} vbuckets (first [{}, {}))",
                        first.start, first.end
                    ));
                }
            }
            if from_default != to_default {
                reasons.push(format!(
                    "the default bucket count changes from {from_default} to {to_default}, \
                     which can move documents of every tenant"
                ));
            }
            for tenant in from_tenants
                .iter()
                .map(|entry| &entry.tenant)
                .chain(to_tenants.iter().map(|entry| &entry.tenant))
            {
                if from.buckets_of(tenant) != to.buckets_of(tenant) {
                    tenants.insert(tenant.clone());
                }
            }
        }
        (from_layout, to_layout) => {
            let kind = |layout: &Layout| match layout {
                Layout::Hashed { .. } => "a hashed layout",
                Layout::Fanout { .. } => "a fanout layout",
                Layout::TenantTable { .. } => "a tenant table",
            };
            reasons.push(format!(
                "the source is {} and the target is {}; only two hashed layouts can be compared",
                kind(from_layout),
                kind(to_layout)
            ));
        }
    }

    let scope = if !reasons.is_empty() {
        MoveScope::Everything {
            reason: reasons.join("; "),
        }
    } else if tenants.is_empty() {
        MoveScope::Nothing
    } else {
        MoveScope::Tenants(tenants.into_iter().collect())
    };
    let stamp_routing_field = match to.routing_field() {
        Some(field) if from.routing_field() != Some(field) => Some(field.to_owned()),
        _ => None,
    };
    VersionDiff {
        scope,
        moved_vbuckets,
        stamp_routing_field,
    }
}

/// What a backfill has to scan at one source location of `from`.
///
/// This refines [`diff`] per location: when the only version-wide change is the placement,
/// a source location none of whose vbuckets move keeps every document whose tenant keeps its
/// bucket count, so only the tenants of [`VersionDiff::scope`]'s bucket changes are scanned
/// there. A location that owns a moved vbucket (or any other version-wide change) is scanned
/// whole. Stamping is not considered here: see [`VersionDiff::stamp_routing_field`].
pub fn scope_at(from: &RoutingVersion, to: &RoutingVersion, location: &Location) -> MoveScope {
    let d = diff(from, to);
    let (
        Layout::Hashed {
            virtual_buckets: from_v,
            default_buckets: from_default,
            placement,
            ..
        },
        Layout::Hashed {
            virtual_buckets: to_v,
            default_buckets: to_default,
            ..
        },
    ) = (from.layout(), to.layout())
    else {
        return d.scope;
    };
    let placement_only = from.tenant_key == to.tenant_key
        && from.id_field == to.id_field
        && from_v == to_v
        && from_default == to_default;
    if !placement_only || d.moved_vbuckets.is_empty() {
        return d.scope;
    }
    let owned = placement
        .iter()
        .filter(|range| &from.location_on(&range.shard) == location);
    for range in owned {
        if let Some(moved) = d
            .moved_vbuckets
            .iter()
            .find(|m| m.start < range.end && range.start < m.end)
        {
            return MoveScope::Everything {
                reason: format!(
                    "vbuckets [{}, {}) of {} move to another location",
                    moved.start.max(range.start),
                    moved.end.min(range.end),
                    location
                ),
            };
        }
    }
    let mut tenants = BTreeSet::new();
    if let (
        Layout::Hashed {
            tenant_buckets: from_tenants,
            ..
        },
        Layout::Hashed {
            tenant_buckets: to_tenants,
            ..
        },
    ) = (from.layout(), to.layout())
    {
        for tenant in from_tenants
            .iter()
            .chain(to_tenants.iter())
            .map(|entry| &entry.tenant)
        {
            if from.buckets_of(tenant) != to.buckets_of(tenant) {
                tenants.insert(tenant.clone());
            }
        }
    }
    if tenants.is_empty() {
        MoveScope::Nothing
    } else {
        MoveScope::Tenants(tenants.into_iter().collect())
    }
}

/// The vbucket ranges whose location differs between two hashed versions with
/// the same `V`, merged and sorted. Locations are constant between the range
/// boundaries of the two placements, so only those segments are compared.
fn moved_ranges(
    from: &RoutingVersion,
    to: &RoutingVersion,
    virtual_buckets: u32,
) -> Vec<Range<u32>> {
    let mut boundaries = BTreeSet::from([0, virtual_buckets]);
    for version in [from, to] {
        if let Layout::Hashed { placement, .. } = version.layout() {
            for range in placement {
                boundaries.extend(
                    [range.start, range.end]
                        .into_iter()
                        .filter(|&b| b < virtual_buckets),
                );
            }
        }
    }
    let boundaries: Vec<u32> = boundaries.into_iter().collect();
    let mut moved: Vec<Range<u32>> = Vec::new();
    for segment in boundaries.windows(2) {
        let (start, end) = (segment[0], segment[1]);
        if from.location_of_vbucket(start) == to.location_of_vbucket(start) {
            continue;
        }
        match moved.last_mut() {
            Some(last) if last.end == start => last.end = end,
            _ => moved.push(start..end),
        }
    }
    moved
}

/// Whether the document with this tenant and id changes location between the
/// two versions. A fanout source answers with every location it lists, so a
/// document counts as moving unless both versions name exactly the same locations.
pub fn moves(
    from: &RoutingVersion,
    to: &RoutingVersion,
    tenant: &KeyValue,
    id: &KeyValue,
) -> Result<bool, RoutingError> {
    let before = from.locate(tenant, id)?;
    let after = to.locate(tenant, id)?;
    Ok(before.locations != after.locations)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::routing::{PlacementRange, TenantBuckets};

    fn string(text: &str) -> KeyValue {
        KeyValue::String(text.to_owned())
    }

    fn version(
        default_buckets: u32,
        tenant_buckets: &[(&str, u32)],
        placement: &[(u32, u32, &str)],
        routing_field: Option<&str>,
    ) -> RoutingVersion {
        RoutingVersion::new(
            "orders",
            "customerId",
            Layout::Hashed {
                virtual_buckets: 1024,
                default_buckets,
                tenant_buckets: tenant_buckets
                    .iter()
                    .map(|(tenant, buckets)| TenantBuckets {
                        tenant: string(tenant),
                        buckets: *buckets,
                    })
                    .collect(),
                placement: placement
                    .iter()
                    .map(|(start, end, shard)| PlacementRange {
                        start: *start,
                        end: *end,
                        shard: (*shard).into(),
                    })
                    .collect(),
                routing_field: routing_field.map(String::from),
            },
        )
    }

    const TWO_SHARDS: &[(u32, u32, &str)] = &[(0, 512, "s1"), (512, 1024, "s2")];

    #[test]
    fn a_location_whose_vbuckets_stay_scans_only_changed_tenants() {
        let three = &[(0, 342, "s1"), (342, 683, "s2"), (683, 1024, "s3")];
        let four = &[
            (0, 300, "s1"),
            (300, 342, "s4"),
            (342, 683, "s2"),
            (683, 1024, "s3"),
        ];
        let v1 = version(1, &[], three, Some("bucket"));
        let v2 = version(1, &[("hot", 16)], four, Some("bucket"));
        assert!(matches!(diff(&v1, &v2).scope, MoveScope::Everything { .. }));
        let at = |shard: &str| scope_at(&v1, &v2, &v1.location_on(shard));
        match at("s1") {
            MoveScope::Everything { reason } => {
                assert!(reason.contains("[300, 342)"), "{reason}")
            }
            other => panic!("s1 gives vbuckets away: {other:?}"),
        }
        assert_eq!(at("s2"), MoveScope::Tenants(vec![string("hot")]));
        assert_eq!(at("s3"), MoveScope::Tenants(vec![string("hot")]));
        // Without bucket changes, untouched locations move nothing.
        let v3 = version(1, &[], four, Some("bucket"));
        assert_eq!(
            scope_at(&v1, &v3, &v1.location_on("s2")),
            MoveScope::Nothing
        );
        // A version-wide change scans every location.
        let v4 = version(2, &[], four, Some("bucket"));
        assert!(matches!(
            scope_at(&v1, &v4, &v1.location_on("s2")),
            MoveScope::Everything { .. }
        ));
    }

    #[test]
    fn identical_versions_move_nothing() {
        let v1 = version(1, &[("a", 4)], TWO_SHARDS, Some("bucket"));
        let d = diff(&v1, &v1.clone());
        assert_eq!(
            d,
            VersionDiff {
                scope: MoveScope::Nothing,
                moved_vbuckets: vec![],
                stamp_routing_field: None,
            }
        );
    }

    #[test]
    fn changed_bucket_counts_scope_to_those_tenants() {
        let v1 = version(1, &[("a", 4), ("b", 2), ("c", 8)], TWO_SHARDS, None);
        // a: 4 -> 16, b: unchanged, c: 8 -> default 1, d: default 1 -> 1 (listed, no change), e: new 64.
        let v2 = version(
            1,
            &[("a", 16), ("b", 2), ("d", 1), ("e", 64)],
            &[(512, 1024, "s2"), (0, 512, "s1")],
            Some("bucket"),
        );
        let d = diff(&v1, &v2);
        assert_eq!(
            d.scope,
            MoveScope::Tenants(vec![string("a"), string("c"), string("e")])
        );
        assert!(d.moved_vbuckets.is_empty());
        assert_eq!(d.stamp_routing_field.as_deref(), Some("bucket"));
    }

    #[test]
    fn changed_placement_moves_everything_and_lists_vbuckets() {
        let v1 = version(1, &[], TWO_SHARDS, None);
        let v2 = version(
            1,
            &[],
            &[(0, 256, "s1"), (256, 600, "s3"), (600, 1024, "s2")],
            None,
        );
        let d = diff(&v1, &v2);
        assert_eq!(d.moved_vbuckets, vec![256..600]);
        match d.scope {
            MoveScope::Everything { reason } => {
                assert!(
                    reason.contains("placement changes for 344 of 1024"),
                    "{reason}"
                )
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_renamed_collection_is_a_placement_change() {
        let v1 = version(1, &[], TWO_SHARDS, None);
        let v2 = version(1, &[], TWO_SHARDS, None)
            .with_collections(BTreeMap::from([("s2".to_owned(), "orders_v2".to_owned())]));
        let d = diff(&v1, &v2);
        assert_eq!(d.moved_vbuckets, vec![512..1024]);
        assert!(matches!(d.scope, MoveScope::Everything { .. }));
    }

    #[test]
    fn default_buckets_key_fields_and_layouts_move_everything() {
        let v1 = version(1, &[], TWO_SHARDS, None);
        let reason = |d: VersionDiff| match d.scope {
            MoveScope::Everything { reason } => reason,
            other => panic!("{other:?}"),
        };
        let more_default = version(2, &[], TWO_SHARDS, None);
        assert!(
            reason(diff(&v1, &more_default)).contains("default bucket count changes from 1 to 2")
        );

        let mut other_key = v1.clone();
        other_key.tenant_key = "accountId".into();
        assert!(reason(diff(&v1, &other_key)).contains("tenant key changes"));
        let other_id = v1.clone().with_id_field("orderId");
        assert!(reason(diff(&v1, &other_id)).contains("id field changes"));

        let fanout = RoutingVersion::new(
            "orders",
            "customerId",
            Layout::Fanout {
                shards: vec!["s1".into(), "s2".into()],
            },
        );
        let d = diff(&fanout, &v1);
        assert!(d.moved_vbuckets.is_empty());
        assert!(
            reason(d).contains("the source is a fanout layout and the target is a hashed layout")
        );
    }

    #[test]
    fn routing_field_is_stamped_only_when_it_changes() {
        let without = version(1, &[], TWO_SHARDS, None);
        let bucket = version(1, &[], TWO_SHARDS, Some("bucket"));
        let slot = version(1, &[], TWO_SHARDS, Some("slot"));
        assert_eq!(
            diff(&without, &bucket).stamp_routing_field.as_deref(),
            Some("bucket")
        );
        assert_eq!(
            diff(&bucket, &slot).stamp_routing_field.as_deref(),
            Some("slot")
        );
        assert_eq!(diff(&bucket, &bucket).stamp_routing_field, None);
        assert_eq!(diff(&bucket, &without).stamp_routing_field, None);
    }

    #[test]
    fn moves_compares_locations() {
        let v1 = version(1, &[], TWO_SHARDS, None);
        let v2 = version(1, &[("hot", 16)], TWO_SHARDS, None);
        let hot = string("hot");
        for id in 0..200 {
            let id = KeyValue::Int(id);
            let expected =
                v1.locate(&hot, &id).unwrap().locations != v2.locate(&hot, &id).unwrap().locations;
            assert_eq!(moves(&v1, &v2, &hot, &id).unwrap(), expected);
            // A tenant whose count did not change never moves.
            assert!(!moves(&v1, &v2, &string("cold"), &id).unwrap());
        }
        let fanout = RoutingVersion::new(
            "orders",
            "customerId",
            Layout::Fanout {
                shards: vec!["s1".into(), "s2".into()],
            },
        );
        assert!(moves(&fanout, &v1, &hot, &KeyValue::Int(1)).unwrap());
    }
}

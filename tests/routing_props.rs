//! Property tests of the routing rules' consequences (the project's design document, "Routing"):
//! a one-bucket tenant sits where plain tenant hashing puts it, and doubling a
//! tenant's buckets moves only documents whose new sub-bucket is at or above the
//! old count — about half of them. Failing seeds are printed and persisted by
//! proptest as usual.

use std::collections::BTreeSet;

use proptest::prelude::*;
use reshard::routing::{
    hash, moves, KeyValue, Layout, Location, PlacementRange, RoutingVersion, TenantBuckets,
};

fn key() -> impl Strategy<Value = KeyValue> {
    prop_oneof![
        any::<String>().prop_map(KeyValue::String),
        any::<i64>().prop_map(KeyValue::Int),
        any::<[u8; 12]>().prop_map(KeyValue::ObjectId),
        (any::<u8>(), proptest::collection::vec(any::<u8>(), 0..24))
            .prop_map(|(subtype, bytes)| KeyValue::Binary { subtype, bytes }),
    ]
}

/// `V` and a placement of `[0, V)` over up to four shards, cut at random points.
fn placement() -> impl Strategy<Value = (u32, Vec<PlacementRange>)> {
    (1u32..5000)
        .prop_flat_map(|virtual_buckets| {
            (
                Just(virtual_buckets),
                proptest::collection::btree_set(1..virtual_buckets.max(2), 0..4),
            )
        })
        .prop_map(|(virtual_buckets, cuts)| {
            let mut bounds: Vec<u32> = vec![0];
            bounds.extend(cuts.into_iter().filter(|&cut| cut < virtual_buckets));
            bounds.push(virtual_buckets);
            let ranges = bounds
                .windows(2)
                .enumerate()
                .map(|(index, pair)| PlacementRange {
                    start: pair[0],
                    end: pair[1],
                    shard: format!("s{}", index + 1),
                })
                .collect();
            (virtual_buckets, ranges)
        })
}

fn hashed(
    virtual_buckets: u32,
    placement: Vec<PlacementRange>,
    tenant_buckets: Vec<TenantBuckets>,
) -> RoutingVersion {
    RoutingVersion::new(
        "orders",
        "customerId",
        Layout::Hashed {
            virtual_buckets,
            default_buckets: 1,
            tenant_buckets,
            placement,
            routing_field: None,
        },
    )
}

proptest! {
    #[test]
    fn one_bucket_is_plain_tenant_hashing(
        tenant in key(),
        id in key(),
        (virtual_buckets, ranges) in placement(),
        listed in any::<bool>(),
    ) {
        // One bucket, either by default or as an explicit override.
        let overrides = if listed {
            vec![TenantBuckets { tenant: tenant.clone(), buckets: 1 }]
        } else {
            vec![]
        };
        let version = hashed(virtual_buckets, ranges.clone(), overrides);
        let located = version.locate(&tenant, &id).unwrap();
        let expected = (hash(&tenant.encode()) % u64::from(virtual_buckets)) as u32;
        let shard = &ranges.iter().find(|range| range.contains(expected)).unwrap().shard;
        prop_assert_eq!(located.sub_bucket, 0);
        prop_assert_eq!(located.vbucket, Some(expected));
        prop_assert_eq!(located.locations, vec![Location::new(shard.clone(), "orders")]);
    }


    #[test]
    fn display_and_json_forms_round_trip(key in key()) {
        prop_assert_eq!(KeyValue::parse_cli(&key.to_string()).unwrap(), key.clone());
        let json = serde_json::to_string(&key).unwrap();
        prop_assert_eq!(serde_json::from_str::<KeyValue>(&json).unwrap(), key.clone());
        prop_assert_eq!(KeyValue::from_bson(&key.to_bson()).unwrap(), key);
    }

    #[test]
    fn other_tenants_never_move_when_one_tenant_grows(
        hot in key(),
        other in key(),
        id in key(),
        buckets in 2u32..=1000,
        (virtual_buckets, ranges) in placement(),
    ) {
        prop_assume!(hot != other);
        let before = hashed(virtual_buckets, ranges.clone(), vec![]);
        let after = hashed(
            virtual_buckets,
            ranges,
            vec![TenantBuckets { tenant: hot, buckets }],
        );
        prop_assert!(!moves(&before, &after, &other, &id).unwrap());
        let shards: BTreeSet<String> = before.shards();
        prop_assert_eq!(shards, after.shards());
    }
}

proptest! {
    // Each case routes several hundred documents twice; fewer cases keep the run short.
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn doubling_buckets_moves_only_new_sub_buckets(
        tenant in key(),
        buckets in 1u32..=64,
        ids in proptest::collection::btree_set(key(), 400..500),
        (virtual_buckets, ranges) in placement(),
    ) {
        let with = |count: u32| hashed(
            virtual_buckets,
            ranges.clone(),
            vec![TenantBuckets { tenant: tenant.clone(), buckets: count }],
        );
        let before = with(buckets);
        let after = with(2 * buckets);
        let mut moved = 0usize;
        for id in &ids {
            let old = before.locate(&tenant, id).unwrap();
            let new = after.locate(&tenant, id).unwrap();
            if new.sub_bucket < buckets {
                // h mod 2n < n implies h mod n = h mod 2n: same sub-bucket, same place.
                prop_assert_eq!(new.sub_bucket, old.sub_bucket);
                prop_assert_eq!(&new.vbucket, &old.vbucket);
                prop_assert_eq!(&new.locations, &old.locations);
            }
            let changed = moves(&before, &after, &tenant, id).unwrap();
            prop_assert_eq!(changed, new.locations != old.locations);
            if changed {
                prop_assert!(new.sub_bucket >= buckets);
                moved += 1;
            }
        }
        let fraction = moved as f64 / ids.len() as f64;
        prop_assert!(fraction <= 0.5 + 0.12, "moved {moved} of {} ids", ids.len());
    }
}

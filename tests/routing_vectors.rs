//! Checks the routing core against `tests/vectors/routing.json`, which
//! `scripts/gen_routing_vectors.py` computes independently with the reference
//! xxHash implementation. Applications in other languages check themselves
//! against the same file.

use std::num::NonZeroU32;

use reshard::routing::{
    hash, sub_bucket, vbucket, KeyValue, Layout, Location, PlacementRange, RoutingError,
    RoutingVersion, TenantBuckets,
};
use serde::Deserialize;

#[derive(Deserialize)]
struct Vectors {
    description: String,
    rules: Vec<String>,
    cases: Vec<Case>,
    bson_cases: Vec<BsonCase>,
    error_cases: Vec<ErrorCase>,
}

#[derive(Deserialize)]
struct Case {
    tenant: KeyValue,
    id: KeyValue,
    virtual_buckets: u32,
    buckets: u32,
    tenant_encoding: String,
    tenant_hash: String,
    sub_bucket: u32,
    vbucket: u32,
}

#[derive(Deserialize)]
struct BsonCase {
    bson: serde_json::Value,
    key: KeyValue,
}

#[derive(Deserialize)]
struct ErrorCase {
    bson: serde_json::Value,
    error: String,
    bson_type: String,
}

fn vectors() -> Vectors {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/vectors/routing.json");
    let text = std::fs::read_to_string(path).unwrap_or_else(|error| panic!("{path}: {error}"));
    serde_json::from_str(&text).unwrap_or_else(|error| panic!("{path}: {error}"))
}

/// A hashed version over two shards: `[0, V/2)` on s1, the rest on s2. Half of the
/// cases give the tenant its count as an override, half as the default.
fn version_for(case: &Case, as_override: bool) -> RoutingVersion {
    let half = case.virtual_buckets / 2;
    let (default_buckets, tenant_buckets) = if as_override {
        (
            1,
            vec![TenantBuckets {
                tenant: case.tenant.clone(),
                buckets: case.buckets,
            }],
        )
    } else {
        (case.buckets, vec![])
    };
    RoutingVersion::new(
        "orders",
        "customerId",
        Layout::Hashed {
            virtual_buckets: case.virtual_buckets,
            default_buckets,
            tenant_buckets,
            placement: vec![
                PlacementRange {
                    start: 0,
                    end: half,
                    shard: "s1".into(),
                },
                PlacementRange {
                    start: half,
                    end: case.virtual_buckets,
                    shard: "s2".into(),
                },
            ],
            routing_field: None,
        },
    )
}

fn check_case(index: usize, case: &Case) -> Result<(), String> {
    let encoding = hex::encode(case.tenant.encode());
    if encoding != case.tenant_encoding {
        return Err(format!(
            "tenant encoding {encoding}, expected {}",
            case.tenant_encoding
        ));
    }
    let tenant_hash = hash(&case.tenant.encode()).to_string();
    if tenant_hash != case.tenant_hash {
        return Err(format!(
            "tenant hash {tenant_hash}, expected {}",
            case.tenant_hash
        ));
    }
    let buckets = NonZeroU32::new(case.buckets).ok_or("buckets = 0 in the vectors")?;
    let virtual_buckets =
        NonZeroU32::new(case.virtual_buckets).ok_or("virtual_buckets = 0 in the vectors")?;
    let sub = sub_bucket(&case.id, buckets);
    let vb = vbucket(&case.tenant, sub, virtual_buckets);
    if (sub, vb) != (case.sub_bucket, case.vbucket) {
        return Err(format!(
            "sub_bucket {sub}, vbucket {vb}; expected {}, {}",
            case.sub_bucket, case.vbucket
        ));
    }
    let version = version_for(case, index.is_multiple_of(2));
    let located = version
        .locate(&case.tenant, &case.id)
        .map_err(|error| format!("locate failed: {error}"))?;
    let shard = if case.vbucket < case.virtual_buckets / 2 {
        "s1"
    } else {
        "s2"
    };
    if located.sub_bucket != case.sub_bucket
        || located.vbucket != Some(case.vbucket)
        || located.locations != vec![Location::new(shard, "orders")]
    {
        return Err(format!("locate gave {located:?}"));
    }
    Ok(())
}

#[test]
fn every_vector_case_routes_as_listed() {
    let vectors = vectors();
    assert!(!vectors.description.is_empty() && !vectors.rules.is_empty());
    assert!(
        vectors.cases.len() >= 60,
        "only {} cases",
        vectors.cases.len()
    );
    let failures: Vec<String> = vectors
        .cases
        .iter()
        .enumerate()
        .filter_map(|(index, case)| {
            check_case(index, case).err().map(|problem| {
                format!(
                    "case {index} (tenant {}, id {}, V {}, n {}): {problem}",
                    case.tenant, case.id, case.virtual_buckets, case.buckets
                )
            })
        })
        .collect();
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn vector_cases_cover_every_key_type_and_parameter() {
    let vectors = vectors();
    for type_name in ["string", "int", "object_id", "binary"] {
        assert!(vectors
            .cases
            .iter()
            .any(|c| c.tenant.type_name() == type_name));
        assert!(vectors.cases.iter().any(|c| c.id.type_name() == type_name));
    }
    for buckets in [1, 2, 16, 64, 1000] {
        assert!(vectors.cases.iter().any(|c| c.buckets == buckets));
    }
    for virtual_buckets in [1024, 4096, 7] {
        assert!(vectors
            .cases
            .iter()
            .any(|c| c.virtual_buckets == virtual_buckets));
    }
}

#[test]
fn bson_cases_read_as_listed() {
    for (index, case) in vectors().bson_cases.iter().enumerate() {
        let bson = bson::Bson::try_from(case.bson.clone())
            .unwrap_or_else(|error| panic!("bson case {index}: bad extended JSON: {error}"));
        let key =
            KeyValue::from_bson(&bson).unwrap_or_else(|error| panic!("bson case {index}: {error}"));
        assert_eq!(key, case.key, "bson case {index}");
    }
}

#[test]
fn error_cases_are_refused() {
    for (index, case) in vectors().error_cases.iter().enumerate() {
        assert_eq!(case.error, "unsupported_key_type", "error case {index}");
        let bson = bson::Bson::try_from(case.bson.clone())
            .unwrap_or_else(|error| panic!("error case {index}: bad extended JSON: {error}"));
        assert_eq!(
            KeyValue::from_bson(&bson),
            Err(RoutingError::UnsupportedKeyType {
                bson_type: case.bson_type.clone()
            }),
            "error case {index}"
        );
    }
}

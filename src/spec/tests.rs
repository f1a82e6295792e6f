use std::collections::BTreeSet;

use super::*;
use crate::routing::Location;

const ORDERS_V2: &str = "\
# orders v2: the hot customer gets 16 buckets
tenant_key: customerId
id_field: _id              # optional, default _id
layout: hashed             # hashed | fanout | tenant_table
virtual_buckets: 1024
default_buckets: 1
tenant_buckets:
  - tenant: cust-0001
    buckets: 16
  - tenant: 42
    buckets: 4
  - tenant: {oid: 650f1a2b3c4d5e6f708192a3}
    buckets: 2
  - tenant: {uuid: 123e4567-e89b-12d3-a456-426614174000}
    buckets: 2
  - tenant: {binary: 00ff}
    buckets: 2
routing_field: bucket
placement:
  - vbuckets: [0, 256]     # half-open [start, end)
    shard: s1
  - vbuckets: [256, 1024]
    shard: s2
collections:
  s2: orders_v2
";

fn shards() -> BTreeSet<String> {
    ["s1", "s2", "s3"].map(String::from).into()
}

fn messages(errors: &[SpecError]) -> Vec<String> {
    errors.iter().map(ToString::to_string).collect()
}

fn parse_errors(text: &str) -> Vec<String> {
    messages(&parse_version_spec("v2.yaml", text, "orders").unwrap_err())
}

#[test]
fn parses_the_documented_example() {
    let version = parse_version_spec("v2.yaml", ORDERS_V2, "orders").unwrap();
    assert_eq!(version.version, 0);
    assert_eq!(version.collection, "orders");
    assert_eq!(version.tenant_key, "customerId");
    assert_eq!(version.id_field, "_id");
    assert_eq!(version.virtual_buckets(), Some(1024));
    assert_eq!(version.routing_field(), Some("bucket"));
    assert_eq!(
        version.buckets_of(&KeyValue::String("cust-0001".into())),
        16
    );
    assert_eq!(version.buckets_of(&KeyValue::Int(42)), 4);
    assert_eq!(
        version.buckets_of(&KeyValue::parse_cli("oid:650f1a2b3c4d5e6f708192a3").unwrap()),
        2
    );
    assert_eq!(
        version
            .buckets_of(&KeyValue::parse_cli("uuid:123e4567-e89b-12d3-a456-426614174000").unwrap()),
        2
    );
    assert_eq!(
        version.buckets_of(&KeyValue::parse_cli("hex:00ff").unwrap()),
        2
    );
    assert_eq!(
        version.locations(),
        vec![
            Location::new("s1", "orders"),
            Location::new("s2", "orders_v2")
        ]
    );
    let shards = shards();
    let ctx = ValidationContext {
        registered_shards: &shards,
        previous_virtual_buckets: Some(1024),
    };
    assert_eq!(
        check_version_spec("v2.yaml", ORDERS_V2, &version, &ctx),
        Ok(())
    );
}

#[test]
fn parses_fanout_and_tenant_table() {
    let fanout = parse_version_spec(
        "v1.yaml",
        "tenant_key: customerId\nlayout: fanout\nshards: [s1, s2]\n",
        "orders",
    )
    .unwrap();
    assert_eq!(
        fanout.layout(),
        &Layout::Fanout {
            shards: vec!["s1".into(), "s2".into()]
        }
    );
    let table = parse_version_spec(
        "v1.yaml",
        "tenant_key: customerId\nid_field: orderId\nlayout: tenant_table\n\
             tenants:\n- tenant: cust-1\n  shard: s1\n- {tenant: 7, shard: s2}\ndefault_shard: s3\n",
        "orders",
    )
    .unwrap();
    assert_eq!(table.id_field, "orderId");
    assert_eq!(
        table.layout(),
        &Layout::TenantTable {
            tenants: vec![
                TenantShard {
                    tenant: KeyValue::String("cust-1".into()),
                    shard: "s1".into()
                },
                TenantShard {
                    tenant: KeyValue::Int(7),
                    shard: "s2".into()
                },
            ],
            default_shard: Some("s3".into()),
        }
    );
}

#[test]
fn defaults_apply() {
    let version = parse_version_spec(
        "v.yaml",
        "tenant_key: t\nlayout: hashed\nplacement:\n- vbuckets: [0, 1024]\n  shard: s1\n",
        "c",
    )
    .unwrap();
    assert_eq!(version.id_field, "_id");
    assert_eq!(version.virtual_buckets(), Some(1024));
    assert_eq!(version.buckets_of(&KeyValue::Int(1)), 1);
    assert_eq!(version.routing_field(), None);
}

#[test]
fn unknown_fields_list_the_allowed_ones() {
    let errors = parse_errors("tenant_key: t\nlayout: hashed\nshardz: [s1]\n");
    assert_eq!(errors.len(), 1);
    assert!(
        errors[0].starts_with("v2.yaml:3:1: unknown field `shardz`, expected one of `tenant_key`"),
        "{}",
        errors[0]
    );
    assert!(errors[0].contains("`default_shard`"), "{}", errors[0]);
}

#[test]
fn type_errors_carry_path_and_position() {
    let errors = parse_errors(
        "tenant_key: t\nlayout: hashed\nplacement:\n  - vbuckets: [0, many]\n    shard: s1\n",
    );
    assert_eq!(errors.len(), 1);
    assert!(
        errors[0].starts_with("v2.yaml:4:")
            && errors[0].contains(": placement[0].vbuckets[1]: invalid type"),
        "{}",
        errors[0]
    );
    let missing = parse_errors("tenant_key: t\nlayout: hashed\nplacement:\n  - vbuckets: [0, 1]\n");
    assert!(
        missing[0].contains("placement[0]: missing field `shard`"),
        "{}",
        missing[0]
    );
}

#[test]
fn syntax_errors_have_a_position() {
    let errors =
        parse_version_spec("v2.yaml", "tenant_key: t\n  layout: [\n", "orders").unwrap_err();
    assert_eq!(errors.len(), 1);
    assert!(errors[0].line.is_some(), "{:?}", errors[0]);
}

#[test]
fn empty_and_non_mapping_specs() {
    assert_eq!(
        parse_errors("# nothing yet\n"),
        vec!["v2.yaml: the spec is empty; it needs at least tenant_key, layout and the fields of that layout"]
    );
    let errors = parse_errors("- a\n- b\n");
    assert!(
        errors[0].contains("expected a mapping of routing version fields"),
        "{}",
        errors[0]
    );
}

#[test]
fn missing_and_foreign_fields_name_the_layout() {
    assert_eq!(
        parse_errors("tenant_key: t\nlayout: fanout\nshards: [s1]\nvirtual_buckets: 1024\ndefault_shard: s1\n"),
        vec![
            "v2.yaml:4:1: virtual_buckets: virtual_buckets does not belong to layout fanout; fanout takes shards",
            "v2.yaml:5:1: default_shard: default_shard does not belong to layout fanout; fanout takes shards",
        ]
    );
    assert_eq!(
        parse_errors("layout: hashed\n"),
        vec![
            "v2.yaml: tenant_key: missing; name the document field that routes today, e.g. tenant_key: customerId",
            "v2.yaml: placement: missing; a hashed layout places vbuckets on shards, e.g. placement: [{vbuckets: [0, 1024], shard: s1}]",
        ]
    );
    assert_eq!(
        parse_errors("tenant_key: t\nlayout: ring\n"),
        vec!["v2.yaml:2:1: layout: unknown layout \"ring\"; choose hashed, fanout or tenant_table"]
    );
}

#[test]
fn bad_tenants_and_ranges() {
    let errors = parse_errors(
        "tenant_key: t\nlayout: hashed\ntenant_buckets:\n  - tenant: 1.5\n    buckets: 2\n  - tenant: {oid: \"12\"}\n    buckets: 2\n  - tenant: true\n    buckets: 2\n  - tenant: {md5: aa}\n    buckets: 2\n  - tenant: {binary: 12}\n    buckets: 2\nplacement:\n  - vbuckets: [0, 512, 1024]\n    shard: s1\n",
    );
    assert_eq!(errors.len(), 6, "{errors:#?}");
    assert!(
        errors[0].starts_with("v2.yaml:4:5: tenant_buckets[0].tenant: 1.5 is not a 64-bit integer"),
        "{}",
        errors[0]
    );
    assert!(
        errors[1].starts_with("v2.yaml:6:5: tenant_buckets[1].tenant: \"12\" is not 24 hex digits"),
        "{}",
        errors[1]
    );
    assert!(
        errors[2].starts_with("v2.yaml:8:5: tenant_buckets[2].tenant: true is not a tenant"),
        "{}",
        errors[2]
    );
    assert!(
        errors[3].starts_with("v2.yaml:10:5: tenant_buckets[3].tenant: unexpected key md5"),
        "{}",
        errors[3]
    );
    assert_eq!(
        errors[4],
        "v2.yaml:12:5: tenant_buckets[4].tenant: YAML reads 12 as a number; write the binary value in quotes"
    );
    assert_eq!(
        errors[5],
        "v2.yaml:15:5: placement[0].vbuckets: expected [start, end] (half-open), got 3 number(s)"
    );
}

#[test]
fn validation_problems_point_at_their_lines() {
    let text = "\
tenant_key: customerId
layout: hashed
virtual_buckets: 2048
tenant_buckets:
  - tenant: cust-1
    buckets: 0
placement:
  - vbuckets: [0, 600]
    shard: s1
  - vbuckets: [512, 2000]
    shard: s9
collections:
  s3: orders_v3
";
    let version = parse_version_spec("v3.yaml", text, "orders").unwrap();
    let shards = shards();
    let ctx = ValidationContext {
        registered_shards: &shards,
        previous_virtual_buckets: Some(1024),
    };
    let errors = check_version_spec("v3.yaml", text, &version, &ctx).unwrap_err();
    assert_eq!(
        messages(&errors),
        vec![
            "v3.yaml:3:1: virtual_buckets: virtual_buckets is 2048 but earlier versions of this collection use 1024; V stays fixed for a collection",
            "v3.yaml:6:5: tenant_buckets[0].buckets: bucket count must be at least 1",
            "v3.yaml:11:5: placement[1].shard: unknown shard \"s9\"; registered shards: s1, s2, s3",
            "v3.yaml:10:5: placement[1].vbuckets: vbuckets [512, 600) are placed by both placement[0] and placement[1]",
            "v3.yaml:7:1: placement: vbuckets [2000, 2048) are not placed by any range",
            "v3.yaml:13:3: collections.s3: shard \"s3\" is not used by this version (it uses s1, s9)",
        ]
    );
}

#[test]
fn locator_handles_block_styles() {
    let text = "\
# comment: not a key
a: 1
b:
  c: 2   # trailing comment
  d:
    - x
    - e: 3
      f: [1, 2]
    -
      g: 4
h:
- i: 5
- 'quoted key': 6
  \"j\": 7
k: \"value # not a comment\"
l: {m: 1}
";
    let locator = YamlLocator::new(text);
    let at = |path: &str| locator.position(path);
    assert_eq!(at("a"), Some((2, 1)));
    assert_eq!(at("b"), Some((3, 1)));
    assert_eq!(at("b.c"), Some((4, 3)));
    assert_eq!(at("b.d"), Some((5, 3)));
    assert_eq!(at("b.d[0]"), Some((6, 5)));
    assert_eq!(at("b.d[1]"), Some((7, 5)));
    assert_eq!(at("b.d[1].e"), Some((7, 7)));
    assert_eq!(at("b.d[1].f"), Some((8, 7)));
    assert_eq!(
        at("b.d[1].f[1]"),
        Some((8, 7)),
        "flow values fall back to their key"
    );
    assert_eq!(at("b.d[2]"), Some((9, 5)));
    assert_eq!(at("b.d[2].g"), Some((10, 7)));
    assert_eq!(at("h[0].i"), Some((12, 3)));
    assert_eq!(at("h[1].quoted key"), Some((13, 3)));
    assert_eq!(at("h[1].j"), Some((14, 3)));
    assert_eq!(at("k"), Some((15, 1)));
    assert_eq!(at("l.m"), Some((16, 1)));
    assert_eq!(at("nowhere"), None);
    assert_eq!(at("b.zzz"), Some((3, 1)));
}

#[test]
fn spec_error_display_omits_unknown_parts() {
    let mut error = SpecError {
        file: "f.yaml".into(),
        line: Some(3),
        column: Some(7),
        path: "placement[0].shard".into(),
        message: "boom".into(),
    };
    assert_eq!(error.to_string(), "f.yaml:3:7: placement[0].shard: boom");
    error.column = None;
    error.path.clear();
    assert_eq!(error.to_string(), "f.yaml:3: boom");
    error.line = None;
    assert_eq!(error.to_string(), "f.yaml: boom");
}

//! The routing core: where a document lives under a routing version.
//!
//! Every part of `reshard` (the router embedded in applications, the backfill
//! workers, reconciliation and cleanup) has to agree on one answer to "where does
//! the document with this tenant key and this id live?", and applications in
//! other languages have to compute the same answer. This module is that answer,
//! kept pure (no I/O, no clocks, no database) so it can be unit-tested,
//! property-tested and checked against the language-neutral test vectors in
//! `tests/vectors/routing.json`.
//!
//! The rules (the project's design document, "Routing"):
//!
//! - `h(bytes)` is xxHash64 with seed 0 ([`hash`]);
//! - keys are encoded by type ([`KeyValue::encode`]);
//! - a tenant `t` has `n(t)` buckets: a default plus per-tenant overrides;
//! - sub-bucket `s = 0` if `n(t) = 1`, else `h(enc(id)) mod n(t)` ([`sub_bucket`]);
//! - vbucket `h(enc(t)) mod V` for `s = 0`, else `h(enc(t) ‖ 0x00 ‖ u32le(s)) mod V`
//!   ([`vbucket`]);
//! - the shard is the placement range that contains the vbucket.
//!
//! With every `n(t) = 1` this is plain tenant hashing, which is why a version that
//! only raises the bucket count of a few tenants moves only (part of) those
//! tenants' documents; [`diff`] works that out for the backfill.

mod diff;
mod hash;
mod key;
mod validate;
mod version;

pub use diff::{diff, moves, scope_at, MoveScope, VersionDiff};
pub use hash::{hash, sub_bucket, vbucket};
pub use key::{KeyValue, GENERIC_BINARY_SUBTYPE, UUID_SUBTYPE};
pub use validate::{ValidationContext, ValidationError};
pub use version::{
    Layout, Located, Location, PlacementRange, RoutingVersion, TenantBuckets, TenantShard,
    DEFAULT_ID_FIELD, DEFAULT_VIRTUAL_BUCKETS,
};

/// Why a key could not be read or a document could not be located.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RoutingError {
    /// A tenant key or id has a BSON type that has no routing encoding.
    #[error(
        "a routing key of BSON type {bson_type} is not supported; \
         supported types are string, int (int32 or int64), objectId and binData (including UUID)"
    )]
    UnsupportedKeyType {
        /// The MongoDB name of the offending type, e.g. `double`.
        bson_type: String,
    },

    /// A key typed on the command line could not be parsed.
    #[error("cannot read key {input:?}: {reason}; accepted forms: {forms}", forms = key_forms())]
    InvalidCliKey {
        /// The text as typed.
        input: String,
        /// What is wrong with it.
        reason: String,
    },

    /// A tenant-table layout has no entry for the tenant and no default shard.
    #[error("tenant {tenant} is not in the tenant table and the table has no default_shard")]
    TenantNotInTable {
        /// The tenant that was looked up.
        tenant: KeyValue,
    },

    /// The version places no range over this vbucket (the version was not validated).
    #[error("vbucket {vbucket} is not placed on any shard; validate the routing version")]
    VbucketNotPlaced {
        /// The vbucket without a shard.
        vbucket: u32,
    },

    /// A hashed layout with `virtual_buckets = 0` (the version was not validated).
    #[error("the routing version has virtual_buckets = 0; validate the routing version")]
    NoVirtualBuckets,

    /// A tenant with a bucket count of 0 (the version was not validated).
    #[error("tenant {tenant} has a bucket count of 0; validate the routing version")]
    NoBuckets {
        /// The tenant whose count is 0.
        tenant: KeyValue,
    },
}

fn key_forms() -> &'static str {
    "int:<i64>, oid:<24 hex digits>, uuid:<canonical uuid>, hex:<hex bytes>, \
     bin:<subtype>:<hex bytes>, str:<text>, or any other text as a string"
}

/// `orders` routed by `customerId` over 8 vbuckets, all on shard `s1`, with the routing field
/// `field`: the version the unit tests of the writers' decisions share.
#[cfg(test)]
pub(crate) fn one_shard_version(field: Option<&str>) -> RoutingVersion {
    RoutingVersion::new(
        "orders",
        "customerId",
        Layout::Hashed {
            virtual_buckets: 8,
            default_buckets: 1,
            tenant_buckets: vec![],
            placement: vec![PlacementRange {
                start: 0,
                end: 8,
                shard: "s1".into(),
            }],
            routing_field: field.map(String::from),
        },
    )
}

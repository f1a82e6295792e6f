//! The hash function and the two hash rules built on it.
//!
//! These are the only places where bytes become numbers, so they are written
//! to match the project's design document word for word; every other part of routing is table lookups.

use std::num::NonZeroU32;

use xxhash_rust::xxh64::{xxh64, Xxh64};

use super::KeyValue;

/// `h(bytes)`: xxHash64 with seed 0.
pub fn hash(bytes: &[u8]) -> u64 {
    xxh64(bytes, 0)
}

/// The sub-bucket of a document whose tenant has `buckets` buckets:
/// `0` if there is one bucket, else `h(enc(id)) mod buckets`.
pub fn sub_bucket(id: &KeyValue, buckets: NonZeroU32) -> u32 {
    if buckets.get() == 1 {
        return 0;
    }
    let h = id.with_encoding(hash);
    // The remainder is below `buckets`, so it fits in a u32.
    (h % u64::from(buckets.get())) as u32
}

/// The vbucket of sub-bucket `sub_bucket` of `tenant` among `virtual_buckets` vbuckets:
/// `h(enc(t)) mod V` for sub-bucket 0, else `h(enc(t) ‖ 0x00 ‖ u32le(s)) mod V`.
///
/// Sub-bucket 0 hashes the tenant alone, so a tenant with a single bucket sits
/// exactly where plain tenant hashing puts it.
pub fn vbucket(tenant: &KeyValue, sub_bucket: u32, virtual_buckets: NonZeroU32) -> u32 {
    let h = if sub_bucket == 0 {
        tenant.with_encoding(hash)
    } else {
        let mut state = Xxh64::new(0);
        tenant.with_encoding(|bytes| state.update(bytes));
        state.update(&[0x00]);
        state.update(&sub_bucket.to_le_bytes());
        state.digest()
    };
    // The remainder is below `virtual_buckets`, so it fits in a u32.
    (h % u64::from(virtual_buckets.get())) as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    fn n(value: u32) -> NonZeroU32 {
        NonZeroU32::new(value).unwrap()
    }

    #[test]
    fn hash_is_xxhash64_seed_0() {
        // Reference values of XXH64 with seed 0.
        assert_eq!(hash(b""), 0xef46_db37_51d8_e999);
        assert_eq!(hash(b"a"), 0xd24e_c4f1_a98c_6e5b);
    }

    #[test]
    fn one_bucket_means_sub_bucket_zero() {
        assert_eq!(sub_bucket(&KeyValue::Int(12345), n(1)), 0);
    }

    #[test]
    fn sub_bucket_is_id_hash_modulo_buckets() {
        let id = KeyValue::String("order-1".into());
        assert_eq!(sub_bucket(&id, n(16)), (hash(b"order-1") % 16) as u32);
    }

    #[test]
    fn vbucket_rules() {
        let tenant = KeyValue::String("cust-1".into());
        assert_eq!(
            vbucket(&tenant, 0, n(1024)),
            (hash(b"cust-1") % 1024) as u32
        );
        let mut salted = b"cust-1".to_vec();
        salted.push(0);
        salted.extend_from_slice(&3u32.to_le_bytes());
        assert_eq!(vbucket(&tenant, 3, n(1024)), (hash(&salted) % 1024) as u32);
    }
}

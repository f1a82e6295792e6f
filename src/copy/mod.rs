//! The workers' executor: a protocol step turned into a bulk statement ([`steps`]).
//!
//! What the statements become on the wire (the [`crate::shards::BulkWriter`]: de-duplication
//! by id within a batch, one unordered command per target location, retries of exactly the
//! failed statements, dead letters, overload reported to the throttle) and what a failure
//! means ([`crate::shards::classify`]) belong to the shard access layer; reading the source,
//! partitions, leases and checkpoints belong to the worker ([`crate::worker`]).

pub mod steps;

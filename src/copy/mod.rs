//! Moving documents in bulk: the backfill's copy, cleanup's deletes and stamping in place.
//!
//! This module owns the write path from a batch of statements to per-statement results
//! (the project's design document, "Backfill"):
//!
//! - [`classify`] decides, from codes and labels only, what a failed statement means:
//!   already present, transient, overload, or permanent. Pure and table-tested.
//! - [`writer`] is the [`BulkWriter`]: de-duplication by id within a batch, one unordered
//!   command per target location with all locations in flight at once (bounded per shard),
//!   retries of exactly the failed statements with full-jitter exponential backoff, dead
//!   letters for the rest, and overload reported to the throttle ([`crate::throttle`]).
//!
//! Reading the source, partitions, leases and checkpoints are not here: the writer neither
//! knows where its statements came from nor records anything in Postgres.

pub mod classify;
pub mod steps;
pub mod writer;

pub use classify::{classify, FailureClass, FailureOrigin, WriteFailure};
pub use writer::{
    BatchCounts, BatchReport, BulkWriter, Deadline, Modification, OverloadSink, RetryPolicy,
    ShardReport, Statement, StatementResult, WriteOp, WriterError, WriterOptions,
};

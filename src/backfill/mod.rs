//! The backfill: planning what to copy ([`plan`]), and the workers that copy it ([`worker`]).
//!
//! See the project's design document, "Backfill" and ARCHITECTURE.md. The plan is stored in Postgres as partitions;
//! any number of `reshard worker` processes lease them, copy each through one open cursor
//! in `_id` order and the unordered [`crate::copy::BulkWriter`], and checkpoint each batch
//! fenced by the lease token.

pub mod plan;
pub mod worker;

pub use worker::{prepare_batch, Worker, WorkerConfig, WorkerError, WorkerSummary};

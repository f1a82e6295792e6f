//! The front: a MongoDB wire-protocol server that applications reach with their own MongoDB
//! driver, as they reach a `mongos`.
//!
//! It owns three parts, read in this order:
//! - [`wire`]: the codec, pure (bytes in, typed requests out, reply frames back), with every
//!   length and section checked before it is trusted;
//! - [`server`]: the TCP listener, one task per connection, one request answered at a time,
//!   a malformed message closing only the connection that sent it;
//! - [`commands`]: dispatch, a table from command name to one handler, and the handlers;
//!   errors leave as MongoDB errors through [`error::CommandError`].
//!
//! Beside them, [`auth`] holds SCRAM-SHA-256 and the users file (pure, like the codec), and
//! [`tls`] the TLS handshake's configuration.
//!
//! The routed commands (CRUD, counts, aggregations, indexes) are handlers in the same table:
//! [`plan`] reads a command into what it asks before any I/O, and the executor is the
//! router's engine ([`engine`]: a router per routed collection, registered like any
//! application's), not a second router; [`cursors`] holds what `getMore` continues.
//! Everything the front does not route goes to the passthrough location.

pub mod auth;
pub mod commands;
pub mod cursors;
pub mod engine;
pub mod error;
pub mod plan;
pub mod server;
pub mod tls;
pub mod wire;

pub use commands::{Command, Connection, Context, Dispatch, Handler, Reply, Spec};
pub use engine::{Engine, EngineConfig};
pub use error::{CommandError, ErrorCode};
pub use server::{serve, Front, Stats};

/// The MongoDB release whose semantics the front follows, as `buildInfo` reports it.
pub const MONGODB_VERSION: &str = "7.0.0";

/// The wire version of [`MONGODB_VERSION`] (MongoDB 7.0 speaks 21), advertised as
/// `maxWireVersion`; drivers choose the commands and options they send by it.
pub const MAX_WIRE_VERSION: i32 = 21;

/// The feature compatibility version that matches [`MONGODB_VERSION`].
pub const FEATURE_COMPATIBILITY_VERSION: &str = "7.0";

/// MongoDB's `maxBsonObjectSize`: the largest document a client may send for storage.
pub const MAX_BSON_OBJECT_SIZE: i32 = 16 * 1024 * 1024;

/// MongoDB's `maxWriteBatchSize`: the most statements in one write command.
pub const MAX_WRITE_BATCH_SIZE: i32 = 100_000;

/// What the front advertises and enforces. The defaults are a `mongos` 7.0's.
#[derive(Clone, Debug, Default)]
pub struct Settings {
    /// The largest message read (and advertised as `maxMessageSizeBytes`).
    pub limits: wire::Limits,
    /// Sessions, advertised by `logicalSessionTimeoutMinutes` in `hello`. Off (`None`) by
    /// default, and to stay off until the front supports sessions: a server that advertises
    /// them gets an `lsid` with every command and a `txnNumber` with every write, and drivers
    /// then retry writes once after a network error or a retryable code (retryable writes),
    /// which is safe only when the server recognises the retry by `lsid` + `txnNumber` and does
    /// not apply the write twice. Without the field drivers use no sessions and no retryable
    /// writes.
    pub logical_session_timeout_minutes: Option<u32>,
    /// The process's command line as `getCmdLineOpts` reports it (already redacted).
    pub argv: Vec<String>,
    /// The users clients authenticate as (`--users-file`). With users, every command but the
    /// handshake, the SASL conversation and a few diagnostics is refused on a connection that
    /// has not authenticated, and `hello` advertises `SCRAM-SHA-256`; without (`None`), no
    /// one authenticates and nothing is asked (`commands::auth`).
    pub users: Option<std::sync::Arc<auth::Users>>,
    /// TLS on every connection (`--tls-cert-file`, `--tls-key-file`), or none.
    pub tls: Option<tls::Tls>,
}

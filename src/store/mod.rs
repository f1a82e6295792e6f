//! The state store: every SQL statement of reshard lives in this module tree.
//!
//! Postgres holds the truth about shards, routing versions, migrations and their phases,
//! routers, partitions, dead letters, reconciliation runs and shadow-read mismatches. `NOTIFY` is a nudge for listeners;
//! the rows are what they act on.

pub mod bypasses;
pub mod dead_letters;
pub mod events;
mod gates;
pub mod hooks;
pub mod migrations;
pub mod partitions;
pub mod playbooks;
pub mod reconcile;
pub mod routers;
pub use routers::RouterKind;
pub mod shadow;
pub mod shards;
pub mod versions;
pub mod workers;

use std::time::Duration;

use sqlx::migrate::Migrator;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{ConnectOptions, PgPool};

use crate::error::Error;
use crate::phase::{Gate, MoveError};
use crate::redact::Redacted;

/// The schema migrations, embedded in the binary.
pub static MIGRATOR: Migrator = sqlx::migrate!("./migrations");

/// The channel on which every persisted migration change is announced.
pub const CHANNEL: &str = "reshard_migrations";

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("cannot reach the state store {url}: {reason}")]
    Unreachable { url: Redacted, reason: String },
    /// The URL is not a PostgreSQL URL, or the server refused it for good (a wrong password,
    /// a database that does not exist): waiting does not cure it.
    #[error("the state store {url} cannot be used: {reason}")]
    Refused { url: Redacted, reason: String },
    #[error("the state store {url} {state}; run `reshard db migrate` first")]
    SchemaBehind { url: Redacted, state: String },
    #[error("the state store {url} has schema migrations this binary does not know ({unknown}); use a newer reshard")]
    SchemaAhead { url: Redacted, unknown: String },
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    Conflict(String),
    #[error(transparent)]
    Move(#[from] MoveError),
    #[error("gate {gate} is closed: {detail}")]
    GateClosed { gate: Gate, detail: String },
    #[error("a concurrent change won: {0}")]
    Lost(String),
    #[error("state store query failed: {0}")]
    Sql(#[from] sqlx::Error),
    #[error("the state store did not answer within {0:?}")]
    TimedOut(std::time::Duration),
}

impl From<StoreError> for Error {
    fn from(err: StoreError) -> Self {
        Error::Known(Box::new(err))
    }
}

impl crate::error::Kind for StoreError {
    fn code(&self) -> &'static str {
        StoreError::code(self)
    }

    fn hint(&self) -> Option<String> {
        StoreError::hint(self)
    }

    fn is_bad_input(&self) -> bool {
        StoreError::is_bad_input(self)
    }
}

impl StoreError {
    /// Whether the request itself is wrong (exit 2, nothing changed) rather than the store
    /// failing it (exit 1).
    pub fn is_bad_input(&self) -> bool {
        matches!(
            self,
            StoreError::Refused { .. }
                | StoreError::SchemaBehind { .. }
                | StoreError::SchemaAhead { .. }
                | StoreError::NotFound(_)
                | StoreError::Conflict(_)
                | StoreError::Move(_)
        )
    }

    /// A stable name of the kind, for errors printed as JSON.
    pub fn code(&self) -> &'static str {
        match self {
            StoreError::Unreachable { .. } => "store_unreachable",
            StoreError::Refused { .. } => "store_refused",
            StoreError::SchemaBehind { .. } => "store_schema_behind",
            StoreError::SchemaAhead { .. } => "store_schema_ahead",
            StoreError::NotFound(_) => "not_found",
            StoreError::Conflict(_) => "conflict",
            StoreError::Move(_) => "phase_move_refused",
            StoreError::GateClosed { .. } => "gate_closed",
            StoreError::Lost(_) => "concurrent_change",
            StoreError::Sql(_) => "store_query_failed",
            StoreError::TimedOut(_) => "store_timed_out",
        }
    }

    /// What an operator checks next, where there is something to say.
    pub fn hint(&self) -> Option<String> {
        let source = "the URL comes from --database-url, RESHARD_DATABASE_URL or DATABASE_URL";
        match self {
            StoreError::Unreachable { .. } => Some(format!(
                "check that PostgreSQL is running at that host and port and accepts \
                 connections from here ({source}); nothing was changed"
            )),
            StoreError::Refused { .. } => Some(format!(
                "check the URL's user, password and database name ({source})"
            )),
            StoreError::SchemaBehind { .. } => Some("run `reshard db migrate`".into()),
            StoreError::SchemaAhead { .. } => {
                Some("use the reshard release that migrated this store, or a newer one".into())
            }
            StoreError::GateClosed { .. } => {
                Some("`reshard migration status ID` shows each gate and what holds it".into())
            }
            StoreError::Lost(_) => Some(
                "another command changed the migration first; read its status and decide again"
                    .into(),
            ),
            StoreError::TimedOut(_) => Some(
                "the state store is slow or failing over; `reshard migration status ID` shows \
                 what was recorded before running the command again"
                    .into(),
            ),
            StoreError::NotFound(_)
            | StoreError::Conflict(_)
            | StoreError::Move(_)
            | StoreError::Sql(_) => None,
        }
    }

    /// Whether the state store could not be reached or is going through a restart or
    /// failover (connections refused or dropped, the pool timed out, the server shutting down
    /// or starting up): a wait and a retry may succeed.
    pub fn is_unavailable(&self) -> bool {
        match self {
            StoreError::Unreachable { .. } | StoreError::TimedOut(_) => true,
            StoreError::Sql(e) => unavailable(e),
            _ => false,
        }
    }
}

/// Whether `e` says the server could not be reached or is going through a restart or failover.
fn unavailable(e: &sqlx::Error) -> bool {
    match e {
        sqlx::Error::Io(_)
        | sqlx::Error::Tls(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::WorkerCrashed => true,
        // Class 57: operator intervention (admin shutdown, cannot connect now); 08:
        // connection exceptions.
        sqlx::Error::Database(db) => db
            .code()
            .is_some_and(|c| c.starts_with("57") || c.starts_with("08")),
        _ => false,
    }
}

pub type StoreResult<T> = Result<T, StoreError>;

/// `call`, or [`StoreError::TimedOut`] when it has not answered within `limit`: a server
/// that is cut off (not refusing, silent) would otherwise hold a query until TCP gives up.
pub async fn within<T>(
    limit: std::time::Duration,
    call: impl std::future::Future<Output = StoreResult<T>>,
) -> StoreResult<T> {
    tokio::time::timeout(limit, call)
        .await
        .unwrap_or(Err(StoreError::TimedOut(limit)))
}

/// A connection pool to the state store, and the (redacted) URL it came from.
#[derive(Clone, Debug)]
pub struct Store {
    pool: PgPool,
    url: Redacted,
    /// A dry run's store ([`Store::dry_run`]): the changes of a command are rolled back.
    dry_run: bool,
}

/// Why the state store at `url` cannot be reached, with any password in `reason` redacted.
fn unreachable(url: &Redacted, reason: String) -> StoreError {
    StoreError::Unreachable {
        url: url.clone(),
        reason: crate::redact::redact_uri(&reason),
    }
}

/// The connection options of `url`, and the options of reshard's pools.
fn pool_options(url: &Redacted) -> StoreResult<(PgPoolOptions, PgConnectOptions)> {
    let options: PgConnectOptions =
        url.expose()
            .parse()
            .map_err(|e: sqlx::Error| StoreError::Refused {
                url: url.clone(),
                reason: crate::redact::redact_uri(&format!("not a PostgreSQL URL ({e})")),
            })?;
    let options = options
        .application_name("reshard")
        .log_statements(tracing::log::LevelFilter::Trace);
    let pool = PgPoolOptions::new()
        .max_connections(8)
        .acquire_timeout(Duration::from_secs(10));
    Ok((pool, options))
}

impl Store {
    /// Connects without checking the schema (for `db migrate` and `db status`).
    ///
    /// One connection of its own is opened first ([`Store::check_reachable`]), so a store that
    /// is down fails at once with the reason (connection refused, no such host) rather than
    /// after the pool's acquire timeout with "pool timed out".
    pub async fn connect_unchecked(url: &str) -> StoreResult<Store> {
        let store = Store::connect_lazy(url)?;
        store.check_reachable().await.map_err(|e| match e {
            StoreError::Sql(e) => StoreError::Refused {
                url: store.url.clone(),
                reason: crate::redact::redact_uri(&e.to_string()),
            },
            other => other,
        })?;
        Ok(store)
    }

    /// A store whose pool connects on first use: only a URL that is not a PostgreSQL URL is
    /// refused here. For a caller that waits for the store itself ([`Store::check_reachable`]).
    pub fn connect_lazy(url: &str) -> StoreResult<Store> {
        let url = Redacted::new(url);
        let (pool, options) = pool_options(&url)?;
        Ok(Store {
            pool: pool.connect_lazy_with(options),
            url,
            dry_run: false,
        })
    }

    /// Opens one connection of its own and closes it: whether the store answers now, and if
    /// not, why. The pool would wait for its acquire timeout (retrying a refused connection
    /// meanwhile) and then say only that it timed out.
    pub async fn check_reachable(&self) -> StoreResult<()> {
        let connection = self.pool.connect_options().connect().await.map_err(|e| {
            // A refusal that waiting does not cure (a wrong password, no such database)
            // keeps its kind; the rest says where and why.
            if unavailable(&e) {
                unreachable(&self.url, e.to_string())
            } else {
                StoreError::Sql(e)
            }
        })?;
        // The store answered; how the connection closes says nothing more.
        let _ = sqlx::Connection::close(connection).await;
        Ok(())
    }

    /// Connects and refuses to go on unless every migration this binary knows is applied.
    pub async fn connect(url: &str) -> StoreResult<Store> {
        let store = Store::connect_unchecked(url).await?;
        store.check_schema().await?;
        Ok(store)
    }

    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// The same store for a command's `--dry-run`: each change an operator's command makes
    /// runs in one transaction that ends in [`Store::finish`], and this store rolls it back
    /// there. The dry run thus goes through the change itself (every lock, check and refusal,
    /// the rows as they would be written, returned to the command) and keeps none of it. An
    /// event appended within is dropped with the rest (its log line is at info, below a
    /// one-shot command's default filter). `tests/dry_run.rs` runs every command that changes
    /// state this way and compares every table before and after.
    pub fn dry_run(&self) -> Store {
        Store {
            dry_run: true,
            ..self.clone()
        }
    }

    pub fn is_dry_run(&self) -> bool {
        self.dry_run
    }

    /// Commits `tx`, or rolls it back in a dry run's store.
    async fn finish(&self, tx: sqlx::Transaction<'_, sqlx::Postgres>) -> StoreResult<()> {
        if self.dry_run {
            tx.rollback().await?;
        } else {
            tx.commit().await?;
        }
        Ok(())
    }

    pub fn url(&self) -> &Redacted {
        &self.url
    }

    pub async fn migrate(&self) -> StoreResult<Vec<i64>> {
        let before = self.applied_versions().await?;
        MIGRATOR
            .run(&self.pool)
            .await
            .map_err(|e| StoreError::Conflict(format!("migration failed: {e}")))?;
        let after = self.applied_versions().await?;
        Ok(after.into_iter().filter(|v| !before.contains(v)).collect())
    }

    /// Applied schema migration versions, oldest first; empty when none is applied.
    pub async fn applied_versions(&self) -> StoreResult<Vec<i64>> {
        let exists: bool = sqlx::query_scalar("SELECT to_regclass('_sqlx_migrations') IS NOT NULL")
            .fetch_one(&self.pool)
            .await?;
        if !exists {
            return Ok(Vec::new());
        }
        Ok(sqlx::query_scalar(
            "SELECT version FROM _sqlx_migrations WHERE success ORDER BY version",
        )
        .fetch_all(&self.pool)
        .await?)
    }

    pub async fn check_schema(&self) -> StoreResult<()> {
        let applied = self.applied_versions().await?;
        let known: Vec<i64> = MIGRATOR.iter().map(|m| m.version).collect();
        let unknown: Vec<String> = applied
            .iter()
            .filter(|v| !known.contains(v))
            .map(|v| v.to_string())
            .collect();
        if !unknown.is_empty() {
            return Err(StoreError::SchemaAhead {
                url: self.url.clone(),
                unknown: unknown.join(", "),
            });
        }
        let missing = known.iter().filter(|v| !applied.contains(v)).count();
        if missing > 0 {
            let state = if applied.is_empty() {
                "has no reshard schema".to_owned()
            } else {
                format!(
                    "is {missing} schema migration(s) behind ({} of {} applied)",
                    applied.len(),
                    known.len()
                )
            };
            return Err(StoreError::SchemaBehind {
                url: self.url.clone(),
                state,
            });
        }
        Ok(())
    }
}

//! How a router is configured: [`RouterConfig`] and the step hook tests use.

use std::sync::Arc;
use std::time::Duration;

use mongodb::options::WriteConcern;

use super::RouterError;

/// How a router behaves. [`RouterConfig::named`] gives the defaults.
#[derive(Clone)]
pub struct RouterConfig {
    /// Shown to operators in `reshard router list`.
    pub name: String,
    /// How long a heartbeat keeps the router's lease: how long it serves without reaching the
    /// state store (its self-fence deadline), and how long a router that stopped heartbeating
    /// (crashed, partitioned) holds up phase changes before the driver counts it out. Default
    /// ten minutes: longer than a PostgreSQL failover or restart.
    pub lease_ttl: Duration,
    /// How long before its lease runs out the router stops sending commands, and how long
    /// after it the driver waits before counting a silent router out: it covers the time a
    /// command takes to reach a server and the drift between the two clocks. `None`: a tenth
    /// of `lease_ttl`, at most 30 s. Below half of `lease_ttl`.
    pub fence_margin: Option<Duration>,
    /// How often the router heartbeats (and polls, in case a `NOTIFY` was missed).
    pub heartbeat_interval: Duration,
    /// How long a write waits while the phase holds writes (the write switch) before it fails
    /// with the retryable [`RouterError::WriteHeld`].
    pub hold_timeout: Duration,
    /// Write concern of every write (default `w: "majority", j: true`).
    pub write_concern: WriteConcern,
    /// The largest page [`Router::list_tenant`] returns.
    pub max_page_size: usize,
    /// How many locations a tenant listing queries at once.
    pub list_parallelism: usize,
    /// Called before every protocol step, with the step's name and side. Tests use it to force
    /// an interleaving (run another actor between two steps); production leaves it `None`.
    pub step_hook: Option<StepHook>,
    /// The most shadow reads (the migration's `shadow_read_percent`) in flight at once; a
    /// sampled read beyond them is skipped, not queued.
    pub shadow_reads_in_flight: usize,
    /// How long [`Router::connect`] (and [`Router::with_shards`]) keep trying while the state
    /// store cannot be reached, with backoff and jitter and a warning at each attempt; then
    /// they fail with [`RouterError::StoreUnreachable`]. `None`: one attempt, failing at once.
    ///
    /// Default two minutes, waiting: an application that restarts during a state-store
    /// failover or restart (the outage a running router rides out) comes up once the store is
    /// back, rather than exiting into its supervisor's restart backoff (minutes, with
    /// Kubernetes) or staying down (without a supervisor); bounded, so a wrong host or a store
    /// gone for good still ends in an error. Meanwhile the router serves nothing: it has not
    /// loaded the migration's phase, and it never guesses one. A URL that is not a PostgreSQL
    /// URL, a store without reshard's schema, or a shard without a connection fail at once.
    pub connect_deadline: Option<Duration>,
    /// What registers: the library in an application, or a `reshard front` (shown by
    /// `reshard router list`).
    pub kind: crate::store::RouterKind,
}

/// See [`RouterConfig::step_hook`].
pub type StepHook = Arc<dyn Fn(StepEvent) -> futures::future::BoxFuture<'static, ()> + Send + Sync>;

/// A protocol step about to run: `find`, `insert`, `replace_live`, `replace_tombstone`,
/// `update_live` or `delete`, on the source or the target, and for an insert what it inserts
/// (`app`, `copy` or `tombstone`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StepEvent {
    pub step: &'static str,
    pub side: crate::protocol::Side,
    pub payload: Option<&'static str>,
}

impl RouterConfig {
    /// The fence margin in force ([`RouterConfig::fence_margin`]).
    pub fn fence_margin(&self) -> Duration {
        self.fence_margin
            .unwrap_or((self.lease_ttl / 10).min(Duration::from_secs(30)))
    }

    pub fn named(name: impl Into<String>) -> Self {
        RouterConfig {
            name: name.into(),
            lease_ttl: Duration::from_secs(600),
            fence_margin: None,
            heartbeat_interval: Duration::from_secs(2),
            hold_timeout: Duration::from_secs(5),
            write_concern: WriteConcern::majority().and_journal(true),
            max_page_size: 1000,
            list_parallelism: 8,
            step_hook: None,
            shadow_reads_in_flight: 8,
            connect_deadline: Some(Duration::from_secs(120)),
            kind: crate::store::RouterKind::Library,
        }
    }

    /// Refuses a fence margin that leaves the lease nothing to serve with.
    pub(super) fn check(&self) -> Result<(), RouterError> {
        let margin = self.fence_margin();
        if margin.is_zero() || margin * 2 >= self.lease_ttl {
            return Err(RouterError::InvalidUpdate(format!(
                "fence_margin ({margin:?}) must be above zero and below half of lease_ttl ({:?})",
                self.lease_ttl
            )));
        }
        Ok(())
    }
}

trait WriteConcernExt {
    fn and_journal(self, journal: bool) -> Self;
}

impl WriteConcernExt for WriteConcern {
    fn and_journal(mut self, journal: bool) -> Self {
        self.journal = Some(journal);
        self
    }
}

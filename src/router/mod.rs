//! The router applications embed: it reads and writes one collection through the current phase
//! of its migration, so that the phases actually happen in the application's traffic.
//!
//! A [`Router`] registers itself, then loads the collection's routing versions and its active
//! migration from the state store, listens for `NOTIFY` and also polls, and heartbeats a lease
//! from a task of its own. When the migration's epoch changes it stops starting operations under
//! the old epoch, waits for the ones in flight to finish (heartbeating all the while, so the
//! driver keeps waiting for it), switches, and acknowledges the new epoch at once.
//!
//! The lease fences every step, not only the start of an operation (ARCHITECTURE.md, "Leases
//! fence every step"): a step is not sent once fewer than [`RouterConfig::fence_margin`] of the
//! lease are left (measured on a monotonic clock from the start of the last renewal), and the
//! command it sends ends before that point. The driver counts a silent router out only a fence
//! margin after its lease ran out (by PostgreSQL's clock), so nothing of an operation lands
//! after that. An operation cut short reports [`RouterError::RoutingStale`] (it only read) or
//! [`RouterError::OutcomeUnknown`] (a write of it may have landed, in time). A router whose
//! lease lapsed loads the current phase again before it serves: it renews, then loads, then
//! serves.
//!
//! The data path does not touch the state store: operations run on the phase the router
//! loaded last, and the lease is long (ten minutes by default) while heartbeats are frequent,
//! so an application keeps reading and writing through a PostgreSQL outage shorter than the
//! lease; phase changes wait meanwhile (the driver counts a router that stopped heartbeating
//! out only after its lease). The price is that a router that crashes without deregistering
//! holds up phase changes until its lease has run out (ARCHITECTURE.md, "The data path
//! outlives the state store").
//!
//! A router that starts while the state store is down has no phase to apply, and never
//! guesses one: [`Router::connect`] returns only once it has registered and loaded the
//! migration's phase, and until then nothing can be sent through it. It tries again with
//! backoff (a warning at each attempt, with the reason) up to
//! [`RouterConfig::connect_deadline`] (two minutes by default), then fails naming the
//! deadline and the last reason (ARCHITECTURE.md, "A router starting without the state store
//! waits for it").
//!
//! Every operation runs one of the pure [`crate::protocol`] machines against the shards; this
//! module only turns their steps into MongoDB commands.
//!
//! ```no_run
//! # async fn demo() -> Result<(), reshard::router::RouterError> {
//! use mongodb::bson::doc;
//! use reshard::router::{Router, RouterConfig};
//!
//! let router = Router::connect(
//!     "postgres://postgres@127.0.0.1/reshard",
//!     "orders",
//!     RouterConfig::named("orders-api"),
//! )
//! .await?;
//! router
//!     .insert(doc! { "_id": "o-1", "customerId": "cust-7", "total": 12 })
//!     .await?;
//! router
//!     .update("cust-7", "o-1", doc! { "$inc": { "total": 3 } })
//!     .await?;
//! let order = router.get("cust-7", "o-1").await?;
//! assert_eq!(order.unwrap().get_i32("total").unwrap(), 15);
//! let page = router.list_tenant("cust-7", None, 100).await?;
//! assert_eq!(page.documents.len(), 1);
//! router.shutdown().await;
//! # Ok(()) }
//! ```

mod exec;
mod list;
mod query;
mod shadow;
mod stats;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use mongodb::bson::{Bson, Document};
use mongodb::options::WriteConcern;
use tokio::sync::{watch, Notify, RwLock};
use tokio::task::JoinHandle;

use crate::phase::Phase;
use crate::protocol::{Operation, Outcome, ProtocolError};
use crate::routing::{KeyValue, RoutingError, RoutingVersion};
use crate::shards::Shards;
use crate::store::routers::{Heartbeat, Registration, Renewal};
use crate::store::{within, Store, StoreError, CHANNEL};

/// How long a heartbeat or a load may wait for the state store before it is given up (and
/// tried again at the next interval): a server cut off by the network answers nothing.
const STORE_CALL_LIMIT: Duration = Duration::from_secs(15);

pub use exec::{is_duplicate_key, Image, Terms};
pub use list::Page;
pub use query::{Order, Query, QueryCursor, MAX_SOURCE_MATCHES};
use stats::OperationStats;

/// How a router behaves. [`RouterConfig::named`] gives the defaults.
#[derive(Clone)]
pub struct RouterConfig {
    /// Shown to operators in `reshard routers list`.
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
    /// `reshard routers list`).
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
    fn check(&self) -> Result<(), RouterError> {
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

#[derive(Debug, thiserror::Error)]
pub enum RouterError {
    #[error("the router could not renew its lease in time; nothing of this operation was applied; it refuses operations until it can reach the state store again")]
    RoutingStale,
    #[error("the router was shut down; nothing of this operation was applied")]
    ShutDown,
    #[error("the router could not start: the state store could not be reached within {deadline:?} ({attempts} attempts), and a router serves nothing before it has loaded the migration's phase; last reason: {reason}")]
    StoreUnreachable {
        /// [`RouterConfig::connect_deadline`].
        deadline: Duration,
        attempts: u32,
        /// Why the last attempt failed, without credentials.
        reason: String,
    },
    #[error("the router's lease ran out before the operation finished: its write may or may not have been applied (nothing of it can land later); read the document back, or retry an idempotent write")]
    OutcomeUnknown,
    #[error("the shard refused the write: {}", .0.describe())]
    Write(Box<crate::copy::classify::WriteFailure>),
    #[error("writes are held by the write switch and did not resume within {0:?}; retry")]
    WriteHeld(Duration),
    #[error("reads of many documents wait while a rollback switches reads back to the source, and the switch did not end within {0:?}; retry")]
    ReadHeld(Duration),
    #[error("the migration moved from {planned} to {now}, whose reads this cursor's do not match; run the query again")]
    CursorOutdated { planned: Phase, now: Phase },
    #[error("the query matches more than {0} documents that only the source layout holds yet (the backfill has not copied them), which the router holds in memory to merge; narrow the filter or wait for the backfill")]
    QueryTooLarge(usize),
    #[error("id {0} already exists")]
    DuplicateId(String),
    #[error("the document has no {0:?} field")]
    MissingField(String),
    #[error("field {0:?} cannot be changed: the tenant key, the id, the routing field and _reshard are immutable")]
    ImmutableField(String),
    #[error("{0}")]
    InvalidUpdate(String),
    #[error("invalid listing cursor: {0}")]
    InvalidCursor(String),
    #[error("page size {asked} is above the maximum of {max}")]
    PageTooLarge { asked: usize, max: usize },
    #[error("shard {0:?} is used by a routing version but has no connection")]
    UnknownShard(String),
    #[error(transparent)]
    Routing(#[from] RoutingError),
    #[error(transparent)]
    Protocol(#[from] ProtocolError),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("MongoDB: {}", crate::shards::describe(.0))]
    Mongo(#[from] mongodb::error::Error),
}

/// What the router applies: the phase of the collection's migration and the two layouts.
/// Without an active migration, both layouts are the collection's current version and the
/// phase is `completed` (read and write the current version).
#[derive(Clone, Debug)]
pub struct Snapshot {
    pub migration_id: Option<i64>,
    pub epoch: i64,
    pub phase: Phase,
    /// A rolled-back migration that was sealed: deletes leave no source tombstone.
    pub sealed: bool,
    /// The migration's share of reads shadowed when the snapshot was loaded (routers follow
    /// changes of it with every poll, without a new epoch).
    pub shadow_read_percent: f64,
    pub source: Arc<RoutingVersion>,
    pub target: Arc<RoutingVersion>,
}

impl Snapshot {
    /// A stored document as the application sees it: without `_reshard` and without the
    /// routing fields of the two versions (reshard derives them; no write may set them).
    pub fn view(&self, doc: Document) -> Document {
        let mut doc = crate::envelope::strip(doc);
        for field in [self.source.routing_field(), self.target.routing_field()]
            .into_iter()
            .flatten()
        {
            doc.remove(field);
        }
        doc
    }

    async fn load(store: &Store, collection: &str) -> Result<Snapshot, StoreError> {
        match store.followed_migration(collection).await? {
            Some(m) => Ok(Snapshot {
                migration_id: Some(m.id),
                epoch: m.epoch,
                phase: m.phase(),
                sealed: m.sealed_at.is_some(),
                shadow_read_percent: shadow_read_percent(&m),
                source: Arc::new(
                    store
                        .version(collection, Some(m.from_version))
                        .await?
                        .version,
                ),
                target: Arc::new(store.version(collection, Some(m.to_version)).await?.version),
            }),
            None => {
                let current = store.current_version(collection).await?;
                let v = Arc::new(store.version(collection, Some(current)).await?.version);
                Ok(Snapshot {
                    migration_id: None,
                    epoch: 0,
                    phase: Phase::Completed,
                    sealed: false,
                    shadow_read_percent: 0.0,
                    source: v.clone(),
                    target: v,
                })
            }
        }
    }

    fn same_epoch(&self, other: &Snapshot) -> bool {
        self.migration_id == other.migration_id && self.epoch == other.epoch
    }
}

/// The migration's `shadow_read_percent` (0 when its settings cannot be read).
fn shadow_read_percent(m: &crate::store::migrations::Migration) -> f64 {
    crate::settings::MigrationSettings::from_json(&m.settings)
        .map(|s| s.shadow_read_percent)
        .unwrap_or(0.0)
}

pub(crate) struct Inner {
    store: Store,
    collection: String,
    id: uuid::Uuid,
    config: RouterConfig,
    shards: Shards,
    /// Operations hold a read guard for their whole life; an epoch switch takes the write
    /// guard, so it waits for the operations of the old epoch to drain and new ones wait for
    /// the switch.
    snapshot: RwLock<Arc<Snapshot>>,
    epochs: watch::Sender<(Option<i64>, i64)>,
    lease: Mutex<Lease>,
    /// Wakes the heartbeat task (an epoch was switched: acknowledge it now).
    beat_now: Notify,
    /// Wakes the follower (the lease lapsed: load the phase again).
    reload_now: Notify,
    stats: Mutex<OperationStats>,
    /// The phase applied now, for labelling metrics without waiting on `snapshot` (an epoch
    /// switch in progress holds it).
    applied_phase: Mutex<Phase>,
    /// Shadow reads: the share, the bound on tasks in flight, the counts.
    shadow: shadow::ShadowReads,
    /// Set by [`Router::shutdown`]: operations that have not taken the snapshot yet refuse.
    closed: std::sync::atomic::AtomicBool,
}

/// The router's lease, on the monotonic clock.
struct Lease {
    /// Until when the last renewal that counts is valid.
    valid_until: Instant,
    /// Bumped when a renewal found the lease lapsed (the driver may have counted this router
    /// out and moved on): renewals do not count until a load that started after it.
    lapses: u64,
    /// The value of `lapses` when the last load of the phase started.
    loaded: u64,
}

/// A router for one collection. Cheap to clone; clones share one registration.
#[derive(Clone)]
pub struct Router {
    inner: Arc<Inner>,
    /// The follower and the heartbeat task; empty once shut down.
    task: Arc<Mutex<Vec<JoinHandle<()>>>>,
}

impl Router {
    /// Connects to the state store, opens a client per registered shard, registers and starts
    /// following the collection's migration. While the state store cannot be reached it tries
    /// again until [`RouterConfig::connect_deadline`]; it returns only once it has loaded the
    /// migration's phase.
    pub async fn connect(
        database_url: &str,
        collection: &str,
        config: RouterConfig,
    ) -> Result<Router, RouterError> {
        config.check()?;
        // A URL that is not one never becomes reachable: refused here, before any attempt.
        let store = Store::connect_lazy(database_url)?;
        let id = uuid::Uuid::new_v4();
        starting(&store, &config, id, || async {
            store.check_schema().await?;
            let shards = Shards::connect(&store.shards().await?, false)
                .await
                .map_err(|e| RouterError::InvalidUpdate(e.to_string()))?;
            Router::start(store.clone(), collection, config.clone(), shards, id).await
        })
        .await
    }

    /// Like [`Router::connect`], with the application's own database handle per shard name.
    pub async fn with_shards(
        store: Store,
        collection: &str,
        config: RouterConfig,
        shards: impl Into<Shards>,
    ) -> Result<Router, RouterError> {
        config.check()?;
        let shards = shards.into();
        let id = uuid::Uuid::new_v4();
        starting(&store, &config, id, || {
            Router::start(
                store.clone(),
                collection,
                config.clone(),
                shards.clone(),
                id,
            )
        })
        .await
    }

    /// One attempt to start: registers as `id` (every attempt registers as the same router, so
    /// an attempt cut short leaves no second registration behind), loads the phase,
    /// acknowledges it and starts the follower and the heartbeats.
    async fn start(
        store: Store,
        collection: &str,
        config: RouterConfig,
        shards: Shards,
        id: uuid::Uuid,
    ) -> Result<Router, RouterError> {
        // Register first, then load: any move the driver makes after the registration waits
        // for this router, and every move before it is in what the load sees.
        let started = Instant::now();
        let host = crate::identity::hostname();
        store
            .register_router(&Registration {
                id,
                collection,
                name: &config.name,
                host: &host,
                pid: std::process::id() as i32,
                ttl: config.lease_ttl,
                fence_margin: config.fence_margin(),
                kind: config.kind,
                heartbeat_interval: config.heartbeat_interval,
            })
            .await?;
        let snapshot = match Snapshot::load(&store, collection).await {
            Ok(s) => s,
            Err(e) => {
                let _ = store.deregister_router(id).await;
                return Err(e.into());
            }
        };
        // A shard the application did not hand over (or that was registered since it read
        // the registry) is connected from its registration.
        if let Err(e) = connect_shards(&store, &shards, &snapshot).await {
            let _ = store.deregister_router(id).await;
            return Err(e);
        }
        crate::telemetry::router_applies(collection, snapshot.epoch, snapshot.phase.as_str(), None);
        let (epochs, _) = watch::channel((snapshot.migration_id, snapshot.epoch));
        let shadow =
            shadow::ShadowReads::new(snapshot.shadow_read_percent, config.shadow_reads_in_flight);
        let inner = Arc::new(Inner {
            store,
            collection: collection.to_owned(),
            id,
            lease: Mutex::new(Lease {
                valid_until: started + config.lease_ttl,
                lapses: 0,
                loaded: 0,
            }),
            config,
            shards,
            applied_phase: Mutex::new(snapshot.phase),
            snapshot: RwLock::new(Arc::new(snapshot)),
            epochs,
            beat_now: Notify::new(),
            reload_now: Notify::new(),
            stats: Mutex::new(OperationStats::default()),
            shadow,
            closed: std::sync::atomic::AtomicBool::new(false),
        });
        // Acknowledge the epoch we start with at once.
        inner.heartbeat().await;
        let tasks = vec![
            tokio::spawn(follow(inner.clone())),
            tokio::spawn(heartbeats(inner.clone())),
        ];
        Ok(Router {
            inner,
            task: Arc::new(Mutex::new(tasks)),
        })
    }

    /// This router's registration id.
    pub fn id(&self) -> uuid::Uuid {
        self.inner.id
    }

    /// The phase and epoch the router applies now.
    pub async fn snapshot(&self) -> Arc<Snapshot> {
        self.inner.snapshot.read().await.clone()
    }

    /// Waits until the router applies an epoch of at least `epoch` (for tests and tools).
    pub async fn wait_for_epoch(&self, epoch: i64, timeout: Duration) -> bool {
        let mut rx = self.inner.epochs.subscribe();
        let reached = tokio::time::timeout(timeout, rx.wait_for(|(_, e)| *e >= epoch)).await;
        matches!(reached, Ok(Ok(_)))
    }

    /// Stops following, and removes the registration so that no barrier waits for it. New
    /// operations are refused ([`RouterError::ShutDown`]) and the ones in flight drain first
    /// (each ends by its lease's deadline), while the lease is still renewed: a barrier that
    /// stops waiting for this router once it deregistered must not have a write of it land
    /// afterwards.
    pub async fn shutdown(&self) {
        let tasks = std::mem::take(&mut *self.task.lock().expect("router task lock"));
        if tasks.is_empty() {
            return;
        }
        self.inner
            .closed
            .store(true, std::sync::atomic::Ordering::SeqCst);
        drop(self.inner.snapshot.write().await);
        for task in &tasks {
            task.abort();
        }
        for task in tasks {
            let _ = task.await;
        }
        let _ = self.inner.store.deregister_router(self.inner.id).await;
    }

    /// The document with this tenant and id, or `None` (a tombstone is "not found").
    pub async fn get(
        &self,
        tenant: impl Into<Bson>,
        id: impl Into<Bson>,
    ) -> Result<Option<Document>, RouterError> {
        let (tenant, id) = (tenant.into(), id.into());
        let (outcome, _, snapshot) = self
            .run_on("get", &tenant, &id, Operation::Get, &Terms::default())
            .await?;
        let doc = match outcome {
            Outcome::Read(doc) => doc,
            other => unreachable_outcome("get", other),
        };
        // The application has its answer; a shadow read (when sampled) runs in a task.
        shadow::after_get(&self.inner, snapshot, tenant, id);
        Ok(doc)
    }

    /// Inserts a new document; [`RouterError::DuplicateId`] when the id exists in either layout.
    pub async fn insert(&self, doc: Document) -> Result<(), RouterError> {
        let (tenant, id) = self.keys_of(&doc).await?;
        match self
            .run("insert", &tenant, &id, Operation::Insert(doc))
            .await?
        {
            Outcome::Inserted => Ok(()),
            Outcome::Duplicate => Err(RouterError::DuplicateId(id.to_string())),
            other => unreachable_outcome("insert", other),
        }
    }

    /// Replaces the document with the same tenant and id; with `upsert`, creates it when
    /// absent (re-creating a deleted id replaces its tombstone). Returns whether a document
    /// was written.
    pub async fn replace(&self, doc: Document, upsert: bool) -> Result<bool, RouterError> {
        let (tenant, id) = self.keys_of(&doc).await?;
        let op = Operation::Replace { doc, upsert };
        match self.run("replace", &tenant, &id, op).await? {
            // An upsert that created the document.
            Outcome::Inserted => Ok(true),
            other => changed(other, "replace"),
        }
    }

    /// Applies a partial update (`$set`, `$inc`, ...) to the document. Refuses an update that
    /// would change the tenant key, the id, the routing field or `_reshard`.
    pub async fn update(
        &self,
        tenant: impl Into<Bson>,
        id: impl Into<Bson>,
        update: Document,
    ) -> Result<bool, RouterError> {
        let (tenant, id) = (tenant.into(), id.into());
        exec::check_update(&*self.snapshot().await, &update)?;
        changed(
            self.run("update", &tenant, &id, Operation::Update(update))
                .await?,
            "update",
        )
    }

    /// Deletes the document (a tombstone while the source may still hold a copy). Returns
    /// whether it existed.
    pub async fn delete(
        &self,
        tenant: impl Into<Bson>,
        id: impl Into<Bson>,
    ) -> Result<bool, RouterError> {
        let (tenant, id) = (tenant.into(), id.into());
        changed(
            self.run("delete", &tenant, &id, Operation::Delete).await?,
            "delete",
        )
    }

    /// One page of a tenant's documents in `_id` order, after the id `after`. The page's
    /// `next` is the cursor for the following page (`None` at the end).
    pub async fn list_tenant(
        &self,
        tenant: impl Into<Bson>,
        after: Option<Bson>,
        limit: usize,
    ) -> Result<Page, RouterError> {
        if limit > self.inner.config.max_page_size {
            return Err(RouterError::PageTooLarge {
                asked: limit,
                max: self.inner.config.max_page_size,
            });
        }
        let tenant = tenant.into();
        let started = Instant::now();
        let result = async {
            self.inner.check_lease()?;
            let snapshot = self.inner.snapshot.read().await;
            self.inner.check_open()?;
            // A listing only reads, but a read answered from an old phase after the driver
            // counted this router out could miss documents cleanup removed: it ends by the
            // lease's deadline too.
            let deadline = self
                .inner
                .step_deadline()
                .ok_or(RouterError::RoutingStale)?;
            tokio::time::timeout_at(
                deadline,
                list::list_tenant(&self.inner, &snapshot, &tenant, after, limit, deadline),
            )
            .await
            .map_err(|_| RouterError::RoutingStale)?
        }
        .await;
        self.inner.record("list_tenant", started, result.is_ok());
        result
    }

    async fn keys_of(&self, doc: &Document) -> Result<(Bson, Bson), RouterError> {
        let snapshot = self.snapshot().await;
        exec::check_document(&snapshot, doc)?;
        let tenant_key = snapshot.target.tenant_key.clone();
        let tenant = doc
            .get(&tenant_key)
            .cloned()
            .ok_or(RouterError::MissingField(tenant_key))?;
        let id = doc
            .get("_id")
            .cloned()
            .ok_or_else(|| RouterError::MissingField("_id".to_owned()))?;
        Ok((tenant, id))
    }

    /// Runs one operation on the document with this tenant and id, under `terms`: a
    /// condition the document must match besides its id, and the image of it to return. This
    /// is the router's engine as the front drives it: `op` is any of the protocol's
    /// operations (a conditional `Get`, an `Upsert`, ...), checked as the library's own calls
    /// check theirs. `name` labels it in the statistics and metrics (`find_and_modify`, ...).
    pub async fn execute(
        &self,
        name: &'static str,
        tenant: Bson,
        id: Bson,
        op: Operation<Document, Document>,
        terms: &Terms,
    ) -> Result<Executed, RouterError> {
        {
            let snapshot = self.snapshot().await;
            match &op {
                Operation::Get | Operation::Delete => {}
                Operation::Insert(doc) | Operation::Replace { doc, .. } => {
                    exec::check_document(&snapshot, doc)?;
                    check_keys(&snapshot, doc, &tenant, &id)?;
                }
                Operation::Update(update) => exec::check_update(&snapshot, update)?,
                Operation::Upsert { update, insert } => {
                    exec::check_update(&snapshot, update)?;
                    exec::check_document(&snapshot, insert)?;
                    check_keys(&snapshot, insert, &tenant, &id)?;
                }
            }
        }
        let (outcome, image, _) = self.run_on(name, &tenant, &id, op, terms).await?;
        Ok(Executed { outcome, image })
    }

    /// Runs one operation under the current epoch; while the phase holds writes, waits for the
    /// phase to move on (without holding up the epoch switch) up to the hold timeout.
    async fn run(
        &self,
        name: &'static str,
        tenant: &Bson,
        id: &Bson,
        op: Operation<Document, Document>,
    ) -> Result<Outcome<Document>, RouterError> {
        Ok(self
            .run_on(name, tenant, id, op, &Terms::default())
            .await?
            .0)
    }

    /// [`Router::run`] under `terms`, with the image asked for and the snapshot the operation
    /// ran on.
    async fn run_on(
        &self,
        name: &'static str,
        tenant: &Bson,
        id: &Bson,
        op: Operation<Document, Document>,
        terms: &Terms,
    ) -> Result<(Outcome<Document>, Option<Document>, Arc<Snapshot>), RouterError> {
        let started = Instant::now();
        let result = self.run_held(tenant, id, op, terms).await;
        self.inner.record(name, started, result.is_ok());
        result
    }

    async fn run_held(
        &self,
        tenant: &Bson,
        id: &Bson,
        op: Operation<Document, Document>,
        terms: &Terms,
    ) -> Result<(Outcome<Document>, Option<Document>, Arc<Snapshot>), RouterError> {
        let tenant_key = KeyValue::from_bson(tenant)?;
        let id_key = KeyValue::from_bson(id)?;
        let deadline = tokio::time::Instant::now() + self.inner.config.hold_timeout;
        let mut epochs = self.inner.epochs.subscribe();
        loop {
            self.inner.check_lease()?;
            let (outcome, image, snapshot) = {
                let snapshot = self.inner.snapshot.read().await;
                self.inner.check_open()?;
                let keys = exec::Keys {
                    tenant,
                    id,
                    tenant_key: &tenant_key,
                    id_key: &id_key,
                    terms,
                };
                let (outcome, image) =
                    exec::run_operation(&self.inner, &snapshot, &keys, op.clone()).await?;
                (outcome, image, Arc::clone(&*snapshot))
            };
            if outcome != Outcome::Held {
                return Ok((outcome, image, snapshot));
            }
            epochs.borrow_and_update();
            if tokio::time::timeout_at(deadline, epochs.changed())
                .await
                .is_err()
            {
                return Err(RouterError::WriteHeld(self.inner.config.hold_timeout));
            }
        }
    }
}

/// What [`Router::execute`] did: the operation's outcome, and the image of the document it
/// asked for ([`Terms::image`]).
#[derive(Clone, Debug, PartialEq)]
pub struct Executed {
    pub outcome: Outcome<Document>,
    pub image: Option<Document>,
}

/// A whole document the application hands over for `tenant` and `id` must carry them: the
/// front takes both from the command's filter, the document has its own.
fn check_keys(
    snapshot: &Snapshot,
    doc: &Document,
    tenant: &Bson,
    id: &Bson,
) -> Result<(), RouterError> {
    let tenant_key = &snapshot.target.tenant_key;
    let same = |field: &str, expected: &Bson| {
        doc.get(field)
            .is_some_and(|v| crate::ids::key(v) == crate::ids::key(expected))
    };
    if !same(tenant_key, tenant) {
        return Err(RouterError::ImmutableField(tenant_key.clone()));
    }
    if !same("_id", id) {
        return Err(RouterError::ImmutableField("_id".to_owned()));
    }
    Ok(())
}

/// Runs `attempt` until it has started the router, failed for another reason than a state
/// store that cannot be reached, or [`RouterConfig::connect_deadline`] has passed. Each attempt
/// first checks that the store answers ([`Store::check_reachable`], which says why it does
/// not, where the pool would only time out); the next one starts after an exponential backoff
/// with jitter (a quarter of a second, doubling up to 4 s, each wait lengthened by up to as
/// much again at random, so that routers restarted together do not try together), announced
/// by a warning with the reason. An attempt still running at the deadline is cut short.
async fn starting<F, Fut>(
    store: &Store,
    config: &RouterConfig,
    id: uuid::Uuid,
    mut attempt: F,
) -> Result<Router, RouterError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<Router, RouterError>>,
{
    use backon::{ExponentialBuilder, Retryable};

    let mut once = || {
        let start = attempt();
        async move {
            store.check_reachable().await?;
            start.await
        }
    };
    let Some(limit) = config.connect_deadline else {
        return once().await;
    };
    let started = Instant::now();
    let deadline = tokio::time::Instant::now() + limit;
    let mut attempts = 0_u32;
    let mut last_reason = None;
    let backoff = ExponentialBuilder::default()
        .with_jitter()
        .with_min_delay(Duration::from_millis(250))
        .with_max_delay(Duration::from_secs(4))
        .without_max_times();
    let retrying = once
        .retry(backoff)
        .sleep(tokio::time::sleep)
        .when(store_unreachable)
        // The last wait ends at the deadline, where the attempt it leads to is cut short.
        .adjust(|_, delay| {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            delay.filter(|_| !left.is_zero()).map(|d| d.min(left))
        })
        .notify(|e, delay| {
            attempts += 1;
            let reason = crate::redact::redact_uri(&e.to_string());
            tracing::warn!(
                router = %config.name,
                attempt = attempts,
                waited = ?started.elapsed(),
                deadline = ?limit,
                next_in = ?delay,
                error = %reason,
                "cannot reach the state store; the router serves nothing before it has loaded \
                 the migration's phase; trying again"
            );
            last_reason = Some(reason);
        });
    let outcome = tokio::time::timeout_at(deadline, retrying).await;
    let reason = match outcome {
        Ok(Ok(router)) => return Ok(router),
        Ok(Err(e)) if !store_unreachable(&e) => return Err(e),
        Ok(Err(e)) => crate::redact::redact_uri(&e.to_string()),
        Err(_) => last_reason.unwrap_or_else(|| "no answer from the state store yet".to_owned()),
    };
    // An attempt may have registered before the store went away again, or before the
    // deadline cut it short: one try to remove the registration, so that no barrier waits for
    // a router that never started (its lease would hold the next move until it ran out).
    let store = store.clone();
    tokio::spawn(async move {
        let _ = within(STORE_CALL_LIMIT, store.deregister_router(id)).await;
    });
    Err(RouterError::StoreUnreachable {
        deadline: limit,
        attempts: attempts + 1,
        reason,
    })
}

/// A start that failed because the state store could not be reached: another attempt may
/// succeed.
fn store_unreachable(e: &RouterError) -> bool {
    matches!(e, RouterError::Store(e) if e.is_unavailable())
}

fn changed(outcome: Outcome<Document>, op: &str) -> Result<bool, RouterError> {
    match outcome {
        Outcome::Changed(changed) => Ok(changed),
        other => unreachable_outcome(op, other),
    }
}

fn unreachable_outcome<T>(op: &str, outcome: Outcome<Document>) -> T {
    panic!("the protocol answered {op} with {outcome:?}")
}

impl Inner {
    /// Refuses an operation once the router is shut down.
    fn check_open(&self) -> Result<(), RouterError> {
        if self.closed.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(RouterError::ShutDown);
        }
        Ok(())
    }

    /// Refuses to start an operation once the lease is about to run out.
    fn check_lease(&self) -> Result<(), RouterError> {
        self.step_deadline()
            .map(|_| ())
            .ok_or(RouterError::RoutingStale)
    }

    /// The time by which the next step must have ended: a fence margin before the lease runs
    /// out. `None` once that time has passed.
    fn step_deadline(&self) -> Option<tokio::time::Instant> {
        let until = self.lease.lock().expect("lease lock").valid_until;
        let deadline = until.checked_sub(self.config.fence_margin())?;
        (Instant::now() < deadline).then(|| tokio::time::Instant::from_std(deadline))
    }

    /// Records an operation: in the heartbeat's statistics and in the metrics facade.
    fn record(&self, op: &'static str, started: Instant, ok: bool) {
        let took = started.elapsed();
        self.stats.lock().expect("stats lock").record(op, took, ok);
        let phase = *self.applied_phase.lock().expect("phase lock");
        crate::telemetry::router_operation(
            &self.collection,
            op,
            crate::telemetry::path_of(op, phase),
            ok,
            took,
        );
    }

    /// Renews the lease and acknowledges the epoch applied now (the epoch switched to last,
    /// read without waiting for a switch in progress).
    async fn heartbeat(&self) {
        let started = Instant::now();
        let (migration_id, epoch) = *self.epochs.borrow();
        let mut stats = self.stats.lock().expect("stats lock").take_report();
        stats["shadow"] = self.shadow.report();
        let beat = Heartbeat {
            migration_id,
            acked_epoch: migration_id.map(|_| epoch),
            stats: &stats,
        };
        let renewal = match within(
            STORE_CALL_LIMIT,
            self.store.router_heartbeat(
                self.id,
                self.config.lease_ttl,
                self.config.fence_margin(),
                &beat,
            ),
        )
        .await
        {
            Ok(Renewal::Gone) => match within(
                STORE_CALL_LIMIT,
                self.store.register_router(&Registration {
                    id: self.id,
                    collection: &self.collection,
                    name: &self.config.name,
                    host: &crate::identity::hostname(),
                    pid: std::process::id() as i32,
                    ttl: self.config.lease_ttl,
                    fence_margin: self.config.fence_margin(),
                    kind: self.config.kind,
                    heartbeat_interval: self.config.heartbeat_interval,
                }),
            )
            .await
            {
                // A new registration is a lapse: the driver did not wait for this router.
                Ok(()) => Renewal::Lapsed,
                Err(e) => {
                    tracing::warn!(router = %self.config.name, error = %e, "registration failed");
                    return;
                }
            },
            Ok(renewal) => renewal,
            Err(e) => {
                tracing::warn!(router = %self.config.name, error = %e, "heartbeat failed");
                return;
            }
        };
        {
            let mut lease = self.lease.lock().expect("lease lock");
            if renewal == Renewal::Lapsed {
                // The driver may have counted this router out and moved on: serve again only
                // once the phase was loaded after this renewal.
                lease.lapses += 1;
            } else if lease.loaded >= lease.lapses {
                lease.valid_until = started + self.config.lease_ttl;
            }
        }
        if renewal == Renewal::Lapsed {
            tracing::warn!(
                router = %self.config.name,
                "the lease had lapsed; loading the phase again before serving"
            );
            self.reload_now.notify_one();
            return;
        }
        // The store answered: store the shadow-read counts too (when they changed).
        self.shadow.store_counts(self).await;
    }

    /// Loads the state and, when the epoch changed, drains and switches.
    async fn refresh(&self) -> bool {
        let lapses = self.lease.lock().expect("lease lock").lapses;
        let switched = self.load().await;
        if let Some(switched) = switched {
            let mut lease = self.lease.lock().expect("lease lock");
            let covers_a_lapse = lapses > lease.loaded;
            lease.loaded = lease.loaded.max(lapses);
            drop(lease);
            // Acknowledge a switch, or renew a lapsed lease, without waiting for the interval.
            if switched || covers_a_lapse {
                self.beat_now.notify_one();
            }
        }
        switched.unwrap_or(false)
    }

    /// One load of the migration state: `Some(true)` when it switched epochs, `Some(false)`
    /// when the epoch is current, `None` when the state store could not be read.
    async fn load(&self) -> Option<bool> {
        let warn = |e: StoreError| {
            tracing::warn!(router = %self.config.name, error = %e, "cannot load the migration state");
            None
        };
        // Polls are frequent: read the migration row alone, and the versions only on a change.
        let active = match within(
            STORE_CALL_LIMIT,
            self.store.followed_migration(&self.collection),
        )
        .await
        {
            Ok(m) => m,
            Err(e) => return warn(e),
        };
        // Settings change without a new epoch: the share of shadow reads follows every poll.
        self.shadow
            .set_percent(active.as_ref().map_or(0.0, shadow_read_percent));
        let current = self.snapshot.read().await.clone();
        let key = (active.as_ref().map(|m| m.id), active.map_or(0, |m| m.epoch));
        if key == (current.migration_id, current.epoch) {
            return Some(false);
        }
        let fresh = match within(
            STORE_CALL_LIMIT,
            Snapshot::load(&self.store, &self.collection),
        )
        .await
        {
            Ok(s) => s,
            Err(e) => return warn(e),
        };
        if current.same_epoch(&fresh) {
            return Some(false);
        }
        // A version of the new epoch may name a shard registered since this router started:
        // it is connected before the router switches (and acknowledges); until it is, the
        // router stays in its epoch and the driver's barrier names it.
        if let Err(e) = connect_shards(&self.store, &self.shards, &fresh).await {
            tracing::warn!(router = %self.config.name, epoch = fresh.epoch, "cannot switch epoch: {e}");
            return None;
        }
        let mut guard = self.snapshot.write().await;
        tracing::info!(
            router = %self.config.name,
            from = %current.phase, to = %fresh.phase, epoch = fresh.epoch,
            "switching epoch"
        );
        let key = (fresh.migration_id, fresh.epoch);
        crate::telemetry::router_applies(
            &self.collection,
            fresh.epoch,
            fresh.phase.as_str(),
            Some(current.phase.as_str()),
        );
        *self.applied_phase.lock().expect("phase lock") = fresh.phase;
        *guard = Arc::new(fresh);
        drop(guard);
        self.epochs.send_replace(key);
        Some(true)
    }
}

/// Connects every shard the snapshot's versions name that `shards` lacks, from the store's
/// registry.
async fn connect_shards(
    store: &Store,
    shards: &Shards,
    snapshot: &Snapshot,
) -> Result<(), RouterError> {
    let mut wanted = snapshot.source.shards();
    wanted.extend(snapshot.target.shards());
    if wanted.iter().all(|s| shards.contains(s)) {
        return Ok(());
    }
    let registered = within(STORE_CALL_LIMIT, store.shards()).await?;
    match shards.ensure(&wanted, &registered).await {
        Ok(connected) => {
            for shard in connected {
                tracing::info!(
                    shard,
                    "connected to a shard registered since this router started"
                );
            }
            Ok(())
        }
        Err(crate::shards::EnsureError::Unregistered(e)) => Err(RouterError::UnknownShard(e.0)),
        Err(e) => Err(RouterError::InvalidUpdate(e.to_string())),
    }
}

/// The follower: listens for changes, polls anyway, loads the state and switches epochs. A
/// switch waits for the operations of the old epoch to drain; the heartbeat task goes on
/// meanwhile.
async fn follow(inner: Arc<Inner>) {
    let mut listener = listen(&inner).await;
    loop {
        let poll = inner.config.heartbeat_interval;
        match listener.as_mut() {
            Some(l) => tokio::select! {
                n = l.recv() => if let Err(e) = n {
                    tracing::warn!(error = %e, "lost the NOTIFY listener; polling");
                    listener = None;
                },
                _ = tokio::time::sleep(poll) => {}
                _ = inner.reload_now.notified() => {}
            },
            None => {
                tokio::select! {
                    _ = tokio::time::sleep(poll) => {}
                    _ = inner.reload_now.notified() => {}
                }
                listener = listen(&inner).await;
            }
        }
        inner.refresh().await;
    }
}

/// The heartbeat task: renews the lease every interval, and at once after an epoch switch.
async fn heartbeats(inner: Arc<Inner>) {
    loop {
        tokio::select! {
            _ = tokio::time::sleep(inner.config.heartbeat_interval) => {}
            _ = inner.beat_now.notified() => {}
        }
        inner.heartbeat().await;
    }
}

async fn listen(inner: &Inner) -> Option<sqlx::postgres::PgListener> {
    let subscribe = async {
        let mut listener = sqlx::postgres::PgListener::connect_with(inner.store.pool())
            .await
            .ok()?;
        listener.listen(CHANNEL).await.ok()?;
        Some(listener)
    };
    tokio::time::timeout(STORE_CALL_LIMIT, subscribe)
        .await
        .ok()
        .flatten()
}

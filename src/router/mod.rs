//! The router applications embed: it reads and writes one collection through the current phase
//! of its migration, so that the phases actually happen in the application's traffic.
//!
//! A [`Router`] registers itself, then loads the collection's routing versions and its active
//! migration from the state store, listens for `NOTIFY` and also polls, and heartbeats a lease
//! from a task of its own. When the migration's epoch changes it stops starting operations under
//! the old epoch, waits for the ones in flight to finish (heartbeating all the while, so the
//! driver keeps waiting for it), switches, and acknowledges the new epoch at once.
//!
//! The lease fences every step, not only the start of an operation (docs/decisions/0006-leases-fence-every-step.md): a step is not sent once fewer than [`RouterConfig::fence_margin`] of the
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
//! holds up phase changes until its lease has run out (docs/decisions/0008-the-data-path-outlives-the-state-store.md).
//!
//! A router that starts while the state store is down has no phase to apply, and never
//! guesses one: [`Router::connect`] returns only once it has registered and loaded the
//! migration's phase, and until then nothing can be sent through it. It tries again with
//! backoff (a warning at each attempt, with the reason) up to
//! [`RouterConfig::connect_deadline`] (two minutes by default), then fails naming the
//! deadline and the last reason (docs/decisions/0009-a-starting-router-waits-for-the-state-store.md).
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

mod config;
mod exec;
mod follower;
mod list;
mod query;
mod shadow;
mod snapshot;
mod stats;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use mongodb::bson::{Bson, Document};
use tokio::sync::{watch, Notify, RwLock};
use tokio::task::JoinHandle;

use crate::phase::Phase;
use crate::protocol::{Operation, Outcome, ProtocolError};
use crate::routing::{KeyValue, RoutingError};
use crate::shards::Shards;
use crate::store::routers::{Heartbeat, Registration, Renewal};
use crate::store::{within, Store, StoreError, CHANNEL};

/// How long a heartbeat or a load may wait for the state store before it is given up (and
/// tried again at the next interval): a server cut off by the network answers nothing.
const STORE_CALL_LIMIT: Duration = Duration::from_secs(15);

pub use config::{RouterConfig, StepEvent, StepHook};
pub use exec::{is_duplicate_key, Image, Terms};
use follower::{connect_shards, follow, heartbeats};
pub use list::Page;
pub use query::{Order, Query, QueryCursor, MAX_SOURCE_MATCHES};
use snapshot::shadow_read_percent;
pub use snapshot::Snapshot;
use stats::OperationStats;

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
    Write(Box<crate::shards::classify::WriteFailure>),
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
}

//! What the routed commands run on: the state store, one router per routed collection of the
//! front's database (each registered as a router, so the driver's barriers and the write
//! switch wait for this front as for any application), the shard handles they share, the
//! passthrough location, and the cursors the front holds.
//!
//! A collection is routed when it has a routing version. The front learns the routed
//! collections when it starts, starts a router for each, and looks again every few seconds
//! (and before it sends a command on a collection it does not route to the passthrough), so
//! a version created while it runs is routed within one look, before any migration of it can
//! move past `planned` without this front's acknowledgement.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::Mutex;

use super::cursors::Cursors;
use crate::router::{Router, RouterConfig, RouterError};
use crate::shards::passthrough::Passthrough;
use crate::shards::Shards;
use crate::store::Store;

/// How often the front looks for collections that gained a routing version.
pub const DISCOVERY_INTERVAL: Duration = Duration::from_secs(2);

/// How a front's engine is made.
#[derive(Clone)]
pub struct EngineConfig {
    /// The logical database the application uses; its collections with routing versions are
    /// routed, everything else goes to the passthrough.
    pub database: String,
    /// The routers' settings; each router's name is this name (the front's, say
    /// `front 10.0.0.5:27018`).
    pub router: RouterConfig,
}

/// What the routed commands run on.
pub struct Engine {
    store: Store,
    config: EngineConfig,
    shards: Shards,
    passthrough: Option<Passthrough>,
    routers: Mutex<HashMap<String, Router>>,
    /// The routed collections, and when they were read.
    routed: std::sync::Mutex<(BTreeSet<String>, Option<Instant>)>,
    pub cursors: Cursors,
}

/// Where a command on a namespace goes.
pub enum Destination<'a> {
    /// A routed collection of the front's database, through its router.
    Routed(Router),
    /// Anything else, to the passthrough location.
    Passthrough(&'a Passthrough),
    /// Anything else, with no passthrough location configured.
    Unserved,
}

impl Engine {
    /// An engine over `store` (its schema checked) and `shards`, starting a router for every
    /// routed collection.
    pub async fn start(
        store: Store,
        shards: Shards,
        passthrough: Option<Passthrough>,
        mut config: EngineConfig,
    ) -> Result<Arc<Engine>, RouterError> {
        // Its routers register as a front's (`reshard router list`, `status`).
        config.router.kind = crate::store::RouterKind::Front;
        let engine = Arc::new(Engine {
            store,
            config,
            shards,
            passthrough,
            routers: Mutex::new(HashMap::new()),
            routed: std::sync::Mutex::new((BTreeSet::new(), None)),
            cursors: Cursors::default(),
        });
        for collection in engine.discover().await? {
            engine.router_of(&collection).await?;
        }
        Ok(engine)
    }

    /// The logical database the front routes.
    pub fn database(&self) -> &str {
        &self.config.database
    }

    pub fn passthrough(&self) -> Option<&Passthrough> {
        self.passthrough.as_ref()
    }

    /// The routed collections, as last read.
    pub fn routed_collections(&self) -> BTreeSet<String> {
        self.routed.lock().expect("routed lock").0.clone()
    }

    /// Reads the routed collections from the store.
    async fn discover(&self) -> Result<BTreeSet<String>, RouterError> {
        let names: BTreeSet<String> = self.store.routed_collections().await?.into_iter().collect();
        *self.routed.lock().expect("routed lock") = (names.clone(), Some(Instant::now()));
        Ok(names)
    }

    /// Looks for new routed collections and starts their routers; run every
    /// [`DISCOVERY_INTERVAL`] until the engine is dropped.
    pub async fn follow(self: Arc<Engine>) {
        loop {
            tokio::time::sleep(DISCOVERY_INTERVAL).await;
            match self.discover().await {
                Ok(names) => {
                    for collection in names {
                        if let Err(e) = self.router_of(&collection).await {
                            tracing::warn!(collection, error = %e, "front: cannot start the collection's router");
                        }
                    }
                }
                Err(e) => tracing::warn!(error = %e, "front: cannot read the routed collections"),
            }
        }
    }

    /// Where a command on `database.collection` goes. A collection the last look did not
    /// find routed is looked up again when that look is older than a second, so the
    /// passthrough never serves a collection that has a routing version for longer than
    /// that.
    pub async fn destination(
        &self,
        database: &str,
        collection: &str,
    ) -> Result<Destination<'_>, RouterError> {
        if database == self.config.database {
            if let Some(router) = self.routers.lock().await.get(collection) {
                return Ok(Destination::Routed(router.clone()));
            }
            let (known, read_at) = self.routed.lock().expect("routed lock").clone();
            let stale = read_at.is_none_or(|at| at.elapsed() > Duration::from_secs(1));
            let routed = known.contains(collection)
                || (stale && self.discover().await?.contains(collection));
            if routed {
                return Ok(Destination::Routed(self.router_of(collection).await?));
            }
        }
        Ok(match &self.passthrough {
            Some(p) => Destination::Passthrough(p),
            None => Destination::Unserved,
        })
    }

    /// The router of a routed collection, started (registered) on first use.
    async fn router_of(&self, collection: &str) -> Result<Router, RouterError> {
        let mut routers = self.routers.lock().await;
        if let Some(router) = routers.get(collection) {
            return Ok(router.clone());
        }
        let router = Router::with_shards(
            self.store.clone(),
            collection,
            self.config.router.clone(),
            self.shards.clone(),
        )
        .await?;
        tracing::info!(collection, router = %router.id(), "front: routing the collection");
        routers.insert(collection.to_owned(), router.clone());
        Ok(router)
    }

    /// The routers started so far, by collection.
    pub async fn routers(&self) -> Vec<(String, Router)> {
        let routers = self.routers.lock().await;
        routers
            .iter()
            .map(|(c, r)| (c.clone(), r.clone()))
            .collect()
    }

    /// Deregisters every router (each drains what it has in flight first).
    pub async fn shutdown(&self) {
        for (_, router) in self.routers().await {
            router.shutdown().await;
        }
    }

    /// The shard handles the routers share (the catalogue commands reach every location).
    pub fn shards(&self) -> &Shards {
        &self.shards
    }
}

//! A prepared migration world for router-level tests: a fresh state store with shards s1..s4
//! (databases on one real server), orders versions 1 and 2 from `tests/fixtures/versions`, and
//! a planned migration from 1 to 2. The state store is a fresh database on the shared server
//! ([`World::start`]) or a PostgreSQL cluster of the test's own that it may stop and kill
//! ([`World::start_private`]).

use std::collections::HashMap;
use std::path::Path;

use std::time::Duration;

use mongodb::Database;
use reshard::phase::{Action, Phase};
use reshard::router::Router;
use reshard::routing::RoutingVersion;
use reshard::store::Store;

use super::{MongoServer, PgDb, PrivatePg};

/// The phases from `planned` to `backfill`, in order: where routers read both layouts and
/// write the new one while the copy runs.
pub const TO_BACKFILL: [Phase; 4] = [
    Phase::DualRead,
    Phase::WriteSwitch,
    Phase::NewWrites,
    Phase::Backfill,
];

/// Where a [`World`] keeps its state.
pub enum StateDb {
    /// A fresh database on the shared server.
    Shared(PgDb),
    /// A cluster of the test's own.
    Private(std::sync::Arc<PrivatePg>),
}

impl StateDb {
    pub fn url(&self) -> String {
        match self {
            StateDb::Shared(db) => db.url(),
            StateDb::Private(pg) => pg.url(),
        }
    }

    pub async fn pool(&self) -> sqlx::PgPool {
        match self {
            StateDb::Shared(db) => db.pool().await,
            StateDb::Private(pg) => pg.new_pool().await,
        }
    }

    /// The private cluster; panics for the shared one.
    pub fn private(&self) -> &std::sync::Arc<PrivatePg> {
        match self {
            StateDb::Private(pg) => pg,
            StateDb::Shared(_) => panic!("this world's state store is the shared server"),
        }
    }
}

/// Runs the `reshard` binary against `db` ([`super::bin_without_db`] with
/// `RESHARD_DATABASE_URL`) and returns what it did, whatever the exit code.
pub fn reshard(db: &StateDb, args: &[&str]) -> std::process::Output {
    super::bin_without_db()
        .env("RESHARD_DATABASE_URL", db.url())
        .args(args)
        .output()
        .unwrap()
}

/// As [`reshard`], failing the test with the command's output unless it succeeds; returns
/// its standard output.
pub fn reshard_ok(db: &StateDb, args: &[&str]) -> String {
    let out = reshard(db, args);
    assert!(
        out.status.success(),
        "reshard {args:?} failed ({}):\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

pub struct World {
    pub db: StateDb,
    pub server: MongoServer,
    pub store: Store,
    pub migration: i64,
    pub shards: HashMap<String, Database>,
    pub v1: RoutingVersion,
    pub v2: RoutingVersion,
}

impl World {
    pub async fn start() -> World {
        Self::start_on(StateDb::Shared(PgDb::fresh().await)).await
    }

    /// A world whose state store is a PostgreSQL cluster of its own.
    pub async fn start_private() -> World {
        Self::start_on(StateDb::Private(std::sync::Arc::new(
            PrivatePg::start().await,
        )))
        .await
    }

    /// A world whose migration goes from the version `v1` to the version `v2` (YAML texts)
    /// rather than the fixtures'.
    #[allow(dead_code)]
    pub async fn start_with_versions(v1: &str, v2: &str) -> World {
        let db = StateDb::Shared(PgDb::fresh().await);
        Self::start_with(db, [("v1.yaml", v1.to_owned()), ("v2.yaml", v2.to_owned())]).await
    }

    /// A world whose server takes `configureFailPoint` (`failCommand`).
    #[allow(dead_code)]
    pub async fn start_with_failpoints() -> World {
        let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/versions");
        let texts = ["orders_v1.yaml", "orders_v2.yaml"]
            .map(|file| (file, std::fs::read_to_string(fixtures.join(file)).unwrap()));
        let server = MongoServer::builder().test_commands(true).start().await;
        Self::start_with_server(StateDb::Shared(PgDb::fresh().await), texts, server).await
    }

    async fn start_on(db: StateDb) -> World {
        let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/versions");
        let texts = ["orders_v1.yaml", "orders_v2.yaml"]
            .map(|file| (file, std::fs::read_to_string(fixtures.join(file)).unwrap()));
        Self::start_with(db, texts).await
    }

    async fn start_with(db: StateDb, texts: [(&str, String); 2]) -> World {
        Self::start_with_server(db, texts, MongoServer::start().await).await
    }

    async fn start_with_server(
        db: StateDb,
        texts: [(&str, String); 2],
        server: MongoServer,
    ) -> World {
        let store = Store::connect_unchecked(&db.url()).await.unwrap();
        store.migrate().await.unwrap();
        let client = server.client().await;
        let base = MongoServer::database_name();
        let mut shards = HashMap::new();
        for name in ["s1", "s2", "s3", "s4"] {
            let database = format!("{base}_{name}");
            store
                .add_shard(name, &server.uri(), &database)
                .await
                .unwrap();
            shards.insert(name.to_owned(), client.database(&database));
        }
        let mut versions = Vec::new();
        for (file, text) in texts {
            let v = reshard::spec::parse_version_spec(file, &text, "orders").unwrap();
            versions.push(
                store
                    .insert_version(&v, &text, "test")
                    .await
                    .unwrap()
                    .version,
            );
        }
        let migration = store
            .create_migration("orders", 1, 2, "test")
            .await
            .unwrap()
            .id;
        let v2 = versions.pop().unwrap();
        let v1 = versions.pop().unwrap();
        World {
            db,
            server,
            store,
            migration,
            shards,
            v1,
            v2,
        }
    }

    /// A router of the `orders` collection on this world's shards, as an application runs it.
    pub async fn router(&self, config: reshard::router::RouterConfig) -> Router {
        Router::with_shards(self.store.clone(), "orders", config, self.shards.clone())
            .await
            .unwrap()
    }

    /// The shards as the workers take them.
    pub fn databases(&self) -> std::collections::BTreeMap<String, Database> {
        self.shards
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    }

    /// Runs one worker for the migration until its current task is done.
    pub async fn work(&self) {
        let mut config = reshard::worker::WorkerConfig::new("test-worker");
        config.migration = Some(self.migration);
        config.exit_when_done = true;
        config.lease_ttl = Duration::from_secs(5);
        config.idle_poll = Duration::from_millis(200);
        let (_stop, shutdown) = tokio::sync::watch::channel(false);
        reshard::worker::Worker::with_shards(self.store.clone(), self.databases(), config)
            .run(shutdown)
            .await
            .unwrap();
    }

    /// Waits until every router still counted has acknowledged the migration's current epoch.
    pub async fn acknowledged(&self) {
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        loop {
            let m = self.store.migration(self.migration).await.unwrap();
            if self
                .store
                .unacknowledged_routers(&m)
                .await
                .unwrap()
                .is_empty()
            {
                return;
            }
            assert!(std::time::Instant::now() < deadline, "no acknowledgement");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Moves the migration through `phases`, waiting for every router to acknowledge each.
    pub async fn advance(&self, routers: &[&Router], phases: &[Phase]) {
        for phase in phases {
            let t = self
                .store
                .transition(
                    self.migration,
                    &Action::Advance(*phase),
                    "test",
                    None,
                    false,
                )
                .await
                .unwrap();
            for r in routers {
                assert!(
                    r.wait_for_epoch(t.migration.epoch, Duration::from_secs(10))
                        .await,
                    "router did not reach epoch {}",
                    t.migration.epoch
                );
            }
            // The acknowledgement is the heartbeat after the switch.
            let deadline = std::time::Instant::now() + Duration::from_secs(10);
            while !self
                .store
                .unacknowledged_routers(&t.migration)
                .await
                .unwrap()
                .is_empty()
            {
                assert!(std::time::Instant::now() < deadline, "no acknowledgement");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }

    /// Moves the phase without its gate (the same row change, epoch bump and notification as
    /// `Store::transition`), for tests of router behaviour in phases whose gates other
    /// components open.
    pub async fn force_phase(&self, routers: &[&Router], phase: Phase) {
        let pool = self.db.pool().await;
        let epoch: i64 = sqlx::query_scalar(
            "UPDATE migrations SET phase = $2, epoch = epoch + 1 WHERE id = $1 RETURNING epoch",
        )
        .bind(self.migration)
        .bind(phase.as_str())
        .fetch_one(&pool)
        .await
        .unwrap();
        sqlx::query("SELECT pg_notify('reshard_migrations', '{}')")
            .execute(&pool)
            .await
            .unwrap();
        for r in routers {
            // An ended migration too: routers acknowledge its final epoch, which is what the
            // driver's last barrier (before purging or dropping anything) waits for.
            assert!(r.wait_for_epoch(epoch, Duration::from_secs(10)).await);
            assert_eq!(r.snapshot().await.phase, phase);
        }
    }
}

//! `--features containers`: the same fixtures backed by Docker through testcontainers,
//! with the official `mongo` and `postgres` images at pinned tags.
//!
//! Differences from the local backend:
//! * `mongod` always runs as a single-node replica set `rs` (initiated here) with
//!   `--setParameter enableTestCommands=1`, so `test_commands` and `sync_on_commit` are
//!   accepted and ignored (mongod journals `j:true` writes anyway).
//! * [`Storage::Memory`] is not available on community mongod: data survives `restart`.
//! * `kill` is `shutdown {force: true}` (the container's PID 1 cannot be SIGKILLed from
//!   inside and the Docker API is not exposed by testcontainers); `stop` is `docker stop`.
//! * [`PgDb`] uses `RESHARD_TEST_PG_URL` when set, else a `postgres` container per `PgDb`.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use mongodb::bson::doc;
use sqlx::postgres::PgPool;
use testcontainers_modules::mongo::Mongo;
use testcontainers_modules::postgres::Postgres;
use testcontainers_modules::testcontainers::core::IntoContainerPort;
use testcontainers_modules::testcontainers::runners::AsyncRunner;
use testcontainers_modules::testcontainers::{ContainerAsync, ImageExt};

use super::common::{
    mongo_start_timeout, mongo_uri, unique_name, wait_for_ping, MongoServerBuilder, Storage,
};
use super::pg_common;

/// Official image tags the container backend runs (pinned).
pub const MONGO_IMAGE_TAG: &str = "7.0.14";
pub const POSTGRES_IMAGE_TAG: &str = "15.8";

const MONGO_PORT: u16 = 27017;
const PG_PORT: u16 = 5432;

/// A `mongo` container. Removed on `Drop`.
pub struct MongoServer {
    name: String,
    host: String,
    port: u16,
    opts: MongoServerBuilder,
    container: ContainerAsync<Mongo>,
    running: Mutex<bool>,
}

fn free_port() -> u16 {
    std::net::TcpListener::bind(("127.0.0.1", 0))
        .and_then(|l| l.local_addr())
        .expect("binding 127.0.0.1:0")
        .port()
}

impl MongoServerBuilder {
    /// Starts a `mongo` container (single-node replica set) and waits until it is primary.
    pub async fn start(self) -> MongoServer {
        let name = self.display_name();
        let mut cmd: Vec<String> = vec![
            "--replSet".into(),
            "rs".into(),
            "--bind_ip_all".into(),
            "--setParameter".into(),
            "enableTestCommands=1".into(),
        ];
        cmd.extend(self.extra_args.iter().cloned());
        // A fixed host port, so `restart` keeps the URI.
        let port = free_port();
        let container = Mongo::default()
            .with_tag(MONGO_IMAGE_TAG)
            .with_cmd(cmd)
            .with_mapped_port(port, MONGO_PORT.tcp())
            .with_startup_timeout(Duration::from_secs(120))
            .start()
            .await
            .unwrap_or_else(|e| panic!("starting mongo:{MONGO_IMAGE_TAG} container {name}: {e}"));
        let host = container
            .get_host()
            .await
            .map(|h| h.to_string())
            .unwrap_or_else(|_| "127.0.0.1".to_string());
        let server = MongoServer {
            name,
            host,
            port,
            opts: self,
            container,
            running: Mutex::new(true),
        };
        server.wait_up().await;
        server.initiate_replica_set().await;
        server
    }
}

impl MongoServer {
    pub fn uri(&self) -> String {
        mongo_uri(&self.host, self.port)
    }

    pub fn uri_with_database(&self, db: &str) -> String {
        self.uri().replacen("/?", &format!("/{db}?"), 1)
    }

    pub fn host(&self) -> &str {
        &self.host
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn is_running(&self) -> bool {
        *self.running.lock().unwrap()
    }

    /// The server's process id on this machine: none for a container (its process is the
    /// Docker daemon's to signal), so faults that stop a process are skipped here.
    pub fn pid(&self) -> Option<u32> {
        None
    }

    /// The container's stdout and stderr so far.
    pub async fn logs(&self) -> String {
        let out = self.container.stdout_to_vec().await.unwrap_or_default();
        let err = self.container.stderr_to_vec().await.unwrap_or_default();
        format!(
            "{}{}",
            String::from_utf8_lossy(&out),
            String::from_utf8_lossy(&err)
        )
    }

    /// Abrupt stop: `shutdown {force: true}`; the container exits with mongod.
    pub async fn kill(&self) {
        if !self.is_running() {
            return;
        }
        // The connection drops during shutdown, so an error is the expected outcome.
        let _ = self
            .admin_command(doc! { "shutdown": 1, "force": true })
            .await;
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline && self.ping(Duration::from_millis(300)).await.is_ok() {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        *self.running.lock().unwrap() = false;
    }

    /// `docker stop` (SIGTERM, then SIGKILL after Docker's grace period).
    pub async fn stop(&self) {
        if !self.is_running() {
            return;
        }
        if let Err(e) = self.container.stop().await {
            panic!("stopping container {}: {e}", self.name);
        }
        *self.running.lock().unwrap() = false;
    }

    /// Stops the container if it runs, starts it again (same host port, same data) and
    /// waits until it is primary again.
    pub async fn restart(&self) {
        self.stop().await;
        if let Err(e) = self.container.start().await {
            panic!("restarting container {}: {e}", self.name);
        }
        *self.running.lock().unwrap() = true;
        self.wait_up().await;
        self.wait_primary().await;
    }

    async fn wait_up(&self) {
        if let Err(e) = wait_for_ping(&self.uri(), mongo_start_timeout() * 4, || Ok(())).await {
            panic!(
                "mongo container {} did not answer on {}: {e}\n--- logs ---\n{}",
                self.name,
                self.uri(),
                self.logs().await
            );
        }
    }

    async fn initiate_replica_set(&self) {
        let cfg = doc! {
            "_id": "rs",
            "members": [ { "_id": 0, "host": format!("localhost:{MONGO_PORT}") } ],
        };
        if let Err(e) = self.admin_command(doc! { "replSetInitiate": cfg }).await {
            // 23 = AlreadyInitialized
            if super::common::error_code(&e) != Some(23) {
                panic!("replSetInitiate on {}: {e}", self.name);
            }
        }
        self.wait_primary().await;
    }

    async fn wait_primary(&self) {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Ok(reply) = self.admin_command(doc! { "hello": 1 }).await {
                if reply.get_bool("isWritablePrimary").unwrap_or(false) {
                    return;
                }
            }
            if Instant::now() > deadline {
                panic!("mongo container {} did not become primary", self.name);
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// A server shared by all tests of this test binary. Its container is not removed
    /// when the process exits (statics are never dropped).
    pub async fn shared() -> &'static MongoServer {
        static SHARED: tokio::sync::OnceCell<MongoServer> = tokio::sync::OnceCell::const_new();
        SHARED
            .get_or_init(|| MongoServer::builder().name("shared").start())
            .await
    }
}

impl std::fmt::Debug for MongoServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MongoServer")
            .field("name", &self.name)
            .field("uri", &self.uri())
            .field("container", &self.container.id())
            .finish()
    }
}

/// A fresh database (`reshard_t_...`): on `RESHARD_TEST_PG_URL` when set (dropped
/// `WITH (FORCE)` on `Drop`), else in its own `postgres` container (removed on `Drop`).
pub struct PgDb {
    name: String,
    admin_url: String,
    url: String,
    pool: tokio::sync::OnceCell<PgPool>,
    container: Option<ContainerAsync<Postgres>>,
}

impl PgDb {
    /// `$RESHARD_TEST_PG_URL`, or `None` when each `PgDb` gets its own container.
    pub fn configured_admin_url() -> Option<String> {
        std::env::var("RESHARD_TEST_PG_URL")
            .ok()
            .filter(|u| !u.is_empty())
    }

    pub async fn fresh() -> PgDb {
        let (admin_url, container) = match Self::configured_admin_url() {
            Some(url) => (url, None),
            None => {
                let c = Postgres::default()
                    .with_host_auth()
                    .with_tag(POSTGRES_IMAGE_TAG)
                    .with_startup_timeout(Duration::from_secs(120))
                    .start()
                    .await
                    .unwrap_or_else(|e| {
                        panic!("starting postgres:{POSTGRES_IMAGE_TAG} container: {e}")
                    });
                let host = c.get_host().await.expect("container host");
                let port = c
                    .get_host_port_ipv4(PG_PORT.tcp())
                    .await
                    .expect("postgres port");
                (
                    format!("postgres://postgres@{host}:{port}/postgres"),
                    Some(c),
                )
            }
        };
        let name = unique_name("reshard_t");
        pg_common::create_database(&admin_url, &name).await;
        let url = pg_common::with_database(&admin_url, &name);
        PgDb {
            name,
            admin_url,
            url,
            pool: tokio::sync::OnceCell::new(),
            container,
        }
    }

    /// Admin URL (maintenance database) of the server holding this database.
    pub fn admin_url(&self) -> String {
        self.admin_url.clone()
    }

    pub fn url(&self) -> String {
        self.url.clone()
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// A pool (max 8 connections) on this database, connected on first call; later calls
    /// return clones of it. Bound to the tokio runtime of the first call.
    pub async fn pool(&self) -> PgPool {
        self.pool
            .get_or_init(|| super::pg_common::connect_pool(&self.url))
            .await
            .clone()
    }
}

impl Drop for PgDb {
    fn drop(&mut self) {
        if self.container.is_none() {
            pg_common::drop_database_blocking(&self.admin_url, &self.name);
        }
        // Otherwise the container (and the database with it) goes with `self.container`.
    }
}

impl std::fmt::Debug for PgDb {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgDb").field("url", &self.url).finish()
    }
}

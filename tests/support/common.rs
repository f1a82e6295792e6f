//! Backend-independent parts of the fixtures.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use mongodb::bson::{doc, Bson, Document};
use mongodb::Client;
use rand::Rng;

use super::MongoServer;

/// Options every test URI carries: without `serverMonitoringMode=poll` some errors stall
/// the driver for 10 s, and without `maxIdleTimeMS` idle pooled connections die at 300 s.
pub const MONGO_URI_OPTIONS: &str =
    "directConnection=true&serverMonitoringMode=poll&maxIdleTimeMS=60000";

/// How long a server may take to answer its first `ping`: 30 s, or
/// `$RESHARD_TEST_MONGO_START_TIMEOUT_SECS`. (secantusd-py needs ~0.3 s on an idle machine
/// but 2-7 s while cargo compiles on both cores: it imports numpy and shapely.)
pub fn mongo_start_timeout() -> Duration {
    std::env::var("RESHARD_TEST_MONGO_START_TIMEOUT_SECS")
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
        .map(Duration::from_secs)
        .unwrap_or(Duration::from_secs(30))
}

/// True when the heavy tests should run (`RESHARD_HEAVY_TESTS` set to anything but
/// `""`/`0`; `scripts/test` sets it under CI).
pub fn heavy_tests_enabled() -> bool {
    matches!(std::env::var("RESHARD_HEAVY_TESTS"), Ok(v) if !v.is_empty() && v != "0")
}

/// Returns early from a test (printing why) unless [`heavy_tests_enabled`].
#[macro_export]
macro_rules! require_heavy {
    () => {
        if !$crate::support::heavy_tests_enabled() {
            eprintln!("skipped: set RESHARD_HEAVY_TESTS=1 to run this heavy test");
            return;
        }
    };
}

/// A name unique within this machine for a while: `<prefix>_<pid>_<counter>_<random>`,
/// lower-case ASCII, digits and `_` only (valid as a PostgreSQL or MongoDB name).
pub fn unique_name(prefix: &str) -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let r: u32 = rand::thread_rng().gen();
    format!("{prefix}_{}_{n}_{r:08x}", std::process::id())
}

/// `mongodb://127.0.0.1:<port>/?<MONGO_URI_OPTIONS>`.
pub fn mongo_uri(host: &str, port: u16) -> String {
    format!("mongodb://{host}:{port}/?{MONGO_URI_OPTIONS}")
}

/// Converts a JSON value (relaxed extended JSON) into a BSON document; panics otherwise.
pub fn json_to_doc(v: serde_json::Value) -> Document {
    match Bson::try_from(v) {
        Ok(Bson::Document(d)) => d,
        Ok(other) => panic!("expected a JSON object, got {other:?}"),
        Err(e) => panic!("invalid extended JSON: {e}"),
    }
}

/// Polls `ping` on `uri` until it answers or `timeout` passes. `alive` is called between
/// attempts and may return an error message (e.g. "process exited") to stop early.
pub(crate) async fn wait_for_ping(
    uri: &str,
    timeout: Duration,
    mut alive: impl FnMut() -> Result<(), String>,
) -> Result<(), String> {
    let deadline = Instant::now() + timeout;
    // Wait for the port first: cheap, and avoids driver server-selection timeouts.
    let addr = uri
        .trim_start_matches("mongodb://")
        .split('/')
        .next()
        .unwrap_or_default()
        .to_string();
    let mut last_err = String::from("never connected");
    loop {
        alive()?;
        if Instant::now() > deadline {
            return Err(format!("no ping answer within {timeout:?}: {last_err}"));
        }
        match tokio::net::TcpStream::connect(&addr).await {
            Ok(_) => break,
            Err(e) => last_err = format!("connect {addr}: {e}"),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let ping_uri = format!("{uri}&serverSelectionTimeoutMS=1000&connectTimeoutMS=1000");
    loop {
        alive()?;
        if Instant::now() > deadline {
            return Err(format!("no ping answer within {timeout:?}: {last_err}"));
        }
        match Client::with_uri_str(&ping_uri).await {
            Ok(client) => {
                let r = client
                    .database("admin")
                    .run_command(doc! { "ping": 1 })
                    .await;
                client.shutdown().immediate(true).await;
                match r {
                    Ok(_) => return Ok(()),
                    Err(e) => last_err = format!("ping: {e}"),
                }
            }
            Err(e) => last_err = format!("client: {e}"),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Where a server keeps its data.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Storage {
    /// Ephemeral: nothing survives [`MongoServer::restart`].
    #[default]
    Memory,
    /// On disk in the fixture's temporary directory: data survives [`MongoServer::restart`]
    /// (and, with `sync_on_commit`, a [`MongoServer::kill`] for `j:true` writes).
    Persistent,
}

/// Builder for [`MongoServer`]; finish with `.start().await`.
#[derive(Clone, Debug, Default)]
pub struct MongoServerBuilder {
    pub(crate) name: Option<String>,
    pub(crate) test_commands: bool,
    pub(crate) sync_on_commit: bool,
    pub(crate) storage: Storage,
    pub(crate) extra_args: Vec<String>,
}

impl MongoServerBuilder {
    /// A label for logs and panic messages (e.g. `s1`); default `mongo`.
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = Some(name.into());
        self
    }
    /// Enable `configureFailPoint` (`--enable-test-commands`; on mongod
    /// `--setParameter enableTestCommands=1`).
    pub fn test_commands(mut self, on: bool) -> Self {
        self.test_commands = on;
        self
    }
    /// Fsync on every commit (`--sync-on-commit`), for tests that kill a server.
    pub fn sync_on_commit(mut self, on: bool) -> Self {
        self.sync_on_commit = on;
        self
    }
    pub fn storage(mut self, storage: Storage) -> Self {
        self.storage = storage;
        self
    }
    /// Extra command-line arguments for the server process.
    pub fn arg(mut self, arg: impl Into<String>) -> Self {
        self.extra_args.push(arg.into());
        self
    }
    pub(crate) fn display_name(&self) -> String {
        self.name.clone().unwrap_or_else(|| "mongo".to_string())
    }
}

/// Backend-independent methods of [`MongoServer`].
impl MongoServer {
    pub fn builder() -> MongoServerBuilder {
        MongoServerBuilder::default()
    }

    /// Starts a server with default options (in-memory, no test commands).
    pub async fn start() -> MongoServer {
        Self::builder().start().await
    }

    /// A database name unique per call (`reshard_t_...`), for tests that isolate per
    /// database on one server rather than per process.
    pub fn database_name() -> String {
        unique_name("reshard_t")
    }

    /// A new driver client for this server (bound to the calling tokio runtime).
    pub async fn client(&self) -> Client {
        Client::with_uri_str(self.uri())
            .await
            .unwrap_or_else(|e| panic!("mongo client for {}: {e}", self.uri()))
    }

    /// Runs an admin command on a short-lived client and returns the reply.
    pub async fn admin_command(&self, cmd: Document) -> mongodb::error::Result<Document> {
        let client = Client::with_uri_str(self.uri()).await?;
        let r = client.database("admin").run_command(cmd).await;
        client.shutdown().immediate(true).await;
        r
    }

    /// `ping` with `timeout` as server-selection and connect timeout (for checking that a
    /// server is down, or up).
    pub async fn ping(&self, timeout: Duration) -> mongodb::error::Result<()> {
        let ms = timeout.as_millis().max(1);
        let uri = format!(
            "{}&serverSelectionTimeoutMS={ms}&connectTimeoutMS={ms}",
            self.uri()
        );
        let client = Client::with_uri_str(uri).await?;
        let r = client
            .database("admin")
            .run_command(doc! { "ping": 1 })
            .await;
        client.shutdown().immediate(true).await;
        r.map(|_| ())
    }

    /// Arms the `failCommand` failpoint. `spec` holds `mode` and `data` (and any other
    /// field of `configureFailPoint`), e.g.
    /// `json!({"mode": {"times": 1}, "data": {"failCommands": ["insert"], "errorCode": 489,
    /// "errorLabels": ["SystemOverloadedError"]}})`. Needs `test_commands(true)`.
    /// Only one failpoint is active at a time per server.
    pub async fn fail_command(&self, spec: serde_json::Value) {
        let mut cmd = doc! { "configureFailPoint": "failCommand" };
        cmd.extend(json_to_doc(spec));
        if let Err(e) = self.admin_command(cmd.clone()).await {
            panic!("configureFailPoint {cmd} on {}: {e}", self.uri());
        }
    }

    /// Turns the `failCommand` failpoint off.
    pub async fn clear_failpoint(&self) {
        let cmd = doc! { "configureFailPoint": "failCommand", "mode": "off" };
        if let Err(e) = self.admin_command(cmd).await {
            panic!("clearing failCommand on {}: {e}", self.uri());
        }
    }
}

/// The server error code carried by a driver error (command error, write error, write
/// concern error, or the first write error of an `insert_many`), if any.
pub fn error_code(e: &mongodb::error::Error) -> Option<i32> {
    use mongodb::error::{ErrorKind, WriteFailure};
    match e.kind.as_ref() {
        ErrorKind::Command(c) => Some(c.code),
        ErrorKind::Write(WriteFailure::WriteError(w)) => Some(w.code),
        ErrorKind::Write(WriteFailure::WriteConcernError(w)) => Some(w.code),
        ErrorKind::InsertMany(im) => im
            .write_errors
            .as_ref()
            .and_then(|v| v.first().map(|w| w.code))
            .or_else(|| im.write_concern_error.as_ref().map(|w| w.code)),
        _ => None,
    }
    .or_else(|| {
        std::error::Error::source(e)
            .and_then(|s| s.downcast_ref::<mongodb::error::Error>())
            .and_then(error_code)
    })
}

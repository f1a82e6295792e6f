//! [`MongoServer`] backed by a local SecantusDB process (`secantusd-py`).

use std::collections::HashSet;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use tempfile::TempDir;

use super::common::{mongo_start_timeout, mongo_uri, wait_for_ping, MongoServerBuilder, Storage};

const HOST: &str = "127.0.0.1";
const DIR_PREFIX: &str = "reshard-secantus-";
/// How long `stop()` waits after SIGTERM before SIGKILL (SIGTERM can hang).
const TERM_GRACE: Duration = Duration::from_secs(2);

/// One `secantusd-py` process, in its own process group, with its data and log in a
/// temporary directory owned by the fixture. Killed (whole process group) on `Drop`.
pub struct MongoServer {
    name: String,
    port: u16,
    opts: MongoServerBuilder,
    dir: TempDir,
    child: Mutex<Option<Child>>,
    /// Whether the server runs with `--auth` (set by [`MongoServer::require_auth`]).
    auth: AtomicBool,
}

/// Path of `secantusd-py`: `$RESHARD_SECANTUSD`, else `<crate>/.venv/bin/secantusd-py`.
pub fn secantusd_path() -> PathBuf {
    match std::env::var_os("RESHARD_SECANTUSD") {
        Some(p) if !p.is_empty() => PathBuf::from(p),
        _ => Path::new(env!("CARGO_MANIFEST_DIR")).join(".venv/bin/secantusd-py"),
    }
}

impl MongoServerBuilder {
    /// Spawns the server and waits (up to 30 s, see `mongo_start_timeout`) until it answers `ping`; panics with the
    /// tail of its log otherwise.
    pub async fn start(self) -> MongoServer {
        sweep_stale_dirs();
        let exe = secantusd_path();
        if !exe.is_file() {
            panic!(
                "SecantusDB server not found at {}: run scripts/install-secantus.sh \
                 (or set RESHARD_SECANTUSD to the path of secantusd-py)",
                exe.display()
            );
        }
        let name = self.display_name();
        let mut attempt = 0;
        loop {
            attempt += 1;
            let port = free_port();
            let server = MongoServer {
                name: name.clone(),
                port,
                opts: self.clone(),
                dir: new_server_dir(),
                child: Mutex::new(None),
                auth: AtomicBool::new(false),
            };
            match server.spawn_and_wait().await {
                Ok(()) => return server,
                // Another process may have taken the port between our probe and the bind.
                Err(e) if attempt < 3 && server.log_tail(4000).contains("in use") => {
                    eprintln!("[{name}] port {port} was taken, retrying: {e}");
                    server.kill_now();
                }
                Err(e) => {
                    server.kill_now();
                    panic!(
                        "secantusd {name} did not come up on port {port}: {e}\n--- log tail ({}) ---\n{}",
                        server.log_path().display(),
                        server.log_tail(4000)
                    );
                }
            }
        }
    }
}

impl MongoServer {
    /// `mongodb://127.0.0.1:<port>/?directConnection=true&serverMonitoringMode=poll&maxIdleTimeMS=60000`
    pub fn uri(&self) -> String {
        mongo_uri(HOST, self.port)
    }

    /// Like [`uri`](Self::uri) with `db` as the default database in the path.
    pub fn uri_with_database(&self, db: &str) -> String {
        self.uri().replacen("/?", &format!("/{db}?"), 1)
    }

    pub fn host(&self) -> &str {
        HOST
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// The label given to the builder (`s1`, ...), `mongo` by default.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The server's stdout/stderr (appended to across restarts).
    pub fn log_path(&self) -> PathBuf {
        self.dir.path().join("secantusd.log")
    }

    /// The last `max_bytes` of the log.
    pub fn log_tail(&self, max_bytes: usize) -> String {
        let bytes = std::fs::read(self.log_path()).unwrap_or_default();
        let start = bytes.len().saturating_sub(max_bytes);
        String::from_utf8_lossy(&bytes[start..]).into_owned()
    }

    /// Process id of the running server (also its process-group id).
    pub fn pid(&self) -> Option<u32> {
        self.child.lock().unwrap().as_ref().map(|c| c.id())
    }

    /// Whether the server process is still running.
    pub fn is_running(&self) -> bool {
        let mut guard = self.child.lock().unwrap();
        match guard.as_mut() {
            Some(c) => matches!(c.try_wait(), Ok(None)),
            None => false,
        }
    }

    /// SIGKILL to the process group; returns once the process is reaped. No-op if stopped.
    pub async fn kill(&self) {
        self.kill_now();
    }

    fn kill_now(&self) {
        let mut guard = self.child.lock().unwrap();
        if let Some(mut child) = guard.take() {
            signal_group(child.id(), "KILL");
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// SIGTERM, up to 2 s to exit, then SIGKILL. No-op if stopped.
    pub async fn stop(&self) {
        let pid = match self.pid() {
            Some(pid) => pid,
            None => return,
        };
        signal_group(pid, "TERM");
        let deadline = Instant::now() + TERM_GRACE;
        while Instant::now() < deadline {
            if !self.is_running() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        self.kill_now();
    }

    /// Stops the server if it runs ([`stop`](Self::stop)), then starts it again on the
    /// same port with the same options and storage directory, and waits for `ping`.
    /// With [`Storage::Memory`] the restarted server is empty.
    pub async fn restart(&self) {
        self.stop().await;
        if let Err(e) = self.spawn_and_wait().await {
            self.kill_now();
            panic!(
                "secantusd {} did not come back on port {}: {e}\n--- log tail ({}) ---\n{}",
                self.name,
                self.port,
                self.log_path().display(),
                self.log_tail(4000)
            );
        }
    }

    /// Creates `user` (role `root` on `admin`) with `password`, then restarts the server with
    /// `--auth` on the same storage: from then on every command but the handshake (`hello`,
    /// `ping`) needs SCRAM-SHA-256 credentials (`authSource=admin`), so [`uri`](Self::uri)
    /// only pings. SecantusDB has no localhost exception, hence the restart. Needs
    /// [`Storage::Persistent`], where the user survives it (with `sync_on_commit`, even when
    /// SIGTERM hangs and the restart kills).
    pub async fn require_auth(&self, user: &str, password: &str) {
        assert_eq!(
            self.opts.storage,
            Storage::Persistent,
            "require_auth needs Storage::Persistent: the user must survive the restart"
        );
        let create = mongodb::bson::doc! {
            "createUser": user, "pwd": password, "roles": ["root"],
        };
        if let Err(e) = self.admin_command(create).await {
            panic!("createUser {user} on {}: {e}", self.name);
        }
        self.auth.store(true, Ordering::SeqCst);
        self.restart().await;
    }

    fn args(&self) -> Vec<String> {
        let storage = match self.opts.storage {
            // ":memory:" is a temp dir under $TMPDIR, which we point into self.dir, so a
            // SIGKILL leaves nothing behind once the fixture is dropped.
            Storage::Memory => ":memory:".to_string(),
            Storage::Persistent => self.dir.path().join("data").display().to_string(),
        };
        let mut args = vec![
            "--config".to_string(),
            self.dir.path().join("secantusd.toml").display().to_string(),
            "--host".to_string(),
            HOST.to_string(),
            "--port".to_string(),
            self.port.to_string(),
            "--storage-path".to_string(),
            storage,
        ];
        if self.opts.test_commands {
            args.push("--enable-test-commands".to_string());
        }
        if self.opts.sync_on_commit {
            args.push("--sync-on-commit".to_string());
        }
        if self.auth.load(Ordering::SeqCst) {
            args.push("--auth".to_string());
        }
        args.extend(self.opts.extra_args.iter().cloned());
        args
    }

    async fn spawn_and_wait(&self) -> Result<(), String> {
        let exe = secantusd_path();
        let mut log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log_path())
            .map_err(|e| format!("opening log: {e}"))?;
        let args = self.args();
        let _ = writeln!(
            log,
            "=== [{}] {} {}",
            self.name,
            exe.display(),
            args.join(" ")
        );
        let log_err = log.try_clone().map_err(|e| format!("log: {e}"))?;

        let mut cmd = match setpriv() {
            // The server gets SIGKILL if this test process dies without running Drop
            // (see `spawn_from_long_lived_thread`).
            Some(setpriv) => {
                let mut c = Command::new(setpriv);
                c.args(["--pdeathsig", "KILL", "--"]).arg(&exe);
                c
            }
            None => Command::new(&exe),
        };
        cmd.args(&args)
            .current_dir(self.dir.path())
            .env("TMPDIR", self.dir.path().join("tmp"))
            .env("PYTHONUNBUFFERED", "1")
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(log_err)
            .process_group(0);
        let child = super::spawn::from_long_lived_thread(cmd)
            .map_err(|e| format!("spawning {}: {e}", exe.display()))?;
        *self.child.lock().unwrap() = Some(child);

        let started = Instant::now();
        let r = wait_for_ping(&self.uri(), mongo_start_timeout(), || {
            let mut guard = self.child.lock().unwrap();
            match guard.as_mut().map(|c| c.try_wait()) {
                Some(Ok(None)) => Ok(()),
                Some(Ok(Some(status))) => Err(format!("process exited: {status}")),
                Some(Err(e)) => Err(format!("try_wait: {e}")),
                None => Err("process was killed".to_string()),
            }
        })
        .await;
        if std::env::var_os("RESHARD_TEST_VERBOSE").is_some() {
            eprintln!(
                "[{}] up on port {} in {:?}",
                self.name,
                self.port,
                started.elapsed()
            );
        }
        r
    }
}

impl Drop for MongoServer {
    fn drop(&mut self) {
        let child = match self.child.get_mut() {
            Ok(c) => c.take(),
            Err(poisoned) => poisoned.into_inner().take(),
        };
        if let Some(mut child) = child {
            signal_group(child.id(), "KILL");
            let _ = child.kill();
            let _ = child.wait();
        }
        // `dir` (data, log, $TMPDIR) is removed by TempDir's Drop.
    }
}

impl std::fmt::Debug for MongoServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MongoServer")
            .field("name", &self.name)
            .field("port", &self.port)
            .field("dir", &self.dir.path())
            .finish()
    }
}

fn new_server_dir() -> TempDir {
    let dir = tempfile::Builder::new()
        .prefix(&format!("{DIR_PREFIX}{}-", std::process::id()))
        .tempdir()
        .expect("creating a temporary directory for secantusd");
    std::fs::create_dir_all(dir.path().join("tmp")).expect("mkdir tmp");
    std::fs::create_dir_all(dir.path().join("data")).expect("mkdir data");
    // An explicit (empty) config file disables the auto-discovery of ./secantusd.toml,
    // ~/.secantus/secantusd.toml and /etc/secantus/secantusd.toml.
    File::create(dir.path().join("secantusd.toml")).expect("writing secantusd.toml");
    dir
}

/// Sends SIG`sig` to the process group `pgid` (= the server's pid: it leads its group).
fn signal_group(pgid: u32, sig: &str) {
    let _ = Command::new("kill")
        .arg(format!("-{sig}"))
        .arg("--")
        .arg(format!("-{pgid}"))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
}

fn setpriv() -> Option<&'static Path> {
    static SETPRIV: OnceLock<Option<PathBuf>> = OnceLock::new();
    SETPRIV
        .get_or_init(|| {
            ["/usr/bin/setpriv", "/bin/setpriv"]
                .iter()
                .map(PathBuf::from)
                .find(|p| p.is_file())
        })
        .as_deref()
}

/// A port that was free a moment ago and was not handed out before in this process.
fn free_port() -> u16 {
    static USED: Mutex<Option<HashSet<u16>>> = Mutex::new(None);
    let mut used = USED.lock().unwrap();
    let used = used.get_or_insert_with(HashSet::new);
    loop {
        let port = std::net::TcpListener::bind((HOST, 0))
            .and_then(|l| l.local_addr())
            .expect("binding 127.0.0.1:0")
            .port();
        if used.insert(port) {
            return port;
        }
    }
}

/// Removes the temporary directories of test processes that died without cleaning up
/// (their servers were killed by the parent-death signal). Once per process.
fn sweep_stale_dirs() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let Ok(entries) = std::fs::read_dir(std::env::temp_dir()) else {
            return;
        };
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            let Some(rest) = name.strip_prefix(DIR_PREFIX) else {
                continue;
            };
            let Some(pid) = rest.split('-').next().and_then(|p| p.parse::<u32>().ok()) else {
                continue;
            };
            if pid != std::process::id() && !Path::new(&format!("/proc/{pid}")).exists() {
                let _ = std::fs::remove_dir_all(entry.path());
            }
        }
    });
}

/// A server shared by all tests of this test binary (in-memory, no test commands):
/// isolate with [`MongoServer::database_name`]. Never stopped; it dies with the process.
impl MongoServer {
    pub async fn shared() -> &'static MongoServer {
        static SHARED: tokio::sync::OnceCell<MongoServer> = tokio::sync::OnceCell::const_new();
        SHARED
            .get_or_init(|| MongoServer::builder().name("shared").start())
            .await
    }
}

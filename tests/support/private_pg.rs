//! [`PrivatePg`]: a PostgreSQL cluster of the test's own, for fault tests that stop, kill
//! and restart the state store without touching the shared server.
//!
//! `initdb` into a temporary directory, then one `postgres` process on a free port of
//! 127.0.0.1 (and a unix socket in the same directory), from the server binaries on the
//! machine: it needs no container, so it exists with and without `--features containers`.
//!
//! * Binaries: `$RESHARD_TEST_PG_BINDIR`, else `pg_config --bindir`, else the newest
//!   `/usr/lib/postgresql/<major>/bin`, else the directory `postgres` on `$PATH` links to.
//! * Root: PostgreSQL refuses to run as root, so when the tests run as root `initdb` and
//!   `postgres` run as the `postgres` system user (else `nobody`) through `setpriv`, and the
//!   temporary directory is handed to that user.
//! * Cleanup: the postmaster leads its own process group and gets SIGKILL when the test
//!   process dies (`setpriv --pdeathsig`); its children notice the postmaster's death and
//!   exit. `Drop` kills the postmaster and all its children and removes the directory.
//! * Durability: `fsync=off` (and `full_page_writes=off`) but `synchronous_commit=on`, so
//!   every acknowledged commit is in the kernel's page cache before the client hears of
//!   it: [`PrivatePg::kill`] (SIGKILL) loses nothing; only an OS crash would.
//! * `dynamic_shared_memory_type=mmap` keeps dynamic shared memory inside the data
//!   directory; the small System V segment a killed cluster leaves is removed by `kill`.

use std::collections::{HashMap, HashSet};
use std::fs::OpenOptions;
use std::io::Write;
use std::os::unix::fs::MetadataExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::str::FromStr;
use std::sync::atomic::{AtomicU16, Ordering};
use std::sync::{mpsc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use rand::Rng;
use sqlx::postgres::{PgConnectOptions, PgConnection, PgPool};
use sqlx::{ConnectOptions, Connection};
use tempfile::TempDir;

const HOST: &str = "127.0.0.1";
const DIR_PREFIX: &str = "reshard-privpg-";
/// The database [`PrivatePg::url`] points at.
pub const PRIVATE_PG_DATABASE: &str = "reshard";
/// How long `stop()` waits for a fast shutdown before it kills.
const STOP_TIMEOUT: Duration = Duration::from_secs(60);
/// How long a restart keeps retrying while its port is still taken.
const PORT_RETRY_WINDOW: Duration = Duration::from_secs(15);

/// A private PostgreSQL cluster (see the module docs). Every method takes `&self`, so an
/// `Arc<PrivatePg>` can be shared with the tasks of a test.
pub struct PrivatePg {
    bindir: PathBuf,
    run_as: Option<RunAs>,
    port: AtomicU16,
    dir: TempDir,
    /// The postmaster (started through `setpriv`, which execs: same pid).
    child: Mutex<Option<Child>>,
}

/// The unprivileged user the cluster runs as when the tests run as root.
#[derive(Clone, Debug)]
struct RunAs {
    name: String,
    uid: u32,
    gid: u32,
}

impl PrivatePg {
    /// `initdb` in a new temporary directory, starts the server on a free port, waits until
    /// it accepts connections and creates the database `reshard`. Panics (with the server
    /// log) when anything fails.
    pub async fn start() -> PrivatePg {
        sweep_stale_dirs();
        let bindir = server_bindir();
        let run_as = run_as();
        if run_as.is_some() && setpriv().is_none() {
            panic!("the tests run as root and PostgreSQL refuses to: setpriv (util-linux) is needed to run it as another user");
        }
        let dir = tempfile::Builder::new()
            .prefix(&format!("{DIR_PREFIX}{}-", std::process::id()))
            .tempdir()
            .expect("creating a temporary directory for PostgreSQL");
        if let Some(user) = &run_as {
            std::os::unix::fs::chown(dir.path(), Some(user.uid), Some(user.gid))
                .unwrap_or_else(|e| panic!("chown {} to {}: {e}", dir.path().display(), user.name));
        }
        let pg = PrivatePg {
            bindir,
            run_as,
            port: AtomicU16::new(0),
            dir,
            child: Mutex::new(None),
        };
        pg.initdb().await;

        let mut attempt = 0;
        loop {
            attempt += 1;
            pg.port.store(free_port(), Ordering::SeqCst);
            match pg.spawn_and_wait().await {
                Ok(()) => break,
                // Another process took the port between our probe and the bind.
                Err(StartError::PortInUse(e)) if attempt < 5 => {
                    eprintln!("[private-pg] port {} was taken, retrying: {e}", pg.port());
                }
                Err(e) => pg.fail(&format!("did not come up on port {}", pg.port()), e),
            }
        }
        super::pg_common::create_database(&pg.admin_url(), PRIVATE_PG_DATABASE).await;
        pg
    }

    /// `postgres://postgres@127.0.0.1:<port>/reshard`
    pub fn url(&self) -> String {
        format!(
            "postgres://postgres@{HOST}:{}/{PRIVATE_PG_DATABASE}",
            self.port()
        )
    }

    /// `postgres://postgres@127.0.0.1:<port>/postgres` (the maintenance database).
    pub fn admin_url(&self) -> String {
        format!("postgres://postgres@{HOST}:{}/postgres", self.port())
    }

    pub fn host(&self) -> &str {
        HOST
    }

    /// The port; the same across [`stop`](Self::stop), [`kill`](Self::kill) and
    /// [`start_again`](Self::start_again).
    pub fn port(&self) -> u16 {
        self.port.load(Ordering::SeqCst)
    }

    /// The temporary directory: `data/`, the logs and the unix socket.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    pub fn data_dir(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    /// The server's stderr (appended to across restarts).
    pub fn log_path(&self) -> PathBuf {
        self.dir.path().join("postgres.log")
    }

    /// The last `max_bytes` of the server log.
    pub fn log_tail(&self, max_bytes: usize) -> String {
        let bytes = std::fs::read(self.log_path()).unwrap_or_default();
        let start = bytes.len().saturating_sub(max_bytes);
        String::from_utf8_lossy(&bytes[start..]).into_owned()
    }

    /// Process id of the running postmaster.
    pub fn pid(&self) -> Option<u32> {
        self.child.lock().unwrap().as_ref().map(|c| c.id())
    }

    /// The postmaster and all its descendants (backends, checkpointer, ...); empty when
    /// the server is not running.
    pub fn pids(&self) -> Vec<u32> {
        match self.pid() {
            Some(pid) if self.is_running() => {
                let mut pids = vec![pid];
                pids.extend(descendants(pid));
                pids
            }
            _ => Vec::new(),
        }
    }

    /// Whether the postmaster is running.
    pub fn is_running(&self) -> bool {
        let mut guard = self.child.lock().unwrap();
        match guard.as_mut() {
            Some(c) => matches!(c.try_wait(), Ok(None)),
            None => false,
        }
    }

    /// A new pool (max 8 connections) on [`url`](Self::url). Pools survive restarts: sqlx
    /// replaces the broken connections on the next acquire.
    pub async fn new_pool(&self) -> PgPool {
        super::pg_common::connect_pool(&self.url()).await
    }

    /// Fast shutdown (SIGINT: clients are disconnected, a shutdown checkpoint is written)
    /// and waits for the postmaster to exit; kills it after 60 s. No-op when not running.
    pub async fn stop(&self) {
        let Some(pid) = self.pid() else { return };
        if self.is_running() {
            send_signal(&[pid], "INT");
            let deadline = Instant::now() + STOP_TIMEOUT;
            while self.is_running() {
                if Instant::now() > deadline {
                    eprintln!("[private-pg] fast shutdown took over {STOP_TIMEOUT:?}, killing");
                    break;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
        self.kill_now();
    }

    /// SIGKILL to the postmaster and all its descendants, like a crash of the whole
    /// server: returns once they are all gone. The next start runs crash recovery.
    /// No-op when not running.
    pub async fn kill(&self) {
        self.kill_now();
    }

    /// Starts the stopped or killed server again, on the same port and data directory (so
    /// clients reconnect to the same URL), and waits until it accepts connections. Retries
    /// for a while if the port is still taken. No-op when it is running.
    pub async fn start_again(&self) {
        if self.is_running() {
            return;
        }
        // Whatever exited left no process behind (`kill_now` reaps and kills); a stale
        // lock file could still name a pid that is alive again (or a zombie).
        self.kill_now();
        let deadline = Instant::now() + PORT_RETRY_WINDOW;
        let mut delay = Duration::from_millis(50);
        loop {
            match self.spawn_and_wait().await {
                Ok(()) => return,
                Err(StartError::PortInUse(e)) if Instant::now() < deadline => {
                    eprintln!(
                        "[private-pg] port {} still taken, retrying: {e}",
                        self.port()
                    );
                    tokio::time::sleep(delay).await;
                    delay = (delay * 2).min(Duration::from_millis(500));
                }
                Err(e) => self.fail(&format!("did not come back on port {}", self.port()), e),
            }
        }
    }

    /// [`stop`](Self::stop), then [`start_again`](Self::start_again).
    pub async fn restart(&self) {
        self.stop().await;
        self.start_again().await;
    }

    /// Kills whatever runs, then panics with `what`, the error and the log tail.
    fn fail(&self, what: &str, e: StartError) -> ! {
        self.kill_now();
        panic!(
            "private PostgreSQL {what}: {e}\n--- log tail ({}) ---\n{}",
            self.log_path().display(),
            self.log_tail(4000)
        );
    }

    async fn initdb(&self) {
        let exe = self.bindir.join("initdb");
        let log_path = self.dir.path().join("initdb.log");
        let log = std::fs::File::create(&log_path).expect("creating initdb.log");
        let log_err = log.try_clone().expect("initdb.log");
        let mut cmd: tokio::process::Command = self.command(&exe, false).into();
        cmd.arg("-D")
            .arg(self.data_dir())
            .args([
                "-U",
                "postgres",
                "--auth=trust",
                "-E",
                "UTF8",
                "--locale=C",
                "--no-sync",
                "--no-instructions",
            ])
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(log_err)
            .kill_on_drop(true);
        let status = tokio::time::timeout(Duration::from_secs(120), cmd.status()).await;
        let ok = matches!(status, Ok(Ok(s)) if s.success());
        if !ok {
            let out = std::fs::read_to_string(&log_path).unwrap_or_default();
            panic!(
                "{} -D {} failed ({status:?}){}:\n{out}",
                exe.display(),
                self.data_dir().display(),
                match &self.run_as {
                    Some(u) => format!(" as {}", u.name),
                    None => String::new(),
                }
            );
        }
    }

    /// `exe` through `setpriv` when available: as [`RunAs`] when root, with
    /// `--pdeathsig KILL` when `pdeathsig`. Runs in the temporary directory, in the C
    /// locale, without the caller's `PG*` variables.
    fn command(&self, exe: &Path, pdeathsig: bool) -> Command {
        let mut cmd = match (setpriv(), &self.run_as) {
            (None, Some(_)) => unreachable!("checked in start()"),
            (None, None) => Command::new(exe),
            (Some(setpriv), run_as) => {
                let mut c = Command::new(setpriv);
                if let Some(u) = run_as {
                    c.arg(format!("--reuid={}", u.uid))
                        .arg(format!("--regid={}", u.gid))
                        .arg("--clear-groups");
                }
                if pdeathsig {
                    c.args(["--pdeathsig", "KILL"]);
                }
                c.arg("--").arg(exe);
                c
            }
        };
        for (key, _) in std::env::vars_os() {
            if key.to_string_lossy().starts_with("PG") {
                cmd.env_remove(key);
            }
        }
        cmd.current_dir(self.dir.path())
            .env("HOME", self.dir.path())
            .env("LC_ALL", "C")
            .env("LANG", "C");
        cmd
    }

    fn server_args(&self) -> Vec<String> {
        let dir = self.dir.path().display().to_string();
        // A unix socket path must fit in 108 bytes ("/.s.PGSQL.<port>" included).
        let sockets = if dir.len() <= 80 { dir } else { String::new() };
        let mut args = vec![
            "-D".to_string(),
            self.data_dir().display().to_string(),
            "-p".to_string(),
            self.port().to_string(),
        ];
        for setting in [
            format!("listen_addresses={HOST}"),
            format!("unix_socket_directories={sockets}"),
            "fsync=off".to_string(),
            "full_page_writes=off".to_string(),
            "synchronous_commit=on".to_string(),
            "shared_buffers=16MB".to_string(),
            "max_connections=100".to_string(),
            "dynamic_shared_memory_type=mmap".to_string(),
            "logging_collector=off".to_string(),
        ] {
            args.push("-c".to_string());
            args.push(setting);
        }
        args
    }

    async fn spawn_and_wait(&self) -> Result<(), StartError> {
        let exe = self.bindir.join("postgres");
        let log_path = self.log_path();
        let mut log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)
            .map_err(|e| StartError::Other(format!("opening the log: {e}")))?;
        let args = self.server_args();
        let _ = writeln!(log, "=== {} {}", exe.display(), args.join(" "));
        let log_start = log.metadata().map(|m| m.len()).unwrap_or(0);
        let log_err = log
            .try_clone()
            .map_err(|e| StartError::Other(format!("log: {e}")))?;
        let mut cmd = self.command(&exe, true);
        cmd.args(&args)
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(log_err)
            .process_group(0);
        let child = super::spawn::from_long_lived_thread(cmd)
            .map_err(|e| StartError::Other(format!("spawning {}: {e}", exe.display())))?;
        *self.child.lock().unwrap() = Some(child);

        let r = self.wait_until_ready().await;
        if let Err(e) = &r {
            self.kill_now();
            let bytes = std::fs::read(&log_path).unwrap_or_default();
            let since = String::from_utf8_lossy(&bytes[(log_start as usize).min(bytes.len())..])
                .into_owned();
            if since.contains("could not bind")
                || since.contains("Address already in use")
                || since.contains("could not create any TCP/IP sockets")
            {
                return Err(StartError::PortInUse(e.to_string()));
            }
        }
        r
    }

    /// Polls a connection to the maintenance database until one succeeds, the postmaster
    /// exits or 60 s (`$RESHARD_TEST_PG_START_TIMEOUT_SECS`) pass.
    async fn wait_until_ready(&self) -> Result<(), StartError> {
        let timeout = std::env::var("RESHARD_TEST_PG_START_TIMEOUT_SECS")
            .ok()
            .and_then(|v| v.parse::<u64>().ok())
            .map(Duration::from_secs)
            .unwrap_or(Duration::from_secs(60));
        let options = PgConnectOptions::from_str(&self.admin_url())
            .expect("admin URL")
            .disable_statement_logging();
        let deadline = Instant::now() + timeout;
        let mut last = String::from("never tried");
        loop {
            {
                let mut guard = self.child.lock().unwrap();
                match guard.as_mut().map(|c| c.try_wait()) {
                    Some(Ok(None)) => {}
                    Some(Ok(Some(status))) => {
                        return Err(StartError::Other(format!("postgres exited: {status}")))
                    }
                    Some(Err(e)) => return Err(StartError::Other(format!("try_wait: {e}"))),
                    None => return Err(StartError::Other("postgres was killed".into())),
                }
            }
            if Instant::now() > deadline {
                return Err(StartError::Other(format!(
                    "no connection within {timeout:?}: {last}"
                )));
            }
            match tokio::time::timeout(Duration::from_secs(5), PgConnection::connect_with(&options))
                .await
            {
                Ok(Ok(conn)) => {
                    let _ = conn.close().await;
                    return Ok(());
                }
                Ok(Err(e)) => last = e.to_string(),
                Err(_) => last = "connect timed out".to_string(),
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    }

    /// SIGKILL to the postmaster and its descendants (the postmaster stopped first so it
    /// forks no new child meanwhile), waits until they are gone, and removes what a
    /// killed cluster leaves: the lock files and the System V interlock segment.
    fn kill_now(&self) {
        let child = match self.child.lock() {
            Ok(mut g) => g.take(),
            Err(poisoned) => poisoned.into_inner().take(),
        };
        let Some(mut child) = child else { return };
        let pid = child.id();
        if matches!(child.try_wait(), Ok(None)) {
            send_signal(&[pid], "STOP");
            let deadline = Instant::now() + Duration::from_millis(200);
            while !matches!(proc_stat(pid), Some(('T', _))) && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(1));
            }
            let shm = self.shm_segment(pid);
            let mut victims = vec![pid];
            victims.extend(descendants(pid));
            send_signal(&victims, "KILL");
            let _ = child.kill();
            let _ = child.wait();
            wait_gone(&victims[1..], Duration::from_secs(10));
            if let Some((key, shmid)) = shm {
                remove_shm_segment(key, shmid);
            }
        } else {
            let _ = child.wait();
        }
        let _ = std::fs::remove_file(self.data_dir().join("postmaster.pid"));
        let sock = format!(".s.PGSQL.{}", self.port());
        let _ = std::fs::remove_file(self.dir.path().join(format!("{sock}.lock")));
        let _ = std::fs::remove_file(self.dir.path().join(sock));
    }

    /// `(key, shmid)` of the System V segment from `postmaster.pid` (line 7), if the file
    /// belongs to `pid`.
    fn shm_segment(&self, pid: u32) -> Option<(i64, i64)> {
        let text = std::fs::read_to_string(self.data_dir().join("postmaster.pid")).ok()?;
        let lines: Vec<&str> = text.lines().collect();
        if lines.first()?.trim() != pid.to_string() {
            return None;
        }
        let mut fields = lines.get(6)?.split_whitespace();
        let key = fields.next()?.parse().ok()?;
        let shmid = fields.next()?.parse().ok()?;
        Some((key, shmid))
    }
}

impl Drop for PrivatePg {
    fn drop(&mut self) {
        self.kill_now();
        // `dir` (data, logs, socket) is removed by TempDir's Drop.
    }
}

impl std::fmt::Debug for PrivatePg {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PrivatePg")
            .field("url", &self.url())
            .field("dir", &self.dir.path())
            .finish()
    }
}

#[derive(Debug)]
enum StartError {
    PortInUse(String),
    Other(String),
}

impl std::fmt::Display for StartError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StartError::PortInUse(e) => write!(f, "port in use: {e}"),
            StartError::Other(e) => f.write_str(e),
        }
    }
}

/// The directory holding `postgres` and `initdb` (see the module docs).
fn server_bindir() -> PathBuf {
    static BINDIR: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    let found = BINDIR.get_or_init(|| {
        let has_server = |d: &Path| d.join("postgres").is_file() && d.join("initdb").is_file();
        if let Some(d) = std::env::var_os("RESHARD_TEST_PG_BINDIR").filter(|d| !d.is_empty()) {
            let d = PathBuf::from(d);
            return if has_server(&d) {
                Ok(d)
            } else {
                Err(format!(
                    "RESHARD_TEST_PG_BINDIR={} has no postgres and initdb",
                    d.display()
                ))
            };
        }
        let from_pg_config = Command::new("pg_config")
            .arg("--bindir")
            .stderr(Stdio::null())
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| PathBuf::from(String::from_utf8_lossy(&o.stdout).trim()));
        if let Some(d) = from_pg_config.filter(|d| has_server(d)) {
            return Ok(d);
        }
        let newest = std::fs::read_dir("/usr/lib/postgresql")
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| {
                let major = e.file_name().to_string_lossy().parse::<f64>().ok()?;
                let bin = e.path().join("bin");
                has_server(&bin).then_some((major, bin))
            })
            .max_by(|a, b| a.0.total_cmp(&b.0));
        if let Some((_, d)) = newest {
            return Ok(d);
        }
        let on_path = std::env::var_os("PATH").and_then(|path| {
            std::env::split_paths(&path)
                .map(|d| d.join("postgres"))
                .find(|p| p.is_file())
                .and_then(|p| std::fs::canonicalize(p).ok())
                .and_then(|p| p.parent().map(Path::to_path_buf))
                .filter(|d| has_server(d))
        });
        on_path.ok_or_else(|| {
            "no PostgreSQL server binaries (postgres, initdb) found: tried \
             $RESHARD_TEST_PG_BINDIR, `pg_config --bindir`, /usr/lib/postgresql/*/bin and $PATH"
                .to_string()
        })
    });
    match found {
        Ok(d) => d.clone(),
        Err(e) => panic!("{e}"),
    }
}

/// When this process runs as root: the user to run PostgreSQL as (`postgres`, else
/// `nobody`). `None` otherwise.
fn run_as() -> Option<RunAs> {
    let euid = std::fs::metadata("/proc/self").map(|m| m.uid()).ok()?;
    if euid != 0 {
        return None;
    }
    for name in ["postgres", "nobody"] {
        let Ok(out) = Command::new("getent").args(["passwd", name]).output() else {
            continue;
        };
        let line = String::from_utf8_lossy(&out.stdout).into_owned();
        let fields: Vec<&str> = line.trim().split(':').collect();
        if let (Some(uid), Some(gid)) = (fields.get(2), fields.get(3)) {
            if let (Ok(uid), Ok(gid)) = (uid.parse::<u32>(), gid.parse::<u32>()) {
                if uid != 0 {
                    return Some(RunAs {
                        name: name.to_string(),
                        uid,
                        gid,
                    });
                }
            }
        }
    }
    panic!("the tests run as root, PostgreSQL refuses to, and there is no `postgres` or `nobody` user to run it as");
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

/// `kill -s <sig> <pids>`; errors (processes already gone) are ignored.
fn send_signal(pids: &[u32], sig: &str) {
    if pids.is_empty() {
        return;
    }
    let _ = Command::new("kill")
        .args(["-s", sig, "--"])
        .args(pids.iter().map(u32::to_string))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
}

/// `(state, ppid)` from `/proc/<pid>/stat`.
fn proc_stat(pid: u32) -> Option<(char, u32)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // "pid (comm) state ppid ...": comm may hold spaces and parentheses.
    let rest = &stat[stat.rfind(')')? + 1..];
    let mut fields = rest.split_whitespace();
    let state = fields.next()?.chars().next()?;
    let ppid = fields.next()?.parse().ok()?;
    Some((state, ppid))
}

/// All live descendants of `pid` (PostgreSQL's children are session leaders of their own,
/// so a process-group signal would miss them).
fn descendants(pid: u32) -> Vec<u32> {
    let mut children: HashMap<u32, Vec<u32>> = HashMap::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Some(p) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<u32>().ok())
        else {
            continue;
        };
        if let Some((state, ppid)) = proc_stat(p) {
            if state != 'Z' && state != 'X' {
                children.entry(ppid).or_default().push(p);
            }
        }
    }
    let mut out = Vec::new();
    let mut seen = HashSet::from([pid]);
    let mut todo = vec![pid];
    while let Some(p) = todo.pop() {
        for &c in children.get(&p).map(Vec::as_slice).unwrap_or_default() {
            if seen.insert(c) {
                out.push(c);
                todo.push(c);
            }
        }
    }
    out
}

/// Waits until every pid is gone or a zombie (PID 1 may reap reparented children late).
fn wait_gone(pids: &[u32], timeout: Duration) {
    let deadline = Instant::now() + timeout;
    loop {
        let alive: Vec<u32> = pids
            .iter()
            .copied()
            .filter(|&p| matches!(proc_stat(p), Some((s, _)) if s != 'Z' && s != 'X'))
            .collect();
        if alive.is_empty() {
            return;
        }
        if Instant::now() > deadline {
            eprintln!("[private-pg] processes {alive:?} still alive after SIGKILL");
            return;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Removes the System V segment `shmid` if it still carries `key` and nobody is attached
/// (`/proc/sysvipc/shm`: key shmid perms size cpid lpid nattch ...).
fn remove_shm_segment(key: i64, shmid: i64) {
    let Ok(table) = std::fs::read_to_string("/proc/sysvipc/shm") else {
        return;
    };
    let ours = table.lines().skip(1).any(|line| {
        let f: Vec<&str> = line.split_whitespace().collect();
        f.len() > 6
            && f[0].parse::<i64>().ok() == Some(key)
            && f[1].parse::<i64>().ok() == Some(shmid)
            && f[6] == "0"
    });
    if ours {
        let _ = Command::new("ipcrm")
            .args(["-m", &shmid.to_string()])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}

/// A port of 127.0.0.1 that was free a moment ago and was not handed out before in this
/// process, below the kernel's ephemeral range when possible, so that no outgoing
/// connection takes it while the server is down between a kill and a restart.
fn free_port() -> u16 {
    static USED: Mutex<Option<HashSet<u16>>> = Mutex::new(None);
    let mut used = USED.lock().unwrap();
    let used = used.get_or_insert_with(HashSet::new);
    let ephemeral_low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse::<u16>().ok())
        .unwrap_or(32768);
    const LOW: u16 = 20000;
    if ephemeral_low > LOW + 1000 {
        for _ in 0..200 {
            let port = rand::thread_rng().gen_range(LOW..ephemeral_low);
            if !used.contains(&port) && std::net::TcpListener::bind((HOST, port)).is_ok() {
                used.insert(port);
                return port;
            }
        }
    }
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

//! The fault campaign (issue 13, item 3): seeded runs of a whole migration through `reshard
//! run`, with the example application writing through the router throughout and a seeded mix
//! of faults, forward to `completed` or rolled back from a target-writing phase. Each run then
//! checks, from the application's ledgers and a full scan of every location, that nothing was
//! lost or resurrected and that everything sits where the final layout places it.
//!
//! Faults (every run schedules each kind at least once, at a seeded milestone, plus a few
//! more): a `reshard worker` SIGKILLed (restarted a second later), `reshard run` SIGKILLed (run
//! again at once), a shard server SIGSTOPped for a few seconds, `failCommand` overload (489,
//! `SystemOverloadedError` + `RetryableError`) on inserts and deletes, dropped connections
//! (`closeConnection`), the state store (a `PrivatePg`) SIGKILLed and restarted, and an
//! application instance (a router) SIGKILLed without deregistering, and a new one started;
//! every run also kills one in `dual_read`, just before the write switch, which waits it out;
//! and the `reshard front` SIGKILLed and started again on its port; a writer that bypasses the
//! router (a plain driver update of a seeded order in the source layout after the write
//! switch), which the watch must list and `bypass resolve --action recopy` must carry over; and
//! a fifth shard registered while workers run. In every run the workers, the routers and the
//! front start before the target's last shard is registered (the playbook registers it), and
//! the routers shadow 10 % of their reads, which must find no mismatch the bypass did not make.
//! Beside the embedded-router
//! applications, an order service that knows only its connection string
//! (`examples/orders_front.rs`) writes and reads through that front the whole run: forward or
//! rolled back, its reads must never be stale and its ledger must check like theirs.
//!
//! Schedules are decided by the seed and by milestones (a phase, and the share of the phase's
//! task partitions done), not wall time. `RESHARD_CAMPAIGN_SEED=N` makes run 0 use seed N (run
//! i uses N + i); the direction is the seed's parity (even: forward). `RESHARD_CAMPAIGN_RUNS=N`
//! runs N runs; default 2 (one each way), 5 with `RESHARD_HEAVY_TESTS=1`.
//! `RESHARD_CAMPAIGN_KEEP=1` keeps each run's directory (logs, ledgers, journals).

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use futures::TryStreamExt;
use mongodb::bson::{doc, Document};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use reshard::ledger;
use reshard::routing::{KeyValue, Location, RoutingVersion};
use reshard::spec::playbook::{parse_playbook, Source};
use serde_json::{json, Value};
use sqlx::postgres::PgPoolOptions;
use sqlx::PgPool;
use support::{heavy_tests_enabled, MongoServer, PrivatePg};
use tokio::process::{Child, Command};

// ---------------------------------------------------------------------------------------
// The schedule

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
enum Kind {
    WorkerKill,
    DriverKill,
    ShardPause,
    Overload,
    DropConnections,
    StoreKill,
    RouterKill,
    FrontKill,
    Bypass,
    ShardAdd,
}

const KINDS: [Kind; 10] = [
    Kind::WorkerKill,
    Kind::DriverKill,
    Kind::ShardPause,
    Kind::Overload,
    Kind::DropConnections,
    Kind::StoreKill,
    Kind::RouterKill,
    Kind::FrontKill,
    Kind::Bypass,
    Kind::ShardAdd,
];

impl Kind {
    fn short(self) -> &'static str {
        match self {
            Kind::WorkerKill => "worker-kill",
            Kind::DriverKill => "driver-kill",
            Kind::ShardPause => "shard-stop",
            Kind::Overload => "overload",
            Kind::DropConnections => "drop-conn",
            Kind::StoreKill => "store-kill",
            Kind::RouterKill => "router-kill",
            Kind::FrontKill => "front-kill",
            Kind::Bypass => "bypass",
            Kind::ShardAdd => "shard-add",
        }
    }
}

/// Phases in the order a run meets them.
const PHASES: [&str; 12] = [
    "planned",
    "dual_read",
    "write_switch",
    "new_writes",
    "backfill",
    "reconcile",
    "new_reads",
    "cleanup",
    "completed",
    "reverting",
    "revert_switch",
    "rolled_back",
];

fn rank(phase: &str) -> usize {
    PHASES.iter().position(|p| *p == phase).unwrap_or(0)
}

fn task_of(phase: &str) -> Option<&'static str> {
    match phase {
        "backfill" => Some("backfill"),
        "cleanup" => Some("cleanup"),
        "reverting" => Some("revert"),
        _ => None,
    }
}

/// A point of the migration: a phase reached, and in a task phase a share of its partitions
/// done.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Milestone {
    phase: &'static str,
    share: f64,
}

impl std::fmt::Display for Milestone {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if task_of(self.phase).is_some() {
            write!(f, "{}@{:.0}%", self.phase, self.share * 100.0)
        } else {
            write!(f, "{}", self.phase)
        }
    }
}

#[derive(Clone, Debug)]
struct Fault {
    kind: Kind,
    at: Milestone,
    /// Shard index (0..4) for shard faults, worker index for a worker kill.
    target: usize,
    /// Seconds a pause, an overload, dropped connections or a store outage last.
    secs: f64,
}

#[derive(Clone, Debug)]
struct Plan {
    seed: u64,
    /// `None`: forward to `completed`; else the phase the migration rolls back from.
    rollback_from: Option<&'static str>,
    faults: Vec<Fault>,
}

impl Plan {
    fn direction(&self) -> String {
        match self.rollback_from {
            None => "forward".into(),
            Some(p) => format!("rollback@{p}"),
        }
    }
}

fn plan(seed: u64) -> Plan {
    let mut rng = StdRng::seed_from_u64(seed);
    let rollback_from = if seed.is_multiple_of(2) {
        None
    } else {
        Some(["new_writes", "backfill", "reconcile", "new_reads"][rng.gen_range(0..4)])
    };
    // The phases this run passes through where a fault can be placed.
    let mut phases: Vec<&'static str> = vec!["dual_read", "new_writes"];
    match rollback_from {
        None => phases.extend(["backfill", "reconcile", "new_reads", "cleanup"]),
        Some(from) => {
            for p in ["backfill", "reconcile", "new_reads"] {
                if rank(p) <= rank(from) {
                    phases.push(p);
                }
            }
            phases.push("reverting");
        }
    }
    let tasks: Vec<&'static str> = phases
        .iter()
        .copied()
        .filter(|p| task_of(p).is_some())
        .collect();
    let mut kinds: Vec<Kind> = KINDS.to_vec();
    for _ in 0..rng.gen_range(0..=2) {
        kinds.push(KINDS[rng.gen_range(0..KINDS.len())]);
    }
    let mut faults = Vec::new();
    for kind in kinds {
        let choices: Vec<&'static str> = match kind {
            // Workers only matter while a task runs; a shard added while they run.
            Kind::WorkerKill | Kind::ShardAdd => tasks.clone(),
            // A write to the source layout is a bypass once writes have switched, and the
            // source still holds the seeded orders until cleanup.
            Kind::Bypass => phases
                .iter()
                .copied()
                .filter(|p| ["new_writes", "backfill", "reconcile"].contains(p))
                .collect(),
            // Not right before a switch that holds writes (dual_read -> write_switch).
            Kind::StoreKill => phases
                .iter()
                .copied()
                .filter(|p| *p != "dual_read")
                .collect(),
            _ => phases.clone(),
        };
        let phase = choices[rng.gen_range(0..choices.len())];
        let share = if task_of(phase).is_some() {
            rng.gen_range(0..=5) as f64 / 10.0
        } else {
            0.0
        };
        let secs = match kind {
            Kind::StoreKill => rng.gen_range(1.0..3.0),
            _ => rng.gen_range(2.0..4.0),
        };
        faults.push(Fault {
            kind,
            at: Milestone { phase, share },
            target: rng.gen_range(0..4),
            secs,
        });
    }
    // A router SIGKILLed just before the write switch, in every run (issue 29, item 2): the
    // playbook soaks in dual_read, so the kill lands before the switch, which must wait the
    // dead router out (its lease) with writes flowing rather than hold them and go back.
    faults.push(Fault {
        kind: Kind::RouterKill,
        at: Milestone {
            phase: "dual_read",
            share: 0.0,
        },
        target: 0,
        secs: 0.0,
    });
    faults.sort_by(|a, b| {
        (rank(a.at.phase), a.at.share)
            .partial_cmp(&(rank(b.at.phase), b.at.share))
            .unwrap()
    });
    Plan {
        seed,
        rollback_from,
        faults,
    }
}

fn steps(rollback_from: Option<&str>) -> String {
    let mut s = String::from(
        "  - advance: dual_read\n  \
         - soak: {duration: 3s, max_router_errors: 1000000, overload_for: 1h}\n  \
         - advance: {to: write_switch, switch_timeout: 10s}\n",
    );
    let reached = |p: &str| rollback_from.is_none_or(|from| rank(p) <= rank(from));
    if reached("backfill") {
        s.push_str("  - backfill: {workers: 0}\n");
    }
    if reached("reconcile") {
        s.push_str("  - reconcile: {sample: 50, repair: true}\n");
    }
    if reached("new_reads") {
        s.push_str("  - advance: new_reads\n");
    }
    match rollback_from {
        None => s.push_str("  - cleanup: {workers: 0}\n  - complete: {}\n"),
        // From new_writes the copy back has only the application's writes to carry: a soak
        // first (faults make router errors and overload: allowed) gives it enough for the
        // faults placed in it. (Slowing the copier instead is no use: below the application's
        // insert rate it never catches up with the target.)
        Some("new_writes") => s.push_str(
            "  - soak: {duration: 10s, max_router_errors: 1000000, overload_for: 1h}\n  \
             - rollback: {workers: 0}\n",
        ),
        Some(_) => s.push_str("  - rollback: {workers: 0}\n"),
    }
    s
}

// ---------------------------------------------------------------------------------------
// Processes

/// An example's binary (`cargo test` builds the examples beside the test binaries).
fn example(name: &str) -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let dir = exe.parent().unwrap().parent().unwrap();
    dir.join("examples").join(name)
}

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/campaign")
        .join(name)
}

fn signal(pid: u32, sig: &str) {
    signal_str(&pid.to_string(), sig)
}

/// `kill -SIG -- WHO` (a pid, or `-pgid` for a process group).
fn signal_str(who: &str, sig: &str) {
    let _ = std::process::Command::new("kill")
        .arg(format!("-{sig}"))
        .arg("--")
        .arg(who)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

/// What every process of a run shares: the state store URL and the shard URIs.
#[derive(Clone)]
struct Env {
    url: String,
    shard_uris: Vec<String>,
    dir: PathBuf,
}

impl Env {
    fn command(&self, program: &Path) -> Command {
        let mut cmd = Command::new(program);
        cmd.env("RESHARD_DATABASE_URL", &self.url)
            .env("RESHARD_LOG", "info")
            .current_dir(&self.dir)
            .stdin(Stdio::null())
            .kill_on_drop(true);
        for (n, uri) in self.shard_uris.iter().enumerate() {
            cmd.env(format!("RESHARD_S{}_URI", n + 1), uri);
        }
        cmd
    }

    fn reshard(&self) -> Command {
        self.command(Path::new(env!("CARGO_BIN_EXE_reshard")))
    }

    fn log(&self, name: &str) -> std::fs::File {
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join(name))
            .unwrap()
    }

    /// Runs `reshard ARGS` to its end.
    async fn reshard_out(&self, args: &[&str]) -> std::process::Output {
        self.reshard().args(args).output().await.unwrap()
    }

    async fn reshard_ok(&self, args: &[&str]) -> String {
        let out = self.reshard_out(args).await;
        assert!(
            out.status.success(),
            "reshard {args:?}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
}

/// One instance of the example application.
struct App {
    prefix: String,
    child: Child,
    ledger: PathBuf,
    journal: PathBuf,
    killed: bool,
}

const ROUTER_LEASE_SECS: u64 = 10;

fn start_app(env: &Env, prefix: &str, seed: u64) -> App {
    let ledger = env.dir.join(format!("ledger-{prefix}.jsonl"));
    let journal = env.dir.join(format!("journal-{prefix}.jsonl"));
    let child = env
        .command(&example("orders_app"))
        .env("RESHARD_LOG", "warn")
        .args(["--duration", "100000s", "--rate", "60", "--workers", "3"])
        .args(["--list-percent", "2", "--hot-share", "0.3"])
        .args(["--router-lease", &format!("{ROUTER_LEASE_SECS}s")])
        .args(["--id-prefix", prefix, "--seed", &seed.to_string()])
        .arg("--ledger")
        .arg(&ledger)
        .arg("--journal")
        .arg(&journal)
        .stdout(Stdio::piped())
        .stderr(env.log(&format!("app-{prefix}.log")))
        .spawn()
        .unwrap();
    App {
        prefix: prefix.to_owned(),
        child,
        ledger,
        journal,
        killed: false,
    }
}

/// Keeps `slots` processes running, each restarted a second after it ends (SIGKILLed by a
/// fault, or gave up while the state store was down). `spawn(slot, start)` makes the command
/// of one start; `start` counts every start, first ones included.
struct Supervised {
    pids: Arc<Mutex<Vec<Option<u32>>>>,
    stop: Arc<AtomicBool>,
    starts: Arc<AtomicU32>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Supervised {
    fn start<F>(slots: usize, spawn: F) -> Supervised
    where
        F: Fn(usize, u32) -> Command + Send + Sync + 'static,
    {
        let spawn = Arc::new(spawn);
        let pids = Arc::new(Mutex::new(vec![None; slots]));
        let stop = Arc::new(AtomicBool::new(false));
        let starts = Arc::new(AtomicU32::new(0));
        let tasks = (0..slots)
            .map(|slot| {
                let (spawn, pids, stop, starts) =
                    (spawn.clone(), pids.clone(), stop.clone(), starts.clone());
                tokio::spawn(async move {
                    while !stop.load(Ordering::SeqCst) {
                        let n = starts.fetch_add(1, Ordering::SeqCst);
                        let mut child = spawn(slot, n).spawn().unwrap();
                        pids.lock().unwrap()[slot] = child.id();
                        let _ = child.wait().await;
                        pids.lock().unwrap()[slot] = None;
                        tokio::time::sleep(Duration::from_secs(1)).await;
                    }
                })
            })
            .collect();
        Supervised {
            pids,
            stop,
            starts,
            tasks,
        }
    }

    /// SIGKILLs the process of `slot` (modulo the slots); false when none is running there.
    fn kill(&self, slot: usize) -> bool {
        let pid = {
            let pids = self.pids.lock().unwrap();
            pids[slot % pids.len()]
        };
        match pid {
            Some(pid) => {
                signal(pid, "KILL");
                true
            }
            None => false,
        }
    }

    /// Starts after the first one of each slot.
    fn restarts(&self) -> u32 {
        let slots = self.pids.lock().unwrap().len() as u32;
        self.starts.load(Ordering::SeqCst).saturating_sub(slots)
    }

    async fn stop(self) {
        self.stop.store(true, Ordering::SeqCst);
        let pids: Vec<u32> = self
            .pids
            .lock()
            .unwrap()
            .iter()
            .flatten()
            .copied()
            .collect();
        for pid in pids {
            signal(pid, "TERM");
        }
        for t in self.tasks {
            let _ = tokio::time::timeout(Duration::from_secs(30), t).await;
        }
    }
}

/// Keeps `reshard worker` processes running, one per slot.
fn start_workers(env: &Env, slots: usize) -> Supervised {
    let env = env.clone();
    Supervised::start(slots, move |slot, _| {
        let mut cmd = env.reshard();
        cmd.args(["worker", "--concurrency", "2", "--lease-ttl", "5s"])
            .args(["--name", &format!("campaign-w{slot}")])
            .stdout(env.log(&format!("worker-{slot}.log")))
            .stderr(env.log(&format!("worker-{slot}.log")));
        cmd
    })
}

/// Keeps one `reshard front` process serving on a fixed port: the application behind it keeps
/// its connection string across restarts, as it would behind a load balancer.
struct Fronts {
    port: u16,
    process: Supervised,
}

impl Fronts {
    fn start(env: &Env) -> Fronts {
        let port = {
            let probe = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            probe.local_addr().unwrap().port()
        };
        let env = env.clone();
        let process = Supervised::start(1, move |_, n| {
            let mut cmd = env.reshard();
            cmd.args(["front", "--listen", &format!("127.0.0.1:{port}")])
                .args([
                    "--database",
                    "shop",
                    "--name",
                    &format!("campaign-front-{n}"),
                ])
                .args(["--lease-ttl", &format!("{ROUTER_LEASE_SECS}s")])
                .stdout(env.log("front.log"))
                .stderr(env.log("front.log"));
            cmd
        });
        Fronts { port, process }
    }

    fn uri(&self) -> String {
        format!(
            "mongodb://127.0.0.1:{}/?serverSelectionTimeoutMS=20000",
            self.port
        )
    }

    fn kill(&self) -> bool {
        self.process.kill(0)
    }

    fn starts(&self) -> u32 {
        self.process.starts.load(Ordering::SeqCst)
    }

    /// Stops the front after the application behind it has stopped.
    async fn stop(self) {
        self.process.stop().await
    }
}

/// The order service that does not know reshard exists (`examples/orders_front.rs`, the
/// official driver only), writing through the front: its ledger is checked like the other
/// applications'. It is never killed itself (its outcome-unknown writes are re-read, not
/// journaled), only the front under it.
fn start_front_app(env: &Env, fronts: &Fronts, seed: u64) -> App {
    let prefix = "f";
    let ledger = env.dir.join(format!("ledger-{prefix}.jsonl"));
    let child = env
        .command(&example("orders_front"))
        .args(["--uri", &fronts.uri()])
        .args(["--duration", "100000s", "--rate", "15", "--workers", "2"])
        .args(["--list-percent", "2", "--hot-share", "0.3"])
        .args(["--id-prefix", prefix, "--seed", &seed.to_string()])
        .arg("--ledger")
        .arg(&ledger)
        .stdout(Stdio::piped())
        .stderr(env.log(&format!("app-{prefix}.log")))
        .spawn()
        .unwrap();
    App {
        prefix: prefix.to_owned(),
        child,
        ledger,
        // It keeps no journal: nothing is read from this path.
        journal: env.dir.join("no-journal"),
        killed: false,
    }
}

/// What the driver loop saw.
#[derive(Default, Debug)]
struct DriverLog {
    runs: u32,
    killed: u32,
    /// Non-zero exits that were not our kills: (exit code, last line of stderr).
    failures: Vec<(Option<i32>, String)>,
    end: Option<Value>,
}

/// Runs `reshard run` until the playbook ends, running it again after every kill or failure
/// (failures are expected while the state store is down); gives up after `limit`.
async fn drive(
    env: Env,
    playbook: PathBuf,
    pid: Arc<Mutex<Option<u32>>>,
    kill_requested: Arc<AtomicBool>,
    limit: Duration,
) -> DriverLog {
    let started = Instant::now();
    let mut log = DriverLog::default();
    loop {
        if started.elapsed() > limit {
            log.failures
                .push((None, format!("gave up: not done after {limit:?}")));
            return log;
        }
        log.runs += 1;
        let stderr_path = env.dir.join(format!("run-{}.log", log.runs));
        let child = env
            .reshard()
            .args(["--output", "json", "run"])
            .arg(&playbook)
            .args(["--workers", "0"])
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&stderr_path).unwrap())
            .spawn()
            .unwrap();
        *pid.lock().unwrap() = child.id();
        let mut child = child;
        let mut stdout = child.stdout.take().unwrap();
        let reader = tokio::spawn(async move {
            use tokio::io::AsyncReadExt;
            let mut buf = Vec::new();
            let _ = stdout.read_to_end(&mut buf).await;
            buf
        });
        let left = limit.saturating_sub(started.elapsed());
        let status = match tokio::time::timeout(left, child.wait()).await {
            Ok(status) => status.unwrap(),
            Err(_) => {
                // A run that does not end by the limit: a hang.
                let _ = child.kill().await;
                *pid.lock().unwrap() = None;
                let stderr = std::fs::read_to_string(&stderr_path).unwrap_or_default();
                let tail: Vec<&str> = stderr.lines().rev().take(5).collect();
                log.failures.push((
                    None,
                    format!(
                        "reshard run #{} hung past {limit:?}; its last lines: {tail:?}",
                        log.runs
                    ),
                ));
                return log;
            }
        };
        *pid.lock().unwrap() = None;
        let out = std::process::Output {
            status,
            stdout: reader.await.unwrap_or_default(),
            stderr: Vec::new(),
        };
        let stderr = std::fs::read_to_string(&stderr_path).unwrap_or_default();
        if kill_requested.swap(false, Ordering::SeqCst) && !out.status.success() {
            log.killed += 1;
            continue;
        }
        if out.status.success() {
            let end: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
            match end["end"].as_str() {
                Some("done") => {
                    log.end = Some(end);
                    return log;
                }
                _ => {
                    log.failures
                        .push((Some(0), format!("unexpected end: {end}")));
                }
            }
        } else {
            let last = stderr
                .lines()
                .rev()
                .find(|l| !l.trim().is_empty())
                .unwrap_or("")
                .to_owned();
            log.failures.push((out.status.code(), last));
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

// ---------------------------------------------------------------------------------------
// One run

#[derive(Debug)]
struct Outcome {
    seed: u64,
    direction: String,
    fired: Vec<String>,
    skipped: Vec<String>,
    problems: Vec<String>,
    notes: Vec<String>,
    seconds: f64,
}

struct Shared {
    pg: Arc<PrivatePg>,
    servers: Vec<Arc<MongoServer>>,
    monitor: PgPool,
}

/// The migration's phase and, in a task phase, the share of its partitions done.
async fn where_now(pool: &PgPool) -> Option<(String, f64)> {
    let row: Option<(i64, String)> = sqlx::query_as(
        "SELECT m.id, m.phase FROM migrations m JOIN playbooks p ON p.migration_id = m.id
         WHERE p.name = 'campaign'",
    )
    .fetch_optional(pool)
    .await
    .ok()?;
    let (id, phase) = row?;
    let share = match task_of(&phase) {
        Some(task) => {
            let (done, all): (i64, i64) = sqlx::query_as(
                "SELECT count(*) FILTER (WHERE state = 'done'), count(*) FROM partitions
                 WHERE migration_id = $1 AND task = $2",
            )
            .bind(id)
            .bind(task)
            .fetch_one(pool)
            .await
            .ok()?;
            if all == 0 {
                0.0
            } else {
                done as f64 / all as f64
            }
        }
        None => 0.0,
    };
    Some((phase, share))
}

async fn repeat_failpoint(server: &MongoServer, spec: Value, secs: f64) {
    let until = Instant::now() + Duration::from_secs_f64(secs);
    while Instant::now() < until {
        let mut cmd = doc! { "configureFailPoint": "failCommand" };
        cmd.extend(support::json_to_doc(spec.clone()));
        let _ = server.admin_command(cmd).await;
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let _ = server
        .admin_command(doc! { "configureFailPoint": "failCommand", "mode": "off" })
        .await;
}

async fn run_one(seed: u64, seed_orders: usize, rate: u32) -> Outcome {
    let started = Instant::now();
    let plan = plan(seed);
    eprintln!(
        "campaign: run seed {}: {} with {}",
        plan.seed,
        plan.direction(),
        plan.faults
            .iter()
            .map(|f| format!("{}@{}", f.kind.short(), f.at))
            .collect::<Vec<_>>()
            .join(", ")
    );
    let dir = tempfile::Builder::new()
        .prefix(&format!("reshard-campaign-{seed}-"))
        .tempdir()
        .unwrap();
    let pg = Arc::new(PrivatePg::start().await);
    let mut servers = Vec::new();
    for n in 1..=4 {
        servers.push(Arc::new(
            MongoServer::builder()
                .name(format!("s{n}"))
                .test_commands(true)
                .start()
                .await,
        ));
    }
    let env = Env {
        url: pg.url(),
        shard_uris: servers.iter().map(|s| s.uri()).collect(),
        dir: dir.path().to_owned(),
    };
    let monitor = PgPoolOptions::new()
        .max_connections(2)
        .acquire_timeout(Duration::from_secs(2))
        .connect_lazy(&env.url)
        .unwrap();
    let shared = Shared {
        pg: pg.clone(),
        servers,
        monitor,
    };

    // The collection as it is before reshard: shards, version 1, seeded orders. Only the
    // shards version 1 and the first target need are registered: the playbook registers s4,
    // after the workers, the application and the front started (they learn it from the store).
    env.reshard_ok(&["db", "migrate"]).await;
    for n in 1..=3 {
        env.reshard_ok(&[
            "shard",
            "add",
            &format!("s{n}"),
            "--uri",
            &format!("${{RESHARD_S{n}_URI}}"),
            "--database",
            &format!("shop_s{n}"),
        ])
        .await;
    }
    env.reshard_ok(&[
        "version",
        "create",
        "--collection",
        "orders",
        "--file",
        fixture("v1.yaml").to_str().unwrap(),
    ])
    .await;
    let template = std::fs::read_to_string(fixture("playbook.yaml")).unwrap();
    let text = template
        .replace("${RATE}", &rate.to_string())
        .replace("${BATCH}", "20")
        .replace("${PARTITION}", &(seed_orders / 5).max(20).to_string())
        + &steps(plan.rollback_from);
    let playbook_path = dir.path().join("campaign.yaml");
    std::fs::write(&playbook_path, &text).unwrap();
    let pb = parse_playbook("campaign.yaml", &text).unwrap_or_else(|e| panic!("{e:?}"));
    let source = match &pb.source {
        Source::Spec(v) => v.clone(),
        Source::Version(_) => unreachable!(),
    };
    let target = pb.target.clone();
    let mut seeded = seed_source(&shared, &source, seed_orders, seed).await;

    // The application, then the playbook, its workers and the faults.
    let mut apps = vec![start_app(&env, "a", seed)];
    let fronts = Fronts::start(&env);
    let front_app = start_front_app(&env, &fronts, seed ^ 0xf);
    tokio::time::sleep(Duration::from_secs(2)).await;
    let workers = start_workers(&env, 2);
    let driver_pid = Arc::new(Mutex::new(None));
    let kill_requested = Arc::new(AtomicBool::new(false));
    let driver = tokio::spawn(drive(
        env.clone(),
        playbook_path.clone(),
        driver_pid.clone(),
        kill_requested.clone(),
        // A router or front killed while reverting plans the copy back again once its lease
        // lapsed (every revert partition starts over): a rolled-back run can copy back twice.
        Duration::from_secs(if heavy_tests_enabled() { 480 } else { 360 }),
    ));
    let mut fired = Vec::new();
    let mut notes = Vec::new();
    let mut outages: Vec<(u64, u64)> = Vec::new();
    let mut fault_problems = Vec::new();
    let mut bypassed = Vec::new();
    let mut added_shards: Vec<MongoServer> = Vec::new();
    let mut pending = plan.faults.clone().into_iter().peekable();
    while !driver.is_finished() {
        let Some(next) = pending.peek().cloned() else {
            break;
        };
        let Some((phase, share)) = where_now(&shared.monitor).await else {
            tokio::time::sleep(Duration::from_millis(200)).await;
            continue;
        };
        let reached = rank(&phase) > rank(next.at.phase)
            || (rank(&phase) == rank(next.at.phase) && share >= next.at.share);
        // A store outage is kept out of the switches that hold writes.
        let held = matches!(
            phase.as_str(),
            "dual_read" | "write_switch" | "revert_switch"
        );
        if !reached || (next.kind == Kind::StoreKill && held) {
            tokio::time::sleep(Duration::from_millis(200)).await;
            continue;
        }
        pending.next();
        let at = format!("{}@{phase}:{:.0}%", next.kind.short(), share * 100.0);
        eprintln!("campaign: seed {seed}: {at}");
        let server = &shared.servers[next.target % 4];
        match next.kind {
            Kind::WorkerKill => {
                if !workers.kill(next.target) && !workers.kill(next.target + 1) {
                    notes.push(format!("{at}: no worker was running"));
                }
            }
            Kind::DriverKill => {
                let pid = *driver_pid.lock().unwrap();
                match pid {
                    Some(pid) => {
                        kill_requested.store(true, Ordering::SeqCst);
                        signal(pid, "KILL");
                    }
                    None => notes.push(format!("{at}: no driver was running")),
                }
            }
            Kind::ShardPause => match server.pid() {
                // The server leads its process group.
                Some(pid) => {
                    let group = format!("-{pid}");
                    signal_str(&group, "STOP");
                    tokio::time::sleep(Duration::from_secs_f64(next.secs)).await;
                    signal_str(&group, "CONT");
                }
                // A container's process is not ours to stop (`--features containers`).
                None => notes.push(format!("{at}: the shard is a container; not paused")),
            },
            Kind::Overload => {
                repeat_failpoint(
                    server,
                    json!({"mode": {"times": 1}, "data": {
                        "failCommands": ["insert", "delete"], "errorCode": 489,
                        "errorLabels": ["SystemOverloadedError", "RetryableError"],
                    }}),
                    next.secs,
                )
                .await;
            }
            Kind::DropConnections => {
                repeat_failpoint(
                    server,
                    json!({"mode": {"times": 1}, "data": {
                        "failCommands": ["insert", "update", "delete", "find", "findAndModify"],
                        "closeConnection": true,
                    }}),
                    next.secs,
                )
                .await;
            }
            Kind::StoreKill => {
                let from = now_ms();
                shared.pg.kill().await;
                tokio::time::sleep(Duration::from_secs_f64(next.secs)).await;
                shared.pg.start_again().await;
                // Errors a little after the restart still count: the outage's tail. The next
                // fault waits until it has passed, so that its errors are not counted here.
                outages.push((from, now_ms() + 2000));
                tokio::time::sleep(Duration::from_millis(2100)).await;
            }
            Kind::Bypass => {
                let pick = next.target * 37 + fired.len() * 11;
                match bypass(&env, &shared, &source, &mut seeded, pick).await {
                    Ok((id, line)) => {
                        notes.push(format!("{at}: {line}"));
                        bypassed.push(id);
                    }
                    Err(e) => fault_problems.push(format!("{at}: {e}")),
                }
            }
            Kind::ShardAdd => {
                let name = format!("s{}", 5 + added_shards.len());
                let server = MongoServer::builder()
                    .name(name.clone())
                    .test_commands(true)
                    .start()
                    .await;
                let uri = server.uri();
                let database = format!("shop_{name}");
                let out = env
                    .reshard_out(&[
                        "shard",
                        "add",
                        &name,
                        "--uri",
                        &uri,
                        "--database",
                        &database,
                    ])
                    .await;
                if !out.status.success() {
                    fault_problems.push(format!(
                        "{at}: reshard shard add {name}: {}",
                        String::from_utf8_lossy(&out.stderr)
                    ));
                }
                added_shards.push(server);
            }
            Kind::FrontKill => {
                if !fronts.kill() {
                    notes.push(format!("{at}: no front was running"));
                }
            }
            Kind::RouterKill => {
                let app = apps.last_mut().unwrap();
                if let Some(pid) = app.child.id() {
                    signal(pid, "KILL");
                }
                app.killed = true;
                let _ = app.child.wait().await;
                let prefix = ((b'a' + apps.len() as u8) as char).to_string();
                apps.push(start_app(&env, &prefix, seed + apps.len() as u64));
                // The next fault waits until the new instance serves (its router registered):
                // an instance that starts while the store is down cannot register.
                let ledger = apps.last().unwrap().ledger.clone();
                let until = Instant::now() + Duration::from_secs(30);
                while Instant::now() < until
                    && std::fs::metadata(&ledger).map_or(true, |m| m.len() == 0)
                {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        }
        fired.push(at);
    }
    let skipped: Vec<String> = pending
        .map(|f| format!("{}@{}", f.kind.short(), f.at))
        .collect();
    let log = driver.await.unwrap();
    let mut problems = fault_problems;
    notes.push(format!(
        "reshard run x{} ({} killed), worker restarts {}",
        log.runs,
        log.killed,
        workers.restarts()
    ));
    for (code, line) in &log.failures {
        notes.push(format!("run exit {code:?}: {line}"));
    }
    if log.end.is_none() {
        problems.push(format!(
            "the playbook did not end: {:?}",
            log.failures.last()
        ));
    }
    workers.stop().await;
    notes.push(format!("front starts {}", fronts.starts()));
    apps.push(front_app);
    // The application writes a little longer in the final phase, then stops.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let mut summaries = Vec::new();
    for app in apps.iter_mut().filter(|a| !a.killed) {
        if let Some(pid) = app.child.id() {
            signal(pid, "TERM");
        }
    }
    for app in apps.iter_mut().filter(|a| !a.killed) {
        let mut stdout = String::new();
        if let Some(mut out) = app.child.stdout.take() {
            use tokio::io::AsyncReadExt;
            let _ = tokio::time::timeout(Duration::from_secs(60), out.read_to_string(&mut stdout))
                .await;
        }
        let status = tokio::time::timeout(Duration::from_secs(30), app.child.wait()).await;
        match serde_json::from_str::<Value>(&stdout) {
            Ok(v) => summaries.push((app.prefix.clone(), v)),
            Err(_) => problems.push(format!(
                "application {} ended without a summary ({status:?}): {stdout}",
                app.prefix
            )),
        }
    }
    fronts.stop().await;
    for (prefix, s) in &summaries {
        let w = &s["workload"];
        if w["read_anomalies"].as_u64() != Some(0) {
            problems.push(format!(
                "application {prefix}: {} read anomalies: {}",
                w["read_anomalies"], w["anomaly_examples"]
            ));
        }
        notes.push(format!(
            "app {prefix}: {} acknowledged writes, {} errors",
            w["acknowledged_writes"], w["errors"]
        ));
    }

    let expected_phase = if plan.rollback_from.is_some() {
        "rolled_back"
    } else {
        "completed"
    };
    match where_now(&shared.monitor).await {
        Some((phase, _)) if phase == expected_phase => {}
        other => problems.push(format!("final phase {other:?}, expected {expected_phase}")),
    }
    let (partition_problems, partition_notes) =
        check_partitions(&shared.monitor, plan.rollback_from.is_none()).await;
    problems.extend(partition_problems);
    notes.extend(partition_notes);
    let final_version = if plan.rollback_from.is_some() {
        &source
    } else {
        &target
    };
    if std::env::var_os("RESHARD_CAMPAIGN_SABOTAGE").is_some() {
        // The checks' own test: lose one seeded order and one the application wrote, and
        // leave a stray copy; the run must then fail on each.
        sabotage(&shared, final_version, &seeded, &apps).await;
    }
    let (scan_problems, scan_notes) = check_locations(
        &shared,
        &source,
        &target,
        final_version,
        &apps,
        &seeded,
        plan.rollback_from.is_some(),
    )
    .await;
    problems.extend(scan_problems);
    notes.extend(scan_notes);
    let (shadow_problems, shadow_notes) = check_shadow_reads(&shared.monitor, &bypassed).await;
    problems.extend(shadow_problems);
    notes.extend(shadow_notes);
    drop(added_shards);
    // The router serves through a state-store outage: no application error in one.
    let (outage_errors, held) = errors_in(&apps, &outages);
    notes.push(format!(
        "errors during store outages: {outage_errors} (+{held} WriteHeld)"
    ));
    if outage_errors > 0 {
        problems.push(format!(
            "{outage_errors} application error(s) while the state store was down"
        ));
    }
    if !problems.is_empty() || std::env::var_os("RESHARD_CAMPAIGN_KEEP").is_some() {
        let kept = dir.keep();
        notes.push(format!("kept {}", kept.display()));
    }
    Outcome {
        seed,
        direction: plan.direction(),
        fired,
        skipped,
        problems,
        notes,
        seconds: started.elapsed().as_secs_f64(),
    }
}

fn tenant_name(i: usize, rng: &mut StdRng) -> String {
    if i.is_multiple_of(3) {
        "cust-hot".into()
    } else {
        format!("cust-{:04}", rng.gen_range(2..40))
    }
}

/// Orders from before reshard where version 1 places them; returns them by id.
async fn seed_source(
    shared: &Shared,
    source: &RoutingVersion,
    n: usize,
    seed: u64,
) -> BTreeMap<String, Document> {
    let mut rng = StdRng::seed_from_u64(seed ^ 0x5eed);
    let mut by_location: BTreeMap<Location, Vec<Document>> = BTreeMap::new();
    let mut all = BTreeMap::new();
    for i in 0..n {
        let tenant = tenant_name(i, &mut rng);
        let id = format!("seed-{i:05}");
        let d = doc! { "_id": &id, "customerId": &tenant, "qty": rng.gen_range(1..10), "status": "old", "version": 1 };
        let l = source
            .locate(&KeyValue::String(tenant), &KeyValue::String(id.clone()))
            .unwrap()
            .locations[0]
            .clone();
        by_location.entry(l).or_default().push(d.clone());
        all.insert(id, d);
    }
    for (l, docs) in by_location {
        collection(shared, &l)
            .await
            .insert_many(docs)
            .await
            .unwrap();
    }
    all
}

async fn collection(shared: &Shared, l: &Location) -> mongodb::Collection<Document> {
    let n: usize = l.shard.trim_start_matches('s').parse().unwrap();
    shared.servers[n - 1]
        .client()
        .await
        .database(&format!("shop_{}", l.shard))
        .collection(&l.collection)
}

/// `RESHARD_CAMPAIGN_SABOTAGE=1`: deletes the first seeded order and the first live order of
/// the first application's ledger, and puts a copy of the second seeded order on a shard
/// where the final layout does not place it.
async fn sabotage(
    shared: &Shared,
    final_version: &RoutingVersion,
    seeded: &BTreeMap<String, Document>,
    apps: &[App],
) {
    let at = |d: &Document| {
        final_version
            .locate(
                &KeyValue::String(d.get_str("customerId").unwrap().into()),
                &KeyValue::String(d.get_str("_id").unwrap().into()),
            )
            .unwrap()
            .locations[0]
            .clone()
    };
    let mut it = seeded.values();
    let first = it.next().unwrap();
    collection(shared, &at(first))
        .await
        .delete_one(doc! { "_id": first.get_str("_id").unwrap() })
        .await
        .unwrap();
    let second = it.next().unwrap();
    let elsewhere = final_version
        .locations()
        .into_iter()
        .find(|l| *l != at(second))
        .unwrap();
    collection(shared, &elsewhere)
        .await
        .insert_one(second.clone())
        .await
        .unwrap();
    if let Some((id, (tenant, _))) = allowed_states(&apps[0])
        .into_iter()
        .find(|(_, (_, allowed))| allowed.len() == 1 && allowed[0].is_some())
    {
        let d = doc! { "_id": &id, "customerId": &tenant };
        collection(shared, &at(&d))
            .await
            .delete_one(doc! { "_id": &id })
            .await
            .unwrap();
    }
    eprintln!("campaign: sabotaged (RESHARD_CAMPAIGN_SABOTAGE): the checks must fail");
}

/// A writer that bypasses the router: a plain driver update of a seeded order where the source
/// layout holds it, after the write switch. The watch must find it (`bypass list`), and
/// `bypass resolve --action recopy` must carry it to where the migration reads it: the order is
/// expected as bypassed at the end, in either direction. Returns the id and a note.
async fn bypass(
    env: &Env,
    shared: &Shared,
    source: &RoutingVersion,
    seeded: &mut BTreeMap<String, Document>,
    pick: usize,
) -> Result<(String, String), String> {
    let (id, mut d) = seeded
        .iter()
        .nth(pick % seeded.len())
        .map(|(k, v)| (k.clone(), v.clone()))
        .unwrap();
    let tenant = d.get_str("customerId").unwrap().to_owned();
    let l = source
        .locate(&KeyValue::String(tenant), &KeyValue::String(id.clone()))
        .unwrap()
        .locations[0]
        .clone();
    let started = Instant::now();
    let written = collection(shared, &l)
        .await
        .update_one(
            doc! { "_id": &id },
            doc! { "$set": { "status": "bypassed", "qty": 99 } },
        )
        .await
        .map_err(|e| format!("the bypassing write of {id} failed: {e}"))?;
    if written.matched_count != 1 {
        return Err(format!("seeded order {id} was not in {l} to bypass"));
    }
    d.insert("status", "bypassed");
    d.insert("qty", 99);
    seeded.insert(id.clone(), d);
    let migration: i64 = sqlx::query_scalar("SELECT max(id) FROM migrations")
        .fetch_one(&shared.monitor)
        .await
        .map_err(|e| format!("reading the migration's id: {e}"))?;
    let migration = migration.to_string();
    let until = Instant::now() + Duration::from_secs(60);
    loop {
        let out = env
            .reshard_out(&["bypass", "list", &migration, "--output", "json"])
            .await;
        if out.status.success() && String::from_utf8_lossy(&out.stdout).contains(&id) {
            break;
        }
        if Instant::now() > until {
            return Err(format!(
                "the bypassing write of {id} in {l} was not listed within 60 s: {}",
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let listed = started.elapsed().as_secs_f64();
    let mut last = String::new();
    for _ in 0..5 {
        let out = env
            .reshard_out(&[
                "bypass",
                "resolve",
                &migration,
                "--id",
                &id,
                "--action",
                "recopy",
                "--reason",
                "campaign: the bypass fault",
            ])
            .await;
        if out.status.success() {
            return Ok((
                id.clone(),
                format!("{id} written in {l}, listed after {listed:.1}s, recopied"),
            ));
        }
        last = String::from_utf8_lossy(&out.stderr).into_owned();
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    Err(format!("bypass resolve --id {id} failed: {last}"))
}

/// Shadow reads (the playbook sets 10 %) found no pristine copy that differs from its
/// source document, except the orders the bypass fault changed behind the router.
async fn check_shadow_reads(pool: &PgPool, bypassed: &[String]) -> (Vec<String>, Vec<String>) {
    let compared: Result<(i64, i64), _> = sqlx::query_as(
        "SELECT coalesce(sum(compared), 0)::bigint, coalesce(sum(mismatches), 0)::bigint
         FROM shadow_read_counts",
    )
    .fetch_one(pool)
    .await;
    let mismatched: Result<Vec<(String, Option<String>)>, _> =
        sqlx::query_as("SELECT doc_id_text, resolution FROM shadow_mismatches")
            .fetch_all(pool)
            .await;
    let (Ok((compared, mismatches)), Ok(mismatched)) = (compared, mismatched) else {
        return (
            vec!["reading the shadow reads' counts failed".into()],
            Vec::new(),
        );
    };
    // Only reads of a pristine copy held on both sides are compared, and the applications read
    // mostly their own orders (target-only): a run may compare few, or none; the count is a note.
    let mut problems = Vec::new();
    let unexplained: Vec<&(String, Option<String>)> = mismatched
        .iter()
        .filter(|(id, _)| !bypassed.iter().any(|b| id.contains(b.as_str())))
        .collect();
    if !unexplained.is_empty() {
        problems.push(format!("shadow read mismatches: {unexplained:?}"));
    }
    let notes = vec![format!(
        "shadow reads: {compared} compared, {mismatches} mismatched ({} document(s): {:?})",
        mismatched.len(),
        mismatched
    )];
    (problems, notes)
}

/// Every partition of every task is done and balances its ledger (`scanned = inserted +
/// already_present + stamped + dead_lettered + deleted + kept`), with no dead letter; after a
/// completed migration, cleanup deleted no more than the backfill moved.
async fn check_partitions(pool: &PgPool, forward: bool) -> (Vec<String>, Vec<String>) {
    type Row = (String, i64, i64, i64, i64, i64, i64, i64, i64, i64, i64);
    let rows: Vec<Row> = match sqlx::query_as(
        "SELECT task, count(*), count(*) FILTER (WHERE state = 'done'),
                count(*) FILTER (WHERE scanned <> inserted + already_present + stamped
                                              + dead_lettered + deleted + kept),
                coalesce(sum(scanned), 0)::bigint, coalesce(sum(inserted), 0)::bigint,
                coalesce(sum(already_present), 0)::bigint, coalesce(sum(stamped), 0)::bigint,
                coalesce(sum(dead_lettered), 0)::bigint, coalesce(sum(deleted), 0)::bigint,
                coalesce(sum(kept), 0)::bigint
         FROM partitions WHERE task <> 'verify' GROUP BY task",
    )
    .fetch_all(pool)
    .await
    {
        Ok(rows) => rows,
        Err(e) => return (vec![format!("reading partitions: {e}")], Vec::new()),
    };
    let mut problems = Vec::new();
    let mut notes = Vec::new();
    let mut by_task = BTreeMap::new();
    for row in rows {
        let (
            task,
            all,
            done,
            unbalanced,
            scanned,
            inserted,
            present,
            stamped,
            letters,
            deleted,
            kept,
        ) = row.clone();
        notes.push(format!(
            "{task}: {all} partitions, scanned {scanned} = inserted {inserted} + present \
             {present} + stamped {stamped} + dead {letters} + deleted {deleted} + kept {kept}"
        ));
        if done != all {
            problems.push(format!("{task}: {done} of {all} partitions done"));
        }
        if unbalanced > 0 {
            problems.push(format!(
                "{task}: {unbalanced} partition(s) with an unbalanced ledger"
            ));
        }
        if letters > 0 {
            problems.push(format!("{task}: {letters} dead letter(s)"));
        }
        by_task.insert(task, row);
    }
    if forward {
        // Cleanup scans the same source ranges, but in collections both layouts share it also
        // meets what the application wrote in place since (kept), and routers removed some
        // moved source documents themselves; it can only delete what the backfill moved.
        match (by_task.get("backfill"), by_task.get("cleanup")) {
            (Some(b), Some(c)) => {
                if c.9 > b.5 + b.6 {
                    problems.push(format!(
                        "cleanup deleted {}, more than the backfill moved ({} inserted + already \
                         present)",
                        c.9,
                        b.5 + b.6
                    ));
                }
            }
            _ => {
                problems.push("a completed migration without backfill or cleanup partitions".into())
            }
        }
    }
    (problems, notes)
}

/// What one instance's ledger and journal say each of its ids may be at the end: the last
/// acknowledged state, or the state of a write sent after it whose outcome is unknown.
fn allowed_states(app: &App) -> BTreeMap<String, (String, Vec<Option<Value>>)> {
    // A killed instance may leave a torn last line: every whole line counts.
    let entries: Vec<ledger::Entry> = std::fs::read_to_string(&app.ledger)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    let mut last: BTreeMap<String, (u64, String, Option<Value>)> = BTreeMap::new();
    for e in entries {
        if last.get(&e.id).is_none_or(|(s, _, _)| *s < e.seq) {
            last.insert(e.id.clone(), (e.seq, e.tenant.clone(), e.doc.clone()));
        }
    }
    let mut out: BTreeMap<String, (String, Vec<Option<Value>>)> = last
        .iter()
        .map(|(id, (_, t, d))| (id.clone(), (t.clone(), vec![d.clone()])))
        .collect();
    let journal = std::fs::read_to_string(&app.journal).unwrap_or_default();
    for line in journal.lines() {
        let Ok(v) = serde_json::from_str::<Value>(line) else {
            continue;
        };
        if v["type"] != "intent" {
            continue;
        }
        let id = v["id"].as_str().unwrap().to_owned();
        let seq = v["seq"].as_u64().unwrap();
        let after = last.get(&id).is_none_or(|(s, _, _)| *s < seq);
        if after {
            let doc = if v["doc"].is_null() {
                None
            } else {
                Some(v["doc"].clone())
            };
            let entry = out
                .entry(id)
                .or_insert_with(|| (v["tenant"].as_str().unwrap().to_owned(), vec![None]));
            entry.1.push(doc);
        }
    }
    out
}

fn app_fields(d: &Document) -> Value {
    json!({
        "customerId": d.get_str("customerId").unwrap_or_default(),
        "qty": d.get_i32("qty").unwrap_or_default(),
        "status": d.get_str("status").unwrap_or_default(),
        "version": d.get_i32("version").unwrap_or_default(),
    })
}

/// A full scan of every location either layout uses.
#[allow(clippy::too_many_arguments)]
async fn check_locations(
    shared: &Shared,
    source: &RoutingVersion,
    target: &RoutingVersion,
    final_version: &RoutingVersion,
    apps: &[App],
    seeded: &BTreeMap<String, Document>,
    rolled_back: bool,
) -> (Vec<String>, Vec<String>) {
    let mut problems = Vec::new();
    let mut locations: BTreeSet<Location> = source.locations().into_iter().collect();
    locations.extend(target.locations());
    // id -> (location, document) of every live document.
    let mut live: BTreeMap<String, Vec<(Location, Document)>> = BTreeMap::new();
    let (mut tombstones, mut total) = (0, 0);
    for l in &locations {
        let docs: Vec<Document> = collection(shared, l)
            .await
            .find(doc! {})
            .await
            .unwrap()
            .try_collect()
            .await
            .unwrap();
        for d in docs {
            total += 1;
            if reshard::envelope::is_tombstone(&d) {
                tombstones += 1;
                if tombstones <= 3 {
                    problems.push(format!("a tombstone is left at {l}: {d}"));
                }
                continue;
            }
            let id = d.get_str("_id").unwrap_or_default().to_owned();
            live.entry(id).or_default().push((l.clone(), d));
        }
    }
    if tombstones > 3 {
        problems.push(format!("{tombstones} tombstones are left"));
    }
    // Placement: once, where the final layout puts it.
    let (mut off, mut twice) = (0, 0);
    for (id, copies) in &live {
        if copies.len() > 1 {
            twice += 1;
            if twice <= 3 {
                problems.push(format!(
                    "{id} is in {} locations: {:?}",
                    copies.len(),
                    copies
                        .iter()
                        .map(|(l, _)| l.to_string())
                        .collect::<Vec<_>>()
                ));
            }
        }
        for (l, d) in copies {
            let tenant = d.get_str("customerId").unwrap_or_default().to_owned();
            let want = &final_version
                .locate(&KeyValue::String(tenant), &KeyValue::String(id.clone()))
                .unwrap()
                .locations[0];
            if want != l {
                off += 1;
                if off <= 3 {
                    problems.push(format!(
                        "{id} is at {l}, the final layout puts it at {want}"
                    ));
                }
            }
        }
    }
    if off > 3 {
        problems.push(format!("{off} documents off their final location"));
    }
    if rolled_back {
        // The target layout is gone: nothing where only the target version placed documents.
        let source_locations: BTreeSet<Location> = source.locations().into_iter().collect();
        for l in target.locations() {
            if !source_locations.contains(&l) {
                let n = collection(shared, &l)
                    .await
                    .count_documents(doc! {})
                    .await
                    .unwrap();
                if n > 0 {
                    problems.push(format!("{n} document(s) left at target-only {l}"));
                }
            }
        }
    }
    // Content: the seeded orders unchanged, the application's as its ledgers say.
    let actual = |id: &str| -> Option<Value> {
        live.get(id)
            .and_then(|c| c.first())
            .map(|(_, d)| app_fields(d))
    };
    let mut missing_seeded = 0;
    for (id, d) in seeded {
        if actual(id) != Some(app_fields(d)) {
            missing_seeded += 1;
            if missing_seeded <= 3 {
                problems.push(format!(
                    "seeded {id}: expected {}, found {:?}",
                    app_fields(d),
                    actual(id)
                ));
            }
        }
    }
    let (mut lost, mut resurrected, mut wrong, mut checked, mut uncertain) = (0, 0, 0, 0, 0);
    let mut known: BTreeSet<String> = seeded.keys().cloned().collect();
    for app in apps {
        for (id, (_, allowed)) in allowed_states(app) {
            known.insert(id.clone());
            checked += 1;
            if allowed.len() > 1 {
                uncertain += 1;
            }
            let got = actual(&id);
            if allowed.contains(&got) {
                continue;
            }
            let last = allowed[0].clone();
            let what = match (&last, &got) {
                (Some(_), None) => {
                    lost += 1;
                    "lost"
                }
                (None, Some(_)) => {
                    resurrected += 1;
                    "resurrected"
                }
                _ => {
                    wrong += 1;
                    "wrong"
                }
            };
            if lost + resurrected + wrong <= 5 {
                problems.push(format!(
                    "{what}: {id} (app {}): allowed {allowed:?}, found {got:?}",
                    app.prefix
                ));
            }
        }
    }
    if lost + resurrected + wrong > 0 {
        problems.push(format!(
            "ledger check: {lost} lost, {resurrected} resurrected, {wrong} wrong of {checked}"
        ));
    }
    let strangers: Vec<&String> = live.keys().filter(|id| !known.contains(*id)).collect();
    if !strangers.is_empty() {
        problems.push(format!(
            "{} document(s) nobody acknowledged or tried to write: {:?}",
            strangers.len(),
            strangers.iter().take(5).collect::<Vec<_>>()
        ));
    }
    let notes = vec![format!(
        "scanned {total} documents in {} locations; ledger ids {checked} ({uncertain} with an unknown outcome), seeded {}",
        locations.len(),
        seeded.len()
    )];
    (problems, notes)
}

/// Application errors during the store outages (and WriteHeld among them, apart).
fn errors_in(apps: &[App], outages: &[(u64, u64)]) -> (u64, u64) {
    let (mut errors, mut held) = (0, 0);
    for app in apps {
        let journal = std::fs::read_to_string(&app.journal).unwrap_or_default();
        for line in journal.lines() {
            let Ok(v) = serde_json::from_str::<Value>(line) else {
                continue;
            };
            if v["type"] != "error" {
                continue;
            }
            let t = v["t_ms"].as_u64().unwrap_or(0);
            if outages.iter().any(|(a, b)| *a <= t && t <= *b) {
                if v["kind"] == "WriteHeld" {
                    held += 1;
                } else {
                    errors += 1;
                    eprintln!("campaign: error during a store outage: {line}");
                }
            }
        }
    }
    (errors, held)
}

// ---------------------------------------------------------------------------------------
// The campaign

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn fault_campaign() {
    let heavy = heavy_tests_enabled();
    let runs: u64 = std::env::var("RESHARD_CAMPAIGN_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(if heavy { 5 } else { 2 });
    let base: u64 = std::env::var("RESHARD_CAMPAIGN_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| rand::random::<u32>() as u64 & !1);
    let (orders, rate) = if heavy { (600, 40) } else { (300, 30) };
    eprintln!(
        "campaign: seed {base} ({runs} runs; replay with RESHARD_CAMPAIGN_SEED={base} \
         RESHARD_CAMPAIGN_RUNS={runs})"
    );
    let started = Instant::now();
    let mut outcomes = Vec::new();
    for i in 0..runs {
        let outcome = run_one(base + i, orders, rate).await;
        eprintln!(
            "campaign: seed {} {} in {:.0}s: {}\n  notes: {}",
            outcome.seed,
            outcome.direction,
            outcome.seconds,
            if outcome.problems.is_empty() {
                "ok".to_owned()
            } else {
                outcome.problems.join("\n  ")
            },
            outcome.notes.join("; ")
        );
        outcomes.push(outcome);
    }
    // The coverage table.
    eprintln!(
        "\ncampaign: {runs} runs in {:.0}s",
        started.elapsed().as_secs_f64()
    );
    eprintln!(
        "{:>3} {:>10} {:<20} {:>5} {:<8} faults",
        "run", "seed", "direction", "secs", "outcome"
    );
    let mut covered: BTreeMap<(bool, Kind), u32> = BTreeMap::new();
    for (i, o) in outcomes.iter().enumerate() {
        eprintln!(
            "{:>3} {:>10} {:<20} {:>5.0} {:<8} {}{}",
            i,
            o.seed,
            o.direction,
            o.seconds,
            if o.problems.is_empty() {
                "ok"
            } else {
                "FAILED"
            },
            o.fired.join(" "),
            if o.skipped.is_empty() {
                String::new()
            } else {
                format!(" (not reached: {})", o.skipped.join(" "))
            }
        );
        for f in &o.fired {
            let kind = KINDS
                .iter()
                .find(|k| f.starts_with(k.short()))
                .copied()
                .unwrap();
            *covered.entry((o.direction == "forward", kind)).or_default() += 1;
        }
    }
    let mut uncovered = Vec::new();
    for forward in [true, false] {
        let dir = if forward { "forward" } else { "rollback" };
        eprintln!(
            "  {dir:<8} {}",
            KINDS
                .iter()
                .map(|k| format!(
                    "{} x{}",
                    k.short(),
                    covered.get(&(forward, *k)).unwrap_or(&0)
                ))
                .collect::<Vec<_>>()
                .join(", ")
        );
        if runs >= 2 {
            for k in KINDS {
                if !covered.contains_key(&(forward, k)) {
                    uncovered.push(format!("{dir} {}", k.short()));
                }
            }
        }
    }
    let failed: Vec<String> = outcomes
        .iter()
        .filter(|o| !o.problems.is_empty())
        .map(|o| {
            format!(
                "seed {} ({}): {}",
                o.seed,
                o.direction,
                o.problems.join("; ")
            )
        })
        .collect();
    assert!(failed.is_empty(), "failed runs:\n{}", failed.join("\n"));
    assert!(
        uncovered.is_empty(),
        "fault kinds that never fired: {uncovered:?}"
    );
}

//! The data path outlives the state store (issue 13): an application writing through the
//! router sees no error and no stale read while its PostgreSQL is down, in every phase of a
//! migration, and a phase change asked for during the outage (or caught by one in its barrier)
//! waits for the store to come back. The state store is a cluster of the test's own
//! (`PrivatePg`), stopped and killed for real; the quick variant's outages last seconds, with
//! `RESHARD_HEAVY_TESTS=1` the long ones last five minutes.
//!
//! A router with a short lease is the "before" of this issue: once its lease runs out during
//! the outage it refuses operations (and never answers from a phase it may no longer hold),
//! and serves again once the store is back.

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use mongodb::bson::{doc, Bson};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use reshard::driver::{Driver, MoveOptions, Progress};
use reshard::phase::{Action, Phase};
use reshard::router::{Router, RouterConfig, RouterError};
use reshard::store::routers::Registration;
use support::{heavy_tests_enabled, World};

const HOT: &str = "cust-hot";

/// The long outage: five minutes under `RESHARD_HEAVY_TESTS=1`, seconds otherwise.
fn long_outage() -> Duration {
    if heavy_tests_enabled() {
        Duration::from_secs(300)
    } else {
        Duration::from_secs(12)
    }
}

fn app_config(name: &str) -> RouterConfig {
    let mut c = RouterConfig::named(name);
    c.heartbeat_interval = Duration::from_millis(200);
    // No shard is killed here: acknowledged in memory is durable enough, and faster.
    c.write_concern = mongodb::options::WriteConcern::nodes(1);
    c
}

/// What the application saw.
#[derive(Default)]
struct Seen {
    ok: AtomicU64,
    /// Operations that failed, with the error.
    errors: Mutex<Vec<String>>,
    /// Reads that disagreed with the application's own ledger.
    stale: Mutex<Vec<String>>,
}

impl Seen {
    fn error(&self, what: String) {
        self.errors.lock().unwrap().push(what);
    }
    fn stale(&self, what: String) {
        self.stale.lock().unwrap().push(what);
    }
    fn counts(&self) -> (u64, usize, usize) {
        (
            self.ok.load(Ordering::SeqCst),
            self.errors.lock().unwrap().len(),
            self.stale.lock().unwrap().len(),
        )
    }
    fn report(&self) -> String {
        let errors = self.errors.lock().unwrap();
        let stale = self.stale.lock().unwrap();
        format!(
            "{} ok, {} errors {:?}, {} stale reads {:?}",
            self.ok.load(Ordering::SeqCst),
            errors.len(),
            errors.iter().take(5).collect::<Vec<_>>(),
            stale.len(),
            stale.iter().take(5).collect::<Vec<_>>()
        )
    }
}

/// One application task: its own tenants (and its own ids of the hot tenant), a ledger of
/// what it wrote, and every read checked against it.
struct AppTask {
    id: usize,
    rng: StdRng,
    /// (tenant, id) -> the value last written, `None` once deleted.
    ledger: BTreeMap<(String, String), Option<i32>>,
    /// Ids whose last write's outcome is unknown: not checked any more.
    unknown: BTreeSet<String>,
    next_id: u64,
}

impl AppTask {
    fn new(id: usize, seed: u64) -> AppTask {
        AppTask {
            id,
            rng: StdRng::seed_from_u64(seed),
            ledger: BTreeMap::new(),
            unknown: BTreeSet::new(),
            next_id: 0,
        }
    }

    fn tenants(&self) -> Vec<String> {
        let mut t: Vec<String> = (0..3).map(|j| format!("t{}-{j}", self.id)).collect();
        t.push(HOT.to_owned());
        t
    }

    /// The ids of this task in a listing of `tenant` (the hot tenant is shared).
    fn mine(&self, id: &str) -> bool {
        id.starts_with(&format!("k{}-", self.id))
    }

    async fn insert(&mut self, router: &Router, seen: &Seen) {
        let tenants = self.tenants();
        let tenant = tenants[self.rng.gen_range(0..tenants.len())].clone();
        let id = format!("k{}-{:05}", self.id, self.next_id);
        self.next_id += 1;
        let n: i32 = self.rng.gen_range(0..1_000_000);
        match router
            .insert(doc! { "_id": &id, "customerId": &tenant, "n": n })
            .await
        {
            Ok(()) => {
                self.ledger.insert((tenant, id), Some(n));
                seen.ok.fetch_add(1, Ordering::SeqCst);
            }
            Err(e) => self.failed(&id, "insert", e, seen),
        }
    }

    /// A write failed: a refusal applied nothing (the ledger stands, and later reads check
    /// it); any other failure leaves the outcome unknown, and the id is not checked again.
    fn failed(&mut self, id: &str, op: &str, e: RouterError, seen: &Seen) {
        if !matches!(e, RouterError::RoutingStale) {
            self.ledger.retain(|(_, i), _| i != id);
            self.unknown.insert(id.to_owned());
        }
        seen.error(format!("{op} {id}: {e}"));
    }

    fn pick(&mut self, live_only: bool) -> Option<(String, String)> {
        let keys: Vec<_> = self
            .ledger
            .iter()
            .filter(|(_, v)| !live_only || v.is_some())
            .map(|(k, _)| k.clone())
            .collect();
        (!keys.is_empty()).then(|| keys[self.rng.gen_range(0..keys.len())].clone())
    }

    async fn step(&mut self, router: &Router, seen: &Seen) {
        let roll = self.rng.gen_range(0..100);
        if roll < 30 || self.ledger.len() < 8 {
            return self.insert(router, seen).await;
        }
        if roll < 55 {
            let Some((tenant, id)) = self.pick(true) else {
                return;
            };
            let n: i32 = self.rng.gen_range(0..1_000_000);
            match router
                .update(tenant.as_str(), id.as_str(), doc! { "$set": { "n": n } })
                .await
            {
                Ok(true) => {
                    self.ledger.insert((tenant, id), Some(n));
                    seen.ok.fetch_add(1, Ordering::SeqCst);
                }
                Ok(false) => seen.stale(format!("update of live {tenant}/{id} found nothing")),
                Err(e) => self.failed(&id, "update", e, seen),
            }
            return;
        }
        if roll < 63 {
            let Some((tenant, id)) = self.pick(true) else {
                return;
            };
            match router.delete(tenant.as_str(), id.as_str()).await {
                Ok(true) => {
                    self.ledger.insert((tenant, id), None);
                    seen.ok.fetch_add(1, Ordering::SeqCst);
                }
                Ok(false) => seen.stale(format!("delete of live {tenant}/{id} found nothing")),
                Err(e) => self.failed(&id, "delete", e, seen),
            }
            return;
        }
        if roll < 90 {
            let Some((tenant, id)) = self.pick(false) else {
                return;
            };
            let expected = self.ledger[&(tenant.clone(), id.clone())];
            match router.get(tenant.as_str(), id.as_str()).await {
                Ok(doc) => {
                    let got = doc.map(|d| d.get_i32("n").unwrap_or(-1));
                    if got != expected {
                        seen.stale(format!(
                            "get {tenant}/{id}: read {got:?}, last wrote {expected:?}"
                        ));
                    } else {
                        seen.ok.fetch_add(1, Ordering::SeqCst);
                    }
                }
                Err(e) => seen.error(format!("get {id}: {e}")),
            }
            return;
        }
        let tenants = self.tenants();
        let tenant = tenants[self.rng.gen_range(0..tenants.len())].clone();
        match list_all(router, &tenant).await {
            Ok(listed) => {
                let listed: BTreeMap<String, i32> = listed
                    .into_iter()
                    .filter(|(id, _)| self.mine(id) && !self.unknown.contains(id))
                    .collect();
                let expected: BTreeMap<String, i32> = self
                    .ledger
                    .iter()
                    .filter(|((t, _), v)| *t == tenant && v.is_some())
                    .map(|((_, id), v)| (id.clone(), v.unwrap()))
                    .collect();
                if listed != expected {
                    let a: BTreeSet<_> = listed.keys().collect();
                    let b: BTreeSet<_> = expected.keys().collect();
                    seen.stale(format!(
                        "listing {tenant}: {} listed, {} expected; extra {:?}, missing {:?}",
                        listed.len(),
                        expected.len(),
                        a.difference(&b).take(3).collect::<Vec<_>>(),
                        b.difference(&a).take(3).collect::<Vec<_>>()
                    ));
                } else {
                    seen.ok.fetch_add(1, Ordering::SeqCst);
                }
            }
            Err(e) => seen.error(format!("list {tenant}: {e}")),
        }
    }
}

/// Every document of `tenant`, in pages of 7 (id -> n).
async fn list_all(router: &Router, tenant: &str) -> Result<Vec<(String, i32)>, RouterError> {
    let mut out = Vec::new();
    let mut after: Option<Bson> = None;
    loop {
        let page = router.list_tenant(tenant, after.clone(), 7).await?;
        for d in &page.documents {
            out.push((
                d.get_str("_id").unwrap_or_default().to_owned(),
                d.get_i32("n").unwrap_or(-1),
            ));
        }
        match page.next {
            Some(next) => after = Some(next),
            None => return Ok(out),
        }
    }
}

/// The application: `tasks` tasks writing and reading through `router` until stopped.
struct App {
    seen: Arc<Seen>,
    stop: Arc<AtomicBool>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl App {
    fn start(router: &Router, tasks: usize, seed: u64) -> App {
        let seen = Arc::new(Seen::default());
        let stop = Arc::new(AtomicBool::new(false));
        let tasks = (0..tasks)
            .map(|k| {
                let (router, seen, stop) = (router.clone(), seen.clone(), stop.clone());
                tokio::spawn(async move {
                    let mut task = AppTask::new(k, seed * 31 + k as u64);
                    while !stop.load(Ordering::SeqCst) {
                        task.step(&router, &seen).await;
                        tokio::time::sleep(Duration::from_millis(3)).await;
                    }
                })
            })
            .collect();
        App { seen, stop, tasks }
    }

    async fn stop(self) -> Arc<Seen> {
        self.stop.store(true, Ordering::SeqCst);
        for t in self.tasks {
            t.await.unwrap();
        }
        self.seen
    }
}

/// How many operations the application must complete while the store is down.
const MIN_OPS_DURING_OUTAGE: u64 = 10;

/// Takes the state store away for `outage` (`kill`: SIGKILL of the whole server, else a fast
/// shutdown) while the application runs (longer if it has not completed
/// [`MIN_OPS_DURING_OUTAGE`] operations by then), and returns how many operations succeeded
/// meanwhile. The application's error and stale-read counts must not move.
async fn outage(w: &World, seen: &Seen, outage: Duration, kill: bool, label: &str) -> u64 {
    let pg = w.db.private();
    let (ok_before, errors_before, stale_before) = seen.counts();
    let started = Instant::now();
    if kill {
        pg.kill().await;
    } else {
        pg.stop().await;
    }
    tokio::time::sleep(outage).await;
    // Listings grow with the run and the machine may be busy: keep the store down until the
    // application has done a few operations without it (at most a minute more).
    let more = Instant::now();
    while seen.counts().0 < ok_before + MIN_OPS_DURING_OUTAGE
        && more.elapsed() < Duration::from_secs(60)
    {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    pg.start_again().await;
    let (ok_after, errors_after, stale_after) = seen.counts();
    eprintln!(
        "[outage] {label}: {:?} without the state store ({}), {} operations succeeded, \
         {} errors, {} stale reads",
        started.elapsed(),
        if kill { "killed" } else { "stopped" },
        ok_after - ok_before,
        errors_after - errors_before,
        stale_after - stale_before
    );
    ok_after - ok_before
}

/// Waits until the state store answers again (the test's own calls; the router needs none).
async fn store_back(w: &World) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while w.store.migration(w.migration).await.is_err() {
        assert!(
            Instant::now() < deadline,
            "the state store did not come back"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_application_reads_and_writes_through_state_store_outages_in_every_phase() {
    let w = World::start_private().await;
    let router = Router::with_shards(
        w.store.clone(),
        "orders",
        app_config("app"),
        w.shards.clone(),
    )
    .await
    .unwrap();
    let app = App::start(&router, 2, 7);
    tokio::time::sleep(Duration::from_secs(2)).await;

    let short = Duration::from_secs(3);
    let mut during = BTreeMap::new();
    during.insert(
        "planned",
        outage(&w, &app.seen, short, true, "planned").await,
    );
    store_back(&w).await;
    w.advance(&[&router], &[Phase::DualRead]).await;
    during.insert(
        "dual_read",
        outage(&w, &app.seen, short, false, "dual_read").await,
    );
    store_back(&w).await;
    w.advance(&[&router], &[Phase::WriteSwitch, Phase::NewWrites])
        .await;
    during.insert(
        "new_writes",
        outage(&w, &app.seen, short, true, "new_writes").await,
    );
    store_back(&w).await;
    w.advance(&[&router], &[Phase::Backfill]).await;
    // The long outage, in the phase with the most moving parts: reads on both layouts,
    // writes on the target, tombstones for deletes.
    during.insert(
        "backfill",
        outage(&w, &app.seen, long_outage(), true, "backfill (long)").await,
    );
    store_back(&w).await;
    w.work().await;
    // The copy is done; the next phases' gates (reconciliation) are not this test's subject.
    for (phase, kill) in [
        (Phase::Reconcile, false),
        (Phase::NewReads, true),
        (Phase::Cleanup, false),
    ] {
        w.force_phase(&[&router], phase).await;
        during.insert(
            phase.as_str(),
            outage(&w, &app.seen, short, kill, phase.as_str()).await,
        );
        store_back(&w).await;
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let seen = app.stop().await;
    router.shutdown().await;

    let (ok, errors, stale) = seen.counts();
    assert_eq!((errors, stale), (0, 0), "{}", seen.report());
    for (phase, n) in &during {
        assert!(
            *n >= MIN_OPS_DURING_OUTAGE,
            "the application should have kept working in {phase} without the store: {n} ops"
        );
    }
    eprintln!("[outage] every phase: {ok} operations, none failed, none stale: {during:?}");
}

/// Records what the driver says.
#[derive(Default)]
struct Notes(Mutex<Vec<String>>);

impl Progress for Notes {
    fn note(&self, message: &str) {
        self.0.lock().unwrap().push(message.to_owned());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_phase_change_waits_for_the_state_store_while_the_application_never_notices() {
    let w = World::start_private().await;
    let pg = w.db.private().clone();
    let router = Router::with_shards(
        w.store.clone(),
        "orders",
        app_config("app"),
        w.shards.clone(),
    )
    .await
    .unwrap();
    let app = App::start(&router, 2, 11);
    tokio::time::sleep(Duration::from_secs(1)).await;
    let notes = Arc::new(Notes::default());
    let driver = Driver::new(w.store.clone(), "test", notes.clone());

    // 1. The move is made, and the store goes away before its barrier has heard from the
    //    router: the barrier waits through the outage (and the router serves on).
    let t = w
        .store
        .transition(
            w.migration,
            &Action::Advance(Phase::DualRead),
            "test",
            None,
            false,
        )
        .await
        .unwrap();
    pg.stop().await;
    let barrier = {
        let (driver, m) = (driver.clone(), t.migration.clone());
        tokio::spawn(async move { driver.barrier(&m, Duration::from_secs(120)).await })
    };
    // Longer than the store's pool waits for a connection (10 s), so the driver tells.
    let outage_1 = Duration::from_secs(if heavy_tests_enabled() { 30 } else { 14 });
    let ok_before = app.seen.counts().0;
    tokio::time::sleep(outage_1).await;
    assert!(
        !barrier.is_finished(),
        "the barrier cannot pass without the state store"
    );
    pg.start_again().await;
    barrier
        .await
        .unwrap()
        .expect("the barrier passes once the store is back");
    let served_1 = app.seen.counts().0 - ok_before;
    assert!(
        notes
            .0
            .lock()
            .unwrap()
            .iter()
            .any(|n| n.contains("unreachable")),
        "the driver said it was waiting for the store: {:?}",
        notes.0.lock().unwrap()
    );
    assert_eq!(router.snapshot().await.phase, Phase::DualRead);

    w.advance(&[&router], &[Phase::WriteSwitch, Phase::NewWrites])
        .await;

    // 2. The store goes away, then a move is asked for: it waits for the store, is made
    //    once it is back, and the router follows.
    let outage_2 = long_outage();
    pg.kill().await;
    notes.0.lock().unwrap().clear();
    let ok_before = app.seen.counts().0;
    let advance = {
        let driver = driver.clone();
        let id = w.migration;
        let options = MoveOptions {
            timeout: outage_2 + Duration::from_secs(120),
            ..MoveOptions::default()
        };
        tokio::spawn(async move { driver.advance(id, Phase::Backfill, &options).await })
    };
    tokio::time::sleep(outage_2).await;
    assert!(!advance.is_finished(), "nothing moves without the store");
    assert_eq!(router.snapshot().await.phase, Phase::NewWrites);
    let served_2 = app.seen.counts().0 - ok_before;
    pg.start_again().await;
    advance
        .await
        .unwrap()
        .expect("the move is made once the store is back");
    assert!(
        notes
            .0
            .lock()
            .unwrap()
            .iter()
            .any(|n| n.contains("unreachable")),
        "{:?}",
        notes.0.lock().unwrap()
    );
    let m = w.store.migration(w.migration).await.unwrap();
    assert_eq!(m.phase(), Phase::Backfill);
    assert!(
        router
            .wait_for_epoch(m.epoch, Duration::from_secs(10))
            .await
    );
    tokio::time::sleep(Duration::from_secs(1)).await;

    let seen = app.stop().await;
    router.shutdown().await;
    let (ok, errors, stale) = seen.counts();
    assert_eq!((errors, stale), (0, 0), "{}", seen.report());
    assert!(
        served_1 > 10 && served_2 > 10,
        "the application kept working without the store: {served_1}, {served_2}"
    );
    eprintln!(
        "[outage] a barrier through a {outage_1:?} outage and a move asked for during a \
         {outage_2:?} outage: {ok} operations ({served_1} and {served_2} meanwhile), none \
         failed, none stale"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_router_whose_lease_runs_out_refuses_rather_than_guess_and_serves_again_after() {
    // The router as it was before this issue: a lease shorter than the outage.
    let w = World::start_private().await;
    let mut config = app_config("short-lease");
    config.lease_ttl = Duration::from_secs(4);
    let router = Router::with_shards(w.store.clone(), "orders", config, w.shards.clone())
        .await
        .unwrap();
    w.advance(
        &[&router],
        &[Phase::DualRead, Phase::WriteSwitch, Phase::NewWrites],
    )
    .await;
    let app = App::start(&router, 2, 5);
    tokio::time::sleep(Duration::from_secs(1)).await;
    let outage = Duration::from_secs(10);
    let (ok_0, errors_0, _) = app.seen.counts();
    w.db.private().kill().await;
    tokio::time::sleep(outage).await;
    let (ok_1, errors_1, _) = app.seen.counts();
    w.db.private().start_again().await;
    // Serving again: the router renews, loads the phase, then serves.
    let t = Instant::now();
    let resumed = loop {
        let before = app.seen.counts().1;
        tokio::time::sleep(Duration::from_millis(500)).await;
        if app.seen.counts().1 == before {
            break t.elapsed();
        }
        assert!(
            t.elapsed() < Duration::from_secs(30),
            "the router did not serve again"
        );
    };
    let (ok_2, _, _) = app.seen.counts();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let seen = app.stop().await;
    router.shutdown().await;
    let (ok_3, _, stale) = seen.counts();

    let refused = errors_1 - errors_0;
    assert!(
        refused > 0,
        "a lease shorter than the outage ends in refusals"
    );
    assert!(
        seen.errors
            .lock()
            .unwrap()
            .iter()
            .all(|e| e.contains("could not renew its lease") || e.contains("lease ran out")),
        "refusals only: {}",
        seen.report()
    );
    assert_eq!(stale, 0, "never a stale read: {}", seen.report());
    assert!(ok_3 > ok_2, "it serves again after the store came back");
    eprintln!(
        "[outage] before this issue (a 4 s lease, a {outage:?} outage): {} operations \
         succeeded, {refused} refused during the outage; serving again {resumed:?} after the \
         store came back",
        ok_1 - ok_0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_router_holds_phase_changes_until_its_deadline_and_is_forgotten_only_after() {
    let w = World::start().await;
    // A router that registered and went silent (crashed, or cut off from the store and
    // still serving: nobody can tell the two apart before its lease runs out).
    let id = uuid::Uuid::new_v4();
    let lease = Duration::from_secs(4);
    let margin = Duration::from_millis(400);
    w.store
        .register_router(&Registration {
            id,
            collection: "orders",
            name: "silent",
            host: "elsewhere",
            pid: 4242,
            ttl: lease,
            fence_margin: margin,
            kind: reshard::store::RouterKind::Library,
            heartbeat_interval: Duration::from_secs(2),
        })
        .await
        .unwrap();
    let registered = Instant::now();
    let reshard = |args: &[&str]| {
        std::process::Command::new(env!("CARGO_BIN_EXE_reshard"))
            .env("RESHARD_DATABASE_URL", w.db.url())
            .env_remove("DATABASE_URL")
            .args(args)
            .output()
            .unwrap()
    };

    // Forgetting it before its deadline is refused, and changes nothing.
    let out = reshard(&["router", "remove", &id.to_string()]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("may still be serving until"), "{stderr}");
    let listed = reshard(&["router", "list", "--output", "json"]);
    assert!(String::from_utf8_lossy(&listed.stdout).contains(&id.to_string()));

    // The barrier of the next move waits for it until its lease and margin ran out.
    let notes = Arc::new(Notes::default());
    let driver = Driver::new(w.store.clone(), "test", notes);
    let options = MoveOptions {
        timeout: Duration::from_secs(30),
        ..MoveOptions::default()
    };
    driver
        .advance(w.migration, Phase::DualRead, &options)
        .await
        .unwrap();
    let held = registered.elapsed();
    assert!(
        held >= lease,
        "the barrier waited for the silent router until its deadline: {held:?}"
    );

    // After the deadline it may be forgotten; then it is gone from the list.
    let out = reshard(&["router", "remove", &id.to_string()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let listed = reshard(&["router", "list", "--output", "json"]);
    assert!(!String::from_utf8_lossy(&listed.stdout).contains(&id.to_string()));
    let out = reshard(&["router", "remove", &id.to_string()]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no router"));
}

/// What a future logs at warn and above, wherever it is polled
/// (`tracing::instrument::WithSubscriber`).
#[derive(Clone, Default)]
struct Logged(Arc<Mutex<Vec<u8>>>);

impl Logged {
    fn subscriber(&self) -> impl tracing::Subscriber + Send + Sync {
        tracing_subscriber::fmt()
            .with_writer(self.clone())
            .with_max_level(tracing::Level::WARN)
            .with_ansi(false)
            .finish()
    }

    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }
}

impl std::io::Write for Logged {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Logged {
    type Writer = Logged;
    fn make_writer(&'a self) -> Logged {
        self.clone()
    }
}

/// The state store's URL with a password in it, which its `trust` authentication ignores and
/// no log line or error may show.
const PASSWORD: &str = "s3cret-pw";

fn url_with_password(w: &World) -> String {
    w.db.private()
        .url()
        .replacen("postgres@", &format!("postgres:{PASSWORD}@"), 1)
}

/// Item 4: an application that starts while its state store is down (here through
/// `Router::connect`, as the example application does) waits for the store, warning at each
/// attempt with the reason and without the password, and serves once the router has loaded
/// the phase; it never serves before. Before, `Router::connect` failed as soon as the pool
/// gave up waiting for a connection (10 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_router_starting_while_the_state_store_is_down_waits_for_it_and_then_serves() {
    use tracing::instrument::WithSubscriber;
    let w = World::start_private().await;
    let pg = w.db.private().clone();
    let url = url_with_password(&w);
    pg.stop().await;
    let logged = Logged::default();
    let started = Instant::now();
    let connecting = tokio::spawn(
        async move { Router::connect(&url, "orders", app_config("late-app")).await }
            .with_subscriber(logged.subscriber()),
    );
    // Longer than the pool's own wait for a connection (10 s): the router's patience shows,
    // not the pool's.
    let outage = Duration::from_secs(14);
    tokio::time::sleep(outage).await;
    assert!(
        !connecting.is_finished(),
        "the router waits for the state store: {:?}",
        if connecting.is_finished() {
            Some(connecting.await.unwrap().err())
        } else {
            None
        }
    );
    pg.start_again().await;
    let router = connecting
        .await
        .unwrap()
        .expect("the router starts once the store is back");
    let waited = started.elapsed();
    // It serves, on the phase it loaded, and follows the migration from there.
    assert_eq!(router.snapshot().await.phase, Phase::Planned);
    router
        .insert(doc! { "_id": "late-1", "customerId": HOT, "n": 1 })
        .await
        .unwrap();
    let read = router.get(HOT, "late-1").await.unwrap();
    assert_eq!(read.and_then(|d| d.get_i32("n").ok()), Some(1));
    w.advance(&[&router], &[Phase::DualRead]).await;
    router.shutdown().await;

    let log = logged.text();
    let attempts = log
        .lines()
        .filter(|l| l.contains("WARN") && l.contains("cannot reach the state store"))
        .count();
    assert!(attempts >= 2, "a warning at each attempt: {log}");
    assert!(
        log.contains(&format!("127.0.0.1:{}", pg.port())) && log.contains("late-app"),
        "the warnings name the store and the router: {log}"
    );
    assert!(!log.contains(PASSWORD), "a password in the log: {log}");
    eprintln!(
        "[outage] a router started during a {outage:?} outage: {attempts} warnings, serving \
         {waited:?} after it started; the first: {}",
        log.lines().next().unwrap_or_default()
    );
}

/// With a deadline shorter than the outage, the start fails by the deadline, naming the
/// deadline and the last reason, never the password; with no deadline it fails at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_router_whose_start_deadline_passes_before_the_store_is_back_fails_naming_it() {
    let w = World::start_private().await;
    let pg = w.db.private().clone();
    let url = url_with_password(&w);
    pg.stop().await;

    let mut config = app_config("impatient-app");
    config.connect_deadline = Some(Duration::from_secs(3));
    let started = Instant::now();
    let failed = Router::connect(&url, "orders", config).await.err();
    let took = started.elapsed();
    let Some(e @ RouterError::StoreUnreachable { .. }) = failed else {
        panic!("the start must fail for want of the state store: {failed:?}");
    };
    let message = e.to_string();
    assert!(message.contains("within 3s"), "the deadline: {message}");
    assert!(
        message.contains(&format!(
            "cannot reach the state store postgres://postgres:***@127.0.0.1:{}",
            pg.port()
        )),
        "the last reason: {message}"
    );
    assert!(!message.contains(PASSWORD), "{message}");
    assert!(
        took >= Duration::from_secs(3) && took < Duration::from_secs(6),
        "it gives up by its deadline: {took:?}"
    );

    let mut config = app_config("fail-fast-app");
    config.connect_deadline = None;
    let started = Instant::now();
    let failed = Router::connect(&url, "orders", config).await.err();
    assert!(
        matches!(&failed, Some(RouterError::Store(e)) if e.is_unavailable()),
        "{failed:?}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "one attempt, at once: {:?}",
        started.elapsed()
    );
    pg.start_again().await;
}

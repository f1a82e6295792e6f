//! The backfill against real servers: scope per location, partitions shared by workers,
//! a worker killed mid-partition, overload, permanent refusals and a slow target shard.
//!
//! Each test builds its own world (a fresh state store, SecantusDB servers with the shards as
//! databases, two routing versions from `tests/fixtures/backfill`, a migration moved to
//! `backfill`), seeds the source layout, runs workers, then checks the targets document by
//! document and every partition's ledger (`scanned = inserted + already_present + stamped +
//! dead_lettered`).

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::{Child, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::TryStreamExt;
use mongodb::bson::{doc, Bson, Document};
use mongodb::event::command::CommandEvent;
use mongodb::event::EventHandler;
use mongodb::options::ClientOptions;
use mongodb::{Client, Database};
use reshard::phase::{Action, Phase};
use reshard::routing::{KeyValue, Location, RoutingVersion};
use reshard::settings::MigrationSettings;
use reshard::store::events::EventKind;
use reshard::store::partitions::{Claim, Partition, PartitionState, Task};
use reshard::store::{Store, StoreError};
use reshard::worker::{Worker, WorkerConfig, WorkerSummary};
use serde_json::json;
use support::{MongoServer, PgDb};
use tokio::sync::watch;

const COLLECTION: &str = "orders";
const HOT: &str = "cust-hot";
/// How long any one worker run may take before the test gives up.
const WORKER_TIMEOUT: Duration = Duration::from_secs(300);

// ---------------------------------------------------------------------------------------------
// The world
// ---------------------------------------------------------------------------------------------

/// Which routing versions and how the shards sit on servers.
struct Layout {
    /// `(from, to)` file names in `tests/fixtures/backfill`.
    versions: (&'static str, &'static str),
    /// `(shard, index of its server)`; the shards are databases on these servers.
    shards: Vec<(&'static str, usize)>,
    /// `test_commands` per server (its length is the number of servers).
    test_commands: Vec<bool>,
}

impl Layout {
    /// hot_v1 -> hot_v2: s1..s3 -> s1..s4, all on one server.
    fn hot() -> Layout {
        Layout {
            versions: ("hot_v1.yaml", "hot_v2.yaml"),
            shards: vec![("s1", 0), ("s2", 0), ("s3", 0), ("s4", 0)],
            test_commands: vec![false],
        }
    }

    /// split_v1 -> split_v2: s1, s2 -> s1, s4, s2, s3, all on one server.
    fn split(test_commands: bool) -> Layout {
        Layout {
            versions: ("split_v1.yaml", "split_v2.yaml"),
            shards: vec![("s1", 0), ("s2", 0), ("s3", 0), ("s4", 0)],
            test_commands: vec![test_commands],
        }
    }
}

struct Fixture {
    pg: PgDb,
    servers: Vec<MongoServer>,
    store: Store,
    migration: i64,
    v1: RoutingVersion,
    v2: RoutingVersion,
    /// The shard name -> server index.
    shard_server: BTreeMap<String, usize>,
    /// The shard name -> database name.
    shard_db: BTreeMap<String, String>,
    /// For the workers: `reshard::shards::writer_client` (driver write retries off).
    writer_dbs: BTreeMap<String, Database>,
    /// For seeding and checking.
    dbs: BTreeMap<String, Database>,
}

impl Fixture {
    /// A state store with the layout's shards and versions, and a migration from version 1
    /// to version 2 moved to `backfill` (no router is registered, so the acknowledgement
    /// gates pass).
    async fn start(layout: Layout) -> Fixture {
        let (pg, servers) = tokio::join!(
            PgDb::fresh(),
            futures::future::join_all(layout.test_commands.iter().enumerate().map(|(i, &tc)| {
                MongoServer::builder()
                    .name(format!("m{i}"))
                    .test_commands(tc)
                    .start()
            }))
        );
        let store = Store::connect_unchecked(&pg.url()).await.unwrap();
        store.migrate().await.unwrap();

        let base = MongoServer::database_name();
        let mut writer_clients = Vec::new();
        let mut clients = Vec::new();
        for s in &servers {
            writer_clients.push(reshard::shards::writer_client(&s.uri()).await.unwrap());
            clients.push(s.client().await);
        }
        let mut shard_server = BTreeMap::new();
        let mut shard_db = BTreeMap::new();
        let mut writer_dbs = BTreeMap::new();
        let mut dbs = BTreeMap::new();
        for &(name, server) in &layout.shards {
            let database = format!("{base}_{name}");
            store
                .add_shard(name, &servers[server].uri(), &database)
                .await
                .unwrap();
            shard_server.insert(name.to_owned(), server);
            shard_db.insert(name.to_owned(), database.clone());
            writer_dbs.insert(name.to_owned(), writer_clients[server].database(&database));
            dbs.insert(name.to_owned(), clients[server].database(&database));
        }

        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/backfill");
        let mut versions = Vec::new();
        for file in [layout.versions.0, layout.versions.1] {
            let text = std::fs::read_to_string(dir.join(file)).unwrap();
            let v = reshard::spec::parse_version_spec(file, &text, COLLECTION)
                .unwrap_or_else(|e| panic!("{file}: {e:?}"));
            versions.push(
                store
                    .insert_version(&v, &text, "test")
                    .await
                    .unwrap()
                    .version,
            );
        }
        let v2 = versions.pop().unwrap();
        let v1 = versions.pop().unwrap();
        let migration = store
            .create_migration(COLLECTION, v1.version, v2.version, "test")
            .await
            .unwrap()
            .id;
        for phase in [
            Phase::DualRead,
            Phase::WriteSwitch,
            Phase::NewWrites,
            Phase::Backfill,
        ] {
            store
                .transition(migration, &Action::Advance(phase), "test", None, false)
                .await
                .unwrap_or_else(|e| panic!("advancing to {phase:?}: {e}"));
        }
        Fixture {
            pg,
            servers,
            store,
            migration,
            v1,
            v2,
            shard_server,
            shard_db,
            writer_dbs,
            dbs,
        }
    }

    fn server_of(&self, shard: &str) -> &MongoServer {
        &self.servers[self.shard_server[shard]]
    }

    async fn settings(&self, change: impl FnOnce(&mut MigrationSettings)) {
        self.store
            .update_settings(self.migration, change, "test", Some("test setup"))
            .await
            .unwrap();
    }

    fn config(&self, name: &str, concurrency: usize) -> WorkerConfig {
        let mut cfg = WorkerConfig::new(name);
        cfg.migration = Some(self.migration);
        cfg.concurrency = concurrency;
        cfg.exit_when_done = true;
        cfg.lease_ttl = Duration::from_secs(3);
        cfg.idle_poll = Duration::from_millis(500);
        cfg
    }

    fn worker(&self, cfg: WorkerConfig) -> Worker {
        Worker::with_shards(self.store.clone(), self.writer_dbs.clone(), cfg)
    }

    /// Runs one in-process worker until the backfill is done.
    async fn run_worker(&self, cfg: WorkerConfig) -> WorkerSummary {
        run_to_end(self.worker(cfg)).await
    }

    async fn partitions(&self) -> Vec<Partition> {
        self.store
            .partitions(self.migration, Task::Backfill)
            .await
            .unwrap()
    }

    async fn epoch(&self) -> i64 {
        self.store.migration(self.migration).await.unwrap().epoch
    }

    async fn event_kinds(&self) -> Vec<String> {
        self.store
            .events(self.migration)
            .await
            .unwrap()
            .into_iter()
            .map(|e| e.kind.to_string())
            .collect()
    }

    async fn count(&self, location: &Location) -> u64 {
        self.dbs[&location.shard]
            .collection::<Document>(&location.collection)
            .count_documents(doc! {})
            .await
            .unwrap()
    }

    fn cli(&self, args: &[&str]) -> std::process::Output {
        support::bin(&self.pg).args(args).output().unwrap()
    }
}

/// Runs `worker` to its end (it must have `exit_when_done`), keeping its shutdown channel
/// open: a closed channel reads as a shutdown request.
async fn run_to_end(worker: Worker) -> WorkerSummary {
    let (_stop, shutdown) = watch::channel(false);
    tokio::time::timeout(WORKER_TIMEOUT, worker.run(shutdown))
        .await
        .expect("the worker did not finish in time")
        .expect("the worker failed")
}

// ---------------------------------------------------------------------------------------------
// Seeding
// ---------------------------------------------------------------------------------------------

/// `hot` documents of [`HOT`], then `tenants` other tenants with `per_tenant` documents each.
/// Ids are unique across tenants. With `bucket`, each carries `bucket: 0` as the v1 layout
/// (routing field `bucket`, one bucket per tenant) writes it.
fn make_docs(hot: usize, tenants: usize, per_tenant: usize, bucket: bool) -> Vec<Document> {
    let mut docs = Vec::with_capacity(hot + tenants * per_tenant);
    let mut n = 0_usize;
    let mut push = |tenant: String| {
        let mut d = doc! {
            "_id": format!("o-{n:06}"),
            "customerId": tenant,
            "total": (n % 997) as i32,
            "status": if n.is_multiple_of(3) { "open" } else { "paid" },
            "lines": [ { "sku": format!("sku-{}", n % 41), "qty": (n % 5) as i32 + 1 } ],
        };
        if bucket {
            d.insert("bucket", 0_i32);
        }
        docs.push(d);
        n += 1;
    };
    for _ in 0..hot {
        push(HOT.to_owned());
    }
    for t in 0..tenants {
        for _ in 0..per_tenant {
            push(format!("cust-{t:04}"));
        }
    }
    docs
}

fn id_of(d: &Document) -> &str {
    d.get_str("_id").unwrap()
}

fn tenant_of(d: &Document) -> &str {
    d.get_str("customerId").unwrap()
}

/// Where `version` places `d`, and its sub-bucket.
fn place(version: &RoutingVersion, d: &Document) -> (Location, u32) {
    let located = version
        .locate(
            &KeyValue::String(tenant_of(d).to_owned()),
            &KeyValue::String(id_of(d).to_owned()),
        )
        .unwrap();
    assert_eq!(located.locations.len(), 1);
    (located.locations[0].clone(), located.sub_bucket)
}

/// Inserts each document at its source (v1) location.
async fn seed(fx: &Fixture, docs: &[Document]) {
    let mut by_location: BTreeMap<Location, Vec<Document>> = BTreeMap::new();
    for d in docs {
        by_location
            .entry(place(&fx.v1, d).0)
            .or_default()
            .push(d.clone());
    }
    for (location, docs) in by_location {
        let coll = fx.dbs[&location.shard].collection::<Document>(&location.collection);
        for chunk in docs.chunks(2_000) {
            coll.insert_many(chunk.to_vec()).await.unwrap();
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Expectations and checks
// ---------------------------------------------------------------------------------------------

/// What the backfill should do with the seeded documents, worked out from the versions alone.
#[derive(Debug, Default)]
struct Expect {
    /// Documents whose target location differs from their source location.
    moved: u64,
    /// Documents that stay and get the routing field stamped.
    stamped: u64,
    /// Documents the scan should read, by source shard.
    in_scope: BTreeMap<String, u64>,
}

impl Expect {
    fn scanned(&self) -> u64 {
        self.in_scope.values().sum()
    }
}

/// `full_scan`: source shards scanned whole; elsewhere only `changed` tenants are read.
fn expect(fx: &Fixture, docs: &[Document], full_scan: &[&str], changed: &[&str]) -> Expect {
    let mut e = Expect::default();
    for shard in fx.v1.shards() {
        e.in_scope.insert(shard, 0);
    }
    let field = fx.v2.routing_field();
    for d in docs {
        let (from, _) = place(&fx.v1, d);
        let (to, sub) = place(&fx.v2, d);
        let in_scope = full_scan.contains(&from.shard.as_str()) || changed.contains(&tenant_of(d));
        if in_scope {
            *e.in_scope.get_mut(&from.shard).unwrap() += 1;
        }
        if from != to {
            assert!(in_scope, "{} moves but the test scope misses it", id_of(d));
            e.moved += 1;
        } else if let Some(field) = field {
            if d.get(field) != Some(&Bson::Int32(sub as i32)) {
                assert!(in_scope, "{} needs stamping but is out of scope", id_of(d));
                e.stamped += 1;
            }
        }
    }
    e
}

fn without(d: &Document, fields: &[&str]) -> Document {
    let mut d = d.clone();
    for f in fields {
        d.remove(*f);
    }
    d
}

/// Every document of every location of either version, by location and `_id`.
async fn read_all(fx: &Fixture) -> BTreeMap<Location, BTreeMap<String, Document>> {
    let locations: BTreeSet<Location> = fx
        .v1
        .locations()
        .into_iter()
        .chain(fx.v2.locations())
        .collect();
    let mut all = BTreeMap::new();
    for location in locations {
        let docs: Vec<Document> = fx.dbs[&location.shard]
            .collection::<Document>(&location.collection)
            .find(doc! {})
            .await
            .unwrap()
            .try_collect()
            .await
            .unwrap();
        let mut by_id = BTreeMap::new();
        for d in docs {
            let id = id_of(&d).to_owned();
            assert!(
                by_id.insert(id.clone(), d).is_none(),
                "{location} holds _id {id} twice"
            );
        }
        all.insert(location, by_id);
    }
    all
}

/// Checks the targets document by document: a moved document is at its target location as a
/// copy (routing field = sub-bucket, `_reshard: {src: "copy", epoch, rev: 0}`, every other
/// field as in the source) and still at its source untouched; a document that stays is
/// unchanged apart from a stamped routing field; no location holds anything else. Documents
/// in `refused` must not have been copied.
async fn verify_targets(fx: &Fixture, docs: &[Document], refused: &BTreeSet<String>) {
    let epoch = fx.epoch().await;
    let field = fx.v2.routing_field();
    let mut ignore = vec!["_reshard"];
    ignore.extend(field);
    let all = read_all(fx).await;
    let mut expected: BTreeMap<&Location, BTreeSet<&str>> =
        all.keys().map(|l| (l, BTreeSet::new())).collect();
    let mut problems = Vec::new();
    for d in docs {
        let id = id_of(d);
        let (from, _) = place(&fx.v1, d);
        let (to, sub) = place(&fx.v2, d);
        expected.get_mut(&from).unwrap().insert(id);
        let at_source = all[&from].get(id);
        if from == to {
            match at_source {
                None => problems.push(format!("{id} (stays at {from}) is gone")),
                Some(s) => {
                    if without(s, &ignore) != without(d, &ignore) {
                        problems.push(format!("{id} at {from} changed: {s} (seeded {d})"));
                    }
                    if s.contains_key("_reshard") {
                        problems.push(format!("{id} at {from} stays but got _reshard: {s}"));
                    }
                    if let Some(f) = field {
                        if s.get(f) != Some(&Bson::Int32(sub as i32)) {
                            problems.push(format!("{id} at {from}: {f} should be {sub}: {s}"));
                        }
                    }
                }
            }
            continue;
        }
        if at_source != Some(d) {
            problems.push(format!(
                "{id}: source copy at {from} changed: {at_source:?}"
            ));
        }
        let copy = all[&to].get(id);
        if refused.contains(id) {
            if copy.is_some() {
                problems.push(format!("{id} was refused but is at {to}"));
            }
            continue;
        }
        expected.get_mut(&to).unwrap().insert(id);
        let Some(copy) = copy else {
            problems.push(format!("{id} is missing at {to} (from {from})"));
            continue;
        };
        if without(copy, &ignore) != without(d, &ignore) {
            problems.push(format!("{id} at {to} differs: {copy} (seeded {d})"));
        }
        if let Some(f) = field {
            if copy.get(f) != Some(&Bson::Int32(sub as i32)) {
                problems.push(format!("{id} at {to}: {f} should be {sub}: {copy}"));
            }
        }
        let meta = copy.get_document("_reshard").ok();
        let want = doc! { "src": "copy", "epoch": epoch, "rev": 0_i64 };
        if meta != Some(&want) {
            problems.push(format!("{id} at {to}: _reshard is {meta:?}, want {want}"));
        }
    }
    for (location, ids) in &expected {
        let present = &all[*location];
        if present.len() != ids.len() {
            problems.push(format!(
                "{location} holds {} documents, expected {}",
                present.len(),
                ids.len()
            ));
        }
        for id in present.keys() {
            if !ids.contains(id.as_str()) {
                problems.push(format!("{location} holds unexpected _id {id}"));
            }
        }
    }
    if !problems.is_empty() {
        let n = problems.len();
        problems.truncate(20);
        panic!(
            "{n} problem(s) in the targets, first ones:\n{}",
            problems.join("\n")
        );
    }
}

/// Every partition done, with a ledger that balances.
fn check_ledgers(partitions: &[Partition]) {
    assert!(!partitions.is_empty(), "no partitions were planned");
    for p in partitions {
        assert_eq!(p.state, PartitionState::Done, "partition {p:?}");
        assert_eq!(
            p.scanned,
            p.inserted + p.already_present + p.stamped + p.dead_lettered,
            "ledger of partition {} ({}/{}) does not balance: {p:?}",
            p.id,
            p.source_shard,
            p.source_collection
        );
    }
}

fn scanned_by_shard(partitions: &[Partition]) -> BTreeMap<String, u64> {
    let mut m = BTreeMap::new();
    for p in partitions {
        *m.entry(p.source_shard.clone()).or_insert(0) += p.scanned as u64;
    }
    m
}

fn sum(partitions: &[Partition], f: impl Fn(&Partition) -> i64) -> u64 {
    partitions.iter().map(|p| f(p) as u64).sum()
}

/// Scanned per source shard equals the expected scope (shards without partitions scan 0).
fn check_scope(partitions: &[Partition], e: &Expect) {
    let scanned = scanned_by_shard(partitions);
    for (shard, want) in &e.in_scope {
        assert_eq!(
            scanned.get(shard).copied().unwrap_or(0),
            *want,
            "documents scanned on {shard} (all: {scanned:?}, expected: {:?})",
            e.in_scope
        );
    }
}

// ---------------------------------------------------------------------------------------------
// Tests
// ---------------------------------------------------------------------------------------------

/// Three source shards to four, a hot tenant going from 1 to 16 buckets and many tenants
/// that do not change: the scope per location, the copies, the stamps and the ledgers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hot_tenant_and_new_shard_copy_exactly_what_moves() {
    let started = Instant::now();
    let fx = Fixture::start(Layout::hot()).await;
    // 30,000 documents: 6,000 of the hot tenant, 600 tenants x 40.
    let docs = make_docs(6_000, 600, 40, true);
    assert!(docs.len() >= 30_000);
    // The fixture's premise: the hot tenant lives on s2 in v1, so the scope that reads only
    // changed tenants has something to read.
    let hot_home = place(&fx.v1, &docs[0]).0;
    assert_eq!(
        hot_home.shard, "s2",
        "hot_v1.yaml places {HOT} on {hot_home}"
    );
    seed(&fx, &docs).await;
    let e = expect(&fx, &docs, &["s1"], &[HOT]);
    eprintln!(
        "seeded {} documents in {:?}: {e:?}",
        docs.len(),
        started.elapsed()
    );
    assert!(e.moved > 1_000 && e.stamped > 0, "{e:?}");

    fx.settings(|s| {
        s.max_docs_per_sec = 200_000.0;
        s.documents_per_partition = Some(4_000);
    })
    .await;
    let copy_started = Instant::now();
    // A lease long enough for a loaded machine: the local server answers nothing for seconds
    // while it sorts a range for a scan's first batch, and a write that outlives its lease is
    // given up (what this test counts exactly assumes no pass was given up).
    let mut cfg = fx.config("w1", 2);
    cfg.lease_ttl = Duration::from_secs(15);
    let summary = fx.run_worker(cfg).await;
    eprintln!("backfill: {summary:?} in {:?}", copy_started.elapsed());

    let partitions = fx.partitions().await;
    check_ledgers(&partitions);
    // s1 gives vbuckets [300, 342) to s4: scanned whole. s2 and s3 keep all their vbuckets:
    // only the hot tenant is read there.
    for p in &partitions {
        match p.source_shard.as_str() {
            "s1" => assert_eq!(p.tenant_filter, None, "{p:?}"),
            "s2" | "s3" => {
                let filter = p.tenant_filter.as_ref().unwrap_or_else(|| panic!("{p:?}"));
                assert!(filter.to_string().contains(HOT), "{filter}");
                assert!(!filter.to_string().contains("cust-0"), "{filter}");
            }
            other => panic!("partition on {other}, which is no source: {p:?}"),
        }
    }
    assert!(partitions.iter().any(|p| p.source_shard == "s2"));
    assert!(partitions.iter().filter(|p| p.source_shard == "s1").count() >= 2);
    check_scope(&partitions, &e);
    let on_s1 = docs
        .iter()
        .filter(|d| place(&fx.v1, d).0.shard == "s1")
        .count() as u64;
    assert_eq!(e.in_scope["s1"], on_s1);
    assert_eq!(e.in_scope["s2"], 6_000);

    let t = fx
        .store
        .task_totals(fx.migration, Task::Backfill)
        .await
        .unwrap();
    assert_eq!(t.done, t.partitions);
    assert_eq!(t.scanned as u64, e.scanned());
    assert_eq!(t.dead_lettered, 0);
    // A pass given up wrote copies no checkpoint recorded: the pass that took over finds them
    // present. The split moves then; the sum and the targets' contents do not.
    assert_eq!(
        (t.inserted + t.stamped + t.already_present) as u64,
        e.scanned(),
        "{t:?}"
    );
    assert!(t.inserted as u64 <= e.moved, "{t:?}");
    assert!(t.stamped as u64 <= e.stamped, "{t:?}");
    if summary.leases_lost == 0 {
        assert_eq!(t.inserted as u64, e.moved, "{t:?}");
        assert_eq!(t.stamped as u64, e.stamped, "{t:?}");
        assert_eq!(summary.partitions_done as i64, t.partitions);
    }

    verify_targets(&fx, &docs, &BTreeSet::new()).await;
    assert!(fx
        .event_kinds()
        .await
        .contains(&"backfill_planned".to_owned()));
    fx.store
        .transition(
            fx.migration,
            &Action::Advance(Phase::Reconcile),
            "test",
            None,
            false,
        )
        .await
        .expect("the backfill_complete gate should open");
    eprintln!("total {:?}", started.elapsed());
}

/// Two workers at once share the partitions: each partition is done exactly once, nothing is
/// scanned twice, nothing is copied twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_workers_share_the_partitions() {
    let fx = Fixture::start(Layout::hot()).await;
    let docs = make_docs(1_500, 150, 30, true);
    seed(&fx, &docs).await;
    let e = expect(&fx, &docs, &["s1"], &[HOT]);
    // Slow enough that both workers are in before the work runs out.
    fx.settings(|s| {
        s.max_docs_per_sec = 1_000.0;
        s.batch_size = 100;
        s.documents_per_partition = Some(300);
    })
    .await;

    let w1 = fx.worker(fx.config("w1", 2));
    let w2 = fx.worker(fx.config("w2", 2));
    let (a, b) = tokio::join!(tokio::spawn(run_to_end(w1)), tokio::spawn(run_to_end(w2)));
    let (a, b) = (a.unwrap(), b.unwrap());

    let partitions = fx.partitions().await;
    assert!(partitions.len() >= 8, "{} partitions", partitions.len());
    check_ledgers(&partitions);
    for p in &partitions {
        assert_eq!(
            p.attempts, 1,
            "partition {} was claimed more than once: {p:?}",
            p.id
        );
    }
    let owners: BTreeSet<_> = partitions
        .iter()
        .filter_map(|p| p.lease_owner.clone())
        .collect();
    assert_eq!(
        owners,
        BTreeSet::from(["w1".to_owned(), "w2".to_owned()]),
        "both workers should have finished partitions"
    );
    assert_eq!(
        a.partitions_done + b.partitions_done,
        partitions.len() as u64
    );
    assert_eq!((a.leases_lost, b.leases_lost), (0, 0));
    check_scope(&partitions, &e);
    assert_eq!(sum(&partitions, |p| p.inserted), e.moved);
    assert_eq!(sum(&partitions, |p| p.stamped), e.stamped);
    assert_eq!(
        sum(&partitions, |p| p.already_present),
        e.scanned() - e.moved - e.stamped
    );
    verify_targets(&fx, &docs, &BTreeSet::new()).await;
}

/// Kills the child process on drop (a failed test must not leave a worker running).
struct ChildGuard(Child);

impl Drop for ChildGuard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A `reshard worker` process is SIGKILLed in the middle of a partition; a second worker
/// takes its leases over when they expire and resumes from the checkpoints.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_worker_is_taken_over_from_its_checkpoints() {
    let fx = Fixture::start(Layout::hot()).await;
    let docs = make_docs(2_000, 200, 25, true);
    seed(&fx, &docs).await;
    let e = expect(&fx, &docs, &["s1"], &[HOT]);
    fx.settings(|s| {
        s.max_docs_per_sec = 1_000.0;
        s.batch_size = 100;
        s.documents_per_partition = Some(1_000);
    })
    .await;

    let log = tempfile::NamedTempFile::new().unwrap();
    let child = std::process::Command::new(env!("CARGO_BIN_EXE_reshard"))
        .env("RESHARD_DATABASE_URL", fx.pg.url())
        .env("RESHARD_LOG", "info")
        .args(["worker", &fx.migration.to_string()])
        .args([
            "--concurrency",
            "2",
            "--exit-when-done",
            "--lease-ttl",
            "3s",
        ])
        .args(["--name", "doomed"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log.reopen().unwrap())
        .spawn()
        .unwrap();
    let mut child = ChildGuard(child);
    let log_tail = || {
        let bytes = std::fs::read(log.path()).unwrap_or_default();
        String::from_utf8_lossy(&bytes[bytes.len().saturating_sub(4_000)..]).into_owned()
    };

    // Wait for a checkpoint in a partition that is not finished.
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        if let Ok(Some(status)) = child.0.try_wait() {
            panic!(
                "the worker exited ({status}) before it was killed:\n{}",
                log_tail()
            );
        }
        assert!(
            Instant::now() < deadline,
            "no checkpoint seen:\n{}",
            log_tail()
        );
        let partitions = fx.partitions().await;
        if partitions
            .iter()
            .any(|p| p.state == PartitionState::Leased && p.scanned > 0)
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    child.0.kill().unwrap(); // SIGKILL
    child.0.wait().unwrap();
    let at_kill = fx.partitions().await;
    let done_at_kill = at_kill
        .iter()
        .filter(|p| p.state == PartitionState::Done)
        .count();
    let scanned_at_kill = sum(&at_kill, |p| p.scanned);
    eprintln!(
        "killed with {done_at_kill}/{} partitions done, {scanned_at_kill} documents scanned",
        at_kill.len()
    );
    assert!(
        done_at_kill < at_kill.len(),
        "everything was done before the kill"
    );
    assert!(scanned_at_kill > 0);
    let orphaned: Vec<i64> = at_kill
        .iter()
        .filter(|p| p.state == PartitionState::Leased)
        .map(|p| p.id)
        .collect();
    assert!(!orphaned.is_empty());

    // Full speed for the rest, through the CLI.
    let out = fx.cli(&[
        "throttle",
        "set",
        &fx.migration.to_string(),
        "--max-docs-per-sec",
        "200000",
        "--reason",
        "test: finish quickly",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let m = fx.store.migration(fx.migration).await.unwrap();
    assert_eq!(
        m.settings["max_docs_per_sec"],
        json!(200_000.0),
        "{}",
        m.settings
    );
    let summary = fx.run_worker(fx.config("rescuer", 2)).await;
    eprintln!("rescuer: {summary:?}");

    let partitions = fx.partitions().await;
    check_ledgers(&partitions);
    for p in partitions.iter().filter(|p| orphaned.contains(&p.id)) {
        assert!(
            p.attempts >= 2,
            "partition {} was not taken over: {p:?}",
            p.id
        );
        assert_eq!(p.lease_owner.as_deref(), Some("rescuer"), "{p:?}");
    }
    // Resumed from the checkpoints: no document is counted twice or skipped.
    check_scope(&partitions, &e);
    let inserted = sum(&partitions, |p| p.inserted);
    assert!(
        inserted <= e.moved,
        "{inserted} inserted, {} moved",
        e.moved
    );
    assert_eq!(sum(&partitions, |p| p.dead_lettered), 0);
    verify_targets(&fx, &docs, &BTreeSet::new()).await;
}

/// Counts the `insert` commands that failed, and wakes whoever waits for one.
#[derive(Default)]
struct FailedInserts {
    count: AtomicU64,
    notify: tokio::sync::Notify,
}

/// Target shards shed load on about one insert command in five (code 489 with the
/// `SystemOverloadedError` label only, so the driver does not retry by itself): the backfill
/// finishes without dead letters, cuts its rate and says so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overload_cuts_the_rate_and_loses_nothing() {
    let fx = Fixture::start(Layout::split(true)).await;
    let docs = make_docs(0, 120, 10, false);
    seed(&fx, &docs).await;
    let e = expect(&fx, &docs, &["s1", "s2"], &[]);
    fx.settings(|s| {
        s.max_docs_per_sec = 600.0;
        s.batch_size = 50;
        s.documents_per_partition = Some(400);
        s.capacity_signal_after_secs = 1;
    })
    .await;

    // The worker's connections as `writer_client` makes them, plus command monitoring.
    let failed = Arc::new(FailedInserts::default());
    let server = &fx.servers[0];
    let mut options = ClientOptions::parse(server.uri()).await.unwrap();
    reshard::shards::writer::disable_driver_write_retries(&mut options);
    options.app_name = Some("reshard".into());
    let seen = failed.clone();
    options.command_event_handler = Some(EventHandler::callback(move |event| {
        if let CommandEvent::Failed(f) = event {
            if f.command_name == "insert" {
                seen.count.fetch_add(1, Ordering::SeqCst);
                seen.notify.notify_one();
            }
        }
    }));
    let client = Client::with_options(options).unwrap();
    let dbs: BTreeMap<String, Database> = fx
        .shard_db
        .iter()
        .map(|(shard, db)| (shard.clone(), client.database(db)))
        .collect();

    // Arm "let 4 inserts pass, fail the 5th"; re-arm as soon as it fired.
    let arm = || {
        server.fail_command(json!({
            "mode": {"skip": 4, "times": 1},
            "data": {
                "failCommands": ["insert"],
                "errorCode": 489,
                "errorLabels": ["SystemOverloadedError"],
            },
        }))
    };
    let stop = Arc::new(AtomicBool::new(false));
    let rearm = async {
        arm().await;
        while !stop.load(Ordering::SeqCst) {
            let fired = tokio::time::timeout(Duration::from_millis(200), failed.notify.notified());
            if fired.await.is_ok() {
                arm().await;
            }
        }
        server.clear_failpoint().await;
    };
    let worker = Worker::with_shards(fx.store.clone(), dbs, fx.config("w1", 2));
    let work = async {
        let summary = run_to_end(worker).await;
        stop.store(true, Ordering::SeqCst);
        summary
    };
    let started = Instant::now();
    let (summary, ()) = tokio::join!(work, rearm);
    let failures = failed.count.load(Ordering::SeqCst);
    eprintln!(
        "{summary:?} in {:?}; {failures} insert commands failed",
        started.elapsed()
    );
    assert!(failures >= 3, "the failpoint fired {failures} times");

    assert!(fx
        .store
        .dead_letters(fx.migration, true)
        .await
        .unwrap()
        .is_empty());
    let partitions = fx.partitions().await;
    check_ledgers(&partitions);
    check_scope(&partitions, &e);
    assert_eq!(sum(&partitions, |p| p.inserted), e.moved);
    assert_eq!(sum(&partitions, |p| p.dead_lettered), 0);
    verify_targets(&fx, &docs, &BTreeSet::new()).await;

    let workers = fx.store.workers(fx.migration).await.unwrap();
    let overloads: i64 = workers.iter().map(|w| w.overloads).sum();
    let cuts: i64 = workers.iter().map(|w| w.rate_cuts).sum();
    assert!(overloads > 0, "workers: {workers:?}");
    assert!(cuts > 0, "workers: {workers:?}");
    let kinds = fx.event_kinds().await;
    assert!(kinds.contains(&"rate_cut".to_owned()), "events: {kinds:?}");
    assert!(
        kinds.contains(&"capacity_signal".to_owned()),
        "events: {kinds:?}"
    );

    // The operator sees the same in `migration status`.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_reshard"))
        .env("RESHARD_DATABASE_URL", fx.pg.url())
        .args([
            "migration",
            "status",
            &fx.migration.to_string(),
            "--output",
            "json",
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let status: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let throttle = &status["throttle"];
    assert_eq!(throttle["overloads"].as_i64(), Some(overloads), "{status}");
    assert_eq!(throttle["rate_cuts"].as_i64(), Some(cuts), "{status}");
    assert!(throttle["retries"].as_i64().unwrap() > 0, "{status}");
    assert!(
        throttle["capacity_signals"].as_u64().unwrap() > 0,
        "{status}"
    );
    assert_eq!(
        status["backfill"]["documents_copied"].as_u64(),
        Some(e.moved),
        "{status}"
    );
    assert_eq!(status["backfill"]["eta_secs"], 0, "{status}");
}

/// A target collection's validator refuses a few copies for good (code 121): they become dead
/// letters with the code and message, the reconcile gate stays closed until an operator
/// skips them with a reason, and the reason is in the event log.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_copies_become_dead_letters_that_hold_the_gate() {
    let fx = Fixture::start(Layout::split(false)).await;
    let mut docs = make_docs(0, 60, 10, false);
    // Three documents that move from s1 to s4 carry a total the target refuses.
    let mut refused = BTreeSet::new();
    for d in docs.iter_mut() {
        if refused.len() < 3 && place(&fx.v2, d).0.shard == "s4" {
            d.insert("total", "n/a");
            refused.insert(id_of(d).to_owned());
        }
    }
    assert_eq!(refused.len(), 3);
    seed(&fx, &docs).await;
    let e = expect(&fx, &docs, &["s1", "s2"], &[]);
    let s4 = &fx.dbs["s4"];
    s4.create_collection(COLLECTION).await.unwrap();
    s4.run_command(doc! {
        "collMod": COLLECTION,
        "validator": { "$jsonSchema": { "properties": { "total": { "bsonType": "int" } } } },
        "validationAction": "error",
    })
    .await
    .unwrap();
    fx.settings(|s| {
        s.max_docs_per_sec = 100_000.0;
        s.batch_size = 100;
        s.documents_per_partition = Some(200);
    })
    .await;

    fx.run_worker(fx.config("w1", 2)).await;

    let partitions = fx.partitions().await;
    check_ledgers(&partitions);
    check_scope(&partitions, &e);
    assert_eq!(sum(&partitions, |p| p.dead_lettered), 3);
    assert_eq!(sum(&partitions, |p| p.inserted), e.moved - 3);
    let letters = fx.store.dead_letters(fx.migration, false).await.unwrap();
    let ids: BTreeSet<String> = letters.iter().map(|d| d.doc_id_text.clone()).collect();
    assert_eq!(ids, refused, "{letters:?}");
    for d in &letters {
        assert_eq!(d.code, Some(121), "{d:?}");
        assert!(!d.message.is_empty(), "{d:?}");
        assert_eq!(d.target.as_deref(), Some("s4/orders"), "{d:?}");
        assert_eq!(d.source_shard.as_deref(), Some("s1"), "{d:?}");
        assert_eq!(
            d.status,
            reshard::store::dead_letters::DeadLetterStatus::Open
        );
    }
    verify_targets(&fx, &docs, &refused).await;

    // The gate holds while a dead letter is open.
    match fx
        .store
        .transition(
            fx.migration,
            &Action::Advance(Phase::Reconcile),
            "test",
            None,
            false,
        )
        .await
    {
        Err(StoreError::GateClosed { detail, .. }) => {
            assert!(detail.contains("dead letter"), "{detail}")
        }
        other => panic!("the gate should be closed by the dead letters: {other:?}"),
    }

    let id = fx.migration.to_string();
    let out = fx.cli(&["--output", "json", "deadletter", "list", &id]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let listed: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let listed: BTreeSet<String> = listed
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["id_text"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(listed, refused);

    let reason = "schema refuses string totals; fixed by hand in the target";
    let mut skipped = refused.iter();
    let first = skipped.next().unwrap();
    let out = fx.cli(&["deadletter", "skip", &id, "--id", first, "--reason", reason]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // One still open: still closed.
    assert!(matches!(
        fx.store
            .transition(
                fx.migration,
                &Action::Advance(Phase::Reconcile),
                "test",
                None,
                true
            )
            .await,
        Err(StoreError::GateClosed { .. })
    ));
    for doc_id in skipped {
        let out = fx.cli(&[
            "deadletter",
            "skip",
            &id,
            "--id",
            doc_id,
            "--reason",
            reason,
        ]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    assert!(fx
        .store
        .dead_letters(fx.migration, false)
        .await
        .unwrap()
        .is_empty());
    fx.store
        .transition(
            fx.migration,
            &Action::Advance(Phase::Reconcile),
            "test",
            None,
            false,
        )
        .await
        .expect("the gate should open once every dead letter is skipped");

    let events = fx.store.events(fx.migration).await.unwrap();
    let skips: Vec<_> = events
        .iter()
        .filter(|e| e.kind == EventKind::DeadletterSkipped)
        .collect();
    assert_eq!(skips.len(), 3, "{events:?}");
    for e in skips {
        assert_eq!(e.reason.as_deref(), Some(reason), "{e:?}");
    }
    // Each checkpoint that recorded dead letters is an event naming them.
    let recorded: u64 = events
        .iter()
        .filter(|e| e.kind == EventKind::DeadLettered)
        .map(|e| {
            assert!(
                e.details["first_ids"]
                    .as_array()
                    .is_some_and(|a| !a.is_empty()),
                "{e:?}"
            );
            assert!(e.reason.is_some(), "{e:?}");
            e.details["documents"].as_u64().unwrap()
        })
        .sum();
    assert_eq!(recorded, 3, "{events:?}");
}

/// One target shard answers every insert slowly (its own server, `blockConnection`): the
/// partitions whose copies go elsewhere finish while those writing to it are still going.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_target_shard_slows_only_the_copies_to_it() {
    // s4, the only target of s1's moves, on its own server; everything else on another.
    let fx = Fixture::start(Layout {
        versions: ("split_v1.yaml", "split_v2.yaml"),
        shards: vec![("s1", 0), ("s2", 0), ("s3", 0), ("s4", 1)],
        test_commands: vec![false, true],
    })
    .await;
    let docs = make_docs(0, 200, 10, false);
    seed(&fx, &docs).await;
    let e = expect(&fx, &docs, &["s1", "s2"], &[]);
    fx.settings(|s| {
        s.max_docs_per_sec = 100_000.0;
        s.batch_size = 100;
        s.documents_per_partition = Some(500);
    })
    .await;
    let to = |shard: &str| {
        docs.iter()
            .filter(|d| place(&fx.v2, d).0.shard == shard && place(&fx.v1, d).0.shard != shard)
            .count() as u64
    };
    let (to_s3, to_s4) = (to("s3"), to("s4"));
    assert_eq!(to_s3 + to_s4, e.moved);
    assert!(to_s3 > 300 && to_s4 > 300, "{to_s3} {to_s4}");

    fx.server_of("s4")
        .fail_command(json!({
            "mode": "alwaysOn",
            "data": {"failCommands": ["insert"], "blockConnection": true, "blockTimeMS": 1000},
        }))
        .await;
    // Every partition runs at once; s1's (ordered first) write to the slow shard.
    let worker = fx.worker(fx.config("w1", 8));
    let (s3, s4) = (fx.v2.location_on("s3"), fx.v2.location_on("s4"));
    let done = AtomicBool::new(false);
    let work = async {
        let summary = run_to_end(worker).await;
        done.store(true, Ordering::SeqCst);
        summary
    };
    // What the poller saw: s2's partitions all done while one of s1's was not, and s3 complete
    // while s4 was not.
    let observe = async {
        let mut fast_first = None;
        let mut s3_first = None;
        while !done.load(Ordering::SeqCst) {
            let partitions = fx.partitions().await;
            let all_done = |shard: &str| {
                let of: Vec<_> = partitions
                    .iter()
                    .filter(|p| p.source_shard == shard)
                    .collect();
                !of.is_empty() && of.iter().all(|p| p.state == PartitionState::Done)
            };
            if fast_first.is_none() && all_done("s2") {
                fast_first = Some(!all_done("s1"));
            }
            let (n3, n4) = (fx.count(&s3).await, fx.count(&s4).await);
            if s3_first.is_none() && n3 == to_s3 {
                s3_first = Some((n4 < to_s4, n4));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        (fast_first, s3_first)
    };
    let (summary, (fast_first, s3_first)) = tokio::join!(work, observe);
    fx.server_of("s4").clear_failpoint().await;
    eprintln!("{summary:?}; s2 done first: {fast_first:?}; s3 complete first: {s3_first:?}");

    let partitions = fx.partitions().await;
    check_ledgers(&partitions);
    assert!(partitions.iter().filter(|p| p.source_shard == "s1").count() >= 2);
    assert_eq!(
        fast_first,
        Some(true),
        "s2's partitions (copies to s3) should finish while s1's (copies to the slow s4) run"
    );
    let (s4_behind, n4) = s3_first.expect("s3 was never seen complete");
    assert!(
        s4_behind,
        "s3 got all {to_s3} copies only when s4 had {n4} of {to_s4}"
    );
    check_scope(&partitions, &e);
    assert_eq!(sum(&partitions, |p| p.inserted), e.moved);
    verify_targets(&fx, &docs, &BTreeSet::new()).await;
}

/// `reshard worker ID --exit-when-done` at the default log level (no `RESHARD_LOG`) says what
/// it claimed, took over (and from whom) and finished (with the ledger), and a progress line
/// about every 10 s, and nothing per batch or per document.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_logs_claims_takeovers_finishes_and_progress_at_the_default_level() {
    let fx = Fixture::start(Layout::hot()).await;
    let docs = make_docs(600, 30, 10, true);
    seed(&fx, &docs).await;
    let e = expect(&fx, &docs, &["s1"], &[HOT]);
    let scanned = e.scanned();
    // Slow enough for a progress line (about 14 s), in batches of 10 over about 8 partitions.
    let rate = scanned as f64 / 14.0;
    fx.settings(|s| {
        s.max_docs_per_sec = rate;
        s.batch_size = 10;
        s.documents_per_partition = Some((scanned / 8).max(1));
    })
    .await;

    let log = tempfile::NamedTempFile::new().unwrap();
    let child = std::process::Command::new(env!("CARGO_BIN_EXE_reshard"))
        .env("RESHARD_DATABASE_URL", fx.pg.url())
        .env_remove("RESHARD_LOG")
        .args(["worker", &fx.migration.to_string()])
        .args(["--concurrency", "1", "--exit-when-done", "--name", "logger"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log.reopen().unwrap())
        .spawn()
        .unwrap();
    let mut child = ChildGuard(child);

    // Once the worker planned, a worker that died holds one of the partitions still pending:
    // its lease runs out and the worker takes it over.
    let deadline = Instant::now() + Duration::from_secs(60);
    let ghost = Claim {
        token: uuid::Uuid::new_v4(),
        owner: "ghost".into(),
        ttl: Duration::from_secs(1),
        fence_margin: Duration::from_millis(200),
    };
    loop {
        assert!(Instant::now() < deadline, "the worker planned nothing");
        if !fx.partitions().await.is_empty() {
            let held = fx
                .store
                .claim_partition(fx.migration, Task::Backfill, &ghost, None)
                .await
                .unwrap();
            assert!(held.is_some(), "no partition left for the ghost to hold");
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    let status = tokio::task::spawn_blocking(move || child.0.wait().unwrap())
        .await
        .unwrap();
    let text = std::fs::read_to_string(log.path()).unwrap();
    eprintln!("{text}");
    assert!(status.success(), "{status}:\n{text}");
    let partitions = fx.partitions().await;
    assert!(partitions.iter().all(|p| p.state == PartitionState::Done));
    check_ledgers(&partitions);

    let lines = |what: &str| text.lines().filter(|l| l.contains(what)).count();
    assert!(
        text.lines()
            .all(|l| !l.contains(" DEBUG ") && !l.contains(" TRACE ")),
        "{text}"
    );
    let claimed = lines("partition claimed");
    // A take-over is an event: its log line is the event's.
    let taken_over = lines("kind=\"partition_taken_over\"");
    assert_eq!(claimed + taken_over, partitions.len(), "{text}");
    assert!(
        text.lines().any(
            |l| l.contains("kind=\"partition_taken_over\"") && l.contains("\"from\":\"ghost\"")
        ),
        "{text}"
    );
    assert!(
        text.lines().any(|l| l.contains("partition claimed")
            && l.contains("location=s1/")
            && l.contains("range=[")),
        "{text}"
    );
    assert_eq!(lines("partition finished"), partitions.len(), "{text}");
    assert!(
        text.lines().any(|l| l.contains("partition finished")
            && l.contains("scanned=")
            && l.contains("inserted=")),
        "{text}"
    );
    let progress: Vec<&str> = text
        .lines()
        .filter(|l| l.contains(" progress ") && l.contains("partitions_done="))
        .collect();
    assert!(!progress.is_empty(), "no progress line:\n{text}");
    assert!(progress[0].contains("docs_per_sec="), "{text}");
    // Nothing per batch: far fewer log lines (each starts with its time) than batches.
    let batches = scanned / 10;
    let log_lines = text
        .lines()
        .filter(|l| l.starts_with(|c: char| c.is_ascii_digit()))
        .count() as u64;
    assert!(
        log_lines < batches / 2,
        "{log_lines} log lines for {batches} batches:\n{text}"
    );
}

/// Ids of every type (issue 16: partitions are ranges across types, planned without a probe
/// per type): on a location scanned whole and cut into several partitions, every document is
/// met once. Strings, numbers and ObjectIds are copied; ids reshard cannot route (a boolean, a
/// null, a date, an object) are dead letters naming the type, in the ledger, not skipped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ids_of_every_type_are_met_and_unroutable_ones_are_dead_letters() {
    use mongodb::bson::{oid::ObjectId, Bson};
    let fx = Fixture::start(Layout::hot()).await;
    // Tenants that version 1 puts on s1 (scanned whole: it gives vbuckets to s4).
    let on_s1: Vec<String> = (0..400)
        .map(|t| format!("cust-{t:03}"))
        .filter(|t| {
            let d = doc! { "_id": "probe", "customerId": t.as_str() };
            place(&fx.v1, &d).0.shard == "s1"
        })
        .collect();
    assert!(on_s1.len() > 20, "{on_s1:?}");
    let located = |id: &Bson, tenant: &str| {
        fx.v1
            .locate(
                &KeyValue::String(tenant.to_owned()),
                &KeyValue::from_bson(id).unwrap(),
            )
            .unwrap()
            .locations[0]
            .clone()
    };
    let s1 = located(&Bson::String("probe".into()), &on_s1[0]);
    let mut docs = Vec::new();
    for i in 0..600_i64 {
        let tenant = on_s1[i as usize % on_s1.len()].as_str();
        let id = match i % 3 {
            0 => Bson::String(format!("o-{i:05}")),
            1 => Bson::Int64(i * 1_000),
            _ => {
                let mut bytes = [0_u8; 12];
                bytes[4..12].copy_from_slice(&(i as u64).to_be_bytes());
                Bson::ObjectId(ObjectId::from_bytes(bytes))
            }
        };
        if located(&id, tenant) == s1 {
            docs.push(doc! { "_id": id, "customerId": tenant, "total": i });
        }
    }
    let routable = docs.len() as i64;
    let odd = [
        Bson::Boolean(true),
        Bson::Null,
        Bson::DateTime(mongodb::bson::DateTime::from_millis(86_400_000)),
        Bson::Document(doc! { "order": 7, "line": 1 }),
    ];
    for id in &odd {
        docs.push(doc! { "_id": id.clone(), "customerId": on_s1[0].as_str(), "total": 1 });
    }
    fx.dbs[&s1.shard]
        .collection::<Document>(&s1.collection)
        .insert_many(docs.clone())
        .await
        .unwrap();
    fx.settings(|s| {
        s.max_docs_per_sec = 100_000.0;
        s.documents_per_partition = Some(100);
    })
    .await;
    fx.run_worker(fx.config("w1", 2)).await;

    let partitions: Vec<Partition> = fx
        .partitions()
        .await
        .into_iter()
        .filter(|p| p.source_shard == s1.shard)
        .collect();
    check_ledgers(&partitions);
    assert!(partitions.len() >= 3, "{partitions:?}");
    assert!(
        partitions.iter().all(|p| p.id_type == "any"),
        "{partitions:?}"
    );
    assert_eq!(sum(&partitions, |p| p.scanned), docs.len() as u64);
    assert_eq!(sum(&partitions, |p| p.dead_lettered), odd.len() as u64);
    let letters = fx.store.dead_letters(fx.migration, false).await.unwrap();
    assert_eq!(letters.len(), odd.len(), "{letters:?}");
    for l in &letters {
        assert!(
            l.message.contains("is not supported") && l.message.contains("supported types"),
            "a dead letter says why, naming the type: {l:?}"
        );
    }
    // Every routable document moved or stayed where version 2 wants it.
    let t = fx
        .store
        .task_totals(fx.migration, Task::Backfill)
        .await
        .unwrap();
    let on_s1_totals = sum(&partitions, |p| p.inserted + p.already_present + p.stamped);
    assert_eq!(on_s1_totals as i64, routable, "{t:?}");
}

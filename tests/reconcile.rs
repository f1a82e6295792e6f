//! Reconciliation, repair and the reconcile gate against real servers.
//!
//! Each test builds its own world (a fresh state store, one SecantusDB server holding the
//! shards `s1..s4` as databases, the two routing versions of `tests/fixtures/reconcile`, a
//! migration in `backfill`), seeds the source layout, runs an in-process worker to the end,
//! moves the migration to `reconcile`, then tampers with the target by hand and runs
//! `reshard reconcile` / `reshard repair` / `reshard migration advance` as an operator would.
//!
//! The layout (see the fixture files): s1's documents all move, to `s1/orders_v2` (a new
//! collection, so `s1/orders` is a source location that is no target location and its counts
//! are checked against the ledger) or to `s3/orders`; s2 keeps half its vbuckets in place and
//! gives the other half to `s4/orders`, so `s2/orders` is both a source and a target location.
//! The hot tenant lives on s1 and spreads over 16 buckets on every target location.

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::{Duration, Instant};

use mongodb::bson::{doc, Bson, Document};
use mongodb::{Collection, Database};
use reshard::ids;
use reshard::phase::{Action, Phase};
use reshard::router::{Router, RouterConfig};
use reshard::routing::{KeyValue, Location, RoutingVersion};
use reshard::settings::MigrationSettings;
use reshard::store::partitions::{Partition, PartitionState, Task};
use reshard::store::Store;
use reshard::worker::{Worker, WorkerConfig};
use serde_json::Value;
use support::{MongoServer, PgDb};
use tokio::sync::watch;

const COLLECTION: &str = "orders";
/// The hot tenant; `v2.yaml` gives it 16 buckets.
const HOT: &str = "cust-hot";
const SHARDS: [&str; 4] = ["s1", "s2", "s3", "s4"];
/// `--recheck-delay` of the runs that are expected to find something.
const RECHECK_DELAY: &str = "100ms";
const WORKER_TIMEOUT: Duration = Duration::from_secs(120);

// ---------------------------------------------------------------------------------------------
// The world
// ---------------------------------------------------------------------------------------------

struct Fixture {
    pg: PgDb,
    _server: MongoServer,
    store: Store,
    migration: i64,
    v1: RoutingVersion,
    v2: RoutingVersion,
    /// For the workers: `reshard::shards::writer_client`.
    writer_dbs: BTreeMap<String, Database>,
    /// For seeding, tampering and checking.
    dbs: BTreeMap<String, Database>,
}

/// What a CLI run returned.
struct CliOut {
    code: i32,
    stdout: String,
    stderr: String,
}

impl CliOut {
    fn json(&self) -> Value {
        serde_json::from_str(&self.stdout).unwrap_or_else(|e| {
            panic!(
                "stdout is no JSON ({e}); exit {}\nstdout: {}\nstderr: {}",
                self.code, self.stdout, self.stderr
            )
        })
    }

    fn expect_code(&self, code: i32, what: &str) -> &Self {
        assert_eq!(
            self.code, code,
            "{what}: exit {} (want {code})\nstdout: {}\nstderr: {}",
            self.code, self.stdout, self.stderr
        );
        self
    }
}

impl Fixture {
    /// A state store with the shards and versions, and a migration from version 1 to 2 moved
    /// through `phases` (no router is registered, so the acknowledgement gates pass).
    async fn start(phases: &[Phase]) -> Fixture {
        let (pg, server) = tokio::join!(PgDb::fresh(), MongoServer::builder().name("m0").start());
        let store = Store::connect_unchecked(&pg.url()).await.unwrap();
        store.migrate().await.unwrap();

        let base = MongoServer::database_name();
        let writer = reshard::shards::writer_client(&server.uri()).await.unwrap();
        let client = server.client().await;
        let mut writer_dbs = BTreeMap::new();
        let mut dbs = BTreeMap::new();
        for name in SHARDS {
            let database = format!("{base}_{name}");
            store
                .add_shard(name, &server.uri(), &database)
                .await
                .unwrap();
            writer_dbs.insert(name.to_owned(), writer.database(&database));
            dbs.insert(name.to_owned(), client.database(&database));
        }

        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/reconcile");
        let mut versions = Vec::new();
        for file in ["v1.yaml", "v2.yaml"] {
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
        for &phase in phases {
            store
                .transition(migration, &Action::Advance(phase), "test", None, false)
                .await
                .unwrap_or_else(|e| panic!("advancing to {phase:?}: {e}"));
        }
        Fixture {
            pg,
            _server: server,
            store,
            migration,
            v1,
            v2,
            writer_dbs,
            dbs,
        }
    }

    /// A migration in `backfill` whose backfill of `docs` ran to its end (still in `backfill`).
    async fn backfilled(docs: &[Document]) -> Fixture {
        let started = Instant::now();
        let fx = Fixture::start(&[
            Phase::DualRead,
            Phase::WriteSwitch,
            Phase::NewWrites,
            Phase::Backfill,
        ])
        .await;
        assert_eq!(
            place(&fx.v1, &make_docs(1, 0, 0)[0]).0,
            Location::new("s1", COLLECTION),
            "the fixture's premise: {HOT} lives on s1 in v1"
        );
        seed(&fx, docs).await;
        fx.store
            .update_settings(
                fx.migration,
                |s: &mut MigrationSettings| {
                    s.max_docs_per_sec = 200_000.0;
                    s.documents_per_partition = Some(600);
                },
                "test",
                Some("test setup"),
            )
            .await
            .unwrap();
        let mut cfg = WorkerConfig::new("w1");
        cfg.migration = Some(fx.migration);
        cfg.concurrency = 2;
        cfg.exit_when_done = true;
        cfg.lease_ttl = Duration::from_secs(5);
        cfg.idle_poll = Duration::from_millis(200);
        let worker = Worker::with_shards(fx.store.clone(), fx.writer_dbs.clone(), cfg);
        let (_stop, shutdown) = watch::channel(false);
        tokio::time::timeout(WORKER_TIMEOUT, worker.run(shutdown))
            .await
            .expect("the worker did not finish in time")
            .expect("the worker failed");
        let partitions = fx.partitions().await;
        assert!(!partitions.is_empty());
        for p in &partitions {
            assert_eq!(p.state, PartitionState::Done, "{p:?}");
            assert_eq!(p.dead_lettered, 0, "{p:?}");
        }
        eprintln!(
            "seeded and backfilled {} documents in {:?}",
            docs.len(),
            started.elapsed()
        );
        fx
    }

    /// Ends the backfill: `backfill -> reconcile`.
    async fn to_reconcile(&self) {
        self.store
            .transition(
                self.migration,
                &Action::Advance(Phase::Reconcile),
                "test",
                None,
                false,
            )
            .await
            .expect("the backfill_complete gate should open");
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

    fn coll(&self, location: &Location) -> Collection<Document> {
        self.dbs[&location.shard].collection(&location.collection)
    }

    async fn find(&self, location: &Location, id: &str) -> Option<Document> {
        self.coll(location)
            .find_one(doc! { "_id": id })
            .await
            .unwrap()
    }

    async fn count(&self, location: &Location) -> u64 {
        self.coll(location).count_documents(doc! {}).await.unwrap()
    }

    /// Runs the binary (off the runtime's threads: it blocks until the process exits).
    async fn cli(&self, args: &[&str]) -> CliOut {
        let url = self.pg.url();
        let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        let out = tokio::task::spawn_blocking(move || {
            std::process::Command::new(env!("CARGO_BIN_EXE_reshard"))
                .env("RESHARD_DATABASE_URL", url)
                .env_remove("RESHARD_LOG")
                .args(&args)
                .output()
                .unwrap()
        })
        .await
        .unwrap();
        CliOut {
            code: out.status.code().expect("killed by a signal"),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        }
    }

    /// `reshard --output json reconcile ID --recheck-delay 100ms <extra>`.
    async fn reconcile(&self, extra: &[&str]) -> CliOut {
        let id = self.migration.to_string();
        let mut args = vec![
            "--output",
            "json",
            "reconcile",
            &id,
            "--recheck-delay",
            RECHECK_DELAY,
        ];
        args.extend_from_slice(extra);
        let started = Instant::now();
        let out = self.cli(&args).await;
        eprintln!(
            "reconcile {extra:?}: exit {} in {:?}",
            out.code,
            started.elapsed()
        );
        out
    }

    async fn repair(&self) -> CliOut {
        let id = self.migration.to_string();
        self.cli(&["--output", "json", "repair", &id]).await
    }

    async fn advance(&self, to: &str) -> CliOut {
        self.ignore_bypasses().await;
        let id = self.migration.to_string();
        self.cli(&["migration", "advance", &id, "--to", to, "--timeout", "5s"])
            .await
    }

    /// Every write these tests make by hand is deliberate tampering (a defect for
    /// reconciliation to find), which the bypass watch records: an operator who knows resolves
    /// it with `ignore`. The bypass gate itself is tested in `tests/bypass.rs`.
    async fn ignore_bypasses(&self) {
        let id = self.migration.to_string();
        let listed = self.cli(&["--output", "json", "bypass", "list", &id]).await;
        listed.expect_code(0, "bypass list");
        for b in listed.json().as_array().cloned().unwrap_or_default() {
            let n = b["id"].to_string();
            self.cli(&[
                "bypass",
                "resolve",
                &id,
                "--bypass",
                &n,
                "--action",
                "ignore",
                "--reason",
                "the test's own tampering",
            ])
            .await
            .expect_code(0, "bypass resolve");
        }
    }

    async fn configure(&self, args: &[&str]) {
        let id = self.migration.to_string();
        let mut all = vec!["migration", "configure", &id];
        all.extend_from_slice(args);
        all.extend_from_slice(&["--reason", "test"]);
        self.cli(&all).await.expect_code(0, "migration configure");
    }

    /// The gate holds `new_reads` back, and says which gate.
    async fn assert_gate_closed(&self) {
        let out = self.advance("new_reads").await;
        out.expect_code(1, "advance --to new_reads with the gate closed");
        assert!(
            out.stderr.contains("gate reconciliation_passed is closed"),
            "{}",
            out.stderr
        );
        assert_eq!(self.phase().await, Phase::Reconcile);
    }

    async fn phase(&self) -> Phase {
        self.store.migration(self.migration).await.unwrap().phase()
    }

    /// A router of the collection, as an application embeds it.
    async fn router(&self) -> Router {
        let mut config = RouterConfig::named("shadow-app");
        config.heartbeat_interval = Duration::from_millis(200);
        config.write_concern = mongodb::options::WriteConcern::nodes(1);
        // Every sampled read is compared: none is skipped for being one too many in flight.
        config.shadow_reads_in_flight = 64;
        Router::with_shards(self.store.clone(), COLLECTION, config, self.dbs.clone())
            .await
            .unwrap()
    }

    /// `reshard --output json migration status ID`'s `shadowReads`.
    async fn shadow_status(&self) -> Value {
        let id = self.migration.to_string();
        let out = self
            .cli(&["--output", "json", "migration", "status", &id])
            .await;
        out.expect_code(0, "migration status");
        out.json()["shadow_reads"].clone()
    }

    /// Alters a pristine copy in the target with a plain driver client, behind reshard's back:
    /// its envelope still says it is a copy.
    async fn alter_copy(&self, location: &Location, id: &str) {
        let r = self
            .coll(location)
            .update_one(
                doc! { "_id": id, "_reshard.src": "copy" },
                doc! { "$set": { "total": -1, "note": "edited by hand" } },
            )
            .await
            .unwrap();
        assert_eq!(r.modified_count, 1, "{id} is a pristine copy at {location}");
    }
}

/// Polls `check` every 100 ms until it holds, for at most 10 s.
async fn eventually<F, Fut>(what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + Duration::from_secs(10);
    while !check().await {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

// ---------------------------------------------------------------------------------------------
// Seeding and expectations
// ---------------------------------------------------------------------------------------------

/// `hot` documents of [`HOT`], then `tenants` other tenants with `per_tenant` documents each,
/// each carrying `bucket: 0` as v1 (one bucket per tenant, routing field `bucket`) writes it.
fn make_docs(hot: usize, tenants: usize, per_tenant: usize) -> Vec<Document> {
    let mut docs = Vec::with_capacity(hot + tenants * per_tenant);
    let mut n = 0_usize;
    let mut push = |tenant: String| {
        docs.push(doc! {
            "_id": format!("o-{n:06}"),
            "customerId": tenant,
            "total": (n % 997) as i32,
            "status": if n.is_multiple_of(3) { "open" } else { "paid" },
            "lines": [ { "sku": format!("sku-{}", n % 41), "qty": (n % 5) as i32 + 1 } ],
            "bucket": 0_i32,
        });
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

async fn seed(fx: &Fixture, docs: &[Document]) {
    let mut by_location: BTreeMap<Location, Vec<Document>> = BTreeMap::new();
    for d in docs {
        by_location
            .entry(place(&fx.v1, d).0)
            .or_default()
            .push(d.clone());
    }
    for (location, docs) in by_location {
        for chunk in docs.chunks(2_000) {
            fx.coll(&location)
                .insert_many(chunk.to_vec())
                .await
                .unwrap();
        }
    }
}

/// What the versions say about the seeded documents.
#[derive(Debug, Default)]
struct Expect {
    /// Documents that move: `_id` -> (source, target).
    moved: BTreeMap<String, (Location, Location)>,
    /// Documents that stay where they are.
    stays: u64,
    /// Per source location, its documents.
    at_source: BTreeMap<Location, u64>,
    /// Per target location, the copies it receives.
    copies_at: BTreeMap<Location, u64>,
}

impl Expect {
    fn of(fx: &Fixture, docs: &[Document]) -> Expect {
        let mut e = Expect::default();
        for d in docs {
            let (from, to) = (place(&fx.v1, d).0, place(&fx.v2, d).0);
            *e.at_source.entry(from.clone()).or_default() += 1;
            if from == to {
                e.stays += 1;
            } else {
                *e.copies_at.entry(to.clone()).or_default() += 1;
                e.moved.insert(id_of(d).to_owned(), (from, to));
            }
        }
        e
    }

    /// Copies that land in a collection that is also a source location (a full scan of that
    /// source reads them and must ignore them).
    fn copies_into_sources(&self) -> u64 {
        self.copies_at
            .iter()
            .filter(|(l, _)| self.at_source.contains_key(l))
            .map(|(_, n)| n)
            .sum()
    }

    /// The first moved `_id` (in `_id` order) going `from -> to` that `pick` accepts.
    fn moving(&self, from: &Location, to: &Location, pick: impl Fn(&str) -> bool) -> String {
        self.moved
            .iter()
            .find(|(id, (f, t))| f == from && t == to && pick(id))
            .map(|(id, _)| id.clone())
            .unwrap_or_else(|| panic!("no document moves from {from} to {to}"))
    }
}

fn loc(shard: &str, collection: &str) -> Location {
    Location::new(shard, collection)
}

fn s1_source() -> Location {
    loc("s1", COLLECTION)
}

fn s1_target() -> Location {
    loc("s1", "orders_v2")
}

// ---------------------------------------------------------------------------------------------
// Reading reports
// ---------------------------------------------------------------------------------------------

fn findings(report: &Value) -> &Vec<Value> {
    report["findings"]
        .as_array()
        .unwrap_or_else(|| panic!("no findings array: {report}"))
}

/// `(kind, _id)` of every finding (`-` for findings without a document).
fn finding_keys(report: &Value) -> BTreeSet<(String, String)> {
    findings(report)
        .iter()
        .map(|f| {
            (
                f["kind"].as_str().unwrap().to_owned(),
                f["id_text"].as_str().unwrap_or("-").to_owned(),
            )
        })
        .collect()
}

fn finding<'a>(report: &'a Value, kind: &str, id: &str) -> &'a Value {
    findings(report)
        .iter()
        .find(|f| f["kind"] == kind && f["id_text"] == id)
        .unwrap_or_else(|| panic!("no {kind} finding for {id}: {report:#}"))
}

fn strata(report: &Value) -> BTreeMap<String, Value> {
    report["run"]["summary"]["strata"]
        .as_array()
        .unwrap_or_else(|| panic!("no strata: {report}"))
        .iter()
        .map(|s| (s["name"].as_str().unwrap().to_owned(), s.clone()))
        .collect()
}

fn outcomes(report: &Value) -> BTreeMap<String, u64> {
    report["run"]["summary"]["outcomes"]
        .as_object()
        .unwrap_or_else(|| panic!("no outcomes: {report}"))
        .iter()
        .map(|(k, v)| (k.clone(), v.as_u64().unwrap()))
        .collect()
}

fn u(v: &Value) -> u64 {
    v.as_u64().unwrap_or_else(|| panic!("not a count: {v}"))
}

/// A clean stratum of `k` samples reports the rule-of-three bound `3/k`.
fn assert_clean_stratum(name: &str, s: &Value) {
    let k = u(&s["samples"]);
    assert!(k > 0, "stratum {name} has no samples: {s}");
    assert_eq!(u(&s["defects"]), 0, "{name}: {s}");
    let bound = s["bound"]
        .as_f64()
        .unwrap_or_else(|| panic!("{name}: no bound: {s}"));
    let want = (3.0 / k as f64).min(1.0);
    assert!(
        (bound - want).abs() < 1e-9,
        "{name}: bound {bound}, want 3/{k} = {want}"
    );
}

fn assert_passed(report: &Value) {
    assert_eq!(report["run"]["passed"], Value::Bool(true), "{report:#}");
    assert_eq!(
        report["run"]["summary"]["passed"],
        Value::Bool(true),
        "{report:#}"
    );
}

// ---------------------------------------------------------------------------------------------
// Tests
// ---------------------------------------------------------------------------------------------

/// A clean backfill reconciles: sampled (a stratum per source location and per target
/// location, each with the rule-of-three bound) and in full (every moved document counted as
/// copied); the counts of the source-only location match the ledger. A run from before the
/// backfill ended does not open the gate; one after it does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clean_backfill_passes_sampled_and_full_and_opens_the_gate() {
    let started = Instant::now();
    let docs = make_docs(50, 60, 40);
    let fx = Fixture::backfilled(&docs).await;
    let e = Expect::of(&fx, &docs);
    assert!(e.moved.len() > 1_000 && e.stays > 300, "{e:?}");
    for target in fx.v2.locations() {
        assert!(
            e.copies_at.get(&target).copied().unwrap_or(0) > 0,
            "the fixture's premise: every target location receives copies ({e:?})"
        );
    }

    // Reconciliation may run during a planned backfill, but that run predates the end of
    // the backfill and does not count for the gate.
    let early = fx.reconcile(&[]).await;
    early.expect_code(0, "reconcile during backfill");
    let early_run = early.json()["run"]["id"].as_i64().unwrap();
    fx.to_reconcile().await;
    fx.assert_gate_closed().await;

    // Sampled, a stratum per source location and one per target location.
    let k = 50_u64;
    let out = fx.reconcile(&["--sample", &k.to_string()]).await;
    out.expect_code(0, "reconcile --sample 50");
    let report = out.json();
    assert_passed(&report);
    assert_eq!(report["run"]["mode"], "sample");
    assert_eq!(report["run"]["migration_id"].as_i64(), Some(fx.migration));
    assert!(findings(&report).is_empty(), "{report:#}");
    assert_eq!(report["run"]["summary"]["findings"], serde_json::json!({}));
    let st = strata(&report);
    let want: BTreeSet<String> = fx
        .v1
        .locations()
        .iter()
        .map(|l| format!("shard:{l}"))
        .chain(fx.v2.locations().iter().map(|l| format!("placement:{l}")))
        .collect();
    assert_eq!(
        st.keys().cloned().collect::<BTreeSet<_>>(),
        want,
        "{report:#}"
    );
    for (name, s) in &st {
        assert_clean_stratum(name, s);
    }
    // s1's documents all move: every sample counts. s2's sample may hit copies that came in.
    assert_eq!(u(&st["shard:s1/orders"]["samples"]), k);
    assert!(u(&st["shard:s2/orders"]["samples"]) <= k);
    for target in fx.v2.locations() {
        assert_eq!(
            u(&st[&format!("placement:{target}")]["samples"]),
            k.min(e.copies_at[&target]),
            "placement samples at {target}"
        );
    }
    // Counts: every partition of the source-only s1/orders matches its ledger; s2/orders is
    // also a target location and is left to the presence checks.
    let partitions = fx.partitions().await;
    let counts = report["run"]["summary"]["counts"].as_array().unwrap();
    assert_eq!(counts.len(), partitions.len(), "{report:#}");
    let mut counted = 0;
    for p in &partitions {
        let c = counts
            .iter()
            .find(|c| c["partition"].as_i64() == Some(p.id))
            .unwrap_or_else(|| panic!("partition {} not in counts: {report:#}", p.id));
        if p.source_shard == "s1" {
            assert_eq!(c["count"], c["ledger"], "{c}");
            assert_eq!(
                c["ledger"].as_i64(),
                Some(p.scanned + p.skipped_foreign),
                "{c}"
            );
            counted += u(&c["count"]);
        } else {
            assert!(c["skipped"].is_string(), "{c}");
        }
    }
    assert_eq!(counted, e.at_source[&s1_source()]);

    // Full: every moved document is a pristine copy in place, every other one stays.
    let out = fx.reconcile(&["--full"]).await;
    out.expect_code(0, "reconcile --full");
    let report = out.json();
    assert_passed(&report);
    assert_eq!(report["run"]["mode"], "full");
    assert!(findings(&report).is_empty(), "{report:#}");
    // Every copy's placement is checked too, once (by the merge of the source it came from).
    let mut want_outcomes = BTreeMap::from([
        ("copied".to_owned(), e.moved.len() as u64),
        ("placed".to_owned(), e.moved.len() as u64),
        ("stayed".to_owned(), e.stays),
    ]);
    if e.copies_into_sources() > 0 {
        want_outcomes.insert("ignored".to_owned(), e.copies_into_sources());
    }
    assert_eq!(outcomes(&report), want_outcomes, "{report:#}");
    let st = strata(&report);
    for (name, s) in &st {
        assert_clean_stratum(name, s);
    }
    for source in fx.v1.locations() {
        assert_eq!(
            u(&st[&format!("full:{source}")]["samples"]),
            e.at_source[&source],
            "full:{source}"
        );
    }
    let full_run = report["run"]["id"].as_i64().unwrap();

    // `show`: the latest run by default, any run with --run.
    let id = fx.migration.to_string();
    let shown = fx
        .cli(&["--output", "json", "reconcile", "show", &id])
        .await;
    shown.expect_code(0, "reconcile show");
    assert_eq!(shown.json()["run"]["id"].as_i64(), Some(full_run));
    let shown = fx
        .cli(&[
            "--output",
            "json",
            "reconcile",
            "show",
            &id,
            "--run",
            &early_run.to_string(),
        ])
        .await;
    shown.expect_code(0, "reconcile show --run");
    assert_eq!(shown.json()["run"]["mode"], "sample");
    let runs = fx.store.reconciliation_runs(fx.migration).await.unwrap();
    assert_eq!(runs.len(), 3);
    assert!(runs.iter().all(|r| r.passed == Some(true)), "{runs:?}");

    let out = fx.advance("new_reads").await;
    out.expect_code(0, "advance --to new_reads after a passing run");
    assert_eq!(fx.phase().await, Phase::NewReads);
    eprintln!("total {:?}", started.elapsed());
}

/// A deleted copy, an edited pristine copy and a copy moved to a wrong shard are each found
/// by a full run under their `_id` and kind; the gate stays closed; `repair` puts all three
/// right, after which a full run passes and the gate opens.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tampering_is_found_repaired_and_gates_new_reads() {
    let started = Instant::now();
    let docs = make_docs(50, 60, 40);
    let fx = Fixture::backfilled(&docs).await;
    fx.to_reconcile().await;
    let e = Expect::of(&fx, &docs);
    let (s2, s3, s4) = (
        loc("s2", COLLECTION),
        loc("s3", COLLECTION),
        loc("s4", COLLECTION),
    );
    let not_hot = |id: &str| docs.iter().any(|d| id_of(d) == id && tenant_of(d) != HOT);

    // (a) A copy deleted by hand.
    let missing = e.moving(&s1_source(), &s3, not_hot);
    let r = fx
        .coll(&s3)
        .delete_one(doc! { "_id": &missing })
        .await
        .unwrap();
    assert_eq!(r.deleted_count, 1);
    // (b) A field of a pristine copy changed by hand.
    let mismatched = e.moving(&s2, &s4, not_hot);
    let before = fx.find(&s4, &mismatched).await.unwrap();
    assert_eq!(
        before.get_document("_reshard").unwrap().get_str("src"),
        Ok("copy")
    );
    let r = fx
        .coll(&s4)
        .update_one(
            doc! { "_id": &mismatched },
            doc! { "$set": { "total": 123_456 } },
        )
        .await
        .unwrap();
    assert_eq!(r.modified_count, 1);
    // (c) A copy moved by hand to a target shard where it does not belong.
    let misplaced = e.moving(&s1_source(), &s1_target(), not_hot);
    let copy = fx.find(&s1_target(), &misplaced).await.unwrap();
    fx.coll(&s4).insert_one(copy.clone()).await.unwrap();
    fx.coll(&s1_target())
        .delete_one(doc! { "_id": &misplaced })
        .await
        .unwrap();

    let out = fx.reconcile(&["--full"]).await;
    out.expect_code(1, "reconcile --full after tampering");
    let report = out.json();
    assert_eq!(report["run"]["passed"], Value::Bool(false), "{report:#}");
    assert_eq!(
        finding_keys(&report),
        BTreeSet::from([
            ("missing".to_owned(), missing.clone()),
            ("mismatched".to_owned(), mismatched.clone()),
            ("misplaced".to_owned(), misplaced.clone()),
        ]),
        "{report:#}"
    );
    let f = finding(&report, "missing", &missing);
    assert_eq!(f["details"]["expected"], "s3/orders", "{f}");
    assert_eq!(f["details"]["source"], "s1/orders", "{f}");
    assert_eq!(f["stratum"], "full:s1/orders", "{f}");
    let f = finding(&report, "mismatched", &mismatched);
    assert_eq!(f["details"]["fields"], serde_json::json!(["total"]), "{f}");
    assert_eq!(f["details"]["location"], "s4/orders", "{f}");
    let f = finding(&report, "misplaced", &misplaced);
    assert_eq!(f["details"]["expected"], "s1/orders_v2", "{f}");
    assert_eq!(f["details"]["found"], "s4/orders", "{f}");
    assert_eq!(u(&report["run"]["summary"]["rechecked_away"]), 0);
    let by_kind = &report["run"]["summary"]["findings"];
    assert_eq!(by_kind["missing"], 1, "{report:#}");
    assert_eq!(by_kind["mismatched"], 1, "{report:#}");
    assert!(u(&by_kind["misplaced"]) >= 1, "{report:#}");
    let st = strata(&report);
    assert!(u(&st["full:s1/orders"]["defects"]) >= 2, "{report:#}");
    assert_eq!(
        st["full:s1/orders"]["bound"],
        Value::Null,
        "a stratum with defects has no bound"
    );
    fx.assert_gate_closed().await;
    // `show` reports the same run and findings as stored.
    let shown = fx
        .cli(&[
            "--output",
            "json",
            "reconcile",
            "show",
            &fx.migration.to_string(),
        ])
        .await;
    shown.expect_code(0, "reconcile show");
    assert_eq!(finding_keys(&shown.json()), finding_keys(&report));

    // Repair.
    let out = fx.repair().await;
    eprintln!("repair: exit {}\n{}\n{}", out.code, out.stdout, out.stderr);
    let repaired = out.json();
    let action_of = |id: &str| -> String {
        let finding_id = findings(&report)
            .iter()
            .find(|f| f["id_text"] == id)
            .unwrap()["id"]
            .clone();
        repaired["repaired"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["finding"] == finding_id)
            .map(|r| r["action"].as_str().unwrap().to_owned())
            .unwrap_or_else(|| panic!("finding {finding_id} ({id}) was not handled: {repaired:#}"))
    };
    assert_eq!(action_of(&missing), "copied again");
    assert_eq!(action_of(&mismatched), "pristine copy replaced");
    let pristine = |id: &str| {
        let mut d = docs.iter().find(|d| id_of(d) == id).unwrap().clone();
        d.remove("bucket");
        d
    };
    let without_meta = |mut d: Document| {
        d.remove("_reshard");
        d.remove("bucket");
        d
    };
    let fixed = fx.find(&s3, &missing).await.expect("(a) is copied again");
    assert_eq!(without_meta(fixed.clone()), pristine(&missing));
    assert_eq!(
        fixed.get_document("_reshard").unwrap().get_str("src"),
        Ok("copy")
    );
    let fixed = fx.find(&s4, &mismatched).await.unwrap();
    assert_eq!(without_meta(fixed), pristine(&mismatched));
    // (c): the document belongs at s1/orders_v2 and nowhere else. Repair must put it there
    // (from the source, which still holds it) and take the stray copy away.
    let at_right = fx.find(&s1_target(), &misplaced).await;
    let at_wrong = fx.find(&s4, &misplaced).await;
    assert!(
        at_right.is_some() && at_wrong.is_none(),
        "(c) {misplaced} after repair: at s1/orders_v2: {}, at s4/orders: {} (repair said {:?}, \
         exit {})",
        at_right.is_some(),
        at_wrong.is_some(),
        action_of(&misplaced),
        out.code
    );
    out.expect_code(0, "repair");
    assert!(
        repaired["still_wrong"].as_array().unwrap().is_empty(),
        "{repaired:#}"
    );
    let shown = fx
        .cli(&[
            "--output",
            "json",
            "reconcile",
            "show",
            &fx.migration.to_string(),
        ])
        .await
        .json();
    for f in findings(&shown) {
        assert!(f["repaired_at"].is_string(), "{f}");
        assert!(f["resolution"].is_string(), "{f}");
    }

    let out = fx.reconcile(&["--full"]).await;
    out.expect_code(0, "reconcile --full after repair");
    let report = out.json();
    assert_passed(&report);
    assert_eq!(outcomes(&report)["copied"], e.moved.len() as u64);
    fx.advance("new_reads")
        .await
        .expect_code(0, "advance --to new_reads after repair");
    assert_eq!(fx.phase().await, Phase::NewReads);
    eprintln!("total {:?}", started.elapsed());
}

/// The repairs the product promises, end to end: a deleted copy is copied again, an edited
/// pristine copy is replaced, a stray duplicate at a wrong target location (the right one
/// holds the document too; only the placement check sees it, given samples that cover the
/// location) is removed, and a mismatched copy the application rewrote before the repair is
/// left alone. Then a full run passes and the gate opens.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn repair_restores_copies_removes_strays_and_spares_application_writes() {
    let docs = make_docs(50, 60, 40);
    let fx = Fixture::backfilled(&docs).await;
    fx.to_reconcile().await;
    let e = Expect::of(&fx, &docs);
    let epoch = fx.epoch().await;
    let (s2, s3, s4) = (
        loc("s2", COLLECTION),
        loc("s3", COLLECTION),
        loc("s4", COLLECTION),
    );
    let seeded = |id: &str| docs.iter().find(|d| id_of(d) == id).unwrap().clone();
    let without_meta = |mut d: Document| {
        d.remove("_reshard");
        d.remove("bucket");
        d
    };

    let missing = e.moving(&s1_source(), &s3, |_| true);
    fx.coll(&s3)
        .delete_one(doc! { "_id": &missing })
        .await
        .unwrap();
    let mismatched = e.moving(&s2, &s4, |_| true);
    fx.coll(&s4)
        .update_one(
            doc! { "_id": &mismatched },
            doc! { "$set": { "status": "lost" } },
        )
        .await
        .unwrap();
    let overtaken = e.moving(&s2, &s4, |id| id != mismatched);
    fx.coll(&s4)
        .update_one(
            doc! { "_id": &overtaken },
            doc! { "$unset": { "lines": "" } },
        )
        .await
        .unwrap();
    let stray = e.moving(&s1_source(), &s1_target(), |_| true);
    let copy = fx.find(&s1_target(), &stray).await.unwrap();
    fx.coll(&s3).insert_one(copy.clone()).await.unwrap();

    // Samples that cover every target location whole.
    let out = fx.reconcile(&["--full", "--sample", "100000"]).await;
    out.expect_code(1, "reconcile after tampering");
    let report = out.json();
    assert_eq!(
        finding_keys(&report),
        BTreeSet::from([
            ("missing".to_owned(), missing.clone()),
            ("mismatched".to_owned(), mismatched.clone()),
            ("mismatched".to_owned(), overtaken.clone()),
            ("misplaced".to_owned(), stray.clone()),
        ]),
        "{report:#}"
    );
    assert_eq!(
        finding(&report, "mismatched", &overtaken)["details"]["fields"],
        serde_json::json!(["lines"])
    );
    let f = finding(&report, "misplaced", &stray);
    assert_eq!(f["details"]["found"], "s3/orders", "{f}");
    assert_eq!(f["details"]["expected"], "s1/orders_v2", "{f}");
    assert_eq!(f["stratum"], "placement:s3/orders", "{f}");
    // s3/orders lost one copy and got the stray: as many documents with `_reshard` as the
    // backfill wrote there, every one sampled.
    assert_eq!(
        u(&strata(&report)["placement:s3/orders"]["samples"]),
        e.copies_at[&s3],
        "every document at s3/orders with _reshard is sampled"
    );
    fx.assert_gate_closed().await;

    // The application rewrites one mismatched copy before the repair gets to it.
    let mut app = seeded(&overtaken);
    app.insert("total", 5);
    app.insert(
        "_reshard",
        doc! { "src": "app", "epoch": epoch, "rev": 1_i64 },
    );
    fx.coll(&s4)
        .replace_one(doc! { "_id": &overtaken }, app.clone())
        .await
        .unwrap();

    let out = fx.repair().await;
    out.expect_code(0, "repair");
    let repaired = out.json();
    let actions: BTreeMap<String, String> = repaired["repaired"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            let f = findings(&report)
                .iter()
                .find(|f| f["id"] == r["finding"])
                .unwrap();
            (
                f["id_text"].as_str().unwrap().to_owned(),
                r["action"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    assert_eq!(actions[&missing], "copied again", "{repaired:#}");
    assert_eq!(
        actions[&mismatched], "pristine copy replaced",
        "{repaired:#}"
    );
    assert_eq!(
        actions[&overtaken], "left alone: the application wrote it since",
        "{repaired:#}"
    );
    assert_eq!(actions[&stray], "removed from s3/orders", "{repaired:#}");
    let mut want = seeded(&missing);
    want.remove("bucket");
    assert_eq!(without_meta(fx.find(&s3, &missing).await.unwrap()), want);
    let mut want = seeded(&mismatched);
    want.remove("bucket");
    assert_eq!(without_meta(fx.find(&s4, &mismatched).await.unwrap()), want);
    assert_eq!(
        fx.find(&s4, &overtaken).await,
        Some(app),
        "the application's write is kept"
    );
    assert_eq!(fx.find(&s3, &stray).await, None);
    assert_eq!(fx.find(&s1_target(), &stray).await, Some(copy));
    assert_eq!(fx.count(&s3).await, e.copies_at[&s3]);
    let shown = fx
        .cli(&[
            "--output",
            "json",
            "reconcile",
            "show",
            &fx.migration.to_string(),
        ])
        .await
        .json();
    for f in findings(&shown) {
        assert!(f["repaired_at"].is_string(), "{f}");
        assert_eq!(
            f["resolution"].as_str(),
            Some(actions[f["id_text"].as_str().unwrap()].as_str())
        );
    }

    let out = fx.reconcile(&["--full", "--sample", "100000"]).await;
    out.expect_code(0, "reconcile after repair");
    let report = out.json();
    assert_passed(&report);
    assert_eq!(outcomes(&report).get("superseded"), Some(&1));
    fx.advance("new_reads")
        .await
        .expect_code(0, "advance --to new_reads");
    assert_eq!(fx.phase().await, Phase::NewReads);
}

/// The gate follows the evidence: a run that found a missing document after an earlier run
/// passed keeps `new_reads` closed until a newer run passes again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_newer_failing_run_closes_the_gate_an_older_pass_opened() {
    let docs = make_docs(50, 30, 40);
    let fx = Fixture::backfilled(&docs).await;
    fx.to_reconcile().await;
    let e = Expect::of(&fx, &docs);
    fx.reconcile(&["--full"])
        .await
        .expect_code(0, "a clean run");
    let s3 = loc("s3", COLLECTION);
    let gone = e.moving(&s1_source(), &s3, |_| true);
    let copy = fx.find(&s3, &gone).await.unwrap();
    fx.coll(&s3)
        .delete_one(doc! { "_id": &gone })
        .await
        .unwrap();
    let out = fx.reconcile(&["--full"]).await;
    out.expect_code(1, "a run that finds a missing document");
    assert_eq!(
        finding_keys(&out.json()),
        BTreeSet::from([("missing".to_owned(), gone.clone())])
    );
    let runs = fx.store.reconciliation_runs(fx.migration).await.unwrap();
    assert_eq!(
        runs.iter().map(|r| r.passed).collect::<Vec<_>>(),
        vec![Some(false), Some(true)]
    );
    fx.assert_gate_closed().await;

    fx.coll(&s3).insert_one(copy).await.unwrap();
    fx.reconcile(&["--full"])
        .await
        .expect_code(0, "a clean run again");
    fx.advance("new_reads")
        .await
        .expect_code(0, "advance --to new_reads");
}

/// A finding that is gone when it is checked again (a copy in flight) is not reported: the
/// run passes and says how many cleared on the re-check.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_finding_that_heals_before_the_recheck_is_not_reported() {
    let docs = make_docs(20, 20, 20);
    let fx = Fixture::backfilled(&docs).await;
    fx.to_reconcile().await;
    let e = Expect::of(&fx, &docs);
    let s3 = loc("s3", COLLECTION);
    let late = e.moving(&s1_source(), &s3, |_| true);
    let copy = fx.find(&s3, &late).await.unwrap();
    fx.coll(&s3)
        .delete_one(doc! { "_id": &late })
        .await
        .unwrap();

    // The full pass over 420 documents takes well under a second; the copy comes back 3 s
    // after the run starts, 5 s before the re-check.
    let id = fx.migration.to_string();
    let args = [
        "--output",
        "json",
        "reconcile",
        &id,
        "--full",
        "--recheck-delay",
        "8s",
    ];
    let run = fx.cli(&args);
    let heal = async {
        let deadline = Instant::now() + Duration::from_secs(10);
        let started = loop {
            let runs = fx.store.reconciliation_runs(fx.migration).await.unwrap();
            if let Some(r) = runs.first() {
                break r.started_at;
            }
            assert!(Instant::now() < deadline, "the run never started");
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        let since = (chrono::Utc::now() - started).to_std().unwrap_or_default();
        tokio::time::sleep(Duration::from_secs(3).saturating_sub(since)).await;
        let runs = fx.store.reconciliation_runs(fx.migration).await.unwrap();
        assert_eq!(
            runs[0].finished_at, None,
            "the run finished before the copy came back"
        );
        fx.coll(&s3).insert_one(copy).await.unwrap();
    };
    let (out, ()) = tokio::join!(run, heal);
    out.expect_code(
        0,
        "reconcile with a copy that came back before the re-check",
    );
    let report = out.json();
    assert_passed(&report);
    assert!(findings(&report).is_empty(), "{report:#}");
    assert_eq!(
        u(&report["run"]["summary"]["rechecked_away"]),
        1,
        "{report:#}"
    );
}

/// One document in the wrong place is one misplaced document: with `--max-misplaced 1` a run
/// that finds exactly that passes, however many checks see it (presence from its source, and
/// placement at the location that holds it when the sample covers it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_misplaced_document_counts_once_against_the_threshold() {
    let docs = make_docs(50, 60, 40);
    let fx = Fixture::backfilled(&docs).await;
    fx.to_reconcile().await;
    let e = Expect::of(&fx, &docs);
    let s4 = loc("s4", COLLECTION);
    let misplaced = e.moving(&s1_source(), &s1_target(), |_| true);
    let copy = fx.find(&s1_target(), &misplaced).await.unwrap();
    fx.coll(&s4).insert_one(copy).await.unwrap();
    fx.coll(&s1_target())
        .delete_one(doc! { "_id": &misplaced })
        .await
        .unwrap();
    fx.configure(&["--max-misplaced", "1"]).await;

    let out = fx.reconcile(&["--full", "--sample", "100000"]).await;
    let report = out.json();
    assert_eq!(
        finding_keys(&report),
        BTreeSet::from([("misplaced".to_owned(), misplaced.clone())]),
        "{report:#}"
    );
    assert_eq!(
        report["run"]["summary"]["findings"]["misplaced"], 1,
        "one misplaced document must be counted once: {report:#}"
    );
    out.expect_code(
        0,
        "reconcile with one misplaced document and --max-misplaced 1",
    );
    assert_passed(&report);
}

/// A document the application rewrote in the target (`_reshard.src = "app"`) is superseded,
/// not mismatched; one it deleted (a tombstone) is deleted, not missing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn application_writes_in_the_target_are_no_defects() {
    let docs = make_docs(50, 60, 40);
    let fx = Fixture::backfilled(&docs).await;
    fx.to_reconcile().await;
    let e = Expect::of(&fx, &docs);
    let epoch = fx.epoch().await;
    let (s3, s4) = (loc("s3", COLLECTION), loc("s4", COLLECTION));

    let rewritten = e.moving(&s1_source(), &s3, |_| true);
    let mut app = fx.find(&s3, &rewritten).await.unwrap();
    app.insert("total", 999_999);
    app.insert("status", "refunded");
    app.insert("note", "written by the application");
    app.insert(
        "_reshard",
        doc! { "src": "app", "epoch": epoch, "rev": 1_i64 },
    );
    let r = fx
        .coll(&s3)
        .replace_one(doc! { "_id": &rewritten }, app)
        .await
        .unwrap();
    assert_eq!(r.modified_count, 1);

    let deleted = e.moving(&loc("s2", COLLECTION), &s4, |_| true);
    let copy = fx.find(&s4, &deleted).await.unwrap();
    let tombstone = doc! {
        "_id": &deleted,
        "customerId": copy.get_str("customerId").unwrap(),
        "bucket": copy.get_i32("bucket").unwrap(),
        "_reshard": { "deleted": true, "at": mongodb::bson::DateTime::now(), "epoch": epoch, "rev": 1_i64 },
    };
    fx.coll(&s4)
        .replace_one(doc! { "_id": &deleted }, tombstone)
        .await
        .unwrap();

    let out = fx.reconcile(&["--full", "--sample", "100000"]).await;
    out.expect_code(0, "reconcile with application writes in the target");
    let report = out.json();
    assert_passed(&report);
    assert!(findings(&report).is_empty(), "{report:#}");
    let got = outcomes(&report);
    assert_eq!(got.get("superseded"), Some(&1), "{got:?}");
    assert_eq!(got.get("deleted"), Some(&1), "{got:?}");
    assert_eq!(
        got.get("copied"),
        Some(&(e.moved.len() as u64 - 2)),
        "{got:?}"
    );
    assert_eq!(got.get("mismatched"), None, "{got:?}");
}

/// With strata per tenant, a hot tenant holding 1% of the documents gets its own stratum of
/// k samples (per-shard strata have none for it), and one missing copy of it is found.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tenant_strata_find_a_small_hot_tenant() {
    // 5,000 documents: 50 of the hot tenant, 10 tenants x 495.
    let docs = make_docs(50, 10, 495);
    assert_eq!(docs.len(), 5_000);
    let fx = Fixture::backfilled(&docs).await;
    fx.to_reconcile().await;
    let e = Expect::of(&fx, &docs);
    let hot_stratum = format!("tenant:{HOT}");

    let out = fx
        .reconcile(&["--stratify", "tenant", "--sample", "20"])
        .await;
    out.expect_code(0, "reconcile --stratify tenant");
    let report = out.json();
    assert_passed(&report);
    let st = strata(&report);
    let hot = st
        .get(&hot_stratum)
        .unwrap_or_else(|| panic!("no stratum {hot_stratum}: {report:#}"));
    let k = u(&hot["samples"]);
    assert!((20..=50).contains(&k), "{hot}");
    assert_clean_stratum(&hot_stratum, hot);
    // Every tenant with documents in scope has a stratum.
    for t in 0..10 {
        let name = format!("tenant:cust-{t:04}");
        assert_clean_stratum(
            &name,
            st.get(&name)
                .unwrap_or_else(|| panic!("no {name}: {report:#}")),
        );
    }

    let out = fx
        .reconcile(&["--stratify", "shard", "--sample", "20"])
        .await;
    out.expect_code(0, "reconcile --stratify shard");
    let report = out.json();
    let names: Vec<String> = strata(&report).into_keys().collect();
    assert!(!names.iter().any(|n| n.starts_with("tenant:")), "{names:?}");

    // Strata per target bucket: named `bucket:<n>`, next to the placement strata.
    let out = fx
        .reconcile(&["--stratify", "bucket", "--sample", "20"])
        .await;
    out.expect_code(0, "reconcile --stratify bucket");
    let report = out.json();
    let st = strata(&report);
    assert!(
        st.keys()
            .all(|n| n.starts_with("bucket:") || n.starts_with("placement:")),
        "{report:#}"
    );
    assert_clean_stratum("bucket:0", &st["bucket:0"]);
    for (name, s) in &st {
        assert_eq!(u(&s["defects"]), 0, "{name}: {s}");
    }

    // One hot copy goes missing: a tenant stratum that covers all 50 finds it.
    let s3 = loc("s3", COLLECTION);
    let hot_id = e.moving(&s1_source(), &s3, |id| {
        docs.iter().any(|d| id_of(d) == id && tenant_of(d) == HOT)
    });
    fx.coll(&s3)
        .delete_one(doc! { "_id": &hot_id })
        .await
        .unwrap();
    let out = fx
        .reconcile(&["--stratify", "tenant", "--sample", "60"])
        .await;
    out.expect_code(
        1,
        "reconcile --stratify tenant --sample 60 with a hot copy missing",
    );
    let report = out.json();
    assert_eq!(
        finding_keys(&report),
        BTreeSet::from([("missing".to_owned(), hot_id.clone())]),
        "{report:#}"
    );
    let f = finding(&report, "missing", &hot_id);
    assert_eq!(f["stratum"], hot_stratum.as_str(), "{f}");
    let hot = &strata(&report)[&hot_stratum];
    assert_eq!(u(&hot["samples"]), 50, "{hot}");
    assert_eq!(u(&hot["defects"]), 1, "{hot}");
    assert_eq!(hot["bound"], Value::Null, "{hot}");
}

/// `reconcile` compares a finished backfill with the target: in `planned`, or in `backfill`
/// before the backfill is planned, it refuses (exit 2) and names the phase; so does `repair`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reconcile_refuses_a_migration_in_the_wrong_phase() {
    let fx = Fixture::start(&[]).await;
    assert_eq!(fx.phase().await, Phase::Planned);
    let out = fx.reconcile(&[]).await;
    out.expect_code(2, "reconcile in planned");
    assert!(out.stderr.contains("planned"), "{}", out.stderr);
    let out = fx.repair().await;
    out.expect_code(2, "repair in planned");
    assert!(out.stderr.contains("planned"), "{}", out.stderr);
    assert!(fx
        .store
        .reconciliation_runs(fx.migration)
        .await
        .unwrap()
        .is_empty());

    for phase in [
        Phase::DualRead,
        Phase::WriteSwitch,
        Phase::NewWrites,
        Phase::Backfill,
    ] {
        fx.store
            .transition(fx.migration, &Action::Advance(phase), "test", None, false)
            .await
            .unwrap();
    }
    let out = fx.reconcile(&["--full"]).await;
    out.expect_code(2, "reconcile in backfill before it is planned");
    assert!(out.stderr.contains("backfill"), "{}", out.stderr);
    assert!(fx
        .store
        .reconciliation_runs(fx.migration)
        .await
        .unwrap()
        .is_empty());
}

/// An extra document in a source-only location after the backfill is a `count` finding naming
/// the partition, and no threshold lets it pass. Thresholds do admit the defects they name:
/// with `--max-missing 1`, a run with exactly one missing document passes and opens the gate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_count_mismatch_never_passes_and_thresholds_admit_known_defects() {
    let docs = make_docs(50, 60, 40);
    let fx = Fixture::backfilled(&docs).await;
    fx.to_reconcile().await;
    let e = Expect::of(&fx, &docs);

    // An extra document of a tenant that lives on s1, after every other `_id`.
    let tenant = docs
        .iter()
        .find(|d| tenant_of(d) != HOT && place(&fx.v1, d).0 == s1_source())
        .map(|d| tenant_of(d).to_owned())
        .unwrap();
    let extra_id = "o-999999";
    let extra = doc! {
        "_id": extra_id, "customerId": &tenant, "total": 1, "status": "open", "lines": [], "bucket": 0,
    };
    fx.coll(&s1_source()).insert_one(extra).await.unwrap();
    let partitions = fx.partitions().await;
    let holder = partitions
        .iter()
        .find(|p| {
            let decode = |b: &Option<Vec<u8>>| b.as_deref().map(|b| ids::decode(b).unwrap());
            let id = Bson::String(extra_id.into());
            p.source_shard == "s1"
                && decode(&p.lower_bound).is_none_or(|l| ids::compare(&id, &l).is_ge())
                && decode(&p.upper_bound).is_none_or(|u| ids::compare(&id, &u).is_lt())
        })
        .expect("a partition of s1 covers the extra _id");

    fx.configure(&[
        "--max-missing",
        "1000",
        "--max-mismatched",
        "1000",
        "--max-misplaced",
        "1000",
    ])
    .await;
    for extra_args in [&[][..], &["--full"][..]] {
        let out = fx.reconcile(extra_args).await;
        out.expect_code(1, "reconcile with a count mismatch and lenient thresholds");
        let report = out.json();
        assert_eq!(report["run"]["passed"], Value::Bool(false), "{report:#}");
        let counts: Vec<&Value> = findings(&report)
            .iter()
            .filter(|f| f["kind"] == "count")
            .collect();
        assert_eq!(counts.len(), 1, "{report:#}");
        let f = counts[0];
        assert_eq!(f["stratum"], format!("partition:{}", holder.id), "{f}");
        assert_eq!(f["details"]["partition"].as_i64(), Some(holder.id), "{f}");
        assert_eq!(f["details"]["location"], "s1/orders", "{f}");
        let ledger = holder.scanned + holder.skipped_foreign;
        assert_eq!(f["details"]["ledger"].as_i64(), Some(ledger), "{f}");
        assert_eq!(f["details"]["count"].as_i64(), Some(ledger + 1), "{f}");
        assert_eq!(report["run"]["summary"]["thresholds"]["max_missing"], 1000);
        if extra_args.contains(&"--full") {
            // The full scan also sees the document itself, with no copy.
            let f = finding(&report, "missing", extra_id);
            assert_eq!(f["details"]["source"], "s1/orders", "{f}");
        }
    }
    fx.assert_gate_closed().await;

    // Back to no tolerance; the extra document goes, one copy goes missing.
    fx.coll(&s1_source())
        .delete_one(doc! { "_id": extra_id })
        .await
        .unwrap();
    fx.configure(&[
        "--max-missing",
        "0",
        "--max-mismatched",
        "0",
        "--max-misplaced",
        "0",
    ])
    .await;
    let s3 = loc("s3", COLLECTION);
    let gone = e.moving(&s1_source(), &s3, |_| true);
    fx.coll(&s3)
        .delete_one(doc! { "_id": &gone })
        .await
        .unwrap();
    let out = fx.reconcile(&["--full"]).await;
    out.expect_code(1, "reconcile with one missing document and --max-missing 0");
    assert_eq!(
        finding_keys(&out.json()),
        BTreeSet::from([("missing".to_owned(), gone.clone())])
    );
    fx.assert_gate_closed().await;

    fx.configure(&["--max-missing", "1"]).await;
    let out = fx.reconcile(&["--full"]).await;
    out.expect_code(0, "reconcile with one missing document and --max-missing 1");
    let report = out.json();
    assert_passed(&report);
    assert_eq!(
        finding_keys(&report),
        BTreeSet::from([("missing".to_owned(), gone.clone())]),
        "the finding is still reported: {report:#}"
    );
    assert_eq!(report["run"]["summary"]["thresholds"]["max_missing"], 1);
    let runs = fx.store.reconciliation_runs(fx.migration).await.unwrap();
    assert_eq!(runs[0].passed, Some(true));
    fx.advance("new_reads")
        .await
        .expect_code(0, "advance --to new_reads");
    assert_eq!(fx.phase().await, Phase::NewReads);
}

/// Shadow reads (issue 14): after a passing run, two pristine copies are altered behind
/// reshard's back. A router shadowing every read reports both (id and both locations) while
/// the application gets its answers as usual; `migration status` shows the reads compared and
/// the mismatches; the gate refuses `new_reads` naming them; the application then rewrites one
/// of the two; `reshard repair` copies the other again from its source and resolves the
/// rewritten one as superseded; the gate opens.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shadow_reads_report_an_altered_copy_and_hold_the_gate_until_repaired() {
    let docs = make_docs(30, 30, 10);
    let fx = Fixture::backfilled(&docs).await;
    fx.to_reconcile().await;
    let e = Expect::of(&fx, &docs);
    fx.reconcile(&[]).await.expect_code(0, "a clean run");
    fx.configure(&["--shadow-read-percent", "100"]).await;
    let router = fx.router().await;
    let tenant = |id: &str| tenant_of(docs.iter().find(|d| id_of(d) == id).unwrap()).to_owned();

    let (s3, s4) = (loc("s3", COLLECTION), loc("s4", COLLECTION));
    let altered = e.moving(&s1_source(), &s3, |_| true);
    let rewritten = e.moving(&loc("s2", COLLECTION), &s4, |_| true);
    fx.alter_copy(&s3, &altered).await;
    fx.alter_copy(&s4, &rewritten).await;

    // Clean copies compare equal; the application reads what the target holds.
    let clean: Vec<String> = e
        .moved
        .keys()
        .filter(|id| **id != altered && **id != rewritten)
        .take(8)
        .cloned()
        .collect();
    for id in &clean {
        let got = router.get(tenant(id), id.as_str()).await.unwrap().unwrap();
        assert_eq!(got.get_str("_id").unwrap(), id);
    }
    for id in [&altered, &rewritten] {
        let got = router.get(tenant(id), id.as_str()).await.unwrap().unwrap();
        assert_eq!(
            got.get_i32("total").unwrap(),
            -1,
            "the application sees the target"
        );
    }

    let store = fx.store.clone();
    let m = fx.migration;
    eventually("two shadow mismatches", || {
        let store = store.clone();
        async move { store.shadow_mismatches(m, true).await.unwrap().len() == 2 }
    })
    .await;
    let open = fx.store.shadow_mismatches(m, true).await.unwrap();
    let found: BTreeMap<String, (String, String, Value)> = open
        .iter()
        .map(|o| {
            (
                o.doc_id_text.clone(),
                (
                    o.source_location.clone(),
                    o.target_location.clone(),
                    o.fields.clone(),
                ),
            )
        })
        .collect();
    assert_eq!(
        found.get(&altered),
        Some(&(
            "s1/orders".to_owned(),
            "s3/orders".to_owned(),
            serde_json::json!(["note", "total"])
        )),
        "{open:?}"
    );
    assert_eq!(
        found.get(&rewritten).map(|f| (f.0.as_str(), f.1.as_str())),
        Some(("s2/orders", "s4/orders")),
        "{open:?}"
    );

    // The heartbeat stores the counts; `migration status` shows them.
    let deadline = Instant::now() + Duration::from_secs(10);
    let shown = loop {
        let shown = fx.shadow_status().await;
        if shown["reads_compared"].as_i64() == Some(clean.len() as i64 + 2) {
            break shown;
        }
        assert!(
            Instant::now() < deadline,
            "the counts never reached status: {shown:#}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(shown["percent"], 100.0, "{shown:#}");
    assert_eq!(shown["mismatches"], 2, "{shown:#}");
    assert_eq!(shown["open_mismatches"], 2, "{shown:#}");
    let listed: BTreeSet<&str> = shown["open"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|o| o["_id"].as_str())
        .collect();
    assert_eq!(
        listed,
        BTreeSet::from([altered.as_str(), rewritten.as_str()]),
        "{shown:#}"
    );
    let id = fx.migration.to_string();
    let text = fx.cli(&["migration", "status", &id]).await;
    assert!(
        text.stdout
            .contains("100% of reads; 10 compared, 2 mismatches (2 documents open, 0 resolved)"),
        "{}",
        text.stdout
    );
    assert!(text.stdout.contains(&altered), "{}", text.stdout);

    // The run passed, but the mismatches hold the gate shut, named and counted.
    let out = fx.advance("new_reads").await;
    out.expect_code(1, "advance with shadow mismatches open");
    assert!(
        out.stderr
            .contains("2 shadow read mismatch(es) are unresolved"),
        "{}",
        out.stderr
    );
    assert!(
        out.stderr.contains(&format!("reshard repair {id}")),
        "{}",
        out.stderr
    );
    assert_eq!(fx.phase().await, Phase::Reconcile);

    // The application rewrites one of them: its write is newer than the source.
    router
        .update(
            tenant(&rewritten),
            rewritten.as_str(),
            doc! { "$set": { "status": "paid" } },
        )
        .await
        .unwrap();

    let out = fx.repair().await;
    out.expect_code(0, "repair");
    let report = out.json();
    let by_id: BTreeMap<String, Value> = report["shadow_mismatches"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| (r["_id"].as_str().unwrap().to_owned(), r.clone()))
        .collect();
    assert_eq!(by_id[&altered]["resolution"], "repaired", "{report:#}");
    assert_eq!(by_id[&rewritten]["resolution"], "superseded", "{report:#}");
    assert_eq!(by_id[&rewritten]["why"], "superseded", "{report:#}");

    // The copy equals its source again, and is still a pristine copy.
    let copy = fx.find(&s3, &altered).await.unwrap();
    let source = fx.find(&s1_source(), &altered).await.unwrap();
    assert!(reshard::envelope::is_pristine_copy(&copy), "{copy:?}");
    assert!(
        reshard::envelope::content_differences(&source, &copy, &fx.v1, &fx.v2).is_empty(),
        "{source:?} vs {copy:?}"
    );
    // The application's write was left alone.
    let app = fx.find(&s4, &rewritten).await.unwrap();
    assert_eq!(app.get_str("status").unwrap(), "paid");
    assert!(fx
        .store
        .shadow_mismatches(m, true)
        .await
        .unwrap()
        .is_empty());
    let totals = fx.store.shadow_totals(m).await.unwrap();
    assert_eq!((totals.open, totals.resolved), (0, 2), "{totals:?}");

    // Reading the repaired copy compares equal now: no new mismatch.
    router
        .get(tenant(&altered), altered.as_str())
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(fx
        .store
        .shadow_mismatches(m, true)
        .await
        .unwrap()
        .is_empty());

    router.shutdown().await;
    fx.advance("new_reads")
        .await
        .expect_code(0, "advance once the mismatches are resolved");
    assert_eq!(fx.phase().await, Phase::NewReads);
}

/// Shadow reads are off by default: reading an altered copy compares nothing and reports
/// nothing. Turned on while the router runs (a settings change, no new epoch), the router
/// follows at its next poll and the same read is reported.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_shadow_reads_nothing_is_compared_until_they_are_turned_on() {
    let docs = make_docs(20, 20, 10);
    let fx = Fixture::backfilled(&docs).await;
    fx.to_reconcile().await;
    let e = Expect::of(&fx, &docs);
    let router = fx.router().await;
    let tenant = |id: &str| tenant_of(docs.iter().find(|d| id_of(d) == id).unwrap()).to_owned();
    let s3 = loc("s3", COLLECTION);
    let altered = e.moving(&s1_source(), &s3, |_| true);
    fx.alter_copy(&s3, &altered).await;

    for id in e.moved.keys().take(20).chain([&altered]) {
        router.get(tenant(id), id.as_str()).await.unwrap().unwrap();
    }
    // Several heartbeats: whatever was counted has been reported by now.
    tokio::time::sleep(Duration::from_millis(1_000)).await;
    let shown = fx.shadow_status().await;
    assert_eq!(shown["percent"], 0.0, "{shown:#}");
    assert_eq!(shown["reads_compared"], 0, "{shown:#}");
    assert_eq!(shown["mismatches"], 0, "{shown:#}");
    assert_eq!(shown["open_mismatches"], 0, "{shown:#}");
    let routers = fx.cli(&["--output", "json", "router", "list"]).await;
    routers.expect_code(0, "routers list");
    let routers = routers.json();
    let stats = &routers.as_array().unwrap()[0]["stats"]["shadow"];
    assert_eq!(stats["compared"], 0, "{routers:#}");

    fx.configure(&["--shadow-read-percent", "100"]).await;
    let store = fx.store.clone();
    let m = fx.migration;
    eventually(
        "the router to follow the setting and report the altered copy",
        || {
            let (router, store, tenant, altered) = (&router, &store, &tenant, &altered);
            async move {
                router.get(tenant(altered), altered.as_str()).await.unwrap();
                tokio::time::sleep(Duration::from_millis(50)).await;
                store.shadow_mismatches(m, true).await.unwrap().len() == 1
            }
        },
    )
    .await;
    assert_eq!(
        router.snapshot().await.epoch,
        fx.epoch().await,
        "no new epoch was needed"
    );
    router.shutdown().await;
}

//! Benchmark: single-document operations at 1, 16 and 64 concurrent connections, three ways
//! side by side in one run (BENCHMARKS.md, "The front against the library"):
//!
//! * **direct**: the official Rust driver straight to the servers (a plain collection, no
//!   routing);
//! * **library**: the router library in process (`Router::insert`, `get`, `update`);
//! * **front**: the official Rust driver through a `reshard front` process (the release-built
//!   binary `cargo bench` builds), which calls the same router engine.
//!
//! ```text
//! cargo bench --bench front
//! ```
//!
//! Three SecantusDB servers: version 1 keeps the collection on `s1`, version 2 spreads it over
//! `s2` and `s3` (4 buckets per tenant). The migration is moved to `new_writes` through the
//! phase machine (every router acknowledging each epoch) and stays there: inserts go to the
//! target, a read looks in the target and then in the source, an update of a document still in
//! the source moves it. The operations cycle insert (a new id), find by tenant and `_id`,
//! update by tenant and `_id` (`$inc`), the reads and updates on random documents of
//! `RESHARD_BENCH_FRONT_DOCS` (default 2,000) loaded into each way's collection beforehand.
//! Each way gets its own ids. For each concurrency (`RESHARD_BENCH_FRONT_CONNECTIONS`, default
//! `1,16,64`) the three ways run one after another, each with `RESHARD_BENCH_FRONT_WARMUP`
//! (default 300) operations of warm-up and then `RESHARD_BENCH_FRONT_OPS` (default 6,000)
//! measured ones shared by that many tasks, each on a connection of its own (the driver's
//! pool sized to the concurrency; the router's shard clients keep their defaults, in the
//! library and in the front alike). Besides latency and throughput, the servers' own counters
//! (`serverStatus`: `network.numRequests`, CRUD `opcounters`) and the state store's
//! transactions (`pg_stat_database`) give the round trips per operation of each way.

#[path = "../tests/support/mod.rs"]
mod support;

use std::collections::BTreeMap;
use std::process::{Child, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use mongodb::bson::{doc, Document};
use mongodb::{Client, Collection};
use rand::Rng;
use reshard::phase::{Action, Phase};
use reshard::router::{Router, RouterConfig};
use reshard::store::Store;
use support::{MongoServer, PgDb, Shards};

const V1: &str = "tenant_key: customerId
layout: hashed
virtual_buckets: 1024
placement:
  - vbuckets: [0, 1024]
    shard: s1
";

const V2: &str = "tenant_key: customerId
layout: hashed
virtual_buckets: 1024
routing_field: bucket
default_buckets: 4
placement:
  - vbuckets: [0, 512]
    shard: s2
  - vbuckets: [512, 1024]
    shard: s3
";

const TENANTS: usize = 200;
const BENCH: &str = "front";

fn env_or(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn tenant(i: usize) -> String {
    format!("c-{:04}", i % TENANTS)
}

fn document(id: String, i: usize) -> Document {
    doc! {
        "_id": id,
        "customerId": tenant(i),
        "total": i as i64,
        "status": "paid",
        "lines": [{ "sku": format!("sku-{}", i % 97), "qty": 1 }],
        "note": "x".repeat(120),
    }
}

/// The id of preloaded document `i` of a way.
fn preloaded_id(way: Way, i: usize) -> String {
    format!("{}-{i:06}", way.prefix())
}

/// Nearest-rank percentile of sorted microseconds, in milliseconds.
fn percentile(sorted: &[u64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1] as f64 / 1000.0
}

#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Debug)]
enum Way {
    Direct,
    Library,
    Front,
}

impl Way {
    fn name(self) -> &'static str {
        match self {
            Way::Direct => "direct",
            Way::Library => "library",
            Way::Front => "front",
        }
    }

    fn prefix(self) -> &'static str {
        match self {
            Way::Direct => "d",
            Way::Library => "l",
            Way::Front => "f",
        }
    }
}

/// What one cell's tasks talk to.
#[derive(Clone)]
enum Target {
    /// The plain collections on `s2` and `s3`; a document goes to the one of its tenant's
    /// parity.
    Direct(Arc<Vec<Collection<Document>>>),
    Library(Arc<Router>),
    Front(Collection<Document>),
}

impl Target {
    async fn insert(&self, d: Document, i: usize) {
        match self {
            Target::Direct(c) => {
                c[i % TENANTS % 2].insert_one(d).await.unwrap();
            }
            Target::Library(r) => r.insert(d).await.unwrap(),
            Target::Front(c) => {
                c.insert_one(d).await.unwrap();
            }
        }
    }

    async fn find(&self, id: &str, i: usize) {
        let t = tenant(i);
        let found = match self {
            Target::Direct(c) => c[i % TENANTS % 2]
                .find_one(doc! { "customerId": &t, "_id": id })
                .await
                .unwrap()
                .is_some(),
            Target::Library(r) => r.get(t.as_str(), id).await.unwrap().is_some(),
            Target::Front(c) => c
                .find_one(doc! { "customerId": &t, "_id": id })
                .await
                .unwrap()
                .is_some(),
        };
        assert!(found, "{id} not found");
    }

    async fn update(&self, id: &str, i: usize) {
        let t = tenant(i);
        let change = doc! { "$inc": { "total": 1 } };
        let matched = match self {
            Target::Direct(c) => {
                c[i % TENANTS % 2]
                    .update_one(doc! { "customerId": &t, "_id": id }, change)
                    .await
                    .unwrap()
                    .matched_count
                    == 1
            }
            Target::Library(r) => r.update(t.as_str(), id, change).await.unwrap(),
            Target::Front(c) => {
                c.update_one(doc! { "customerId": &t, "_id": id }, change)
                    .await
                    .unwrap()
                    .matched_count
                    == 1
            }
        };
        assert!(matched, "{id} not updated");
    }
}

/// `ops` operations by `concurrency` tasks: insert, find, update, insert, ... by a shared
/// counter. Returns every operation's microseconds (with its kind: 0 insert, 1 find, 2
/// update) and the wall time.
async fn run_ops(
    target: &Target,
    way: Way,
    tag: &str,
    concurrency: usize,
    ops: usize,
    docs: usize,
) -> (Vec<(usize, u64)>, Duration) {
    let next = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let tasks: Vec<_> = (0..concurrency)
        .map(|_| {
            let (target, next, tag) = (target.clone(), next.clone(), tag.to_owned());
            tokio::spawn(async move {
                let mut took = Vec::with_capacity(ops / concurrency + 1);
                loop {
                    let k = next.fetch_add(1, Ordering::Relaxed) as usize;
                    if k >= ops {
                        break;
                    }
                    let i = rand::thread_rng().gen_range(0..docs);
                    let at = Instant::now();
                    match k % 3 {
                        0 => {
                            let id = format!("{}-{tag}-{k:07}", way.prefix());
                            target.insert(document(id, k), k).await;
                        }
                        1 => target.find(&preloaded_id(way, i), i).await,
                        _ => target.update(&preloaded_id(way, i), i).await,
                    }
                    took.push((k % 3, at.elapsed().as_micros() as u64));
                }
                took
            })
        })
        .collect();
    let mut all = Vec::with_capacity(ops);
    for t in tasks {
        all.extend(t.await.unwrap());
    }
    (all, started.elapsed())
}

/// The servers' request count and CRUD command count (`serverStatus`), summed.
async fn server_counts(servers: &[Client]) -> (i64, i64) {
    let (mut requests, mut crud) = (0, 0);
    for c in servers {
        let s = c
            .database("admin")
            .run_command(doc! { "serverStatus": 1 })
            .await
            .unwrap();
        let n = |d: &Document, k: &str| d.get_i64(k).or_else(|_| d.get_i32(k).map(i64::from));
        requests += n(s.get_document("network").unwrap(), "numRequests").unwrap_or(0);
        let o = s.get_document("opcounters").unwrap();
        for k in ["insert", "query", "update", "delete", "getmore"] {
            crud += n(o, k).unwrap_or(0);
        }
    }
    (requests, crud)
}

/// The state store database's committed and rolled-back transactions so far (the statistics
/// are flushed at most once a second: read after a pause).
async fn store_transactions(pool: &sqlx::PgPool, name: &str) -> i64 {
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    let _ = sqlx::query("select pg_stat_clear_snapshot()")
        .execute(pool)
        .await;
    sqlx::query_scalar::<_, i64>(
        "select xact_commit + xact_rollback from pg_stat_database where datname = $1",
    )
    .bind(name)
    .fetch_one(pool)
    .await
    .unwrap()
}

struct Cell {
    way: Way,
    concurrency: usize,
    ops: usize,
    p50: f64,
    p99: f64,
    mean: f64,
    throughput: f64,
    requests_per_op: f64,
    crud_per_op: f64,
    store_per_op: f64,
}

/// A free port on 127.0.0.1 (bound, read, released).
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn driver_uri(host_port: &str, pool: usize) -> String {
    format!(
        "mongodb://{host_port}/?directConnection=true&serverMonitoringMode=poll&\
         maxIdleTimeMS=60000&retryWrites=false&maxPoolSize={pool}"
    )
}

struct FrontProcess(Child);

impl Drop for FrontProcess {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn main() {
    support::bench_main(BENCH, bench);
}

async fn bench() {
    let n_docs = env_or("RESHARD_BENCH_FRONT_DOCS", 2_000);
    let ops = env_or("RESHARD_BENCH_FRONT_OPS", 6_000);
    let warmup = env_or("RESHARD_BENCH_FRONT_WARMUP", 300);
    let connections: Vec<usize> = std::env::var("RESHARD_BENCH_FRONT_CONNECTIONS")
        .unwrap_or_else(|_| "1,16,64".into())
        .split(',')
        .map(|c| {
            c.trim()
                .parse()
                .expect("RESHARD_BENCH_FRONT_CONNECTIONS: 1,16,64")
        })
        .collect();

    let (servers, pg) = tokio::join!(Shards::start(3), PgDb::fresh());
    let store = Store::connect_unchecked(&pg.url()).await.unwrap();
    store.migrate().await.unwrap();
    let db_name = MongoServer::database_name();
    let mut databases = BTreeMap::new();
    let mut admin = Vec::new();
    for server in servers.iter() {
        store
            .add_shard(server.name(), &server.uri(), &db_name)
            .await
            .unwrap();
        let client = reshard::shards::writer_client(&server.uri()).await.unwrap();
        databases.insert(server.name().to_string(), client.database(&db_name));
        admin.push(Client::with_uri_str(server.uri()).await.unwrap());
    }
    for (file, text) in [("v1.yaml", V1), ("v2.yaml", V2)] {
        let v = reshard::spec::parse_version_spec(file, text, "orders").unwrap();
        store.insert_version(&v, text, "bench").await.unwrap();
    }
    // The routed ways' documents in the source (version 1: all on s1), the direct way's in
    // plain collections on s2 and s3.
    let routed: Vec<Document> = [Way::Library, Way::Front]
        .into_iter()
        .flat_map(|w| (0..n_docs).map(move |i| document(preloaded_id(w, i), i)))
        .collect();
    databases["s1"]
        .collection::<Document>("orders")
        .insert_many(routed)
        .await
        .unwrap();
    let direct_names = ["s2", "s3"];
    for (parity, name) in direct_names.iter().enumerate() {
        let chunk: Vec<Document> = (0..n_docs)
            .filter(|i| i % TENANTS % 2 == parity)
            .map(|i| document(preloaded_id(Way::Direct, i), i))
            .collect();
        databases[*name]
            .collection::<Document>("orders_direct")
            .insert_many(chunk)
            .await
            .unwrap();
    }
    let migration = store
        .create_migration("orders", 1, 2, "bench")
        .await
        .unwrap()
        .id;
    let router = Arc::new(
        Router::with_shards(
            store.clone(),
            "orders",
            RouterConfig::named("bench-library"),
            databases.clone(),
        )
        .await
        .unwrap(),
    );
    for phase in [Phase::DualRead, Phase::WriteSwitch, Phase::NewWrites] {
        let t = store
            .transition(migration, &Action::Advance(phase), "bench", None, false)
            .await
            .unwrap();
        assert!(
            router
                .wait_for_epoch(t.migration.epoch, Duration::from_secs(10))
                .await
        );
        let deadline = Instant::now() + Duration::from_secs(15);
        while !store
            .unacknowledged_routers(&t.migration)
            .await
            .unwrap()
            .is_empty()
        {
            assert!(Instant::now() < deadline, "no acknowledgement");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    // The front: the release binary, serving the routed collection as database `shop`.
    let front_addr = format!("127.0.0.1:{}", free_port());
    let log = std::env::temp_dir().join(format!("reshard-bench-front-{}.log", std::process::id()));
    let _front = FrontProcess(
        std::process::Command::new(env!("CARGO_BIN_EXE_reshard"))
            .args([
                "front",
                "--listen",
                &front_addr,
                "--database",
                "shop",
                "--name",
                "bench-front",
            ])
            .env("RESHARD_DATABASE_URL", pg.url())
            .env("RESHARD_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap(),
    );
    {
        let probe = Client::with_uri_str(driver_uri(&front_addr, 1))
            .await
            .unwrap();
        let orders = probe.database("shop").collection::<Document>("orders");
        let deadline = Instant::now() + Duration::from_secs(60);
        let i = 0;
        loop {
            match orders
                .find_one(doc! { "customerId": tenant(i), "_id": preloaded_id(Way::Front, i) })
                .await
            {
                Ok(Some(_)) => break,
                Ok(None) => panic!("the front does not find a preloaded document"),
                Err(e) => {
                    assert!(
                        Instant::now() < deadline,
                        "the front did not answer: {e}; log {}",
                        log.display()
                    );
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            }
        }
    }
    let phase = store.migration(migration).await.unwrap().phase;
    eprintln!(
        "phase {phase:?}; {n_docs} documents per way; {ops} operations per cell after {warmup} \
         of warm-up; connections {connections:?}; front at {front_addr} (log {})",
        log.display()
    );

    let pool = pg.pool().await;
    let mut cells = Vec::new();
    for &concurrency in &connections {
        for way in [Way::Direct, Way::Library, Way::Front] {
            let target = match way {
                Way::Direct => {
                    let mut colls = Vec::new();
                    for name in direct_names {
                        let server = servers.iter().find(|s| s.name() == name).unwrap();
                        let host_port = format!("{}:{}", server.host(), server.port());
                        let c = Client::with_uri_str(driver_uri(&host_port, concurrency))
                            .await
                            .unwrap();
                        colls.push(c.database(&db_name).collection("orders_direct"));
                    }
                    Target::Direct(Arc::new(colls))
                }
                Way::Library => Target::Library(router.clone()),
                Way::Front => {
                    let c = Client::with_uri_str(driver_uri(&front_addr, concurrency))
                        .await
                        .unwrap();
                    Target::Front(c.database("shop").collection("orders"))
                }
            };
            let tag = format!("c{concurrency}");
            run_ops(
                &target,
                way,
                &format!("{tag}w"),
                concurrency,
                warmup,
                n_docs,
            )
            .await;
            let tx_before = store_transactions(&pool, pg.name()).await;
            let (req_before, crud_before) = server_counts(&admin).await;
            let (kinds, wall) = run_ops(&target, way, &tag, concurrency, ops, n_docs).await;
            let by_kind: Vec<f64> = (0..3)
                .map(|kind| {
                    let mut v: Vec<u64> = kinds
                        .iter()
                        .filter(|(k, _)| *k == kind)
                        .map(|(_, us)| *us)
                        .collect();
                    v.sort_unstable();
                    percentile(&v, 50.0)
                })
                .collect();
            let mut took: Vec<u64> = kinds.iter().map(|(_, us)| *us).collect();
            let (req_after, crud_after) = server_counts(&admin).await;
            let tx_after = store_transactions(&pool, pg.name()).await;
            took.sort_unstable();
            let cell = Cell {
                way,
                concurrency,
                ops,
                p50: percentile(&took, 50.0),
                p99: percentile(&took, 99.0),
                mean: took.iter().sum::<u64>() as f64 / took.len() as f64 / 1000.0,
                throughput: ops as f64 / wall.as_secs_f64(),
                // The counting's own `serverStatus` calls (3 before, 3 after) are taken off.
                requests_per_op: (req_after - req_before - 3) as f64 / ops as f64,
                crud_per_op: (crud_after - crud_before) as f64 / ops as f64,
                // The counting's own two queries, and the routers' heartbeats, are in it.
                store_per_op: (tx_after - tx_before) as f64 / ops as f64,
            };
            eprintln!(
                "  {:>7} x{:<3} p50 {:.3} ms, p99 {:.3} ms, {:.0} ops/s; p50 insert {:.3} ms, \
                 find {:.3} ms, update {:.3} ms",
                way.name(),
                concurrency,
                cell.p50,
                cell.p99,
                cell.throughput,
                by_kind[0],
                by_kind[1],
                by_kind[2]
            );
            cells.push(cell);
        }
    }

    println!();
    println!(
        "| way | connections | ops | p50 | p99 | mean | throughput | server requests / op | \
         CRUD commands / op | state-store transactions / op |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|");
    for c in &cells {
        println!(
            "| {} | {} | {} | {:.3} ms | {:.3} ms | {:.3} ms | {:.0} ops/s | {:.2} | {:.2} | {:.3} |",
            c.way.name(),
            c.concurrency,
            c.ops,
            c.p50,
            c.p99,
            c.mean,
            c.throughput,
            c.requests_per_op,
            c.crud_per_op,
            c.store_per_op
        );
    }
    println!();
    println!(
        "| connections | front p50 − library p50 (target ≤ 0.3 ms) | front / library throughput \
         (target ≥ 90 %) | library / direct throughput |"
    );
    println!("|---|---|---|---|");
    for &concurrency in &connections {
        let of = |w: Way| {
            cells
                .iter()
                .find(|c| c.way == w && c.concurrency == concurrency)
                .unwrap()
        };
        let (d, l, f) = (of(Way::Direct), of(Way::Library), of(Way::Front));
        let gap = f.p50 - l.p50;
        let ratio = f.throughput / l.throughput;
        println!(
            "| {concurrency} | {gap:+.3} ms {} | {:.1} % {} | {:.1} % |",
            if gap <= 0.3 { "(met)" } else { "(missed)" },
            100.0 * ratio,
            if ratio >= 0.9 { "(met)" } else { "(missed)" },
            100.0 * l.throughput / d.throughput
        );
        support::bench_figure(
            BENCH,
            &format!("front p50 - library p50, {concurrency} connections"),
            format!("{gap:+.3} ms"),
        );
        support::bench_figure(
            BENCH,
            &format!("front / library throughput, {concurrency} connections"),
            format!("{:.1} %", 100.0 * ratio),
        );
    }
    router.shutdown().await;
}

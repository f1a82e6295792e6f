//! Benchmark: the application's `get` latency through a router with shadow reads at 0% and at
//! 10%, side by side, on the same servers and data (BENCHMARKS.md, "Shadow reads"). A
//! benchmark, not a test: `cargo test` builds it and returns at once.
//!
//! ```text
//! cargo bench --profile dev --bench shadow_reads
//! ```
//!
//! (`cargo bench --bench shadow_reads` measures the release build; the dev profile spares a
//! cold release build and the latency is the servers' anyway.)
//!
//! One source server (`s1`) holds the collection in version 1; version 2 spreads it over two
//! target servers (`s2`, `s3`). The migration is moved to `backfill` through the phase machine
//! with the router acknowledging every epoch, a worker copies every document, and the
//! migration stays in `backfill`, where reads go to the target first and shadow reads compare
//! each sampled read's pristine copy with its source. One application task reads random ids
//! one after another through one router. The two settings alternate in rounds (0, 10, 10, 0,
//! 0, 10, ...) so that drift in the machine's load falls on both alike; each setting gets
//! `RESHARD_BENCH_GETS` reads (default 20,000) in `RESHARD_BENCH_ROUNDS` rounds (default 10).

#[path = "../tests/support/mod.rs"]
mod support;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use mongodb::bson::{doc, Document};
use rand::Rng;
use reshard::phase::{Action, Phase};
use reshard::router::{Router, RouterConfig};
use reshard::settings::MigrationSettings;
use reshard::store::Store;
use reshard::worker::{Worker, WorkerConfig};
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

fn env_or(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn documents(n: usize) -> Vec<Document> {
    (0..n)
        .map(|i| {
            doc! {
                "_id": format!("o-{i:06}"),
                "customerId": format!("c-{:04}", i % TENANTS),
                "total": i as i64,
                "status": "paid",
                "lines": [{ "sku": format!("sku-{}", i % 97), "qty": 1 }],
                "note": "x".repeat(120),
            }
        })
        .collect()
}

/// Nearest-rank percentile of sorted microseconds, in milliseconds.
fn percentile(sorted: &[u64], p: f64) -> f64 {
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1] as f64 / 1000.0
}

fn main() {
    support::bench_main("shadow_reads", bench);
}

async fn bench() {
    let n_docs = env_or("RESHARD_BENCH_DOCS", 2_000);
    let gets = env_or("RESHARD_BENCH_GETS", 20_000);
    let rounds = env_or("RESHARD_BENCH_ROUNDS", 10).max(2);
    // Half of the rounds are each setting's.
    let per_round = 2 * gets / rounds;

    let (shards, pg) = tokio::join!(Shards::start(3), PgDb::fresh());
    let store = Store::connect_unchecked(&pg.url()).await.unwrap();
    store.migrate().await.unwrap();
    let db_name = MongoServer::database_name();
    let mut databases = BTreeMap::new();
    for server in shards.iter() {
        store
            .add_shard(server.name(), &server.uri(), &db_name)
            .await
            .unwrap();
        let client = reshard::shards::writer_client(&server.uri()).await.unwrap();
        databases.insert(server.name().to_string(), client.database(&db_name));
    }
    for (file, text) in [("v1.yaml", V1), ("v2.yaml", V2)] {
        let v = reshard::spec::parse_version_spec(file, text, "orders").unwrap();
        store.insert_version(&v, text, "bench").await.unwrap();
    }
    let docs = documents(n_docs);
    databases["s1"]
        .collection::<Document>("orders")
        .insert_many(docs.clone())
        .await
        .unwrap();
    let m = store
        .create_migration("orders", 1, 2, "bench")
        .await
        .unwrap()
        .id;

    let mut config = RouterConfig::named("bench-app");
    config.heartbeat_interval = Duration::from_millis(200);
    let router = Router::with_shards(store.clone(), "orders", config, databases.clone())
        .await
        .unwrap();
    for phase in [
        Phase::DualRead,
        Phase::WriteSwitch,
        Phase::NewWrites,
        Phase::Backfill,
    ] {
        let t = store
            .transition(m, &Action::Advance(phase), "bench", None, false)
            .await
            .unwrap();
        assert!(
            router
                .wait_for_epoch(t.migration.epoch, Duration::from_secs(10))
                .await
        );
        // The acknowledgement is the heartbeat after the switch.
        let deadline = Instant::now() + Duration::from_secs(10);
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
    let mut worker = WorkerConfig::new("bench-worker");
    worker.migration = Some(m);
    worker.exit_when_done = true;
    worker.lease_ttl = Duration::from_secs(10);
    worker.idle_poll = Duration::from_millis(200);
    let (_stop, shutdown) = tokio::sync::watch::channel(false);
    Worker::with_shards(store.clone(), databases.clone(), worker)
        .run(shutdown)
        .await
        .unwrap();
    let copied = store
        .task_totals(m, reshard::store::partitions::Task::Backfill)
        .await
        .unwrap();
    eprintln!(
        "{n_docs} documents copied to the target ({} inserted); phase backfill; {gets} gets per \
         setting in {rounds} rounds",
        copied.inserted
    );

    let mut latencies: BTreeMap<u32, Vec<u64>> = BTreeMap::new();
    let mut rng = rand::thread_rng();
    // Warm-up: connections, caches.
    for _ in 0..500 {
        let d = &docs[rng.gen_range(0..docs.len())];
        router
            .get(d.get_str("customerId").unwrap(), d.get_str("_id").unwrap())
            .await
            .unwrap()
            .unwrap();
    }
    let started = Instant::now();
    for round in 0..rounds {
        // 0, 10, 10, 0, 0, 10, ...: each setting runs first in half of the pairs.
        let percent: u32 = [0, 10, 10, 0][round % 4];
        store
            .update_settings(
                m,
                |s: &mut MigrationSettings| s.shadow_read_percent = f64::from(percent),
                "bench",
                None,
            )
            .await
            .unwrap();
        // The router follows settings with its next poll.
        tokio::time::sleep(Duration::from_millis(600)).await;
        let samples = latencies.entry(percent).or_default();
        for _ in 0..per_round {
            let d = &docs[rng.gen_range(0..docs.len())];
            let t = Instant::now();
            let got = router
                .get(d.get_str("customerId").unwrap(), d.get_str("_id").unwrap())
                .await
                .unwrap();
            samples.push(t.elapsed().as_micros() as u64);
            assert!(got.is_some());
        }
    }
    let elapsed = started.elapsed();
    // Let the last shadow reads and a heartbeat land.
    tokio::time::sleep(Duration::from_millis(1_000)).await;
    let totals = store.shadow_totals(m).await.unwrap();
    router.shutdown().await;

    println!();
    println!("shadow reads: router get latency, phase backfill, {n_docs} documents, one reader");
    println!(
        "{:>8} {:>8} {:>10} {:>10} {:>10}",
        "shadow", "gets", "p50 ms", "p99 ms", "mean ms"
    );
    let mut p99 = BTreeMap::new();
    for (percent, samples) in &mut latencies {
        samples.sort_unstable();
        let mean = samples.iter().sum::<u64>() as f64 / samples.len() as f64 / 1000.0;
        p99.insert(*percent, percentile(samples, 99.0));
        println!(
            "{:>7}% {:>8} {:>10.3} {:>10.3} {:>10.3}",
            percent,
            samples.len(),
            percentile(samples, 50.0),
            percentile(samples, 99.0),
            mean
        );
    }
    println!(
        "p99 ratio (10% / 0%): {:.3}; reads compared {}, mismatches {}; {:.1} s of reads",
        p99[&10] / p99[&0],
        totals.compared,
        totals.mismatches,
        elapsed.as_secs_f64()
    );
    support::bench_figure(
        "shadow_reads",
        "router get p99 with 10 % shadow reads over 0 %",
        format!("{:.2}", p99[&10] / p99[&0]),
    );
    assert_eq!(totals.mismatches, 0, "a clean copy has no mismatch");
    assert!(totals.compared > 0, "shadow reads compared nothing at 10%");
}

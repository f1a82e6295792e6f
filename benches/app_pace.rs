//! Benchmark: what a backfill does to the application it protects, and how the throttle
//! answers an overload (BENCHMARKS.md, "The application sets the pace" and "Rate halving and
//! recovery"). Run it with `cargo bench --bench app_pace` (or `scripts/bench`).
//!
//! 1. **Application p99.** One source server (`s1`) and two targets (`s2`, `s3`); an
//!    application of `RESHARD_BENCH_READERS` (default 8) tasks reads and writes random orders
//!    through one router, all the time. Its p99 is measured for `RESHARD_BENCH_PACE_QUIET`
//!    seconds (default 30) without a backfill, then for up to `RESHARD_BENCH_PACE_WINDOW`
//!    seconds (default 60) during a backfill by a `reshard worker` process with the default
//!    throttle, then without one again once the worker is gone; the two quiet windows read as
//!    one are the reference (a 10-second window's p99 moved by half between two windows of the
//!    same application on this machine). Twice on
//!    fresh servers: with a latency budget of 1.3 times the p99 the routers reported when the
//!    backfill was planned, and without a budget. Also the p99 from the first checkpointed
//!    batch on ("steady"): before it, the local servers read and sort the whole collection for
//!    the scan's first batch (seconds, during which they answer nothing else: a stall
//!    MongoDB's `_id` index scan does not have), and count it for the ETA (a scan here, the
//!    collection's metadata on MongoDB).
//! 2. **Rate halving and recovery.** A worker copies at a configured maximum into a target
//!    that starts rejecting inserts with `SystemOverloadedError` (489) for a few seconds:
//!    how long from the first rejection until the applied rate is halved, and from the last
//!    rejection until it is back at the maximum (the workers' heartbeats, every 200 ms).

#[path = "../tests/support/mod.rs"]
mod support;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use mongodb::bson::{doc, Document};
use rand::Rng;
use reshard::phase::{Action, Phase};
use reshard::router::{Router, RouterConfig};
use reshard::store::Store;
use serde_json::json;
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

const TENANTS: usize = 500;

fn env_or(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn document(i: usize) -> Document {
    doc! {
        "_id": format!("o-{i:08}"),
        "customerId": format!("c-{:04}", i % TENANTS),
        "total": i as i64,
        "status": "paid",
        "lines": [{ "sku": format!("sku-{}", i % 97), "qty": 1 }],
        "note": "x".repeat(120),
    }
}

/// Nearest-rank percentile of sorted microseconds, in milliseconds.
fn percentile(sorted: &[u64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1] as f64 / 1000.0
}

/// A migration from V1 to V2 on fresh servers, moved to `backfill` with `router`
/// acknowledging every epoch.
struct Scene {
    _servers: Shards,
    pg: PgDb,
    store: Store,
    migration: i64,
    databases: BTreeMap<String, mongodb::Database>,
    router: Arc<Router>,
}

async fn scene(documents: usize, test_commands: bool) -> Scene {
    let builder = MongoServer::builder().test_commands(test_commands);
    let (servers, pg) = tokio::join!(Shards::start_with(3, builder), PgDb::fresh());
    let store = Store::connect_unchecked(&pg.url()).await.unwrap();
    store.migrate().await.unwrap();
    let db_name = MongoServer::database_name();
    let mut databases = BTreeMap::new();
    for server in servers.iter() {
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
    let source = databases["s1"].collection::<Document>("orders");
    for start in (0..documents).step_by(5_000) {
        let chunk: Vec<Document> = (start..(start + 5_000).min(documents))
            .map(document)
            .collect();
        source.insert_many(chunk).ordered(false).await.unwrap();
    }
    let migration = store
        .create_migration("orders", 1, 2, "bench")
        .await
        .unwrap()
        .id;
    let mut config = RouterConfig::named("bench-app");
    config.heartbeat_interval = Duration::from_secs(1);
    let router = Arc::new(
        Router::with_shards(store.clone(), "orders", config, databases.clone())
            .await
            .unwrap(),
    );
    for phase in [
        Phase::DualRead,
        Phase::WriteSwitch,
        Phase::NewWrites,
        Phase::Backfill,
    ] {
        let t = store
            .transition(migration, &Action::Advance(phase), "bench", None, false)
            .await
            .unwrap();
        assert!(
            router
                .wait_for_epoch(t.migration.epoch, Duration::from_secs(10))
                .await
        );
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
    Scene {
        _servers: servers,
        pg,
        store,
        migration,
        databases,
        router,
    }
}

/// The application: `readers` tasks, each reading a random order (and one time in ten
/// inserting a new one) and then pausing `pause`, until `stop`. Each operation's latency goes
/// into `samples` with the time it ended.
fn application(
    router: &Arc<Router>,
    documents: usize,
    readers: usize,
    pause: Duration,
    stop: &Arc<AtomicBool>,
    samples: &Arc<Mutex<Vec<(Instant, u64)>>>,
) -> Vec<tokio::task::JoinHandle<()>> {
    let next_id = Arc::new(AtomicU64::new(documents as u64));
    (0..readers)
        .map(|_| {
            let (router, stop, samples, next_id) = (
                router.clone(),
                stop.clone(),
                samples.clone(),
                next_id.clone(),
            );
            tokio::spawn(async move {
                while !stop.load(Ordering::Relaxed) {
                    let (write, i) = {
                        let mut rng = rand::thread_rng();
                        (rng.gen_bool(0.1), rng.gen_range(0..documents))
                    };
                    let started = Instant::now();
                    if write {
                        let n = next_id.fetch_add(1, Ordering::Relaxed) as usize;
                        router.insert(document(n)).await.unwrap();
                    } else {
                        let d = document(i);
                        let got = router
                            .get(d.get_str("customerId").unwrap(), d.get_str("_id").unwrap())
                            .await
                            .unwrap();
                        assert!(got.is_some());
                    }
                    let took = started.elapsed().as_micros() as u64;
                    samples.lock().unwrap().push((Instant::now(), took));
                    tokio::time::sleep(pause).await;
                }
            })
        })
        .collect()
}

/// The p99 (and p50, count) of the samples that ended within `[from, to)`.
fn window(samples: &Mutex<Vec<(Instant, u64)>>, from: Instant, to: Instant) -> (f64, f64, usize) {
    let mut v: Vec<u64> = samples
        .lock()
        .unwrap()
        .iter()
        .filter(|(at, _)| *at >= from && *at < to)
        .map(|(_, us)| *us)
        .collect();
    v.sort_unstable();
    (percentile(&v, 99.0), percentile(&v, 50.0), v.len())
}

/// The p99 (and count) of the samples that ended within any of `windows`.
fn pooled(samples: &Mutex<Vec<(Instant, u64)>>, windows: &[(Instant, Instant)]) -> (f64, usize) {
    let mut v: Vec<u64> = samples
        .lock()
        .unwrap()
        .iter()
        .filter(|(at, _)| windows.iter().any(|(from, to)| at >= from && at < to))
        .map(|(_, us)| *us)
        .collect();
    v.sort_unstable();
    (percentile(&v, 99.0), v.len())
}

/// One round of part 1: the application without a backfill, then during one (with the
/// latency budget factor, or none).
async fn p99_round(documents: usize, readers: usize, budget_factor: f64) -> serde_json::Value {
    let s = scene(documents, false).await;
    s.store
        .update_settings(
            s.migration,
            |m| {
                m.latency_budget_factor = budget_factor;
                if let Some(max) = std::env::var("RESHARD_BENCH_PACE_MAX")
                    .ok()
                    .and_then(|v| v.parse().ok())
                {
                    m.max_docs_per_sec = max;
                }
            },
            "bench",
            None,
        )
        .await
        .unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let samples = Arc::new(Mutex::new(Vec::new()));
    let app = application(
        &s.router,
        documents,
        readers,
        Duration::from_millis(20),
        &stop,
        &samples,
    );
    // Warm up, then measure the application alone for `RESHARD_BENCH_PACE_QUIET` seconds
    // (default 30): on this machine the p99 of one 10-second window moves by half between two
    // windows of the same application.
    let quiet = Duration::from_secs(env_or("RESHARD_BENCH_PACE_QUIET", 30) as u64);
    tokio::time::sleep(Duration::from_secs(3)).await;
    let quiet_from = Instant::now();
    tokio::time::sleep(quiet).await;
    let quiet_to = Instant::now();

    let mut worker = std::process::Command::new(env!("CARGO_BIN_EXE_reshard"));
    worker
        .args(["worker", &s.migration.to_string(), "--exit-when-done"])
        .env("RESHARD_DATABASE_URL", s.pg.url())
        .env("RESHARD_LOG", "warn")
        .stdout(std::process::Stdio::null());
    // The backfill is watched for at most `RESHARD_BENCH_PACE_WINDOW` seconds (default 60):
    // held to the application's budget it may take much longer, and what matters is the
    // application's latency meanwhile and how much was copied.
    let limit = Duration::from_secs(env_or("RESHARD_BENCH_PACE_WINDOW", 60) as u64);
    let copy_from = Instant::now();
    let mut child = worker.spawn().unwrap();
    // Each second: the applied rate the workers report, and the documents copied so far.
    let sampling = Arc::new(AtomicBool::new(true));
    let sampler = {
        let (store, migration, sampling) = (s.store.clone(), s.migration, sampling.clone());
        tokio::spawn(async move {
            let mut series = Vec::new();
            while sampling.load(Ordering::Relaxed) {
                tokio::time::sleep(Duration::from_secs(1)).await;
                let applied: f64 = store
                    .workers(migration)
                    .await
                    .unwrap()
                    .iter()
                    .filter(|r| r.live)
                    .map(|r| r.applied_docs_per_sec)
                    .sum();
                let copied = store
                    .task_totals(migration, reshard::store::partitions::Task::Backfill)
                    .await
                    .map(|t| t.scanned)
                    .unwrap_or(0);
                series.push((copy_from.elapsed().as_secs_f64(), applied.round(), copied));
            }
            series
        })
    };
    let finished = loop {
        if let Some(status) = child.try_wait().unwrap() {
            assert!(status.success(), "the worker failed");
            break true;
        }
        if copy_from.elapsed() >= limit {
            // SIGTERM: the worker finishes its batches in flight and releases its partitions.
            unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) };
            child.wait().unwrap();
            break false;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let copy_to = Instant::now();
    sampling.store(false, Ordering::Relaxed);
    let rate_series = sampler.await.unwrap();
    let copied = s
        .store
        .task_totals(s.migration, reshard::store::partitions::Task::Backfill)
        .await
        .unwrap()
        .scanned;
    // The application alone again once the worker is gone: how far the quiet p99 itself
    // moves between two windows on this machine.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let after_from = Instant::now();
    tokio::time::sleep(quiet).await;
    let after_to = Instant::now();
    stop.store(true, Ordering::Relaxed);
    for a in app {
        a.await.unwrap();
    }
    let (quiet_p99, quiet_p50, quiet_n) = window(&samples, quiet_from, quiet_to);
    let (after_p99, _, after_n) = window(&samples, after_from, after_to);
    let (copy_p99, copy_p50, copy_n) = window(&samples, copy_from, copy_to);
    // From the first checkpointed batch on: the local servers read and sort a whole query's
    // result before its first batch (seconds here, answering nothing else meanwhile); MongoDB
    // streams an `_id` index scan.
    let first_copied = rate_series
        .iter()
        .find(|(_, _, copied)| *copied > 0)
        .map(|(at, _, _)| Duration::from_secs_f64(*at));
    let steady_from = copy_from + first_copied.unwrap_or(copy_to - copy_from);
    let (steady_p99, _, steady_n) = window(&samples, steady_from, copy_to);
    // Without a backfill, before and after it as one window: the reference the issue's
    // "p99 without a backfill" is read against, free of the drift between the two.
    let (pooled_p99, pooled_n) =
        pooled(&samples, &[(quiet_from, quiet_to), (after_from, after_to)]);
    // The median of the p99s of 5-second windows: how the tail compares outside its worst
    // moments (a stall of the machine or of the single-threaded server in one window).
    let median_of_p99s = |windows: &[(Instant, Instant)]| {
        let mut p99s: Vec<f64> = windows
            .iter()
            .flat_map(|(from, to)| {
                let n = ((*to - *from).as_secs() / 5) as u32;
                (0..n).map(move |k| {
                    let at = *from + Duration::from_secs(5) * k;
                    (at, at + Duration::from_secs(5))
                })
            })
            .map(|(from, to)| window(&samples, from, to).0)
            .filter(|p| p.is_finite())
            .collect();
        p99s.sort_by(f64::total_cmp);
        p99s.get(p99s.len() / 2).copied().unwrap_or(f64::NAN)
    };
    let quiet_median_5s_p99 = median_of_p99s(&[(quiet_from, quiet_to), (after_from, after_to)]);
    let steady_median_5s_p99 = median_of_p99s(&[(steady_from, copy_to)]);
    // The p99 of each second of the backfill: where the tail comes from.
    let per_second: Vec<f64> = (0..(copy_to - copy_from).as_secs() + 1)
        .map(|k| {
            let from = copy_from + Duration::from_secs(k);
            (window(&samples, from, from + Duration::from_secs(1)).0 * 10.0).round() / 10.0
        })
        .collect();
    let m = s.store.migration(s.migration).await.unwrap();
    let cuts = s
        .store
        .events(s.migration)
        .await
        .unwrap()
        .iter()
        .filter(|e| e.details["cause"] == "app_latency")
        .count();
    s.router.shutdown().await;
    json!({
        "latency_budget_factor": budget_factor,
        "documents": documents,
        "readers": readers,
        "quiet_p50_ms": quiet_p50,
        "quiet_p99_ms": quiet_p99,
        "quiet_operations": quiet_n,
        "backfill_p50_ms": copy_p50,
        "backfill_p99_ms": copy_p99,
        "backfill_operations": copy_n,
        "backfill_seconds": (copy_to - copy_from).as_secs_f64(),
        "backfill_finished": finished,
        "documents_copied": copied,
        "copied_docs_per_sec": copied as f64 / (copy_to - copy_from).as_secs_f64(),
        "backfill_p99_over_quiet_p99": copy_p99 / quiet_p99,
        "first_batch_after_seconds": first_copied.map(|d| d.as_secs_f64()),
        "steady_p99_ms": steady_p99,
        "steady_operations": steady_n,
        "steady_p99_over_quiet_p99": steady_p99 / quiet_p99,
        "quiet_after_p99_ms": after_p99,
        "quiet_after_operations": after_n,
        "steady_p99_over_quiet_after_p99": steady_p99 / after_p99,
        "quiet_pooled_p99_ms": pooled_p99,
        "quiet_pooled_operations": pooled_n,
        "steady_p99_over_quiet_pooled_p99": steady_p99 / pooled_p99,
        "quiet_median_5s_p99_ms": quiet_median_5s_p99,
        "steady_median_5s_p99_ms": steady_median_5s_p99,
        "steady_over_quiet_median_5s_p99": steady_median_5s_p99 / quiet_median_5s_p99,
        "backfill_p99_ms_per_second": per_second,
        "applied_rate_and_copied_per_second": rate_series,
        "app_p99_baseline_ms": m.app_p99_baseline_ms,
        "app_latency_cut_events": cuts,
    })
}

/// Part 2: halving after the first overload rejection, recovery after the last.
async fn overload_round() -> serde_json::Value {
    const MAX: f64 = 2_000.0;
    const OVERLOAD: Duration = Duration::from_secs(4);
    let documents = env_or("RESHARD_BENCH_OVERLOAD_DOCS", 400_000);
    let s = scene(documents, true).await;
    s.store
        .update_settings(
            s.migration,
            |m| {
                m.max_docs_per_sec = MAX;
                m.batch_size = 200;
            },
            "bench",
            None,
        )
        .await
        .unwrap();
    let mut wc = reshard::worker::WorkerConfig::new("bench-worker");
    wc.migration = Some(s.migration);
    wc.refresh = Duration::from_millis(200);
    wc.idle_poll = Duration::from_millis(200);
    let (stop_worker, shutdown) = tokio::sync::watch::channel(false);
    let worker = reshard::worker::Worker::with_shards(s.store.clone(), s.databases.clone(), wc);
    let worker = tokio::spawn(async move { worker.run(shutdown).await.map(|_| ()) });
    let applied = || async {
        s.store
            .workers(s.migration)
            .await
            .unwrap()
            .iter()
            .filter(|r| r.live)
            .map(|r| r.applied_docs_per_sec)
            .sum::<f64>()
    };
    // Copying, at the maximum (the scan's first batch comes only once the local server has
    // read the whole result).
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let copied = s
            .store
            .task_totals(s.migration, reshard::store::partitions::Task::Backfill)
            .await
            .unwrap()
            .scanned;
        if copied >= 4_000 && applied().await >= MAX {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the worker never copied at its maximum"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let target = s._servers.get("s2");
    target
        .fail_command(json!({
            "mode": "alwaysOn",
            "data": {
                "failCommands": ["insert"],
                "errorCode": 489,
                "errorLabels": ["SystemOverloadedError"],
            },
        }))
        .await;
    let first = Instant::now();
    let halved = loop {
        if applied().await <= MAX / 2.0 {
            break first.elapsed();
        }
        assert!(first.elapsed() < Duration::from_secs(30), "never halved");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    tokio::time::sleep(OVERLOAD.saturating_sub(first.elapsed())).await;
    let mut lowest = applied().await;
    target.clear_failpoint().await;
    let last = Instant::now();
    let recovered = loop {
        let now = applied().await;
        lowest = lowest.min(now);
        if now >= MAX {
            break last.elapsed();
        }
        assert!(last.elapsed() < Duration::from_secs(600), "never recovered");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let _ = stop_worker.send(true);
    worker.await.unwrap().unwrap();
    s.router.shutdown().await;
    json!({
        "max_docs_per_sec": MAX,
        "overload_seconds": OVERLOAD.as_secs_f64(),
        "halved_after_first_rejection_seconds": halved.as_secs_f64(),
        "lowest_applied_docs_per_sec": lowest,
        "back_at_max_after_last_rejection_seconds": recovered.as_secs_f64(),
    })
}

fn main() {
    support::bench_main("app_pace", bench);
}

async fn bench() {
    let documents = env_or("RESHARD_BENCH_DOCS", 200_000);
    let readers = env_or("RESHARD_BENCH_READERS", 8);
    // `RESHARD_BENCH_PACE_ROUNDS` picks rounds (`budget,unthrottled,overload`, the default).
    let rounds = std::env::var("RESHARD_BENCH_PACE_ROUNDS")
        .unwrap_or_else(|_| "budget,unthrottled,overload".into());
    let factor: f64 = std::env::var("RESHARD_BENCH_PACE_FACTOR")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1.3);
    let budget = if rounds.contains("budget") {
        p99_round(documents, readers, factor).await
    } else {
        json!(null)
    };
    eprintln!("{budget}");
    let unthrottled = if rounds.contains("unthrottled") {
        p99_round(documents, readers, 0.0).await
    } else {
        json!(null)
    };
    eprintln!("{unthrottled}");
    if !rounds.contains("overload") {
        return;
    }
    let overload = overload_round().await;
    eprintln!("{overload}");
    println!(
        "{}",
        serde_json::to_string_pretty(&json!({
            "with_latency_budget": budget,
            "without_budget": unthrottled,
            "overload": overload,
        }))
        .unwrap()
    );
    println!();
    println!("| backfill | app p99 without a backfill (before / after / both) | app p99 during the backfill | ratio | from the first batch | ratio (to before / after / both) | median 5 s p99, quiet / steady | copied | cuts announced |");
    println!("|---|---|---|---|---|---|---|---|---|");
    for (name, r) in [
        ("throttled by a budget of 1.3 x the planned p99", &budget),
        ("default throttle, no budget", &unthrottled),
    ] {
        println!(
            "| {name} | {:.1} / {:.1} / {:.1} ms | {:.1} ms | {:.2} | {:.1} ms | {:.2} / {:.2} / **{:.2}** | {:.1} / {:.1} ms ({:.2}) | {} docs in {:.1} s{} | {} |",
            r["quiet_p99_ms"].as_f64().unwrap(),
            r["quiet_after_p99_ms"].as_f64().unwrap_or(f64::NAN),
            r["quiet_pooled_p99_ms"].as_f64().unwrap_or(f64::NAN),
            r["backfill_p99_ms"].as_f64().unwrap(),
            r["backfill_p99_over_quiet_p99"].as_f64().unwrap(),
            r["steady_p99_ms"].as_f64().unwrap_or(f64::NAN),
            r["steady_p99_over_quiet_p99"].as_f64().unwrap_or(f64::NAN),
            r["steady_p99_over_quiet_after_p99"].as_f64().unwrap_or(f64::NAN),
            r["steady_p99_over_quiet_pooled_p99"].as_f64().unwrap_or(f64::NAN),
            r["quiet_median_5s_p99_ms"].as_f64().unwrap_or(f64::NAN),
            r["steady_median_5s_p99_ms"].as_f64().unwrap_or(f64::NAN),
            r["steady_over_quiet_median_5s_p99"].as_f64().unwrap_or(f64::NAN),
            r["documents_copied"],
            r["backfill_seconds"].as_f64().unwrap(),
            if r["backfill_finished"] == true { "" } else { " (stopped)" },
            r["app_latency_cut_events"],
        );
    }
    for (name, r) in [
        ("budget 1.3x", &budget),
        ("default throttle, no budget", &unthrottled),
    ] {
        support::bench_figure(
            "app_pace",
            &format!("application p99 during a backfill ({name}) / without one"),
            format!(
                "{:.2} ({:.1} ms vs {:.1} ms); from the first batch {:.2} of the quiet windows before and after as one",
                r["backfill_p99_over_quiet_p99"].as_f64().unwrap(),
                r["backfill_p99_ms"].as_f64().unwrap(),
                r["quiet_p99_ms"].as_f64().unwrap(),
                r["steady_p99_over_quiet_pooled_p99"].as_f64().unwrap_or(f64::NAN),
            ),
        );
    }
    support::bench_figure(
        "app_pace",
        "rate halved after the first overload rejection",
        format!(
            "{:.2} s",
            overload["halved_after_first_rejection_seconds"]
                .as_f64()
                .unwrap()
        ),
    );
    support::bench_figure(
        "app_pace",
        "rate back at its maximum after the last rejection",
        format!(
            "{:.1} s",
            overload["back_at_max_after_last_rejection_seconds"]
                .as_f64()
                .unwrap()
        ),
    );
    println!();
    println!(
        "overload: rate halved {:.2} s after the first rejection; back at {} docs/s {:.1} s after the last (lowest {:.0})",
        overload["halved_after_first_rejection_seconds"].as_f64().unwrap(),
        overload["max_docs_per_sec"],
        overload["back_at_max_after_last_rejection_seconds"].as_f64().unwrap(),
        overload["lowest_applied_docs_per_sec"].as_f64().unwrap(),
    );
}

//! Benchmark: reshard's whole backfill against the raw copy baseline on the same servers and
//! data, at several sizes (BENCHMARKS.md, "Backfill against the raw copy baseline"). Run it
//! with `cargo bench --bench bench_backfill` (or `scripts/bench`).
//!
//! Per size (`RESHARD_BENCH_DOCS`, a comma-separated list, default `60000,1000000`), on fresh
//! servers: one source server (`s1`) holds the collection; three target servers (`s2..s4`)
//! receive it (`default_buckets: 4`, so every document moves). With `RESHARD_BENCH_SOURCES=3`
//! the collection is spread over three source servers (`s1..s3`, collection `orders`) and
//! moves to `orders_v2` on `s2..s4`: the topology of a 3 -> 3 reshard, where every target
//! location receives documents from every source location. In one run:
//!
//! 1. the raw copy baseline (issue 16): one cursor per source location in `_id` order, the
//!    copies built by the same `prepare_batch`, written through the same bulk writer and write
//!    concern (`w: majority, j: true`), two batches in flight, no PostgreSQL, no planning;
//! 2. reshard: a real `reshard worker` process (planning, leases, checkpoints in PostgreSQL,
//!    and the bypass watches it follows, which read back every copy it inserts; without them
//!    with `RESHARD_BENCH_WATCH=0`) with the throttle lifted, until the backfill is done; its
//!    CPU time and peak resident memory come from the kernel (`wait4`);
//! 3. the baseline again, so that neither side has the emptier servers: the ratio uses the
//!    mean of the two.
//!
//! The baseline's copies go to collections of their own, dropped after each run.

#[path = "../tests/support/mod.rs"]
mod support;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use mongodb::bson::{doc, Document};
use reshard::phase::{Action, Phase};
use reshard::routing::Location;
use reshard::shards::{BulkWriter, WriterOptions};
use reshard::store::partitions::Task;
use reshard::store::Store;
use reshard::worker::prepare_batch;
use serde_json::json;
use support::{MongoServer, PgDb, Shards};

const BATCH: usize = 1_000;
const IN_FLIGHT: usize = 2;

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
  - vbuckets: [0, 342]
    shard: s2
  - vbuckets: [342, 683]
    shard: s3
  - vbuckets: [683, 1024]
    shard: s4
";

/// `RESHARD_BENCH_SOURCES=3`: the source over three servers.
const V1_THREE: &str = "tenant_key: customerId
layout: hashed
virtual_buckets: 1024
placement:
  - vbuckets: [0, 342]
    shard: s1
  - vbuckets: [342, 683]
    shard: s2
  - vbuckets: [683, 1024]
    shard: s3
";

/// `RESHARD_BENCH_SOURCES=3`: `V2` in collections of its own beside the source's.
fn v2_beside() -> String {
    format!("{V2}collections:\n  s2: orders_v2\n  s3: orders_v2\n  s4: orders_v2\n")
}

/// The source locations of the run: `s1` alone, or `s1..s3` (`RESHARD_BENCH_SOURCES=3`).
fn source_count() -> usize {
    match std::env::var("RESHARD_BENCH_SOURCES").as_deref() {
        Ok("3") => 3,
        Ok("1") | Err(_) => 1,
        Ok(other) => panic!("RESHARD_BENCH_SOURCES: 1 or 3, not {other:?}"),
    }
}

fn document(i: usize) -> Document {
    doc! {
        "_id": format!("o-{i:08}"),
        "customerId": format!("c-{:05}", i % 5_000),
        "total": i as i64,
        "status": "paid",
        "lines": [{ "sku": format!("sku-{}", i % 97), "qty": 1 }],
        "note": "x".repeat(120),
    }
}

/// The physical limit on this machine (issue 16's baseline): one cursor per source location in
/// `_id` order, the same copies written through the same writer and write concern, two batches
/// in flight, no PostgreSQL, no planning. Reading overlaps writing: the readers fill a queue of
/// `IN_FLIGHT` batches that the writers drain.
async fn raw_copy(
    sources: &[(Location, mongodb::Collection<Document>)],
    writer: &BulkWriter,
    v1: &reshard::routing::RoutingVersion,
    v2: &reshard::routing::RoutingVersion,
    collection: &str,
) -> Duration {
    let started = Instant::now();
    let (tx, rx) = tokio::sync::mpsc::channel::<Vec<reshard::shards::Statement>>(IN_FLIGHT);
    let rx = std::sync::Arc::new(tokio::sync::Mutex::new(rx));
    let writers: Vec<_> = (0..IN_FLIGHT)
        .map(|_| {
            let (rx, writer) = (rx.clone(), writer.clone());
            tokio::spawn(async move {
                loop {
                    let next = rx.lock().await.recv().await;
                    let Some(batch) = next else { return };
                    let report = writer.write(batch).await.unwrap();
                    assert_eq!(report.counts.dead_lettered, 0);
                }
            })
        })
        .collect();
    let readers = sources.iter().map(|(here, source)| {
        let tx = tx.clone();
        async move {
            let mut cursor = source
                .find(doc! {})
                .sort(doc! { "_id": 1 })
                .batch_size(BATCH as u32)
                .await
                .unwrap();
            let mut batch = Vec::with_capacity(BATCH);
            let send = |docs: Vec<Document>| {
                prepare_batch(v1, v2, here, 1, docs)
                    .statements
                    .into_iter()
                    .map(|mut s| {
                        s.location.collection = collection.to_owned();
                        s
                    })
                    .collect::<Vec<_>>()
            };
            while let Some(d) = futures::TryStreamExt::try_next(&mut cursor).await.unwrap() {
                batch.push(d);
                if batch.len() == BATCH {
                    tx.send(send(std::mem::take(&mut batch))).await.unwrap();
                }
            }
            if !batch.is_empty() {
                tx.send(send(batch)).await.unwrap();
            }
        }
    });
    futures::future::join_all(readers).await;
    drop(tx);
    for w in writers {
        w.await.unwrap();
    }
    started.elapsed()
}

/// What the kernel accounted for a child process that ran to its end.
struct ChildUsage {
    wall: Duration,
    cpu_seconds: f64,
    peak_rss_mib: f64,
    success: bool,
}

/// Runs `command` to its end and reads its CPU time and peak resident set from `wait4` (which
/// reaps the child: `Child::wait` is not called).
#[allow(clippy::zombie_processes)]
fn run_measured(mut command: std::process::Command) -> ChildUsage {
    let started = Instant::now();
    let child = command.spawn().expect("the reshard binary starts");
    let pid = child.id() as libc::pid_t;
    let mut status = 0;
    // SAFETY: an all-zero rusage is a valid value, and `wait4` fills it for our own child.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    let waited = unsafe { libc::wait4(pid, &mut status, 0, &mut usage) };
    assert_eq!(
        waited,
        pid,
        "wait4 failed: {}",
        std::io::Error::last_os_error()
    );
    let seconds = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    ChildUsage {
        wall: started.elapsed(),
        cpu_seconds: seconds(usage.ru_utime) + seconds(usage.ru_stime),
        // Linux reports kilobytes.
        peak_rss_mib: usage.ru_maxrss as f64 / 1024.0,
        success: libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
    }
}

fn main() {
    support::bench_main("bench_backfill", backfill_against_raw_copy);
}

async fn backfill_against_raw_copy() {
    let sizes: Vec<usize> = std::env::var("RESHARD_BENCH_DOCS")
        .unwrap_or_else(|_| "60000,1000000".into())
        .split(',')
        .map(|n| {
            n.trim()
                .parse()
                .expect("RESHARD_BENCH_DOCS: numbers, comma-separated")
        })
        .collect();
    let from = match source_count() {
        1 => String::new(),
        k => format!(" from {k} sources"),
    };
    let mut results = Vec::new();
    for n in sizes {
        let result = one_size(n).await;
        eprintln!("{}", serde_json::to_string(&result).unwrap());
        let f = |key: &str| result[key].as_f64().unwrap();
        let figure = |name: &str, value: String| {
            support::bench_figure(
                "bench_backfill",
                &format!("{n} documents{from}: {name}"),
                value,
            )
        };
        figure(
            "whole backfill (planning included) / raw copy baseline",
            format!(
                "{:.2} ({} vs {} docs/s)",
                f("whole_backfill_over_raw_copy"),
                result["reshard_docs_per_sec"],
                (f("raw_copy_before_docs_per_sec") + f("raw_copy_after_docs_per_sec")) / 2.0
            ),
        );
        figure("planning", format!("{:.2} s", f("plan_seconds")));
        figure(
            "copy after planning / raw copy baseline",
            format!("{:.2}", f("copy_after_planning_over_raw_copy")),
        );
        figure(
            "worker CPU, share of the machine",
            format!("{:.1} %", 100.0 * f("worker_cpu_share_of_machine")),
        );
        figure(
            "worker peak resident memory",
            format!("{:.1} MiB", f("worker_peak_rss_mib")),
        );
        figure(
            "full reconciliation / raw read of both sides",
            format!(
                "{:.2} ({} vs {} docs/s)",
                f("full_reconcile_over_raw_read"),
                result["full_reconcile_docs_per_sec"],
                result["raw_read_both_sides_docs_per_sec"]
            ),
        );
        figure(
            "cleanup",
            format!("{} docs/s", result["cleanup_docs_per_sec"]),
        );
        results.push(result);
    }
    println!("{}", serde_json::to_string_pretty(&results).unwrap());
    println!();
    println!(
        "| documents, source locations | partitions | raw copy baseline (before / after) | reshard, whole (planning included) | whole / baseline | planning | copy after planning / baseline | worker CPU, share of the machine | worker peak RSS | raw read of both sides | full reconciliation | reconciliation / raw read | cleanup |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    for r in &results {
        println!(
            "| {} from {} | {} | {} / {} docs/s | {} docs/s | {:.2} | {:.2} s | {:.2} | {:.1} s, {:.1} % | {:.1} MiB | {} docs/s | {} docs/s | {:.2} | {} docs/s |",
            r["documents"],
            r["source_locations"],
            r["partitions"],
            r["raw_copy_before_docs_per_sec"],
            r["raw_copy_after_docs_per_sec"],
            r["reshard_docs_per_sec"],
            r["whole_backfill_over_raw_copy"].as_f64().unwrap(),
            r["plan_seconds"].as_f64().unwrap(),
            r["copy_after_planning_over_raw_copy"].as_f64().unwrap(),
            r["worker_cpu_seconds"].as_f64().unwrap(),
            100.0 * r["worker_cpu_share_of_machine"].as_f64().unwrap(),
            r["worker_peak_rss_mib"].as_f64().unwrap(),
            r["raw_read_both_sides_docs_per_sec"],
            r["full_reconcile_docs_per_sec"],
            r["full_reconcile_over_raw_read"].as_f64().unwrap(),
            r["cleanup_docs_per_sec"],
        );
    }
}

async fn one_size(n: usize) -> serde_json::Value {
    // Partitions the planner is told to aim at (by default it chooses from the size and the
    // workers).
    let partitions: Option<usize> = std::env::var("RESHARD_BENCH_PARTITIONS")
        .ok()
        .and_then(|v| v.parse().ok());
    let shards = Shards::start(4).await;
    let pg = PgDb::fresh().await;
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
    let (v1_text, v2_text) = if source_count() == 3 {
        (V1_THREE, v2_beside())
    } else {
        (V1, V2.to_owned())
    };
    let mut versions = Vec::new();
    for (file, text) in [("v1.yaml", v1_text), ("v2.yaml", v2_text.as_str())] {
        let v = reshard::spec::parse_version_spec(file, text, "orders").unwrap();
        versions.push(
            store
                .insert_version(&v, text, "bench")
                .await
                .unwrap()
                .version,
        );
    }
    let (v1, v2) = (versions[0].clone(), versions[1].clone());
    let m = store
        .create_migration("orders", 1, 2, "bench")
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
            .transition(m, &Action::Advance(phase), "bench", None, false)
            .await
            .unwrap();
    }
    store
        .update_settings(
            m,
            |s| {
                s.max_docs_per_sec = 1e9;
                s.batch_size = BATCH;
                if let Some(p) = partitions {
                    s.documents_per_partition = Some((n / p).max(1) as u64);
                }
            },
            "bench",
            None,
        )
        .await
        .unwrap();

    let sources: Vec<(Location, mongodb::Collection<Document>)> = v1
        .locations()
        .into_iter()
        .map(|l| {
            let coll = databases[&l.shard].collection::<Document>(&l.collection);
            (l, coll)
        })
        .collect();
    let loading = Instant::now();
    for start in (0..n).step_by(5_000) {
        let mut by_location: BTreeMap<Location, Vec<Document>> = BTreeMap::new();
        for d in (start..(start + 5_000).min(n)).map(document) {
            let (tenant, id) = v1.document_keys(&d).unwrap();
            let at = v1.locate(&tenant, &id).unwrap().locations[0].clone();
            by_location.entry(at).or_default().push(d);
        }
        for (at, chunk) in by_location {
            databases[&at.shard]
                .collection::<Document>(&at.collection)
                .insert_many(chunk)
                .ordered(false)
                .await
                .unwrap();
        }
    }
    let load_seconds = loading.elapsed().as_secs_f64();
    let writer = BulkWriter::new(databases.clone(), WriterOptions::default());
    let drop_copies = |collection: &'static str| {
        let databases = databases.clone();
        async move {
            for shard in ["s2", "s3", "s4"] {
                databases[shard]
                    .collection::<Document>(collection)
                    .drop()
                    .await
                    .unwrap();
            }
        }
    };

    let before = raw_copy(&sources, &writer, &v1, &v2, "raw_copy").await;
    drop_copies("raw_copy").await;

    // The bypass watches a migration has from `dual_read` on (the driver starts them when it
    // leaves `planned`; the phases were moved here without it), opened on the data as loaded:
    // a `reshard worker` follows them while it copies, reading back every copy it inserts.
    // `RESHARD_BENCH_WATCH=0` leaves them out, to measure what following them costs.
    let watched = std::env::var("RESHARD_BENCH_WATCH").as_deref() != Ok("0");
    if watched {
        let migration = store.migration(m).await.unwrap();
        let connected = reshard::shards::Shards::new(databases.clone());
        reshard::watch::start(&store, &connected, &migration, &v1, &v2, true)
            .await
            .unwrap();
    }
    let mut worker = std::process::Command::new(env!("CARGO_BIN_EXE_reshard"));
    worker
        .args(["worker", &m.to_string(), "--exit-when-done"])
        .env("RESHARD_DATABASE_URL", pg.url())
        .env(
            "RESHARD_LOG",
            std::env::var("RESHARD_BENCH_WORKER_LOG").unwrap_or_else(|_| "warn".into()),
        )
        .stdout(std::process::Stdio::null());
    let wall = chrono::Utc::now();
    let usage = run_measured(worker);
    assert!(usage.success, "the worker failed");
    let planned_at = store
        .migration(m)
        .await
        .unwrap()
        .backfill_planned_at
        .unwrap();
    let plan_seconds = (planned_at - wall).num_milliseconds() as f64 / 1000.0;

    let after = raw_copy(&sources, &writer, &v1, &v2, "raw_copy").await;
    drop_copies("raw_copy").await;

    let totals = store.task_totals(m, Task::Backfill).await.unwrap();
    assert_eq!(totals.scanned as usize, n);
    assert_eq!(totals.inserted as usize, n, "{totals:?}");

    // A full reconciliation against a raw read of both sides: every location through one
    // cursor in `_id` order, all at once.
    store
        .transition(m, &Action::Advance(Phase::Reconcile), "bench", None, false)
        .await
        .unwrap();
    let raw_read = read_everything(&databases).await;
    let mut reconcile = std::process::Command::new(env!("CARGO_BIN_EXE_reshard"));
    reconcile
        .args(["reconcile", &m.to_string(), "--full", "--output", "json"])
        .env("RESHARD_DATABASE_URL", pg.url())
        .env("RESHARD_LOG", "warn")
        .stdout(std::process::Stdio::null());
    let verified = run_measured(reconcile);
    assert!(verified.success, "the full reconciliation failed");
    let raw_read_again = read_everything(&databases).await;
    let read_mean = (2.0 * n as f64 / raw_read.as_secs_f64()
        + 2.0 * n as f64 / raw_read_again.as_secs_f64())
        / 2.0;

    // Cleanup: the same worker, deleting the moved documents from the source in its waves.
    for phase in [Phase::NewReads, Phase::Cleanup] {
        store
            .transition(m, &Action::Advance(phase), "bench", None, false)
            .await
            .unwrap();
    }
    let mut cleaner = std::process::Command::new(env!("CARGO_BIN_EXE_reshard"));
    cleaner
        .args(["worker", &m.to_string(), "--exit-when-done"])
        .env("RESHARD_DATABASE_URL", pg.url())
        .env(
            "RESHARD_LOG",
            std::env::var("RESHARD_BENCH_WORKER_LOG").unwrap_or_else(|_| "warn".into()),
        )
        .stdout(std::process::Stdio::null());
    let cleaned = run_measured(cleaner);
    assert!(cleaned.success, "the cleanup worker failed");
    let cleanup = store.task_totals(m, Task::Cleanup).await.unwrap();
    assert_eq!(cleanup.deleted as usize, n, "{cleanup:?}");
    for (at, source) in &sources {
        assert_eq!(source.estimated_document_count().await.unwrap(), 0, "{at}");
    }
    let rate = |d: Duration| n as f64 / d.as_secs_f64();
    let baseline = (rate(before) + rate(after)) / 2.0;
    let copy = usage.wall.as_secs_f64();
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get()) as f64;
    json!({
        "documents": n,
        "source_locations": sources.len(),
        "target_servers": 3,
        "batch": BATCH,
        "partitions": totals.partitions,
        "bypass_watches": watched,
        "load_seconds": load_seconds,
        "raw_copy_before_docs_per_sec": rate(before).round(),
        "raw_copy_after_docs_per_sec": rate(after).round(),
        "reshard_seconds": copy,
        "reshard_docs_per_sec": (n as f64 / copy).round(),
        "plan_seconds": plan_seconds,
        "whole_backfill_over_raw_copy": n as f64 / copy / baseline,
        "copy_after_planning_over_raw_copy": n as f64 / (copy - plan_seconds) / baseline,
        "worker_cpu_seconds": usage.cpu_seconds,
        "worker_cpu_share_of_machine": usage.cpu_seconds / (copy * cores),
        "worker_peak_rss_mib": usage.peak_rss_mib,
        "raw_read_both_sides_docs_per_sec": read_mean.round(),
        "full_reconcile_seconds": verified.wall.as_secs_f64(),
        "full_reconcile_docs_per_sec": (2.0 * n as f64 / verified.wall.as_secs_f64()).round(),
        "full_reconcile_over_raw_read":
            2.0 * n as f64 / verified.wall.as_secs_f64() / read_mean,
        "full_reconcile_cpu_seconds": verified.cpu_seconds,
        "cleanup_seconds": cleaned.wall.as_secs_f64(),
        "cleanup_docs_per_sec": (n as f64 / cleaned.wall.as_secs_f64()).round(),
        "cleanup_cpu_seconds": cleaned.cpu_seconds,
    })
}

/// Reads every document of every location (of either layout), one cursor each in `_id` order,
/// all at once.
async fn read_everything(databases: &BTreeMap<String, mongodb::Database>) -> Duration {
    let started = Instant::now();
    let collections = databases
        .values()
        .flat_map(|db| ["orders", "orders_v2"].map(|c| db.collection::<Document>(c)));
    let reads = collections.map(|coll| async move {
        let mut cursor = coll
            .find(doc! {})
            .sort(doc! { "_id": 1 })
            .batch_size(BATCH as u32)
            .await
            .unwrap();
        let mut n = 0_u64;
        while futures::TryStreamExt::try_next(&mut cursor)
            .await
            .unwrap()
            .is_some()
        {
            n += 1;
        }
        n
    });
    futures::future::join_all(reads).await;
    started.elapsed()
}

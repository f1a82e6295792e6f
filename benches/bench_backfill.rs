//! Benchmark: unthrottled backfill throughput against the raw unordered ingest rate of the
//! same target servers (BENCHMARKS.md, "Backfill throughput"). Run it with `cargo bench` (or `scripts/bench`):
//!
//! ```text
//! cargo bench --bench bench_backfill
//! ```
//!
//! One source server (`s1`) holds N documents in one collection; three target servers
//! (`s2..s4`) receive them. The raw ingest writes pre-built copies (no reading, no planning,
//! no checkpoints) through the same bulk writer with the same number of batches in flight;
//! the backfill is a real worker (planning, leases, one cursor per partition, checkpoints in
//! Postgres, `w: majority, j: true`) with the throttle lifted. Raw runs before and after the
//! copy, into fresh collections, and the ratio uses their mean. Last, in the same run, the raw
//! copy baseline (issue 16): one cursor reading the source, the same writer, two batches in
//! flight, no PostgreSQL; `whole_backfill_over_raw_copy` is reshard's backfill (planning
//! included) over it, `copy_after_planning_over_raw_copy` the copy alone.

#[path = "../tests/support/mod.rs"]
mod support;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use mongodb::bson::{doc, Document};
use reshard::backfill::{prepare_batch, Worker, WorkerConfig};
use reshard::copy::{BulkWriter, WriteOp, WriterOptions};
use reshard::phase::{Action, Phase};
use reshard::routing::Location;
use reshard::store::partitions::Task;
use reshard::store::Store;
use serde_json::json;
use support::{MongoServer, PgDb, Shards};

const BATCH: usize = 1_000;
const CONCURRENCY: usize = 2;

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

fn documents(n: usize) -> Vec<Document> {
    (0..n)
        .map(|i| {
            doc! {
                "_id": format!("o-{i:08}"),
                "customerId": format!("c-{:05}", i % 5_000),
                "total": i as i64,
                "status": "paid",
                "lines": [{ "sku": format!("sku-{}", i % 97), "qty": 1 }],
                "note": "x".repeat(120),
            }
        })
        .collect()
}

/// Writes pre-built batches with `CONCURRENCY` batches in flight, as the worker's loops do.
async fn raw_ingest(writer: &BulkWriter, batches: Vec<Vec<reshard::copy::Statement>>) -> Duration {
    let started = Instant::now();
    let queue = std::sync::Arc::new(tokio::sync::Mutex::new(batches.into_iter()));
    let tasks: Vec<_> = (0..CONCURRENCY)
        .map(|_| {
            let (queue, writer) = (queue.clone(), writer.clone());
            tokio::spawn(async move {
                loop {
                    let next = queue.lock().await.next();
                    let Some(batch) = next else { return };
                    let report = writer.write(batch).await.unwrap();
                    assert_eq!(report.counts.dead_lettered, 0);
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    started.elapsed()
}

/// The physical limit on this machine (issue 16's baseline): one cursor reading the source in
/// `_id` order, the same copies written through the same writer and write concern, two batches
/// in flight, no PostgreSQL, no planning. Reading overlaps writing: the reader fills a queue of
/// `CONCURRENCY` batches that the writers drain.
async fn raw_copy(
    source: &mongodb::Collection<Document>,
    writer: &BulkWriter,
    v1: &reshard::routing::RoutingVersion,
    v2: &reshard::routing::RoutingVersion,
    collection: &str,
) -> Duration {
    let started = Instant::now();
    let (tx, rx) = tokio::sync::mpsc::channel::<Vec<reshard::copy::Statement>>(CONCURRENCY);
    let rx = std::sync::Arc::new(tokio::sync::Mutex::new(rx));
    let writers: Vec<_> = (0..CONCURRENCY)
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
    let here = Location::new("s1", "orders");
    let mut cursor = source
        .find(doc! {})
        .sort(doc! { "_id": 1 })
        .batch_size(BATCH as u32)
        .await
        .unwrap();
    let mut batch = Vec::with_capacity(BATCH);
    let send = |docs: Vec<Document>| {
        prepare_batch(v1, v2, &here, 1, docs)
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
    drop(tx);
    for w in writers {
        w.await.unwrap();
    }
    started.elapsed()
}

fn main() {
    support::bench_main("bench_backfill", unthrottled_copy_against_raw_ingest);
}

async fn unthrottled_copy_against_raw_ingest() {
    let n: usize = std::env::var("RESHARD_BENCH_DOCS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(60_000);
    // Partitions the planner aims at (each opens one `_id`-range cursor on the source).
    let partitions: usize = std::env::var("RESHARD_BENCH_PARTITIONS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(4);
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
    let mut versions = Vec::new();
    for (file, text) in [("v1.yaml", V1), ("v2.yaml", V2)] {
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
                s.documents_per_partition = (n / partitions).max(1) as u64;
            },
            "bench",
            None,
        )
        .await
        .unwrap();

    let docs = documents(n);
    let source = databases["s1"].collection::<Document>("orders");
    for chunk in docs.chunks(5_000) {
        source
            .insert_many(chunk.to_vec())
            .ordered(false)
            .await
            .unwrap();
    }
    let here = Location::new("s1", "orders");
    let prebuilt = |collection: &str| -> Vec<Vec<reshard::copy::Statement>> {
        docs.chunks(BATCH)
            .map(|chunk| {
                prepare_batch(&v1, &v2, &here, 1, chunk.to_vec())
                    .statements
                    .into_iter()
                    .map(|mut s| {
                        s.location.collection = collection.to_owned();
                        assert!(matches!(s.op, WriteOp::Insert(_)));
                        s
                    })
                    .collect()
            })
            .collect()
    };
    let writer = BulkWriter::new(databases.clone(), WriterOptions::default());

    let raw_before = raw_ingest(&writer, prebuilt("raw_before")).await;
    // What reading alone costs: the whole source through one cursor in `_id` order.
    let started = Instant::now();
    let mut cursor = source
        .find(doc! {})
        .sort(doc! { "_id": 1 })
        .batch_size(BATCH as u32)
        .await
        .unwrap();
    let mut read = 0;
    while futures::TryStreamExt::try_next(&mut cursor)
        .await
        .unwrap()
        .is_some()
    {
        read += 1;
    }
    assert_eq!(read, n);
    let source_read = started.elapsed();
    let mut config = WorkerConfig::new("bench");
    config.migration = Some(m);
    config.concurrency = CONCURRENCY;
    config.exit_when_done = true;
    let worker = Worker::with_shards(store.clone(), databases.clone(), config);
    let (_stop, shutdown) = tokio::sync::watch::channel(false);
    let started = Instant::now();
    let wall = chrono::Utc::now();
    let summary = worker.run(shutdown).await.unwrap();
    let copy = started.elapsed();
    let planned_at = store
        .migration(m)
        .await
        .unwrap()
        .backfill_planned_at
        .unwrap();
    let plan_seconds = (planned_at - wall).num_milliseconds() as f64 / 1000.0;
    let raw_after = raw_ingest(&writer, prebuilt("raw_after")).await;
    let baseline = raw_copy(&source, &writer, &v1, &v2, "raw_copy").await;

    let totals = store.task_totals(m, Task::Backfill).await.unwrap();
    assert_eq!(totals.scanned as usize, n);
    assert_eq!(totals.inserted as usize, n, "{totals:?}");
    let rate = |d: Duration| n as f64 / d.as_secs_f64();
    let raw_mean = (rate(raw_before) + rate(raw_after)) / 2.0;
    let result = json!({
        "documents": n,
        "target_servers": 3,
        "batch": BATCH,
        "batches_in_flight": CONCURRENCY,
        "partitions": totals.partitions,
        "raw_before_docs_per_sec": rate(raw_before).round(),
        "raw_after_docs_per_sec": rate(raw_after).round(),
        "source_read_docs_per_sec": rate(source_read).round(),
        "plan_seconds": plan_seconds,
        "copy_docs_per_sec": rate(copy).round(),
        "copy_docs_per_sec_after_planning": (n as f64 / (copy.as_secs_f64() - plan_seconds)).round(),
        "copy_seconds": copy.as_secs_f64(),
        "copy_over_raw": rate(copy) / raw_mean,
        "raw_copy_docs_per_sec": rate(baseline).round(),
        "whole_backfill_over_raw_copy": rate(copy) / rate(baseline),
        "copy_after_planning_over_raw_copy":
            (n as f64 / (copy.as_secs_f64() - plan_seconds)) / rate(baseline),
        "worker_batches": summary.batches,
    });
    println!("{}", serde_json::to_string_pretty(&result).unwrap());
}

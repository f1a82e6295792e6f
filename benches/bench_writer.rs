//! Benchmark of the bulk writer against an ordered baseline (BENCHMARKS.md, "Bulk writer").
//! Run it with `cargo bench` (or `scripts/bench`):
//!
//! ```text
//! cargo bench --bench bench_writer
//! ```
//!
//! The ordered baseline is what a router does with an ordered bulk write: it starts a new
//! command at every change of target shard and sends the pieces one after another. Round trips
//! are counted with the driver's command monitoring. `RESHARD_BENCH_SEED` replays a run.

#[path = "../tests/support/mod.rs"]
mod support;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use mongodb::bson::{doc, Bson};
use mongodb::event::command::CommandEvent;
use mongodb::event::EventHandler;
use mongodb::options::ClientOptions;
use mongodb::{Client, Database};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use reshard::routing::Location;
use reshard::shards::writer::disable_driver_write_retries;
use reshard::shards::{BulkWriter, Statement, WriterOptions};
use serde_json::json;
use support::{MongoServer, Shards};

const BATCH: usize = 1_000;
const TRIALS: usize = 3;
const SHARD_COUNTS: [usize; 5] = [2, 3, 4, 5, 8];
const SLOW_BLOCK_MS: u64 = 50;

struct Bench {
    shards: Shards,
    databases: BTreeMap<String, Database>,
    inserts_started: Arc<Mutex<u64>>,
}

impl Bench {
    async fn start(n: usize) -> Bench {
        let shards = Shards::start_with(n, MongoServer::builder().test_commands(true)).await;
        let db_name = MongoServer::database_name();
        let inserts_started = Arc::new(Mutex::new(0u64));
        let mut databases = BTreeMap::new();
        for server in shards.iter() {
            let mut options = ClientOptions::parse(server.uri()).await.unwrap();
            disable_driver_write_retries(&mut options);
            let counter = inserts_started.clone();
            options.command_event_handler = Some(EventHandler::callback(move |event| {
                if let CommandEvent::Started(started) = event {
                    if started.command_name == "insert" {
                        *counter.lock().unwrap() += 1;
                    }
                }
            }));
            let client = Client::with_options(options).unwrap();
            databases.insert(server.name().to_string(), client.database(&db_name));
        }
        Bench {
            shards,
            databases,
            inserts_started,
        }
    }

    fn writer(&self, s: usize) -> BulkWriter {
        let databases = self
            .databases
            .iter()
            .take(s)
            .map(|(name, db)| (name.clone(), db.clone()));
        BulkWriter::new(databases, WriterOptions::default())
    }

    /// Runs `f` and returns how many insert commands it sent and how long it took.
    async fn measure<F: std::future::Future<Output = ()>>(&self, f: F) -> (u64, Duration) {
        let before = *self.inserts_started.lock().unwrap();
        let started = Instant::now();
        f.await;
        let elapsed = started.elapsed();
        (*self.inserts_started.lock().unwrap() - before, elapsed)
    }
}

/// `BATCH` documents, each sent to a uniformly random shard among the first `s`.
fn batch(s: usize, collection: &str, rng: &mut StdRng) -> Vec<Statement> {
    (0..BATCH as i64)
        .map(|id| {
            let shard = format!("s{}", rng.gen_range(1..=s));
            let document = doc! { "_id": id, "tenant": rng.gen_range(0..1_000i64), "payload": "x".repeat(200) };
            Statement::insert(Location::new(shard, collection), document).unwrap()
        })
        .collect()
}

/// The ordered baseline: a new command at every change of shard, one after another.
async fn ordered_baseline(databases: &BTreeMap<String, Database>, statements: &[Statement]) {
    let mut start = 0;
    while start < statements.len() {
        let location = &statements[start].location;
        let mut end = start + 1;
        while end < statements.len() && statements[end].location == *location {
            end += 1;
        }
        let documents: Vec<Bson> = statements[start..end]
            .iter()
            .map(|s| match &s.op {
                reshard::shards::WriteOp::Insert(d) => Bson::Document(d.clone()),
                other => panic!("{other:?}"),
            })
            .collect();
        let reply = databases[&location.shard]
            .run_command(doc! {
                "insert": &location.collection,
                "documents": documents,
                "ordered": true,
                "writeConcern": { "w": "majority", "j": true },
            })
            .await
            .unwrap();
        assert!(!reply.contains_key("writeErrors"), "{reply}");
        start = end;
    }
}

fn expected_ordered(n: usize, s: usize) -> f64 {
    1.0 + (n as f64 - 1.0) * (1.0 - 1.0 / s as f64)
}

fn main() {
    support::bench_main("bench_writer", bulk_writer_against_ordered_baseline);
}

async fn bulk_writer_against_ordered_baseline() {
    let seed: u64 = std::env::var("RESHARD_BENCH_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| rand::thread_rng().gen());
    println!("seed {seed} (RESHARD_BENCH_SEED={seed} replays)");
    let mut rng = StdRng::seed_from_u64(seed);
    let bench = Bench::start(*SHARD_COUNTS.iter().max().unwrap()).await;
    let mut collection_no = 0;
    let mut next_collection = || {
        collection_no += 1;
        format!("bench_{collection_no}")
    };

    println!("\nRound trips per {BATCH}-document batch (mean of {TRIALS} batches, random shard per document)\n");
    println!(
        "| S | this writer | ordered baseline | 1 + (n-1)(1-1/S) | writer time | baseline time |"
    );
    println!("|---|---|---|---|---|---|");
    for s in SHARD_COUNTS {
        let writer = bench.writer(s);
        let (mut w_trips, mut o_trips) = (0u64, 0u64);
        let (mut w_time, mut o_time) = (Duration::ZERO, Duration::ZERO);
        for _ in 0..TRIALS {
            let statements = batch(s, &next_collection(), &mut rng);
            let (trips, time) = bench
                .measure(async {
                    let report = writer.write(statements.clone()).await.unwrap();
                    assert_eq!(report.counts.inserted, BATCH as u64);
                })
                .await;
            w_trips += trips;
            w_time += time;
            let statements = batch(s, &next_collection(), &mut rng);
            let (trips, time) = bench
                .measure(ordered_baseline(&bench.databases, &statements))
                .await;
            o_trips += trips;
            o_time += time;
        }
        let t = TRIALS as f64;
        support::bench_figure(
            "bench_writer",
            &format!("round trips per 1,000-document batch, S = {s} (ordered baseline)"),
            format!("{:.1} ({:.1})", w_trips as f64 / t, o_trips as f64 / t),
        );
        println!(
            "| {s} | {:.1} | {:.1} | {:.2} | {:.0} ms | {:.0} ms |",
            w_trips as f64 / t,
            o_trips as f64 / t,
            expected_ordered(BATCH, s),
            w_time.as_secs_f64() * 1000.0 / t,
            o_time.as_secs_f64() * 1000.0 / t,
        );
    }

    println!("\nCopy time of one {BATCH}-document batch at S = 4, one shard (s4) slowed by blockConnection ({SLOW_BLOCK_MS} ms per command)\n");
    println!("| shard s4 | this writer | ordered baseline | baseline round trips |");
    println!("|---|---|---|---|");
    let writer = bench.writer(4);
    for slowed in [false, true] {
        if slowed {
            bench.shards.get("s4").fail_command(json!({
                "mode": {"times": 100_000},
                "data": {"failCommands": ["insert"], "blockConnection": true, "blockTimeMS": SLOW_BLOCK_MS},
            }))
            .await;
        }
        let statements = batch(4, &next_collection(), &mut rng);
        let (_, w_time) = bench
            .measure(async {
                let report = writer.write(statements).await.unwrap();
                assert_eq!(report.counts.inserted, BATCH as u64);
            })
            .await;
        let statements = batch(4, &next_collection(), &mut rng);
        let (o_trips, o_time) = bench
            .measure(ordered_baseline(&bench.databases, &statements))
            .await;
        support::bench_figure(
            "bench_writer",
            &format!(
                "one batch at S = 4, s4 {} (ordered baseline)",
                if slowed {
                    "slowed 50 ms per command"
                } else {
                    "normal"
                }
            ),
            format!(
                "{:.0} ms ({:.0} ms)",
                w_time.as_secs_f64() * 1000.0,
                o_time.as_secs_f64() * 1000.0
            ),
        );
        println!(
            "| {} | {:.0} ms | {:.0} ms | {o_trips} |",
            if slowed { "slowed" } else { "normal" },
            w_time.as_secs_f64() * 1000.0,
            o_time.as_secs_f64() * 1000.0,
        );
    }
    bench.shards.get("s4").clear_failpoint().await;
}

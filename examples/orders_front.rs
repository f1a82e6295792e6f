//! The order service of `orders_app.rs`, for an application that does not know reshard
//! exists: it talks only MongoDB, through the official Rust driver, to whatever its connection
//! string names. Pointed at `reshard front`, the migration happens under it; the only change
//! from pointing it at a `mongos` or a plain server is `--uri`.
//!
//! ```sh
//! reshard front --listen 127.0.0.1:27018 --database shop &
//! cargo run --example orders_front -- --uri mongodb://127.0.0.1:27018 --duration 30s --ledger /tmp/orders.jsonl
//! cargo run --example orders_front -- --uri mongodb://127.0.0.1:27018 --check --ledger /tmp/orders.jsonl
//! ```
//!
//! The same workload as `orders_app` (Zipf-distributed customers, inserts, partial updates,
//! replaces, deletes, re-creates, reads by id and listings by customer), the same ledger
//! format (JSON lines of every acknowledged write, `src/ledger.rs`, compiled into this example
//! by `#[path]`: no `reshard` import), so `orders_app --check` judges its ledger too. Its own
//! `--check` reads every id of the ledger through the connection string and reports lost
//! writes, resurrected deletes and wrong contents. Both print a JSON summary and exit 1 on any
//! anomaly.

#[path = "../src/ledger.rs"]
#[allow(dead_code)]
mod ledger;

use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::io::{BufReader, BufWriter};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use clap::Parser;
use futures::TryStreamExt;
use ledger::{Entry, LedgerWriter};
use mongodb::bson::{doc, Document};
use mongodb::{Client, Collection};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{json, Value};

fn duration(s: &str) -> Result<Duration, String> {
    humantime::parse_duration(s).map_err(|e| e.to_string())
}

#[derive(Parser, Debug)]
struct Args {
    /// The MongoDB connection string: the front (or a mongos, or a plain server).
    #[arg(
        long,
        env = "ORDERS_MONGODB_URI",
        default_value = "mongodb://127.0.0.1:27018"
    )]
    uri: String,
    #[arg(long, default_value = "shop")]
    database: String,
    #[arg(long, default_value = "orders")]
    collection: String,
    /// How long to run the workload (`30s`, `10m`).
    #[arg(long, default_value = "30s", value_parser = duration)]
    duration: Duration,
    /// Operations per second across all workers.
    #[arg(long, default_value_t = 200)]
    rate: u32,
    #[arg(long, default_value_t = 4)]
    workers: u32,
    /// Number of customers; customer 1 is `cust-hot` and takes the largest share.
    #[arg(long, default_value_t = 50)]
    tenants: usize,
    /// Zipf exponent of the customer distribution.
    #[arg(long, default_value_t = 1.2)]
    zipf: f64,
    /// The hot customer's share of the orders (0..1); without it, all customers follow Zipf.
    #[arg(long)]
    hot_share: Option<f64>,
    /// Percent of operations that list a customer's orders.
    #[arg(long, default_value_t = 5)]
    list_percent: u32,
    /// The ledger of acknowledged writes (the workload writes it, `--check` reads it).
    #[arg(long)]
    ledger: PathBuf,
    /// Check the ledger against what reads through `--uri` return instead of running.
    #[arg(long)]
    check: bool,
    #[arg(long)]
    seed: Option<u64>,
    /// The prefix of this instance's order ids (`<prefix><worker>-<n>`).
    #[arg(long, default_value = "f")]
    id_prefix: String,
}

/// Samples customer ranks 1..=n with probability proportional to 1/k^s.
struct Zipf {
    cumulative: Vec<f64>,
}

impl Zipf {
    fn new(n: usize, s: f64) -> Self {
        let mut total = 0.0;
        let cumulative = (1..=n)
            .map(|k| {
                total += 1.0 / (k as f64).powf(s);
                total
            })
            .collect();
        Zipf { cumulative }
    }

    fn sample(&self, rng: &mut impl Rng) -> usize {
        let x = rng.gen::<f64>() * self.cumulative.last().copied().unwrap_or(1.0);
        self.cumulative.partition_point(|c| *c < x) + 1
    }
}

fn pick_tenant(rng: &mut impl Rng, zipf: &Zipf, hot_share: Option<f64>) -> String {
    let rank = match hot_share {
        Some(share) if rng.gen_bool(share.clamp(0.0, 1.0)) => 1,
        Some(_) if zipf.cumulative.len() > 1 => loop {
            let rank = zipf.sample(rng);
            if rank != 1 {
                break rank;
            }
        },
        _ => zipf.sample(rng),
    };
    if rank == 1 {
        "cust-hot".to_owned()
    } else {
        format!("cust-{rank:04}")
    }
}

/// The fields the application controls, as the ledger records them.
fn app_fields(doc: &Document) -> Value {
    json!({
        "customerId": doc.get_str("customerId").unwrap_or_default(),
        "qty": doc.get_i32("qty").unwrap_or_default(),
        "status": doc.get_str("status").unwrap_or_default(),
        "version": doc.get_i32("version").unwrap_or_default(),
    })
}

#[derive(Default, Debug, Clone, serde::Serialize)]
struct Counts {
    ops: u64,
    acknowledged_writes: u64,
    reads: u64,
    listings: u64,
    errors: u64,
    read_anomalies: u64,
    anomaly_examples: Vec<String>,
    error_examples: Vec<String>,
}

struct Shared {
    ledger: Mutex<LedgerWriter<BufWriter<File>>>,
    seq: AtomicU64,
    counts: Mutex<Counts>,
}

impl Shared {
    fn log(&self, worker: u32, op: &str, tenant: &str, id: &str, doc: Option<Value>) {
        let entry = Entry {
            seq: self.seq.fetch_add(1, Ordering::SeqCst),
            worker,
            op: op.to_owned(),
            tenant: tenant.to_owned(),
            id: id.to_owned(),
            doc,
        };
        self.ledger
            .lock()
            .unwrap()
            .append(&entry)
            .expect("ledger write");
    }

    fn anomaly(&self, what: String) {
        let mut c = self.counts.lock().unwrap();
        c.read_anomalies += 1;
        if c.anomaly_examples.len() < 20 {
            c.anomaly_examples.push(what);
        }
    }
}

struct Worker {
    n: u32,
    rng: StdRng,
    /// Per order id of this worker: its customer and what it holds (`None`: deleted).
    orders: HashMap<String, (String, Option<Document>)>,
    next_id: u64,
    prefix: String,
}

impl Worker {
    fn pick(&mut self, live: bool) -> Option<(String, String, Option<Document>)> {
        let candidates: Vec<&String> = self
            .orders
            .iter()
            .filter(|(_, (_, d))| d.is_some() == live)
            .map(|(id, _)| id)
            .collect();
        if candidates.is_empty() {
            return None;
        }
        let id = candidates[self.rng.gen_range(0..candidates.len())].clone();
        let (tenant, doc) = self.orders[&id].clone();
        Some((id, tenant, doc))
    }
}

/// One order, read by its customer and id.
async fn get(
    orders: &Collection<Document>,
    tenant: &str,
    id: &str,
) -> mongodb::error::Result<Option<Document>> {
    orders
        .find_one(doc! { "customerId": tenant, "_id": id })
        .await
}

/// After a write whose effect is unknown: reads the order until a read succeeds, and records
/// what it holds.
async fn resync(
    orders: &Collection<Document>,
    shared: &Shared,
    w: &mut Worker,
    tenant: &str,
    id: &str,
) {
    for _ in 0..40 {
        if let Ok(found) = get(orders, tenant, id).await {
            shared.log(w.n, "resync", tenant, id, found.as_ref().map(app_fields));
            w.orders.insert(id.to_owned(), (tenant.to_owned(), found));
            return;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    // Unknown: forget the order rather than guess (its last ledger entry may be stale, which
    // the check would then report).
    w.orders.remove(id);
}

async fn step(
    orders: &Collection<Document>,
    shared: &Shared,
    w: &mut Worker,
    zipf: &Zipf,
    hot: Option<f64>,
    list_percent: u32,
) {
    let list_percent = list_percent.min(100);
    let roll: u32 = match w.rng.gen_range(0..100) {
        r if r < 100 - list_percent => r * 95 / (100 - list_percent).max(1),
        _ => 95,
    };
    shared.counts.lock().unwrap().ops += 1;
    // The order a write touches, for a resync when its outcome is unknown.
    let mut touched: Option<(String, String)> = None;
    let result: mongodb::error::Result<()> = async {
        match roll {
            // Insert a new order.
            0..=29 => {
                let tenant = pick_tenant(&mut w.rng, zipf, hot);
                let id = format!("{}{}-{}", w.prefix, w.n, w.next_id);
                w.next_id += 1;
                let doc = doc! {
                    "_id": &id, "customerId": &tenant, "qty": 1, "status": "new", "version": 1,
                    "createdAt": mongodb::bson::DateTime::now(),
                };
                w.orders.insert(id.clone(), (tenant.clone(), None));
                touched = Some((tenant.clone(), id.clone()));
                orders.insert_one(doc.clone()).await?;
                shared.log(w.n, "insert", &tenant, &id, Some(app_fields(&doc)));
                w.orders.insert(id, (tenant, Some(doc)));
            }
            // Partial update.
            30..=54 => {
                let Some((id, tenant, Some(mut doc))) = w.pick(true) else { return Ok(()) };
                touched = Some((tenant.clone(), id.clone()));
                let r = orders
                    .update_one(
                        doc! { "customerId": &tenant, "_id": &id },
                        doc! { "$inc": { "qty": 1, "version": 1 }, "$set": { "status": "paid" } },
                    )
                    .await?;
                if r.matched_count != 1 {
                    shared.anomaly(format!("update of live {id} matched {}", r.matched_count));
                    return Ok(());
                }
                doc.insert("qty", doc.get_i32("qty").unwrap() + 1);
                doc.insert("version", doc.get_i32("version").unwrap() + 1);
                doc.insert("status", "paid");
                shared.log(w.n, "update", &tenant, &id, Some(app_fields(&doc)));
                w.orders.insert(id, (tenant, Some(doc)));
            }
            // Replace the whole order.
            55..=64 => {
                let Some((id, tenant, Some(doc))) = w.pick(true) else { return Ok(()) };
                touched = Some((tenant.clone(), id.clone()));
                let version = doc.get_i32("version").unwrap() + 1;
                let new = doc! { "_id": &id, "customerId": &tenant, "qty": 7, "status": "replaced", "version": version };
                let r = orders
                    .replace_one(doc! { "customerId": &tenant, "_id": &id }, new.clone())
                    .await?;
                if r.matched_count != 1 {
                    shared.anomaly(format!("replace of live {id} matched {}", r.matched_count));
                    return Ok(());
                }
                shared.log(w.n, "replace", &tenant, &id, Some(app_fields(&new)));
                w.orders.insert(id, (tenant, Some(new)));
            }
            // Delete.
            65..=74 => {
                let Some((id, tenant, Some(_))) = w.pick(true) else { return Ok(()) };
                touched = Some((tenant.clone(), id.clone()));
                let r = orders
                    .delete_one(doc! { "customerId": &tenant, "_id": &id })
                    .await?;
                if r.deleted_count != 1 {
                    shared.anomaly(format!("delete of live {id} deleted {}", r.deleted_count));
                }
                shared.log(w.n, "delete", &tenant, &id, None);
                w.orders.insert(id, (tenant, None));
            }
            // Re-create a deleted order.
            75..=79 => {
                let Some((id, tenant, None)) = w.pick(false) else { return Ok(()) };
                touched = Some((tenant.clone(), id.clone()));
                let doc = doc! { "_id": &id, "customerId": &tenant, "qty": 3, "status": "recreated", "version": 1 };
                orders.insert_one(doc.clone()).await?;
                shared.log(w.n, "recreate", &tenant, &id, Some(app_fields(&doc)));
                w.orders.insert(id, (tenant, Some(doc)));
            }
            // Read one of my orders and compare with what I know.
            80..=94 => {
                let live = w.rng.gen_bool(0.8);
                let Some((id, tenant, known)) = w.pick(live) else { return Ok(()) };
                let found = get(orders, &tenant, &id).await?;
                shared.counts.lock().unwrap().reads += 1;
                let (a, b) = (known.as_ref().map(app_fields), found.as_ref().map(app_fields));
                if a != b {
                    shared.anomaly(format!("read {id}: expected {a:?}, got {b:?}"));
                }
            }
            // List a customer's orders (a find by the tenant filter, in batches) and compare
            // mine of that customer.
            _ => {
                let tenant = pick_tenant(&mut w.rng, zipf, hot);
                let docs: Vec<Document> = orders
                    .find(doc! { "customerId": &tenant })
                    .batch_size(200)
                    .await?
                    .try_collect()
                    .await?;
                let mut seen: BTreeMap<String, Value> = BTreeMap::new();
                for d in &docs {
                    let id = match d.get("_id") {
                        Some(mongodb::bson::Bson::String(s)) => s.clone(),
                        Some(other) => other.clone().into_canonical_extjson().to_string(),
                        None => String::new(),
                    };
                    if seen.insert(id.clone(), app_fields(d)).is_some() {
                        shared.anomaly(format!("listing of {tenant} returned {id} twice"));
                    }
                }
                shared.counts.lock().unwrap().listings += 1;
                for (id, (t, doc)) in &w.orders {
                    if *t != tenant {
                        continue;
                    }
                    let want = doc.as_ref().map(app_fields);
                    if seen.get(id).cloned() != want {
                        shared.anomaly(format!(
                            "listing of {tenant}: {id} expected {want:?}, got {:?}",
                            seen.get(id)
                        ));
                    }
                }
            }
        }
        Ok(())
    }
    .await;
    match result {
        Ok(()) => {
            if roll < 80 {
                shared.counts.lock().unwrap().acknowledged_writes += 1;
            }
        }
        Err(e) => {
            {
                let mut c = shared.counts.lock().unwrap();
                c.errors += 1;
                if c.error_examples.len() < 20 {
                    c.error_examples.push(e.to_string());
                }
            }
            eprintln!("orders_front: operation failed: {e}");
            // Whether a failed write happened or not, a read says (a refusal did not; a
            // connection lost on the way may or may not have).
            if let Some((tenant, id)) = touched {
                resync(orders, shared, w, &tenant, &id).await;
            }
        }
    }
}

async fn check(
    orders: &Collection<Document>,
    path: &PathBuf,
) -> Result<bool, Box<dyn std::error::Error>> {
    let entries = ledger::read(BufReader::new(File::open(path)?))?;
    let expected = ledger::expected(&entries);
    let mut actual = BTreeMap::new();
    for (id, (tenant, _)) in &expected {
        let found = get(orders, tenant, id).await?;
        actual.insert(id.clone(), found.as_ref().map(app_fields));
    }
    let report = ledger::check(&expected, &actual);
    println!(
        "{}",
        serde_json::to_string_pretty(&json!({ "check": report, "anomalies": report.anomalies() }))?
    );
    Ok(report.anomalies() == 0)
}

async fn run(args: Args) -> Result<bool, Box<dyn std::error::Error>> {
    let client = Client::with_uri_str(&args.uri).await?;
    let orders = client
        .database(&args.database)
        .collection::<Document>(&args.collection);
    if args.check {
        return check(&orders, &args.ledger).await;
    }
    let seed = args.seed.unwrap_or_else(rand::random);
    eprintln!("orders_front: seed {seed}");
    let shared = Arc::new(Shared {
        ledger: Mutex::new(LedgerWriter::new(BufWriter::new(File::create(
            &args.ledger,
        )?))),
        seq: AtomicU64::new(0),
        counts: Default::default(),
    });
    let zipf = Arc::new(Zipf::new(args.tenants.max(1), args.zipf));
    let deadline = Instant::now() + args.duration;
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    tokio::spawn(async move {
        let mut term =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).unwrap();
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        }
        let _ = stop_tx.send(true);
    });
    let per_worker = Duration::from_secs_f64(args.workers as f64 / args.rate.max(1) as f64);
    let mut tasks = Vec::new();
    for n in 0..args.workers {
        let (orders, shared, zipf) = (orders.clone(), shared.clone(), zipf.clone());
        let stop = stop_rx.clone();
        let (prefix, hot, list_percent) =
            (args.id_prefix.clone(), args.hot_share, args.list_percent);
        tasks.push(tokio::spawn(async move {
            let mut w = Worker {
                n,
                rng: StdRng::seed_from_u64(seed ^ (n as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15)),
                orders: HashMap::new(),
                next_id: 0,
                prefix,
            };
            let mut tick = tokio::time::interval(per_worker);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            while Instant::now() < deadline && !*stop.borrow() {
                tick.tick().await;
                step(&orders, &shared, &mut w, &zipf, hot, list_percent).await;
            }
        }));
    }
    for t in tasks {
        t.await?;
    }
    shared.ledger.lock().unwrap().flush()?;
    let counts = shared.counts.lock().unwrap().clone();
    println!(
        "{}",
        serde_json::to_string_pretty(&json!({ "seed": seed, "workload": counts }))?
    );
    Ok(counts.read_anomalies == 0)
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    match run(Args::parse()).await {
        Ok(true) => std::process::ExitCode::SUCCESS,
        Ok(false) => std::process::ExitCode::from(1),
        Err(e) => {
            eprintln!("orders_front: {e}");
            std::process::ExitCode::from(2)
        }
    }
}

//! A small order service built on reshard's router: the reference for application authors.
//!
//! It generates a skewed workload (Zipf-distributed customers, one very hot one) of inserts,
//! partial updates, replaces, deletes, re-creates, reads and tenant listings at a given rate,
//! and appends every acknowledged write to a ledger (JSON lines). Run it while a migration
//! moves through its phases, then check the ledger against the final state:
//!
//! ```sh
//! cargo run --example orders_app -- --database-url $URL --duration 30s --ledger /tmp/orders.jsonl
//! cargo run --example orders_app -- --database-url $URL --check --ledger /tmp/orders.jsonl
//! ```
//!
//! Each worker owns its own order ids (so it knows exactly what each of them must contain)
//! while all workers share the customers. A read that disagrees with the worker's own
//! knowledge is counted as a read anomaly at once; `--check` reports lost writes, resurrected
//! deletes and wrong contents. Both print a JSON summary and exit 1 on any anomaly.

use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::io::{BufReader, BufWriter};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use clap::Parser;
use mongodb::bson::{doc, Bson, Document};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use reshard::ledger::{self, Entry, LedgerWriter};
use reshard::router::{Router, RouterConfig, RouterError};
use serde_json::{json, Value};

#[derive(Parser, Debug)]
struct Args {
    #[arg(long, env = "RESHARD_DATABASE_URL")]
    database_url: String,
    #[arg(long, default_value = "orders")]
    collection: String,
    /// How long to run the workload (`30s`, `10m`).
    #[arg(long, default_value = "30s", value_parser = reshard::duration::parse)]
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
    /// The ledger of acknowledged writes (the workload and `--check`).
    #[arg(long, required_unless_present_any = ["seed_orders", "shard_load"])]
    ledger: Option<PathBuf>,
    /// Check the ledger against the final state instead of running the workload.
    #[arg(long)]
    check: bool,
    /// Seed of the workload (printed; random when not given).
    #[arg(long)]
    seed: Option<u64>,
    /// Percent of operations that list a customer's orders (the rest of the mix scales down).
    #[arg(long, default_value_t = 5)]
    list_percent: u32,
    /// The hot customer's share of the orders (0..1); the others follow the Zipf law. Without
    /// it, all customers do.
    #[arg(long)]
    hot_share: Option<f64>,
    /// Instead of the workload: put this many existing orders where the collection's current
    /// version places them (written directly, as data from before reshard), `createdAt` spread
    /// over the last `--seed-window`.
    #[arg(long)]
    seed_orders: Option<u64>,
    #[arg(long, default_value = "10m", value_parser = reshard::duration::parse)]
    seed_window: Duration,
    /// Instead of the workload: print, per shard, the orders it holds and those created in
    /// the last WINDOW (`10m`; the insert load it takes), as JSON.
    #[arg(long, value_name = "WINDOW", value_parser = reshard::duration::parse)]
    shard_load: Option<Duration>,
    /// The router's lease (default: the library's ten minutes). A short lease lets a driver
    /// count a killed instance out quickly (fault tests).
    #[arg(long, value_parser = reshard::duration::parse)]
    router_lease: Option<Duration>,
    /// How long the router waits for the state store when the service starts while it is
    /// down (default: the library's two minutes); `0s` fails at once. The service serves
    /// nothing before the router has loaded the migration's phase.
    #[arg(long, value_parser = reshard::duration::parse)]
    connect_deadline: Option<Duration>,
    /// The prefix of this instance's order ids (`<prefix><worker>-<n>`): instances that run
    /// one after another on one collection need different prefixes.
    #[arg(long, default_value = "w")]
    id_prefix: String,
    /// A journal (JSON lines) of every write's intent, appended before the write is sent
    /// (`{"type": "intent", "seq", "worker", "op", "tenant", "id", "doc"}`: the state the write
    /// leads to, `seq` from the ledger's sequence), and of every failed operation (`{"type":
    /// "error", "t_ms", "kind", "error"}`). With it, both files are flushed after every line,
    /// so a process killed with SIGKILL leaves them whole: a write whose intent has no later
    /// ledger entry may or may not have landed.
    #[arg(long)]
    journal: Option<PathBuf>,
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

/// Picks a customer: `cust-hot` with probability `hot_share`, the others by Zipf rank; or all
/// by Zipf rank.
fn pick_tenant(rng: &mut impl Rng, zipf: &Zipf, hot_share: Option<f64>) -> String {
    match hot_share {
        Some(share) if rng.gen_bool(share.clamp(0.0, 1.0)) => tenant_name(1),
        Some(_) => loop {
            let rank = zipf.sample(rng);
            if rank != 1 || zipf.cumulative.len() == 1 {
                break tenant_name(rank);
            }
        },
        None => tenant_name(zipf.sample(rng)),
    }
}

fn tenant_name(rank: usize) -> String {
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
}

struct Shared {
    ledger: Mutex<LedgerWriter<BufWriter<File>>>,
    seq: std::sync::atomic::AtomicU64,
    counts: Mutex<Counts>,
    /// `--journal`: intents and errors, flushed line by line (and the ledger too).
    journal: Option<Mutex<BufWriter<File>>>,
}

impl Shared {
    fn log(&self, worker: u32, op: &str, tenant: &str, id: &str, doc: Option<Value>) {
        let entry = Entry {
            seq: self.seq.fetch_add(1, std::sync::atomic::Ordering::SeqCst),
            worker,
            op: op.to_owned(),
            tenant: tenant.to_owned(),
            id: id.to_owned(),
            doc,
        };
        let mut ledger = self.ledger.lock().unwrap();
        ledger.append(&entry).expect("ledger write");
        if self.journal.is_some() {
            ledger.flush().expect("ledger flush");
        }
    }

    fn journal(&self, line: Value) {
        if let Some(journal) = &self.journal {
            use std::io::Write;
            let mut out = journal.lock().unwrap();
            serde_json::to_writer(&mut *out, &line).expect("journal write");
            out.write_all(b"\n").expect("journal write");
            out.flush().expect("journal flush");
        }
    }

    /// Records that a write is about to be sent, and the state of `id` it leads to.
    fn intent(&self, worker: u32, op: &str, tenant: &str, id: &str, doc: Option<Value>) {
        if self.journal.is_some() {
            let seq = self.seq.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            self.journal(json!({
                "type": "intent", "seq": seq, "worker": worker, "op": op, "tenant": tenant,
                "id": id, "doc": doc,
            }));
        }
    }

    fn error(&self, e: &RouterError) {
        let kind = format!("{e:?}");
        let kind = kind
            .split(|c: char| !c.is_alphanumeric())
            .next()
            .unwrap_or_default();
        let t_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        self.journal(
            json!({ "type": "error", "t_ms": t_ms, "kind": kind, "error": e.to_string() }),
        );
    }

    /// Counts an anomaly; the example names the phase and epoch the router was in just after.
    fn anomaly(&self, at: &reshard::router::Snapshot, what: String) {
        let mut c = self.counts.lock().unwrap();
        c.read_anomalies += 1;
        if c.anomaly_examples.len() < 20 {
            c.anomaly_examples
                .push(format!("[{} epoch {}] {what}", at.phase, at.epoch));
        }
    }
}

/// What one worker knows of its own orders.
struct Worker {
    n: u32,
    rng: StdRng,
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

/// Re-reads an order whose write failed in a way that may or may not have applied.
async fn resync(router: &Router, shared: &Shared, w: &mut Worker, tenant: &str, id: &str) {
    if let Ok(found) = router.get(tenant, id).await {
        shared.log(w.n, "resync", tenant, id, found.as_ref().map(app_fields));
        w.orders.insert(id.to_owned(), (tenant.to_owned(), found));
    }
}

/// Whether an error means the write certainly did not happen.
fn not_applied(e: &RouterError) -> bool {
    matches!(
        e,
        RouterError::WriteHeld(_) | RouterError::RoutingStale | RouterError::DuplicateId(_)
    )
}

async fn step(
    router: &Router,
    shared: &Shared,
    w: &mut Worker,
    zipf: &Zipf,
    hot: Option<f64>,
    list_percent: u32,
) {
    // Rolls 95..99 list; with fewer listings the rest of the mix takes their place.
    let list_percent = list_percent.min(100);
    let roll: u32 = match w.rng.gen_range(0..100) {
        r if r < 100 - list_percent => r * 95 / (100 - list_percent).max(1),
        _ => 95,
    };
    shared.counts.lock().unwrap().ops += 1;
    let result: Result<(), RouterError> = async {
        match roll {
            // Insert a new order for a Zipf-chosen customer.
            0..=29 => {
                let tenant = pick_tenant(&mut w.rng, zipf, hot);
                let id = format!("{}{}-{}", w.prefix, w.n, w.next_id);
                w.next_id += 1;
                let doc = doc! {
                    "_id": &id, "customerId": &tenant, "qty": 1, "status": "new", "version": 1,
                    "createdAt": mongodb::bson::DateTime::now(),
                };
                w.orders.insert(id.clone(), (tenant.clone(), None));
                shared.intent(w.n, "insert", &tenant, &id, Some(app_fields(&doc)));
                router.insert(doc.clone()).await?;
                shared.log(w.n, "insert", &tenant, &id, Some(app_fields(&doc)));
                w.orders.insert(id, (tenant, Some(doc)));
            }
            // Partial update.
            30..=54 => {
                let Some((id, tenant, Some(mut doc))) = w.pick(true) else { return Ok(()) };
                let mut after = doc.clone();
                after.insert("qty", doc.get_i32("qty").unwrap() + 1);
                after.insert("version", doc.get_i32("version").unwrap() + 1);
                after.insert("status", "paid");
                shared.intent(w.n, "update", &tenant, &id, Some(app_fields(&after)));
                let changed = router
                    .update(&tenant, &id, doc! { "$inc": { "qty": 1, "version": 1 }, "$set": { "status": "paid" } })
                    .await?;
                if !changed {
                    shared.anomaly(&*router.snapshot().await, format!("update of live {id} matched nothing"));
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
                let version = doc.get_i32("version").unwrap() + 1;
                let new = doc! { "_id": &id, "customerId": &tenant, "qty": 7, "status": "replaced", "version": version };
                shared.intent(w.n, "replace", &tenant, &id, Some(app_fields(&new)));
                if !router.replace(new.clone(), false).await? {
                    shared.anomaly(&*router.snapshot().await, format!("replace of live {id} matched nothing"));
                    return Ok(());
                }
                shared.log(w.n, "replace", &tenant, &id, Some(app_fields(&new)));
                w.orders.insert(id, (tenant, Some(new)));
            }
            // Delete.
            65..=74 => {
                let Some((id, tenant, Some(_))) = w.pick(true) else { return Ok(()) };
                shared.intent(w.n, "delete", &tenant, &id, None);
                if !router.delete(&tenant, &id).await? {
                    shared.anomaly(&*router.snapshot().await, format!("delete of live {id} found nothing"));
                }
                shared.log(w.n, "delete", &tenant, &id, None);
                w.orders.insert(id, (tenant, None));
            }
            // Re-create a deleted order.
            75..=79 => {
                let Some((id, tenant, None)) = w.pick(false) else { return Ok(()) };
                let doc = doc! { "_id": &id, "customerId": &tenant, "qty": 3, "status": "recreated", "version": 1 };
                shared.intent(w.n, "recreate", &tenant, &id, Some(app_fields(&doc)));
                router.insert(doc.clone()).await?;
                shared.log(w.n, "recreate", &tenant, &id, Some(app_fields(&doc)));
                w.orders.insert(id, (tenant, Some(doc)));
            }
            // Read one of my orders and compare with what I know.
            80..=94 => {
                let live = w.rng.gen_bool(0.8);
                let Some((id, tenant, known)) = w.pick(live) else { return Ok(()) };
                let found = router.get(&tenant, &id).await?;
                shared.counts.lock().unwrap().reads += 1;
                let (a, b) = (known.as_ref().map(app_fields), found.as_ref().map(app_fields));
                if a != b {
                    shared.anomaly(&*router.snapshot().await, format!("read {id}: expected {a:?}, got {b:?}"));
                }
            }
            // List a customer and compare my orders of that customer.
            _ => {
                let tenant = pick_tenant(&mut w.rng, zipf, hot);
                let mut seen: BTreeMap<String, Value> = BTreeMap::new();
                let mut after: Option<Bson> = None;
                loop {
                    let page = router.list_tenant(tenant.as_str(), after.clone(), 100).await?;
                    for d in &page.documents {
                        // Orders written before reshard may have ids of any type: an id is
                        // named by its value and type, so that 7 and "7" stay apart.
                        let id = match d.get("_id") {
                            Some(Bson::String(s)) => s.clone(),
                            Some(other) => other.clone().into_canonical_extjson().to_string(),
                            None => String::new(),
                        };
                        if seen.insert(id.clone(), app_fields(d)).is_some() {
                            shared.anomaly(&*router.snapshot().await, format!("listing of {tenant} returned {id} twice"));
                        }
                    }
                    match page.next {
                        Some(next) => after = Some(next),
                        None => break,
                    }
                }
                shared.counts.lock().unwrap().listings += 1;
                for (id, (t, doc)) in &w.orders {
                    if *t != tenant {
                        continue;
                    }
                    let want = doc.as_ref().map(app_fields);
                    if seen.get(id).cloned() != want {
                        shared.anomaly(&*router.snapshot().await, format!("listing of {tenant}: {id} expected {want:?}, got {:?}", seen.get(id)));
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
            shared.counts.lock().unwrap().errors += 1;
            shared.error(&e);
            tracing::warn!(error = %e, "operation failed");
            if !not_applied(&e) && roll < 80 {
                // The write may or may not have happened: find out and record it.
                let ids: Vec<(String, String)> = w
                    .orders
                    .iter()
                    .map(|(id, (t, _))| (id.clone(), t.clone()))
                    .collect();
                for (id, tenant) in ids {
                    resync(router, shared, w, &tenant, &id).await;
                }
            }
        }
    }
}

/// Writes `n` orders where the current version places them, in batches per location.
async fn seed_orders(args: &Args, n: u64) -> Result<bool, Box<dyn std::error::Error>> {
    let store = reshard::store::Store::connect(&args.database_url).await?;
    let current = store.current_version(&args.collection).await?;
    let version = store
        .version(&args.collection, Some(current))
        .await?
        .version;
    let databases = own_databases(&store.shards().await?).await?;
    let zipf = Zipf::new(args.tenants.max(1), args.zipf);
    let mut rng = StdRng::seed_from_u64(args.seed.unwrap_or(7));
    let now = mongodb::bson::DateTime::now().timestamp_millis();
    let window = (args.seed_window.as_millis() as i64).max(1);
    let mut batches: HashMap<reshard::routing::Location, Vec<Document>> = HashMap::new();
    let mut written = 0_u64;
    let started = Instant::now();
    for i in 0..n {
        let tenant = pick_tenant(&mut rng, &zipf, args.hot_share);
        let id = format!("seed-{i:07}");
        let located = version.locate(
            &reshard::routing::KeyValue::String(tenant.clone()),
            &reshard::routing::KeyValue::String(id.clone()),
        )?;
        let mut doc = doc! {
            "_id": &id, "customerId": &tenant, "qty": rng.gen_range(1..10), "status": "new",
            "version": 1,
            "createdAt": mongodb::bson::DateTime::from_millis(now - window + (i as i64 * window) / n.max(1) as i64),
        };
        if let Some(field) = version.routing_field() {
            doc.insert(field, located.sub_bucket as i32);
        }
        let location = located.locations[0].clone();
        let batch = batches.entry(location.clone()).or_default();
        batch.push(doc);
        if batch.len() >= 1000 {
            let docs = std::mem::take(batch);
            written += docs.len() as u64;
            databases[&location.shard]
                .collection::<Document>(&location.collection)
                .insert_many(docs)
                .await?;
        }
    }
    for (location, docs) in batches {
        if !docs.is_empty() {
            written += docs.len() as u64;
            databases[&location.shard]
                .collection::<Document>(&location.collection)
                .insert_many(docs)
                .await?;
        }
    }
    println!(
        "{}",
        json!({ "seeded": written, "seconds": started.elapsed().as_secs_f64() })
    );
    Ok(true)
}

/// The application's own handle on each registered shard's database: seeding and counting
/// are the application's writes and reads, not reshard's.
async fn own_databases(
    registered: &[reshard::store::shards::Shard],
) -> Result<std::collections::BTreeMap<String, mongodb::Database>, Box<dyn std::error::Error>> {
    let mut databases = std::collections::BTreeMap::new();
    for shard in registered {
        let uri = reshard::shards::resolve_uri(shard.uri.expose())?;
        let client = mongodb::Client::with_uri_str(&uri).await?;
        databases.insert(shard.name.clone(), client.database(&shard.database));
    }
    Ok(databases)
}

/// Per shard: the orders it holds (tombstones aside) and those created in the last `window`.
async fn shard_load(args: &Args, window: Duration) -> Result<bool, Box<dyn std::error::Error>> {
    let store = reshard::store::Store::connect(&args.database_url).await?;
    let registered = store.shards().await?;
    let databases = own_databases(&registered).await?;
    let since = mongodb::bson::DateTime::from_millis(
        mongodb::bson::DateTime::now().timestamp_millis() - window.as_millis() as i64,
    );
    let live = doc! { "_reshard.deleted": { "$ne": true } };
    let mut out = serde_json::Map::new();
    for shard in &registered {
        let db = &databases[&shard.name];
        let (mut documents, mut recent) = (0_u64, 0_u64);
        for name in db.list_collection_names().await? {
            if !name.starts_with(&args.collection) {
                continue;
            }
            let coll = db.collection::<Document>(&name);
            documents += coll.count_documents(live.clone()).await?;
            let mut filter = live.clone();
            filter.insert("createdAt", doc! { "$gte": since });
            recent += coll.count_documents(filter).await?;
        }
        out.insert(
            shard.name.clone(),
            json!({
                "documents": documents,
                "inserted_recently": recent,
                "inserts_per_sec": recent as f64 / window.as_secs_f64().max(1.0),
            }),
        );
    }
    println!("{}", Value::Object(out));
    Ok(true)
}

fn ledger_path(args: &Args) -> Result<&PathBuf, Box<dyn std::error::Error>> {
    args.ledger
        .as_ref()
        .ok_or_else(|| "--ledger is required".into())
}

async fn run(args: Args) -> Result<bool, Box<dyn std::error::Error>> {
    if let Some(n) = args.seed_orders {
        return seed_orders(&args, n).await;
    }
    if let Some(window) = args.shard_load {
        return shard_load(&args, window).await;
    }
    let mut config = RouterConfig::named("orders-app");
    config.heartbeat_interval = Duration::from_millis(500);
    if let Some(lease) = args.router_lease {
        config.lease_ttl = lease;
    }
    if let Some(deadline) = args.connect_deadline {
        config.connect_deadline = (!deadline.is_zero()).then_some(deadline);
    }
    let router = Router::connect(&args.database_url, &args.collection, config).await?;
    if args.check {
        let entries = ledger::read(BufReader::new(File::open(ledger_path(&args)?)?))?;
        let expected = ledger::expected(&entries);
        let mut actual = BTreeMap::new();
        for (id, (tenant, _)) in &expected {
            let found = router.get(tenant.as_str(), id.as_str()).await?;
            actual.insert(id.clone(), found.as_ref().map(app_fields));
        }
        let report = ledger::check(&expected, &actual);
        println!(
            "{}",
            serde_json::to_string_pretty(
                &json!({ "check": report, "anomalies": report.anomalies() })
            )?
        );
        router.shutdown().await;
        return Ok(report.anomalies() == 0);
    }
    let seed = args.seed.unwrap_or_else(rand::random);
    eprintln!("orders_app: seed {seed}");
    let shared = Arc::new(Shared {
        ledger: Mutex::new(LedgerWriter::new(BufWriter::new(File::create(
            ledger_path(&args)?,
        )?))),
        seq: Default::default(),
        counts: Default::default(),
        journal: match &args.journal {
            Some(path) => Some(Mutex::new(BufWriter::new(File::create(path)?))),
            None => None,
        },
    });
    let zipf = Arc::new(Zipf::new(args.tenants.max(1), args.zipf));
    let hot = args.hot_share;
    let list_percent = args.list_percent;
    let deadline = Instant::now() + args.duration;
    // SIGINT or SIGTERM end the workload early; the ledger is flushed as after a full run.
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
        let (router, shared, zipf) = (router.clone(), shared.clone(), zipf.clone());
        let stop = stop_rx.clone();
        let prefix = args.id_prefix.clone();
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
                step(&router, &shared, &mut w, &zipf, hot, list_percent).await;
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
    router.shutdown().await;
    Ok(counts.read_anomalies == 0)
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_env("RESHARD_LOG"))
        .with_writer(std::io::stderr)
        .init();
    match run(Args::parse()).await {
        Ok(true) => std::process::ExitCode::SUCCESS,
        Ok(false) => std::process::ExitCode::from(1),
        Err(e) => {
            eprintln!(
                "orders_app: {}",
                reshard::redact::redact_uri(&e.to_string())
            );
            std::process::ExitCode::from(2)
        }
    }
}

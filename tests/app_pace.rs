//! The application sets the pace: with a latency budget, a worker halves its rate while a
//! router reports a p99 above it (a `rate_cut` event with the cause), and steps it back up
//! once the routers recover; the p99 routers reported when the backfill was planned is kept
//! as the base of a relative budget (`--latency-budget 2x`). Real servers; the application is
//! a real router whose reads are slowed by a step hook.

mod support;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use mongodb::bson::{doc, Document};
use reshard::phase::Phase;
use reshard::router::{RouterConfig, StepEvent};
use reshard::routing::KeyValue;
use reshard::store::events::EventKind;
use support::World;

/// Enough that the backfill, at most `MAX_RATE` documents a second, outlasts the test.
const DOCS: usize = 40_000;
/// Above the floor even at a slow start's eighth, so that a cut is a cut.
const MAX_RATE: f64 = 1_600.0;
/// What each protocol step of the application's reads waits while it is slow.
const SLOW_STEP: Duration = Duration::from_millis(300);
/// The budget: over what the application reports under the backfill on a loaded 2-core
/// machine, under what a slow read takes (at least one slowed step, plus the read).
const BUDGET_MS: f64 = 250.0;

async fn seed(w: &World) -> Vec<(String, String)> {
    let mut by_location: HashMap<_, Vec<Document>> = HashMap::new();
    let mut seeded = Vec::new();
    for i in 0..DOCS {
        let tenant = format!("cust-{:03}", i % 20);
        let id = format!("old-{i:05}");
        let at =
            w.v1.locate(
                &KeyValue::String(tenant.clone()),
                &KeyValue::String(id.clone()),
            )
            .unwrap()
            .locations[0]
                .clone();
        by_location
            .entry(at)
            .or_default()
            .push(doc! { "_id": &id, "customerId": &tenant, "qty": i as i32 });
        seeded.push((tenant, id));
    }
    for (at, docs) in by_location {
        w.shards[&at.shard]
            .collection::<Document>(&at.collection)
            .insert_many(docs)
            .await
            .unwrap();
    }
    seeded
}

/// The worker's applied rate as its last heartbeat recorded it.
async fn applied(w: &World) -> f64 {
    w.store
        .workers(w.migration)
        .await
        .unwrap()
        .iter()
        .filter(|r| r.live)
        .map(|r| r.applied_docs_per_sec)
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn routers_over_their_latency_budget_cut_the_rate_and_recovery_restores_it() {
    let w = World::start().await;
    let seeded = Arc::new(seed(&w).await);
    let slow = Arc::new(AtomicBool::new(false));
    let hook_slow = slow.clone();
    let mut config = RouterConfig::named("app");
    config.heartbeat_interval = Duration::from_secs(1);
    config.step_hook = Some(Arc::new(move |_e: StepEvent| {
        let slow = hook_slow.load(Ordering::Relaxed);
        Box::pin(async move {
            if slow {
                tokio::time::sleep(SLOW_STEP).await;
            }
        })
    }));
    let router = Arc::new(w.router(config).await);

    // The application: 24 readers, all the time (enough operations per heartbeat to
    // judge even while slow).
    let stop = Arc::new(AtomicBool::new(false));
    let mut readers = Vec::new();
    for r in 0..24 {
        let (router, seeded, stop) = (router.clone(), seeded.clone(), stop.clone());
        readers.push(tokio::spawn(async move {
            let mut i = r;
            while !stop.load(Ordering::Relaxed) {
                let (tenant, id) = &seeded[i % seeded.len()];
                router.get(tenant.as_str(), id.as_str()).await.unwrap();
                i += 7;
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }));
    }

    w.store
        .update_settings(
            w.migration,
            |s| {
                s.max_docs_per_sec = MAX_RATE;
                s.batch_size = 50;
                s.latency_budget_ms = BUDGET_MS;
            },
            "test",
            None,
        )
        .await
        .unwrap();
    w.advance(
        &[&router],
        &[
            Phase::DualRead,
            Phase::WriteSwitch,
            Phase::NewWrites,
            Phase::Backfill,
        ],
    )
    .await;
    // Let the routers report the application's "before" for a few intervals.
    tokio::time::sleep(Duration::from_secs(3)).await;

    let mut wc = reshard::worker::WorkerConfig::new("pace-worker");
    wc.migration = Some(w.migration);
    wc.lease_ttl = Duration::from_secs(10);
    wc.idle_poll = Duration::from_millis(200);
    wc.refresh = Duration::from_millis(500);
    let (stop_worker, shutdown) = tokio::sync::watch::channel(false);
    let worker = reshard::worker::Worker::with_shards(w.store.clone(), w.databases(), wc);
    let worker = tokio::spawn(async move { worker.run(shutdown).await.map(|_| ()) });

    // The baseline was taken when the worker planned the backfill.
    let started = Instant::now();
    let baseline = loop {
        let m = w.store.migration(w.migration).await.unwrap();
        if m.backfill_planned_at.is_some() {
            break m.app_p99_baseline_ms;
        }
        assert!(started.elapsed() < Duration::from_secs(30), "never planned");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let baseline = baseline.expect("routers reported a p99 before the backfill was planned");
    assert!(baseline > 0.0 && baseline < 10_000.0, "{baseline}");
    tokio::time::sleep(Duration::from_secs(2)).await;
    let before = applied(&w).await;

    // The application slows down: the rate is cut, with the cause in the event.
    slow.store(true, Ordering::Relaxed);
    let started = Instant::now();
    let (mut low, mut peak) = (before, before);
    while started.elapsed() < Duration::from_secs(6) {
        tokio::time::sleep(Duration::from_millis(250)).await;
        let now = applied(&w).await;
        peak = peak.max(now);
        low = low.min(now);
    }
    assert!(
        low <= peak / 2.0 && low <= MAX_RATE / 4.0,
        "rate while over budget: {low} (at most {peak} before)"
    );
    let events = w.store.events(w.migration).await.unwrap();
    let cut = events
        .iter()
        .find(|e| {
            e.kind == EventKind::RateCut
                && e.details["cause"] == "app_latency"
                && e.details["app_p99_ms"].as_f64().unwrap() > BUDGET_MS
        })
        .unwrap_or_else(|| {
            panic!("no rate_cut event naming the application's latency: {events:?}")
        });
    assert_eq!(
        cut.details["latency_budget_ms"], BUDGET_MS,
        "{}",
        cut.details
    );
    assert!(cut.reason.as_deref().unwrap().contains("p99"));

    // It recovers: the rate steps back up (from its lowest, which may come just after the
    // recovery: the window of reports that judges the application still holds slow ones).
    slow.store(false, Ordering::Relaxed);
    let started = Instant::now();
    let mut now = low;
    while started.elapsed() < Duration::from_secs(30) && now < low + 2.0 * (MAX_RATE / 20.0) {
        tokio::time::sleep(Duration::from_millis(500)).await;
        now = applied(&w).await;
        low = low.min(now);
    }
    assert!(
        now >= low + 2.0 * (MAX_RATE / 20.0),
        "the rate steps back up after the routers recover: {low} -> {now}"
    );

    stop.store(true, Ordering::Relaxed);
    for r in readers {
        r.await.unwrap();
    }
    let _ = stop_worker.send(true);
    worker.await.unwrap().expect("the worker ends cleanly");

    // A relative budget: the factor times the p99 kept when the backfill was planned.
    let cli = |args: &[&str]| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_reshard"))
            .env("RESHARD_DATABASE_URL", w.db.url())
            .env_remove("DATABASE_URL")
            .args(args)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let id = w.migration.to_string();
    cli(&["throttle", "set", &id, "--latency-budget", "2x"]);
    let status: serde_json::Value =
        serde_json::from_str(&cli(&["migration", "status", &id, "--output", "json"])).unwrap();
    let shown = status["throttle"]["latency_budget_ms"].as_f64().unwrap();
    assert!(
        (shown - 2.0 * baseline).abs() < 1e-9,
        "{shown} vs 2 x {baseline}"
    );
    assert_eq!(status["throttle"]["app_p99_baseline_ms"], baseline);
}

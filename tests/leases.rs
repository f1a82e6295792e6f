//! Short leases (issue 29, item 0): every task makes progress when a partition needs many lease
//! periods, and a rollback's copy back finishes with 4 s leases, a holder SIGKILLed and the
//! application writing throughout.

mod support;

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use mongodb::bson::{doc, oid::ObjectId, Bson, Document};
use reshard::routing::KeyValue;
use reshard::store::partitions::{Partition, PartitionState, Task};
use support::{heavy_tests_enabled, reshard_ok, StateDb, World};

fn example_binary() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let dir = exe.parent().unwrap().parent().unwrap();
    dir.join("examples").join("orders_app")
}

/// Orders of every `_id` type the tests meet (strings, 64-bit integers, ObjectIds), put where
/// version 1 places them, as data from before reshard.
async fn seed(w: &World, n: usize) -> usize {
    let mut by_location: std::collections::BTreeMap<_, Vec<Document>> = Default::default();
    for i in 0..n {
        let tenant = if i % 4 == 0 {
            "cust-hot".to_owned()
        } else {
            format!("cust-{:04}", i % 37 + 2)
        };
        let id = match i % 3 {
            0 => Bson::String(format!("old-{i:05}")),
            1 => Bson::Int64(1_000_000 + i as i64),
            _ => Bson::ObjectId(ObjectId::new()),
        };
        let l =
            w.v1.locate(
                &KeyValue::String(tenant.clone()),
                &KeyValue::from_bson(&id).unwrap(),
            )
            .unwrap()
            .locations[0]
                .clone();
        by_location.entry(l).or_default().push(doc! {
            "_id": id, "customerId": tenant, "qty": i as i32, "note": "x".repeat(200),
        });
    }
    for (l, docs) in by_location {
        w.shards[&l.shard]
            .collection::<Document>(&l.collection)
            .insert_many(docs)
            .await
            .unwrap();
    }
    n
}

/// The example order service writing through its own router, with a ledger of what it was
/// acknowledged.
struct App {
    child: Child,
    ledger: tempfile::NamedTempFile,
}

impl App {
    fn start(db: &StateDb, seed: u64, rate: u32, seconds: u64) -> App {
        let ledger = tempfile::NamedTempFile::new().unwrap();
        let child = Command::new(example_binary())
            .env("RESHARD_DATABASE_URL", db.url())
            .args([
                "--duration",
                &format!("{seconds}s"),
                "--rate",
                &rate.to_string(),
            ])
            .args(["--workers", "3", "--router-lease", "6s"])
            .args(["--id-prefix", &format!("a{seed}-")])
            .args(["--seed", &seed.to_string()])
            .args(["--ledger", ledger.path().to_str().unwrap()])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        App { child, ledger }
    }

    /// Ends the workload (SIGTERM: the ledger is flushed as after a full run) and checks its
    /// ledger against the final state.
    async fn check(self, db: &StateDb) {
        let App { child, ledger } = self;
        Command::new("kill")
            .args(["-TERM", &child.id().to_string()])
            .status()
            .unwrap();
        let out = tokio::task::spawn_blocking(move || child.wait_with_output().unwrap())
            .await
            .unwrap();
        assert!(
            out.status.success(),
            "the app found anomalies: {}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let check = Command::new(example_binary())
            .env("RESHARD_DATABASE_URL", db.url())
            .args(["--check", "--ledger", ledger.path().to_str().unwrap()])
            .output()
            .unwrap();
        let report = String::from_utf8_lossy(&check.stdout);
        assert!(check.status.success(), "ledger check failed: {report}");
        let report: serde_json::Value = serde_json::from_str(&report).unwrap();
        assert_eq!(report["anomalies"], 0, "{report}");
    }
}

/// A `reshard worker` process with its log in a file of its own.
struct WorkerProcess {
    child: Child,
    log: tempfile::NamedTempFile,
    name: String,
}

impl WorkerProcess {
    fn start(db: &StateDb, migration: &str, name: &str, lease: &str) -> WorkerProcess {
        let log = tempfile::NamedTempFile::new().unwrap();
        let child = Command::new(env!("CARGO_BIN_EXE_reshard"))
            .env("RESHARD_DATABASE_URL", db.url())
            .env("RESHARD_LOG", "info")
            .args(["worker", migration, "--lease-ttl", lease, "--name", name])
            .args(["--concurrency", "2"])
            .stdout(Stdio::null())
            .stderr(log.reopen().unwrap())
            .spawn()
            .unwrap();
        WorkerProcess {
            child,
            log,
            name: name.to_owned(),
        }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.log.path()).unwrap_or_default()
    }

    fn kill(&mut self) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
    }
}

impl Drop for WorkerProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Waits until every partition of `task` is done, or fails after `limit` with the partitions'
/// states and the workers' logs.
async fn until_done(w: &World, task: Task, limit: Duration, workers: &[&WorkerProcess]) {
    let started = Instant::now();
    loop {
        let partitions = w.store.partitions(w.migration, task).await.unwrap();
        if !partitions.is_empty() && partitions.iter().all(|p| p.state == PartitionState::Done) {
            return;
        }
        if started.elapsed() > limit {
            let logs: Vec<String> = workers
                .iter()
                .map(|w| format!("--- {}:\n{}", w.name, tail(&w.log(), 40)))
                .collect();
            panic!(
                "{task} did not finish in {limit:?}: {}\n{}",
                describe(&partitions),
                logs.join("\n")
            );
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

fn describe(partitions: &[Partition]) -> String {
    partitions
        .iter()
        .map(|p| {
            format!(
                "\n  #{} {:?} attempts {} timeouts {} batch limit {:?} scanned {} owner {:?}",
                p.id, p.state, p.attempts, p.timeouts, p.batch_limit, p.scanned, p.lease_owner
            )
        })
        .collect()
}

fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// Waits until `worker` holds a lease on a partition of `task`.
async fn until_holding(w: &World, task: Task, worker: &str) {
    let started = Instant::now();
    loop {
        let partitions = w.store.partitions(w.migration, task).await.unwrap();
        if partitions
            .iter()
            .any(|p| p.state == PartitionState::Leased && p.lease_owner.as_deref() == Some(worker))
        {
            return;
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "{worker} never held a {task} partition: {}",
            describe(&partitions)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The scenario that livelocked (issue 29, item 0), as an operator runs it: forward to
/// `reconcile` with a full reconciliation, then a rollback whose copy back runs on two workers
/// with 4 s leases, one of them SIGKILLed while it holds revert leases and a third started,
/// with the application writing through two routers throughout. The copy back's conditional
/// writes, batched by the default 1,000, took longer than a 4 s lease leaves a command on the
/// loaded stand-in; every timed-out batch gave its partition up, and the next holder met the
/// same batch again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rollback_with_four_second_leases_finishes_with_a_holder_killed() {
    let w = World::start().await;
    let id = w.migration.to_string();
    let documents = if heavy_tests_enabled() { 1_500 } else { 900 };
    seed(&w, documents).await;
    let seconds = 600;
    let started = Instant::now();
    let apps = [
        App::start(&w.db, 7, 60, seconds),
        App::start(&w.db, 8, 60, seconds),
    ];
    tokio::time::sleep(Duration::from_secs(2)).await;
    let per_partition = (documents / 4).to_string();
    reshard_ok(
        &w.db,
        &[
            "migration",
            "configure",
            &id,
            "--documents-per-partition",
            &per_partition,
        ],
    );
    for phase in ["dual_read", "write_switch", "backfill"] {
        reshard_ok(&w.db, &["migration", "advance", &id, "--to", phase]);
    }
    let forward = WorkerProcess::start(&w.db, &id, "forward", "4s");
    until_done(&w, Task::Backfill, Duration::from_secs(120), &[&forward]).await;
    drop(forward);
    reshard_ok(&w.db, &["migration", "advance", &id, "--to", "reconcile"]);
    reshard_ok(&w.db, &["reconcile", &id, "--full", "--lease-ttl", "4s"]);
    reshard_ok(&w.db, &["migration", "rollback", &id, "--reason", "test"]);

    let mut a = WorkerProcess::start(&w.db, &id, "revert-a", "4s");
    let b = WorkerProcess::start(&w.db, &id, "revert-b", "4s");
    until_holding(&w, Task::Revert, "revert-a").await;
    a.kill();
    let c = WorkerProcess::start(&w.db, &id, "revert-c", "4s");
    until_done(&w, Task::Revert, Duration::from_secs(150), &[&a, &b, &c]).await;
    let partitions = w.store.partitions(w.migration, Task::Revert).await.unwrap();
    eprintln!(
        "copy back done {:.0}s after the start:{}",
        started.elapsed().as_secs_f64(),
        describe(&partitions)
    );
    assert!(
        partitions.iter().any(|p| p.attempts > 1),
        "no revert partition was taken over from the killed holder: {}",
        describe(&partitions)
    );
    reshard_ok(
        &w.db,
        &["migration", "advance", &id, "--to", "revert_switch"],
    );
    let m = w.store.migration(w.migration).await.unwrap();
    assert_eq!(m.phase().as_str(), "rolled_back");
    drop((b, c));
    for app in apps {
        app.check(&w.db).await;
    }
}

/// Waits until `worker` holds a lease on a partition of `task` that has recorded something,
/// then SIGKILLs it.
async fn kill_while_holding(w: &World, task: Task, worker: &mut WorkerProcess) {
    let started = Instant::now();
    loop {
        let partitions = w.store.partitions(w.migration, task).await.unwrap();
        if partitions.iter().any(|p| {
            p.state == PartitionState::Leased
                && p.lease_owner.as_deref() == Some(worker.name.as_str())
                && p.scanned > 0
        }) {
            worker.kill();
            return;
        }
        assert!(
            started.elapsed() < Duration::from_secs(90),
            "{} never held a {task} partition that recorded something: {}",
            worker.name,
            describe(&partitions)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The longest a partition of `partitions` took from its first claim to its end, in lease
/// periods of `lease`.
fn longest_in_leases(partitions: &[Partition], lease: Duration) -> f64 {
    partitions
        .iter()
        .filter_map(|p| (p.finished_at? - p.started_at?).to_std().ok())
        .map(|took| took.as_secs_f64() / lease.as_secs_f64())
        .fold(0.0, f64::max)
}

/// How many documents each source location holds that version 2 places elsewhere: what
/// cleanup must delete, counted before it starts (routers write only the target by then).
async fn moved_in_source(w: &World) -> i64 {
    use futures::TryStreamExt;
    let mut moved = 0;
    for l in w.v1.locations() {
        let docs: Vec<Document> = w.shards[&l.shard]
            .collection::<Document>(&l.collection)
            .find(doc! {})
            .await
            .unwrap()
            .try_collect()
            .await
            .unwrap();
        for d in docs {
            if reshard::envelope::is_tombstone(&d) {
                continue;
            }
            let (tenant, id) = w.v2.document_keys(&d).unwrap();
            if !w.v2.locate(&tenant, &id).unwrap().locations.contains(&l) {
                moved += 1;
            }
        }
    }
    moved
}

const SHORT: &str = "2s";

/// Every task of a migration forward (the backfill, a full reconciliation, cleanup) finishes
/// partitions that need ten lease periods or more, on 2 s leases (the shortest the CLI
/// takes), with the application writing and each task's holder SIGKILLed while it holds a
/// partition that recorded something; the ledgers of what was taken over are exact.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forward_tasks_finish_partitions_of_ten_lease_periods_with_a_holder_killed() {
    let lease = Duration::from_secs(2);
    let w = World::start().await;
    let id = w.migration.to_string();
    let seeded = seed(&w, 300).await;
    reshard_ok(
        &w.db,
        &[
            "migration",
            "configure",
            &id,
            "--documents-per-partition",
            "100000",
        ],
    );
    // Slow enough that the longest partition outlasts ten lease periods whatever the split of
    // documents among partitions (20/s gave 9.7 periods for the backfill in a CI run; 12/s
    // made the test take 286 s alone).
    reshard_ok(
        &w.db,
        &[
            "throttle",
            "set",
            &id,
            "--max-docs-per-sec",
            "15",
            "--batch-size",
            "10",
        ],
    );
    let app = App::start(&w.db, 21, 40, 900);
    tokio::time::sleep(Duration::from_secs(2)).await;
    for phase in ["dual_read", "write_switch", "backfill"] {
        reshard_ok(&w.db, &["migration", "advance", &id, "--to", phase]);
    }

    // The backfill.
    let mut a = WorkerProcess::start(&w.db, &id, "backfill-a", SHORT);
    let b = WorkerProcess::start(&w.db, &id, "backfill-b", SHORT);
    kill_while_holding(&w, Task::Backfill, &mut a).await;
    let c = WorkerProcess::start(&w.db, &id, "backfill-c", SHORT);
    until_done(&w, Task::Backfill, Duration::from_secs(240), &[&a, &b, &c]).await;
    drop((a, b, c));
    let backfill = w
        .store
        .partitions(w.migration, Task::Backfill)
        .await
        .unwrap();
    let scanned: i64 = backfill.iter().map(|p| p.scanned).sum();
    assert!(scanned as usize >= seeded, "{}", describe(&backfill));
    for p in &backfill {
        assert_eq!(
            p.scanned,
            p.inserted + p.already_present + p.stamped + p.dead_lettered,
            "{}",
            describe(&backfill)
        );
    }

    // A full reconciliation, its process SIGKILLed and the run resumed by another.
    reshard_ok(&w.db, &["migration", "advance", &id, "--to", "reconcile"]);
    let mut child = Command::new(env!("CARGO_BIN_EXE_reshard"))
        .env("RESHARD_DATABASE_URL", w.db.url())
        .args([
            "reconcile",
            &id,
            "--full",
            "--concurrency",
            "1",
            "--lease-ttl",
            SHORT,
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let started = Instant::now();
    let run = loop {
        assert!(
            started.elapsed() < Duration::from_secs(90),
            "the run never checkpointed"
        );
        if let Some(run) = w
            .store
            .reconciliation_runs(w.migration)
            .await
            .unwrap()
            .first()
        {
            let parts = w.store.verify_partitions(run.id).await.unwrap();
            if parts.iter().any(|p| p.scanned > 0) {
                break run.id;
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    child.kill().unwrap();
    child.wait().unwrap();
    let run_text = run.to_string();
    reshard_ok(
        &w.db,
        &[
            "reconcile",
            &id,
            "--resume",
            &run_text,
            "--lease-ttl",
            SHORT,
            "--recheck-delay",
            "100ms",
        ],
    );
    let verify = w.store.verify_partitions(run).await.unwrap();
    assert!(
        verify.iter().any(|p| p.attempts >= 2),
        "{}",
        describe(&verify)
    );
    let runs = w.store.reconciliation_runs(w.migration).await.unwrap();
    assert_eq!(runs[0].passed, Some(true), "{:?}", runs[0].summary);

    // Cleanup, its ledger counted against what the source held when it started.
    reshard_ok(&w.db, &["migration", "advance", &id, "--to", "new_reads"]);
    let moved = moved_in_source(&w).await;
    reshard_ok(&w.db, &["migration", "advance", &id, "--to", "cleanup"]);
    let mut d = WorkerProcess::start(&w.db, &id, "cleanup-d", SHORT);
    let e = WorkerProcess::start(&w.db, &id, "cleanup-e", SHORT);
    kill_while_holding(&w, Task::Cleanup, &mut d).await;
    let f = WorkerProcess::start(&w.db, &id, "cleanup-f", SHORT);
    until_done(&w, Task::Cleanup, Duration::from_secs(240), &[&d, &e, &f]).await;
    drop((d, e, f));
    let cleanup = w
        .store
        .partitions(w.migration, Task::Cleanup)
        .await
        .unwrap();
    let deleted: i64 = cleanup.iter().map(|p| p.deleted).sum();
    assert_eq!(deleted, moved, "cleanup's ledger: {}", describe(&cleanup));
    assert_eq!(moved_in_source(&w).await, 0);
    for p in &cleanup {
        assert_eq!(
            p.scanned,
            p.deleted + p.kept + p.dead_lettered,
            "{}",
            describe(&cleanup)
        );
    }
    reshard_ok(&w.db, &["migration", "advance", &id, "--to", "completed"]);
    app.check(&w.db).await;

    for (task, partitions) in [
        (Task::Backfill, &backfill),
        (Task::Verify, &verify),
        (Task::Cleanup, &cleanup),
    ] {
        let longest = longest_in_leases(partitions, lease);
        eprintln!("{task}: the longest partition took {longest:.1} lease periods");
        assert!(
            longest >= 10.0,
            "{task}: {longest:.1} lease periods: {}",
            describe(partitions)
        );
        assert!(
            partitions.iter().any(|p| p.attempts >= 2),
            "{task}: nothing was taken over: {}",
            describe(partitions)
        );
    }
}

/// The copy back of a rollback finishes partitions that need ten lease periods or more, on
/// 2 s leases, with the application writing and a holder SIGKILLed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_copy_back_finishes_partitions_of_ten_lease_periods_with_a_holder_killed() {
    let lease = Duration::from_secs(2);
    let w = World::start().await;
    let id = w.migration.to_string();
    seed(&w, 300).await;
    reshard_ok(
        &w.db,
        &[
            "migration",
            "configure",
            &id,
            "--documents-per-partition",
            "100000",
        ],
    );
    let app = App::start(&w.db, 31, 40, 900);
    tokio::time::sleep(Duration::from_secs(2)).await;
    for phase in ["dual_read", "write_switch", "backfill"] {
        reshard_ok(&w.db, &["migration", "advance", &id, "--to", phase]);
    }
    let forward = WorkerProcess::start(&w.db, &id, "forward", SHORT);
    until_done(&w, Task::Backfill, Duration::from_secs(120), &[&forward]).await;
    drop(forward);
    // The application's writes since the switch are what the copy back carries.
    tokio::time::sleep(Duration::from_secs(5)).await;
    // Slow enough that a partition outlasts ten lease periods however many documents the
    // application wrote since the switch (15/s gave 9.9 periods on a loaded machine).
    reshard_ok(
        &w.db,
        &[
            "throttle",
            "set",
            &id,
            "--max-docs-per-sec",
            "10",
            "--batch-size",
            "10",
        ],
    );
    reshard_ok(&w.db, &["migration", "rollback", &id, "--reason", "test"]);
    let mut a = WorkerProcess::start(&w.db, &id, "revert-a", SHORT);
    let b = WorkerProcess::start(&w.db, &id, "revert-b", SHORT);
    kill_while_holding(&w, Task::Revert, &mut a).await;
    let c = WorkerProcess::start(&w.db, &id, "revert-c", SHORT);
    until_done(&w, Task::Revert, Duration::from_secs(240), &[&a, &b, &c]).await;
    let revert = w.store.partitions(w.migration, Task::Revert).await.unwrap();
    reshard_ok(
        &w.db,
        &["migration", "advance", &id, "--to", "revert_switch"],
    );
    let m = w.store.migration(w.migration).await.unwrap();
    assert_eq!(m.phase().as_str(), "rolled_back");
    drop((a, b, c));
    app.check(&w.db).await;
    for p in &revert {
        assert_eq!(
            p.scanned,
            p.inserted + p.already_present + p.stamped + p.dead_lettered,
            "{}",
            describe(&revert)
        );
    }
    let longest = longest_in_leases(&revert, lease);
    eprintln!("revert: the longest partition took {longest:.1} lease periods");
    assert!(
        longest >= 10.0,
        "{longest:.1} lease periods: {}",
        describe(&revert)
    );
    assert!(
        revert.iter().any(|p| p.attempts >= 2),
        "{}",
        describe(&revert)
    );
}

/// A cleanup whose partition row another transaction holds locked for longer than the lease
/// (the lease keeper's and the checkpoint's statements wait on it) ends with an exact ledger
/// (issue 29, item 1): deletions made after the last checkpoint that went through are counted
/// by whoever works on the partition next. Before, the holder's commands ran past the lease's
/// deadline, the partition was given up as lost and taken over from its checkpoint, and the
/// deletions made meanwhile were never counted (a bench run's cleanup was short by 1,278).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cleanup_whose_row_is_locked_longer_than_its_lease_keeps_an_exact_ledger() {
    let w = World::start().await;
    let id = w.migration.to_string();
    seed(&w, 600).await;
    reshard_ok(
        &w.db,
        &[
            "migration",
            "configure",
            &id,
            "--documents-per-partition",
            "100000",
        ],
    );
    for phase in ["dual_read", "write_switch", "backfill"] {
        reshard_ok(&w.db, &["migration", "advance", &id, "--to", phase]);
    }
    w.work().await;
    reshard_ok(&w.db, &["migration", "advance", &id, "--to", "reconcile"]);
    reshard_ok(&w.db, &["reconcile", &id, "--sample", "50"]);
    reshard_ok(&w.db, &["migration", "advance", &id, "--to", "new_reads"]);
    let moved = moved_in_source(&w).await;
    reshard_ok(
        &w.db,
        &[
            "throttle",
            "set",
            &id,
            "--max-docs-per-sec",
            "60",
            "--batch-size",
            "10",
        ],
    );
    reshard_ok(&w.db, &["migration", "advance", &id, "--to", "cleanup"]);

    let mut config = reshard::worker::WorkerConfig::new("locked-out");
    config.migration = Some(w.migration);
    config.exit_when_done = true;
    config.concurrency = 1;
    config.lease_ttl = Duration::from_secs(2);
    config.idle_poll = Duration::from_millis(200);
    let (_stop, shutdown) = tokio::sync::watch::channel(false);
    let worker = reshard::worker::Worker::with_shards(w.store.clone(), w.databases(), config);
    let work = tokio::spawn(async move { worker.run(shutdown).await.unwrap() });

    // Once the cleaner has recorded something, its partition's row is locked for three
    // lease periods.
    let started = Instant::now();
    let held = loop {
        let partitions = w
            .store
            .partitions(w.migration, Task::Cleanup)
            .await
            .unwrap();
        if let Some(p) = partitions
            .iter()
            .find(|p| p.state == PartitionState::Leased && p.scanned > 0)
        {
            break p.id;
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "{}",
            describe(&partitions)
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let pool = w.db.pool().await;
    let mut tx = pool.begin().await.unwrap();
    sqlx::query("SELECT id FROM partitions WHERE id = $1 FOR UPDATE")
        .bind(held)
        .execute(&mut *tx)
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(6)).await;
    tx.commit().await.unwrap();

    let summary = tokio::time::timeout(Duration::from_secs(120), work)
        .await
        .expect("cleanup did not finish")
        .unwrap();
    let cleanup = w
        .store
        .partitions(w.migration, Task::Cleanup)
        .await
        .unwrap();
    assert!(
        cleanup.iter().all(|p| p.state == PartitionState::Done),
        "{}",
        describe(&cleanup)
    );
    let deleted: i64 = cleanup.iter().map(|p| p.deleted).sum();
    assert_eq!(
        deleted,
        moved,
        "cleanup's ledger ({summary:?}): {}",
        describe(&cleanup)
    );
    assert_eq!(moved_in_source(&w).await, 0);
    for p in &cleanup {
        assert_eq!(
            p.scanned,
            p.deleted + p.kept + p.dead_lettered,
            "{}",
            describe(&cleanup)
        );
    }
    let status: serde_json::Value = serde_json::from_str(&reshard_ok(
        &w.db,
        &["migration", "status", &id, "--output", "json"],
    ))
    .unwrap();
    assert_eq!(
        status["cleanup"]["documents_deleted"].as_i64(),
        Some(moved),
        "{status:#}"
    );
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// The sum of a metric's samples in a Prometheus text exposition.
fn metric(text: &str, name: &str) -> f64 {
    text.lines()
        .filter(|l| l.starts_with(name) && !l.starts_with('#'))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// A partition whose every command runs out of the time its lease leaves it, down to batches
/// of one document, is reported as stalled (an event, `status`, a metric) rather than retried in
/// silence, and finishes once its commands fit again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partition_that_keeps_timing_out_is_reported_as_stalled_and_then_finishes() {
    let w = World::start_with_failpoints().await;
    let id = w.migration.to_string();
    // Orders that all move: every batch has copies to write.
    let mut by_location: std::collections::BTreeMap<_, Vec<Document>> = Default::default();
    let mut seeded = 0;
    for i in 0.. {
        let (tenant, oid) = (format!("cust-{:03}", i % 50), format!("m-{i:05}"));
        let keys = (
            KeyValue::String(tenant.clone()),
            KeyValue::String(oid.clone()),
        );
        let from = w.v1.locate(&keys.0, &keys.1).unwrap().locations[0].clone();
        if w.v2.locate(&keys.0, &keys.1).unwrap().locations[0] == from {
            continue;
        }
        by_location
            .entry(from)
            .or_default()
            .push(doc! { "_id": oid, "customerId": tenant, "qty": i });
        seeded += 1;
        if seeded == 120 {
            break;
        }
    }
    for (l, docs) in by_location {
        w.shards[&l.shard]
            .collection::<Document>(&l.collection)
            .insert_many(docs)
            .await
            .unwrap();
    }
    reshard_ok(
        &w.db,
        &[
            "migration",
            "configure",
            &id,
            "--documents-per-partition",
            "100000",
        ],
    );
    for phase in ["dual_read", "write_switch", "backfill"] {
        reshard_ok(&w.db, &["migration", "advance", &id, "--to", phase]);
    }
    // Every copy the workers send is held for longer than a 2 s lease leaves a command.
    w.server
        .admin_command(doc! {
            "configureFailPoint": "failCommand",
            "mode": { "times": 10_000 },
            "data": {
                "failCommands": ["insert"],
                "blockConnection": true,
                "blockTimeMS": 2_500,
                "appName": "reshard",
            },
        })
        .await
        .unwrap();
    let port = free_port();
    let log = tempfile::NamedTempFile::new().unwrap();
    let child = Command::new(env!("CARGO_BIN_EXE_reshard"))
        .env("RESHARD_DATABASE_URL", w.db.url())
        .env("RESHARD_LOG", "info")
        .args([
            "worker",
            &id,
            "--lease-ttl",
            SHORT,
            "--concurrency",
            "1",
            "--exit-when-done",
        ])
        .args(["--metrics-addr", &format!("127.0.0.1:{port}")])
        .stdout(Stdio::null())
        .stderr(log.reopen().unwrap())
        .spawn()
        .unwrap();
    let worker = WorkerProcess {
        child,
        log,
        name: "stalled".into(),
    };
    let started = Instant::now();
    let event = loop {
        let events = w.store.events(w.migration).await.unwrap();
        if let Some(e) = events
            .iter()
            .find(|e| e.kind == reshard::store::events::EventKind::PartitionStalled)
        {
            break e.clone();
        }
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "no partition_stalled event: {}",
            tail(&worker.log(), 30)
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let reason = event.reason.clone().unwrap_or_default();
    assert!(reason.contains("did not finish within"), "{reason}");
    let status: serde_json::Value = serde_json::from_str(&reshard_ok(
        &w.db,
        &["migration", "status", &id, "--output", "json"],
    ))
    .unwrap();
    let stalled = &status["stalled_partitions"][0];
    assert_eq!(stalled["task"], "backfill", "{status:#}");
    assert!(stalled["stalls"].as_i64().unwrap() >= 3, "{status:#}");
    assert!(stalled["timeouts"].as_i64().unwrap() >= 2, "{status:#}");
    let text = reshard_ok(&w.db, &["migration", "status", &id]);
    assert!(text.contains("stalled"), "{text}");
    let scraped = reqwest_text(port).await;
    assert!(
        metric(&scraped, "reshard_partitions_stalled_total") >= 1.0,
        "{scraped}"
    );
    assert!(
        metric(&scraped, "reshard_partition_timeouts_total") >= 2.0,
        "{scraped}"
    );
    let log_text = worker.log();
    assert!(
        log_text.contains("did not finish within") && !log_text.contains("lease lost"),
        "{}",
        tail(&log_text, 30)
    );

    // The commands fit again: the partition finishes, each document copied once.
    w.server
        .admin_command(doc! { "configureFailPoint": "failCommand", "mode": "off" })
        .await
        .unwrap();
    until_done(&w, Task::Backfill, Duration::from_secs(120), &[&worker]).await;
    let backfill = w
        .store
        .partitions(w.migration, Task::Backfill)
        .await
        .unwrap();
    let scanned: i64 = backfill.iter().map(|p| p.scanned).sum();
    assert_eq!(scanned, 120, "{}", describe(&backfill));
}

/// The text a worker's `/metrics` serves.
async fn reqwest_text(port: u16) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .unwrap();
    stream
        .write_all(b"GET /metrics HTTP/1.0\r\nHost: localhost\r\n\r\n")
        .await
        .unwrap();
    let mut body = String::new();
    stream.read_to_string(&mut body).await.unwrap();
    body
}

/// `reshard worker ID --exit-when-done` in a phase with no task (issue 29, item 5) waited for
/// ever without a word. It now exits 0 with a line saying why when nothing will come before an
/// operator acts (a phase before backfill, a pause), says what it waits for when it waits
/// (without the flag, or while a playbook drives the migration), and works once the task comes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_with_nothing_to_do_says_so_and_exits_when_done_unless_a_playbook_drives() {
    let w = World::start().await;
    let id = w.migration.to_string();
    seed(&w, 60).await;
    reshard_ok(&w.db, &["migration", "advance", &id, "--to", "dual_read"]);
    let worker = |extra: &[&str]| {
        let mut c = Command::new(env!("CARGO_BIN_EXE_reshard"));
        c.env("RESHARD_DATABASE_URL", w.db.url())
            .env_remove("RESHARD_LOG")
            .args(["worker", &id, "--lease-ttl", "5s"])
            .args(extra)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        c
    };
    let exits = |mut c: Command| async move {
        let child = c.spawn().unwrap();
        let out = tokio::time::timeout(
            Duration::from_secs(30),
            tokio::task::spawn_blocking(move || child.wait_with_output().unwrap()),
        )
        .await
        .expect("the worker did not exit")
        .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };

    // Before backfill, no playbook: nothing comes until an operator advances it.
    let said = exits(worker(&["--exit-when-done"])).await;
    assert!(
        said.contains("nothing to do") && said.contains("dual_read"),
        "{said}"
    );

    // Without the flag it waits, and says once what for.
    let mut child = worker(&[]).spawn().unwrap();
    tokio::time::sleep(Duration::from_secs(4)).await;
    child.kill().unwrap();
    let out = child.wait_with_output().unwrap();
    let log = String::from_utf8_lossy(&out.stderr);
    assert_eq!(log.matches("waiting").count(), 1, "{log}");
    assert!(log.contains("is in dual_read"), "{log}");

    // A playbook drives it: its next moves need no operator, so the worker waits for them,
    // then does the backfill and exits.
    sqlx::query("INSERT INTO playbooks (name, migration_id, content) VALUES ('drill', $1, '{}')")
        .bind(w.migration)
        .execute(&w.db.pool().await)
        .await
        .unwrap();
    let lock = w
        .store
        .lock_playbook("drill", "test", 1)
        .await
        .unwrap()
        .ok()
        .unwrap();
    let child = worker(&["--exit-when-done"]).spawn().unwrap();
    tokio::time::sleep(Duration::from_secs(3)).await;
    for phase in ["write_switch", "backfill"] {
        reshard_ok(&w.db, &["migration", "advance", &id, "--to", phase]);
    }
    let out = tokio::time::timeout(
        Duration::from_secs(60),
        tokio::task::spawn_blocking(move || child.wait_with_output().unwrap()),
    )
    .await
    .expect("the worker did not do the backfill")
    .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!stdout.contains("nothing to do"), "{stdout}");
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(log.contains("playbook drill drives it"), "{log}");
    let totals = w
        .store
        .task_totals(w.migration, Task::Backfill)
        .await
        .unwrap();
    assert!(
        totals.partitions > 0 && totals.done == totals.partitions,
        "{totals:?}"
    );
    drop(lock);

    // Paused: nothing comes until an operator resumes it.
    reshard_ok(&w.db, &["migration", "advance", &id, "--to", "reconcile"]);
    reshard_ok(&w.db, &["migration", "rollback", &id, "--reason", "test"]);
    reshard_ok(&w.db, &["migration", "pause", &id, "--reason", "test"]);
    let said = exits(worker(&["--exit-when-done"])).await;
    assert!(
        said.contains("nothing to do") && said.contains("paused"),
        "{said}"
    );
}

/// A worker started before a shard is registered connects to it once a migration it serves
/// names it (issue 29, item 3): it used to log "no connection for shard" and hang the backfill.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_started_before_a_shard_exists_connects_to_it_when_a_migration_names_it() {
    let w = World::start().await;
    // A worker for every migration, started while `s5` does not exist.
    let log = tempfile::NamedTempFile::new().unwrap();
    let child = Command::new(env!("CARGO_BIN_EXE_reshard"))
        .env("RESHARD_DATABASE_URL", w.db.url())
        .env("RESHARD_LOG", "info")
        .args(["worker", "--lease-ttl", "5s", "--name", "early"])
        .stdout(Stdio::null())
        .stderr(log.reopen().unwrap())
        .spawn()
        .unwrap();
    let worker = WorkerProcess {
        child,
        log,
        name: "early".into(),
    };
    tokio::time::sleep(Duration::from_secs(2)).await;

    let s5 = format!("{}_s5", support::MongoServer::database_name());
    reshard_ok(
        &w.db,
        &[
            "shard",
            "add",
            "s5",
            "--uri",
            &w.server.uri(),
            "--database",
            &s5,
        ],
    );
    let dir = tempfile::tempdir().unwrap();
    let v1 = dir.path().join("v1.yaml");
    let v2 = dir.path().join("v2.yaml");
    std::fs::write(
        &v1,
        "tenant_key: customerId\nlayout: hashed\nvirtual_buckets: 64\nplacement:\n  \
         - vbuckets: [0, 64]\n    shard: s1\n",
    )
    .unwrap();
    std::fs::write(
        &v2,
        "tenant_key: customerId\nlayout: hashed\nvirtual_buckets: 64\nplacement:\n  \
         - vbuckets: [0, 32]\n    shard: s1\n  - vbuckets: [32, 64]\n    shard: s5\n",
    )
    .unwrap();
    for file in [&v1, &v2] {
        reshard_ok(
            &w.db,
            &[
                "version",
                "create",
                "--collection",
                "parcels",
                "--file",
                file.to_str().unwrap(),
            ],
        );
    }
    let docs: Vec<Document> = (0..200)
        .map(|i| doc! { "_id": format!("p-{i:04}"), "customerId": format!("c-{}", i % 40) })
        .collect();
    w.shards["s1"]
        .collection::<Document>("parcels")
        .insert_many(docs)
        .await
        .unwrap();
    let created = reshard_ok(
        &w.db,
        &[
            "--output",
            "json",
            "migration",
            "create",
            "--collection",
            "parcels",
            "--to",
            "2",
        ],
    );
    let created: serde_json::Value = serde_json::from_str(&created).unwrap();
    let id = created["id"]
        .as_i64()
        .or(created["migration_id"].as_i64())
        .unwrap_or_else(|| panic!("{created}"))
        .to_string();
    for phase in ["dual_read", "write_switch", "backfill"] {
        reshard_ok(&w.db, &["migration", "advance", &id, "--to", phase]);
    }
    let migration: i64 = id.parse().unwrap();
    let started = Instant::now();
    loop {
        let totals = w
            .store
            .task_totals(migration, Task::Backfill)
            .await
            .unwrap();
        if totals.partitions > 0 && totals.done == totals.partitions {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "the backfill did not finish: {totals:?}\n{}",
            tail(&worker.log(), 30)
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let moved = w
        .server
        .client()
        .await
        .database(&s5)
        .collection::<Document>("parcels")
        .count_documents(doc! {})
        .await
        .unwrap();
    assert!(moved > 0, "nothing was copied to s5");
    assert!(worker
        .log()
        .contains("connected to a shard registered since this worker started"));
}

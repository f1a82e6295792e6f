//! An order service that does not know reshard exists (`examples/orders_front.rs`: the
//! official Rust driver and a connection string, nothing else) writes and reads through a real
//! `reshard front` process while the migration goes from `planned` to `completed`, with a real
//! worker for the backfill and the cleanup and a reconciliation in between. Its own read checks
//! must find nothing wrong, and its ledger, checked through the front, must show zero lost
//! writes, zero resurrected deletes and no wrong contents; the same ledger checked by the
//! embedded router (`orders_app --check`) must agree.
//!
//! A second application runs beside it through the same front: the Python twin
//! (`examples/orders_service.py`, pymongo only, its own ids and ledger), with the same checks.
//! It needs `<repo>/.venv` (`scripts/install-secantus.sh`); without it the test fails.
//!
//! 16 s of workload by default, 40 s with `RESHARD_HEAVY_TESTS=1`.

mod support;

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use mongodb::bson::{doc, Document};
use reshard::routing::KeyValue;
use reshard::store::partitions::Task;
use support::{heavy_tests_enabled, reshard_ok, World};

fn example(name: &str) -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let dir = exe.parent().unwrap().parent().unwrap();
    dir.join("examples").join(name)
}

/// The Python of `<repo>/.venv`, with pymongo, or a failure saying how to get it.
fn venv_python() -> PathBuf {
    let python = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(".venv/bin/python");
    let has_pymongo = Command::new(&python)
        .args(["-c", "import pymongo"])
        .output()
        .is_ok_and(|o| o.status.success());
    assert!(
        has_pymongo,
        "{} with pymongo is missing: run scripts/install-secantus.sh",
        python.display()
    );
    python
}

fn orders_service() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("examples/orders_service.py")
}

/// Waits for an application and returns its JSON summary, failing on a non-zero exit.
async fn app_summary(name: &str, app: std::process::Child) -> serde_json::Value {
    let out = tokio::task::spawn_blocking(move || app.wait_with_output().unwrap())
        .await
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{name} found anomalies: {stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("{name}: {e}: {stdout}"))
}

/// Runs a ledger check (an application's `--check`) and returns its report, failing unless
/// it found nothing wrong.
fn clean_check(what: &str, command: &mut Command) -> serde_json::Value {
    let check = command.output().unwrap();
    let report = String::from_utf8_lossy(&check.stdout);
    assert!(
        check.status.success(),
        "{what} failed: {report}{}",
        String::from_utf8_lossy(&check.stderr)
    );
    let report: serde_json::Value = serde_json::from_str(&report).unwrap();
    assert_eq!(report["anomalies"], 0, "{what}: {report}");
    assert_eq!(report["check"]["lost"].as_array().unwrap().len(), 0);
    assert_eq!(report["check"]["resurrected"].as_array().unwrap().len(), 0);
    report
}

/// Kills the front when the test ends, whatever way it ends.
struct Child(std::process::Child);

impl Drop for Child {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_app_on_the_official_driver_loses_nothing_through_the_front_to_completed() {
    let seconds: u64 = if heavy_tests_enabled() { 40 } else { 16 };
    let python = venv_python();
    let world = World::start().await;
    let (db, store, shards) = (&world.db, world.store.clone(), world.shards.clone());
    let migration = world.migration;
    let id = migration.to_string();

    // Orders from before the migration, where version 1 puts them: the backfill moves them.
    for i in 0..200 {
        let tenant = if i % 3 == 0 {
            "cust-hot".to_owned()
        } else {
            format!("cust-{:04}", i % 40 + 2)
        };
        let oid = format!("old-{i:04}");
        let located = world
            .v1
            .locate(
                &KeyValue::String(tenant.clone()),
                &KeyValue::String(oid.clone()),
            )
            .unwrap();
        let l = &located.locations[0];
        shards[&l.shard]
            .collection::<Document>(&l.collection)
            .insert_one(doc! { "_id": &oid, "customerId": &tenant, "qty": i, "status": "old", "version": 1 })
            .await
            .unwrap();
    }

    // The front, as an operator starts it.
    let port = {
        let probe = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        probe.local_addr().unwrap().port()
    };
    let front_log = tempfile::NamedTempFile::new().unwrap();
    let _front = Child(
        Command::new(env!("CARGO_BIN_EXE_reshard"))
            .env("RESHARD_DATABASE_URL", db.url())
            .env("RESHARD_LOG", "warn")
            .args(["front", "--listen", &format!("127.0.0.1:{port}")])
            .args(["--database", "shop", "--name", "orders-front-test"])
            .stdout(Stdio::null())
            .stderr(front_log.reopen().unwrap())
            .spawn()
            .unwrap(),
    );
    let uri = format!("mongodb://127.0.0.1:{port}/?serverSelectionTimeoutMS=10000");
    let client = mongodb::Client::with_uri_str(&uri).await.unwrap();
    let started = Instant::now();
    while client
        .database("admin")
        .run_command(doc! {"ping": 1})
        .await
        .is_err()
    {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "the front does not answer: {}",
            std::fs::read_to_string(front_log.path()).unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // The application: its connection string is all it knows.
    let ledger = tempfile::NamedTempFile::new().unwrap();
    let ledger_path = ledger.path().to_str().unwrap().to_owned();
    let app = Command::new(example("orders_front"))
        .args(["--uri", &uri, "--duration", &format!("{seconds}s")])
        .args(["--rate", "150", "--workers", "3", "--hot-share", "0.33"])
        .args(["--seed", "11", "--ledger", &ledger_path])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // A second application through the same front: Python and pymongo, its own ids.
    let py_ledger = tempfile::NamedTempFile::new().unwrap();
    let py_ledger_path = py_ledger.path().to_str().unwrap().to_owned();
    let py_app = Command::new(&python)
        .arg(orders_service())
        .args(["--uri", &uri, "--duration", &format!("{seconds}s")])
        .args(["--rate", "60", "--workers", "2", "--hot-share", "0.33"])
        .args(["--seed", "12", "--id-prefix", "p"])
        .args(["--ledger", &py_ledger_path])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();

    let pause = Duration::from_secs(seconds / 10);
    tokio::time::sleep(pause).await;
    for phase in ["dual_read", "write_switch", "backfill"] {
        reshard_ok(db, &["migration", "advance", &id, "--to", phase]);
        tokio::time::sleep(pause).await;
    }
    reshard_ok(
        db,
        &["worker", &id, "--exit-when-done", "--lease-ttl", "5s"],
    );
    let totals = store.task_totals(migration, Task::Backfill).await.unwrap();
    assert!(
        totals.partitions > 0 && totals.done == totals.partitions && totals.inserted > 0,
        "{totals:?}"
    );
    reshard_ok(db, &["migration", "advance", &id, "--to", "reconcile"]);
    reshard_ok(
        db,
        &[
            "reconcile",
            &id,
            "--sample",
            "50",
            "--recheck-delay",
            "500ms",
        ],
    );
    reshard_ok(db, &["migration", "advance", &id, "--to", "new_reads"]);
    tokio::time::sleep(pause).await;
    reshard_ok(db, &["migration", "advance", &id, "--to", "cleanup"]);
    reshard_ok(
        db,
        &["worker", &id, "--exit-when-done", "--lease-ttl", "5s"],
    );
    let cleanup = store.task_totals(migration, Task::Cleanup).await.unwrap();
    assert!(
        cleanup.partitions > 0 && cleanup.done == cleanup.partitions && cleanup.deleted > 0,
        "{cleanup:?}"
    );
    reshard_ok(db, &["migration", "advance", &id, "--to", "completed"]);
    assert_eq!(
        store.migration(migration).await.unwrap().phase().as_str(),
        "completed"
    );

    // The application ran through every phase, and its own reads found nothing wrong.
    let summary = app_summary("orders_front", app).await;
    let stdout = summary.to_string();
    let workload = &summary["workload"];
    assert_eq!(workload["read_anomalies"], 0, "{stdout}");
    assert!(
        workload["acknowledged_writes"].as_u64().unwrap() > 300,
        "{stdout}"
    );
    assert!(workload["listings"].as_u64().unwrap() > 0, "{stdout}");
    // The write switch holds writes for a moment; a few may fail and be resynced, not more.
    assert!(
        workload["errors"].as_u64().unwrap() * 20 < workload["ops"].as_u64().unwrap(),
        "{stdout}"
    );

    // The ledger against the documents, read through the front.
    let report = clean_check(
        "ledger check through the front",
        Command::new(example("orders_front"))
            .args(["--uri", &uri, "--check"])
            .args(["--ledger", &ledger_path]),
    );
    let checked = report["check"]["checked"].as_u64().unwrap();
    assert!(checked > 100, "{report}");
    let deleted = std::fs::read_to_string(&ledger_path)
        .unwrap()
        .lines()
        .filter(|l| l.contains("\"op\":\"delete\""))
        .count();
    assert!(deleted > 10, "the workload deleted {deleted} orders");

    // The same ledger judged by the embedded router, past the front.
    let report = clean_check(
        "ledger check by the router",
        Command::new(example("orders_app"))
            .env("RESHARD_DATABASE_URL", db.url())
            .args(["--check", "--ledger", &ledger_path]),
    );
    assert_eq!(report["check"]["checked"].as_u64(), Some(checked));

    // The Python application, beside it the whole time: its reads found nothing wrong, and its
    // ledger checks clean through the front (its own --check) and by the embedded router.
    let py = app_summary("orders_service.py", py_app).await;
    let py_workload = &py["workload"];
    assert_eq!(py_workload["read_anomalies"], 0, "{py}");
    assert!(
        py_workload["acknowledged_writes"].as_u64().unwrap() > 100,
        "{py}"
    );
    assert!(py_workload["reads"].as_u64().unwrap() > 0, "{py}");
    let py_report = clean_check(
        "the Python service's ledger check through the front",
        Command::new(&python)
            .arg(orders_service())
            .args(["--uri", &uri, "--check"])
            .args(["--ledger", &py_ledger_path]),
    );
    let py_checked = py_report["check"]["checked"].as_u64().unwrap();
    assert!(py_checked > 50, "{py_report}");
    let report = clean_check(
        "the Python service's ledger check by the router",
        Command::new(example("orders_app"))
            .env("RESHARD_DATABASE_URL", db.url())
            .args(["--check", "--ledger", &py_ledger_path]),
    );
    assert_eq!(report["check"]["checked"].as_u64(), Some(py_checked));

    // The old orders are all there, through the front, in the new layout.
    let orders = client.database("shop").collection::<Document>("orders");
    let old = orders
        .count_documents(doc! {"customerId": "cust-hot", "status": "old"})
        .await
        .unwrap();
    assert!(old > 0 && old <= 67, "{old}");
}

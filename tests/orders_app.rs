//! The example order service runs against real servers while the driver moves the migration
//! through its phases from `planned` to `new_reads`, with a real backfill worker and a
//! reconciliation in between; its ledger check must report zero anomalies.

mod support;

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use mongodb::bson::{doc, Document};
use reshard::routing::KeyValue;
use reshard::store::partitions::Task;
use support::{heavy_tests_enabled, reshard, World};

fn example_binary() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let dir = exe.parent().unwrap().parent().unwrap();
    dir.join("examples").join("orders_app")
}

#[tokio::test]
async fn the_example_app_loses_nothing_through_the_phases_and_a_backfill() {
    let seconds: u64 = if heavy_tests_enabled() { 30 } else { 16 };
    let world = World::start().await;
    let (db, store, shards) = (&world.db, world.store.clone(), world.shards.clone());
    let v1 = world.v1.clone();
    let migration = world.migration;
    let id = migration.to_string();

    // Orders that exist before the migration, where version 1 puts them.
    let mut seeded = Vec::new();
    for i in 0..300 {
        let tenant = if i % 3 == 0 {
            "cust-hot".to_owned()
        } else {
            format!("cust-{:04}", i % 40 + 2)
        };
        let oid = format!("old-{i:04}");
        let located = v1
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
        seeded.push((tenant, oid, i));
    }

    let ledger = tempfile::NamedTempFile::new().unwrap();
    let app = Command::new(example_binary())
        .env("RESHARD_DATABASE_URL", db.url())
        .args([
            "--duration",
            &format!("{seconds}s"),
            "--rate",
            "150",
            "--workers",
            "3",
        ])
        .args(["--seed", "7", "--ledger", ledger.path().to_str().unwrap()])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();

    let pause = Duration::from_secs(seconds / 8);
    tokio::time::sleep(pause).await;
    for phase in ["dual_read", "write_switch", "backfill"] {
        let out = reshard(db, &["migration", "advance", &id, "--to", phase]);
        assert!(
            out.status.success(),
            "advance to {phase}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        tokio::time::sleep(pause).await;
    }
    // The backfill: a real worker plans, copies and checkpoints while the app keeps writing.
    let worker = reshard(
        db,
        &["worker", &id, "--exit-when-done", "--lease-ttl", "5s"],
    );
    assert!(
        worker.status.success(),
        "worker: {}",
        String::from_utf8_lossy(&worker.stderr)
    );
    let totals = store.task_totals(migration, Task::Backfill).await.unwrap();
    assert!(
        totals.partitions > 0 && totals.done == totals.partitions,
        "{totals:?}"
    );
    assert!(totals.inserted > 0, "{totals:?}");
    assert_eq!(
        totals.scanned,
        totals.inserted + totals.already_present + totals.stamped + totals.dead_lettered
    );
    let out = reshard(db, &["migration", "advance", &id, "--to", "reconcile"]);
    assert!(
        out.status.success(),
        "the backfill gate must open: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Reconciliation while the application keeps writing: what it changes in the target is
    // superseded, not a defect; then reads move to the target alone.
    let out = reshard(
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
    assert!(
        out.status.success(),
        "reconcile: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let out = reshard(db, &["migration", "advance", &id, "--to", "new_reads"]);
    assert!(
        out.status.success(),
        "new_reads: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        store.migration(migration).await.unwrap().phase().as_str(),
        "new_reads"
    );

    let out = tokio::task::spawn_blocking(move || app.wait_with_output().unwrap())
        .await
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "the app found anomalies: {stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let summary: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(summary["workload"]["read_anomalies"], 0, "{stdout}");
    assert!(
        summary["workload"]["acknowledged_writes"].as_u64().unwrap() > 100,
        "{stdout}"
    );

    let check = Command::new(example_binary())
        .env("RESHARD_DATABASE_URL", db.url())
        .args(["--check", "--ledger", ledger.path().to_str().unwrap()])
        .output()
        .unwrap();
    let report = String::from_utf8_lossy(&check.stdout);
    assert!(check.status.success(), "ledger check failed: {report}");
    let report: serde_json::Value = serde_json::from_str(&report).unwrap();
    assert_eq!(report["anomalies"], 0);
    assert!(report["check"]["checked"].as_u64().unwrap() > 50);

    // The old orders the application never touched are all still readable, unchanged.
    let router = reshard::router::Router::with_shards(
        store.clone(),
        "orders",
        reshard::router::RouterConfig::named("checker"),
        shards.clone(),
    )
    .await
    .unwrap();
    for (tenant, oid, qty) in &seeded {
        let found = router.get(tenant.as_str(), oid.as_str()).await.unwrap();
        assert_eq!(
            found.and_then(|d| d.get_i32("qty").ok()),
            Some(*qty),
            "{oid}"
        );
    }
    router.shutdown().await;
}

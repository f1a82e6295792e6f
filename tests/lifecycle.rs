//! A migration's two endings on real servers: forward through cleanup to `completed` (with the
//! tombstone purge), and a rollback in the middle of the backfill while the example
//! application keeps writing. Also: cleanup refuses to delete a document its target lacks.

mod support;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use futures::TryStreamExt;
use mongodb::bson::{doc, Document};
use reshard::routing::{KeyValue, Location, RoutingVersion};
use reshard::store::partitions::{PartitionState, Task};
use support::{heavy_tests_enabled, reshard, reshard_ok, World};

fn location(v: &RoutingVersion, tenant: &str, id: &str) -> (Location, u32) {
    let l = v
        .locate(
            &KeyValue::String(tenant.into()),
            &KeyValue::String(id.into()),
        )
        .unwrap();
    (l.locations[0].clone(), l.sub_bucket)
}

async fn seed(w: &World, n: usize) -> Vec<(String, String)> {
    let mut seeded = Vec::new();
    for i in 0..n {
        let tenant = if i % 3 == 0 {
            "cust-hot".to_owned()
        } else {
            format!("cust-{:04}", i % 40 + 2)
        };
        let id = format!("old-{i:04}");
        let (l, _) = location(&w.v1, &tenant, &id);
        w.shards[&l.shard]
            .collection::<Document>(&l.collection)
            .insert_one(doc! { "_id": &id, "customerId": &tenant, "qty": i as i32 })
            .await
            .unwrap();
        seeded.push((tenant, id));
    }
    seeded
}

async fn find(w: &World, l: &Location, id: &str) -> Option<Document> {
    w.shards[&l.shard]
        .collection::<Document>(&l.collection)
        .find_one(doc! { "_id": id })
        .await
        .unwrap()
}

async fn all(w: &World, l: &Location, filter: Document) -> Vec<Document> {
    w.shards[&l.shard]
        .collection::<Document>(&l.collection)
        .find(filter)
        .await
        .unwrap()
        .try_collect()
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forward_through_cleanup_deletes_exactly_what_moved_and_purges_tombstones() {
    let w = World::start().await;
    let id = w.migration.to_string();
    let seeded = seed(&w, 240).await;
    let router = reshard::router::Router::with_shards(
        w.store.clone(),
        "orders",
        reshard::router::RouterConfig::named("app"),
        w.shards.clone(),
    )
    .await
    .unwrap();
    for phase in ["dual_read", "write_switch", "backfill"] {
        reshard_ok(&w.db, &["migration", "advance", &id, "--to", phase]);
    }
    // The application deletes two old orders while the backfill has not copied them: their
    // tombstones must keep cleanup from resurrecting or losing anything.
    let deleted: Vec<&(String, String)> = seeded.iter().take(2).collect();
    for (tenant, oid) in &deleted {
        assert!(router.delete(tenant.as_str(), oid.as_str()).await.unwrap());
    }
    w.work().await;
    reshard_ok(&w.db, &["migration", "advance", &id, "--to", "reconcile"]);
    reshard_ok(&w.db, &["reconcile", &id, "--sample", "50"]);
    reshard_ok(&w.db, &["migration", "advance", &id, "--to", "new_reads"]);
    reshard_ok(&w.db, &["migration", "advance", &id, "--to", "cleanup"]);
    w.work().await;
    let totals = w
        .store
        .task_totals(w.migration, Task::Cleanup)
        .await
        .unwrap();
    assert!(
        totals.partitions > 0 && totals.done == totals.partitions,
        "{totals:?}"
    );
    assert_eq!(
        totals.scanned,
        totals.deleted + totals.kept + totals.dead_lettered,
        "{totals:?}"
    );
    let status: serde_json::Value = serde_json::from_str(&reshard_ok(
        &w.db,
        &["migration", "status", &id, "--output", "json"],
    ))
    .unwrap();
    assert_eq!(
        status["cleanup"]["documents_deleted"].as_i64(),
        Some(totals.deleted)
    );
    assert_eq!(
        status["cleanup"]["partitions_done"].as_i64(),
        Some(totals.partitions)
    );
    reshard_ok(&w.db, &["migration", "advance", &id, "--to", "completed"]);

    let mut moved = 0;
    for (tenant, oid) in &seeded {
        let (from, _) = location(&w.v1, tenant, oid);
        let (to, bucket) = location(&w.v2, tenant, oid);
        let gone = deleted.iter().any(|(_, d)| d == oid);
        let at_source = find(&w, &from, oid).await;
        let at_target = find(&w, &to, oid).await;
        if gone {
            assert!(
                at_source.is_none() && at_target.is_none(),
                "{oid} came back"
            );
        } else if from == to {
            let d = at_source.unwrap_or_else(|| panic!("{oid} never moved and must stay"));
            assert_eq!(d.get_i32("bucket").unwrap(), bucket as i32);
        } else {
            moved += 1;
            assert!(
                at_source.is_none(),
                "{oid} moved but is still in the source"
            );
            assert!(at_target.is_some(), "{oid} is missing from {to}");
        }
    }
    assert!(moved > 0);
    assert_eq!(totals.deleted, moved + 2 - deleted_that_stay(&w, &deleted));
    for t in w.v2.locations() {
        assert!(
            all(&w, &t, doc! { "_reshard.deleted": true })
                .await
                .is_empty(),
            "tombstones left in {t}"
        );
    }
    let history = reshard_ok(&w.db, &["migration", "history", &id, "--output", "json"]);
    for kind in ["cleanup_planned", "tombstones_purged"] {
        assert!(history.contains(kind), "no {kind} event: {history}");
    }
    for (tenant, oid) in seeded.iter().skip(2).take(20) {
        assert!(router
            .get(tenant.as_str(), oid.as_str())
            .await
            .unwrap()
            .is_some());
    }
    router.shutdown().await;
}

/// Of the deleted documents, those that never move had no source copy to delete apart from
/// the tombstone the router wrote in place.
fn deleted_that_stay(w: &World, deleted: &[&(String, String)]) -> i64 {
    deleted
        .iter()
        .filter(|(t, o)| location(&w.v1, t, o).0 == location(&w.v2, t, o).0)
        .count() as i64
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cleanup_stops_and_fails_the_migration_when_a_target_copy_is_missing() {
    let w = World::start().await;
    let id = w.migration.to_string();
    let seeded = seed(&w, 120).await;
    for phase in ["dual_read", "write_switch", "backfill"] {
        reshard_ok(&w.db, &["migration", "advance", &id, "--to", phase]);
    }
    w.work().await;
    reshard_ok(&w.db, &["migration", "advance", &id, "--to", "reconcile"]);
    reshard_ok(&w.db, &["reconcile", &id, "--full"]);
    reshard_ok(&w.db, &["migration", "advance", &id, "--to", "new_reads"]);
    // After the passing run, someone deletes a copy from the target by hand.
    let (tenant, lost) = seeded
        .iter()
        .find(|(t, o)| location(&w.v1, t, o).0 != location(&w.v2, t, o).0)
        .unwrap();
    let (to, _) = location(&w.v2, tenant, lost);
    w.shards[&to.shard]
        .collection::<Document>(&to.collection)
        .delete_one(doc! { "_id": lost })
        .await
        .unwrap();
    // The watch saw a delete no router made: cleanup waits for an operator's decision.
    let refused = reshard(&w.db, &["migration", "advance", &id, "--to", "cleanup"]);
    assert!(!refused.status.success());
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(stderr.contains("bypasses_resolved"), "{stderr}");
    // An operator ignores it (wrongly): the cleaner's own check is the last line of defence.
    let listed: serde_json::Value = serde_json::from_str(&reshard_ok(
        &w.db,
        &["--output", "json", "bypass", "list", &id],
    ))
    .unwrap();
    assert_eq!(listed[0]["_id"], lost.as_str(), "{listed:#}");
    assert_eq!(listed[0]["operation"], "delete", "{listed:#}");
    reshard_ok(
        &w.db,
        &[
            "bypass", "resolve", &id, "--id", lost, "--action", "ignore", "--reason", "test",
        ],
    );
    reshard_ok(&w.db, &["migration", "advance", &id, "--to", "cleanup"]);
    w.work().await;

    let m = w.store.migration(w.migration).await.unwrap();
    let reason = m.failure_reason.expect("cleanup must fail the migration");
    assert!(reason.contains(lost.as_str()), "{reason}");
    let (from, _) = location(&w.v1, tenant, lost);
    assert!(
        find(&w, &from, lost).await.is_some(),
        "the only copy was deleted"
    );
    let out = reshard(&w.db, &["migration", "advance", &id, "--to", "completed"]);
    assert!(!out.status.success(), "a failed cleanup cannot complete");
}

fn example_binary() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let dir = exe.parent().unwrap().parent().unwrap();
    dir.join("examples").join("orders_app")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rollback_mid_backfill_keeps_every_acknowledged_write_in_the_source() {
    let seconds: u64 = if heavy_tests_enabled() { 40 } else { 24 };
    let w = World::start().await;
    let id = w.migration.to_string();
    seed(&w, 300).await;
    // Slow enough that the rollback lands in the middle of the backfill.
    reshard_ok(
        &w.db,
        &[
            "throttle",
            "set",
            &id,
            "--max-docs-per-sec",
            "30",
            "--batch-size",
            "10",
        ],
    );

    let ledger = tempfile::NamedTempFile::new().unwrap();
    let app = Command::new(example_binary())
        .env("RESHARD_DATABASE_URL", w.db.url())
        .args([
            "--duration",
            &format!("{seconds}s"),
            "--rate",
            "120",
            "--workers",
            "3",
        ])
        .args(["--seed", "11", "--ledger", ledger.path().to_str().unwrap()])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pause = Duration::from_secs(2);
    tokio::time::sleep(pause).await;
    for phase in ["dual_read", "write_switch", "backfill"] {
        reshard_ok(&w.db, &["migration", "advance", &id, "--to", phase]);
        tokio::time::sleep(pause).await;
    }
    let worker = Command::new(env!("CARGO_BIN_EXE_reshard"))
        .env("RESHARD_DATABASE_URL", w.db.url())
        .args(["worker", &id, "--exit-when-done", "--lease-ttl", "5s"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let before = w
        .store
        .task_totals(w.migration, Task::Backfill)
        .await
        .unwrap();
    assert!(
        before.partitions > 0 && before.done < before.partitions && before.scanned > 0,
        "the rollback must land mid-backfill: {before:?}"
    );

    let rollback = reshard(&w.db, &["migration", "rollback", &id, "--reason", "test"]);
    assert!(rollback.status.success());
    // The hint names the commands that finish the rollback; they are what this test runs.
    let hint = String::from_utf8_lossy(&rollback.stderr).into_owned();
    let advances: Vec<Vec<String>> = hint
        .split('`')
        .skip(1)
        .step_by(2)
        .filter(|c| c.starts_with("reshard migration advance"))
        .map(|c| c.split_whitespace().skip(1).map(str::to_owned).collect())
        .collect();
    assert_eq!(
        advances.iter().map(|a| a.join(" ")).collect::<Vec<_>>(),
        [format!("migration advance {id} --to revert_switch")],
        "{hint}"
    );
    reshard_ok(
        &w.db,
        &[
            "throttle",
            "set",
            &id,
            "--max-docs-per-sec",
            "100000",
            "--batch-size",
            "500",
        ],
    );
    let out = tokio::task::spawn_blocking(move || worker.wait_with_output().unwrap())
        .await
        .unwrap();
    assert!(
        out.status.success(),
        "worker: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let revert = w
        .store
        .task_totals(w.migration, Task::Revert)
        .await
        .unwrap();
    assert!(
        revert.partitions > 0 && revert.done == revert.partitions,
        "{revert:?}"
    );
    for args in &advances {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        reshard_ok(&w.db, &args);
    }
    let m = w.store.migration(w.migration).await.unwrap();
    assert_eq!(m.phase().as_str(), "rolled_back");

    let out = tokio::task::spawn_blocking(move || app.wait_with_output().unwrap())
        .await
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "the app found anomalies: {stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let check = Command::new(example_binary())
        .env("RESHARD_DATABASE_URL", w.db.url())
        .args(["--check", "--ledger", ledger.path().to_str().unwrap()])
        .output()
        .unwrap();
    let report = String::from_utf8_lossy(&check.stdout);
    assert!(check.status.success(), "ledger check failed: {report}");
    let report: serde_json::Value = serde_json::from_str(&report).unwrap();
    assert_eq!(report["anomalies"], 0, "{report}");
    assert!(
        report["check"]["checked"].as_u64().unwrap() > 50,
        "{report}"
    );

    // The target is gone: its own collection dropped, nothing of it left in shared ones.
    let only_target = Location::new("s4", "orders_v2");
    let names = w.shards["s4"].list_collection_names().await.unwrap();
    assert!(!names.contains(&only_target.collection), "{names:?}");
    for l in w.v1.locations() {
        for d in all(&w, &l, doc! {}).await {
            assert!(
                !reshard::envelope::is_tombstone(&d),
                "tombstone left in {l}: {d}"
            );
            let tenant = KeyValue::from_bson(d.get("customerId").unwrap()).unwrap();
            let oid = KeyValue::from_bson(d.get("_id").unwrap()).unwrap();
            assert!(
                w.v1.locate(&tenant, &oid).unwrap().locations.contains(&l),
                "{d} does not belong in {l}"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_full_reconciliation_is_resumed_from_its_checkpoints() {
    let w = World::start().await;
    let id = w.migration.to_string();
    let seeded = seed(&w, 300).await;
    for phase in ["dual_read", "write_switch", "backfill"] {
        reshard_ok(&w.db, &["migration", "advance", &id, "--to", phase]);
    }
    w.work().await;
    reshard_ok(&w.db, &["migration", "advance", &id, "--to", "reconcile"]);
    // Slow, so that the kill lands in the middle of the run.
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
    let mut child = Command::new(env!("CARGO_BIN_EXE_reshard"))
        .env("RESHARD_DATABASE_URL", w.db.url())
        .args([
            "reconcile",
            &id,
            "--full",
            "--concurrency",
            "1",
            "--lease-ttl",
            "2s",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let run = loop {
        assert!(
            std::time::Instant::now() < deadline,
            "the run never checkpointed"
        );
        if let Ok(run) = w.store.reconciliation_runs(w.migration).await {
            if let Some(run) = run.first() {
                let parts = w.store.verify_partitions(run.id).await.unwrap();
                if parts.iter().any(|p| p.scanned > 0) {
                    break run.id;
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    child.kill().unwrap();
    child.wait().unwrap();
    let parts = w.store.verify_partitions(run).await.unwrap();
    assert!(
        parts.iter().any(|p| p.state != PartitionState::Done),
        "killed too late"
    );
    let done_before: i64 = parts.iter().map(|p| p.scanned).sum();
    assert!(done_before > 0);

    // A second process takes over once the lease expires, from the checkpoints.
    reshard_ok(
        &w.db,
        &[
            "throttle",
            "set",
            &id,
            "--max-docs-per-sec",
            "100000",
            "--batch-size",
            "500",
        ],
    );
    reshard_ok(
        &w.db,
        &[
            "reconcile",
            &id,
            "--resume",
            &run.to_string(),
            "--recheck-delay",
            "100ms",
        ],
    );
    let parts = w.store.verify_partitions(run).await.unwrap();
    assert!(
        parts.iter().all(|p| p.state == PartitionState::Done),
        "{parts:?}"
    );
    assert!(
        parts.iter().any(|p| p.attempts >= 2),
        "nothing was taken over: {parts:?}"
    );
    // Every source document was checked exactly once: the ones of the killed batch that was
    // not checkpointed are read again, the checkpointed ones are not.
    let checked: i64 = parts.iter().map(|p| p.scanned).sum();
    let outcomes: u64 = parts
        .iter()
        .map(|p| {
            let o: BTreeMap<String, u64> = serde_json::from_value(p.outcomes.clone()).unwrap();
            // The source documents' outcomes (not the placement of what the targets hold,
            // nor the strata, nor the counts of what was read).
            o.iter()
                .filter(|(k, _)| {
                    !matches!(
                        k.as_str(),
                        "ignored" | "placed" | reshard::reconcile::SOURCE_READ
                    ) && !k.starts_with("placement:")
                        && !k.starts_with("full:")
                        && !k.starts_with(reshard::reconcile::READ_PREFIX)
                })
                .map(|(_, n)| n)
                .sum::<u64>()
        })
        .sum();
    assert_eq!(checked as u64, outcomes);
    assert_eq!(checked as usize, seeded.len(), "{parts:?}");
    let runs = w.store.reconciliation_runs(w.migration).await.unwrap();
    assert_eq!(runs.len(), 1);
    assert_eq!(runs[0].passed, Some(true), "{:?}", runs[0].summary);
    reshard_ok(&w.db, &["migration", "advance", &id, "--to", "new_reads"]);
}

//! Writes that bypass the router, on real servers: a plain driver client writing to the
//! source after the write switch is found by the change-stream watch, blocks the gate to
//! `new_reads`, and `reshard bypass resolve --action recopy` carries each write into the
//! target by the protocol's rules. A plain write before the switch is not a bypass; a watch
//! that cannot resume is a gap, never silence.

mod support;

use mongodb::bson::{doc, Document};
use reshard::routing::{KeyValue, Location, RoutingVersion};
use support::{reshard, reshard_ok, StateDb, World};

fn json(db: &StateDb, args: &[&str]) -> serde_json::Value {
    let mut all = args.to_vec();
    all.extend(["--output", "json"]);
    serde_json::from_str(&reshard_ok(db, &all)).unwrap()
}

fn location(v: &RoutingVersion, tenant: &str, id: &str) -> Location {
    v.locate(
        &KeyValue::String(tenant.into()),
        &KeyValue::String(id.into()),
    )
    .unwrap()
    .locations[0]
        .clone()
}

fn coll(w: &World, l: &Location) -> mongodb::Collection<Document> {
    w.shards[&l.shard].collection::<Document>(&l.collection)
}

/// Seeds `n` orders in the source layout; returns (tenant, id) pairs.
async fn seed(w: &World, n: usize) -> Vec<(String, String)> {
    let mut seeded = Vec::new();
    for i in 0..n {
        let tenant = format!("cust-{:03}", i % 20);
        let id = format!("old-{i:04}");
        coll(w, &location(&w.v1, &tenant, &id))
            .insert_one(doc! { "_id": &id, "customerId": &tenant, "qty": i as i32 })
            .await
            .unwrap();
        seeded.push((tenant, id));
    }
    seeded
}

/// A seeded order whose target location differs from its source location.
fn moving<'a>(w: &World, seeded: &'a [(String, String)], skip: usize) -> &'a (String, String) {
    seeded
        .iter()
        .filter(|(t, id)| location(&w.v1, t, id) != location(&w.v2, t, id))
        .nth(skip)
        .expect("a moving order")
}

fn open_bypasses(db: &StateDb, id: &str) -> Vec<serde_json::Value> {
    json(db, &["bypass", "list", id])
        .as_array()
        .unwrap()
        .clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plain_write_after_the_switch_is_found_blocks_new_reads_and_recopy_carries_it() {
    let w = World::start().await;
    let id = w.migration.to_string();
    let seeded = seed(&w, 80).await;
    let router = w.router(reshard::router::RouterConfig::named("app")).await;
    reshard_ok(&w.db, &["migration", "advance", &id, "--to", "dual_read"]);

    // Before the switch the source is authoritative and routers write it plainly: a plain
    // write there is no bypass (the backfill carries whatever the source holds).
    let (early_t, early_id) = moving(&w, &seeded, 0);
    coll(&w, &location(&w.v1, early_t, early_id))
        .update_one(doc! { "_id": early_id }, doc! { "$set": { "qty": 5000 } })
        .await
        .unwrap();
    assert!(open_bypasses(&w.db, &id).is_empty());

    reshard_ok(
        &w.db,
        &["migration", "advance", &id, "--to", "write_switch"],
    );
    reshard_ok(&w.db, &["migration", "advance", &id, "--to", "backfill"]);
    w.work().await;

    // After the copy, a plain client (a cron job that never heard of reshard) writes to the
    // old layout: an update and a delete of moved orders, and a new order.
    let (ut, uid) = moving(&w, &seeded, 1);
    let (dt, did) = moving(&w, &seeded, 2);
    coll(&w, &location(&w.v1, ut, uid))
        .update_one(doc! { "_id": uid }, doc! { "$set": { "qty": 999 } })
        .await
        .unwrap();
    coll(&w, &location(&w.v1, dt, did))
        .delete_one(doc! { "_id": did })
        .await
        .unwrap();
    let (nt, nid) = ("cust-new", "cron-0001");
    coll(&w, &location(&w.v1, nt, nid))
        .insert_one(doc! { "_id": nid, "customerId": nt, "qty": 7 })
        .await
        .unwrap();
    // And a plain write into a target-only location.
    let s4 = Location::new("s4", "orders_v2");
    coll(&w, &s4)
        .insert_one(doc! { "_id": "stray-1", "customerId": "cust-000", "qty": 1 })
        .await
        .unwrap();
    // The application's own writes through the router are not bypasses.
    router
        .insert(doc! { "_id": "app-1", "customerId": "cust-001", "qty": 3 })
        .await
        .unwrap();
    router
        .update("cust-001", "app-1", doc! { "$set": { "qty": 4 } })
        .await
        .unwrap();

    let found = open_bypasses(&w.db, &id);
    let mut seen: Vec<(String, String, String)> = found
        .iter()
        .map(|b| {
            (
                format!(
                    "{}/{}",
                    b["shard"].as_str().unwrap(),
                    b["collection"].as_str().unwrap()
                ),
                b["_id"].as_str().unwrap().to_owned(),
                b["operation"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    seen.sort();
    let mut expected = vec![
        (
            location(&w.v1, ut, uid).to_string(),
            uid.clone(),
            "update".to_owned(),
        ),
        (
            location(&w.v1, dt, did).to_string(),
            did.clone(),
            "delete".to_owned(),
        ),
        (
            location(&w.v1, nt, nid).to_string(),
            nid.to_owned(),
            "insert".to_owned(),
        ),
        (s4.to_string(), "stray-1".to_owned(), "insert".to_owned()),
    ];
    expected.sort();
    assert_eq!(seen, expected, "{found:#?}");
    assert!(found.iter().all(|b| b["phase"] == "backfill"));

    // Status counts them; the gate to new_reads refuses while they are open.
    let status = json(&w.db, &["migration", "status", &id]);
    assert_eq!(status["bypasses"]["open"], 4, "{status:#}");
    reshard_ok(&w.db, &["migration", "advance", &id, "--to", "reconcile"]);
    let refused = reshard(&w.db, &["migration", "advance", &id, "--to", "new_reads"]);
    assert!(!refused.status.success());
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(stderr.contains("bypasses_resolved"), "{stderr}");
    assert!(
        stderr.contains("4 write(s) bypassed the router"),
        "{stderr}"
    );

    // A reason is required, and the gap-only action is refused for a document.
    let no_reason = reshard(
        &w.db,
        &[
            "bypass", "resolve", &id, "--id", uid, "--action", "recopy", "--reason", " ",
        ],
    );
    assert_eq!(no_reason.status.code(), Some(2));

    for x in [uid.as_str(), did.as_str(), nid, "stray-1"] {
        reshard_ok(
            &w.db,
            &[
                "bypass", "resolve", &id, "--id", x, "--action", "recopy", "--reason", "cron job",
            ],
        );
    }
    let left = open_bypasses(&w.db, &id);
    assert!(left.is_empty(), "{left:#?}");

    // Each write is now in the target, as the router reads it.
    let updated = router
        .get(ut.as_str(), uid.as_str())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(updated.get_i32("qty").unwrap(), 999);
    assert!(router
        .get(dt.as_str(), did.as_str())
        .await
        .unwrap()
        .is_none());
    let inserted = router.get(nt, nid).await.unwrap().unwrap();
    assert_eq!(inserted.get_i32("qty").unwrap(), 7);
    let stray = router.get("cust-000", "stray-1").await.unwrap().unwrap();
    assert_eq!(stray.get_i32("qty").unwrap(), 1);
    // The early write (before the switch) was carried by the backfill.
    let early = router
        .get(early_t.as_str(), early_id.as_str())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(early.get_i32("qty").unwrap(), 5000);
    // The target's copies carry reshard's envelope: no plain document is left in s4.
    let plain = coll(&w, &s4)
        .count_documents(doc! { "_reshard": { "$exists": false } })
        .await
        .unwrap();
    assert_eq!(plain, 0);

    reshard_ok(&w.db, &["reconcile", &id, "--full"]);
    reshard_ok(&w.db, &["migration", "advance", &id, "--to", "new_reads"]);
    let status = json(&w.db, &["migration", "status", &id]);
    assert_eq!(status["bypasses"]["open"], 0);
    // The four, and the removal of the plain copy from s4 that recopying the stray made
    // (recorded by the watch, resolved with it).
    assert_eq!(status["bypasses"]["total"], 5);
    let events = json(&w.db, &["migration", "history", &id]);
    let kinds: Vec<&str> = events
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|e| e["kind"].as_str())
        .collect();
    assert!(kinds.contains(&"bypass_found"), "{kinds:?}");
    assert_eq!(kinds.iter().filter(|k| **k == "bypass_resolved").count(), 5);
    router.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_that_cannot_resume_records_a_gap_that_only_an_operator_can_close() {
    let w = World::start().await;
    let id = w.migration.to_string();
    seed(&w, 10).await;
    for phase in ["dual_read", "write_switch"] {
        reshard_ok(&w.db, &["migration", "advance", &id, "--to", phase]);
    }
    // The stored position of the target-only location is no longer a valid token (as when
    // the server's history no longer reaches back to it).
    let bogus = mongodb::bson::to_vec(&doc! { "t": { "_data": "00" } }).unwrap();
    let pool = w.db.pool().await;
    let changed = sqlx::query(
        "UPDATE bypass_watches SET resume_token = $2
         WHERE migration_id = $1 AND shard = 's4'",
    )
    .bind(w.migration)
    .bind(bogus)
    .execute(&pool)
    .await
    .unwrap()
    .rows_affected();
    assert_eq!(changed, 1);

    let found = open_bypasses(&w.db, &id);
    assert_eq!(found.len(), 1, "{found:#?}");
    assert_eq!(found[0]["operation"], "gap");
    assert_eq!(found[0]["shard"], "s4");
    let gap = found[0]["id"].as_i64().unwrap().to_string();

    // The watch goes on from now: a later plain write there is found.
    coll(&w, &Location::new("s4", "orders_v2"))
        .insert_one(doc! { "_id": "after-gap", "customerId": "c", "qty": 1 })
        .await
        .unwrap();
    assert_eq!(open_bypasses(&w.db, &id).len(), 2);

    // A gap names no document: recopy is refused with what to do instead.
    let refused = reshard(
        &w.db,
        &[
            "bypass", "resolve", &id, "--bypass", &gap, "--action", "recopy", "--reason", "x",
        ],
    );
    assert_eq!(refused.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(stderr.contains("--action ignore"), "{stderr}");
    reshard_ok(
        &w.db,
        &[
            "bypass",
            "resolve",
            &id,
            "--bypass",
            &gap,
            "--action",
            "ignore",
            "--reason",
            "checked with a full reconciliation",
        ],
    );
    let left = open_bypasses(&w.db, &id);
    assert_eq!(left.len(), 1);
    assert_eq!(left[0]["_id"], "after-gap");
}

/// The cleaner's deletes are never bypasses, whenever the watch reads them: a reader whose
/// view of the migration or of the claimed ranges is older than a claim checks the store
/// again before it records a delete. Here a catch-up takes its view before the cleanup is
/// even planned, waits on a watch another reader holds while the cleaner claims and deletes,
/// then reads the deletes. (A worker's watch reads the migration once per round; a range
/// claimed while it read was missed, and its deletes closed `bypasses_resolved` on the way to
/// `completed`: seen once in tests/secrets.rs.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cleaners_deletes_are_ours_even_read_with_a_view_older_than_its_claim() {
    let w = World::start().await;
    let id = w.migration.to_string();
    let seeded = seed(&w, 80).await;
    for phase in ["dual_read", "write_switch", "backfill"] {
        reshard_ok(&w.db, &["migration", "advance", &id, "--to", phase]);
    }
    w.work().await;
    reshard_ok(&w.db, &["migration", "advance", &id, "--to", "reconcile"]);
    reshard_ok(&w.db, &["reconcile", &id, "--full"]);
    reshard_ok(&w.db, &["migration", "advance", &id, "--to", "new_reads"]);
    let moved = seeded
        .iter()
        .filter(|(t, i)| location(&w.v1, t, i) != location(&w.v2, t, i))
        .count();
    assert!(moved > 20, "{moved} of 80 orders move");

    // A reader that read the migration before the cleanup was planned, and starts its
    // catch-up before anything is claimed: it waits on the first watch, which another reader
    // holds.
    let before = w.store.migration(w.migration).await.unwrap();
    assert!(before.cleanup_planned_at.is_none());
    reshard_ok(&w.db, &["migration", "advance", &id, "--to", "cleanup"]);
    let watches = w.store.watches(w.migration).await.unwrap();
    let held = w
        .store
        .lock_watch(w.migration, &watches[0].location(), true)
        .await
        .unwrap()
        .unwrap();
    let shards = reshard::shards::Shards::new(w.databases());
    let reader = {
        let (store, shards, before) = (w.store.clone(), shards.clone(), before.clone());
        let (v1, v2) = (w.v1.clone(), w.v2.clone());
        tokio::spawn(async move {
            reshard::watch::catch_up(&store, &shards, &before, (&v1, &v2), true, None, "test")
                .await
                .unwrap()
        })
    };
    let pool = w.db.pool().await;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        let waiting: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM pg_stat_activity
             WHERE datname = current_database() AND wait_event_type = 'Lock'",
        )
        .fetch_one(&pool)
        .await
        .unwrap();
        if waiting > 0 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the reader never waited"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }

    // Meanwhile the cleaner claims its ranges and deletes.
    w.work().await;
    drop(held);
    let first = reader.await.unwrap();
    assert!(first.events > 0, "the reader read the deletes: {first:?}");
    assert_eq!(first.bypasses, 0, "{first:?}");

    // Read to the end: not one of the cleaner's deletes is a bypass.
    let rest = reshard::watch::catch_up(
        &w.store,
        &shards,
        &before,
        (&w.v1, &w.v2),
        true,
        None,
        "test",
    )
    .await
    .unwrap();
    assert!(
        (first.events + rest.events) as usize >= moved,
        "the watch read the cleaner's deletes: {first:?} {rest:?}"
    );
    assert_eq!(rest.bypasses, 0, "{rest:?}");
    assert!(open_bypasses(&w.db, &id).is_empty());
    reshard_ok(&w.db, &["migration", "advance", &id, "--to", "completed"]);
}

//! The router on real servers: the races of the project's design document forced step by step, leases, and tenant
//! listings under concurrent writes in every phase.

mod support;

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures::FutureExt;
use mongodb::bson::{doc, Bson, Document};
use reshard::phase::Phase;
use reshard::protocol::Side;
use reshard::router::{Router, RouterConfig, RouterError, StepEvent, StepHook};
use reshard::routing::{KeyValue, RoutingVersion};
use support::World;

const HOT: &str = "cust-hot";

async fn world() -> World {
    World::start().await
}

fn config(name: &str) -> RouterConfig {
    let mut c = RouterConfig::named(name);
    c.heartbeat_interval = Duration::from_millis(200);
    c.lease_ttl = Duration::from_secs(3);
    // These tests kill no server, so acknowledged-in-memory is durable enough and much faster.
    c.write_concern = mongodb::options::WriteConcern::nodes(1);
    c
}

impl World {
    fn coll(&self, v: &RoutingVersion, tenant: &str, id: &str) -> mongodb::Collection<Document> {
        let located = v
            .locate(
                &KeyValue::String(tenant.into()),
                &KeyValue::String(id.into()),
            )
            .unwrap();
        let l = &located.locations[0];
        self.shards[&l.shard].collection(&l.collection)
    }

    /// An id of the hot tenant whose document moves to another collection in version 2 (a
    /// document that stays in place has no separate source copy to race with).
    fn moving_id(&self, prefix: &str) -> String {
        self.hot_id(prefix, true)
    }

    /// An id of the hot tenant both versions place in one collection: one document is its
    /// source and its target document.
    fn staying_id(&self, prefix: &str) -> String {
        self.hot_id(prefix, false)
    }

    fn hot_id(&self, prefix: &str, moves: bool) -> String {
        (0..)
            .map(|n| format!("{prefix}-{n}"))
            .find(|id| {
                let t = KeyValue::String(HOT.into());
                let i = KeyValue::String(id.clone());
                (self.v1.locate(&t, &i).unwrap().locations
                    != self.v2.locate(&t, &i).unwrap().locations)
                    == moves
            })
            .unwrap()
    }

    /// Puts a document where the source version places it, as the application had it.
    async fn seed(&self, tenant: &str, id: &str, total: i32) {
        self.coll(&self.v1, tenant, id)
            .insert_one(doc! { "_id": id, "customerId": tenant, "total": total })
            .await
            .unwrap();
    }

    /// The backfill's one write for a document: insert-if-absent of a pristine copy.
    async fn copy(&self, tenant: &str, id: &str) {
        let Some(mut doc) = self
            .coll(&self.v1, tenant, id)
            .find_one(doc! { "_id": id })
            .await
            .unwrap()
        else {
            return;
        };
        let located = self
            .v2
            .locate(
                &KeyValue::String(tenant.into()),
                &KeyValue::String(id.into()),
            )
            .unwrap();
        doc.insert("bucket", located.sub_bucket as i32);
        doc.insert("_reshard", doc! { "src": "copy", "epoch": 0 });
        match self.coll(&self.v2, tenant, id).insert_one(doc).await {
            Ok(_) => {}
            Err(e) if reshard::router::is_duplicate_key(&e) => {}
            Err(e) => panic!("copy failed: {e}"),
        }
    }

    async fn target_doc(&self, tenant: &str, id: &str) -> Option<Document> {
        self.coll(&self.v2, tenant, id)
            .find_one(doc! { "_id": id })
            .await
            .unwrap()
    }

    async fn to_backfill(&self, routers: &[&Router]) {
        self.advance(
            routers,
            &[
                Phase::DualRead,
                Phase::WriteSwitch,
                Phase::NewWrites,
                Phase::Backfill,
            ],
        )
        .await;
    }
}

/// A hook that runs `action` once, before the first step matching `step`/`side`/`payload`,
/// and the flag that tells whether it ran.
fn before_once<F>(
    step: &'static str,
    side: Side,
    payload: Option<&'static str>,
    action: F,
) -> (StepHook, Arc<AtomicBool>)
where
    F: Fn() -> futures::future::BoxFuture<'static, ()> + Send + Sync + 'static,
{
    let fired = Arc::new(AtomicBool::new(false));
    let flag = fired.clone();
    let hook: StepHook = Arc::new(move |event: StepEvent| {
        let matches = event.step == step && event.side == side && event.payload == payload;
        if matches && !fired.swap(true, Ordering::SeqCst) {
            action()
        } else {
            async {}.boxed()
        }
    });
    (hook, flag)
}

/// A hook that runs the backfill's copy of `oid` once, just before the router inserts a
/// `payload` (`copy` or `tombstone`) into the target.
fn copy_before_insert_of(
    w: &Arc<World>,
    oid: &str,
    payload: &'static str,
) -> (StepHook, Arc<AtomicBool>) {
    let (w, oid) = (w.clone(), oid.to_owned());
    before_once("insert", Side::Target, Some(payload), move || {
        let (w, oid) = (w.clone(), oid.clone());
        async move { w.copy(HOT, &oid).await }.boxed()
    })
}

fn total(doc: &Option<Document>) -> Option<i32> {
    doc.as_ref().map(|d| d.get_i32("total").unwrap())
}

#[tokio::test]
async fn an_update_racing_the_backfill_copy_keeps_the_update() {
    let w = Arc::new(world().await);
    let oid = w.moving_id("o");
    w.seed(HOT, &oid, 1).await;
    let mut cfg = config("api");
    let (hook, fired) = copy_before_insert_of(&w, &oid, "copy");
    cfg.step_hook = Some(hook);
    let router = w.router(cfg).await;
    w.to_backfill(&[&router]).await;

    // The router found the document only in the source; before its copy-on-write lands,
    // the backfill copies it. The router's copy then fails as a duplicate and the update
    // applies to the backfill's copy.
    assert!(router
        .update(HOT, &oid, doc! { "$inc": { "total": 10 } })
        .await
        .unwrap());
    assert!(
        fired.load(Ordering::SeqCst),
        "the copy never raced the update"
    );
    assert_eq!(total(&router.get(HOT, &oid).await.unwrap()), Some(11));
    let stored = w.target_doc(HOT, &oid).await.unwrap();
    assert_eq!(
        stored
            .get_document("_reshard")
            .unwrap()
            .get_str("src")
            .unwrap(),
        "app"
    );
    // A later copy of the old source document changes nothing.
    w.copy(HOT, &oid).await;
    assert_eq!(total(&router.get(HOT, &oid).await.unwrap()), Some(11));
    router.shutdown().await;
}

#[tokio::test]
async fn a_copy_after_an_update_does_not_overwrite_it() {
    let w = world().await;
    let oid = w.moving_id("o");
    w.seed(HOT, &oid, 1).await;
    let router = w.router(config("api")).await;
    w.to_backfill(&[&router]).await;
    assert!(router
        .update(HOT, &oid, doc! { "$set": { "total": 5 } })
        .await
        .unwrap());
    w.copy(HOT, &oid).await;
    assert_eq!(total(&router.get(HOT, &oid).await.unwrap()), Some(5));
    router.shutdown().await;
}

#[tokio::test]
async fn a_delete_racing_the_backfill_copy_is_never_resurrected() {
    let w = Arc::new(world().await);
    let oid = w.moving_id("o");
    w.seed(HOT, &oid, 1).await;
    let mut cfg = config("api");
    let (hook, fired) = copy_before_insert_of(&w, &oid, "tombstone");
    cfg.step_hook = Some(hook);
    let router = w.router(cfg).await;
    w.to_backfill(&[&router]).await;

    assert!(router.delete(HOT, &oid).await.unwrap());
    assert!(
        fired.load(Ordering::SeqCst),
        "the copy never raced the delete"
    );
    assert_eq!(router.get(HOT, &oid).await.unwrap(), None);
    let stored = w.target_doc(HOT, &oid).await.unwrap();
    assert!(reshard::envelope::is_tombstone(&stored), "{stored}");
    // The source copy is still there until cleanup; copying it again cannot bring it back.
    w.copy(HOT, &oid).await;
    assert_eq!(router.get(HOT, &oid).await.unwrap(), None);
    let page = router.list_tenant(HOT, None, 100).await.unwrap();
    assert!(page.documents.is_empty(), "{:?}", page.documents);
    // A second delete finds nothing.
    assert!(!router.delete(HOT, &oid).await.unwrap());
    router.shutdown().await;
}

#[tokio::test]
async fn re_creating_a_deleted_id_replaces_its_tombstone() {
    let w = world().await;
    let oid = w.moving_id("o");
    w.seed(HOT, &oid, 1).await;
    let router = w.router(config("api")).await;
    w.to_backfill(&[&router]).await;
    assert!(router.delete(HOT, &oid).await.unwrap());
    router
        .insert(doc! { "_id": &oid, "customerId": HOT, "total": 40 })
        .await
        .unwrap();
    assert_eq!(total(&router.get(HOT, &oid).await.unwrap()), Some(40));
    w.copy(HOT, &oid).await;
    assert_eq!(total(&router.get(HOT, &oid).await.unwrap()), Some(40));
    assert!(router.delete(HOT, &oid).await.unwrap());
    assert!(router
        .replace(doc! { "_id": &oid, "customerId": HOT, "total": 41 }, true)
        .await
        .unwrap());
    assert_eq!(total(&router.get(HOT, &oid).await.unwrap()), Some(41));
    router.shutdown().await;
}

#[tokio::test]
async fn inserting_an_id_that_still_sits_in_the_source_is_refused() {
    let w = world().await;
    let oid = w.moving_id("o");
    w.seed(HOT, &oid, 1).await;
    let router = w.router(config("api")).await;
    w.to_backfill(&[&router]).await;
    let err = router
        .insert(doc! { "_id": &oid, "customerId": HOT, "total": 2 })
        .await
        .unwrap_err();
    assert!(matches!(err, RouterError::DuplicateId(_)), "{err}");
    assert_eq!(total(&router.get(HOT, &oid).await.unwrap()), Some(1));
    assert_eq!(w.target_doc(HOT, &oid).await, None);
    router.shutdown().await;
}

#[tokio::test]
async fn two_copy_on_writes_racing_apply_both_updates() {
    let w = Arc::new(world().await);
    let oid = w.moving_id("o");
    w.seed(HOT, &oid, 1).await;
    let other = w.router(config("api-b")).await;
    let mut cfg = config("api-a");
    let b = other.clone();
    let (hook, fired) = before_once("insert", Side::Target, Some("copy"), {
        let oid = oid.clone();
        move || {
            let (b, oid) = (b.clone(), oid.clone());
            async move {
                assert!(b
                    .update(HOT, &oid, doc! { "$inc": { "total": 100 } })
                    .await
                    .unwrap());
            }
            .boxed()
        }
    });
    cfg.step_hook = Some(hook);
    let router = w.router(cfg).await;
    w.to_backfill(&[&router, &other]).await;
    assert!(router
        .update(HOT, &oid, doc! { "$inc": { "total": 10 } })
        .await
        .unwrap());
    assert!(
        fired.load(Ordering::SeqCst),
        "the two copy-on-writes never raced"
    );
    assert_eq!(total(&router.get(HOT, &oid).await.unwrap()), Some(111));
    assert_eq!(total(&other.get(HOT, &oid).await.unwrap()), Some(111));
    router.shutdown().await;
    other.shutdown().await;
}

#[tokio::test]
async fn updates_that_would_move_a_document_are_refused() {
    let w = world().await;
    w.seed(HOT, "o7", 1).await;
    let router = w.router(config("api")).await;
    for field in ["customerId", "_id", "bucket", "_reshard.src"] {
        let err = router
            .update(HOT, "o7", doc! { "$set": { field: "x" } })
            .await
            .unwrap_err();
        assert!(
            matches!(err, RouterError::ImmutableField(_)),
            "{field}: {err}"
        );
    }
    let err = router
        .update(HOT, "o7", doc! { "total": 3 })
        .await
        .unwrap_err();
    assert!(matches!(err, RouterError::InvalidUpdate(_)), "{err}");
    router.shutdown().await;
}

#[tokio::test]
async fn a_router_that_cannot_renew_its_lease_refuses_operations_until_it_can() {
    let w = world().await;
    let mut cfg = config("api");
    cfg.lease_ttl = Duration::from_millis(1200);
    let router = w.router(cfg).await;
    router
        .insert(doc! { "_id": "o8", "customerId": "c1", "total": 1 })
        .await
        .unwrap();
    // Hold the router's registration row locked: its heartbeats block, its lease runs out.
    let pool = w.db.pool().await;
    let mut tx = pool.begin().await.unwrap();
    sqlx::query("SELECT 1 FROM routers WHERE id = $1 FOR UPDATE")
        .bind(router.id())
        .execute(&mut *tx)
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(2000)).await;
    let err = router
        .insert(doc! { "_id": "o9", "customerId": "c1", "total": 1 })
        .await
        .unwrap_err();
    assert!(matches!(err, RouterError::RoutingStale), "{err}");
    tx.rollback().await.unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        match router
            .insert(doc! { "_id": "o9", "customerId": "c1", "total": 1 })
            .await
        {
            Ok(()) => break,
            Err(RouterError::RoutingStale) if std::time::Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(100)).await
            }
            Err(e) => panic!("{e}"),
        }
    }
    router.shutdown().await;
}

/// Lists every page of the hot tenant.
async fn list_all(router: &Router) -> Vec<String> {
    let mut ids = Vec::new();
    let mut after: Option<Bson> = None;
    loop {
        let page = router.list_tenant(HOT, after.clone(), 7).await.unwrap();
        ids.extend(
            page.documents
                .iter()
                .map(|d| d.get_str("_id").unwrap().to_owned()),
        );
        match page.next {
            Some(next) => after = Some(next),
            None => return ids,
        }
    }
}

#[tokio::test]
async fn tenant_listings_under_concurrent_writes_return_each_surviving_document_once() {
    let w = Arc::new(world().await);
    // 40 documents that exist throughout, 10 deleted before any listing.
    for i in 0..50 {
        w.seed(HOT, &format!("k{i:03}"), i).await;
    }
    w.seed("cust-other", "x1", 1).await;
    let router = w.router(config("api")).await;
    let writer = w.router(config("writer")).await;
    for i in 40..50 {
        assert!(writer.delete(HOT, format!("k{i:03}")).await.unwrap());
    }
    let stable: Vec<String> = (0..40).map(|i| format!("k{i:03}")).collect();
    let phases = [
        None,
        Some(Phase::DualRead),
        Some(Phase::WriteSwitch),
        Some(Phase::Backfill),
        Some(Phase::Reconcile),
        Some(Phase::NewReads),
        Some(Phase::Cleanup),
    ];
    for (churn, phase) in phases.into_iter().enumerate() {
        match phase {
            // The gates out of backfill and reconcile belong to the backfill engine and to
            // reconciliation; this test is about what routers do in each phase, so it moves
            // the phase itself once every old document has been copied.
            Some(p @ (Phase::Reconcile | Phase::NewReads | Phase::Cleanup)) => {
                for i in 0..40 {
                    w.copy(HOT, &format!("k{i:03}")).await;
                }
                w.force_phase(&[&router, &writer], p).await;
            }
            Some(p) => w.advance(&[&router, &writer], &[p]).await,
            None => {}
        }
        // Copy half of the documents in backfill, as a running backfill would have.
        if phase == Some(Phase::Backfill) {
            for i in (0..40).step_by(2) {
                w.copy(HOT, &format!("k{i:03}")).await;
            }
        }
        if phase == Some(Phase::WriteSwitch) {
            // Writes are held here by design; the driver never stays in this phase.
            w.advance(&[&router, &writer], &[Phase::NewWrites]).await;
        }
        // Concurrent churn: new documents come and go, stable ones are updated.
        let writer2 = writer.clone();
        let churn_task = tokio::spawn(async move {
            for j in 0..15 {
                let id = format!("n{churn:03}_{j:02}");
                let _ = writer2
                    .insert(doc! { "_id": &id, "customerId": HOT, "total": 0 })
                    .await;
                let _ = writer2
                    .update(
                        HOT,
                        format!("k{:03}", j * 2 + 1),
                        doc! { "$inc": { "total": 1 } },
                    )
                    .await;
                let _ = writer2.delete(HOT, &id).await;
            }
        });
        let listed = list_all(&router).await;
        churn_task.await.unwrap();
        let unique: BTreeSet<&String> = listed.iter().collect();
        assert_eq!(
            unique.len(),
            listed.len(),
            "{phase:?}: duplicates in {listed:?}"
        );
        for id in &stable {
            assert!(
                unique.contains(id),
                "{phase:?}: {id} missing from {listed:?}"
            );
        }
        for i in 40..50 {
            let deleted = format!("k{i:03}");
            assert!(
                !unique.contains(&deleted),
                "{phase:?}: deleted {deleted} listed"
            );
        }
        assert!(
            listed.windows(2).all(|p| p[0] < p[1]),
            "{phase:?}: not in _id order"
        );
    }
    router.shutdown().await;
    writer.shutdown().await;
}

#[tokio::test]
async fn every_write_carries_the_app_stamp_and_the_routing_field() {
    let w = world().await;
    let router = w.router(config("api")).await;
    w.to_backfill(&[&router]).await;
    router
        .insert(doc! { "_id": "s1", "customerId": HOT, "total": 1 })
        .await
        .unwrap();
    let stored = w.target_doc(HOT, "s1").await.unwrap();
    let expected =
        w.v2.locate(
            &KeyValue::String(HOT.into()),
            &KeyValue::String("s1".into()),
        )
        .unwrap()
        .sub_bucket as i32;
    assert_eq!(stored.get_i32("bucket").unwrap(), expected);
    assert_eq!(
        stored
            .get_document("_reshard")
            .unwrap()
            .get_str("src")
            .unwrap(),
        "app"
    );
    // The application never sees the bookkeeping.
    let read = router.get(HOT, "s1").await.unwrap().unwrap();
    assert!(!read.contains_key("_reshard"));
    router.shutdown().await;
}

#[tokio::test]
async fn every_target_write_bumps_the_documents_revision() {
    let w = world().await;
    let oid = w.moving_id("r");
    w.seed(HOT, &oid, 1).await;
    let router = w.router(config("api")).await;
    w.to_backfill(&[&router]).await;
    let rev = |d: Option<Document>| reshard::envelope::revision(&d.unwrap());
    // The copy-on-write copy is revision 0, the update on it revision 1.
    assert!(router
        .update(HOT, &oid, doc! { "$inc": { "total": 1 } })
        .await
        .unwrap());
    assert_eq!(rev(w.target_doc(HOT, &oid).await), 1);
    assert!(router
        .replace(doc! { "_id": &oid, "customerId": HOT, "total": 9 }, false)
        .await
        .unwrap());
    assert_eq!(rev(w.target_doc(HOT, &oid).await), 2);
    assert!(router.delete(HOT, &oid).await.unwrap());
    assert_eq!(rev(w.target_doc(HOT, &oid).await), 3);
    router
        .insert(doc! { "_id": &oid, "customerId": HOT, "total": 4 })
        .await
        .unwrap();
    assert_eq!(rev(w.target_doc(HOT, &oid).await), 4);
    // A new id starts at revision 1.
    router
        .insert(doc! { "_id": "fresh", "customerId": HOT, "total": 4 })
        .await
        .unwrap();
    assert_eq!(rev(w.target_doc(HOT, "fresh").await), 1);
    router.shutdown().await;
}

#[tokio::test]
async fn while_reverting_every_operation_mirrors_the_target_into_the_source() {
    let w = world().await;
    let kept = w.moving_id("m");
    let gone = w.moving_id("g");
    w.seed(HOT, &kept, 1).await;
    w.seed(HOT, &gone, 1).await;
    let router = w.router(config("api")).await;
    w.to_backfill(&[&router]).await;
    // Written while the target was authoritative: only the target knows.
    assert!(router
        .update(HOT, &kept, doc! { "$set": { "total": 5 } })
        .await
        .unwrap());
    let source = |id: String| {
        let coll = w.coll(&w.v1, HOT, &id);
        async move { coll.find_one(doc! { "_id": &id }).await.unwrap() }
    };
    assert_eq!(total(&source(kept.clone()).await), Some(1));

    w.advance(&[&router], &[Phase::Reverting]).await;
    // A read mirrors what it saw; a write mirrors what it wrote; a delete mirrors a tombstone.
    assert_eq!(total(&router.get(HOT, &kept).await.unwrap()), Some(5));
    assert_eq!(total(&source(kept.clone()).await), Some(5));
    assert!(router
        .update(HOT, &kept, doc! { "$inc": { "total": 1 } })
        .await
        .unwrap());
    let mirrored = source(kept.clone()).await.unwrap();
    assert_eq!(mirrored.get_i32("total").unwrap(), 6);
    assert_eq!(reshard::envelope::revision(&mirrored), 2);
    assert!(router.delete(HOT, &gone).await.unwrap());
    assert!(reshard::envelope::is_tombstone(
        &source(gone.clone()).await.unwrap()
    ));

    // From revert_switch on, routers read the source alone, and it holds every write. (The
    // revert_complete gate belongs to the revert copier, not built yet: move the phase here.)
    w.force_phase(&[&router], Phase::RevertSwitch).await;
    assert_eq!(total(&router.get(HOT, &kept).await.unwrap()), Some(6));
    assert_eq!(router.get(HOT, &gone).await.unwrap(), None);
    w.force_phase(&[&router], Phase::RolledBack).await;
    assert_eq!(total(&router.get(HOT, &kept).await.unwrap()), Some(6));
    // Re-creating the deleted id in the source replaces its source tombstone.
    router
        .insert(doc! { "_id": &gone, "customerId": HOT, "total": 7 })
        .await
        .unwrap();
    assert_eq!(total(&router.get(HOT, &gone).await.unwrap()), Some(7));
    router.shutdown().await;
}

/// The copy back leaves out the mirrors routers already made (found by the fault campaign,
/// seed 1877590601: 2,547 of the 2,550 documents a copy back scanned were already in the
/// source, and each refused upsert cost the source a write; on the local servers a write whose
/// filter has an `$or` reads the whole collection, so the copy back fell to 4 documents/s and
/// never finished). It reads the source documents of its batch's mirrors first
/// (`skip_mirrored`): a write mirrored in `reverting` (by an update, or by a read) is left out
/// and counted as present; one made only before (the target alone knows it) is carried back.
#[tokio::test]
async fn the_copy_back_leaves_out_the_mirrors_routers_already_made() {
    let w = world().await;
    let (written, read, behind) = (w.moving_id("w"), w.moving_id("r"), w.moving_id("b"));
    for id in [&written, &read, &behind] {
        w.seed(HOT, id, 1).await;
    }
    let router = w.router(config("api")).await;
    w.to_backfill(&[&router]).await;
    for id in [&written, &read, &behind] {
        assert!(router
            .update(HOT, id, doc! { "$set": { "total": 5 } })
            .await
            .unwrap());
    }
    w.advance(&[&router], &[Phase::Reverting]).await;
    assert!(router
        .update(HOT, &written, doc! { "$set": { "total": 6 } })
        .await
        .unwrap());
    assert_eq!(total(&router.get(HOT, &read).await.unwrap()), Some(5));

    let shards = reshard::shards::Shards::connect(&w.store.shards().await.unwrap(), true)
        .await
        .unwrap();
    let mut left = Vec::new();
    for id in [&written, &read, &behind] {
        let location =
            w.v2.locate(&KeyValue::String(HOT.into()), &KeyValue::String(id.clone()))
                .unwrap()
                .locations[0]
                .clone();
        let image = w
            .coll(&w.v2, HOT, id)
            .find_one(doc! { "_id": id })
            .await
            .unwrap()
            .unwrap();
        let mut batch =
            reshard::worker::prepare_revert(&w.v1, &w.v2, w.migration, &location, vec![image]);
        assert_eq!(batch.statements.len(), 1, "{id}: a mirror to decide");
        reshard::worker::place_mirrors(&shards, &mut batch)
            .await
            .unwrap();
        reshard::worker::skip_mirrored(&shards, &mut batch, w.migration)
            .await
            .unwrap();
        assert_eq!(
            batch.statements.len() + batch.checkpoint.already_present as usize,
            1,
            "{id}: sent or counted present"
        );
        left.extend(batch.statements);
    }
    let ids: Vec<_> = left.iter().map(|s| s.id.clone()).collect();
    assert_eq!(
        ids,
        [Bson::String(behind.clone())],
        "only the unmirrored write"
    );
    // It carries the write the target alone knew back.
    let writer = reshard::shards::writer::BulkWriter::new(
        w.shards.clone(),
        reshard::shards::writer::WriterOptions::default(),
    );
    writer.write(left).await.unwrap();
    let source = w
        .coll(&w.v1, HOT, &behind)
        .find_one(doc! { "_id": &behind })
        .await
        .unwrap();
    assert_eq!(total(&source), Some(5));
    router.shutdown().await;
}

/// In a collection both layouts share, an id both versions place there has one document for
/// both sides. While rolling back, a mirror of it must not write: the revert copier's image,
/// read by its scan before an application write, landed over that write after it (the
/// replace and the tombstone carry no `_reshard.mig`, so the mirror's condition let the older
/// image through) and before the router's own mirror: a lost update and a resurrected delete,
/// seen as reads one version behind by the example application in CI.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_a_collection_both_layouts_share_no_mirror_writes_an_older_image_over_the_document() {
    let w = Arc::new(world().await);
    let (kept, gone) = (w.staying_id("kept"), w.staying_id("gone"));
    assert_ne!(kept, gone);
    for id in [&kept, &gone] {
        w.seed(HOT, id, 1).await;
    }
    let router = w.router(config("api")).await;
    w.to_backfill(&[&router]).await;
    for id in [&kept, &gone] {
        assert!(router
            .update(HOT, id, doc! { "$set": { "total": 5 } })
            .await
            .unwrap());
    }
    w.advance(&[&router], &[Phase::Reverting]).await;

    // The revert copier's scan reads both documents where the target places them (where the
    // source does too), and decides its batch from these images.
    let location =
        w.v2.locate(
            &KeyValue::String(HOT.into()),
            &KeyValue::String(kept.clone()),
        )
        .unwrap()
        .locations[0]
            .clone();
    let mut scanned = Vec::new();
    for id in [&kept, &gone] {
        let coll = w.coll(&w.v2, HOT, id);
        scanned.push(coll.find_one(doc! { "_id": id }).await.unwrap().unwrap());
    }
    assert_eq!(
        w.coll(&w.v2, HOT, &gone).namespace(),
        w.coll(&w.v2, HOT, &kept).namespace()
    );
    let batch = reshard::worker::prepare_revert(&w.v1, &w.v2, w.migration, &location, scanned);
    assert!(
        batch.statements.is_empty(),
        "the source already holds these documents: {:?}",
        batch.statements
    );
    // The batch lands after each application write and before that write's own mirror (a
    // worker's bulk write lands whenever it lands).
    let statements = Arc::new(batch.statements);
    let writer = Arc::new(reshard::shards::writer::BulkWriter::new(
        w.shards.clone(),
        reshard::shards::writer::WriterOptions::default(),
    ));
    let landed = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let hook: StepHook = {
        let (statements, writer, landed) = (statements.clone(), writer.clone(), landed.clone());
        Arc::new(move |event: StepEvent| {
            let (statements, writer, landed) = (statements.clone(), writer.clone(), landed.clone());
            async move {
                if event.step == "mirror_to_source" {
                    writer.write(statements.to_vec()).await.unwrap();
                    landed.fetch_add(1, Ordering::SeqCst);
                }
            }
            .boxed()
        })
    };
    let mut cfg = config("writer-api");
    cfg.step_hook = Some(hook);
    let writing = w.router(cfg).await;
    assert_eq!(writing.snapshot().await.phase, Phase::Reverting);
    assert!(writing
        .replace(doc! { "_id": &kept, "customerId": HOT, "total": 9 }, false)
        .await
        .unwrap());
    assert!(writing.delete(HOT, &gone).await.unwrap());
    assert_eq!(
        landed.load(Ordering::SeqCst),
        2,
        "the batch did not land twice"
    );

    for r in [&router, &writing] {
        assert_eq!(total(&r.get(HOT, &kept).await.unwrap()), Some(9));
        assert_eq!(r.get(HOT, &gone).await.unwrap(), None);
    }
    // The rolled-back collection holds the newest writes too.
    w.force_phase(&[&router, &writing], Phase::RevertSwitch)
        .await;
    w.force_phase(&[&router, &writing], Phase::RolledBack).await;
    assert_eq!(total(&router.get(HOT, &kept).await.unwrap()), Some(9));
    assert_eq!(router.get(HOT, &gone).await.unwrap(), None);
    writing.shutdown().await;
    router.shutdown().await;
}

/// A source layout not made by reshard, listing two shards an order may be on.
const FANOUT_V1: &str = "tenant_key: customerId
layout: fanout
shards: [s1, s2]
";

/// The target: hashed over two other shards, so every order moves.
const HASHED_V2: &str = "tenant_key: customerId
layout: hashed
virtual_buckets: 1024
default_buckets: 1
routing_field: bucket
placement:
  - vbuckets: [0, 512]
    shard: s3
  - vbuckets: [512, 1024]
    shard: s4
";

/// The document with `id` in `coll`, if any.
async fn at(coll: &mongodb::Collection<Document>, id: &str) -> Option<Document> {
    coll.find_one(doc! { "_id": id }).await.unwrap()
}

/// With a fanout source, a rollback's mirrors replace each source document where it is: on
/// the second listed shard here. A mirror sent to the first listed shard instead leaves the
/// source document as it was beside a new one, so a delete mirrored that way leaves the order
/// live after the rollback, and an update leaves two versions of it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_a_fanout_source_mirrors_replace_the_source_document_where_it_is() {
    let w = World::start_with_versions(FANOUT_V1, HASHED_V2).await;
    let (first, second) = (
        w.shards["s1"].collection::<Document>("orders"),
        w.shards["s2"].collection::<Document>("orders"),
    );
    // Read by a router (its mirror), deleted through a router (a mirrored tombstone), and
    // carried back by the revert copier alone.
    let (read, deleted, copied) = ("fan-read", "fan-deleted", "fan-copied");
    for id in [read, deleted, copied] {
        second
            .insert_one(doc! { "_id": id, "customerId": HOT, "total": 1 })
            .await
            .unwrap();
    }
    let router = w.router(config("api")).await;
    w.to_backfill(&[&router]).await;
    for id in [read, deleted, copied] {
        assert!(router
            .update(HOT, id, doc! { "$set": { "total": 5 } })
            .await
            .unwrap());
    }
    w.advance(&[&router], &[Phase::Reverting]).await;
    assert_eq!(total(&router.get(HOT, read).await.unwrap()), Some(5));
    assert_eq!(total(&at(&second, read).await), Some(5));
    assert!(router.delete(HOT, deleted).await.unwrap());
    assert!(reshard::envelope::is_tombstone(
        &at(&second, deleted).await.unwrap()
    ));
    run_worker(&w).await;
    assert_eq!(total(&at(&second, copied).await), Some(5));
    for id in [read, deleted, copied] {
        assert_eq!(
            at(&first, id).await,
            None,
            "{id} was mirrored to the first shard"
        );
    }

    w.force_phase(&[&router], Phase::RevertSwitch).await;
    w.force_phase(&[&router], Phase::RolledBack).await;
    assert_eq!(total(&router.get(HOT, read).await.unwrap()), Some(5));
    assert_eq!(total(&router.get(HOT, copied).await.unwrap()), Some(5));
    assert_eq!(router.get(HOT, deleted).await.unwrap(), None);
    router.shutdown().await;
}

/// With a fanout source, an insert through the router of an id whose document sits on the
/// second listed shard is refused as a duplicate key, as one collection's unique index
/// refuses it, in both phases that write the source before the switch, and leaves the one
/// document; after a rollback, a re-creation of the deleted id replaces its source tombstone
/// where it is rather than putting a document beside it. Sent to the first listed shard
/// without looking at the others (the router's rule before `protocol::listed_location`), the
/// insert succeeded and made a second document of the id.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_a_fanout_source_an_insert_of_an_id_on_another_listed_shard_is_refused() {
    let w = World::start_with_versions(FANOUT_V1, HASHED_V2).await;
    let (first, second) = (
        w.shards["s1"].collection::<Document>("orders"),
        w.shards["s2"].collection::<Document>("orders"),
    );
    let id = "fan-taken";
    second
        .insert_one(doc! { "_id": id, "customerId": HOT, "total": 1 })
        .await
        .unwrap();
    let router = w.router(config("api")).await;
    for phase in [Phase::Planned, Phase::DualRead] {
        if phase != Phase::Planned {
            w.advance(&[&router], &[phase]).await;
        }
        let err = router
            .insert(doc! { "_id": id, "customerId": HOT, "total": 2 })
            .await
            .unwrap_err();
        assert!(matches!(err, RouterError::DuplicateId(_)), "{phase}: {err}");
        assert_eq!(at(&first, id).await, None, "{phase}: a second document");
        assert_eq!(total(&at(&second, id).await), Some(1), "{phase}");
    }

    // Deleted while rolling back: the router's mirror leaves a tombstone on the second
    // shard, which the re-creation after the rollback replaces there.
    w.advance(
        &[&router],
        &[
            Phase::WriteSwitch,
            Phase::NewWrites,
            Phase::Backfill,
            Phase::Reverting,
        ],
    )
    .await;
    assert!(router.delete(HOT, id).await.unwrap());
    assert!(reshard::envelope::is_tombstone(
        &at(&second, id).await.unwrap()
    ));
    w.force_phase(&[&router], Phase::RevertSwitch).await;
    w.force_phase(&[&router], Phase::RolledBack).await;
    router
        .insert(doc! { "_id": id, "customerId": HOT, "total": 3 })
        .await
        .unwrap();
    assert_eq!(
        at(&first, id).await,
        None,
        "a document beside the tombstone"
    );
    assert_eq!(total(&at(&second, id).await), Some(3));
    assert_eq!(total(&router.get(HOT, id).await.unwrap()), Some(3));
    router.shutdown().await;
}

/// With a fanout source, the router's replaces, updates and deletes before the switch and
/// after a rollback change the document where it is, on the second listed shard here. Sent
/// to the first listed shard (the router's rule before `protocol::listed_location`, for every
/// write not preceded by a find), they matched nothing there: the update and the delete
/// reported no document and were lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_a_fanout_source_source_writes_change_the_document_where_it_is() {
    let w = World::start_with_versions(FANOUT_V1, HASHED_V2).await;
    let (first, second) = (
        w.shards["s1"].collection::<Document>("orders"),
        w.shards["s2"].collection::<Document>("orders"),
    );
    let (before, after) = ("fan-before", "fan-after");
    for id in [before, after] {
        second
            .insert_one(doc! { "_id": id, "customerId": HOT, "total": 1 })
            .await
            .unwrap();
    }
    let router = w.router(config("api")).await;
    // Written in `planned`, and after a rollback (source writes stamped for the migration,
    // deletes leaving a tombstone until the seal).
    for (phase, id) in [(Phase::Planned, before), (Phase::RolledBack, after)] {
        if phase == Phase::RolledBack {
            w.advance(
                &[&router],
                &[
                    Phase::DualRead,
                    Phase::WriteSwitch,
                    Phase::NewWrites,
                    Phase::Backfill,
                    Phase::Reverting,
                ],
            )
            .await;
            w.force_phase(&[&router], Phase::RevertSwitch).await;
            w.force_phase(&[&router], Phase::RolledBack).await;
        }
        assert!(
            router
                .update(HOT, id, doc! { "$inc": { "total": 4 } })
                .await
                .unwrap(),
            "{phase}: the update found no document"
        );
        assert!(router
            .replace(doc! { "_id": id, "customerId": HOT, "total": 7 }, false)
            .await
            .unwrap());
        assert_eq!(total(&at(&second, id).await), Some(7), "{phase}");
        assert!(router.delete(HOT, id).await.unwrap(), "{phase}");
        assert_eq!(router.get(HOT, id).await.unwrap(), None, "{phase}");
        assert_eq!(
            at(&first, id).await,
            None,
            "{phase}: a document on the first shard"
        );
    }
    assert!(reshard::envelope::is_tombstone(
        &at(&second, after).await.unwrap()
    ));
    router.shutdown().await;
}

/// Tries `advance --to phase` until the gate opens (a router is counted out, or acknowledges),
/// up to `within`. Returns how many refusals named `router`.
async fn advance_when_open(w: &World, phase: Phase, router: &str, within: Duration) -> usize {
    let deadline = std::time::Instant::now() + within;
    let mut named = 0;
    loop {
        match w
            .store
            .transition(
                w.migration,
                &reshard::phase::Action::Advance(phase),
                "test",
                None,
                false,
            )
            .await
        {
            Ok(_) => return named,
            Err(e) => {
                let message = e.to_string();
                assert!(message.contains("acknowledged"), "{message}");
                named += usize::from(message.contains(router));
                assert!(
                    std::time::Instant::now() < deadline,
                    "{phase} stayed closed: {message}"
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

/// Issue 10's reproduction: a router's source delete stalls (a server selection wait, a
/// retry during a failover) while it cannot reach the state store, so its lease runs out and
/// the driver moves on through the write switch into the backfill, which copies the document.
/// The stalled delete must not land afterwards: the application gets an error saying nothing
/// was applied, and the document it still has is never "deleted but back".
#[tokio::test]
async fn a_step_stalled_past_the_lease_never_lands_late() {
    let w = Arc::new(world().await);
    let oid = w.moving_id("late");
    w.seed(HOT, &oid, 1).await;
    let mut cfg = config("stalled-api");
    cfg.lease_ttl = Duration::from_secs(2);
    cfg.fence_margin = Some(Duration::from_millis(500));
    let router_id = Arc::new(std::sync::OnceLock::<uuid::Uuid>::new());
    // Holds the router's registration row with a lock that blocks its renewals (FOR UPDATE)
    // but not the driver's barrier (FOR SHARE), so its lease runs out while the step stalls.
    let lock: Arc<tokio::sync::Mutex<Option<sqlx::Transaction<'static, sqlx::Postgres>>>> =
        Arc::default();
    let (hook, fired) = {
        let (w, router_id, lock, oid) = (w.clone(), router_id.clone(), lock.clone(), oid.clone());
        before_once("delete_live", Side::Source, None, move || {
            let (w, router_id, lock, oid) =
                (w.clone(), router_id.clone(), lock.clone(), oid.clone());
            async move {
                let pool = w.db.pool().await;
                let mut tx = pool.begin().await.unwrap();
                sqlx::query("SELECT 1 FROM routers WHERE id = $1 FOR KEY SHARE")
                    .bind(router_id.get().unwrap())
                    .execute(&mut *tx)
                    .await
                    .unwrap();
                *lock.lock().await = Some(tx);
                // The driver goes on without the silent router once it is counted out.
                advance_when_open(
                    &w,
                    Phase::WriteSwitch,
                    "stalled-api",
                    Duration::from_secs(5),
                )
                .await;
                let named =
                    advance_when_open(&w, Phase::NewWrites, "stalled-api", Duration::from_secs(10))
                        .await;
                assert!(named > 0, "the switch never waited for the stalled router");
                advance_when_open(&w, Phase::Backfill, "stalled-api", Duration::from_secs(5)).await;
                w.copy(HOT, &oid).await;
            }
            .boxed()
        })
    };
    cfg.step_hook = Some(hook);
    let router = w.router(cfg).await;
    router_id.set(router.id()).unwrap();
    w.advance(&[&router], &[Phase::DualRead]).await;

    let result = router.delete(HOT, &oid).await;
    assert!(fired.load(Ordering::SeqCst), "the delete never stalled");
    assert!(
        matches!(result, Err(RouterError::RoutingStale)),
        "the stalled delete must fail saying nothing was applied: {result:?}"
    );
    // Nothing landed late: the source still holds the document the backfill copied.
    assert!(w
        .coll(&w.v1, HOT, &oid)
        .find_one(doc! { "_id": &oid })
        .await
        .unwrap()
        .is_some());
    // Once it reaches the state store again it loads the phase before serving, and reads and
    // deletes in the new phase.
    lock.lock().await.take().unwrap().rollback().await.unwrap();
    let phase_now = w.store.migration(w.migration).await.unwrap();
    assert!(
        router
            .wait_for_epoch(phase_now.epoch, Duration::from_secs(10))
            .await
    );
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let doc = loop {
        match router.get(HOT, &oid).await {
            Ok(d) => break d,
            Err(RouterError::RoutingStale) if std::time::Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(100)).await
            }
            Err(e) => panic!("{e}"),
        }
    };
    assert_eq!(total(&doc), Some(1), "the failed delete left the document");
    assert!(router.delete(HOT, &oid).await.unwrap());
    w.copy(HOT, &oid).await;
    assert_eq!(router.get(HOT, &oid).await.unwrap(), None, "resurrected");
    router.shutdown().await;
}

/// The other way a step outlives the barrier: a router draining a slow operation before an
/// epoch switch. It keeps heartbeating, so the driver waits for it instead of counting it
/// out, and the operation completes in its own phase.
#[tokio::test]
async fn a_router_draining_a_slow_step_keeps_its_lease_and_holds_the_switch() {
    let w = Arc::new(world().await);
    let oid = w.moving_id("slow");
    w.seed(HOT, &oid, 1).await;
    let mut cfg = config("slow-api");
    cfg.lease_ttl = Duration::from_secs(2);
    cfg.fence_margin = Some(Duration::from_millis(500));
    let (hook, fired) = {
        let w = w.clone();
        before_once("delete_live", Side::Source, None, move || {
            let w = w.clone();
            async move {
                advance_when_open(&w, Phase::WriteSwitch, "slow-api", Duration::from_secs(5)).await;
                // Longer than the lease: the router stays counted because it heartbeats.
                let stalled = std::time::Instant::now();
                while stalled.elapsed() < Duration::from_secs(4) {
                    let refused = w
                        .store
                        .transition(
                            w.migration,
                            &reshard::phase::Action::Advance(Phase::NewWrites),
                            "test",
                            None,
                            false,
                        )
                        .await
                        .unwrap_err()
                        .to_string();
                    assert!(refused.contains("slow-api"), "{refused}");
                    tokio::time::sleep(Duration::from_millis(250)).await;
                }
            }
            .boxed()
        })
    };
    cfg.step_hook = Some(hook);
    let router = w.router(cfg).await;
    w.advance(&[&router], &[Phase::DualRead]).await;
    assert!(router.delete(HOT, &oid).await.unwrap());
    assert!(fired.load(Ordering::SeqCst));
    // Drained, it switches to write_switch and acknowledges; then the switch completes.
    w.acknowledged().await;
    w.advance(&[&router], &[Phase::NewWrites, Phase::Backfill])
        .await;
    w.copy(HOT, &oid).await;
    assert_eq!(router.get(HOT, &oid).await.unwrap(), None, "resurrected");
    router.shutdown().await;
}

/// Runs one in-process worker on the migration until its current task has nothing left.
async fn run_worker(w: &World) {
    let mut cfg = reshard::worker::WorkerConfig::new("test-worker");
    cfg.migration = Some(w.migration);
    cfg.exit_when_done = true;
    cfg.lease_ttl = Duration::from_secs(3);
    cfg.idle_poll = Duration::from_millis(200);
    let worker = reshard::worker::Worker::connect(w.store.clone(), cfg)
        .await
        .unwrap();
    let (_stop, stop_rx) = tokio::sync::watch::channel(false);
    tokio::time::timeout(Duration::from_secs(60), worker.run(stop_rx))
        .await
        .expect("the worker did not finish")
        .unwrap();
}

/// The hole a lapse opens in a rollback: in `reverting` a router writes the target, then its
/// lease runs out before it mirrors the write to the source, and the copy back has already
/// passed the id. The copy is outdated: `revert_complete` stays closed until a copy planned
/// after the lapse ran, and that copy carries the write to the source, so the rolled-back
/// collection keeps it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_router_lapsing_behind_the_copy_back_sends_it_round_again() {
    let w = Arc::new(world().await);
    let oid = w.moving_id("lapse");
    w.seed(HOT, &oid, 1).await;
    let mut cfg = config("lapsing-api");
    cfg.lease_ttl = Duration::from_secs(2);
    cfg.fence_margin = Some(Duration::from_millis(500));
    let router_id = Arc::new(std::sync::OnceLock::<uuid::Uuid>::new());
    let lock: Arc<tokio::sync::Mutex<Option<sqlx::Transaction<'static, sqlx::Postgres>>>> =
        Arc::default();
    let (hook, fired) = {
        let (w, router_id, lock) = (w.clone(), router_id.clone(), lock.clone());
        before_once("mirror_to_source", Side::Source, None, move || {
            let (w, router_id, lock) = (w.clone(), router_id.clone(), lock.clone());
            async move {
                // Renewals block (the lock), so the lease runs out before the mirror is sent.
                let pool = w.db.pool().await;
                let mut tx = pool.begin().await.unwrap();
                sqlx::query("SELECT 1 FROM routers WHERE id = $1 FOR KEY SHARE")
                    .bind(router_id.get().unwrap())
                    .execute(&mut *tx)
                    .await
                    .unwrap();
                *lock.lock().await = Some(tx);
                tokio::time::sleep(Duration::from_secs(3)).await;
            }
            .boxed()
        })
    };
    let router = w.router(config("steady-api")).await;
    w.to_backfill(&[&router]).await;
    w.copy(HOT, &oid).await;
    cfg.step_hook = Some(hook);
    let lapsing = w.router(cfg).await;
    router_id.set(lapsing.id()).unwrap();
    w.advance(&[&router, &lapsing], &[Phase::Reverting]).await;
    run_worker(&w).await;
    let to_switch = || {
        w.store.transition(
            w.migration,
            &reshard::phase::Action::Advance(Phase::RevertSwitch),
            "test",
            None,
            true,
        )
    };
    to_switch().await.expect("the copy back is complete");

    // The write lands in the target; its mirror is never sent.
    let result = lapsing
        .update(HOT, &oid, doc! { "$set": { "total": 9 } })
        .await;
    assert!(fired.load(Ordering::SeqCst), "the mirror never stalled");
    assert!(
        matches!(result, Err(RouterError::OutcomeUnknown)),
        "{result:?}"
    );
    let source = w.coll(&w.v1, HOT, &oid);
    let in_source = || async { source.find_one(doc! { "_id": &oid }).await.unwrap() };
    assert_eq!(total(&in_source().await), Some(1), "the mirror was sent");
    assert_eq!(total(&w.target_doc(HOT, &oid).await), Some(9));

    // The copy back is outdated; the gate says so (even before the router renews).
    let closed = to_switch().await.unwrap_err().to_string();
    assert!(closed.contains("lapsed"), "{closed}");
    lock.lock().await.take().unwrap().rollback().await.unwrap();
    let closed = to_switch().await.unwrap_err().to_string();
    assert!(closed.contains("lapsed"), "{closed}");

    // The worker plans it again, after the lapse, and carries the write back.
    run_worker(&w).await;
    assert_eq!(total(&in_source().await), Some(9));
    let m = w.store.migration(w.migration).await.unwrap();
    let replanned = w
        .store
        .events(w.migration)
        .await
        .unwrap()
        .into_iter()
        .filter(|e| e.kind == reshard::store::events::EventKind::RevertPlanned)
        .count();
    assert_eq!(replanned, 2, "{m:?}");
    let m = w.store.migration(m.id).await.unwrap();
    let e = m.epoch;
    assert!(lapsing.wait_for_epoch(e, Duration::from_secs(10)).await);
    w.advance(
        &[&router, &lapsing],
        &[Phase::RevertSwitch, Phase::RolledBack],
    )
    .await;
    assert_eq!(total(&router.get(HOT, &oid).await.unwrap()), Some(9));
    lapsing.shutdown().await;
    router.shutdown().await;
}

/// A router that shuts down refuses new operations, lets the ones in flight finish, and only
/// then removes its registration: a barrier stops waiting for a router that is gone, so none of
/// its writes may land after that.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_router_shutting_down_drains_its_operations_before_it_deregisters() {
    let w = Arc::new(world().await);
    let oid = w.moving_id("drain");
    w.seed(HOT, &oid, 1).await;
    let release = Arc::new(tokio::sync::Notify::new());
    let (hook, fired) = {
        let release = release.clone();
        before_once("update_live", Side::Source, None, move || {
            let release = release.clone();
            async move { release.notified().await }.boxed()
        })
    };
    let mut cfg = config("draining-api");
    cfg.step_hook = Some(hook);
    let router = Arc::new(w.router(cfg).await);
    let registered = |w: Arc<World>| async move {
        w.store
            .routers(Some("orders"))
            .await
            .unwrap()
            .iter()
            .any(|r| r.name == "draining-api")
    };

    let op = {
        let (router, oid) = (router.clone(), oid.clone());
        tokio::spawn(async move {
            router
                .update(HOT, &oid, doc! { "$set": { "total": 2 } })
                .await
        })
    };
    while !fired.load(Ordering::SeqCst) {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let shutdown = {
        let router = router.clone();
        tokio::spawn(async move { router.shutdown().await })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    let late = {
        let (router, oid) = (router.clone(), oid.clone());
        tokio::spawn(async move { router.get(HOT, &oid).await })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        registered(w.clone()).await,
        "deregistered with an operation in flight"
    );
    assert!(!shutdown.is_finished());

    release.notify_one();
    assert!(
        op.await.unwrap().unwrap(),
        "the operation in flight completes"
    );
    tokio::time::timeout(Duration::from_secs(10), shutdown)
        .await
        .expect("the shutdown ends once drained")
        .unwrap();
    assert!(!registered(w.clone()).await, "still registered");
    assert!(
        matches!(late.await.unwrap(), Err(RouterError::ShutDown)),
        "an operation after the shutdown began is refused"
    );
    let source = w.coll(&w.v1, HOT, &oid);
    let doc = source.find_one(doc! { "_id": &oid }).await.unwrap();
    assert_eq!(total(&doc), Some(2));
}

/// The router's shards through a client of its own whose monitor checks the server only once a
/// minute: a restart of the server then goes unnoticed until a command finds its pooled
/// connection closed (as a connection the server closed while it sat idle would be).
async fn shards_noticing_late(w: &World) -> std::collections::HashMap<String, mongodb::Database> {
    let client =
        mongodb::Client::with_uri_str(format!("{}&heartbeatFrequencyMS=60000", w.server.uri()))
            .await
            .unwrap();
    w.shards
        .iter()
        .map(|(name, db)| (name.clone(), client.database(db.name())))
        .collect()
}

/// Item 6 of the resilience issue (a router's step after a ~35 s stall failed with a broken pipe: the server
/// had closed the pooled connection). The server closes the router's pooled connection between
/// a read and an insert (it restarts, and the driver's monitor does not notice in time); the
/// insert, larger than the driver's write buffer, finds the connection closed while it is
/// being written (a broken pipe: nothing of it was received), and is sent again on a fresh
/// connection instead of failing. Before the fix the application got "MongoDB: the server
/// closed the connection".
#[tokio::test]
async fn a_write_that_finds_its_pooled_connection_closed_is_sent_again_on_a_fresh_one() {
    let w = Arc::new(world().await);
    let oid = w.moving_id("closed");
    let (hook, fired) = {
        let w = w.clone();
        before_once("insert", Side::Source, Some("app"), move || {
            let w = w.clone();
            async move { w.server.restart().await }.boxed()
        })
    };
    let mut cfg = config("reconnecting-api");
    cfg.step_hook = Some(hook);
    let shards = shards_noticing_late(&w).await;
    let router = Router::with_shards(w.store.clone(), "orders", cfg, shards)
        .await
        .unwrap();
    // The read leaves a connection in the router's pool; the insert takes it.
    assert_eq!(router.get(HOT, &oid).await.unwrap(), None);
    let note = "n".repeat(20_000);
    let inserted = router
        .insert(doc! { "_id": &oid, "customerId": HOT, "total": 1, "note": &note })
        .await;
    assert!(fired.load(Ordering::SeqCst), "the server never restarted");
    inserted.expect("the insert is sent again on a fresh connection");
    let stored = router.get(HOT, &oid).await.unwrap().expect("inserted");
    assert_eq!(stored.get_str("note").unwrap(), note);
    let copies = w
        .coll(&w.v1, HOT, &oid)
        .count_documents(doc! { "_id": &oid })
        .await
        .unwrap();
    assert_eq!(copies, 1);
    router.shutdown().await;
}

/// A read whose connection the server closed after receiving it is sent again: a read changes
/// nothing however often it arrives. Before, the application's read failed.
#[tokio::test]
async fn a_read_whose_connection_was_closed_is_sent_again() {
    let w = World::start_with_failpoints().await;
    let oid = w.staying_id("read");
    w.seed(HOT, &oid, 7).await;
    let router = w.router(config("reading-api")).await;
    w.server
        .fail_command(serde_json::json!({
            "mode": { "times": 1 },
            "data": { "failCommands": ["find"], "closeConnection": true },
        }))
        .await;
    let read = router.get(HOT, &oid).await;
    w.server.clear_failpoint().await;
    assert_eq!(total(&read.expect("the read is sent again")), Some(7));
    router.shutdown().await;
}

/// A write whose connection failed once the server may have received it is not sent again:
/// its outcome is unknown (here the server closed the connection without running it; a
/// second send would have deleted the document after the application was told the delete
/// failed). The application gets the failure, and the document is still there.
#[tokio::test]
async fn a_write_that_may_have_reached_the_server_is_not_sent_again() {
    let w = World::start_with_failpoints().await;
    let oid = w.staying_id("unsure");
    w.seed(HOT, &oid, 1).await;
    let router = w.router(config("unsure-api")).await;
    w.server
        .fail_command(serde_json::json!({
            "mode": { "times": 1 },
            "data": { "failCommands": ["delete"], "closeConnection": true },
        }))
        .await;
    let deleted = router.delete(HOT, &oid).await;
    w.server.clear_failpoint().await;
    assert!(
        matches!(deleted, Err(RouterError::Mongo(_))),
        "the connection's failure reaches the application: {deleted:?}"
    );
    let source = w.coll(&w.v1, HOT, &oid);
    assert_eq!(
        total(&source.find_one(doc! { "_id": &oid }).await.unwrap()),
        Some(1),
        "the delete was not sent again"
    );
    // The next delete goes out on a fresh connection.
    assert!(router.delete(HOT, &oid).await.unwrap());
    router.shutdown().await;
}

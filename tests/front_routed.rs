//! The front's routed commands on real servers, through the official Rust driver: a
//! collection with a migration from version 1 (three shards) to version 2 (four, the hot
//! customer over 16 buckets), driven phase by phase while an application talks only MongoDB
//! to the front. Each test asserts what the driver sees against what the same operations mean
//! on one plain collection: inserts ordered and unordered with a duplicate, updates by id and
//! by filter, upserts, `findOneAndUpdate` as a queue, deletes, finds with sort, projection,
//! skip, limit and `getMore`, counts, `distinct`, an aggregation, the refused forms with their
//! codes, and, in the backfill, that a source image a newer target image supersedes never
//! appears in a find, even when only the older image matches the filter.

mod support;

use std::time::Duration;

use futures::TryStreamExt;
use mongodb::bson::{doc, Bson, Document};
use mongodb::error::ErrorKind;
use mongodb::options::FindOptions;
use reshard::phase::Phase;
use reshard::router::Router;
use reshard::shards::passthrough::Passthrough;
use support::{RoutedFront, World, TO_BACKFILL};

/// The MongoDB error code of a failed driver call.
fn code_of(e: &mongodb::error::Error) -> i32 {
    match e.kind.as_ref() {
        ErrorKind::Command(c) => c.code,
        ErrorKind::Write(mongodb::error::WriteFailure::WriteError(w)) => w.code,
        ErrorKind::InsertMany(i) => i
            .write_errors
            .as_ref()
            .and_then(|w| w.first())
            .map_or(-1, |w| w.code),
        other => panic!("not a server error: {other:?}"),
    }
}

fn order(id: i64, customer: &str, total: i32, state: &str) -> Document {
    doc! { "_id": id, "customerId": customer, "total": total, "state": state }
}

async fn ids(cursor: mongodb::Cursor<Document>) -> Vec<i64> {
    let docs: Vec<Document> = cursor.try_collect().await.unwrap();
    docs.iter().map(|d| d.get_i64("_id").unwrap()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_application_on_the_official_driver_reads_and_writes_through_every_phase() {
    let world = World::start().await;
    let front = RoutedFront::start(&world, "front test").await;
    let client = front.client().await;
    let orders = client.database("shop").collection::<Document>("orders");
    // The front registered a router for the routed collection, as a front.
    let registered = world.store.routers(Some("orders")).await.unwrap();
    assert_eq!(
        registered.iter().map(|r| r.kind).collect::<Vec<_>>(),
        [reshard::store::RouterKind::Front],
        "{registered:?}"
    );

    // Inserts, ordered: stops at the duplicate; unordered: reports it and goes on.
    let batch: Vec<Document> = (1..=4)
        .map(|i| order(i, "cust-hot", i as i32 * 10, "ready"))
        .collect();
    orders.insert_many(batch).await.unwrap();
    let dup = orders
        .insert_many(vec![
            order(5, "cust-hot", 50, "ready"),
            order(2, "cust-hot", 0, "ready"),
            order(6, "cust-hot", 60, "ready"),
        ])
        .await
        .unwrap_err();
    assert_eq!(code_of(&dup), 11000, "{dup}");
    assert_eq!(
        orders
            .count_documents(doc! {"customerId": "cust-hot"})
            .await
            .unwrap(),
        5
    );
    let unordered = orders
        .insert_many(vec![
            order(2, "cust-hot", 0, "ready"),
            order(6, "cust-hot", 60, "ready"),
            order(7, "cust-cold", 70, "ready"),
        ])
        .ordered(false)
        .await
        .unwrap_err();
    match unordered.kind.as_ref() {
        ErrorKind::InsertMany(i) => {
            let failed: Vec<usize> = i
                .write_errors
                .as_ref()
                .unwrap()
                .iter()
                .map(|w| w.index)
                .collect();
            assert_eq!(failed, vec![0]);
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(
        orders
            .count_documents(doc! {"customerId": "cust-hot"})
            .await
            .unwrap(),
        6
    );

    // A find with a filter, a sort, a projection, skip and limit, over several batches.
    let found = orders
        .find(doc! {"customerId": "cust-hot", "total": {"$gte": 20}})
        .with_options(
            FindOptions::builder()
                .sort(doc! {"total": -1})
                .projection(doc! {"total": 1})
                .skip(1)
                .batch_size(2)
                .build(),
        )
        .await
        .unwrap();
    let docs: Vec<Document> = found.try_collect().await.unwrap();
    assert_eq!(
        docs,
        vec![
            doc! {"_id": 5_i64, "total": 50},
            doc! {"_id": 4_i64, "total": 40},
            doc! {"_id": 3_i64, "total": 30},
            doc! {"_id": 2_i64, "total": 20},
        ]
    );

    // Move to the backfill: the hot customer's documents are still in the source layout.
    front.advance(&world, &TO_BACKFILL).await;

    // An update by filter takes the document to the target; the source's image, which
    // matched `total: 30`, is superseded and must not appear any more.
    let r = orders
        .update_one(
            doc! {"customerId": "cust-hot", "total": 30},
            doc! {"$set": {"total": 31}},
        )
        .await
        .unwrap();
    assert_eq!((r.matched_count, r.modified_count), (1, 1));
    let stale = orders
        .find(doc! {"customerId": "cust-hot", "total": 30})
        .await
        .unwrap();
    assert_eq!(
        ids(stale).await,
        Vec::<i64>::new(),
        "a superseded source image was returned"
    );
    let fresh = orders
        .find(doc! {"customerId": "cust-hot", "total": 31})
        .await
        .unwrap();
    assert_eq!(ids(fresh).await, vec![3]);

    // A delete leaves a tombstone in the target: the source copy is not read.
    let d = orders
        .delete_one(doc! {"customerId": "cust-hot", "_id": 4_i64})
        .await
        .unwrap();
    assert_eq!(d.deleted_count, 1);
    let all = orders
        .find(doc! {"customerId": "cust-hot"})
        .sort(doc! {"_id": 1})
        .await
        .unwrap();
    assert_eq!(ids(all).await, vec![1, 2, 3, 5, 6]);
    assert_eq!(
        orders
            .count_documents(doc! {"customerId": "cust-hot"})
            .await
            .unwrap(),
        5
    );

    // updateMany over documents of both layouts, then an upsert.
    let many = orders
        .update_many(
            doc! {"customerId": "cust-hot", "total": {"$lt": 40}},
            doc! {"$inc": {"total": 1}},
        )
        .await
        .unwrap();
    assert_eq!(many.matched_count, 3);
    let up = orders
        .update_one(
            doc! {"customerId": "cust-hot", "_id": 9_i64},
            doc! {"$set": {"total": 90}},
        )
        .upsert(true)
        .await
        .unwrap();
    assert_eq!(up.upserted_id, Some(Bson::Int64(9)));
    let totals: Vec<Document> = orders
        .find(doc! {"customerId": "cust-hot"})
        .sort(doc! {"_id": 1})
        .projection(doc! {"_id": 0, "total": 1})
        .await
        .unwrap()
        .try_collect()
        .await
        .unwrap();
    let totals: Vec<i32> = totals.iter().map(|d| d.get_i32("total").unwrap()).collect();
    assert_eq!(totals, vec![11, 21, 32, 50, 60, 90]);

    // findOneAndUpdate as a queue: two takers never get the same item.
    let take = || {
        orders.find_one_and_update(
            doc! {"customerId": "cust-hot", "state": "ready"},
            doc! {"$set": {"state": "taken"}},
        )
    };
    let (a, b) = tokio::join!(take().sort(doc! {"_id": 1}), take().sort(doc! {"_id": 1}));
    let (a, b) = (a.unwrap().unwrap(), b.unwrap().unwrap());
    assert_ne!(a.get_i64("_id").unwrap(), b.get_i64("_id").unwrap());
    assert_eq!(
        a.get_str("state").unwrap(),
        "ready",
        "the image before, by default"
    );
    let taken = orders
        .count_documents(doc! {"customerId": "cust-hot", "state": "taken"})
        .await
        .unwrap();
    assert_eq!(taken, 2);

    // distinct and an aggregation on the merged documents.
    let states = orders
        .distinct("state", doc! {"customerId": "cust-hot"})
        .await
        .unwrap();
    assert_eq!(states, vec![Bson::from("ready"), Bson::from("taken")]);
    let sums: Vec<Document> = orders
        .aggregate(vec![
            doc! {"$match": {"customerId": "cust-hot"}},
            doc! {"$group": {"_id": "$state", "n": {"$sum": 1}}},
            doc! {"$sort": {"_id": 1}},
        ])
        .await
        .unwrap()
        .try_collect()
        .await
        .unwrap();
    // The upserted order has no state: MongoDB groups it under null.
    assert_eq!(
        sums,
        vec![
            doc! {"_id": Bson::Null, "n": 1},
            doc! {"_id": "ready", "n": 3},
            doc! {"_id": "taken", "n": 2}
        ]
    );

    // The refused forms, with their codes.
    let no_tenant = orders.find(doc! {"total": 50}).await.unwrap_err();
    assert_eq!(code_of(&no_tenant), 61, "{no_tenant}");
    let lookup = orders
        .aggregate(vec![
            doc! {"$match": {"customerId": "cust-hot"}},
            doc! {"$lookup": {"from": "x", "as": "y", "localField": "a", "foreignField": "b"}},
        ])
        .await
        .unwrap_err();
    assert_eq!(code_of(&lookup), 238, "{lookup}");
    let watch = orders.watch().await.unwrap_err();
    assert_eq!(code_of(&watch), 115, "{watch}");

    front.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_the_front_does_not_route_goes_to_the_passthrough_location() {
    let world = World::start().await;
    let passthrough = Passthrough::connect(&world.server.uri()).await.unwrap();
    let front = RoutedFront::start_with(&world, "front test", Some(passthrough)).await;
    let client = front.client().await;
    let shop = client.database("shop");
    let events = shop.collection::<Document>("events");

    // A collection without a routing version, read back over several batches.
    let docs: Vec<Document> = (0..25)
        .map(|i| doc! {"_id": i, "kind": if i % 2 == 0 { "a" } else { "b" }})
        .collect();
    events.insert_many(docs).await.unwrap();
    let read = events
        .find(doc! {})
        .sort(doc! {"_id": 1})
        .batch_size(4)
        .await
        .unwrap();
    let read: Vec<Document> = read.try_collect().await.unwrap();
    assert_eq!(read.len(), 25);
    assert_eq!(
        events.count_documents(doc! {"kind": "a"}).await.unwrap(),
        13
    );
    let r = events
        .update_many(doc! {"kind": "b"}, doc! {"$set": {"seen": true}})
        .await
        .unwrap();
    assert_eq!(r.modified_count, 12);
    // It is where the passthrough location holds it, not on a shard.
    let direct = world
        .server
        .client()
        .await
        .database("shop")
        .collection::<Document>("events");
    assert_eq!(
        direct.count_documents(doc! {"seen": true}).await.unwrap(),
        12
    );
    // Another database, and a command the front has no handler for.
    let other = client.database("analytics").collection::<Document>("hits");
    other.insert_one(doc! {"_id": 1}).await.unwrap();
    assert_eq!(other.count_documents(doc! {}).await.unwrap(), 1);
    let stats = shop.run_command(doc! {"dbStats": 1}).await.unwrap();
    assert!(stats.get("ok").is_some(), "{stats}");

    // The listings show the routed collection beside the passthrough's.
    let names = shop.list_collection_names().await.unwrap();
    assert!(
        names.contains(&"events".to_owned()) && names.contains(&"orders".to_owned()),
        "{names:?}"
    );
    let databases = client.list_database_names().await.unwrap();
    assert!(databases.contains(&"shop".to_owned()), "{databases:?}");

    // The routed collection still goes through its router, and what could reach its
    // documents past the router is refused.
    let orders = shop.collection::<Document>("orders");
    orders
        .insert_one(order(1, "cust-a", 10, "ready"))
        .await
        .unwrap();
    let direct_orders = world
        .server
        .client()
        .await
        .database("shop")
        .collection::<Document>("orders");
    assert_eq!(direct_orders.count_documents(doc! {}).await.unwrap(), 0);
    let drop = orders.drop().await.unwrap_err();
    assert_eq!(code_of(&drop), 115, "{drop}");
    let coll_mod = shop
        .run_command(doc! {"collMod": "orders"})
        .await
        .unwrap_err();
    assert_eq!(code_of(&coll_mod), 115, "{coll_mod}");
    let drop_db = shop.drop().await.unwrap_err();
    assert_eq!(code_of(&drop_db), 115, "{drop_db}");
    front.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rolling_back_reads_and_writes_go_on_and_a_cursor_the_switch_outdates_is_killed() {
    let world = World::start().await;
    let front = RoutedFront::start(&world, "front test").await;
    let client = front.client().await;
    let orders = client.database("shop").collection::<Document>("orders");
    let docs: Vec<Document> = (1..=6)
        .map(|i| order(i, "cust-hot", i as i32, "ready"))
        .collect();
    orders.insert_many(docs).await.unwrap();
    front.advance(&world, &TO_BACKFILL).await;
    orders
        .update_one(
            doc! {"customerId": "cust-hot", "_id": 2_i64},
            doc! {"$set": {"total": 20}},
        )
        .await
        .unwrap();

    // Rolling back: writes go to the target and are mirrored; reads merge as before.
    let routers = front.routers().await;
    let refs: Vec<&Router> = routers.iter().collect();
    let t = world
        .store
        .transition(
            world.migration,
            &reshard::phase::Action::Advance(Phase::Reverting),
            "test",
            None,
            false,
        )
        .await
        .unwrap();
    assert_eq!(t.migration.phase(), Phase::Reverting);
    for r in &refs {
        assert!(
            r.wait_for_epoch(t.migration.epoch, Duration::from_secs(10))
                .await
        );
    }
    orders
        .update_one(
            doc! {"customerId": "cust-hot", "_id": 3_i64},
            doc! {"$set": {"total": 30}},
        )
        .await
        .unwrap();
    let totals: Vec<Document> = orders
        .find(doc! {"customerId": "cust-hot", "total": {"$gte": 5}})
        .sort(doc! {"_id": 1})
        .await
        .unwrap()
        .try_collect()
        .await
        .unwrap();
    let ids: Vec<i64> = totals.iter().map(|d| d.get_i64("_id").unwrap()).collect();
    assert_eq!(ids, vec![2, 3, 5, 6]);

    // A cursor opened while reverting, and the switch of reads back to the source: its next
    // batch is refused (QueryPlanKilled), and a new read waits out the switch and fails by
    // the hold timeout as a retryable time limit.
    let mut open = orders
        .find(doc! {"customerId": "cust-hot"})
        .sort(doc! {"_id": 1})
        .batch_size(2)
        .await
        .unwrap();
    assert!(open.advance().await.unwrap());
    world.force_phase(&refs, Phase::RevertSwitch).await;
    let mut failure = None;
    for _ in 0..3 {
        match open.advance().await {
            Ok(true) => continue,
            Ok(false) => break,
            Err(e) => {
                failure = Some(e);
                break;
            }
        }
    }
    let failure = failure.expect("the outdated cursor fails");
    assert_eq!(code_of(&failure), 175, "{failure}");
    let held = orders
        .find(doc! {"customerId": "cust-hot"})
        .await
        .unwrap_err();
    assert_eq!(code_of(&held), 262, "{held}");
    // A read of one document by its id goes on in the switch (the router mirrors, then reads).
    let one = orders
        .find_one(doc! {"customerId": "cust-hot", "_id": 3_i64})
        .await
        .unwrap()
        .unwrap();
    assert_eq!(one.get_i32("total").unwrap(), 30);
    front.stop().await;
}

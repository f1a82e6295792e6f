//! Tenant listings page across `_id` type brackets (issue 10): a tenant whose ids mix numbers,
//! strings, binary data and ObjectIds lists every document once, in MongoDB's order, whatever
//! the page size, in every phase and on both read paths.
//!
//! Randomised: the seed is printed; `RESHARD_TEST_SEED=<n>` replays it.

mod support;

use std::collections::BTreeSet;
use std::time::Duration;

use mongodb::bson::oid::ObjectId;
use mongodb::bson::spec::BinarySubtype;
use mongodb::bson::{doc, Binary, Bson, Document};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use reshard::ids;
use reshard::phase::Phase;
use reshard::router::{Router, RouterConfig};
use reshard::routing::{KeyValue, RoutingVersion};
use support::World;

/// A hot tenant (16 buckets in version 2) and an ordinary one.
const TENANTS: [&str; 2] = ["cust-hot", "cust-7"];

fn config(name: &str) -> RouterConfig {
    let mut c = RouterConfig::named(name);
    c.heartbeat_interval = Duration::from_millis(200);
    c.lease_ttl = Duration::from_secs(3);
    c.write_concern = mongodb::options::WriteConcern::nodes(1);
    c
}

fn seed() -> u64 {
    let seed = std::env::var("RESHARD_TEST_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| rand::thread_rng().gen());
    eprintln!("listing seed: {seed} (replay with RESHARD_TEST_SEED={seed})");
    seed
}

/// The collection where `version` places the document.
fn coll(w: &World, v: &RoutingVersion, tenant: &str, id: &Bson) -> mongodb::Collection<Document> {
    let l = &v
        .locate(
            &KeyValue::String(tenant.into()),
            &KeyValue::from_bson(id).unwrap(),
        )
        .unwrap()
        .locations[0];
    w.shards[&l.shard].collection(&l.collection)
}

/// Puts a document where the source version places it, as the application had it.
async fn seed_source(w: &World, tenant: &str, id: &Bson) {
    coll(w, &w.v1, tenant, id)
        .insert_one(doc! { "_id": id.clone(), "customerId": tenant, "total": 1 })
        .await
        .unwrap();
}

/// The backfill's write for one document: insert-if-absent of a pristine copy.
async fn copy(w: &World, tenant: &str, id: &Bson) {
    let Some(mut d) = coll(w, &w.v1, tenant, id)
        .find_one(doc! { "_id": id.clone() })
        .await
        .unwrap()
    else {
        return;
    };
    let located =
        w.v2.locate(
            &KeyValue::String(tenant.into()),
            &KeyValue::from_bson(id).unwrap(),
        )
        .unwrap();
    d.insert("bucket", located.sub_bucket as i32);
    d.insert("_reshard", doc! { "src": "copy", "epoch": 0, "rev": 0 });
    if let Err(e) = coll(w, &w.v2, tenant, id).insert_one(d).await {
        assert!(reshard::router::is_duplicate_key(&e), "copy failed: {e}");
    }
}

/// Every page of `tenant`'s listing with page sizes drawn from `sizes`, concatenated.
async fn list_in_pages(
    router: &Router,
    tenant: &str,
    mut sizes: impl FnMut() -> usize,
) -> Vec<Bson> {
    let mut out = Vec::new();
    let mut after: Option<Bson> = None;
    loop {
        let page = router
            .list_tenant(tenant, after.clone(), sizes())
            .await
            .unwrap();
        out.extend(page.documents.iter().map(|d| d.get("_id").unwrap().clone()));
        match page.next {
            Some(next) => after = Some(next),
            None => return out,
        }
        assert!(out.len() < 10_000, "the listing does not end");
    }
}

/// Random ids of every routable kind, distinct as MongoDB compares them (`5`, `5_i64` and
/// `5.0` are one value).
fn random_ids(rng: &mut StdRng, n: usize, taken: &mut BTreeSet<Vec<u8>>) -> Vec<Bson> {
    let mut out = Vec::new();
    while out.len() < n {
        let id = match rng.gen_range(0..7) {
            0 => Bson::Int32(rng.gen_range(-1_000..1_000)),
            1 => Bson::Int64(rng.gen_range(-(1_i64 << 60)..(1_i64 << 60))),
            2 => Bson::Double(f64::from(rng.gen_range(-1_000..1_000))),
            3 => Bson::String(format!("o-{}", rng.gen_range(0..100_000))),
            4 => Bson::ObjectId(ObjectId::from_bytes(rng.gen())),
            5 => Bson::Binary(Binary {
                subtype: BinarySubtype::Generic,
                bytes: binary_bytes(rng, false),
            }),
            _ => Bson::Binary(Binary {
                subtype: BinarySubtype::Uuid,
                bytes: binary_bytes(rng, true),
            }),
        };
        // One key per MongoDB value: numbers by value, the rest by their encoding.
        let key = match KeyValue::from_bson(&id).unwrap() {
            KeyValue::Int(v) => format!("n{v}").into_bytes(),
            _ => ids::encode(&id),
        };
        if taken.insert(key) {
            out.push(id);
        }
    }
    out
}

/// Bytes of a binary id. MongoDB orders binary data by length, then subtype, then bytes, in
/// sorts and in `$gt` alike. The local MongoDB-wire servers sort that way but compare by bytes
/// alone in `$gt` (a stand-in quirk, docs/decisions/0026-cursors-continue-across-id-type-brackets.md), so there the ids keep the two orders
/// equal: 16 bytes each, generic ones below 0x80 and UUIDs from 0x80. On real MongoDB
/// (`--features containers`) lengths and bytes are random.
fn binary_bytes(rng: &mut StdRng, uuid: bool) -> Vec<u8> {
    let mut bytes: Vec<u8> = if cfg!(feature = "containers") && !uuid {
        (0..rng.gen_range(1..20)).map(|_| rng.gen()).collect()
    } else {
        rng.gen::<[u8; 16]>().to_vec()
    };
    if !cfg!(feature = "containers") {
        bytes[0] = if uuid {
            bytes[0] | 0x80
        } else {
            bytes[0] & 0x7f
        };
    }
    bytes
}

fn sorted(mut v: Vec<Bson>) -> Vec<Bson> {
    v.sort_by(ids::compare);
    v
}

/// The reproduction: `7`, `"b-7"` and an ObjectId, listed one per page.
#[tokio::test]
async fn pages_of_one_continue_across_id_types_in_every_phase() {
    let w = World::start().await;
    let tenant = "cust-7";
    let oid = Bson::ObjectId(ObjectId::from_bytes([7; 12]));
    let ids = [Bson::Int32(7), Bson::String("b-7".into()), oid];
    for id in &ids {
        seed_source(&w, tenant, id).await;
    }
    let router = Router::with_shards(w.store.clone(), "orders", config("api"), w.shards.clone())
        .await
        .unwrap();
    for phase in phases() {
        move_to(
            &w,
            &router,
            phase,
            &ids.iter().map(|i| (tenant, i.clone())).collect::<Vec<_>>(),
        )
        .await;
        let whole = router.list_tenant(tenant, None, 10).await.unwrap();
        assert_eq!(whole.documents.len(), 3, "{phase:?}");
        let paged = list_in_pages(&router, tenant, || 1).await;
        assert_eq!(paged, ids.to_vec(), "{phase:?}: pages of one");
    }
    router.shutdown().await;
}

/// Random tenants with random mixes of id types, random page sizes: the pages, concatenated,
/// are the whole listing, in every phase.
#[tokio::test]
async fn random_pages_concatenate_to_the_whole_listing_in_every_phase() {
    let mut rng = StdRng::seed_from_u64(seed());
    let w = World::start().await;
    let router = Router::with_shards(w.store.clone(), "orders", config("api"), w.shards.clone())
        .await
        .unwrap();
    let mut taken = BTreeSet::new();
    let mut live: Vec<(&'static str, Vec<Bson>)> = Vec::new();
    let mut old: Vec<(&'static str, Bson)> = Vec::new();
    for tenant in TENANTS {
        let ids = random_ids(&mut rng, 24, &mut taken);
        for id in &ids {
            seed_source(&w, tenant, id).await;
            old.push((tenant, id.clone()));
        }
        live.push((tenant, ids));
    }
    for phase in phases() {
        move_to(&w, &router, phase, &old).await;
        // Writes of this phase: new documents on its write path, and deletes.
        for (tenant, ids) in live.iter_mut() {
            if phase.write_path() != reshard::phase::WritePath::Held {
                for id in random_ids(&mut rng, 4, &mut taken) {
                    router
                        .insert(doc! { "_id": id.clone(), "customerId": *tenant, "total": 2 })
                        .await
                        .unwrap();
                    if phase.write_path() == reshard::phase::WritePath::Source {
                        old.push((tenant, id.clone()));
                    }
                    ids.push(id);
                }
                let gone = ids.remove(rng.gen_range(0..ids.len()));
                assert!(router.delete(*tenant, gone).await.unwrap(), "{phase:?}");
            }
            let expected = sorted(ids.clone());
            let whole = list_in_pages(&router, tenant, || 1000).await;
            assert_eq!(whole, expected, "{phase:?}: the whole listing of {tenant}");
            for _ in 0..3 {
                let max = rng.gen_range(1..8);
                let mut sizes = StdRng::seed_from_u64(rng.gen());
                let paged = list_in_pages(&router, tenant, || sizes.gen_range(1..=max)).await;
                assert_eq!(
                    paged, expected,
                    "{phase:?}: pages of up to {max} of {tenant}"
                );
            }
        }
    }
    router.shutdown().await;
}

/// The phases a listing is checked in: both read paths and every mix of where documents are.
fn phases() -> [Phase; 7] {
    [
        Phase::Planned,
        Phase::DualRead,
        Phase::NewWrites,
        Phase::Backfill,
        Phase::Reconcile,
        Phase::NewReads,
        Phase::Cleanup,
    ]
}

/// Moves the migration to `phase` as its driver would; before the phases that read the target
/// alone, copies every old document (what the backfill's gate guarantees), and in `backfill`
/// half of them.
async fn move_to(w: &World, router: &Router, phase: Phase, old: &[(&str, Bson)]) {
    let current = w.store.migration(w.migration).await.unwrap().phase();
    if current == phase {
        return;
    }
    match phase {
        Phase::DualRead => w.advance(&[router], &[Phase::DualRead]).await,
        Phase::NewWrites => {
            w.advance(&[router], &[Phase::WriteSwitch, Phase::NewWrites])
                .await
        }
        Phase::Backfill => {
            w.advance(&[router], &[Phase::Backfill]).await;
            for (tenant, id) in old.iter().step_by(2) {
                copy(w, tenant, id).await;
            }
        }
        Phase::Reconcile | Phase::NewReads | Phase::Cleanup => {
            for (tenant, id) in old {
                copy(w, tenant, id).await;
            }
            w.force_phase(&[router], phase).await;
        }
        other => panic!("no way to {other:?} here"),
    }
}

/// Partitions are ranges across every `_id` type (issue 16): cut at the quantiles of a random
/// sample of a collection whose ids have every type, routable or not, the partitions' scans,
/// whole or resumed after any id they returned, meet every document exactly once, in order.
#[tokio::test]
async fn partition_ranges_across_types_meet_every_document_once() {
    use reshard::ids::IdRange;
    use reshard::worker::plan;
    let mut rng = StdRng::seed_from_u64(seed());
    let w = World::start().await;
    let coll = w.shards["s1"].collection::<Document>("ranges");
    let mut taken = BTreeSet::new();
    let mut all = random_ids(&mut rng, 120, &mut taken);
    all.extend([
        Bson::MinKey,
        Bson::Null,
        Bson::Double(f64::NAN),
        Bson::Document(doc! { "a": 1 }),
        Bson::Boolean(false),
        Bson::Boolean(true),
        Bson::DateTime(mongodb::bson::DateTime::from_millis(5)),
        Bson::Timestamp(mongodb::bson::Timestamp {
            time: 1,
            increment: 1,
        }),
        Bson::MaxKey,
    ]);
    for id in &all {
        coll.insert_one(doc! { "_id": id.clone() }).await.unwrap();
    }
    let read = |filter: Document| {
        let coll = coll.clone();
        async move {
            let docs: Vec<Document> = futures::TryStreamExt::try_collect(
                coll.find(filter).sort(doc! { "_id": 1 }).await.unwrap(),
            )
            .await
            .unwrap();
            docs.into_iter()
                .map(|d| d.get("_id").unwrap().clone())
                .collect::<Vec<Bson>>()
        }
    };
    let everything = read(Document::new()).await;
    assert_eq!(everything.len(), all.len());
    let location = reshard::routing::Location::new("s1", "ranges");
    for _ in 0..6 {
        let parts = rng.gen_range(1..8);
        let sample: Vec<Bson> = all.iter().filter(|_| rng.gen_bool(0.3)).cloned().collect();
        let partitions = plan::partitions_of(&location, sample, all.len() as u64, parts, None);
        let mut met = Vec::new();
        for p in &partitions {
            let d = |b: &Option<Vec<u8>>| b.as_deref().map(|b| ids::decode(b).unwrap());
            let range = IdRange::of_type(&p.id_type, d(&p.lower_bound), d(&p.upper_bound)).unwrap();
            let whole = read(range.filter(None)).await;
            for id in &whole {
                assert!(
                    range.contains(id),
                    "{id} read from {range:?}, which does not hold it"
                );
            }
            if !whole.is_empty() {
                let k = rng.gen_range(0..whole.len());
                let rest = read(range.filter(Some(&whole[k]))).await;
                assert_eq!(
                    encoded(&rest),
                    encoded(&whole[k + 1..]),
                    "resumed after {} in {range:?}",
                    whole[k]
                );
            }
            met.extend(whole);
        }
        assert_eq!(
            encoded(&met),
            encoded(&everything),
            "the {} partitions' scans, one after another, are the whole collection in order",
            partitions.len()
        );
    }
}

/// Ids as bytes, so that a NaN equals itself.
fn encoded(ids: &[Bson]) -> Vec<Vec<u8>> {
    ids.iter().map(ids::encode).collect()
}

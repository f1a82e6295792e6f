//! What leaving `planned` makes of the source's collection options, on real servers: the
//! options MongoDB lets a collection be created with are carried to the target collections,
//! a target that exists is checked against the source, and a migration whose source has
//! options reshard cannot carry is refused by `migration advance --to dual_read` (exit 2,
//! dry run or not) before anything is created. `collection_options`' unit tests decide every
//! option by value; these show the decision reaching the servers and the operator.
//!
//! What the local stand-in (SecantusDB) cannot show:
//! - what a collation does: it stores and lists a collation but compares strings bytewise
//!   (a unique index with `strength: 2` takes "abc" and "ABC"), so these tests show that the
//!   target gets the source's collation, not that it compares alike. It also lists a collation
//!   as it was given, where MongoDB lists every field with its default written out.
//! - a time-series collection as MongoDB lists it: SecantusDB lists `type: "collection"` with
//!   the `timeseries` option (MongoDB: `type: "timeseries"`) and keeps no buckets; the refusal
//!   here goes by the option, the unit tests cover the type.
//! - clustered collections' expiry, pre- and post-images in change streams, and storage
//!   engine options are listed as given and not applied; the unit tests cover their carrying.

mod support;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Output;

use mongodb::bson::{doc, Bson, Document};
use mongodb::Database;
use serde_json::Value;
use support::{MongoServer, PgDb};

/// A planned migration of `orders` from the fixtures' v1 (s1..s3/orders) to v2 (s1..s3/orders
/// and s4/orders_v2), its shards' databases on the shared server.
struct Planned {
    pg: PgDb,
    id: String,
    shards: BTreeMap<String, Database>,
}

/// The collections a test makes before planning: shard, collection, `create` options.
type Setup = Vec<(&'static str, &'static str, Document)>;

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/versions")
        .join(name)
}

fn reshard(pg: &PgDb, args: &[&str]) -> Output {
    support::bin(pg).args(args).output().unwrap()
}

fn json(pg: &PgDb, args: &[&str]) -> Value {
    let mut all = args.to_vec();
    all.extend(["--output", "json"]);
    let out = reshard(pg, &all);
    assert!(out.status.success(), "reshard {args:?}: {}", stderr(&out));
    serde_json::from_slice(&out.stdout).unwrap()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Makes the collections of `setup` (shard, collection, `create` options), then plans the
/// migration through the command line.
async fn planned(setup: &[(&'static str, &'static str, Document)]) -> Planned {
    let server = MongoServer::shared().await;
    let client = server.client().await;
    let base = MongoServer::database_name();
    let pg = PgDb::fresh().await;
    json(&pg, &["db", "migrate"]);
    let mut shards = BTreeMap::new();
    for name in ["s1", "s2", "s3", "s4"] {
        let database = format!("{base}_{name}");
        json(
            &pg,
            &[
                "shard",
                "add",
                name,
                "--uri",
                &server.uri(),
                "--database",
                &database,
            ],
        );
        shards.insert(name.to_owned(), client.database(&database));
    }
    for (shard, collection, options) in setup {
        let mut create = doc! { "create": *collection };
        create.extend(options.clone());
        shards[*shard]
            .run_command(create)
            .await
            .unwrap_or_else(|e| panic!("creating {shard}/{collection}: {e}"));
    }
    for file in ["orders_v1.yaml", "orders_v2.yaml"] {
        let path = fixture(file);
        json(
            &pg,
            &[
                "version",
                "create",
                "--collection",
                "orders",
                "--file",
                path.to_str().unwrap(),
            ],
        );
    }
    let m = json(
        &pg,
        &["migration", "create", "--collection", "orders", "--to", "2"],
    );
    Planned {
        pg,
        id: m["id"].as_i64().unwrap().to_string(),
        shards,
    }
}

/// The `listCollections` entry of `collection`, if it exists.
async fn listing(db: &Database, collection: &str) -> Option<Document> {
    let reply = db
        .run_command(doc! { "listCollections": 1, "filter": { "name": collection } })
        .await
        .unwrap();
    reply
        .get_document("cursor")
        .unwrap()
        .get_array("firstBatch")
        .unwrap()
        .first()
        .map(|e| e.as_document().unwrap().clone())
}

fn on_every_source(options: &Document) -> Setup {
    ["s1", "s2", "s3"]
        .map(|s| (s, "orders", options.clone()))
        .to_vec()
}

fn orders_v2() -> reshard::routing::RoutingVersion {
    let text = std::fs::read_to_string(fixture("orders_v2.yaml")).unwrap();
    reshard::spec::parse_version_spec("orders_v2.yaml", &text, "orders").unwrap()
}

/// Regression (issue 29, item 8): the target collections were created with the source's
/// indexes only, so the validator, its level and the collation were lost.
#[tokio::test]
async fn a_source_with_a_validator_and_a_collation_gets_targets_with_the_same_options() {
    let options = doc! {
        "validator": { "$jsonSchema": {
            "bsonType": "object",
            "required": ["customerId"],
            "properties": {
                "customerId": { "bsonType": "string" },
                "_reshard": { "bsonType": "object" },
                "bucket": { "bsonType": "int" },
            },
        } },
        "validationLevel": "moderate",
        "validationAction": "error",
        "collation": { "locale": "fr", "strength": 2 },
        "changeStreamPreAndPostImages": { "enabled": true },
    };
    let m = planned(&on_every_source(&options)).await;
    let dry = reshard(
        &m.pg,
        &[
            "migration",
            "advance",
            &m.id,
            "--to",
            "dual_read",
            "--dry-run",
        ],
    );
    assert!(dry.status.success(), "{}", stderr(&dry));
    let out = reshard(&m.pg, &["migration", "advance", &m.id, "--to", "dual_read"]);
    assert!(out.status.success(), "{}", stderr(&out));

    let target = listing(&m.shards["s4"], "orders_v2")
        .await
        .expect("s4/orders_v2 was created");
    assert_eq!(target.get_str("type").unwrap(), "collection");
    assert_eq!(target.get_document("options").unwrap(), &options);

    // The validator holds on the target as on the source: the application's document without
    // its tenant is refused, reshard's own copies and tombstones are not.
    let orders = m.shards["s4"].collection::<Document>("orders_v2");
    let refused = orders
        .insert_one(doc! { "_id": 1, "total": 5 })
        .await
        .expect_err("the target's validator refuses a document without customerId");
    assert!(
        matches!(
            &*refused.kind,
            mongodb::error::ErrorKind::Write(mongodb::error::WriteFailure::WriteError(w))
                if w.code == 121
        ),
        "{refused}"
    );
    let v2 = orders_v2();
    let copy = reshard::envelope::copy(doc! { "_id": 2, "customerId": "c1" }, &v2, 3, 2);
    let tombstone = reshard::envelope::tombstone(&Bson::Int32(3), &Bson::from("c1"), &v2, 3, 2, 1);
    orders.insert_many([copy, tombstone]).await.unwrap();
}

/// Regression (issue 29, item 8): each of these sources was accepted and its targets created
/// as plain collections.
#[tokio::test]
async fn migrations_whose_options_cannot_be_carried_exit_2_say_why_and_create_nothing() {
    let fr = doc! { "collation": { "locale": "fr", "strength": 2 } };
    let closed = doc! { "validator": { "$jsonSchema": {
        "bsonType": "object",
        "additionalProperties": false,
        "properties": { "_id": {}, "customerId": {}, "total": {} },
    } } };
    let capped = doc! { "capped": true, "size": 65536 };
    let timeseries = doc! { "timeseries": { "timeField": "at", "metaField": "customerId" } };
    let cases: Vec<(&str, Setup, Vec<&str>)> = vec![
        (
            "capped",
            vec![
                ("s1", "orders", capped),
                ("s2", "orders", doc! {}),
                ("s3", "orders", doc! {}),
            ],
            vec![
                "s1/orders is a capped collection: once full it evicts its oldest documents",
                "and advance again",
            ],
        ),
        (
            "time series",
            vec![
                ("s1", "orders", doc! {}),
                ("s2", "orders", timeseries),
                ("s3", "orders", doc! {}),
            ],
            vec!["s2/orders is a time-series collection: MongoDB keeps its documents in buckets"],
        ),
        (
            "view",
            vec![
                ("s1", "orders_raw", doc! {}),
                (
                    "s1",
                    "orders",
                    doc! { "viewOn": "orders_raw", "pipeline": [] },
                ),
                ("s2", "orders", doc! {}),
                ("s3", "orders", doc! {}),
            ],
            vec!["s1/orders is a view (of \"orders_raw\"): it holds no documents of its own"],
        ),
        (
            "a schema without reshard's fields",
            on_every_source(&closed),
            vec![
                "s1/orders, s2/orders, s3/orders: the validator would refuse reshard's copies",
                "(additionalProperties: false), and `_reshard` and `bucket` are not among them",
                "_reshard: {bsonType: \"object\"} and bucket: {bsonType: \"int\"}",
            ],
        ),
        (
            "sources that differ",
            vec![
                ("s1", "orders", fr.clone()),
                ("s2", "orders", fr.clone()),
                ("s3", "orders", doc! {}),
            ],
            vec![
                "the source locations differ in \"collation\": s1/orders has { \"locale\": \
                 \"fr\", \"strength\": 2 }, s3/orders has none",
            ],
        ),
        (
            "a target with another collation",
            [
                on_every_source(&fr),
                vec![("s4", "orders_v2", doc! { "collation": { "locale": "en" } })],
            ]
            .concat(),
            vec![
                "s4/orders_v2 exists with \"collation\" { \"locale\": \"en\" }, and the source \
                 (s1/orders) has { \"locale\": \"fr\", \"strength\": 2 }",
                "compare strings differently, in queries, sorts and unique indexes",
            ],
        ),
    ];
    for (case, setup, expected) in cases {
        let m = planned(&setup).await;
        let target_before = listing(&m.shards["s4"], "orders_v2").await;
        for dry_run in [true, false] {
            let mut args = vec!["migration", "advance", &m.id, "--to", "dual_read"];
            if dry_run {
                args.push("--dry-run");
            }
            let out = reshard(&m.pg, &args);
            let text = stderr(&out);
            assert_eq!(out.status.code(), Some(2), "{case}: {text}");
            assert!(
                text.contains(&format!("migration {} cannot leave planned", m.id)),
                "{case}: {text}"
            );
            for fragment in &expected {
                assert!(
                    text.contains(fragment),
                    "{case}: {fragment:?} not in {text}"
                );
            }
        }
        assert_eq!(
            listing(&m.shards["s4"], "orders_v2").await,
            target_before,
            "{case}: the target was created or changed"
        );
        let shown = json(&m.pg, &["migration", "show", &m.id]);
        assert_eq!(shown["phase"], "planned", "{case}");
        let history = json(&m.pg, &["migration", "history", &m.id]);
        let kinds: Vec<&str> = history
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["kind"].as_str().unwrap())
            .collect();
        assert_eq!(kinds, ["create", "prepare_failed"], "{case}");
    }
}

/// A target the operator made is kept once its options are the source's, indexes added.
#[tokio::test]
async fn an_existing_target_is_kept_once_it_matches_the_source() {
    let fr = doc! { "collation": { "locale": "fr", "strength": 2 } };
    let m = planned(
        &[
            on_every_source(&fr),
            vec![("s4", "orders_v2", doc! { "collation": { "locale": "en" } })],
        ]
        .concat(),
    )
    .await;
    m.shards["s1"]
        .run_command(doc! {
            "createIndexes": "orders",
            "indexes": [{ "key": { "customerId": 1, "at": -1 }, "name": "by_customer" }],
        })
        .await
        .unwrap();
    let advance = || reshard(&m.pg, &["migration", "advance", &m.id, "--to", "dual_read"]);
    assert_eq!(advance().status.code(), Some(2));

    // The operator's remedy: the target made again as the source is.
    m.shards["s4"]
        .collection::<Document>("orders_v2")
        .drop()
        .await
        .unwrap();
    m.shards["s4"]
        .run_command(doc! { "create": "orders_v2", "collation": { "locale": "fr", "strength": 2 } })
        .await
        .unwrap();
    let made = listing(&m.shards["s4"], "orders_v2").await.unwrap();
    let out = advance();
    assert!(out.status.success(), "{}", stderr(&out));
    let kept = listing(&m.shards["s4"], "orders_v2").await.unwrap();
    assert_eq!(
        kept.get_document("info").unwrap().get("uuid"),
        made.get_document("info").unwrap().get("uuid"),
        "the target was made again rather than kept"
    );
    let indexes = m.shards["s4"]
        .collection::<Document>("orders_v2")
        .list_index_names()
        .await
        .unwrap();
    assert!(indexes.contains(&"by_customer".to_owned()), "{indexes:?}");
}

//! Conformance of the front's routed collection with MongoDB, through four clients we did not
//! write: pymongo, the Node driver, mongosh and the official Rust driver each run the same
//! scripted workload (tests/clients/conformance_workload.py, conformance_workload.mjs,
//! conformance_mongosh.js, and [`rust_workload`] here) twice: once through the front on the
//! routed `shop.orders`, in the middle of a migration, and once directly against one plain
//! SecantusDB collection holding the same documents. Each run prints (or, for the Rust driver,
//! returns) what every step answered as canonical extended JSON, so an int32, an int64 and a
//! double stay apart; the test asserts that a client's two runs answered the same, step by step.
//!
//! The workload: inserts ordered and unordered, each with a duplicate `_id` in the middle (the
//! inserted count and the failed index and code), updates by id, by filter and `updateMany`,
//! upserts (update and replace), `findOneAndUpdate` (document after and before, none, upsert),
//! `findOneAndReplace` (with a projection too), `findOneAndDelete` (sorted too), `deleteOne` and
//! `deleteMany`, finds with filters (`$gt`, `$in`, `$and`, `$ne`, several tenants by `$in`),
//! projections, sorts, skip and limit in batches of two (so `getMore` runs), `countDocuments`
//! (with skip and limit), `distinct`, aggregations (`$match` on the tenant, then `$group` and
//! `$sort`; `$sort` and `$project` in batches of two), and each tenant's documents at the end.
//! The refused forms have no plain-server equivalent; their codes are asserted: a filter
//! without the tenant key (61, ShardKeyNotFound), `$lookup` (238, CommandNotSupported) and a
//! change stream (115); and, from the Rust driver, a document carrying the target's routing
//! field (2, BadValue: reshard derives it, and reads never show it).
//!
//! The world: `orders` routed by `customerId` from version 1 (three shards) to version 2 (four,
//! each client's hot tenant over 16 buckets). Each client has its own tenants (`PREFIX-hot`,
//! `PREFIX-a`, `PREFIX-b`) and ids (`BASE+n`), seeded through the front in the source layout
//! before the migration moves to its backfill. pymongo and the Rust driver then run while the
//! seeded documents are only in the source and their new writes go to the target (reads
//! merge both); a backfill worker then copies the source, and the Node driver and mongosh run
//! with their documents in both layouts.
//!
//! pymongo comes from `<repo>/.venv`, the Node driver and mongosh from
//! `tests/clients/node_modules`: `scripts/install-secantus.sh` installs both; a missing client
//! fails the test.

mod support;

use std::path::PathBuf;
use std::time::Instant;

use futures::TryStreamExt;
use mongodb::bson::{doc, Bson, Document};
use mongodb::error::ErrorKind;
use mongodb::options::ReturnDocument;
use mongodb::{Client, Collection};
use serde_json::Value;
use support::{RoutedFront, World, TO_BACKFILL};

#[path = "support/clients.rs"]
mod clients;
use clients::{root, run_client};

/// The clients: their tenant prefix and the base of their ids.
const PYMONGO: (&str, i32) = ("py", 1000);
const RUST: (&str, i32) = ("rust", 3000);
const NODE: (&str, i32) = ("node", 2000);
const MONGOSH: (&str, i32) = ("sh", 4000);
const CLIENTS: [(&str, i32); 4] = [PYMONGO, RUST, NODE, MONGOSH];

/// Version 2 of the fixtures with every client's hot tenant over 16 buckets.
fn versions() -> (String, String) {
    let dir = root().join("tests/fixtures/versions");
    let v1 = std::fs::read_to_string(dir.join("orders_v1.yaml")).unwrap();
    let v2 = std::fs::read_to_string(dir.join("orders_v2.yaml")).unwrap();
    let hot: String = CLIENTS
        .iter()
        .map(|(prefix, _)| format!("  - tenant: {prefix}-hot\n    buckets: 16\n"))
        .collect();
    let v2 = v2.replace(
        "  - tenant: cust-hot\n    buckets: 16\n",
        &format!("  - tenant: cust-hot\n    buckets: 16\n{hot}"),
    );
    assert!(
        v2.contains("rust-hot"),
        "the fixture's tenant_buckets moved"
    );
    (v1, v2)
}

/// Where a run goes: the URI and the database holding `orders`.
struct Target<'a> {
    uri: &'a str,
    database: &'a str,
    front: bool,
}

/// The documents every client's run starts from: `BASE+1..=BASE+10` of its hot tenant,
/// `BASE+11..=BASE+14` of `PREFIX-a`, `BASE+15..=BASE+16` of `PREFIX-b`.
fn seed(prefix: &str, base: i32) -> Vec<Document> {
    (1..=16)
        .map(|i| {
            let tenant = match i {
                1..=10 => "hot",
                11..=14 => "a",
                _ => "b",
            };
            doc! {
                "_id": base + i,
                "customerId": format!("{prefix}-{tenant}"),
                "total": i * 10,
                "state": if i % 2 == 1 { "ready" } else { "done" },
            }
        })
        .collect()
}

async fn pymongo(target: &Target<'_>) -> Value {
    let (prefix, base) = PYMONGO;
    let base = base.to_string();
    let script = root().join("tests/clients/conformance_workload.py");
    run_client(
        &root().join(".venv/bin/python"),
        &[
            script.to_str().unwrap(),
            target.uri,
            target.database,
            prefix,
            &base,
            mode(target),
        ],
        &[],
        "pymongo in .venv",
    )
    .await
}

async fn node(target: &Target<'_>) -> Value {
    let (prefix, base) = NODE;
    let base = base.to_string();
    let script = root().join("tests/clients/conformance_workload.mjs");
    let node = which("node").unwrap_or_else(|| PathBuf::from("node (Node 20)"));
    run_client(
        &node,
        &[
            script.to_str().unwrap(),
            target.uri,
            target.database,
            prefix,
            &base,
            mode(target),
        ],
        &[],
        "Node 20 and the mongodb driver in tests/clients",
    )
    .await
}

async fn mongosh(target: &Target<'_>) -> Value {
    let (prefix, base) = MONGOSH;
    let base = base.to_string();
    let script = root().join("tests/clients/conformance_mongosh.js");
    run_client(
        &root().join("tests/clients/node_modules/.bin/mongosh"),
        &[
            target.uri,
            "--quiet",
            "--norc",
            "--file",
            script.to_str().unwrap(),
        ],
        &[
            ("CONFORMANCE_DATABASE", target.database),
            ("CONFORMANCE_PREFIX", prefix),
            ("CONFORMANCE_BASE", &base),
            ("CONFORMANCE_MODE", mode(target)),
        ],
        "mongosh in tests/clients",
    )
    .await
}

fn mode(target: &Target<'_>) -> &'static str {
    if target.front {
        "front"
    } else {
        "direct"
    }
}

fn which(program: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|path| {
        std::env::split_paths(&path)
            .map(|dir| dir.join(program))
            .find(|p| p.is_file())
    })
}

/// The MongoDB error code of a failed driver call.
fn code_of(e: &mongodb::error::Error) -> Option<i32> {
    match e.kind.as_ref() {
        ErrorKind::Command(c) => Some(c.code),
        ErrorKind::Write(mongodb::error::WriteFailure::WriteError(w)) => Some(w.code),
        _ => None,
    }
}

fn opt(d: Option<Document>) -> Bson {
    d.map_or(Bson::Null, Bson::Document)
}

fn docs(d: Vec<Document>) -> Bson {
    Bson::Array(d.into_iter().map(Bson::Document).collect())
}

fn counts(r: mongodb::results::UpdateResult) -> Bson {
    Bson::Array(vec![
        Bson::Int64(r.matched_count as i64),
        Bson::Int64(r.modified_count as i64),
        r.upserted_id.unwrap_or(Bson::Null),
    ])
}

/// The workload of the scripts, on the Rust driver. The driver does not say how many
/// documents an insert that failed inserted: the count is of the batch's new ids present
/// afterwards.
async fn rust_workload(target: &Target<'_>) -> Value {
    let (prefix, base) = RUST;
    let (hot, a, b) = (
        format!("{prefix}-hot"),
        format!("{prefix}-a"),
        format!("{prefix}-b"),
    );
    let client = Client::with_uri_str(target.uri).await.unwrap();
    let orders: Collection<Document> = client.database(target.database).collection("orders");
    let order = |n: i32, tenant: &str, total: i32, state: &str| {
        doc! {"_id": base + n, "customerId": tenant, "total": total, "state": state}
    };
    let mut out: Vec<(String, Bson)> = Vec::new();
    let mut step = |name: &str, value: Bson| out.push((name.to_owned(), value));

    let insert_error = |e: mongodb::error::Error, inserted: u64| match e.kind.as_ref() {
        ErrorKind::InsertMany(i) => {
            let errors = i
                .write_errors
                .iter()
                .flatten()
                .map(|w| Bson::Array(vec![Bson::Int64(w.index as i64), Bson::Int32(w.code)]))
                .collect();
            Bson::Document(doc! {"inserted": inserted as i64, "errors": Bson::Array(errors)})
        }
        other => panic!("not an insert error: {other:?}"),
    };
    let present = |ids: Vec<i32>, tenant: String| {
        let orders = orders.clone();
        async move {
            let ids: Vec<i32> = ids.into_iter().map(|n| base + n).collect();
            orders
                .count_documents(doc! {"customerId": tenant, "_id": {"$in": ids}})
                .await
                .unwrap()
        }
    };
    let r = orders
        .insert_many(vec![
            order(101, &hot, 5, "ready"),
            order(102, &hot, 15, "ready"),
            order(1, &hot, 0, "x"),
            order(103, &hot, 25, "ready"),
        ])
        .await;
    let n = present(vec![101, 102, 103], hot.clone()).await;
    step(
        "insert ordered",
        match r {
            Ok(_) => Bson::from("no error"),
            Err(e) => insert_error(e, n),
        },
    );
    let r = orders
        .insert_many(vec![
            order(104, &hot, 35, "ready"),
            order(101, &hot, 0, "x"),
            order(105, &a, 45, "new"),
        ])
        .ordered(false)
        .await;
    let n = present(vec![104], hot.clone()).await + present(vec![105], a.clone()).await;
    step(
        "insert unordered",
        match r {
            Ok(_) => Bson::from("no error"),
            Err(e) => insert_error(e, n),
        },
    );
    let r = orders.insert_one(order(106, &b, 55, "new")).await.unwrap();
    step("insert one", r.inserted_id);

    step(
        "update by id",
        counts(
            orders
                .update_one(
                    doc! {"customerId": &hot, "_id": base + 2},
                    doc! {"$set": {"total": 21}},
                )
                .await
                .unwrap(),
        ),
    );
    step(
        "update by filter",
        counts(
            orders
                .update_one(
                    doc! {"customerId": &hot, "total": {"$gt": 60, "$lt": 75}},
                    doc! {"$set": {"flag": true}},
                )
                .await
                .unwrap(),
        ),
    );
    step(
        "update many",
        counts(
            orders
                .update_many(
                    doc! {"customerId": &hot, "total": {"$gte": 50}},
                    doc! {"$inc": {"total": 1}},
                )
                .await
                .unwrap(),
        ),
    );
    step(
        "update many none",
        counts(
            orders
                .update_many(
                    doc! {"customerId": &a, "state": "nothing"},
                    doc! {"$set": {"x": 1}},
                )
                .await
                .unwrap(),
        ),
    );
    step(
        "upsert new",
        counts(
            orders
                .update_one(
                    doc! {"customerId": &a, "_id": base + 200},
                    doc! {"$set": {"total": 7, "state": "new"}},
                )
                .upsert(true)
                .await
                .unwrap(),
        ),
    );
    step(
        "upsert existing",
        counts(
            orders
                .update_one(
                    doc! {"customerId": &a, "_id": base + 200},
                    doc! {"$inc": {"total": 1}},
                )
                .upsert(true)
                .await
                .unwrap(),
        ),
    );
    step(
        "replace upsert",
        counts(
            orders
                .replace_one(
                    doc! {"customerId": &b, "_id": base + 201},
                    doc! {"customerId": &b, "total": 9, "state": "new"},
                )
                .upsert(true)
                .await
                .unwrap(),
        ),
    );

    step(
        "findOneAndUpdate after",
        opt(orders
            .find_one_and_update(
                doc! {"customerId": &hot, "state": "ready"},
                doc! {"$set": {"state": "taken"}},
            )
            .sort(doc! {"_id": 1})
            .return_document(ReturnDocument::After)
            .await
            .unwrap()),
    );
    step(
        "findOneAndUpdate before",
        opt(orders
            .find_one_and_update(
                doc! {"customerId": &hot, "state": "ready"},
                doc! {"$set": {"state": "taken"}},
            )
            .sort(doc! {"total": -1})
            .return_document(ReturnDocument::Before)
            .await
            .unwrap()),
    );
    step(
        "findOneAndUpdate none",
        opt(orders
            .find_one_and_update(
                doc! {"customerId": &hot, "state": "nothing"},
                doc! {"$set": {"state": "taken"}},
            )
            .await
            .unwrap()),
    );
    step(
        "findOneAndUpdate upsert",
        opt(orders
            .find_one_and_update(
                doc! {"customerId": &b, "_id": base + 202},
                doc! {"$set": {"total": 3}},
            )
            .upsert(true)
            .return_document(ReturnDocument::After)
            .await
            .unwrap()),
    );
    step(
        "findOneAndReplace",
        opt(orders
            .find_one_and_replace(
                doc! {"customerId": &b, "_id": base + 15},
                doc! {"customerId": &b, "total": 0, "state": "replaced"},
            )
            .return_document(ReturnDocument::After)
            .await
            .unwrap()),
    );
    step(
        "findOneAndReplace projection",
        opt(orders
            .find_one_and_replace(
                doc! {"customerId": &a, "_id": base + 12},
                doc! {"customerId": &a, "total": 1, "state": "replaced"},
            )
            .projection(doc! {"total": 1, "_id": 0})
            .await
            .unwrap()),
    );
    step(
        "findOneAndDelete",
        opt(orders
            .find_one_and_delete(doc! {"customerId": &a, "_id": base + 11})
            .await
            .unwrap()),
    );
    step(
        "findOneAndDelete sorted",
        opt(orders
            .find_one_and_delete(doc! {"customerId": &hot, "state": "done"})
            .sort(doc! {"total": 1})
            .await
            .unwrap()),
    );

    let deleted = |r: mongodb::results::DeleteResult| Bson::Int64(r.deleted_count as i64);
    step(
        "deleteOne",
        deleted(
            orders
                .delete_one(doc! {"customerId": &hot, "_id": base + 3})
                .await
                .unwrap(),
        ),
    );
    step(
        "deleteOne none",
        deleted(
            orders
                .delete_one(doc! {"customerId": &hot, "_id": base + 999})
                .await
                .unwrap(),
        ),
    );
    step(
        "deleteMany",
        deleted(
            orders
                .delete_many(doc! {"customerId": &hot, "state": "done", "total": {"$lt": 90}})
                .await
                .unwrap(),
        ),
    );

    let all = |c: mongodb::Cursor<Document>| async move { docs(c.try_collect().await.unwrap()) };
    step(
        "find sorted",
        all(orders
            .find(doc! {"customerId": &hot, "total": {"$gt": 20}})
            .projection(doc! {"total": 1, "state": 1})
            .sort(doc! {"total": -1})
            .skip(1)
            .limit(5)
            .batch_size(2)
            .await
            .unwrap())
        .await,
    );
    step(
        "find $in",
        all(orders
            .find(doc! {"customerId": &hot, "state": {"$in": ["ready", "taken"]}})
            .sort(doc! {"_id": 1})
            .batch_size(2)
            .await
            .unwrap())
        .await,
    );
    step(
        "find tenants",
        all(orders
            .find(doc! {"customerId": {"$in": [&a, &b]}})
            .projection(doc! {"_id": 0, "customerId": 1, "total": 1})
            .sort(doc! {"customerId": 1, "total": -1})
            .batch_size(3)
            .await
            .unwrap())
        .await,
    );
    step(
        "find one",
        opt(orders
            .find_one(doc! {"customerId": &hot, "_id": base + 5})
            .await
            .unwrap()),
    );
    step(
        "find none",
        opt(orders
            .find_one(doc! {"customerId": &hot, "_id": base + 3})
            .await
            .unwrap()),
    );
    step(
        "find and",
        all(orders
            .find(doc! {
                "$and": [{"customerId": &hot}, {"total": {"$lte": 80}}],
                "state": {"$ne": "taken"},
            })
            .sort(doc! {"total": 1, "_id": 1})
            .limit(3)
            .await
            .unwrap())
        .await,
    );

    let count = |n: u64| Bson::Int64(n as i64);
    step(
        "count",
        count(
            orders
                .count_documents(doc! {"customerId": &hot})
                .await
                .unwrap(),
        ),
    );
    step(
        "count filtered",
        count(
            orders
                .count_documents(doc! {"customerId": &hot, "total": {"$lt": 50}})
                .await
                .unwrap(),
        ),
    );
    step(
        "count skip limit",
        count(
            orders
                .count_documents(doc! {"customerId": &hot})
                .skip(2)
                .limit(3)
                .await
                .unwrap(),
        ),
    );
    let mut states = orders
        .distinct("state", doc! {"customerId": &hot})
        .await
        .unwrap();
    states.sort_by_key(|s| s.to_string());
    step("distinct", Bson::Array(states));
    let mut tenants = orders
        .distinct("customerId", doc! {"customerId": {"$in": [&a, &b]}})
        .await
        .unwrap();
    tenants.sort_by_key(|s| s.to_string());
    step("distinct tenants", Bson::Array(tenants));
    step(
        "aggregate",
        all(orders
            .aggregate(vec![
                doc! {"$match": {"customerId": &hot}},
                doc! {"$group": {"_id": "$state", "n": {"$sum": 1}, "total": {"$sum": "$total"}}},
                doc! {"$sort": {"_id": 1}},
            ])
            .await
            .unwrap())
        .await,
    );
    step(
        "aggregate batches",
        all(orders
            .aggregate(vec![
                doc! {"$match": {"customerId": {"$in": [&hot, &a]}}},
                doc! {"$sort": {"_id": 1}},
                doc! {"$project": {"total": 1}},
            ])
            .batch_size(2)
            .await
            .unwrap())
        .await,
    );
    for tenant in [&hot, &a, &b] {
        step(
            &format!("final {}", &tenant[prefix.len()..]),
            all(orders
                .find(doc! {"customerId": tenant})
                .sort(doc! {"_id": 1})
                .await
                .unwrap())
            .await,
        );
    }

    let steps: Vec<Value> = out
        .into_iter()
        .map(|(name, value)| serde_json::json!([name, value.into_canonical_extjson()]))
        .collect();
    let mut result = serde_json::json!({"client": "mongodb (Rust)", "steps": steps});
    if target.front {
        let no_tenant = orders.find(doc! {"total": 50}).await.err();
        let lookup = orders
            .aggregate(vec![
                doc! {"$match": {"customerId": &hot}},
                doc! {"$lookup": {"from": "x", "as": "y", "localField": "a", "foreignField": "b"}},
            ])
            .await
            .err();
        let watch = orders.watch().await.err();
        // The routing field is reshard's: a document may not carry it (and reads never show
        // it, which the steps above compare).
        let routing_field = orders
            .insert_one(doc! {"_id": base + 900, "customerId": &a, "bucket": 3})
            .await
            .err();
        result["refused"] = serde_json::json!({
            "no tenant": no_tenant.as_ref().and_then(code_of),
            "lookup": lookup.as_ref().and_then(code_of),
            "watch": watch.as_ref().and_then(code_of),
            "routing field": routing_field.as_ref().and_then(code_of),
        });
    }
    result
}

/// The steps a client's run through the front answered unlike its run against the plain
/// server (`(step, front, direct)`), after asserting that the front refused what it refuses
/// with MongoDB's codes.
fn compare(front: &Value, direct: &Value) -> Vec<(String, String, String)> {
    let client = front["client"].as_str().unwrap_or("a client");
    let (f, d) = (
        front["steps"].as_array().unwrap(),
        direct["steps"].as_array().unwrap(),
    );
    let names = |s: &[Value]| -> Vec<String> { s.iter().map(|x| x[0].to_string()).collect() };
    assert_eq!(
        names(f),
        names(d),
        "{client}: the runs took different steps"
    );
    let refused = &front["refused"];
    // The scripts print canonical extended JSON (`{"$numberInt": "61"}`), the Rust run a number.
    let code = |form: &str| {
        let v = &refused[form];
        v.as_i64()
            .or_else(|| v["$numberInt"].as_str().and_then(|n| n.parse().ok()))
    };
    assert_eq!(code("no tenant"), Some(61), "{client}: {refused}");
    assert_eq!(code("lookup"), Some(238), "{client}: {refused}");
    assert_eq!(code("watch"), Some(115), "{client}: {refused}");
    if client == "mongodb (Rust)" {
        assert_eq!(code("routing field"), Some(2), "{client}: {refused}");
    }
    f.iter()
        .zip(d)
        .filter(|(f, d)| f[1] != d[1])
        .map(|(f, d)| {
            (
                format!("{client}: {}", f[0].as_str().unwrap()),
                f[1].to_string(),
                d[1].to_string(),
            )
        })
        .collect()
}

/// The plain server's answers, checked once (pymongo's) so that a workload that lost its
/// point (no duplicate, nothing matched) fails rather than compares two empty runs.
fn check_reference(direct: &Value) {
    let steps: std::collections::HashMap<&str, &Value> = direct["steps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| (s[0].as_str().unwrap(), &s[1]))
        .collect();
    let int = |n: i64| serde_json::json!({"$numberInt": n.to_string()});
    assert_eq!(
        steps["insert ordered"],
        &serde_json::json!({"inserted": int(2), "errors": [[int(2), int(11000)]]}),
        "{direct}"
    );
    assert_eq!(
        steps["insert unordered"],
        &serde_json::json!({"inserted": int(2), "errors": [[int(1), int(11000)]]}),
        "{direct}"
    );
    assert_eq!(steps["count"], &int(8), "{direct}");
    assert_eq!(
        steps["find sorted"].as_array().map(Vec::len),
        Some(4),
        "{direct}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_clients_get_from_the_front_what_one_plain_server_answers() {
    let started = Instant::now();
    let (v1, v2) = versions();
    let world = World::start_with_versions(&v1, &v2).await;
    let front = RoutedFront::start(&world, "conformance test").await;
    let front_uri = front.uri();
    let direct_uri = world.server.uri();
    let direct_db = support::unique_name("conformance_direct");

    // The same documents in the routed collection (source layout) and the plain one.
    let through_front = Client::with_uri_str(&front_uri).await.unwrap();
    let routed: Collection<Document> = through_front.database("shop").collection("orders");
    let plain: Collection<Document> = world
        .server
        .client()
        .await
        .database(&direct_db)
        .collection("orders");
    for (prefix, base) in CLIENTS {
        routed.insert_many(seed(prefix, base)).await.unwrap();
        plain.insert_many(seed(prefix, base)).await.unwrap();
    }

    // The backfill: reads merge the target over the source, writes go to the target.
    front.advance(&world, &TO_BACKFILL).await;
    let through = Target {
        uri: &front_uri,
        database: "shop",
        front: true,
    };
    let direct = Target {
        uri: &direct_uri,
        database: &direct_db,
        front: false,
    };

    // Before the copy: the seeded documents only in the source.
    let reference = pymongo(&direct).await;
    check_reference(&reference);
    let mut differences = compare(&pymongo(&through).await, &reference);
    differences.extend(compare(
        &rust_workload(&through).await,
        &rust_workload(&direct).await,
    ));

    // After it: the Node driver's and mongosh's documents in both layouts.
    world.work().await;
    differences.extend(compare(&node(&through).await, &node(&direct).await));
    differences.extend(compare(&mongosh(&through).await, &mongosh(&direct).await));
    let report: Vec<String> = differences
        .iter()
        .map(|(step, f, d)| format!("  {step}\n    front:  {f}\n    direct: {d}"))
        .collect();
    assert!(
        report.is_empty(),
        "the front answered {} steps unlike the plain server:\n{}",
        report.len(),
        report.join("\n")
    );

    front.stop().await;
    eprintln!("conformance: four clients in {:?}", started.elapsed());
}

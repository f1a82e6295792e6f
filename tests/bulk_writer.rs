//! The bulk writer against real servers: one command per shard, duplicates, overload,
//! transient failures, dead letters, and a slow shard that slows only itself.

mod support;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use mongodb::bson::{doc, Bson, Document};
use mongodb::event::command::CommandEvent;
use mongodb::event::EventHandler;
use mongodb::options::ClientOptions;
use mongodb::{Client, Database};
use reshard::routing::Location;
use reshard::shards::classify::failures_from_driver_error;
use reshard::shards::writer::{disable_driver_write_retries, CommandLimits};
use reshard::shards::{
    classify, BulkWriter, FailureClass, RetryPolicy, Statement, StatementResult, WriterError,
    WriterOptions,
};
use serde_json::json;
use support::{MongoServer, Shards};

const COLLECTION: &str = "orders";

/// Shards with test commands, a writer over them, and a count of the write commands each
/// shard received, from the driver's command monitoring.
struct Fixture {
    shards: Shards,
    databases: BTreeMap<String, Database>,
    writes_started: Arc<Mutex<BTreeMap<String, u32>>>,
    /// `(in flight now, most in flight at once)` of write commands per shard.
    in_flight: Arc<Mutex<BTreeMap<String, (u32, u32)>>>,
    overloads: Arc<Mutex<Vec<String>>>,
    writer: BulkWriter,
}

impl Fixture {
    async fn start(n: usize, retry: RetryPolicy) -> Fixture {
        let options = WriterOptions {
            retry,
            ..WriterOptions::default()
        };
        Fixture::start_with(n, options).await
    }

    async fn start_with(n: usize, options: WriterOptions) -> Fixture {
        let shards = Shards::start_with(n, MongoServer::builder().test_commands(true)).await;
        let db_name = MongoServer::database_name();
        let writes_started = Arc::new(Mutex::new(BTreeMap::new()));
        let in_flight = Arc::new(Mutex::new(BTreeMap::new()));
        let mut databases = BTreeMap::new();
        for server in shards.iter() {
            let mut options = ClientOptions::parse(server.uri()).await.unwrap();
            disable_driver_write_retries(&mut options);
            let counts = writes_started.clone();
            let flying = in_flight.clone();
            let name = server.name().to_string();
            let is_write = |command: &str| ["insert", "update", "delete"].contains(&command);
            options.command_event_handler = Some(EventHandler::callback(move |event| {
                let mut flying = flying.lock().unwrap();
                let (now, most) = flying.entry(name.clone()).or_insert((0, 0));
                match event {
                    CommandEvent::Started(e) if is_write(&e.command_name) => {
                        *counts.lock().unwrap().entry(name.clone()).or_insert(0) += 1;
                        *now += 1;
                        *most = (*most).max(*now);
                    }
                    CommandEvent::Succeeded(e) if is_write(&e.command_name) => *now -= 1,
                    CommandEvent::Failed(e) if is_write(&e.command_name) => *now -= 1,
                    _ => {}
                }
            }));
            let client = Client::with_options(options).unwrap();
            databases.insert(server.name().to_string(), client.database(&db_name));
        }
        let overloads = Arc::new(Mutex::new(Vec::new()));
        let sink = overloads.clone();
        let writer = BulkWriter::new(databases.clone(), options).with_overload_sink(Arc::new(
            move |shard: &str| sink.lock().unwrap().push(shard.to_string()),
        ));
        Fixture {
            shards,
            databases,
            writes_started,
            in_flight,
            overloads,
            writer,
        }
    }

    fn most_in_flight(&self, shard: &str) -> u32 {
        self.in_flight.lock().unwrap()[shard].1
    }

    fn writes_started(&self) -> BTreeMap<String, u32> {
        self.writes_started.lock().unwrap().clone()
    }

    async fn count(&self, shard: &str, filter: Document) -> u64 {
        self.databases[shard]
            .collection::<Document>(COLLECTION)
            .count_documents(filter)
            .await
            .unwrap()
    }

    async fn find(&self, shard: &str, id: i64) -> Option<Document> {
        self.databases[shard]
            .collection::<Document>(COLLECTION)
            .find_one(doc! { "_id": id })
            .await
            .unwrap()
    }
}

fn quick_retries() -> RetryPolicy {
    RetryPolicy {
        max_attempts: 6,
        base_delay: Duration::from_millis(5),
        max_delay: Duration::from_millis(50),
    }
}

/// Documents `0..n`, document `i` on shard `s<i mod shards + 1>`.
fn inserts(n: i64, shards: i64) -> Vec<Statement> {
    (0..n)
        .map(|id| {
            let shard = format!("s{}", id % shards + 1);
            let document = doc! { "_id": id, "tenant": id % 13, "must": true, "v": "first" };
            Statement::insert(Location::new(shard, COLLECTION), document).unwrap()
        })
        .collect()
}

fn shard_of(statement: &Statement) -> &str {
    &statement.location.shard
}

#[tokio::test]
async fn one_command_per_shard_duplicates_dropped_and_repeats_already_present() {
    let fx = Fixture::start(4, quick_retries()).await;
    let mut batch = inserts(2_000, 4);
    // 50 ids appear twice; the later copy wins.
    let repeats: Vec<Statement> = batch
        .iter()
        .step_by(40)
        .map(|s| {
            let mut again = s.clone();
            let mut document = match &s.op {
                reshard::shards::WriteOp::Insert(d) => d.clone(),
                other => panic!("{other:?}"),
            };
            document.insert("v", "second");
            again.op = reshard::shards::WriteOp::Insert(document);
            again
        })
        .collect();
    batch.extend(repeats);
    let mut expected_per_shard: BTreeMap<String, u64> = BTreeMap::new();
    for s in &batch[..2_000] {
        *expected_per_shard
            .entry(shard_of(s).to_string())
            .or_default() += 1;
    }

    let report = fx.writer.write(batch.clone()).await.unwrap();
    assert_eq!(report.counts.inserted, 2_000);
    assert_eq!(report.counts.duplicates_dropped, 50);
    assert_eq!(report.counts.dead_lettered, 0);
    assert_eq!(report.retries, 0);
    // One round trip per shard, by the writer's count and by the driver's.
    assert_eq!(report.commands(), 4);
    for (shard, r) in &report.shards {
        assert_eq!(r.commands, 1, "{shard}");
    }
    let once: BTreeMap<String, u32> = (1..=4).map(|i| (format!("s{i}"), 1)).collect();
    assert_eq!(fx.writes_started(), once);
    // Every document exactly once, where it was sent, and the later duplicate won.
    for (shard, expected) in &expected_per_shard {
        assert_eq!(fx.count(shard, doc! {}).await, *expected, "{shard}");
    }
    let shard = shard_of(&batch[0]).to_string();
    assert_eq!(
        fx.find(&shard, 0).await.unwrap().get_str("v").unwrap(),
        "second"
    );
    assert!(matches!(
        report.results[0],
        StatementResult::DroppedDuplicate { kept: 2_000 }
    ));

    // The same batch again (a crash between write and checkpoint): all already present.
    let again = fx.writer.write(batch).await.unwrap();
    assert_eq!(again.counts.already_present, 2_000);
    assert_eq!(again.counts.inserted, 0);
    assert_eq!(again.counts.duplicates_dropped, 50);
    assert_eq!(again.counts.dead_lettered, 0);
    assert_eq!(again.commands(), 4);
    let twice: BTreeMap<String, u32> = (1..=4).map(|i| (format!("s{i}"), 2)).collect();
    assert_eq!(fx.writes_started(), twice);
}

#[tokio::test]
async fn overload_and_transient_failures_are_retried_until_the_cap() {
    let fx = Fixture::start(2, quick_retries()).await;
    let s2 = fx.shards.get("s2");

    // Overload: s2 rejects three inserts with 489 + SystemOverloadedError.
    s2.fail_command(json!({
        "mode": {"times": 3},
        "data": {"failCommands": ["insert"], "errorCode": 489, "errorLabels": ["SystemOverloadedError"]},
    }))
    .await;
    let batch = inserts(400, 2);
    let on_s2 = batch.iter().filter(|s| shard_of(s) == "s2").count() as u64;
    let report = fx.writer.write(batch).await.unwrap();
    assert_eq!(report.counts.inserted, 400);
    assert_eq!(report.counts.dead_lettered, 0);
    assert_eq!(report.overload_events, 3);
    assert_eq!(report.retries, 3 * on_s2);
    assert_eq!(report.shards["s2"].commands, 4);
    assert_eq!(report.shards["s1"].commands, 1);
    assert_eq!(*fx.overloads.lock().unwrap(), vec!["s2"; 3]);
    assert_eq!(fx.count("s2", doc! {}).await, on_s2);

    // Transient: a dropped connection, then a stepdown-like refusal with the retryable label.
    s2.fail_command(json!({
        "mode": {"times": 1},
        "data": {"failCommands": ["insert"], "closeConnection": true},
    }))
    .await;
    let batch: Vec<Statement> = inserts(600, 2).split_off(400);
    let report = fx.writer.write(batch).await.unwrap();
    assert_eq!(report.counts.inserted + report.counts.already_present, 200);
    assert_eq!(report.counts.dead_lettered, 0);
    assert!(report.retries > 0);
    assert_eq!(report.overload_events, 0);

    s2.fail_command(json!({
        "mode": {"times": 1},
        "data": {"failCommands": ["insert"], "errorCode": 91, "errorLabels": ["RetryableWriteError"]},
    }))
    .await;
    let batch: Vec<Statement> = inserts(800, 2).split_off(600);
    let report = fx.writer.write(batch).await.unwrap();
    assert_eq!(report.counts.inserted, 200);
    assert!(report.retries > 0);
    assert_eq!(report.shards["s2"].commands, 2);

    // A transient failure on every attempt becomes a dead letter once the attempts run out.
    s2.fail_command(json!({
        "mode": {"times": 100},
        "data": {"failCommands": ["insert"], "errorCode": 91, "errorLabels": ["RetryableWriteError"]},
    }))
    .await;
    let batch: Vec<Statement> = inserts(1_000, 2).split_off(800);
    let on_s2 = batch.iter().filter(|s| shard_of(s) == "s2").count() as u64;
    let report = fx.writer.write(batch).await.unwrap();
    s2.clear_failpoint().await;
    assert_eq!(report.counts.inserted, 200 - on_s2);
    assert_eq!(report.counts.dead_lettered, on_s2);
    assert_eq!(report.shards["s2"].commands, 6);
    let (_, letter) = report.dead_letters().next().unwrap();
    match letter {
        StatementResult::DeadLettered {
            code,
            class,
            attempts,
            ..
        } => {
            assert_eq!(*code, Some(91));
            assert_eq!(*class, FailureClass::Transient);
            assert_eq!(*attempts, 6);
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(fx.count("s2", doc! {}).await, 400);
}

#[tokio::test]
async fn a_document_the_target_refuses_is_dead_lettered_and_updates_and_deletes_apply() {
    let fx = Fixture::start(2, quick_retries()).await;
    let s2 = &fx.databases["s2"];
    s2.create_collection(COLLECTION).await.unwrap();
    s2.run_command(doc! {
        "collMod": COLLECTION,
        "validator": { "$jsonSchema": { "required": ["must"] } },
        "validationAction": "error",
    })
    .await
    .unwrap();

    let mut batch = inserts(300, 2);
    let refused = batch.iter().position(|s| shard_of(s) == "s2").unwrap();
    match &mut batch[refused].op {
        reshard::shards::WriteOp::Insert(document) => {
            document.remove("must");
        }
        other => panic!("{other:?}"),
    }
    let report = fx.writer.write(batch.clone()).await.unwrap();
    assert_eq!(report.counts.inserted, 299);
    assert_eq!(report.counts.dead_lettered, 1);
    assert_eq!(report.retries, 0);
    match &report.results[refused] {
        StatementResult::DeadLettered {
            code,
            code_name,
            message,
            class,
            attempts,
            ..
        } => {
            assert_eq!(*code, Some(121));
            assert_eq!(code_name.as_deref(), Some("DocumentValidationFailure"));
            assert!(!message.is_empty());
            assert_eq!(*class, FailureClass::Permanent);
            assert_eq!(*attempts, 1);
        }
        other => panic!("{other:?}"),
    }
    let refused_id = batch[refused].id.as_i64().unwrap();
    assert!(fx.find("s2", refused_id).await.is_none());

    // The same classification from the driver's own `insert_many` error: a duplicate, a
    // refused document, and a new one.
    let error = fx.databases["s2"]
        .collection::<Document>(COLLECTION)
        .insert_many([
            doc! { "_id": 3i64, "must": true },
            doc! { "_id": -1i64 },
            doc! { "_id": -2i64, "must": true },
        ])
        .ordered(false)
        .await
        .unwrap_err();
    let classes: Vec<(usize, FailureClass)> = failures_from_driver_error(&error, 3)
        .iter()
        .map(|(index, failure)| (*index, classify(failure)))
        .collect();
    assert_eq!(
        classes,
        vec![
            (0, FailureClass::AlreadyPresent),
            (1, FailureClass::Permanent)
        ]
    );

    // Stamping in place (update) and cleanup (delete) through the same writer.
    let stamps: Vec<Statement> = batch
        .iter()
        .map(|s| {
            let bucket = s.id.as_i64().unwrap() % 4;
            Statement::update(
                s.location.clone(),
                s.id.clone(),
                doc! { "$set": { "bucket": bucket } },
                false,
            )
        })
        .collect();
    let report = fx.writer.write(stamps).await.unwrap();
    assert_eq!(report.counts.applied, 300);
    assert_eq!(report.affected, 299, "the refused document matches nothing");
    assert_eq!(report.commands(), 2);
    assert_eq!(
        fx.count("s1", doc! { "bucket": { "$exists": false } })
            .await,
        0
    );

    let deletes: Vec<Statement> = batch
        .iter()
        .filter(|s| s.id.as_i64().unwrap() % 2 == 0)
        .map(|s| Statement::delete(s.location.clone(), s.id.clone()))
        .collect();
    let deleted = deletes.len() as u64;
    let report = fx.writer.write(deletes).await.unwrap();
    assert_eq!(report.counts.applied, deleted);
    let left = fx.count("s1", doc! {}).await + fx.count("s2", doc! {}).await;
    // 299 copied documents plus the one `insert_many` added above.
    assert_eq!(left + report.affected, 300);
    assert_eq!(report.affected, deleted);

    // A statement for a shard the writer does not know is refused before anything is sent.
    let before = fx.writes_started();
    let stray = Statement::delete(Location::new("s9", COLLECTION), Bson::Int64(1));
    let err = fx.writer.write(vec![stray]).await.unwrap_err();
    assert_eq!(
        err,
        WriterError::UnknownShard {
            index: 0,
            shard: "s9".into()
        }
    );
    assert_eq!(fx.writes_started(), before);
}

#[tokio::test]
async fn a_blocked_shard_slows_only_its_own_statements() {
    let fx = Fixture::start(4, quick_retries()).await;
    let s3 = fx.shards.get("s3");
    s3.fail_command(json!({
        "mode": {"times": 1000},
        "data": {"failCommands": ["insert"], "blockConnection": true, "blockTimeMS": 2000},
    }))
    .await;
    let report = fx.writer.write(inserts(2_000, 4)).await.unwrap();
    s3.clear_failpoint().await;
    assert_eq!(report.counts.inserted, 2_000);
    assert_eq!(report.commands(), 4);
    let blocked = report.shards["s3"].finished_after;
    for (shard, r) in &report.shards {
        if shard != "s3" {
            assert!(
                r.finished_after < blocked,
                "{shard} finished after {:?}, the blocked s3 after {blocked:?}",
                r.finished_after
            );
        }
    }
    for i in 1..=4 {
        assert_eq!(fx.count(&format!("s{i}"), doc! {}).await, 500);
    }
}

#[tokio::test]
async fn large_location_batches_are_split_and_bounded_in_flight_per_shard() {
    let options = WriterOptions {
        max_in_flight_per_shard: 2,
        limits: CommandLimits {
            max_statements: 100,
            ..CommandLimits::default()
        },
        retry: quick_retries(),
        ..WriterOptions::default()
    };
    let fx = Fixture::start_with(1, options).await;
    // Each command waits on the server, so that commands overlap if the writer lets them.
    fx.shards
        .get("s1")
        .fail_command(json!({
            "mode": {"times": 1000},
            "data": {"failCommands": ["insert"], "blockConnection": true, "blockTimeMS": 100},
        }))
        .await;
    let report = fx.writer.write(inserts(1_000, 1)).await.unwrap();
    fx.shards.get("s1").clear_failpoint().await;
    assert_eq!(report.counts.inserted, 1_000);
    assert_eq!(report.shards["s1"].commands, 10);
    assert!(fx.most_in_flight("s1") <= 2, "{}", fx.most_in_flight("s1"));
    assert_eq!(fx.count("s1", doc! {}).await, 1_000);
}

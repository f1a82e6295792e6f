//! Smoke tests of the real-server test harness (tests/support).

mod support;

use std::time::{Duration, Instant};

use mongodb::bson::{doc, Document};
use mongodb::options::{Acknowledgment, WriteConcern};
use serde_json::json;
use support::{error_code, MongoServer, PgDb, Shards};

#[tokio::test]
async fn two_shards_insert_read_failpoint_and_kill() {
    let t0 = Instant::now();
    let shards = Shards::start_with(2, MongoServer::builder().test_commands(true)).await;
    assert_eq!(shards.names(), ["s1", "s2"]);
    assert_ne!(shards[0].port(), shards[1].port());
    let started = t0.elapsed();

    let db_name = MongoServer::database_name();
    let wc = WriteConcern::builder()
        .w(Acknowledgment::Nodes(1))
        .journal(true)
        .build();
    let mut clients = Vec::new();
    for (i, server) in shards.iter().enumerate() {
        let client = server.client().await;
        let coll = client
            .database(&db_name)
            .collection_with_options::<Document>(
                "docs",
                mongodb::options::CollectionOptions::builder()
                    .write_concern(wc.clone())
                    .build(),
            );
        let docs: Vec<Document> = (0..100)
            .map(|n| doc! { "_id": n, "shard": i as i32, "v": format!("doc-{n}") })
            .collect();
        let res = coll.insert_many(docs).ordered(false).await.unwrap();
        assert_eq!(res.inserted_ids.len(), 100);

        let count = coll.count_documents(doc! {}).await.unwrap();
        assert_eq!(count, 100, "{}", server.name());
        let d = coll.find_one(doc! { "_id": 42 }).await.unwrap().unwrap();
        assert_eq!(d.get_str("v").unwrap(), "doc-42");
        assert_eq!(d.get_i32("shard").unwrap(), i as i32);
        clients.push((client, coll));
    }

    // failCommand: one failure with the given code and labels, then normal service.
    let s1 = &shards[0];
    s1.fail_command(json!({
        "mode": {"times": 1},
        "data": {
            "failCommands": ["find"],
            "errorCode": 489,
            "errorLabels": ["SystemOverloadedError"],
        }
    }))
    .await;
    let db1 = clients[0].0.database(&db_name);
    // run_command is never retried by the driver, so the injected error surfaces.
    let err = db1
        .run_command(doc! { "find": "docs", "filter": {"_id": 1} })
        .await
        .expect_err("the failpoint should fail the first find");
    assert_eq!(error_code(&err), Some(489), "{err:?}");
    assert!(err.contains_label("SystemOverloadedError"), "{err:?}");
    // times: 1 -> the next one succeeds.
    db1.run_command(doc! { "find": "docs", "filter": {"_id": 1} })
        .await
        .unwrap();

    // Armed then cleared: no failure.
    s1.fail_command(json!({
        "mode": "alwaysOn",
        "data": {"failCommands": ["count"], "errorCode": 91, "closeConnection": false}
    }))
    .await;
    s1.clear_failpoint().await;
    db1.run_command(doc! { "count": "docs" }).await.unwrap();

    // SIGKILL s1: it stops answering, s2 still does.
    s1.kill().await;
    assert!(!s1.is_running());
    let dead = s1.ping(Duration::from_millis(500)).await;
    assert!(dead.is_err(), "s1 still answers after kill: {dead:?}");
    let (_, coll2) = &clients[1];
    assert_eq!(coll2.count_documents(doc! {}).await.unwrap(), 100);
    shards[1]
        .admin_command(doc! { "ping": 1 })
        .await
        .expect("s2 answers after s1 was killed");

    eprintln!(
        "two shards: started in {started:?}, whole test {:?}",
        t0.elapsed()
    );
}

#[tokio::test]
async fn persistent_server_survives_kill_and_restart() {
    let server = MongoServer::builder()
        .storage(support::Storage::Persistent)
        .sync_on_commit(true)
        .start()
        .await;
    let port = server.port();
    let db = MongoServer::database_name();
    {
        let client = server.client().await;
        let coll = client.database(&db).collection::<Document>("c");
        coll.insert_one(doc! { "_id": 1, "x": "kept" })
            .with_options(
                mongodb::options::InsertOneOptions::builder()
                    .write_concern(WriteConcern::builder().journal(true).build())
                    .build(),
            )
            .await
            .unwrap();
        client.shutdown().immediate(true).await;
    }
    server.kill().await;
    let t = Instant::now();
    server.restart().await;
    eprintln!("restart after kill took {:?}", t.elapsed());
    assert_eq!(server.port(), port);
    let client = server.client().await;
    let got = client
        .database(&db)
        .collection::<Document>("c")
        .find_one(doc! { "_id": 1 })
        .await
        .unwrap();
    assert_eq!(got.unwrap().get_str("x").unwrap(), "kept");
}

#[tokio::test]
async fn pgdb_is_fresh_and_dropped() {
    let pg = PgDb::fresh().await;
    let pool = pg.pool().await;
    let name = pg.name().to_string();
    assert!(name.starts_with("reshard_t_"), "{name}");
    assert!(pg.url().ends_with(&format!("/{name}")), "{}", pg.url());

    sqlx::query("CREATE TABLE t (id bigint PRIMARY KEY, v text NOT NULL)")
        .execute(&pool)
        .await
        .unwrap();
    sqlx::query("INSERT INTO t VALUES (1, 'one'), (2, 'two')")
        .execute(&pool)
        .await
        .unwrap();
    let n: i64 = sqlx::query_scalar("SELECT count(*) FROM t")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(n, 2);

    let admin = sqlx::PgPool::connect(&pg.admin_url()).await.unwrap();
    let exists = |admin: sqlx::PgPool, name: String| async move {
        sqlx::query_scalar::<_, bool>(
            "SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)",
        )
        .bind(name)
        .fetch_one(&admin)
        .await
        .unwrap()
    };
    assert!(exists(admin.clone(), name.clone()).await);
    // Dropped while its pool still holds open connections (hence WITH (FORCE)).
    drop(pg);
    assert!(
        !exists(admin.clone(), name.clone()).await,
        "{name} still exists"
    );
    admin.close().await;
}

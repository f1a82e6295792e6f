//! The command line, run as a built binary against a real PostgreSQL (a fresh database per
//! test) and real MongoDB-wire servers. JSON output is parsed, not matched as text.

mod support;

use std::path::PathBuf;
use std::process::Output;

use mongodb::bson::doc;
use serde_json::Value;
use support::{MongoServer, PgDb};

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

/// Runs `reshard` against `db` and returns its output, whatever the exit code.
fn reshard(db: &PgDb, args: &[&str]) -> Output {
    support::bin(db).args(args).output().unwrap()
}

/// Runs `reshard ... --output json`, requires exit 0 and parses stdout.
fn json(db: &PgDb, args: &[&str]) -> Value {
    let mut all = args.to_vec();
    all.extend(["--output", "json"]);
    let out = reshard(db, &all);
    assert!(
        out.status.success(),
        "reshard {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "reshard {args:?} printed no JSON ({e}): {}",
            String::from_utf8_lossy(&out.stdout)
        )
    })
}

fn code(out: &Output) -> i32 {
    out.status.code().expect("exited normally")
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// A migrated store with shards s1..s4 on one real server and orders v1 and v2.
async fn prepared(server: &MongoServer) -> PgDb {
    let db = PgDb::fresh().await;
    json(&db, &["db", "migrate"]);
    for name in ["s1", "s2", "s3", "s4"] {
        let database = format!("shard_{name}");
        json(
            &db,
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
    }
    for file in ["orders_v1.yaml", "orders_v2.yaml"] {
        let path = fixture("versions").join(file);
        json(
            &db,
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
    db
}

#[tokio::test]
async fn db_migrate_is_idempotent_and_status_lists_every_migration() {
    let db = PgDb::fresh().await;
    let first = json(&db, &["db", "migrate"]);
    assert!(!first["applied"].as_array().unwrap().is_empty());
    let second = json(&db, &["db", "migrate"]);
    assert_eq!(second["applied"], serde_json::json!([]));
    let status = json(&db, &["db", "status"]);
    assert!(status
        .as_array()
        .unwrap()
        .iter()
        .all(|m| m["applied"] == true));
}

#[tokio::test]
async fn shards_are_added_listed_redacted_and_removed_only_when_unused() {
    let server = MongoServer::start().await;
    let db = PgDb::fresh().await;
    json(&db, &["db", "migrate"]);
    // A password in the URI is stored but never shown.
    let with_password = server
        .uri()
        .replacen("mongodb://", "mongodb://app:hunter2@", 1);
    json(
        &db,
        &[
            "shard",
            "add",
            "s1",
            "--uri",
            &with_password,
            "--database",
            "a",
            "--no-check",
            "--allow-inline-password",
        ],
    );
    json(
        &db,
        &[
            "shard",
            "add",
            "s2",
            "--uri",
            &server.uri(),
            "--database",
            "b",
        ],
    );
    let list = reshard(&db, &["shard", "list"]);
    assert!(!String::from_utf8_lossy(&list.stdout).contains("hunter2"));
    let list = json(&db, &["shard", "list"]);
    let names: Vec<&str> = list
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["s1", "s2"]);
    assert!(list[0]["uri"].as_str().unwrap().contains("app:***@"));

    let again = reshard(
        &db,
        &[
            "shard",
            "add",
            "s2",
            "--uri",
            &server.uri(),
            "--database",
            "b",
        ],
    );
    assert_eq!(code(&again), 2);
    assert!(
        stderr(&again).contains("already registered"),
        "{}",
        stderr(&again)
    );

    json(&db, &["shard", "remove", "s2"]);
    let list = json(&db, &["shard", "list"]);
    assert_eq!(list.as_array().unwrap().len(), 1);
}

#[tokio::test]
async fn versions_are_numbered_per_collection_and_shown() {
    let server = MongoServer::start().await;
    let db = prepared(&server).await;
    let list = json(&db, &["version", "list", "--collection", "orders"]);
    let numbers: Vec<i64> = list
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["version"].as_i64().unwrap())
        .collect();
    assert_eq!(numbers, [1, 2]);
    let v2 = json(&db, &["version", "show", "--collection", "orders"]);
    assert_eq!(v2["version"], 2);
    assert_eq!(v2["layout"]["routing_field"], "bucket");
    let v1 = json(
        &db,
        &[
            "version",
            "show",
            "--collection",
            "orders",
            "--version",
            "1",
        ],
    );
    assert_eq!(v1["layout"]["placement"].as_array().unwrap().len(), 3);
    let text = reshard(&db, &["version", "show", "--collection", "orders"]);
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(text.contains("16 for tenant cust-hot"), "{text}");
    assert!(text.contains("orders_v2"), "{text}");

    // A shard used by a version cannot be removed.
    let out = reshard(&db, &["shard", "remove", "s4"]);
    assert_eq!(code(&out), 2);
    assert!(stderr(&out).contains("orders v2"), "{}", stderr(&out));
}

#[tokio::test]
async fn a_migration_moves_through_its_phases_and_every_change_is_logged() {
    let server = MongoServer::start().await;
    let db = prepared(&server).await;
    let m = json(
        &db,
        &["migration", "create", "--collection", "orders", "--to", "2"],
    );
    assert_eq!(m["from_version"], 1);
    assert_eq!(m["phase"], "planned");
    let id = m["id"].as_i64().unwrap().to_string();

    let dry = json(
        &db,
        &[
            "migration",
            "advance",
            &id,
            "--to",
            "dual_read",
            "--dry-run",
        ],
    );
    assert_eq!(dry["dry_run"], true);
    assert_eq!(json(&db, &["migration", "show", &id])["phase"], "planned");

    // The write switch moves on to new_writes by itself once every live router (none here)
    // has acknowledged it.
    for (phase, lands_in) in [
        ("dual_read", "dual_read"),
        ("write_switch", "new_writes"),
        ("backfill", "backfill"),
    ] {
        let t = json(
            &db,
            &[
                "migration",
                "advance",
                &id,
                "--to",
                phase,
                "--reason",
                "test",
            ],
        );
        assert_eq!(t["to"]["phase"], lands_in);
    }
    let shown = json(&db, &["migration", "show", &id]);
    assert_eq!(shown["phase"], "backfill");
    assert_eq!(shown["epoch"], 5);

    // The backfill gate is closed: nothing was planned, so nothing can count as copied.
    let out = reshard(&db, &["migration", "advance", &id, "--to", "reconcile"]);
    assert_eq!(code(&out), 1, "{}", stderr(&out));
    assert!(
        stderr(&out).contains("backfill_complete"),
        "{}",
        stderr(&out)
    );

    let paused = json(&db, &["migration", "pause", &id, "--reason", "night"]);
    assert_eq!(paused["to"]["paused"], true);
    let out = reshard(&db, &["migration", "advance", &id, "--to", "reconcile"]);
    assert_eq!(code(&out), 2);
    assert!(stderr(&out).contains("paused"), "{}", stderr(&out));
    json(&db, &["migration", "resume", &id]);

    let history = json(&db, &["migration", "history", &id]);
    let kinds: Vec<&str> = history
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["kind"].as_str().unwrap())
        .collect();
    assert_eq!(
        kinds,
        ["create", "advance", "advance", "advance", "advance", "pause", "resume"]
    );
    assert_eq!(history[1]["from_phase"], "planned");
    assert_eq!(history[1]["to_phase"], "dual_read");
    assert_eq!(history[1]["reason"], "test");
    assert_eq!(history[5]["reason"], "night");
    let epochs: Vec<i64> = history
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["epoch"].as_i64().unwrap())
        .collect();
    assert_eq!(epochs, [1, 2, 3, 4, 5, 6, 7]);

    let list = json(&db, &["migration", "list"]);
    assert_eq!(list.as_array().unwrap().len(), 1);
}

/// Registers a router row by hand: a router that never acknowledges anything.
async fn silent_router(db: &PgDb, name: &str, lease_secs: f64) {
    sqlx::query(
        "INSERT INTO routers (id, collection, name, host, pid, lease_expires_at)
         VALUES (gen_random_uuid(), 'orders', $1, 'web-1', 4242,
                 now() + make_interval(secs => $2))",
    )
    .bind(name)
    .bind(lease_secs)
    .execute(&db.pool().await)
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_live_router_that_has_not_acknowledged_holds_the_gate_and_the_barrier() {
    let server = MongoServer::start().await;
    let db = prepared(&server).await;
    let m = json(
        &db,
        &["migration", "create", "--collection", "orders", "--to", "2"],
    );
    let id = m["id"].as_i64().unwrap().to_string();
    silent_router(&db, "orders-api", 600.0).await;
    // Entering dual_read changes router behaviour: the driver waits, then gives up naming it.
    let out = reshard(
        &db,
        &[
            "migration",
            "advance",
            &id,
            "--to",
            "dual_read",
            "--timeout",
            "1s",
        ],
    );
    assert_eq!(code(&out), 1, "{}", stderr(&out));
    assert!(
        stderr(&out).contains("did not acknowledge epoch 2")
            && stderr(&out).contains("orders-api (web-1, pid 4242, epoch -)"),
        "{}",
        stderr(&out)
    );
    // The move itself happened; the next one waits for the acknowledgement first (a driver
    // re-run after a stop inside the barrier continues it), and does not move without it.
    assert_eq!(json(&db, &["migration", "show", &id])["phase"], "dual_read");
    let out = reshard(
        &db,
        &[
            "migration",
            "advance",
            &id,
            "--to",
            "write_switch",
            "--timeout",
            "1s",
        ],
    );
    assert_eq!(code(&out), 1);
    assert!(
        stderr(&out).contains("did not acknowledge epoch 2")
            && stderr(&out).contains("the next move waits for them"),
        "{}",
        stderr(&out)
    );
    assert_eq!(json(&db, &["migration", "show", &id])["phase"], "dual_read");
    // Once it acknowledges the current epoch the gate opens; a write switch it does not
    // acknowledge in time goes back to dual_read and says so. It stays alive: it heartbeats
    // (a router heard of since the driver's wait began is not waited out).
    sqlx::query("UPDATE routers SET migration_id = $1, acked_epoch = 2, heartbeat_at = now()")
        .bind(m["id"].as_i64().unwrap())
        .execute(&db.pool().await)
        .await
        .unwrap();
    let pool = db.pool().await;
    let beating = tokio::spawn(async move {
        loop {
            sqlx::query("UPDATE routers SET heartbeat_at = now()")
                .execute(&pool)
                .await
                .unwrap();
            tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        }
    });
    let out = reshard(
        &db,
        &[
            "migration",
            "advance",
            &id,
            "--to",
            "write_switch",
            "--switch-timeout",
            "1s",
        ],
    );
    assert_eq!(code(&out), 1, "{}", stderr(&out));
    assert!(
        stderr(&out).contains("went back to dual_read"),
        "{}",
        stderr(&out)
    );
    let history = json(&db, &["migration", "history", &id]);
    let moves: Vec<(String, String)> = history
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["kind"] == "advance")
        .map(|e| {
            (
                e["from_phase"].as_str().unwrap().to_owned(),
                e["to_phase"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    assert_eq!(
        moves,
        [
            ("planned".to_owned(), "dual_read".to_owned()),
            ("dual_read".to_owned(), "write_switch".to_owned()),
            ("write_switch".to_owned(), "dual_read".to_owned()),
        ]
    );
    assert!(history.as_array().unwrap().last().unwrap()["reason"]
        .as_str()
        .unwrap()
        .contains("orders-api"));
    beating.abort();
}

#[tokio::test]
async fn the_barrier_stops_waiting_for_a_router_once_its_lease_has_expired() {
    let server = MongoServer::start().await;
    let db = prepared(&server).await;
    let m = json(
        &db,
        &["migration", "create", "--collection", "orders", "--to", "2"],
    );
    let id = m["id"].as_i64().unwrap().to_string();
    silent_router(&db, "crashed-api", 2.0).await;
    let started = std::time::Instant::now();
    let out = reshard(&db, &["migration", "advance", &id, "--to", "dual_read"]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert!(
        stderr(&out).contains("waiting for 1 router(s)"),
        "{}",
        stderr(&out)
    );
    // Counted out only a fence margin (1 s) after its 2 s lease ran out, and named with why.
    assert!(started.elapsed() >= std::time::Duration::from_millis(2500));
    assert!(
        stderr(&out).contains(
            "router crashed-api (web-1, pid 4242, epoch -) counted out: its lease ran out at"
        ),
        "{}",
        stderr(&out)
    );
    let routers = json(&db, &["router", "list", "--collection", "orders"]);
    assert_eq!(routers[0]["name"], "crashed-api");
    assert_eq!(routers[0]["live"], false);
}

/// Regression (issue 29, item 2): a router that died after acknowledging `dual_read` made the
/// next write switch hold every live router's writes for the whole switch timeout; then the
/// switch went back and the command failed. The dead router could never acknowledge it. Now
/// the driver waits it out before the switch, while writes flow, and the switch then passes
/// at once. Before the fix: exit 1, "went back to dual_read", a write held meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_router_that_died_before_the_write_switch_is_waited_out_before_writes_are_held() {
    let server = MongoServer::start().await;
    let db = prepared(&server).await;
    let m = json(
        &db,
        &["migration", "create", "--collection", "orders", "--to", "2"],
    );
    let mid = m["id"].as_i64().unwrap();
    let id = mid.to_string();
    let mut config = reshard::router::RouterConfig::named("live-api");
    config.heartbeat_interval = std::time::Duration::from_millis(200);
    config.hold_timeout = std::time::Duration::from_secs(1);
    let router = reshard::router::Router::connect(&db.url(), "orders", config)
        .await
        .unwrap();
    let out = reshard(&db, &["migration", "advance", &id, "--to", "dual_read"]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    // A router that acknowledged dual_read and died 10 s ago; its lease has 4 s to run.
    let pool = db.pool().await;
    let dead_lease = |secs: f64| {
        let pool = pool.clone();
        async move {
            sqlx::query(
                "INSERT INTO routers (id, collection, name, host, pid, heartbeat_at,
                                      lease_expires_at, migration_id, acked_epoch)
                 VALUES (gen_random_uuid(), 'orders', 'dead-api', 'web-9', 4343,
                         now() - interval '10 s', now() + make_interval(secs => $1), $2, 2)",
            )
            .bind(secs)
            .bind(mid)
            .execute(&pool)
            .await
            .unwrap();
        }
    };
    dead_lease(5.0).await;
    let started = std::time::Instant::now();
    // With a timeout shorter than its lease, the switch does not start: nothing is held, the
    // phase stays, and the message says when the router is counted out.
    let out = reshard(
        &db,
        &[
            "migration",
            "advance",
            &id,
            "--to",
            "write_switch",
            "--timeout",
            "1s",
        ],
    );
    assert_eq!(code(&out), 1, "{}", stderr(&out));
    assert!(
        stderr(&out).contains("did not start")
            && stderr(&out).contains("Writes were not held")
            && stderr(&out).contains("counted out at"),
        "{}",
        stderr(&out)
    );
    assert_eq!(json(&db, &["migration", "show", &id])["phase"], "dual_read");
    let url = db.url();
    let id2 = id.clone();
    let switch = tokio::task::spawn_blocking(move || {
        assert_cmd::Command::cargo_bin("reshard")
            .unwrap()
            .env("RESHARD_DATABASE_URL", url)
            .args([
                "migration",
                "advance",
                &id2,
                "--to",
                "write_switch",
                "--switch-timeout",
                "1s",
            ])
            .output()
            .unwrap()
    });
    // While the driver waits for the dead router, the live one writes as usual.
    tokio::time::sleep(std::time::Duration::from_millis(1000)).await;
    let written = tokio::time::timeout(
        std::time::Duration::from_secs(3),
        router.insert(doc! {"_id": "o-live", "customerId": "cust-1", "total": 1}),
    )
    .await;
    assert!(
        matches!(written, Ok(Ok(()))),
        "a write while the driver waits is not held: {written:?}"
    );
    let out = switch.await.unwrap();
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert!(
        started.elapsed() >= std::time::Duration::from_secs(5),
        "waited until the dead router was counted out: {:?}",
        started.elapsed()
    );
    assert!(
        stderr(&out).contains("stopped heartbeating")
            && stderr(&out).contains("dead-api (web-9, pid 4343, library)"),
        "{}",
        stderr(&out)
    );
    assert_eq!(
        json(&db, &["migration", "show", &id])["phase"],
        "new_writes"
    );
    let history = json(&db, &["migration", "history", &id]);
    let kinds: Vec<&str> = history
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["kind"].as_str().unwrap())
        .collect();
    assert!(!kinds.contains(&"barrier_timed_out"), "{kinds:?}");

    router.shutdown().await;
}

/// The router rows of the two tests below: one that acknowledged `dual_read`, last heard at
/// `heard` (SQL, relative to now), with `interval` between heartbeats (NULL: none recorded) and
/// a lease of `lease_secs`.
async fn dead_router_heard(db: &PgDb, mid: i64, heard: &str, interval: &str, lease_secs: f64) {
    sqlx::query(&format!(
        "INSERT INTO routers (id, collection, name, host, pid, heartbeat_at, heartbeat_interval,
                              lease_expires_at, migration_id, acked_epoch)
         VALUES (gen_random_uuid(), 'orders', 'dead-api', 'web-9', 4343, {heard}, {interval},
                 now() + make_interval(secs => $1), $2, 2)"
    ))
    .bind(lease_secs)
    .bind(mid)
    .execute(&db.pool().await)
    .await
    .unwrap();
}

/// What a migration's history holds, by kind.
fn event_kinds(db: &PgDb, id: &str) -> Vec<String> {
    json(db, &["migration", "history", id])
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["kind"].as_str().unwrap().to_string())
        .collect()
}

/// Regression (issue 29, item 2, found by the campaign, seed 1877590601): a router killed a
/// moment before the write switch (its last heartbeat fresh, so not yet "silent") was not
/// waited out: the switch held every writer for the whole switch timeout, went back, and
/// `reshard run` exited 1. Now every counted router must heartbeat once after the wait begins;
/// one that does not is waited out with writes flowing. Before the fix: exit 1, "write switch
/// timed out: 1 router(s) did not acknowledge epoch 3".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_router_killed_a_moment_before_the_write_switch_is_waited_out_too() {
    let server = MongoServer::start().await;
    let db = prepared(&server).await;
    let m = json(
        &db,
        &["migration", "create", "--collection", "orders", "--to", "2"],
    );
    let mid = m["id"].as_i64().unwrap();
    let id = mid.to_string();
    let mut config = reshard::router::RouterConfig::named("live-api");
    config.heartbeat_interval = std::time::Duration::from_millis(200);
    let router = reshard::router::Router::connect(&db.url(), "orders", config)
        .await
        .unwrap();
    let out = reshard(&db, &["migration", "advance", &id, "--to", "dual_read"]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    // Heard a moment ago, with the default 2 s interval: silent only 6 s from now; its lease
    // (plus the 1 s margin) ends in 4 s.
    dead_router_heard(&db, mid, "now()", "NULL", 3.0).await;
    let started = std::time::Instant::now();
    let out = reshard(
        &db,
        &[
            "migration",
            "advance",
            &id,
            "--to",
            "write_switch",
            "--switch-timeout",
            "1s",
        ],
    );
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert!(
        started.elapsed() >= std::time::Duration::from_secs(3),
        "waited until the dead router was counted out: {:?}",
        started.elapsed()
    );
    assert_eq!(
        json(&db, &["migration", "show", &id])["phase"],
        "new_writes"
    );
    let kinds = event_kinds(&db, &id);
    assert!(!kinds.iter().any(|k| k == "barrier_timed_out"), "{kinds:?}");
    router.shutdown().await;
}

/// Issue 29, item 2: a router that dies after the driver heard it and before it acknowledges
/// the switch. The switch goes back as soon as the router is silent, not at the switch
/// timeout (6 s here, shorter than its lease), and the driver waits it out with writes flowing
/// and switches once more: the move succeeds. Before: writes held 6 s, then exit 1 ("write
/// switch timed out").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_router_that_stops_during_the_write_switch_sends_it_back_at_once_and_it_is_made_again() {
    let server = MongoServer::start().await;
    let db = prepared(&server).await;
    let m = json(
        &db,
        &["migration", "create", "--collection", "orders", "--to", "2"],
    );
    let mid = m["id"].as_i64().unwrap();
    let id = mid.to_string();
    let mut config = reshard::router::RouterConfig::named("live-api");
    config.heartbeat_interval = std::time::Duration::from_millis(200);
    let router = reshard::router::Router::connect(&db.url(), "orders", config)
        .await
        .unwrap();
    let out = reshard(&db, &["migration", "advance", &id, "--to", "dual_read"]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    // Its last heartbeat is stamped half a second ahead: heard after the driver's wait
    // begins, so the switch starts; silent a second after that (the shortest threshold).
    dead_router_heard(
        &db,
        mid,
        "now() + interval '500 ms'",
        "interval '100 ms'",
        8.0,
    )
    .await;
    let started = std::time::Instant::now();
    let out = reshard(
        &db,
        &[
            "migration",
            "advance",
            &id,
            "--to",
            "write_switch",
            "--switch-timeout",
            "6s",
        ],
    );
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert!(
        started.elapsed() >= std::time::Duration::from_secs(8),
        "switched again only once the dead router was counted out: {:?}",
        started.elapsed()
    );
    assert!(
        stderr(&out).contains("stopped heartbeating while writes were held")
            && stderr(&out).contains("switching again"),
        "{}",
        stderr(&out)
    );
    assert_eq!(
        json(&db, &["migration", "show", &id])["phase"],
        "new_writes"
    );
    let history = json(&db, &["migration", "history", &id]);
    let went_back: Vec<_> = history
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["kind"] == "switch_failed")
        .collect();
    assert!(
        went_back.len() == 1 && went_back[0]["details"]["stopped"][0].is_string(),
        "{history:#}"
    );
    let kinds = event_kinds(&db, &id);
    assert!(!kinds.iter().any(|k| k == "barrier_timed_out"), "{kinds:?}");
    router.shutdown().await;
}

#[tokio::test]
async fn the_barrier_waits_for_a_slow_router_to_drain_and_acknowledge() {
    use futures::FutureExt;
    let server = MongoServer::start().await;
    let db = prepared(&server).await;
    let m = json(
        &db,
        &["migration", "create", "--collection", "orders", "--to", "2"],
    );
    let id = m["id"].as_i64().unwrap().to_string();
    let store = reshard::store::Store::connect(&db.url()).await.unwrap();
    let mut config = reshard::router::RouterConfig::named("slow-api");
    config.heartbeat_interval = std::time::Duration::from_millis(200);
    // Every step of this router takes 2 s: an operation in flight holds up the epoch switch.
    config.step_hook = Some(std::sync::Arc::new(|_| {
        tokio::time::sleep(std::time::Duration::from_secs(2)).boxed()
    }));
    let router = reshard::router::Router::connect(&db.url(), "orders", config)
        .await
        .unwrap();
    drop(store);
    let reader = router.clone();
    let in_flight = tokio::spawn(async move { reader.get("cust-1", "o-1").await });
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    let url = db.url();
    let id2 = id.clone();
    let out = tokio::task::spawn_blocking(move || {
        assert_cmd::Command::cargo_bin("reshard")
            .unwrap()
            .env("RESHARD_DATABASE_URL", url)
            .args(["migration", "advance", &id2, "--to", "dual_read"])
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert!(stderr(&out).contains("slow-api"), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("every router still counted acknowledged epoch 2"),
        "{}",
        stderr(&out)
    );
    assert_eq!(in_flight.await.unwrap().unwrap(), None);
    let routers = json(&db, &["router", "list", "--collection", "orders"]);
    assert_eq!(routers[0]["acked_epoch"], 2);
    router.shutdown().await;
    assert_eq!(json(&db, &["router", "list"]).as_array().unwrap().len(), 0);
}

#[tokio::test]
async fn two_concurrent_advances_of_one_migration_make_exactly_one_move() {
    let server = MongoServer::start().await;
    let db = prepared(&server).await;
    let m = json(
        &db,
        &["migration", "create", "--collection", "orders", "--to", "2"],
    );
    let id = m["id"].as_i64().unwrap().to_string();
    let bin = assert_cmd::cargo::cargo_bin("reshard");
    let spawn = || {
        std::process::Command::new(&bin)
            .env("RESHARD_DATABASE_URL", db.url())
            .args(["migration", "advance", &id, "--to", "dual_read"])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap()
    };
    let (a, b) = (spawn(), spawn());
    let (a, b) = (a.wait_with_output().unwrap(), b.wait_with_output().unwrap());
    let mut codes = [code(&a), code(&b)];
    codes.sort();
    assert_eq!(codes, [0, 2], "a: {} b: {}", stderr(&a), stderr(&b));
    let history = json(&db, &["migration", "history", &id]);
    let advances = history
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["kind"] == "advance")
        .count();
    assert_eq!(advances, 1);
    assert_eq!(json(&db, &["migration", "show", &id])["epoch"], 2);
}

#[tokio::test]
async fn route_explain_follows_the_phase() {
    let server = MongoServer::start().await;
    let db = prepared(&server).await;
    let explain = |db: &PgDb| {
        json(
            db,
            &[
                "route",
                "explain",
                "--collection",
                "orders",
                "--tenant",
                "cust-hot",
                "--id",
                "int:7",
            ],
        )
    };
    let before = explain(&db);
    assert_eq!(before["phase"], Value::Null);
    assert_eq!(before["placements"][0]["role"], "current");
    assert_eq!(before["placements"][0]["sub_bucket"], 0);
    assert_eq!(before["read_path"], before["write_path"]);

    let m = json(
        &db,
        &["migration", "create", "--collection", "orders", "--to", "2"],
    );
    let id = m["id"].as_i64().unwrap().to_string();
    for phase in ["dual_read", "write_switch"] {
        json(&db, &["migration", "advance", &id, "--to", phase]);
    }
    let during = explain(&db);
    assert_eq!(during["phase"], "new_writes");
    let source = &during["placements"][0];
    let target = &during["placements"][1];
    assert_eq!(target["role"], "target");
    let t_loc = target["locations"][0].as_str().unwrap();
    let s_loc = source["locations"][0].as_str().unwrap();
    assert_eq!(during["write_path"], serde_json::json!([t_loc]));
    assert_eq!(during["read_path"], serde_json::json!([t_loc, s_loc]));
    // The hot tenant has 16 buckets in v2: the sub-bucket is the id's hash mod 16.
    let expected = reshard::routing::hash(&7i64.to_le_bytes()) % 16;
    assert_eq!(target["sub_bucket"].as_u64().unwrap(), expected);
    // The `_id` as JSON output writes it names the same document; the string "7" another.
    let explain_id = |given: &str| {
        json(
            &db,
            &[
                "route",
                "explain",
                "--collection",
                "orders",
                "--tenant",
                "cust-hot",
                "--id",
                given,
            ],
        )
    };
    assert_eq!(explain_id(r#"{"$numberLong": "7"}"#), during);
    assert_eq!(
        explain_id("\"7\"")["placements"],
        explain_id("7")["placements"]
    );
    assert_ne!(explain_id("\"7\"")["placements"], during["placements"]);
}

#[tokio::test]
async fn logs_follow_reshard_log_and_can_be_json() {
    let server = MongoServer::start().await;
    let db = prepared(&server).await;
    let m = json(
        &db,
        &["migration", "create", "--collection", "orders", "--to", "2"],
    );
    let id = m["id"].as_i64().unwrap().to_string();
    let out = assert_cmd::Command::cargo_bin("reshard")
        .unwrap()
        .env("RESHARD_DATABASE_URL", db.url())
        .env("RESHARD_LOG", "info")
        .args(["--log-format", "json", "migration", "pause", &id])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let line = stderr(&out)
        .lines()
        .find(|l| l.contains("migration changed"))
        .map(str::to_owned)
        .unwrap_or_else(|| panic!("no log line in {}", stderr(&out)));
    let event: Value = serde_json::from_str(&line).unwrap();
    assert_eq!(event["level"], "INFO");
    assert_eq!(event["action"], "pause");
    assert_eq!(event["migration_id"], m["id"]);
    // Without RESHARD_LOG, the same command logs nothing at info level.
    let quiet = reshard(&db, &["migration", "resume", &id]);
    assert!(!stderr(&quiet).contains("migration changed"));
}

#[tokio::test]
async fn throttle_set_is_logged_and_shown_and_status_reports_an_unplanned_backfill() {
    let server = MongoServer::start().await;
    let db = prepared(&server).await;
    json(
        &db,
        &["migration", "create", "--collection", "orders", "--to", "2"],
    );

    let shown = json(&db, &["throttle", "show", "1"]);
    assert_eq!(shown["settings"]["batch_size"], 1000, "{shown}");
    let set = json(
        &db,
        &[
            "throttle",
            "set",
            "1",
            "--max-docs-per-sec",
            "1234",
            "--batch-size",
            "250",
            "--reason",
            "peak hours",
        ],
    );
    assert_eq!(set["before"]["max_docs_per_sec"], 5000.0, "{set}");
    assert_eq!(set["after"]["max_docs_per_sec"], 1234.0, "{set}");
    let shown = json(&db, &["throttle", "show", "1"]);
    assert_eq!(shown["settings"]["batch_size"], 250, "{shown}");
    let history = json(&db, &["migration", "history", "1"]);
    let change = history
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["kind"] == "settings_changed")
        .expect("a settings_changed event");
    assert_eq!(change["reason"], "peak hours");
    assert_eq!(change["details"]["after"]["batch_size"], 250);

    // Durations are written with their unit, and stored as the settings' numbers.
    let set = json(
        &db,
        &[
            "throttle",
            "set",
            "1",
            "--target-batch-latency",
            "750ms",
            "--capacity-signal-after",
            "2m",
        ],
    );
    assert_eq!(set["after"]["target_batch_latency_ms"], 750, "{set}");
    assert_eq!(set["after"]["capacity_signal_after_secs"], 120, "{set}");
    let shown = json(&db, &["throttle", "show", "1"]);

    // The planner's partition size is configured with the migration, not the throttle; a bad
    // value changes nothing.
    let out = reshard(
        &db,
        &["throttle", "set", "1", "--documents-per-partition", "5000"],
    );
    assert_eq!(code(&out), 2, "{}", stderr(&out));
    let out = reshard(
        &db,
        &[
            "migration",
            "configure",
            "1",
            "--documents-per-partition",
            "0",
        ],
    );
    assert_eq!(code(&out), 2, "{}", stderr(&out));
    assert!(stderr(&out).contains("documents_per_partition: 0 is not allowed"));
    assert_eq!(
        json(&db, &["throttle", "show", "1"])["settings"],
        shown["settings"]
    );

    let status = json(&db, &["migration", "status", "1"]);
    assert_eq!(status["phase"], "planned");
    assert_eq!(status["backfill"]["planned"], false);
    assert_eq!(status["backfill"]["documents_copied"], 0);
    assert_eq!(status["throttle"]["configured_docs_per_sec"], 1234.0);
    assert!(status["backfill"]["eta_secs"].is_null());
    // One key case: snake_case (tests/vocabulary.rs checks every read command).
    let mut keys = Vec::new();
    collect_keys(&status, &mut keys);
    let odd: Vec<&String> = keys
        .iter()
        .filter(|k| k.chars().any(|c| c.is_ascii_uppercase()))
        .collect();
    assert!(odd.is_empty(), "keys not in snake_case: {odd:?}");
    assert!(keys.len() > 50, "{keys:?}");
    let text = reshard(&db, &["migration", "status", "1"]);
    assert_eq!(code(&text), 0, "{}", stderr(&text));
    assert!(String::from_utf8_lossy(&text.stdout).contains("not planned yet"));
}

#[tokio::test]
async fn migration_configure_sets_the_partition_size_until_the_backfill_is_planned_and_switches_empty_source_dropping(
) {
    let server = MongoServer::start().await;
    let db = prepared(&server).await;
    json(
        &db,
        &["migration", "create", "--collection", "orders", "--to", "2"],
    );
    let set = json(
        &db,
        &[
            "migration",
            "configure",
            "1",
            "--documents-per-partition",
            "5000",
            "--drop-empty-source",
        ],
    );
    assert_eq!(set["after"]["documents_per_partition"], 5000, "{set}");
    assert_eq!(set["after"]["drop_empty_source"], true, "{set}");
    let set = json(&db, &["migration", "configure", "1", "--keep-empty-source"]);
    assert_eq!(set["after"]["drop_empty_source"], false, "{set}");
    // A bare `true` is no longer how it is written, and the two switches exclude each other.
    let out = reshard(
        &db,
        &["migration", "configure", "1", "--drop-empty-source", "true"],
    );
    assert_eq!(code(&out), 2, "{}", stderr(&out));
    let out = reshard(
        &db,
        &[
            "migration",
            "configure",
            "1",
            "--drop-empty-source",
            "--keep-empty-source",
        ],
    );
    assert_eq!(code(&out), 2, "{}", stderr(&out));

    // Once the backfill is planned its partitions are cut: a new size is refused, saying why.
    sqlx::query("UPDATE migrations SET backfill_planned_at = now() WHERE id = 1")
        .execute(&db.pool().await)
        .await
        .unwrap();
    let out = reshard(
        &db,
        &[
            "migration",
            "configure",
            "1",
            "--documents-per-partition",
            "100",
        ],
    );
    assert_eq!(code(&out), 2, "{}", stderr(&out));
    assert!(
        stderr(&out).contains("backfill was planned at")
            && stderr(&out).contains("its partitions are cut"),
        "{}",
        stderr(&out)
    );
    assert_eq!(
        json(&db, &["throttle", "show", "1"])["settings"]["documents_per_partition"],
        5000
    );
}

#[tokio::test]
async fn migration_wait_returns_once_a_phase_is_reached_or_a_gate_would_pass_and_fails_otherwise() {
    let server = MongoServer::start().await;
    let db = prepared(&server).await;
    json(
        &db,
        &["migration", "create", "--collection", "orders", "--to", "2"],
    );
    let wait = |until: &str, timeout: &str| {
        let mut args = vec!["migration", "wait", "1", "--until", until];
        if !timeout.is_empty() {
            args.extend(["--timeout", timeout]);
        }
        reshard(&db, &args)
    };
    // Reached already: at once.
    let out = wait("planned", "5s");
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert!(String::from_utf8_lossy(&out.stdout).contains("planned reached"));
    // Not reached in time: exit 1, saying what it waited for and where the migration is.
    let out = wait("dual_read", "2s");
    assert_eq!(code(&out), 1, "{}", stderr(&out));
    assert!(
        stderr(&out).contains("migration 1 is in planned; waiting for dual_read")
            && stderr(&out)
                .contains("timed out after 2s waiting for migration 1 to reach dual_read"),
        "{}",
        stderr(&out)
    );

    // A waiter started before the moves returns once they happen (reached or passed: the
    // write switch goes on to new_writes at once).
    let waiter = std::process::Command::new(env!("CARGO_BIN_EXE_reshard"))
        .env("RESHARD_DATABASE_URL", db.url())
        .env_remove("DATABASE_URL")
        .args([
            "migration",
            "wait",
            "1",
            "--until",
            "write_switch",
            "--timeout",
            "2m",
            "--output",
            "json",
        ])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    tokio::time::sleep(std::time::Duration::from_millis(1500)).await;
    for phase in ["dual_read", "write_switch"] {
        json(&db, &["migration", "advance", "1", "--to", phase]);
    }
    let out = waiter.wait_with_output().unwrap();
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let reached: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(reached["reached"], true, "{reached}");
    // It woke on the notification of write_switch, or saw the migration past it.
    assert!(
        reached["phase"] == "write_switch" || reached["phase"] == "new_writes",
        "{reached}"
    );
    assert!(
        stderr(&out).contains("waiting for write_switch"),
        "{}",
        stderr(&out)
    );
    // Passed counts as reached.
    let out = wait("dual_read", "5s");
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert!(String::from_utf8_lossy(&out.stdout).contains("dual_read reached (phase new_writes)"));

    // Gates: evaluated as a move would, without moving.
    let out = wait("routers_acknowledged", "5s");
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let out = wait("backfill_complete", "2s");
    assert_eq!(code(&out), 1, "{}", stderr(&out));
    assert!(
        stderr(&out).contains("backfill_complete is closed: the backfill has not been planned"),
        "{}",
        stderr(&out)
    );
    assert_eq!(
        json(&db, &["migration", "show", "1"])["phase"],
        "new_writes"
    );

    // Rolled back while waiting for completed: it never will be, so it says so at once.
    json(&db, &["migration", "rollback", "1"]);
    let out = wait("completed", "");
    assert_eq!(code(&out), 1, "{}", stderr(&out));
    assert!(
        stderr(&out).contains("migration 1 is in reverting: it will not reach completed"),
        "{}",
        stderr(&out)
    );
}

/// Every object key in `value`, at any depth.
fn collect_keys(value: &serde_json::Value, out: &mut Vec<String>) {
    match value {
        serde_json::Value::Object(map) => {
            for (k, v) in map {
                out.push(k.clone());
                collect_keys(v, out);
            }
        }
        serde_json::Value::Array(items) => items.iter().for_each(|v| collect_keys(v, out)),
        _ => {}
    }
}

/// Regression (issue 15): a task whose partitions have no size reported its total as what it
/// had scanned and `eta done` while it ran; plain `status` showed neither routers nor open
/// findings; an empty list of workers summed to `-0.0` in JSON and `-0 docs/s` in text; and
/// `--watch` printed nothing without a terminal.
#[tokio::test]
async fn status_shows_routers_what_is_open_and_a_running_task_without_a_size() {
    let server = MongoServer::start().await;
    let db = prepared(&server).await;
    let m = json(
        &db,
        &["migration", "create", "--collection", "orders", "--to", "2"],
    );
    let id = m["id"].as_i64().unwrap();
    let ids = id.to_string();
    for phase in ["dual_read", "write_switch", "backfill"] {
        json(&db, &["migration", "advance", &ids, "--to", phase]);
    }
    // No worker is live: every rate is 0, never -0.
    for args in [
        vec!["migration", "status", &ids, "--output", "json"],
        vec!["throttle", "show", &ids, "--output", "json"],
        vec!["throttle", "show", &ids],
        vec!["migration", "status", &ids],
    ] {
        let out = reshard(&db, &args);
        assert_eq!(code(&out), 0, "{}", stderr(&out));
        let text = String::from_utf8_lossy(&out.stdout);
        let negative_zero = text.contains(": -0.0")
            || text
                .split(|c: char| c.is_whitespace() || c == '/')
                .any(|t| t == "-0" || t == "-0.0");
        assert!(!negative_zero, "{args:?} prints a negative zero:\n{text}");
    }

    // A plan whose running partition has no size yet, a worker at 50 docs/s, a router that
    // has not acknowledged the current epoch.
    let store = reshard::store::Store::connect(&db.url()).await.unwrap();
    let partition = |approx: Option<i64>, lower: Option<&str>, upper: Option<&str>| {
        reshard::store::partitions::NewPartition {
            source_shard: "s1".into(),
            source_collection: "orders".into(),
            id_type: "string".into(),
            lower_bound: lower.map(|b| b.as_bytes().to_vec()),
            upper_bound: upper.map(|b| b.as_bytes().to_vec()),
            tenant_filter: None,
            approx_documents: approx,
        }
    };
    store
        .store_backfill_plan(
            id,
            &[
                partition(None, None, Some("m")),
                partition(Some(100), Some("m"), None),
            ],
            "test",
            serde_json::json!({}),
        )
        .await
        .unwrap();
    let pool = db.pool().await;
    sqlx::query(
        "UPDATE partitions SET scanned = 40, inserted = 40, state = 'leased', lease_owner = 'w',
                               lease_expires_at = now() + interval '1 minute'
         WHERE id = (SELECT min(id) FROM partitions WHERE migration_id = $1)",
    )
    .bind(id)
    .execute(&pool)
    .await
    .unwrap();
    sqlx::query(
        "INSERT INTO workers (id, migration_id, name, host, pid, lease_expires_at, docs_per_sec,
                              applied_docs_per_sec)
         VALUES (gen_random_uuid(), $1, 'w', 'h', 1, now() + interval '1 minute', 50, 50)",
    )
    .bind(id)
    .execute(&pool)
    .await
    .unwrap();
    silent_router(&db, "orders-api", 600.0).await;

    let status = json(&db, &["migration", "status", &ids]);
    let b = &status["backfill"];
    assert!(b["approx_documents"].is_null(), "{b}");
    assert!(b["eta_secs"].is_null(), "{b}");
    let p = &status["progress"];
    assert_eq!(p["task"], "backfill", "{p}");
    assert_eq!(p["documents_scanned"], 40);
    assert!(
        p["approx_documents"].is_null() && p["eta_secs"].is_null(),
        "{p}"
    );
    assert_eq!(p["docs_per_sec"], 50.0);
    assert!(status["tasks"]["backfill"]["documents_left"].is_null());
    let router = &status["routers"][0];
    assert_eq!(router["name"], "orders-api");
    assert_eq!(router["behind"], true, "{router}");
    assert!(
        router["lease_left_secs"].as_f64().unwrap() > 500.0,
        "{router}"
    );

    let out = reshard(&db, &["migration", "status", &ids]);
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    for expected in [
        "backfill: 40 (total unknown) documents, 0/2 partitions",
        "- (total unknown)",
        "open findings / dead letters / bypasses  0 / 0 / 0",
        "1 live (1 behind epoch",
        "orders-api",
        "- (behind",
        "in 9m",
    ] {
        assert!(text.contains(expected), "{expected:?} not in\n{text}");
    }
    assert!(!text.contains("done\n"), "{text}");

    // Once the partition has a size, the total and the ETA are known.
    sqlx::query("UPDATE partitions SET approx_documents = 90 WHERE migration_id = $1 AND approx_documents IS NULL")
        .bind(id)
        .execute(&pool)
        .await
        .unwrap();
    let status = json(&db, &["migration", "status", &ids]);
    assert_eq!(status["backfill"]["approx_documents"], 190);
    assert_eq!(status["progress"]["eta_secs"], 3, "150 left at 50/s");

    // Without a terminal, the watch prints a line per refresh.
    let mut watch = std::process::Command::new(env!("CARGO_BIN_EXE_reshard"))
        .env("RESHARD_DATABASE_URL", db.url())
        .env_remove("RESHARD_LOG")
        .args(["migration", "status", &ids, "--watch"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let stdout = watch.stdout.take().unwrap();
    let lines = tokio::task::spawn_blocking(move || {
        use std::io::BufRead;
        std::io::BufReader::new(stdout)
            .lines()
            .take(2)
            .map(|l| l.unwrap())
            .collect::<Vec<_>>()
    })
    .await
    .unwrap();
    let _ = watch.kill();
    let _ = watch.wait();
    assert_eq!(lines.len(), 2, "{lines:?}");
    for line in &lines {
        assert!(
            line.contains("backfill: 40 of ~190") && line.contains("routers 1 live (1 behind"),
            "{line}"
        );
    }
}

/// Regression (issue 15): `RESHARD_ACTOR=` recorded an empty actor.
#[tokio::test]
async fn an_empty_actor_is_the_operating_system_user() {
    let server = MongoServer::start().await;
    let db = prepared(&server).await;
    json(
        &db,
        &["migration", "create", "--collection", "orders", "--to", "2"],
    );
    for (actor, expected) in [("", None), ("  ", None), ("ops-bot", Some("ops-bot"))] {
        let out = assert_cmd::Command::cargo_bin("reshard")
            .unwrap()
            .env("RESHARD_DATABASE_URL", db.url())
            .env("RESHARD_ACTOR", actor)
            .args(["migration", "pause", "1"])
            .output()
            .unwrap();
        assert_eq!(code(&out), 0, "{}", stderr(&out));
        json(&db, &["migration", "resume", "1"]);
        let history = json(&db, &["migration", "history", "1"]);
        let pause = history
            .as_array()
            .unwrap()
            .iter()
            .rev()
            .find(|e| e["kind"] == "pause")
            .unwrap()
            .clone();
        let recorded = pause["actor"].as_str().unwrap();
        match expected {
            Some(name) => assert_eq!(recorded, name),
            None => assert!(
                recorded.contains('@') && !recorded.starts_with('@'),
                "{recorded:?}"
            ),
        }
    }
}

/// A local port that nothing listens on (bound, then let go).
fn closed_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap().port()
}

#[test]
fn a_state_store_that_cannot_be_reached_fails_at_once_with_why_exit_1_and_a_hint() {
    let port = closed_port();
    let url = format!("postgres://admin:s3cret-pw@127.0.0.1:{port}/reshard");
    let out = support::bin_without_db()
        .args(["--database-url", &url, "shard", "list"])
        .output()
        .unwrap();
    let err = stderr(&out);
    // Not bad input: the command was right, the store did not answer.
    assert_eq!(code(&out), 1, "{err}");
    assert!(
        err.contains(&format!(
            "error: cannot reach the state store postgres://admin:***@127.0.0.1:{port}/reshard"
        )),
        "{err}"
    );
    // The reason, not the pool's timeout that hid it.
    assert!(!err.contains("pool timed out"), "{err}");
    assert!(err.to_lowercase().contains("refused"), "{err}");
    assert!(
        err.contains("\nhint: check that PostgreSQL is running at that host and port"),
        "{err}"
    );
    assert!(!err.contains("s3cret-pw"), "{err}");
}

/// The one JSON object an error is on stderr under `--output json` (or `--log-format json`).
fn json_error(out: &Output) -> Value {
    let err = stderr(out);
    let line = err.trim();
    assert!(!line.contains('\n'), "more than one line on stderr:\n{err}");
    serde_json::from_str(line).unwrap_or_else(|e| panic!("stderr is not JSON ({e}): {err}"))
}

#[test]
fn under_json_output_an_error_is_one_object_with_its_code_message_hint_and_exit() {
    let port = closed_port();
    let down = format!("postgres://admin:s3cret-pw@127.0.0.1:{port}/reshard");
    let out = support::bin_without_db()
        .args(["--database-url", &down, "--output", "json", "shard", "list"])
        .output()
        .unwrap();
    assert_eq!(code(&out), 1);
    assert!(out.stdout.is_empty());
    let e = &json_error(&out)["error"];
    assert_eq!(e["code"], "store_unreachable", "{e}");
    assert_eq!(e["exit"], 1, "{e}");
    let message = e["message"].as_str().unwrap();
    assert!(message.contains("postgres://admin:***@127.0.0.1:"), "{e}");
    assert!(!message.contains("s3cret-pw"), "{e}");
    assert!(
        e["hint"].as_str().is_some_and(|h| h.contains("PostgreSQL")),
        "{e}"
    );

    // A database the server does not have: waiting does not cure it, so it is bad input.
    let missing = "postgres://postgres@127.0.0.1:5432/reshard_no_such_database";
    let out = support::bin_without_db()
        .args([
            "--database-url",
            missing,
            "--log-format",
            "json",
            "shard",
            "list",
        ])
        .output()
        .unwrap();
    assert_eq!(code(&out), 2, "{}", stderr(&out));
    let e = &json_error(&out)["error"];
    assert_eq!(e["code"], "store_refused", "{e}");
    assert_eq!(e["exit"], 2, "{e}");
    assert!(
        e["hint"]
            .as_str()
            .is_some_and(|h| h.contains("database name")),
        "{e}"
    );

    // Bad input that is not the store's: the generic code, no hint.
    let out = support::bin_without_db()
        .args(["--output", "json", "shard", "list"])
        .output()
        .unwrap();
    assert_eq!(code(&out), 2);
    let e = &json_error(&out)["error"];
    assert_eq!(e["code"], "bad_input", "{e}");
    assert!(
        e["message"]
            .as_str()
            .unwrap()
            .contains("no state store given"),
        "{e}"
    );
    assert!(e["hint"].is_null(), "{e}");

    // Text output keeps the text form.
    let out = support::bin_without_db()
        .args(["shard", "list"])
        .output()
        .unwrap();
    assert!(
        stderr(&out).starts_with("error: no state store given"),
        "{}",
        stderr(&out)
    );

    // A usage error, which clap finds before any command runs, is one object too, with
    // what is wrong as its message and the usage as its hint; without JSON, clap's text.
    for args in [
        &["--output", "json", "deadletter", "skip", "3", "--idd", "x"][..],
        &["deadletter", "skip", "3", "--output=json"],
        &["--log-format", "json", "migration", "show", "abc"],
    ] {
        let out = support::bin_without_db().args(args).output().unwrap();
        assert_eq!(code(&out), 2, "{args:?}");
        assert!(out.stdout.is_empty(), "{args:?}");
        let e = &json_error(&out)["error"];
        assert_eq!(e["code"], "usage", "{args:?}: {e}");
        assert_eq!(e["exit"], 2, "{e}");
        assert!(!e["message"].as_str().unwrap().is_empty(), "{e}");
        assert!(!e["message"].as_str().unwrap().contains("--help"), "{e}");
    }
    let e = &json_error(
        &support::bin_without_db()
            .args([
                "--output",
                "json",
                "deadletter",
                "skip",
                "3",
                "--reason",
                "r",
            ])
            .output()
            .unwrap(),
    )["error"];
    assert!(e["message"].as_str().unwrap().contains("--id <ID>"), "{e}");
    assert!(
        e["hint"]
            .as_str()
            .unwrap()
            .contains("Usage: reshard deadletter skip"),
        "{e}"
    );
    let out = support::bin_without_db()
        .args(["deadletter", "skip", "3", "--idd", "x"])
        .output()
        .unwrap();
    assert_eq!(code(&out), 2);
    assert!(
        stderr(&out).starts_with("error: unexpected argument '--idd'"),
        "{}",
        stderr(&out)
    );
    // --help and --version are no errors, whatever the output format.
    let out = support::bin_without_db()
        .args(["--output", "json", "--version"])
        .output()
        .unwrap();
    assert_eq!(code(&out), 0);
    let version = String::from_utf8_lossy(&out.stdout);
    assert!(version.starts_with("reshard "), "{version}");
}

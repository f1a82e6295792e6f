//! Hooks on real servers: commands a migration runs on its events get each event as JSON on
//! stdin, from whichever process delivers it (a move, `reshard worker`, `reshard hook
//! deliver`, a playbook stopping at an approval). A failing hook is logged and passed; a
//! blocking one pauses the migration and gets its event again after the resume.

mod support;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use reshard::phase::Action;
use reshard::store::events::{EventKind, NewEvent};
use support::{reshard, reshard_ok, StateDb, World};

fn hooks(db: &StateDb, id: &str) -> Vec<serde_json::Value> {
    let out = reshard_ok(db, &["hook", "list", id, "--output", "json"]);
    serde_json::from_str::<serde_json::Value>(&out)
        .unwrap()
        .as_array()
        .unwrap()
        .clone()
}

fn hook(db: &StateDb, id: &str, name: &str) -> serde_json::Value {
    hooks(db, id)
        .into_iter()
        .find(|h| h["name"] == name)
        .unwrap_or_else(|| panic!("no hook {name}"))
}

/// The events a recording hook received: one JSON object per line.
fn received(file: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(file)
        .unwrap_or_default()
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect()
}

fn kinds(events: &[serde_json::Value]) -> Vec<String> {
    events
        .iter()
        .map(|e| e["event"]["kind"].as_str().unwrap().to_owned())
        .collect()
}

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("reshard-hooks-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[tokio::test(flavor = "multi_thread")]
async fn hooks_receive_their_events_and_a_failure_is_logged_or_holds_the_migration() {
    let w = World::start().await;
    let db = &w.db;
    let id = w.migration.to_string();
    let dir = scratch("cli");
    let rec = dir.join("rec.ndjson");
    let record = format!("cat >> '{}'", rec.display());
    reshard_ok(
        db,
        &[
            "hook",
            "add",
            &id,
            "--name",
            "rec",
            "--on",
            "phase_change,failure,capacity_signal",
            "--command",
            &record,
        ],
    );
    // A failing hook whose stderr carries a credential.
    reshard_ok(
        db,
        &[
            "hook",
            "add",
            &id,
            "--name",
            "broken",
            "--on",
            "phase_change",
            "--command",
            "cat > /dev/null; echo 'cannot reach https://pager:hunter2@pager.example/x' >&2; exit 3",
        ],
    );
    // Bad input changes nothing.
    let bad = reshard(
        db,
        &[
            "hook",
            "add",
            &id,
            "--name",
            "x",
            "--on",
            "phase-change",
            "--command",
            "true",
        ],
    );
    assert_eq!(bad.status.code(), Some(2));
    let err = String::from_utf8_lossy(&bad.stderr);
    assert!(
        err.contains("phase-change") && err.contains("phase_change"),
        "{err}"
    );
    let dup = reshard(
        db,
        &[
            "hook",
            "add",
            &id,
            "--name",
            "rec",
            "--on",
            "all",
            "--command",
            "true",
        ],
    );
    assert_eq!(
        dup.status.code(),
        Some(2),
        "{}",
        String::from_utf8_lossy(&dup.stderr)
    );
    assert_eq!(hooks(db, &id).len(), 2);
    // The event that added a hook says its timeout as `hook list` shows it.
    let added = w
        .store
        .events(w.migration)
        .await
        .unwrap()
        .into_iter()
        .find(|e| e.details["hook_added"] == "rec")
        .expect("a hook_added event");
    assert_eq!(added.details["timeout_ms"], 30_000, "{}", added.details);
    assert_eq!(
        added.details["timeout_ms"],
        hook(db, &id, "rec")["timeout_ms"]
    );

    // A move delivers: the recording hook gets it, the broken one fails and the move stands.
    reshard_ok(db, &["migration", "advance", &id, "--to", "dual_read"]);
    let got = received(&rec);
    assert_eq!(kinds(&got), ["advance"], "{got:?}");
    assert_eq!(got[0]["event"]["from_phase"], "planned");
    assert_eq!(got[0]["event"]["to_phase"], "dual_read");
    assert_eq!(got[0]["migration"]["id"], w.migration);
    assert_eq!(got[0]["migration"]["collection"], "orders");
    assert_eq!(got[0]["hook"], "rec");
    let broken = hook(db, &id, "broken");
    assert_eq!(broken["failures"], 1, "{broken}");
    assert_eq!(broken["deliveries"], 0);
    let error = broken["last_error"].as_str().unwrap();
    assert!(error.contains("exit status 3"), "{error}");
    assert!(error.contains("cannot reach"), "{error}");
    assert!(
        !error.contains("hunter2"),
        "a credential reached the hook's error: {error}"
    );
    assert_eq!(hook(db, &id, "rec")["deliveries"], 1);
    let events = w.store.events(w.migration).await.unwrap();
    let failed: Vec<_> = events
        .iter()
        .filter(|e| e.kind == EventKind::HookFailed)
        .collect();
    assert_eq!(failed.len(), 1);
    assert_eq!(failed[0].details["hook"], "broken");
    assert_eq!(failed[0].details["blocking"], false);
    assert_eq!(
        w.store
            .migration(w.migration)
            .await
            .unwrap()
            .phase()
            .as_str(),
        "dual_read"
    );

    // A failure, recorded by another process, reaches the hook through `hook deliver`; and a
    // second delivery sends nothing twice.
    w.store
        .transition(
            w.migration,
            &Action::Fail("the test failed it".into()),
            "test",
            None,
            false,
        )
        .await
        .unwrap();
    reshard_ok(db, &["hook", "deliver", &id]);
    reshard_ok(db, &["hook", "deliver", &id]);
    let got = received(&rec);
    assert_eq!(kinds(&got), ["advance", "fail"], "{got:?}");
    assert_eq!(got[1]["event"]["reason"], "the test failed it");
    assert_eq!(got[1]["migration"]["failure_reason"], "the test failed it");
    // The old name stays beside it until 0.2.
    assert_eq!(got[1]["migration"]["failure"], "the test failed it");
    reshard_ok(db, &["migration", "resume", &id]);

    // A running worker delivers what workers record (a capacity signal) within seconds.
    let mut worker = Command::new(env!("CARGO_BIN_EXE_reshard"))
        .env("RESHARD_DATABASE_URL", db.url())
        .env_remove("DATABASE_URL")
        .args(["worker", &id])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    w.store
        .record_event(
            w.migration,
            "test",
            &NewEvent::new(
                EventKind::CapacitySignal,
                serde_json::json!({"shard": "s2"}),
            ),
        )
        .await
        .unwrap();
    let started = Instant::now();
    while received(&rec).len() < 3 && started.elapsed() < Duration::from_secs(30) {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let _ = Command::new("kill").arg(worker.id().to_string()).status();
    let _ = worker.wait();
    let got = received(&rec);
    assert_eq!(
        kinds(&got),
        ["advance", "fail", "capacity_signal"],
        "{got:?}"
    );
    assert_eq!(got[2]["event"]["details"]["shard"], "s2");

    // A blocking hook that fails pauses the migration; it is not run again while paused; after
    // the fix and a resume, its events are delivered.
    let allow = dir.join("allow");
    let gate_cmd = format!("cat > /dev/null; test -f '{}'", allow.display());
    reshard_ok(
        db,
        &[
            "hook",
            "add",
            &id,
            "--name",
            "gate",
            "--on",
            "phase_change",
            "--blocking",
            "--command",
            &gate_cmd,
        ],
    );
    let out = reshard(db, &["migration", "advance", &id, "--to", "write_switch"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("blocking hook") && err.contains("gate"),
        "{err}"
    );
    let m = w.store.migration(w.migration).await.unwrap();
    assert!(m.paused, "a failed blocking hook pauses the migration");
    let gate = hook(db, &id, "gate");
    assert_eq!(gate["failures"], 1);
    assert!(gate["held_at_event"].is_i64(), "{gate}");
    reshard_ok(db, &["hook", "deliver", &id]);
    assert_eq!(hook(db, &id, "gate")["failures"], 1, "retried while paused");
    let refused = reshard(db, &["migration", "advance", &id, "--to", "backfill"]);
    assert!(
        !refused.status.success(),
        "a paused migration does not move on"
    );

    std::fs::write(&allow, "").unwrap();
    reshard_ok(db, &["migration", "resume", &id]);
    reshard_ok(db, &["hook", "deliver", &id]);
    let gate = hook(db, &id, "gate");
    assert_eq!(gate["deliveries"], 2, "write_switch and new_writes: {gate}");
    assert!(gate["held_at_event"].is_null());
    reshard_ok(db, &["migration", "advance", &id, "--to", "backfill"]);
    assert_eq!(hook(db, &id, "gate")["deliveries"], 3);

    // Everything the recording hook wanted, in the log's order, once each.
    let got = received(&rec);
    assert_eq!(
        kinds(&got),
        [
            "advance",
            "fail",
            "capacity_signal",
            "advance",
            "advance",
            "advance"
        ],
        "{got:?}"
    );
    let ids: Vec<i64> = got
        .iter()
        .map(|e| e["event"]["id"].as_i64().unwrap())
        .collect();
    assert!(ids.windows(2).all(|p| p[0] < p[1]), "{ids:?}");

    reshard_ok(db, &["hook", "remove", &id, "gate"]);
    assert_eq!(hooks(db, &id).len(), 2);
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_playbook_declares_hooks_and_its_approval_gate_is_announced_once() {
    let w = World::start().await;
    let db = &w.db;
    let dir = scratch("playbook");
    let rec = dir.join("rec.ndjson");
    let uri = w.server.uri();
    let base = format!("{}_pb", support::MongoServer::database_name());
    let playbook = format!(
        r#"apiVersion: reshard/v1
name: invoices-hooks
collection: invoices
shards:
  - {{name: p1, uri: "{uri}", database: {base}_p1}}
  - {{name: p2, uri: "{uri}", database: {base}_p2}}
source:
  spec:
    tenant_key: customerId
    layout: hashed
    virtual_buckets: 64
    placement:
      - {{vbuckets: [0, 64], shard: p1}}
target:
  tenant_key: customerId
  layout: hashed
  virtual_buckets: 64
  placement:
    - {{vbuckets: [0, 32], shard: p1}}
    - {{vbuckets: [32, 64], shard: p2}}
hooks:
  - name: rec
    on: [approval_gate, phase_change]
    command: "cat >> '{rec}'"
    timeout: 10s
steps:
  - advance: dual_read
  - name: go-ahead
    approve: {{message: "check the dashboards"}}
  - advance: {{to: write_switch, switch_timeout: 10s}}
"#,
        rec = rec.display()
    );
    let file = dir.join("invoices.yaml");
    std::fs::write(&file, playbook).unwrap();
    let file = file.to_string_lossy().into_owned();

    reshard_ok(db, &["run", &file]);
    let got = received(&rec);
    assert_eq!(kinds(&got), ["advance", "approval_requested"], "{got:?}");
    assert_eq!(got[1]["event"]["details"]["step"], "go-ahead");
    assert_eq!(
        got[1]["event"]["details"]["message"],
        "check the dashboards"
    );
    let id = got[0]["migration"]["id"].as_i64().unwrap().to_string();
    let listed = hooks(db, &id);
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0]["origin"], "playbook");

    // Stopping at the same gate again announces nothing new.
    reshard_ok(db, &["run", &file]);
    assert_eq!(received(&rec).len(), 2);

    reshard_ok(db, &["approve", &id, "--step", "go-ahead"]);
    reshard_ok(db, &["run", &file]);
    let got = received(&rec);
    assert_eq!(
        kinds(&got),
        ["advance", "approval_requested", "advance", "advance"],
        "{got:?}"
    );
    assert_eq!(got[3]["event"]["to_phase"], "new_writes");

    // The playbook without the hook removes it.
    let text = std::fs::read_to_string(&file).unwrap();
    let start = text.find("hooks:").unwrap();
    let end = text.find("steps:").unwrap();
    std::fs::write(&file, format!("{}{}", &text[..start], &text[end..])).unwrap();
    reshard_ok(db, &["run", &file]);
    assert!(hooks(db, &id).is_empty());
    let _ = std::fs::remove_dir_all(&dir);
}

/// Registers a router row by hand that acknowledges `epoch` (of migration `id`) and then
/// never again: a router that is alive but silent.
async fn silent_router(db: &StateDb, id: i64, name: &str, epoch: i64) {
    sqlx::query(
        "INSERT INTO routers (id, collection, name, host, pid, lease_expires_at, migration_id,
                              acked_epoch)
         VALUES (gen_random_uuid(), 'orders', $1, 'web-1', 4242, now() + interval '10 minutes',
                 $2, $3)",
    )
    .bind(name)
    .bind(id)
    .bind(epoch)
    .execute(&db.pool().await)
    .await
    .unwrap();
}

/// Regression (issue 15): a driver restarted while routers hold writes ran every pending hook
/// first (each up to its timeout, writes held), and a failing blocking hook there paused the
/// migration with the switch unfinished. Now the switch is finished first; the hooks hear of
/// it afterwards, and none runs while writes are held.
#[tokio::test(flavor = "multi_thread")]
async fn a_driver_restarted_inside_the_write_switch_finishes_it_before_any_hook_runs() {
    let w = World::start().await;
    let db = &w.db;
    let id = w.migration.to_string();
    let dir = scratch("switch");
    let rec = dir.join("rec.ndjson");
    reshard_ok(db, &["migration", "advance", &id, "--to", "dual_read"]);
    // A slow hook that records the migration as it finds it when it runs.
    let slow = format!("cat >> '{}'; sleep 2", rec.display());
    reshard_ok(
        db,
        &[
            "hook",
            "add",
            &id,
            "--name",
            "slow",
            "--on",
            "phase_change",
            "--command",
            &slow,
        ],
    );
    reshard_ok(
        db,
        &[
            "hook",
            "add",
            &id,
            "--name",
            "gate",
            "--on",
            "phase_change",
            "--blocking",
            "--command",
            "cat > /dev/null; echo 'not today' >&2; exit 1",
        ],
    );
    // A driver that entered the write switch and died: routers would hold writes now.
    w.store
        .transition(
            w.migration,
            &Action::Advance(reshard::phase::Phase::WriteSwitch),
            "a driver that died",
            None,
            false,
        )
        .await
        .unwrap();
    // Nothing delivers while writes are held, whoever asks.
    reshard_ok(db, &["hook", "deliver", &id]);
    assert!(received(&rec).is_empty(), "{:?}", received(&rec));
    assert_eq!(hook(db, &id, "gate")["failures"], 0);

    let out = reshard(db, &["migration", "advance", &id, "--to", "new_writes"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("blocking hook") && err.contains("gate"),
        "{err}"
    );
    let m = w.store.migration(w.migration).await.unwrap();
    assert_eq!(m.phase().as_str(), "new_writes", "the switch was finished");
    assert!(
        m.paused,
        "the blocking hook failed after the switch, and paused it"
    );
    let got = received(&rec);
    assert_eq!(kinds(&got), ["advance", "advance"], "{got:?}");
    assert_eq!(got[0]["event"]["to_phase"], "write_switch");
    assert_eq!(got[1]["event"]["to_phase"], "new_writes");
    for e in &got {
        assert_eq!(
            e["migration"]["phase"], "new_writes",
            "ran while writes were held: {e}"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// Before a move only blocking hooks run: a slow hook that is not blocking runs after it.
#[tokio::test(flavor = "multi_thread")]
async fn hooks_that_do_not_block_run_after_the_move() {
    let w = World::start().await;
    let db = &w.db;
    let id = w.migration.to_string();
    let dir = scratch("after");
    let rec = dir.join("rec.ndjson");
    let slow = format!("cat >> '{}'; sleep 1", rec.display());
    reshard_ok(
        db,
        &[
            "hook",
            "add",
            &id,
            "--name",
            "slow",
            "--on",
            "capacity_signal",
            "--command",
            &slow,
        ],
    );
    // An event pending before the move.
    w.store
        .record_event(
            w.migration,
            "test",
            &NewEvent::new(EventKind::CapacitySignal, serde_json::json!({})),
        )
        .await
        .unwrap();
    reshard_ok(db, &["migration", "advance", &id, "--to", "dual_read"]);
    let got = received(&rec);
    assert_eq!(kinds(&got), ["capacity_signal"], "{got:?}");
    assert_eq!(
        got[0]["migration"]["phase"], "dual_read",
        "it ran before the move"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// Every way a migration or a playbook run stops on a failure records an event of its own,
/// which `--on failure` hooks receive: here a barrier that times out, a write switch that goes
/// back, and a soak that finds overload. A barrier that waited records how long and for whom.
#[tokio::test(flavor = "multi_thread")]
async fn failure_hooks_hear_timed_out_barriers_and_failed_soaks() {
    let w = World::start().await;
    let db = &w.db;
    let id = w.migration.to_string();
    let dir = scratch("failures");
    let rec = dir.join("failures.ndjson");
    let record = format!("cat >> '{}'", rec.display());
    reshard_ok(
        db,
        &[
            "hook",
            "add",
            &id,
            "--name",
            "page",
            "--on",
            "failure",
            "--command",
            &record,
        ],
    );
    // A router that is alive and never acknowledges: the move is made, its barrier times out.
    silent_router(db, w.migration, "stuck-api", 1).await;
    let out = reshard(
        db,
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
    assert_eq!(out.status.code(), Some(1));
    let got = received(&rec);
    assert_eq!(kinds(&got), ["barrier_timed_out"], "{got:?}");
    let details = &got[0]["event"]["details"];
    assert_eq!(details["epoch"], 2, "{details}");
    assert_eq!(details["phase"], "dual_read");
    assert_eq!(details["timeout_ms"], 1_000);
    assert!(
        details["missing"][0]
            .as_str()
            .unwrap()
            .contains("stuck-api"),
        "{details}"
    );
    assert!(details["back_to"].is_null());

    // It acknowledges dual_read, not the write switch: the switch goes back. It heartbeats
    // (alive), so the driver does not wait it out before the switch.
    sqlx::query("UPDATE routers SET acked_epoch = 2, heartbeat_at = now()")
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
        db,
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
    assert_eq!(out.status.code(), Some(1));
    let got = received(&rec);
    assert_eq!(
        kinds(&got),
        ["barrier_timed_out", "barrier_timed_out"],
        "{got:?}"
    );
    let details = &got[1]["event"]["details"];
    assert_eq!(details["phase"], "write_switch", "{details}");
    assert_eq!(details["back_to"], "dual_read");
    assert_eq!(
        w.store
            .migration(w.migration)
            .await
            .unwrap()
            .phase()
            .as_str(),
        "dual_read"
    );

    // A router that acknowledges late: the barrier the next move runs first (the gate wants
    // the current epoch acknowledged) waits for it, and says so.
    let pool = db.pool().await;
    let migration = w.migration;
    let late = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(1500)).await;
        loop {
            sqlx::query(
                "UPDATE routers SET acked_epoch = (SELECT epoch FROM migrations WHERE id = $1)",
            )
            .bind(migration)
            .execute(&pool)
            .await
            .unwrap();
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    });
    reshard_ok(db, &["migration", "advance", &id, "--to", "write_switch"]);
    late.abort();
    beating.abort();
    let events = w.store.events(w.migration).await.unwrap();
    let waited: Vec<_> = events
        .iter()
        .filter(|e| e.kind == EventKind::BarrierWaited)
        .collect();
    assert!(!waited.is_empty(), "{events:?}");
    let first = &waited[0].details;
    assert!(first["waited_ms"].as_u64().unwrap() >= 1000, "{first}");
    assert!(
        first["waited_for"][0]
            .as_str()
            .unwrap()
            .contains("stuck-api"),
        "{first}"
    );
    assert_eq!(first["phase"], "dual_read", "{first}");
    assert_eq!(first["epoch"], 4, "{first}");
    // Waiting is not a failure.
    assert_eq!(received(&rec).len(), 2);

    // A playbook's soak that finds the targets overloaded stops the run: `soak_failed`, once
    // (the run's stop is the same failure, not another page).
    let prec = dir.join("playbook.ndjson");
    let uri = w.server.uri();
    let base = format!("{}_soak", support::MongoServer::database_name());
    let playbook = format!(
        r#"apiVersion: reshard/v1
name: invoices-soak
collection: invoices
shards:
  - {{name: p1, uri: "{uri}", database: {base}_p1}}
  - {{name: p2, uri: "{uri}", database: {base}_p2}}
source:
  spec:
    tenant_key: customerId
    layout: hashed
    virtual_buckets: 64
    placement:
      - {{vbuckets: [0, 64], shard: p1}}
target:
  tenant_key: customerId
  layout: hashed
  virtual_buckets: 64
  placement:
    - {{vbuckets: [0, 32], shard: p1}}
    - {{vbuckets: [32, 64], shard: p2}}
hooks:
  - {{name: page, on: [failure], command: "cat >> '{prec}'"}}
steps:
  - advance: dual_read
  - name: soak-a-while
    soak: 60s
"#,
        prec = prec.display()
    );
    let file = dir.join("soak.yaml");
    std::fs::write(&file, playbook).unwrap();
    let run = Command::new(env!("CARGO_BIN_EXE_reshard"))
        .env("RESHARD_DATABASE_URL", db.url())
        .env_remove("DATABASE_URL")
        .env_remove("RESHARD_LOG")
        .args(["run", file.to_str().unwrap()])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Once the soak runs, the targets signal overload.
    let started = Instant::now();
    loop {
        let steps = w
            .store
            .playbook_steps("invoices-soak")
            .await
            .unwrap_or_default();
        if steps
            .iter()
            .any(|s| s.position == 1 && s.started_at.is_some())
        {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "the soak never started"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let pid = w
        .store
        .playbook("invoices-soak")
        .await
        .unwrap()
        .unwrap()
        .migration_id;
    w.store
        .record_event(
            pid,
            "test",
            &NewEvent::new(
                EventKind::CapacitySignal,
                serde_json::json!({"shard": "p2"}),
            ),
        )
        .await
        .unwrap();
    let out = tokio::task::spawn_blocking(move || run.wait_with_output().unwrap())
        .await
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("soak: the targets were overloaded"), "{err}");
    let got = received(&prec);
    assert_eq!(kinds(&got), ["soak_failed"], "{got:?}");
    let details = &got[0]["event"]["details"];
    assert_eq!(details["step"], "soak-a-while", "{details}");
    assert_eq!(details["limit"], "overload");
    assert_eq!(details["found"], 1);
    let _ = std::fs::remove_dir_all(&dir);
}

//! Hooks on real servers: commands a migration runs on its events get each event as JSON on
//! stdin, from whichever process delivers it (a move, `reshard worker`, `reshard hook
//! deliver`, a playbook stopping at an approval). A failing hook is logged and passed; a
//! blocking one pauses the migration and gets its event again after the resume.

mod support;

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use reshard::phase::Action;
use reshard::store::events::{EventKind, NewEvent};
use support::{StateDb, World};

fn reshard(db: &StateDb, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_reshard"))
        .env("RESHARD_DATABASE_URL", db.url())
        .env_remove("DATABASE_URL")
        .env_remove("RESHARD_LOG")
        .args(args)
        .output()
        .unwrap()
}

fn ok(db: &StateDb, args: &[&str]) -> String {
    let out = reshard(db, args);
    assert!(
        out.status.success(),
        "reshard {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn hooks(db: &StateDb, id: &str) -> Vec<serde_json::Value> {
    let out = ok(db, &["hook", "list", id, "--output", "json"]);
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
    ok(
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
    ok(
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

    // A move delivers: the recording hook gets it, the broken one fails and the move stands.
    ok(db, &["migration", "advance", &id, "--to", "dual_read"]);
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
    ok(db, &["hook", "deliver", &id]);
    ok(db, &["hook", "deliver", &id]);
    let got = received(&rec);
    assert_eq!(kinds(&got), ["advance", "fail"], "{got:?}");
    assert_eq!(got[1]["event"]["reason"], "the test failed it");
    assert_eq!(got[1]["migration"]["failure"], "the test failed it");
    ok(db, &["migration", "resume", &id]);

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
    ok(
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
    ok(db, &["hook", "deliver", &id]);
    assert_eq!(hook(db, &id, "gate")["failures"], 1, "retried while paused");
    let refused = reshard(db, &["migration", "advance", &id, "--to", "backfill"]);
    assert!(
        !refused.status.success(),
        "a paused migration does not move on"
    );

    std::fs::write(&allow, "").unwrap();
    ok(db, &["migration", "resume", &id]);
    ok(db, &["hook", "deliver", &id]);
    let gate = hook(db, &id, "gate");
    assert_eq!(gate["deliveries"], 2, "write_switch and new_writes: {gate}");
    assert!(gate["held_at_event"].is_null());
    ok(db, &["migration", "advance", &id, "--to", "backfill"]);
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

    ok(db, &["hook", "remove", &id, "gate"]);
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

    ok(db, &["run", &file]);
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
    ok(db, &["run", &file]);
    assert_eq!(received(&rec).len(), 2);

    ok(db, &["approve", "invoices-hooks", "--step", "go-ahead"]);
    ok(db, &["run", &file]);
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
    ok(db, &["run", &file]);
    assert!(hooks(db, &id).is_empty());
    let _ = std::fs::remove_dir_all(&dir);
}

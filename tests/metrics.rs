//! Prometheus metrics on real servers: `/metrics` scraped from a `reshard worker` during a
//! real backfill agrees with the partition ledgers in PostgreSQL; the router library records
//! its operations into the same facade; README lists every metric.

mod support;

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use mongodb::bson::{doc, Document};
use reshard::routing::{KeyValue, Location};
use reshard::store::partitions::Task;
use support::{StateDb, World};

fn reshard(db: &StateDb, args: &[&str]) {
    let out = Command::new(env!("CARGO_BIN_EXE_reshard"))
        .env("RESHARD_DATABASE_URL", db.url())
        .env_remove("RESHARD_LOG")
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "reshard {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `GET path` on `port`: (status line, body).
fn get(port: u16, path: &str) -> Option<(String, String)> {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(s, "GET {path} HTTP/1.1\r\nHost: localhost\r\n\r\n").ok()?;
    let mut text = String::new();
    s.read_to_string(&mut text).ok()?;
    let (head, body) = text.split_once("\r\n\r\n")?;
    Some((head.lines().next()?.to_owned(), body.to_owned()))
}

/// Sum of the samples of `name` whose labels include every `(label, value)` of `with`.
fn sum(body: &str, name: &str, with: &[(&str, &str)]) -> f64 {
    body.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let (series, value) = l.rsplit_once(' ')?;
            let (metric, labels) = match series.split_once('{') {
                Some((m, rest)) => (m, rest.trim_end_matches('}')),
                None => (series, ""),
            };
            if metric != name {
                return None;
            }
            let found: BTreeMap<&str, &str> = labels
                .split(',')
                .filter_map(|kv| {
                    let (k, v) = kv.split_once('=')?;
                    Some((k, v.trim_matches('"')))
                })
                .collect();
            with.iter()
                .all(|(k, v)| found.get(k) == Some(v))
                .then(|| value.parse::<f64>().ok())?
        })
        .sum()
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

async fn seed(w: &World, n: usize) {
    let mut by_location: BTreeMap<Location, Vec<Document>> = BTreeMap::new();
    for i in 0..n {
        let tenant = if i % 4 == 0 {
            "cust-hot".to_owned()
        } else {
            format!("cust-{:03}", i % 50)
        };
        let id = format!("o-{i:05}");
        let l =
            w.v1.locate(
                &KeyValue::String(tenant.clone()),
                &KeyValue::String(id.clone()),
            )
            .unwrap()
            .locations[0]
                .clone();
        by_location
            .entry(l)
            .or_default()
            .push(doc! { "_id": id, "customerId": tenant, "qty": i as i32 });
    }
    for (l, docs) in by_location {
        w.shards[&l.shard]
            .collection::<Document>(&l.collection)
            .insert_many(docs)
            .await
            .unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scraped_worker_counters_match_the_partition_ledgers() {
    let w = World::start().await;
    let id = w.migration.to_string();
    seed(&w, 4_000).await;
    for phase in ["dual_read", "write_switch", "backfill"] {
        reshard(&w.db, &["migration", "advance", &id, "--to", phase]);
    }
    // Slow enough to be scraped in the middle.
    reshard(
        &w.db,
        &[
            "throttle",
            "set",
            &id,
            "--max-docs-per-sec",
            "1500",
            "--batch-size",
            "200",
        ],
    );
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let _worker = Killed(
        Command::new(env!("CARGO_BIN_EXE_reshard"))
            .env("RESHARD_DATABASE_URL", w.db.url())
            .env_remove("RESHARD_LOG")
            .args(["worker", &id, "--metrics-addr", &addr])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let started = Instant::now();
    let health = loop {
        if let Some(answer) = get(port, "/healthz") {
            break answer;
        }
        assert!(started.elapsed() < Duration::from_secs(60), "no /healthz");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(health.0.contains("200"), "{health:?}");
    assert_eq!(health.1, "ok\n");
    assert!(get(port, "/nope").unwrap().0.contains("404"));

    let labels = [("migration", id.as_str()), ("task", "backfill")];
    let mut mid_backfill = 0;
    let deadline = Instant::now() + Duration::from_secs(240);
    loop {
        let (status, body) = get(port, "/metrics").unwrap();
        assert!(status.contains("200"), "{status}");
        let totals = w
            .store
            .task_totals(w.migration, Task::Backfill)
            .await
            .unwrap();
        let scanned = sum(&body, "reshard_documents_scanned_total", &labels);
        let copied = sum(&body, "reshard_documents_copied_total", &labels);
        let stamped = sum(&body, "reshard_documents_stamped_total", &labels);
        let present = sum(&body, "reshard_documents_already_present_total", &labels);
        // A counter moves right after its batch's checkpoint: read after the scrape, the
        // ledger is never behind it.
        assert!(scanned <= totals.scanned as f64, "{scanned} > {totals:?}");
        assert!(copied <= totals.inserted as f64, "{copied} > {totals:?}");
        if totals.partitions > 0 && totals.done < totals.partitions && scanned > 0.0 {
            mid_backfill += 1;
        }
        let finished = totals.partitions > 0 && totals.done == totals.partitions;
        if finished
            && scanned == totals.scanned as f64
            && copied == totals.inserted as f64
            && stamped == totals.stamped as f64
            && present == totals.already_present as f64
        {
            assert_eq!(totals.scanned, 4_000, "{totals:?}");
            assert_eq!(
                sum(&body, "reshard_partitions_done_total", &labels),
                totals.partitions as f64
            );
            assert!(sum(&body, "reshard_batches_total", &labels) > 0.0);
            assert!(
                body.contains("# TYPE reshard_batch_seconds histogram"),
                "{body}"
            );
            assert!(body.contains("reshard_batch_seconds_bucket{"), "{body}");
            // The worker planned the backfill: its event is counted where it was written.
            assert_eq!(
                sum(
                    &body,
                    "reshard_events_total",
                    &[("migration", id.as_str()), ("kind", "backfill_planned")]
                ),
                1.0
            );
            assert!(body.contains("# HELP reshard_documents_copied_total"));
            break;
        }
        assert!(
            Instant::now() < deadline,
            "counters never matched the ledgers: {totals:?}\n{body}"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    assert!(
        mid_backfill > 0,
        "never scraped in the middle of the backfill"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_router_records_its_operations_by_kind_and_path() {
    let handle = metrics_exporter_prometheus::PrometheusBuilder::new()
        .install_recorder()
        .unwrap();
    let w = World::start().await;
    let router = w.router(reshard::router::RouterConfig::named("app")).await;
    for i in 0..3 {
        router
            .insert(doc! { "_id": format!("m-{i}"), "customerId": "cust-1", "qty": i })
            .await
            .unwrap();
    }
    assert!(router.get("cust-1", "m-0").await.unwrap().is_some());
    // A duplicate id is the application's answer, not a failure of the router.
    assert!(router
        .insert(doc! { "_id": "m-0", "customerId": "cust-1" })
        .await
        .is_err());
    // A tenant key no layout can route is one.
    assert!(router
        .get(mongodb::bson::Bson::Array(vec![]), "m-0")
        .await
        .is_err());
    let body = handle.render();
    let ops = |op: &str, path: &str, outcome: &str| {
        sum(
            &body,
            "reshard_router_operations_total",
            &[
                ("collection", "orders"),
                ("op", op),
                ("path", path),
                ("outcome", outcome),
            ],
        )
    };
    assert_eq!(ops("insert", "source", "ok"), 4.0, "{body}");
    assert_eq!(ops("get", "source", "error"), 1.0, "{body}");
    assert_eq!(ops("get", "source", "ok"), 1.0, "{body}");
    assert_eq!(
        sum(
            &body,
            "reshard_router_phase",
            &[("collection", "orders"), ("phase", "planned")]
        ),
        1.0,
        "{body}"
    );
    router.shutdown().await;
}

#[test]
fn readme_lists_every_metric_with_its_meaning() {
    let readme =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md")).unwrap();
    for (name, _, _, _) in reshard::telemetry::METRICS {
        let row = format!("| `{name}` |");
        let line = readme
            .lines()
            .find(|l| l.starts_with(&row))
            .unwrap_or_else(|| panic!("README's metrics table has no row for {name}"));
        let meaning = line.trim_end_matches('|').rsplit('|').next().unwrap_or("");
        assert!(
            meaning.trim().len() > 10,
            "{name} has no meaning in README: {line}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_watch_streams_one_json_object_per_refresh() {
    let w = World::start().await;
    let id = w.migration.to_string();
    seed(&w, 200).await;
    for phase in ["dual_read", "write_switch", "backfill"] {
        reshard(&w.db, &["migration", "advance", &id, "--to", phase]);
    }
    let mut watch = Killed(
        Command::new(env!("CARGO_BIN_EXE_reshard"))
            .env("RESHARD_DATABASE_URL", w.db.url())
            .env_remove("RESHARD_LOG")
            .args(["migration", "status", &id, "--watch", "--output", "json"])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let stdout = watch.0.stdout.take().unwrap();
    let lines = tokio::task::spawn_blocking(move || {
        use std::io::BufRead;
        std::io::BufReader::new(stdout)
            .lines()
            .take(3)
            .map(|l| l.unwrap())
            .collect::<Vec<_>>()
    })
    .await
    .unwrap();
    assert_eq!(lines.len(), 3);
    for line in &lines {
        let v: serde_json::Value = serde_json::from_str(line).unwrap();
        assert_eq!(v["migration_id"], w.migration);
        assert_eq!(v["phase"], "backfill");
        assert_eq!(v["active_task"], "backfill");
        for key in ["tasks", "routers", "bypasses", "throttle", "findings_open"] {
            assert!(!v[key].is_null(), "{key} missing: {v}");
        }
        for task in ["backfill", "verify", "cleanup", "revert"] {
            assert!(v["tasks"][task]["partitions"].is_number(), "{v}");
        }
    }
    drop(watch);

    // An ended migration: one object, and the watch ends by itself.
    let other = World::start().await;
    let oid = other.migration.to_string();
    reshard(&other.db, &["migration", "rollback", &oid]);
    let out = Command::new(env!("CARGO_BIN_EXE_reshard"))
        .env("RESHARD_DATABASE_URL", other.db.url())
        .env_remove("RESHARD_LOG")
        .args(["migration", "status", &oid, "--watch", "--output", "json"])
        .output()
        .unwrap();
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    let objects: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(objects.len(), 1, "{text}");
    assert_eq!(objects[0]["phase"], "rolled_back");
}

/// Regression (issue 15): an idle worker's `/metrics` was empty, not even `# HELP` lines, and
/// `--metrics-addr localhost:PORT` was refused. Every metric is named from the first scrape,
/// and the hooks a worker runs are counted by migration and hook.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_worker_names_every_metric_and_counts_its_hooks_by_migration() {
    let w = World::start().await;
    let id = w.migration.to_string();
    reshard(
        &w.db,
        &[
            "hook",
            "add",
            &id,
            "--name",
            "ping",
            "--on",
            "capacity_signal",
            "--command",
            "cat > /dev/null",
        ],
    );
    let port = free_port();
    let addr = format!("localhost:{port}");
    let _worker = Killed(
        Command::new(env!("CARGO_BIN_EXE_reshard"))
            .env("RESHARD_DATABASE_URL", w.db.url())
            .env_remove("RESHARD_LOG")
            .args(["worker", &id, "--metrics-addr", &addr])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let started = Instant::now();
    let body = loop {
        if let Some((status, body)) = get(port, "/metrics") {
            assert!(status.contains("200"), "{status}");
            break body;
        }
        assert!(started.elapsed() < Duration::from_secs(60), "no /metrics");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    for (name, kind, _, help) in reshard::telemetry::METRICS {
        assert!(
            body.contains(&format!("# HELP {name} {help}")),
            "{name}:\n{body}"
        );
        let kind = format!("{kind:?}").to_lowercase();
        assert!(
            body.contains(&format!("# TYPE {name} {kind}")),
            "{name}:\n{body}"
        );
    }

    w.store
        .record_event(
            w.migration,
            "test",
            &reshard::store::events::NewEvent::new(
                reshard::store::events::EventKind::CapacitySignal,
                serde_json::json!({}),
            ),
        )
        .await
        .unwrap();
    let labels = [
        ("migration", id.as_str()),
        ("hook", "ping"),
        ("outcome", "ok"),
    ];
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (_, body) = get(port, "/metrics").unwrap();
        if sum(&body, "reshard_hook_runs_total", &labels) == 1.0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the hook run was not counted:\n{body}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Issue 32: `reshard exporter` serves a migration's state from the state store while no
/// worker runs: its phase, the documents its backfill has left (the same figure as
/// `migration status`), its rate, the routers' lag, the build's version; and it follows a
/// change made in the store at its next refresh.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_exporter_serves_a_migration_between_its_workers_from_the_store() {
    let w = World::start().await;
    let id = w.migration.to_string();
    seed(&w, 3_000).await;
    for phase in ["dual_read", "write_switch", "backfill"] {
        reshard(&w.db, &["migration", "advance", &id, "--to", phase]);
    }
    reshard(
        &w.db,
        &[
            "throttle",
            "set",
            &id,
            "--max-docs-per-sec",
            "400",
            "--batch-size",
            "100",
        ],
    );
    // A worker copies part of the backfill and is killed: nothing runs the migration after.
    let worker = Killed(
        Command::new(env!("CARGO_BIN_EXE_reshard"))
            .env("RESHARD_DATABASE_URL", w.db.url())
            .env_remove("RESHARD_LOG")
            .args(["worker", &id, "--lease-ttl", "2s"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let t = w
            .store
            .task_totals(w.migration, Task::Backfill)
            .await
            .unwrap();
        if t.scanned >= 500 && t.done < t.partitions {
            break;
        }
        assert!(
            t.done < t.partitions || t.partitions == 0,
            "the backfill ended first: {t:?}"
        );
        assert!(
            Instant::now() < deadline,
            "the backfill never started: {t:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    drop(worker);
    // Its lease runs out: no live worker, a stable figure.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let router = w.router(reshard::router::RouterConfig::named("app")).await;

    let status = Command::new(env!("CARGO_BIN_EXE_reshard"))
        .env("RESHARD_DATABASE_URL", w.db.url())
        .env_remove("RESHARD_LOG")
        .args(["migration", "status", &id, "--output", "json"])
        .output()
        .unwrap();
    let status: serde_json::Value = serde_json::from_slice(&status.stdout).unwrap();
    let left = status["progress"]["documents_left"]
        .as_f64()
        .expect("an estimate");
    assert!(left > 0.0, "{status}");

    let port = free_port();
    let _exporter = Killed(
        Command::new(env!("CARGO_BIN_EXE_reshard"))
            .env("RESHARD_DATABASE_URL", w.db.url())
            .env_remove("RESHARD_LOG")
            .args([
                "exporter",
                "--metrics-addr",
                &format!("127.0.0.1:{port}"),
                "--interval",
                "1s",
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let m = [("migration", id.as_str())];
    let started = Instant::now();
    let body = loop {
        if let Some((_, body)) = get(port, "/metrics") {
            if sum(
                &body,
                "reshard_exporter_refreshes_total",
                &[("outcome", "ok")],
            ) >= 1.0
            {
                break body;
            }
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "the exporter never refreshed"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let phase = |body: &str, p: &str| {
        sum(
            body,
            "reshard_migration_phase",
            &[("migration", id.as_str()), ("phase", p)],
        )
    };
    assert_eq!(phase(&body, "backfill"), 1.0, "{body}");
    assert_eq!(phase(&body, "planned"), 0.0, "{body}");
    assert_eq!(
        sum(
            &body,
            "reshard_migration_documents_left",
            &[("migration", id.as_str()), ("task", "backfill")]
        ),
        left,
        "{body}"
    );
    assert_eq!(
        sum(&body, "reshard_migration_workers_live", &m),
        0.0,
        "{body}"
    );
    assert_eq!(
        sum(&body, "reshard_migration_rate_docs_per_second", &m),
        0.0,
        "{body}"
    );
    assert_eq!(
        sum(&body, "reshard_migration_epoch", &m),
        status["epoch"].as_f64().unwrap(),
        "{body}"
    );
    assert_eq!(
        sum(
            &body,
            "reshard_router_epochs_behind",
            &[("migration", id.as_str()), ("router", "app")]
        ),
        0.0,
        "{body}"
    );
    assert!(
        body.contains("# TYPE reshard_router_epochs_behind gauge"),
        "{body}"
    );
    let version = format!(
        "reshard_build_info{{version=\"{}\"}} 1",
        env!("CARGO_PKG_VERSION")
    );
    assert!(body.lines().any(|l| l == version), "{body}");

    // A change in the store shows at the next refresh.
    assert_eq!(sum(&body, "reshard_migration_paused", &m), 0.0, "{body}");
    reshard(
        &w.db,
        &["migration", "pause", &id, "--reason", "exporter test"],
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (_, body) = get(port, "/metrics").unwrap();
        if sum(&body, "reshard_migration_paused", &m) == 1.0 {
            break;
        }
        assert!(Instant::now() < deadline, "the pause never showed:\n{body}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    router.shutdown().await;
}

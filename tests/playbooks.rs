//! Playbooks on real servers (issue 12): every example playbook in `playbooks/` runs to its end
//! with `reshard run` (approving its manual gates); a run killed with SIGKILL at seeded points
//! and run again ends in the same state as an uninterrupted one; two runs of one playbook at
//! once: one refuses, naming the other; an edit of a step already done is refused with a diff.
//!
//! Randomised kill points: the seed is printed; `RESHARD_TEST_SEED=<n>` replays it.

mod support;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use mongodb::bson::{doc, Bson, Document};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use reshard::routing::{KeyValue, RoutingVersion};
use reshard::spec::playbook::{parse_playbook, Playbook, Source};
use support::{MongoServer, PgDb};

/// A state store, one MongoDB-wire server holding every shard's database, and the
/// `RESHARD_Sn_URI` variables the example playbooks read.
struct Fixture {
    db: PgDb,
    server: MongoServer,
}

impl Fixture {
    async fn start() -> Fixture {
        let db = PgDb::fresh().await;
        let server = MongoServer::start().await;
        let f = Fixture { db, server };
        let out = f.reshard(&["db", "migrate"]);
        assert!(out.status.success(), "{}", stderr(&out));
        f
    }

    fn command(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_reshard"));
        cmd.env("RESHARD_DATABASE_URL", self.db.url())
            .env_remove("RESHARD_LOG")
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .args(args);
        for n in 1..=5 {
            cmd.env(format!("RESHARD_S{n}_URI"), self.server.uri());
        }
        cmd
    }

    fn reshard(&self, args: &[&str]) -> Output {
        self.command(args).output().unwrap()
    }

    async fn client(&self) -> mongodb::Client {
        self.server.client().await
    }
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn example(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("playbooks")
        .join(name)
}

fn playbook(file: &Path) -> Playbook {
    let text = std::fs::read_to_string(file).unwrap();
    parse_playbook(&file.display().to_string(), &text).unwrap()
}

fn source_version(pb: &Playbook) -> RoutingVersion {
    match &pb.source {
        Source::Spec(v) => v.clone(),
        Source::Version(_) => panic!("the examples declare their source"),
    }
}

/// The collection where `version` places a document, on the shard databases the playbook
/// names.
fn coll_at(
    client: &mongodb::Client,
    pb: &Playbook,
    version: &RoutingVersion,
    tenant: &str,
    id: &Bson,
) -> mongodb::Collection<Document> {
    let l = &version
        .locate(
            &KeyValue::String(tenant.into()),
            &KeyValue::from_bson(id).unwrap(),
        )
        .unwrap()
        .locations[0];
    database(client, pb, &l.shard).collection(&l.collection)
}

fn database(client: &mongodb::Client, pb: &Playbook, shard: &str) -> mongodb::Database {
    let s = pb.doc.shards.iter().find(|s| s.name == shard).unwrap();
    client.database(&s.database)
}

/// `n` orders where the source version places them, a third of them the hot customer's.
async fn seed(f: &Fixture, pb: &Playbook, n: usize, seed: u64) -> Vec<Document> {
    let client = f.client().await;
    let from = source_version(pb);
    let mut rng = StdRng::seed_from_u64(seed);
    let mut docs = Vec::new();
    for i in 0..n {
        let tenant = if i % 3 == 0 {
            "cust-hot".to_owned()
        } else {
            format!("cust-{}", rng.gen_range(0..40))
        };
        let id = Bson::String(format!("o-{i:05}"));
        let d = doc! {
            "_id": id.clone(), "customerId": &tenant, "total": rng.gen_range(1..500),
            // Deterministic, so that two fixtures seeded alike hold equal documents.
            "createdAt": mongodb::bson::DateTime::from_millis(1_790_000_000_000 + i as i64 * 1000),
        };
        coll_at(&client, pb, &from, &tenant, &id)
            .insert_one(d.clone())
            .await
            .unwrap();
        docs.push(d);
    }
    docs
}

/// Every document of every location either version uses, stripped of reshard's fields,
/// by location.
async fn state(f: &Fixture, pb: &Playbook) -> BTreeMap<String, Vec<Document>> {
    let client = f.client().await;
    let mut out = BTreeMap::new();
    let from = source_version(pb);
    let mut locations = from.locations();
    locations.extend(pb.target.locations());
    locations.sort();
    locations.dedup();
    for l in locations {
        use futures::TryStreamExt;
        let mut docs: Vec<Document> = database(&client, pb, &l.shard)
            .collection::<Document>(&l.collection)
            .find(doc! {})
            .await
            .unwrap()
            .try_collect()
            .await
            .unwrap();
        for d in docs.iter_mut() {
            assert!(
                !reshard::envelope::is_tombstone(d),
                "a tombstone is left at {l}: {d}"
            );
            d.remove("_reshard");
            d.remove("bucket");
        }
        docs.sort_by(|a, b| a.get_str("_id").unwrap().cmp(b.get_str("_id").unwrap()));
        out.insert(l.to_string(), docs);
    }
    out
}

/// After a completed migration, each seeded document sits once, unchanged, where the target
/// version places it, and nowhere else.
async fn assert_at_target(f: &Fixture, pb: &Playbook, seeded: &[Document]) {
    let state = state(f, pb).await;
    let mut expected: BTreeMap<String, Vec<Document>> =
        state.keys().map(|k| (k.clone(), Vec::new())).collect();
    for d in seeded {
        let l = &pb
            .target
            .locate(
                &KeyValue::String(d.get_str("customerId").unwrap().into()),
                &KeyValue::from_bson(d.get("_id").unwrap()).unwrap(),
            )
            .unwrap()
            .locations[0];
        expected.entry(l.to_string()).or_default().push(d.clone());
    }
    for docs in expected.values_mut() {
        docs.sort_by(|a, b| a.get_str("_id").unwrap().cmp(b.get_str("_id").unwrap()));
    }
    for (location, want) in &expected {
        let have = &state[location];
        assert_eq!(
            have.len(),
            want.len(),
            "{location}: {} documents, {} expected",
            have.len(),
            want.len()
        );
        assert_eq!(have, want, "{location}");
    }
}

/// Runs `reshard run FILE` until the playbook ends, approving each gate it stops at.
fn run_to_the_end(f: &Fixture, file: &Path) -> Vec<String> {
    let mut approved = Vec::new();
    for _ in 0..10 {
        let out = f.reshard(&[
            "--output",
            "json",
            "run",
            file.to_str().unwrap(),
            "--workers",
            "2",
        ]);
        assert!(
            out.status.success(),
            "reshard run failed:\n{}\n{}",
            stdout(&out),
            stderr(&out)
        );
        let end: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        match end["end"].as_str().unwrap() {
            "done" => return approved,
            "waiting_for_approval" => {
                let step = end["step"].as_str().unwrap().to_owned();
                let id = end["migration_id"].to_string();
                // The old key stays beside the new one until 0.2.
                assert_eq!(end["migration"], end["migration_id"], "{end}");
                let command = end["command"].as_str().unwrap();
                assert_eq!(command, format!("reshard approve {id} --step {step}"));
                let out = f.reshard(&["approve", &id, "--step", &step, "--reason", "test"]);
                assert!(out.status.success(), "{}", stderr(&out));
                approved.push(step);
            }
            other => panic!("unexpected end {other}: {end}"),
        }
    }
    panic!("the playbook did not end")
}

async fn migration_phase(f: &Fixture, name: &str) -> String {
    let pool = f.db.pool().await;
    sqlx::query_scalar(
        "SELECT m.phase FROM migrations m JOIN playbooks p ON p.migration_id = m.id
         WHERE p.name = $1",
    )
    .bind(name)
    .fetch_one(&pool)
    .await
    .unwrap()
}

#[tokio::test]
async fn the_hot_tenant_playbook_runs_to_completion_through_its_approval() {
    let f = Fixture::start().await;
    let file = example("hot-tenant.yaml");
    let pb = playbook(&file);
    let seeded = seed(&f, &pb, 600, 1).await;
    let approved = run_to_the_end(&f, &file);
    assert_eq!(approved, ["approve-cleanup"]);
    assert_eq!(migration_phase(&f, "orders-hot-tenant").await, "completed");
    assert_at_target(&f, &pb, &seeded).await;
    // Who approved is in the event log.
    let history = f.reshard(&["--output", "json", "migration", "history", "1"]);
    let events: serde_json::Value = serde_json::from_slice(&history.stdout).unwrap();
    assert!(events
        .as_array()
        .unwrap()
        .iter()
        .any(|e| e["kind"] == "approved" && e["details"]["step"] == "approve-cleanup"));
    // Running it again does nothing and says so.
    let again = f.reshard(&["run", file.to_str().unwrap()]);
    assert!(again.status.success(), "{}", stderr(&again));
    assert!(
        stderr(&again).contains("done earlier"),
        "{}",
        stderr(&again)
    );
}

#[tokio::test]
async fn the_new_shard_and_more_buckets_playbooks_run_to_completion() {
    for name in ["new-shard.yaml", "more-buckets.yaml"] {
        let f = Fixture::start().await;
        let file = example(name);
        let pb = playbook(&file);
        let seeded = seed(&f, &pb, 400, 2).await;
        run_to_the_end(&f, &file);
        assert_eq!(
            migration_phase(&f, &pb.doc.name).await,
            "completed",
            "{name}"
        );
        assert_at_target(&f, &pb, &seeded).await;
    }
}

#[tokio::test]
async fn the_rollback_drill_ends_rolled_back_with_the_source_whole() {
    let f = Fixture::start().await;
    let file = example("rollback-drill.yaml");
    let pb = playbook(&file);
    let seeded = seed(&f, &pb, 300, 3).await;
    run_to_the_end(&f, &file);
    assert_eq!(
        migration_phase(&f, "orders-rollback-drill").await,
        "rolled_back"
    );
    // Every document is back where the source places it, and the target's own collections
    // are gone.
    let state = state(&f, &pb).await;
    let from = source_version(&pb);
    let mut at_source = 0;
    for d in &seeded {
        let l = &from
            .locate(
                &KeyValue::String(d.get_str("customerId").unwrap().into()),
                &KeyValue::from_bson(d.get("_id").unwrap()).unwrap(),
            )
            .unwrap()
            .locations[0];
        assert!(state[&l.to_string()].contains(d), "{d} missing from {l}");
        at_source += 1;
    }
    assert_eq!(at_source, seeded.len());
    let total: usize = state.values().map(Vec::len).sum();
    assert_eq!(total, seeded.len(), "only the source's documents remain");
}

#[tokio::test]
async fn a_second_run_of_the_same_playbook_is_refused_naming_the_first() {
    let f = Fixture::start().await;
    let file = example("hot-tenant.yaml");
    let pb = playbook(&file);
    seed(&f, &pb, 300, 4).await;
    // The first run waits in its soak step long enough for the second to try.
    let mut first = f
        .command(&["run", file.to_str().unwrap()])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pool = f.db.pool().await;
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let holder: Option<i32> =
            sqlx::query_scalar("SELECT pid FROM playbook_drivers WHERE playbook = $1")
                .bind("orders-hot-tenant")
                .fetch_optional(&pool)
                .await
                .unwrap_or(None);
        if holder == Some(first.id() as i32) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the first run never took the lock"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let before: i64 = sqlx::query_scalar("SELECT count(*) FROM migration_events")
        .fetch_one(&pool)
        .await
        .unwrap();
    let second = f.reshard(&["run", file.to_str().unwrap()]);
    assert_eq!(second.status.code(), Some(1), "{}", stderr(&second));
    assert!(
        stderr(&second).contains(&format!("(pid {})", first.id())),
        "{}",
        stderr(&second)
    );
    let after: i64 = sqlx::query_scalar("SELECT count(*) FROM migration_events")
        .fetch_one(&pool)
        .await
        .unwrap();
    // The second run changed nothing; the first goes on writing its own events meanwhile,
    // so only count the second's: none carries its actor's pid.
    assert!(after >= before);
    let _ = first.kill();
    let _ = first.wait();
}

#[tokio::test]
async fn editing_a_step_that_ran_is_refused_with_a_diff_and_later_edits_are_accepted() {
    let f = Fixture::start().await;
    let original = example("new-shard.yaml");
    let pb = playbook(&original);
    seed(&f, &pb, 200, 5).await;
    // Run up to the approval gate.
    let out = f.reshard(&["run", original.to_str().unwrap()]);
    assert!(out.status.success(), "{}", stderr(&out));
    let dir = tempfile::tempdir().unwrap();
    // An edit of a step that ran: refused, with the diff, and nothing changes.
    let text = std::fs::read_to_string(&original).unwrap();
    let edited = text.replace(
        "# No steps: the whole forward path, with an approval before cleanup.",
        "steps:\n  - advance: {to: dual_read, timeout: 90s}\n  - advance: write_switch\n  - backfill: {}\n  - reconcile: {}\n  - advance: new_reads\n  - name: approve-cleanup\n    approve: {}\n  - cleanup: {}\n  - complete: {}\n",
    );
    let file = dir.path().join("edited.yaml");
    std::fs::write(&file, &edited).unwrap();
    let out = f.reshard(&["run", file.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(err.contains("step 1 (\"dual_read\") is done"), "{err}");
    assert!(
        err.lines()
            .any(|l| l.starts_with('+') && l.contains("\"timeout\": \"90s\"")),
        "{err}"
    );
    // An edit of the settings only: accepted and logged.
    let edited = text.replace("max_docs_per_sec: 20000", "max_docs_per_sec: 15000");
    std::fs::write(&file, &edited).unwrap();
    let out = f.reshard(&["run", file.to_str().unwrap()]);
    assert!(out.status.success(), "{}", stderr(&out));
    let history = f.reshard(&["--output", "json", "migration", "history", "1"]);
    let events: serde_json::Value = serde_json::from_slice(&history.stdout).unwrap();
    assert!(events
        .as_array()
        .unwrap()
        .iter()
        .any(|e| e["kind"] == "playbook_changed"
            && e["details"]["diff"].as_str().unwrap().contains("15000")));
}

/// SIGKILL at seeded points (at step boundaries and in the middle of the backfill), then run
/// again: the migration always ends completed, in the same state as an uninterrupted run.
#[tokio::test]
async fn a_run_killed_anywhere_continues_and_ends_in_the_same_state() {
    let seed_value = std::env::var("RESHARD_TEST_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| rand::thread_rng().gen());
    eprintln!("kill points seed: {seed_value} (replay with RESHARD_TEST_SEED={seed_value})");
    let mut rng = StdRng::seed_from_u64(seed_value);
    let file = example("more-buckets.yaml");
    let pb = playbook(&file);
    let steps = pb.steps.len();
    // The uninterrupted run.
    let clean = Fixture::start().await;
    let seeded = seed(&clean, &pb, 500, 6).await;
    run_to_the_end(&clean, &file);
    let expected = state(&clean, &pb).await;
    // Kill points: after each step's start (a boundary), a few at random in the quick
    // variant; every one with RESHARD_HEAVY_TESTS.
    let mut points: Vec<usize> = (0..steps).collect();
    if !support::heavy_tests_enabled() {
        while points.len() > 2 {
            points.remove(rng.gen_range(0..points.len()));
        }
    }
    let f = Fixture::start().await;
    let seeded_again = seed(&f, &pb, 500, 6).await;
    assert_eq!(seeded, seeded_again);
    let pool = f.db.pool().await;
    for point in points {
        let mut child = f
            .command(&["run", file.to_str().unwrap(), "--workers", "2"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        // Wait until the step has started (or the run ended), plus a random moment into it.
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            let started: Option<bool> = sqlx::query_scalar(
                "SELECT started_at IS NOT NULL FROM playbook_steps
                 WHERE playbook = $1 AND position = $2",
            )
            .bind(&pb.doc.name)
            .bind(point as i32)
            .fetch_optional(&pool)
            .await
            .unwrap_or(None);
            if started == Some(true) || child.try_wait().unwrap().is_some() {
                break;
            }
            assert!(Instant::now() < deadline, "step {point} never started");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        tokio::time::sleep(Duration::from_millis(rng.gen_range(0..400))).await;
        let _ = child.kill();
        let _ = child.wait();
        eprintln!("killed the run in step {point} ({})", pb.steps[point].name);
    }
    run_to_the_end(&f, &file);
    assert_eq!(migration_phase(&f, &pb.doc.name).await, "completed");
    assert_eq!(state(&f, &pb).await, expected);
    assert_at_target(&f, &pb, &seeded).await;
}

/// `reshard plan` on the hot-tenant example: the bucket count the formula gives on the
/// playbook's numbers (`ceil(1200 x 1.3 / 500)` = 4; the target gives 16), every shard within
/// the limit after, and the hot shard's write load spread
/// over the shards after, the documents per shard adding up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plan_recommends_the_formulas_buckets_and_spreads_the_hot_shard() {
    let f = Fixture::start().await;
    let file = example("hot-tenant.yaml");
    let pb = playbook(&file);
    let docs = seed(&f, &pb, 600, 11).await;
    let out = f.reshard(&["plan", "--output", "json", file.to_str().unwrap()]);
    assert!(out.status.success(), "{}", stderr(&out));
    let report: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();

    let capacity = pb.doc.capacity.as_ref().unwrap();
    let (limit, headroom) = (
        capacity.per_shard_write_limit,
        capacity.headroom.unwrap_or(0.0),
    );
    let peak = capacity.tenant_rates[0].peak_writes_per_sec;
    let formula = (peak * (1.0 + headroom) / limit).ceil() as u64;
    assert!(formula > 1, "the playbook's numbers changed: {formula}");
    let hot = report["tenants"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["tenant"] == "cust-hot")
        .expect("cust-hot is planned");
    assert_eq!(hot["recommended_buckets"], formula, "{hot}");
    assert_eq!(hot["buckets_in_target"], 16, "{hot}");
    // The README's story ends within its limit: every shard, and the planner says so.
    assert_eq!(report["limit"]["within_limit"], true, "{report}");
    assert_eq!(
        report["over_limit_after"],
        serde_json::json!([]),
        "{report}"
    );
    assert_eq!(report["limit"]["advice"], serde_json::json!([]), "{report}");
    assert_eq!(hot["source"], "given", "{hot}");

    let shards = report["shards"].as_array().unwrap();
    let load = |key: &str| -> Vec<f64> {
        shards
            .iter()
            .map(|s| s[key].as_f64().unwrap())
            .collect::<Vec<_>>()
    };
    let (before, after) = (load("writes_before"), load("writes_after"));
    let max = |v: &[f64]| v.iter().cloned().fold(0.0, f64::max);
    // Before, one shard takes all of cust-hot's writes; after, every shard takes a share.
    assert!(max(&before) >= peak, "{before:?}");
    assert!(max(&after) < max(&before) / 2.0, "{before:?} -> {after:?}");
    assert!(after.iter().all(|w| *w > 0.0), "{after:?}");
    let total = |v: &[f64]| v.iter().sum::<f64>();
    assert!((total(&before) - total(&after)).abs() < 1e-6 * total(&before).max(1.0));
    let documents: u64 = shards
        .iter()
        .map(|s| s["documents_after"].as_u64().unwrap())
        .sum();
    assert_eq!(documents, docs.len() as u64, "{report}");
}

/// A long tenant table (issue 32 item 8): with every tenant's writes measured from the
/// timestamp field, `plan` prints the hottest 20 and counts the rest; `--all` prints every
/// one; JSON always holds them all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plan_shows_the_hottest_tenants_and_counts_the_rest() {
    let f = Fixture::start().await;
    let file = example("hot-tenant.yaml");
    let pb = playbook(&file);
    let client = f.client().await;
    let from = source_version(&pb);
    let now = mongodb::bson::DateTime::now();
    for i in 0..300 {
        let tenant = format!("cust-{}", i % 60);
        let id = Bson::String(format!("o-{i:05}"));
        coll_at(&client, &pb, &from, &tenant, &id)
            .insert_one(doc! { "_id": id.clone(), "customerId": &tenant, "createdAt": now })
            .await
            .unwrap();
    }
    let file = file.to_str().unwrap();
    let out = f.reshard(&["plan", "--output", "json", file]);
    assert!(out.status.success(), "{}", stderr(&out));
    let report: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
    let tenants: Vec<String> = report["tenants"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["tenant"].as_str().unwrap().to_owned())
        .collect();
    assert!(tenants.len() > 30, "{report}");
    let rows = |text: &str| tenants.iter().filter(|t| text.contains(t.as_str())).count();

    let out = f.reshard(&["plan", file]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    assert_eq!(rows(&text), 20, "{text}");
    let rest = format!(
        "... and {} more tenants (--all shows every row)",
        tenants.len() - 20
    );
    assert!(text.contains(&rest), "{text}");
    // The hottest are the ones shown.
    assert!(text.contains(&tenants[0]), "{text}");

    let out = f.reshard(&["plan", "--all", file]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    assert_eq!(rows(&text), tenants.len(), "{text}");
    assert!(!text.contains("more tenants"), "{text}");
}

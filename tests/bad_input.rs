//! Bad input, as data: every folder under `tests/fixtures/bad_input/` is a case with
//! - `args`: the command line, one argument per line (`{case}` is the case's folder);
//! - `setup` (optional): the state before the command: `no_url`, `none` (an empty database),
//!   `migrated`, `v1` (shards s1..s4 and orders v1; the default) or `migration` (v1, v2 and
//!   migration 1 from v1 to v2);
//! - `expected` (optional): lines that stderr must contain; without it, `version.yaml:` or a
//!   non-empty message is enough.
//!
//! Each case must exit 2, print its message, leak no password, and change nothing.
//! Adding a case needs no code.

mod support;

use std::path::{Path, PathBuf};

use support::PgDb;

const SECRETS: &[&str] = &["s3cret-pw", "pw-secret"];

fn cases() -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/bad_input");
    let mut cases: Vec<PathBuf> = std::fs::read_dir(root)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.is_dir())
        .collect();
    cases.sort();
    cases
}

fn run(url: Option<&str>, args: &[String]) -> std::process::Output {
    let mut cmd = assert_cmd::Command::cargo_bin("reshard").unwrap();
    cmd.env_remove("RESHARD_DATABASE_URL")
        .env_remove("DATABASE_URL")
        .env_remove("RESHARD_LOG");
    if let Some(url) = url {
        cmd.env("RESHARD_DATABASE_URL", url);
    }
    cmd.args(args).output().unwrap()
}

fn ok(url: &str, args: &[&str]) {
    let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
    let out = run(Some(url), &args);
    assert!(
        out.status.success(),
        "setup step {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn setup(url: &str, kind: &str) {
    let versions = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/versions");
    if kind == "none" || kind == "no_url" {
        return;
    }
    ok(url, &["db", "migrate"]);
    if kind == "migrated" {
        return;
    }
    for shard in ["s1", "s2", "s3", "s4"] {
        ok(
            url,
            &[
                "shard",
                "add",
                shard,
                "--uri",
                "mongodb://127.0.0.1:1",
                "--database",
                "shop",
                "--no-check",
            ],
        );
    }
    let create = |file: &str| {
        let path = versions.join(file);
        ok(
            url,
            &[
                "version",
                "create",
                "--collection",
                "orders",
                "--file",
                path.to_str().unwrap(),
            ],
        );
    };
    create("orders_v1.yaml");
    if kind == "v1" {
        return;
    }
    create("orders_v2.yaml");
    ok(
        url,
        &["migration", "create", "--collection", "orders", "--to", "2"],
    );
    assert_eq!(kind, "migration", "unknown setup {kind:?}");
}

/// Everything a command could change, as one comparable value.
async fn snapshot(db: &PgDb) -> Vec<String> {
    let pool = db.pool().await;
    let mut rows: Vec<String> = sqlx::query_scalar(
        "SELECT table_name::text FROM information_schema.tables
         WHERE table_schema = 'public' ORDER BY 1",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    if rows.iter().any(|t| t == "migrations") {
        let (shards, versions, migrations, events, epochs): (i64, i64, i64, i64, i64) =
            sqlx::query_as(
                "SELECT (SELECT count(*) FROM shards), (SELECT count(*) FROM routing_versions),
                        (SELECT count(*) FROM migrations), (SELECT count(*) FROM migration_events),
                        (SELECT coalesce(sum(epoch), 0)::bigint FROM migrations)",
            )
            .fetch_one(&pool)
            .await
            .unwrap();
        rows.push(format!(
            "shards={shards} versions={versions} migrations={migrations} events={events} epochs={epochs}"
        ));
    }
    rows
}

#[tokio::test]
async fn every_bad_input_case_exits_2_with_its_message_and_changes_nothing() {
    let mut failures = Vec::new();
    for case in cases() {
        let name = case.file_name().unwrap().to_string_lossy().into_owned();
        let read = |file: &str| std::fs::read_to_string(case.join(file)).ok();
        let kind = read("setup").map_or("v1".to_owned(), |s| s.trim().to_owned());
        let args: Vec<String> = read("args")
            .unwrap_or_else(|| panic!("{name}: no args file"))
            .lines()
            .map(|l| l.replace("{case}", case.to_str().unwrap()))
            .collect();
        let db = PgDb::fresh().await;
        setup(&db.url(), &kind);
        let before = snapshot(&db).await;
        let url = (kind != "no_url").then(|| db.url());
        let out = run(url.as_deref(), &args);
        let after = snapshot(&db).await;
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        let mut problems = Vec::new();
        if out.status.code() != Some(2) {
            problems.push(format!("exit code {:?}, expected 2", out.status.code()));
        }
        match read("expected") {
            Some(expected) => {
                for line in expected.lines().filter(|l| !l.trim().is_empty()) {
                    let line = line.replace("{case}", case.to_str().unwrap());
                    if !stderr.contains(&line) {
                        problems.push(format!("stderr lacks {line:?}"));
                    }
                }
            }
            None if stderr.trim().is_empty() => problems.push("no message".to_owned()),
            None => {}
        }
        for secret in SECRETS {
            if stderr.contains(secret) || stdout.contains(secret) {
                problems.push(format!("output shows the password {secret:?}"));
            }
        }
        if before != after {
            problems.push(format!("state changed: {before:?} -> {after:?}"));
        }
        if !problems.is_empty() {
            failures.push(format!(
                "{name}: {}\n--- stderr:\n{stderr}",
                problems.join("; ")
            ));
        }
    }
    assert!(failures.is_empty(), "\n{}", failures.join("\n\n"));
}

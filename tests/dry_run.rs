//! `--dry-run` on every command that changes state (issue 32): run against a state store that
//! has something for each to act on, every one exits as the change itself would (0, or its
//! refusal) and leaves every row of every table as it was. The same command without
//! `--dry-run` changes the store, so the comparison can see a change; and a command that
//! changes state cannot be added without a `--dry-run` this test runs.

mod support;

/// An `_id` string as the store holds it, in hex for a bytea literal.
fn stored(id: &str) -> String {
    hex::encode(reshard::ids::encode(&mongodb::bson::Bson::String(
        id.into(),
    )))
}

use std::collections::{BTreeMap, BTreeSet};

use support::World;

/// Every table of the store's schema, each as a digest of all its rows.
async fn rows(store: &reshard::store::Store) -> BTreeMap<String, String> {
    let tables: Vec<String> = sqlx::query_scalar(
        "SELECT table_name::text FROM information_schema.tables
         WHERE table_schema = 'public' AND table_type = 'BASE TABLE' ORDER BY 1",
    )
    .fetch_all(store.pool())
    .await
    .unwrap();
    assert!(tables.len() > 10, "{tables:?}");
    let mut out = BTreeMap::new();
    // The bypass watch's read position in each change stream moves with every read of the
    // streams (`bypass list` and the gate checks read them to their end): where a reader got
    // to, not a change a command makes. The bypasses it finds are compared with the rest.
    for table in tables.into_iter().filter(|t| t != "bypass_watches") {
        let digest: String = sqlx::query_scalar(&format!(
            "SELECT count(*)::text || ':' || coalesce(md5(string_agg(t::text, '|' ORDER BY t::text)), '')
             FROM \"{table}\" t"
        ))
        .fetch_one(store.pool())
        .await
        .unwrap();
        out.insert(table, digest);
    }
    out
}

fn bin(w: &World) -> assert_cmd::Command {
    let mut cmd = support::bin_without_db();
    cmd.env("RESHARD_DATABASE_URL", w.db.url());
    cmd
}

/// Runs `reshard ARGS --dry-run --output json`: its exit code, stdout and stderr.
fn dry(w: &World, args: &[&str]) -> (i32, String, String) {
    let out = bin(w)
        .args(args)
        .args(["--dry-run", "--output", "json"])
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// What each command acts on, made by hand in the store: a shard no version uses, a hook, an
/// open dead letter, an open bypass, a router whose lease ran out long ago, a playbook at an
/// approval, a shadow-read mismatch; the migration is in reconcile, where repair runs.
async fn set_up(w: &World) {
    let id = w.migration;
    let sql = [
        format!("UPDATE migrations SET phase = 'reconcile', epoch = 6 WHERE id = {id}"),
        "INSERT INTO shards (name, uri, database) VALUES ('spare', 'mongodb://127.0.0.1:1', 'spare')"
            .to_owned(),
        format!(
            "INSERT INTO dead_letters (migration_id, doc_id, doc_id_text, target, message)
             VALUES ({id}, '\\x{}', 'o-dead', 's1/orders', 'refused')",
            stored("o-dead")
        ),
        format!(
            "INSERT INTO bypasses (migration_id, shard, collection, doc_id, doc_id_text, operation,
                                   phase, happened_at)
             VALUES ({id}, 's1', 'orders', '\\x{}', 'o-bypass', 'update', 'reconcile', now())",
            stored("o-bypass")
        ),
        format!(
            "INSERT INTO routers (id, collection, name, host, pid, lease_expires_at, migration_id,
                                  acked_epoch)
             VALUES ('00000000-0000-0000-0000-0000000000aa', 'orders', 'gone', 'h', 1,
                     now() - interval '1 hour', {id}, 6)"
        ),
        format!(
            "INSERT INTO playbooks (name, migration_id, content)
             VALUES ('pb', {id}, '{{\"steps\": [{{\"name\": \"go\", \"approve\": {{\"message\": \"ok?\"}}}}]}}')"
        ),
        format!(
            "INSERT INTO shadow_mismatches (migration_id, doc_id, doc_id_text, source_location,
                                            target_location, router_name)
             VALUES ({id}, '\\x{}', 'o-shadow', 's1/orders', 's2/orders', 'app')",
            stored("o-shadow")
        ),
    ];
    for s in sql {
        sqlx::query(&s)
            .execute(w.store.pool())
            .await
            .unwrap_or_else(|e| panic!("{s}: {e}"));
    }
    let id = id.to_string();
    bin(w)
        .args([
            "hook",
            "add",
            &id,
            "--name",
            "page",
            "--on",
            "all",
            "--command",
            "true",
        ])
        .assert()
        .success();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_command_that_changes_state_changes_nothing_with_dry_run() {
    let w = World::start().await;
    set_up(&w).await;
    let id = w.migration.to_string();
    let id = id.as_str();
    // (command, arguments, the exit the change itself would have: 0, or its refusal.)
    let cases: Vec<(&str, Vec<&str>, i32)> = vec![
        ("db migrate", vec!["db", "migrate"], 0),
        (
            "shard add",
            vec![
                "shard",
                "add",
                "s9",
                "--uri",
                "mongodb://127.0.0.1:1",
                "--database",
                "s9",
                "--no-check",
            ],
            0,
        ),
        ("shard remove", vec!["shard", "remove", "spare"], 0),
        // The collection has a migration under way: creating another is refused.
        (
            "migration create",
            vec![
                "migration",
                "create",
                "--collection",
                "orders",
                "--to",
                "2",
                "--from",
                "1",
            ],
            2,
        ),
        (
            "migration pause",
            vec!["migration", "pause", id, "--reason", "r"],
            0,
        ),
        // Not paused: nothing to resume.
        ("migration resume", vec!["migration", "resume", id], 2),
        (
            "migration configure",
            vec!["migration", "configure", id, "--max-missing", "3"],
            0,
        ),
        (
            "migration advance",
            vec!["migration", "advance", id, "--to", "new_reads"],
            1,
        ),
        ("migration rollback", vec!["migration", "rollback", id], 0),
        (
            "throttle set",
            vec!["throttle", "set", id, "--batch-size", "50"],
            0,
        ),
        (
            "deadletter retry",
            vec!["deadletter", "retry", id, "--id", "o-dead"],
            0,
        ),
        (
            "deadletter skip",
            vec!["deadletter", "skip", id, "--id", "o-dead", "--reason", "r"],
            0,
        ),
        (
            "bypass resolve",
            vec![
                "bypass", "resolve", id, "--id", "o-bypass", "--action", "recopy", "--reason", "r",
            ],
            0,
        ),
        (
            "hook add",
            vec![
                "hook",
                "add",
                id,
                "--name",
                "more",
                "--on",
                "failure",
                "--command",
                "true",
            ],
            0,
        ),
        ("hook remove", vec!["hook", "remove", id, "page"], 0),
        ("hook deliver", vec!["hook", "deliver", id], 0),
        (
            "router remove",
            vec!["router", "remove", "00000000-0000-0000-0000-0000000000aa"],
            0,
        ),
        (
            "approve",
            vec!["approve", id, "--step", "go", "--reason", "r"],
            0,
        ),
        ("repair", vec!["repair", id], 0),
        (
            "version create",
            vec![
                "version",
                "create",
                "--collection",
                "orders",
                "--file",
                "tests/fixtures/versions/orders_v2.yaml",
            ],
            0,
        ),
        // The example playbook names shards the store holds under other URIs: refused.
        ("run", vec!["run", "playbooks/hot-tenant.yaml"], 2),
    ];
    let before = rows(&w.store).await;
    let mut exits = Vec::new();
    for (name, args, expected) in &cases {
        let (code, stdout, stderr) = dry(&w, args);
        exits.push((*name, code, *expected, stderr.clone()));
        if code == 0 && *name != "run" {
            let value: serde_json::Value = serde_json::from_str(&stdout)
                .unwrap_or_else(|e| panic!("{name}: not one JSON value ({e}): {stdout}"));
            assert_eq!(value["dry_run"], true, "{name}: {value}");
        }
        let after = rows(&w.store).await;
        let changed: Vec<&String> = before
            .keys()
            .filter(|t| before.get(*t) != after.get(*t))
            .collect();
        assert!(
            changed.is_empty(),
            "{name} --dry-run changed {changed:?}\n{stdout}\n{stderr}"
        );
    }
    let wrong: Vec<_> = exits.iter().filter(|(_, c, e, _)| c != e).collect();
    assert!(
        wrong.is_empty(),
        "exits other than the change's own: {wrong:#?}"
    );

    // Every command with a --dry-run is run above; every command without one is known not
    // to change the store's state by an operator's request.
    let covered: BTreeSet<&str> = cases.iter().map(|(n, _, _)| *n).collect();
    let (with, without) = commands();
    let missed: Vec<&String> = with
        .iter()
        .filter(|c| !covered.contains(c.as_str()))
        .collect();
    assert!(
        missed.is_empty(),
        "commands with --dry-run this test does not run: {missed:?}"
    );
    // Reads, and the processes that do the migration's work or serve (worker, front,
    // exporter, a full reconciliation run, which records its findings as its result).
    let read_only: BTreeSet<&str> = [
        "db status",
        "shard list",
        "version list",
        "version show",
        "migration list",
        "migration show",
        "migration history",
        "migration wait",
        "migration status",
        "route locate",
        "route check",
        "route explain",
        "router list",
        "worker",
        "throttle show",
        "deadletter list",
        "bypass list",
        "hook list",
        "reconcile",
        "reconcile show",
        "playbook validate",
        "playbook schema",
        "plan",
        "front",
        "front hash-user",
        "exporter",
        "completion",
        "man",
    ]
    .into_iter()
    .collect();
    let unknown: Vec<&String> = without
        .iter()
        .filter(|c| !read_only.contains(c.as_str()))
        .collect();
    assert!(
        unknown.is_empty(),
        "commands without --dry-run that are not known to only read: {unknown:?} (give a command \
         that changes state a --dry-run, and run it here)"
    );

    // The comparison sees a change: the same command, not dry.
    bin(&w)
        .args(["shard", "remove", "spare"])
        .assert()
        .success();
    let changed = rows(&w.store).await;
    assert_ne!(before.get("shards"), changed.get("shards"));
}

/// The leaf commands of the command line (`migration pause`, `approve`), with and without a
/// `--dry-run` flag.
fn commands() -> (BTreeSet<String>, BTreeSet<String>) {
    use clap::CommandFactory;
    fn walk(
        cmd: &clap::Command,
        path: &str,
        with: &mut BTreeSet<String>,
        without: &mut BTreeSet<String>,
    ) {
        let subs: Vec<&clap::Command> = cmd
            .get_subcommands()
            // Hidden commands are old names of shown ones (`routers`, `forget`), run the same
            // code and are tested in tests/vocabulary.rs.
            .filter(|c| c.get_name() != "help" && !c.is_hide_set())
            .collect();
        let runnable = subs.is_empty() || !cmd.is_subcommand_required_set();
        if !path.is_empty() && runnable {
            if cmd.get_arguments().any(|a| a.get_long() == Some("dry-run")) {
                with.insert(path.to_owned());
            } else {
                without.insert(path.to_owned());
            }
        }
        for sub in subs {
            let next = if path.is_empty() {
                sub.get_name().to_owned()
            } else {
                format!("{path} {}", sub.get_name())
            };
            walk(sub, &next, with, without);
        }
    }
    let (mut with, mut without) = (BTreeSet::new(), BTreeSet::new());
    walk(&reshard::cli::Cli::command(), "", &mut with, &mut without);
    (with, without)
}

//! One vocabulary in JSON (issue 32): every key every read command prints under
//! `--output json` is snake_case, and a key that holds a duration or a rate says its unit
//! (`_ms`, `_secs`, `_per_sec`). Document ids and Extended JSON (`_id`, `$oid`, ...) are the
//! documents' own.

mod support;

use support::World;

fn json(w: &World, args: &[&str]) -> serde_json::Value {
    let out = support::bin_without_db()
        .env("RESHARD_DATABASE_URL", w.db.url())
        .args(args)
        .args(["--output", "json"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "reshard {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("reshard {args:?}: not JSON ({e})"))
}

/// Every key of `v` with its path, `command.a.b[].c`.
fn keys(v: &serde_json::Value, path: &str, out: &mut Vec<(String, String)>) {
    match v {
        serde_json::Value::Object(map) => {
            for (k, child) in map {
                out.push((path.to_owned(), k.clone()));
                // An Extended JSON value or a document's own fields are not ours to name.
                if k.starts_with('$') || k == "_id" || k == "document" {
                    continue;
                }
                keys(child, &format!("{path}.{k}"), out);
            }
        }
        serde_json::Value::Array(items) => {
            for item in items {
                keys(item, &format!("{path}[]"), out);
            }
        }
        _ => {}
    }
}

/// Why `key` breaks the style, if it does.
fn broken(key: &str) -> Option<&'static str> {
    if key == "_id" || key.starts_with('$') {
        return None;
    }
    let snake = key.starts_with(|c: char| c.is_ascii_lowercase())
        && key
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
    if !snake {
        return Some("not snake_case");
    }
    let timed = [
        "latency", "timeout", "eta", "age", "duration", "interval", "elapsed",
    ];
    let words: Vec<&str> = key.split('_').collect();
    // A factor (`latency_budget_factor`) is a multiple, not a duration.
    let has_unit = ["ms", "secs", "sec", "seconds", "at", "factor"]
        .iter()
        .any(|u| words.last() == Some(u))
        || key.ends_with("_per_sec");
    if words.iter().any(|w| timed.contains(w)) && !has_unit {
        return Some("a duration without its unit (_ms, _secs)");
    }
    None
}

#[test]
fn the_style_rule_sees_what_it_should() {
    assert_eq!(broken("documents_copied"), None);
    assert_eq!(broken("lease_age_secs"), None);
    assert_eq!(broken("docs_per_sec"), None);
    assert_eq!(broken("_id"), None);
    assert!(broken("documentsCopied").is_some());
    assert!(broken("approxDocumentsToCopy").is_some());
    assert!(broken("lease_age").is_some());
    assert!(broken("timeout").is_some());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_key_of_every_read_commands_json_is_snake_case_with_units() {
    let w = World::start().await;
    let id = w.migration.to_string();
    let id = id.as_str();
    // Something in each listing: a hook, a dead letter, a bypass, a router.
    support::bin_without_db()
        .env("RESHARD_DATABASE_URL", w.db.url())
        .args([
            "hook",
            "add",
            id,
            "--name",
            "page",
            "--on",
            "all",
            "--command",
            "true",
        ])
        .assert()
        .success();
    for s in [
        format!(
            "INSERT INTO dead_letters (migration_id, doc_id, doc_id_text, target, message)
             VALUES ({id}, '\\x01', 'o-dead', 's1/orders', 'refused')"
        ),
        format!(
            "INSERT INTO bypasses (migration_id, shard, collection, doc_id, doc_id_text, operation,
                                   phase, happened_at)
             VALUES ({id}, 's1', 'orders', '\\x01', 'o-bypass', 'update', 'planned', now())"
        ),
    ] {
        sqlx::query(&s).execute(w.store.pool()).await.unwrap();
    }
    let router = w.router(reshard::router::RouterConfig::named("app")).await;
    let commands: Vec<Vec<&str>> = vec![
        vec!["db", "status"],
        vec!["shard", "list"],
        vec!["version", "list"],
        vec!["version", "show", "--collection", "orders"],
        vec!["migration", "list", "--all"],
        vec!["migration", "show", id],
        vec!["migration", "status", id],
        vec!["migration", "history", id],
        vec!["routers", "list"],
        vec!["throttle", "show", id],
        vec!["deadletter", "list", id, "--all"],
        vec!["hook", "list", id],
        vec!["migration", "advance", id, "--to", "dual_read", "--dry-run"],
    ];
    let mut wrong = Vec::new();
    for args in &commands {
        let value = json(&w, args);
        let mut found = Vec::new();
        keys(&value, &args.join(" "), &mut found);
        for (path, key) in found {
            if let Some(why) = broken(&key) {
                wrong.push(format!("{path}.{key}: {why}"));
            }
        }
    }
    router.shutdown().await;
    wrong.sort();
    wrong.dedup();
    assert!(wrong.is_empty(), "keys out of style:\n{}", wrong.join("\n"));
}

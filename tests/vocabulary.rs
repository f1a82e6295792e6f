//! One vocabulary in JSON (issue 32): every key every read command prints under
//! `--output json` is snake_case, and a key that holds a duration or a rate says its unit
//! (`_ms`, `_secs`, `_per_sec`). Document ids and Extended JSON (`_id`, `$oid`, ...) are the
//! documents' own.

mod support;

/// An `_id` string as the store holds it, in hex for a bytea literal.
fn stored(id: &str) -> String {
    hex::encode(reshard::ids::encode(&mongodb::bson::Bson::String(
        id.into(),
    )))
}

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

type Object = serde_json::Map<String, serde_json::Value>;

/// Calls `visit(path, object, key)` for every key of every object in `v`, its path written
/// `command.a.b[].c`.
fn walk(v: &serde_json::Value, path: &str, visit: &mut impl FnMut(&str, &Object, &str)) {
    match v {
        serde_json::Value::Object(map) => {
            for (k, child) in map {
                visit(path, map, k);
                // An Extended JSON value or a document's own fields are not ours to name.
                if k.starts_with('$') || k == "_id" || k == "document" {
                    continue;
                }
                walk(child, &format!("{path}.{k}"), visit);
            }
        }
        serde_json::Value::Array(items) => {
            for item in items {
                walk(item, &format!("{path}[]"), visit);
            }
        }
        _ => {}
    }
}

/// Every key of `v` with its path.
fn keys(v: &serde_json::Value, path: &str, out: &mut Vec<(String, String)>) {
    walk(v, path, &mut |path, _, k| {
        out.push((path.to_owned(), k.to_owned()))
    });
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

/// Why the key `key` of `object` breaks the shared names, if it does: a migration another
/// object refers to is `migration_id`, why it failed is `failure_reason`. An old name
/// (`reshard::vocabulary::RENAMED_KEYS`) is allowed only beside its new one, with its value,
/// until 0.2. A hook's `migration` is the migration itself (an object), not a reference.
fn unshared(object: &Object, key: &str) -> Option<String> {
    let value = &object[key];
    for (old, new) in reshard::vocabulary::RENAMED_KEYS {
        if key != *old || value.is_object() {
            continue;
        }
        if object.get(*new) == Some(value) {
            return None;
        }
        return Some(format!(
            "`{old}` is `{new}` (the old name only beside the new, until 0.2)"
        ));
    }
    None
}

/// Every shared-name problem of `v`, with its path.
fn unshared_names(v: &serde_json::Value, path: &str, out: &mut Vec<String>) {
    walk(v, path, &mut |path, map, k| {
        if let Some(why) = unshared(map, k) {
            out.push(format!("{path}.{k}: {why}"));
        }
    });
}

#[test]
fn the_shared_names_rule_sees_what_it_should() {
    let problems = |v: serde_json::Value| {
        let mut out = Vec::new();
        unshared_names(&v, "c", &mut out);
        out
    };
    assert!(problems(serde_json::json!({ "migration_id": 3 })).is_empty());
    assert!(problems(serde_json::json!({ "migration_id": 3, "migration": 3 })).is_empty());
    assert!(problems(
        serde_json::json!({ "migration": { "id": 3, "failure_reason": null, "failure": null } })
    )
    .is_empty());
    assert_eq!(problems(serde_json::json!({ "migration": 3 })).len(), 1);
    assert_eq!(
        problems(serde_json::json!({ "migration_id": 4, "migration": 3 })).len(),
        1
    );
    assert_eq!(
        problems(serde_json::json!({ "x": [{ "failure": "boom" }] })).len(),
        1
    );
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
             VALUES ({id}, '\\x{}', 'o-dead', 's1/orders', 'refused')",
            stored("o-dead")
        ),
        format!(
            "INSERT INTO bypasses (migration_id, shard, collection, doc_id, doc_id_text, operation,
                                   phase, happened_at)
             VALUES ({id}, 's1', 'orders', '\\x{}', 'o-bypass', 'update', 'planned', now())",
            stored("o-bypass")
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
        vec!["router", "list"],
        vec!["throttle", "show", id],
        vec!["throttle", "set", id, "--batch-size", "100", "--dry-run"],
        vec![
            "migration",
            "configure",
            id,
            "--max-missing",
            "0",
            "--dry-run",
        ],
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
        unshared_names(&value, &args.join(" "), &mut wrong);
    }
    router.shutdown().await;
    wrong.sort();
    wrong.dedup();
    assert!(wrong.is_empty(), "keys out of style:\n{}", wrong.join("\n"));
}

/// Ids as values (issue 32): an int64 `_id` and a string `_id` that read alike are two ids in
/// JSON (canonical Extended JSON keeps the type), in text (the string is quoted) and in
/// `--id` (Extended JSON, a bare number or a quoted string picks exactly one of them).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_int_id_and_a_string_id_that_read_alike_stay_two_ids() {
    use mongodb::bson::Bson;
    let w = World::start().await;
    let id = w.migration.to_string();
    let id = id.as_str();
    let int = reshard::ids::encode(&Bson::Int64(13_996_721));
    let string = reshard::ids::encode(&Bson::String("13996721".into()));
    for (doc_id, shard) in [(&int, "s1"), (&string, "s2")] {
        sqlx::query(
            "INSERT INTO dead_letters (migration_id, doc_id, doc_id_text, target, message)
             VALUES ($1, $2, '13996721', $3, 'refused')",
        )
        .bind(w.migration)
        .bind(doc_id)
        .bind(format!("{shard}/orders"))
        .execute(w.store.pool())
        .await
        .unwrap();
        sqlx::query(
            "INSERT INTO bypasses (migration_id, shard, collection, doc_id, doc_id_text,
                                   operation, phase, happened_at)
             VALUES ($1, $2, 'orders', $3, '13996721', 'update', 'planned', now())",
        )
        .bind(w.migration)
        .bind(shard)
        .bind(doc_id)
        .execute(w.store.pool())
        .await
        .unwrap();
    }
    let long = serde_json::json!({"$numberLong": "13996721"});
    let text = serde_json::json!("13996721");
    let ids_of = |v: &serde_json::Value| -> Vec<serde_json::Value> {
        v.as_array()
            .unwrap()
            .iter()
            .map(|r| r["_id"].clone())
            .collect()
    };
    let letters = json(&w, &["deadletter", "list", id]);
    assert_eq!(
        ids_of(&letters),
        [long.clone(), text.clone()],
        "{letters:#}"
    );
    let bypasses = json(&w, &["bypass", "list", id]);
    assert_eq!(
        ids_of(&bypasses),
        [long.clone(), text.clone()],
        "{bypasses:#}"
    );

    let table = support::bin_without_db()
        .env("RESHARD_DATABASE_URL", w.db.url())
        .args(["deadletter", "list", id])
        .output()
        .unwrap();
    let table = String::from_utf8_lossy(&table.stdout).into_owned();
    assert!(table.contains(" 13996721 "), "{table}");
    assert!(table.contains(" \"13996721\" "), "{table}");

    let cli = |args: &[&str]| {
        support::bin_without_db()
            .env("RESHARD_DATABASE_URL", w.db.url())
            .args(args)
            .args(["--output", "json"])
            .output()
            .unwrap()
    };
    // A quoted string names the string id only.
    json(
        &w,
        &[
            "deadletter",
            "skip",
            id,
            "--id",
            "\"13996721\"",
            "--reason",
            "r",
        ],
    );
    let open = json(&w, &["deadletter", "list", id]);
    assert_eq!(ids_of(&open), std::slice::from_ref(&long), "{open:#}");
    // Once the string is gone, a bare number does not fall back to it, and the error says
    // how a string id is given.
    let out = cli(&[
        "bypass", "resolve", id, "--id", "13996722", "--action", "ignore", "--reason", "r",
    ]);
    assert_eq!(out.status.code(), Some(2));
    let error: serde_json::Value = serde_json::from_slice(&out.stderr).unwrap();
    assert!(
        error["error"]["hint"]
            .as_str()
            .unwrap()
            .contains("--id '\"13996722\"'"),
        "{error:#}"
    );
    // Extended JSON names the int64 id only.
    let resolved = json(
        &w,
        &[
            "bypass",
            "resolve",
            id,
            "--id",
            r#"{"$numberLong": "13996721"}"#,
            "--action",
            "ignore",
            "--reason",
            "r",
        ],
    );
    assert_eq!(
        ids_of(&resolved),
        std::slice::from_ref(&long),
        "{resolved:#}"
    );
    let open = json(&w, &["bypass", "list", id]);
    assert_eq!(ids_of(&open), std::slice::from_ref(&text), "{open:#}");
    // A bare number names the number, whatever its width.
    json(
        &w,
        &[
            "deadletter",
            "skip",
            id,
            "--id",
            "13996721",
            "--reason",
            "r",
        ],
    );
    let open = json(&w, &["deadletter", "list", id]);
    assert_eq!(open, serde_json::json!([]), "{open:#}");
    let out = cli(&[
        "deadletter",
        "skip",
        id,
        "--id",
        "{\"$oid\": 1",
        "--reason",
        "r",
    ]);
    assert_eq!(out.status.code(), Some(2));
    let error = String::from_utf8_lossy(&out.stderr);
    assert!(error.contains("not JSON"), "{error}");
}

/// The old command words (`reshard::vocabulary::RENAMED_COMMANDS`) and flags (`RENAMED_FLAGS`)
/// still run their command until 0.2, each with one warning that names the new words; the new words warn of nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn old_command_words_still_work_with_a_warning_naming_the_new_ones() {
    let w = World::start().await;
    let id = w.migration.to_string();
    sqlx::query(&format!(
        "INSERT INTO playbooks (name, migration_id, content)
         VALUES ('pb', {id}, '{{\"steps\": [{{\"name\": \"go\", \"approve\": {{}}}}]}}')"
    ))
    .execute(w.store.pool())
    .await
    .unwrap();
    let run = |args: &[&str]| {
        let out = support::bin_without_db()
            .env("RESHARD_DATABASE_URL", w.db.url())
            .args(args)
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let unknown = "00000000-0000-0000-0000-0000000000aa";
    for (args, new_words, code) in [
        (vec!["routers", "list"], Some("`router`"), Some(0)),
        // No such router: the command ran (and refused), after the warning.
        (
            vec!["routers", "forget", unknown],
            Some("`router remove`"),
            Some(2),
        ),
        (
            vec!["router", "forget", unknown],
            Some("`router remove`"),
            Some(2),
        ),
        (
            vec!["approve", "pb", "--step", "go", "--dry-run"],
            Some("is deprecated and goes in"),
            Some(0),
        ),
        (
            vec![
                "migration",
                "configure",
                &id,
                "--shadow-reads",
                "5",
                "--dry-run",
            ],
            Some("`--shadow-read-percent`"),
            Some(0),
        ),
        (
            vec![
                "migration",
                "configure",
                &id,
                "--shadow-read-percent",
                "5",
                "--dry-run",
            ],
            None,
            Some(0),
        ),
        (vec!["router", "list"], None, Some(0)),
        (vec!["router", "remove", unknown], None, Some(2)),
        (
            vec!["approve", &id, "--step", "go", "--dry-run"],
            None,
            Some(0),
        ),
    ] {
        let (got, stderr) = run(&args);
        assert_eq!(got, code, "reshard {args:?}: {stderr}");
        match new_words {
            Some(words) => {
                assert_eq!(
                    stderr.matches("is deprecated").count(),
                    1,
                    "{args:?}: {stderr}"
                );
                assert!(stderr.contains(words), "{args:?}: {stderr}");
                assert!(
                    stderr.contains(reshard::vocabulary::OLD_NAMES_UNTIL),
                    "{stderr}"
                );
            }
            None => assert!(!stderr.contains("deprecated"), "{args:?}: {stderr}"),
        }
    }
    // The approval by name names the migration's id as the new form.
    let (_, stderr) = run(&["approve", "pb", "--step", "go", "--dry-run"]);
    assert!(
        stderr.contains(&format!("`approve {id} --step ...`")),
        "{stderr}"
    );
    // Neither form finds a playbook that is not there, and the error says what approve takes.
    let (code, stderr) = run(&["approve", "nope", "--step", "go"]);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("takes the migration's id"), "{stderr}");
}

/// One name per setting (issue 31): the stored settings (`MigrationSettings`), the playbook's
/// `settings`, a step's options that override them, the flags of `throttle set` and
/// `migration configure` call each setting by one name. A stored
/// or printed name may only add its unit (`_ms`, `_secs`) to what people type a duration in.
#[test]
fn every_setting_has_one_name_in_settings_playbooks_and_flags() {
    use clap::CommandFactory;
    let stored: Vec<String> = match reshard::settings::MigrationSettings::default().to_json() {
        serde_json::Value::Object(m) => m.keys().cloned().collect(),
        other => panic!("{other}"),
    };
    // A typed name is the stored one, or the stored one without its unit; the latency budget
    // is typed once (`25ms` or `1.3x`) and stored as its two forms.
    let is_stored = |name: &str| {
        stored.iter().any(|s| {
            s == name
                || ["_ms", "_secs", "_factor"]
                    .iter()
                    .any(|unit| s.strip_suffix(unit) == Some(name))
        })
    };
    let schema = reshard::spec::playbook::schema();
    let schema = serde_json::to_value(&schema).unwrap();
    let properties = |name: &str| -> Vec<String> {
        let props = schema["$defs"][name]["properties"]
            .as_object()
            .unwrap_or_else(|| panic!("no {name} in the schema"));
        props.keys().cloned().collect()
    };
    let settings = properties("SettingsDoc");
    for key in &settings {
        assert!(
            is_stored(key),
            "playbook settings.{key} is not a stored setting's name"
        );
    }
    // What a step overrides of the settings is called as in `settings`; `workers` and
    // `lease_ttl` are the step's own.
    for key in properties("WorkersDoc") {
        if key != "workers" && key != "lease_ttl" {
            assert!(
                settings.contains(&key),
                "step option {key} is not a setting's name"
            );
        }
    }
    let cli = reshard::cli::Cli::command();
    for path in [["throttle", "set"], ["migration", "configure"]] {
        let command = cli
            .find_subcommand(path[0])
            .and_then(|c| c.find_subcommand(path[1]))
            .unwrap();
        for arg in command.get_arguments().filter(|a| !a.is_hide_set()) {
            let Some(long) = arg.get_long() else { continue };
            let name = long.replace('-', "_");
            let own = [
                "reason",
                "dry_run",
                "keep_empty_source",
                "output",
                "log_format",
                "actor",
            ];
            if own.contains(&name.as_str()) || arg.is_global_set() {
                continue;
            }
            assert!(
                is_stored(&name),
                "reshard {} --{long} is not a stored setting's name",
                path.join(" ")
            );
        }
    }
}

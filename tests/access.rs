//! `shards` is the one MongoDB access layer (ARCHITECTURE.md, "Architecture invariants"): no
//! file of `src/` outside `src/shards/` holds a MongoDB client, database, collection, cursor
//! or session handle, opens one, or sends a command through one. What the rest of the crate
//! does on a shard, it asks `shards` for by name (a scan, a count, a sample, a step command,
//! a bulk write, a purge, a change stream), so a reader finds every server call in one place
//! and a decision cannot hide in a raw driver call.
//!
//! The rule is read from the source text, as `tests/layering.rs` reads the layers: comments
//! are not code, and the driver's data types (BSON, options, errors, a change stream's
//! events) are not handles and may be named anywhere.

#[path = "support/source.rs"]
mod source;
use source::{is_ident, root, rust_files};

/// The driver's handle types: whoever holds one can send any command.
const HANDLES: &[&str] = &[
    "Client",
    "Collection",
    "Database",
    "Cursor",
    "ClientSession",
    "SessionCursor",
];

/// Calls that take or give a handle, or send a command through one: `.database(name)` and
/// `.collection(name)` (with an argument: the front's `engine.database()` is a name),
/// commands, sessions, and a client's constructors.
const CALLS: &[&str] = &[
    ".collection::<",
    ".run_command(",
    ".run_cursor_command(",
    ".list_collection_names(",
    ".list_database_names(",
    ".start_session(",
    "Client::with_uri_str(",
    "Client::with_options(",
];

/// Whether `text` holds `word` as a whole identifier.
fn has_word(text: &str, word: &str) -> bool {
    text.match_indices(word).any(|(at, _)| {
        let before = text[..at].chars().next_back();
        let after = text[at + word.len()..].chars().next();
        !before.is_some_and(is_ident) && !after.is_some_and(is_ident)
    })
}

/// The code of `source` without its comments (line comments, and doc comments, which are
/// line comments too).
fn code(source: &str) -> String {
    source
        .lines()
        .map(|line| {
            // A `//` inside a string literal (a URI) is not a comment: the quotes before it
            // are odd.
            let comment = line
                .match_indices("//")
                .map(|(at, _)| at)
                .find(|at| line[..*at].matches('"').count() % 2 == 0);
            comment.map_or(line, |at| &line[..at])
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// What in `source` breaks the access rule, one line each.
fn breaches(source: &str) -> Vec<String> {
    let code = code(source);
    let mut out = Vec::new();
    for handle in HANDLES {
        let path = format!("mongodb::{handle}");
        if has_word(&code, &path) {
            out.push(format!("names `{path}`"));
        }
    }
    // `use mongodb::{Client, bson::doc};`, over as many lines as it takes.
    for (at, _) in code.match_indices("use mongodb::{") {
        let group = &code[at..];
        let group = &group[..group.find("};").unwrap_or(group.len())];
        for handle in HANDLES {
            if has_word(group, handle) {
                out.push(format!("imports `mongodb::{handle}`"));
            }
        }
    }
    for call in CALLS {
        if code.contains(call) {
            out.push(format!("calls `{call}`"));
        }
    }
    for method in [".collection(", ".database("] {
        for (at, _) in code.match_indices(method) {
            let rest = code[at + method.len()..].trim_start();
            if !rest.starts_with(')') {
                out.push(format!("calls `{method}..)` for a handle"));
            }
        }
    }
    out.sort();
    out.dedup();
    out
}

#[test]
fn no_file_outside_shards_holds_or_uses_a_mongodb_handle() {
    let src = root().join("src");
    let shards = src.join("shards");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    files.sort();
    let mut found = Vec::new();
    for file in files.iter().filter(|f| !f.starts_with(&shards)) {
        let text = std::fs::read_to_string(file).unwrap();
        for breach in breaches(&text) {
            found.push(format!(
                "{}: {breach}",
                file.strip_prefix(root()).unwrap().display()
            ));
        }
    }
    assert!(
        files.iter().filter(|f| !f.starts_with(&shards)).count() > 100,
        "the scan found too few files to mean anything"
    );
    assert!(
        found.is_empty(),
        "MongoDB handles outside src/shards/ (ask `shards` for a named operation):\n{}",
        found.join("\n")
    );
}

#[test]
fn the_shards_layer_itself_holds_the_handles_the_rule_looks_for() {
    // The rule is not vacuous: the layer it leaves alone does what it forbids elsewhere.
    let text = std::fs::read_to_string(root().join("src/shards/mod.rs")).unwrap();
    let found = breaches(&text);
    assert!(
        found.iter().any(|b| b.contains("mongodb::Database")),
        "{found:?}"
    );
    assert!(found.iter().any(|b| b.contains(".database(")), "{found:?}");
}

#[test]
fn the_reader_finds_every_form_of_a_handle() {
    for (line, expected) in [
        (
            "let c: mongodb::Collection<Document> = x;",
            "names `mongodb::Collection`",
        ),
        ("use mongodb::Database;", "names `mongodb::Database`"),
        (
            "use mongodb::{\n    bson::doc,\n    Client,\n};",
            "imports `mongodb::Client`",
        ),
        (
            "shards.collection(&location)?.find(f)",
            "calls `.collection(..)` for a handle",
        ),
        (
            "let db = shards.database(\n &shard)?;",
            "calls `.database(..)` for a handle",
        ),
        (
            "db.run_command(doc! { \"ping\": 1 })",
            "calls `.run_command(`",
        ),
        (
            "let c = Client::with_uri_str(uri).await?;",
            "calls `Client::with_uri_str(`",
        ),
        ("d.collection::<Document>(\"x\")", "calls `.collection::<`"),
    ] {
        assert!(
            breaches(line).contains(&expected.to_owned()),
            "{line:?}: {:?}",
            breaches(line)
        );
    }
    for innocent in [
        "// shards.collection(&location) is gone",
        "/// Holds a mongodb::Database once.",
        "if command.database == engine.database() {",
        "use mongodb::bson::{doc, Document};",
        "use mongodb::options::WriteConcern;",
        "let e: mongodb::error::Error = x;",
        "let u = \"mongodb://h/db\"; // a mongodb::Client",
        "struct DatabaseName;",
    ] {
        assert_eq!(breaches(innocent), Vec::<String>::new(), "{innocent:?}");
    }
}

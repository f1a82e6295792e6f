//! The layer order of `src/` (ARCHITECTURE.md, "Layers") holds: every `crate::` edge between
//! top-level modules runs from a layer to the same or a lower one, every module is in the
//! table, and the module graph has no cycle. The table is read from ARCHITECTURE.md itself,
//! so the document and the code cannot drift apart silently.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

#[path = "support/source.rs"]
mod source;
use source::{is_ident, root, rust_files};

/// `module -> layer`, from the table under "## Layers" in ARCHITECTURE.md: rows
/// `| N name | module, module, ... |`.
fn layers() -> BTreeMap<String, u32> {
    let text = std::fs::read_to_string(root().join("ARCHITECTURE.md")).unwrap();
    let section = text
        .split("\n## Layers")
        .nth(1)
        .expect("ARCHITECTURE.md has a '## Layers' section");
    let section = section.split("\n## ").next().unwrap();
    let mut out = BTreeMap::new();
    for line in section.lines() {
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        if cells.len() < 4 {
            continue;
        }
        let Some(layer) = cells[1]
            .split_whitespace()
            .next()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        for module in cells[2].split(',') {
            let module = module.trim().trim_matches('`');
            if !module.is_empty() {
                assert!(
                    out.insert(module.to_owned(), layer).is_none(),
                    "{module} is in two layers"
                );
            }
        }
    }
    assert!(!out.is_empty(), "no layer rows found in ARCHITECTURE.md");
    out
}

/// The module path of a file under `src/`: `["router", "exec"]` for `src/router/exec.rs`,
/// `["router"]` for `src/router/mod.rs`, `[]` for `lib.rs` and `main.rs`.
fn module_path(file: &Path) -> Vec<String> {
    let rel = file.strip_prefix(root().join("src")).unwrap();
    let mut parts: Vec<String> = rel
        .iter()
        .map(|p| p.to_string_lossy().trim_end_matches(".rs").to_owned())
        .collect();
    if matches!(
        parts.last().map(String::as_str),
        Some("mod" | "lib" | "main")
    ) {
        parts.pop();
    }
    parts
}

/// The top-level modules a line of code names: `crate::x`, `crate::{x, y::z}`, and
/// `super::` paths that climb to the crate root.
fn referenced(line: &str, path: &[String]) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = line;
    while let Some(at) = rest.find("crate::") {
        // `reshard_crate::` or `mycrate::` are not ours.
        let before = rest[..at].chars().last();
        rest = &rest[at + "crate::".len()..];
        if before.is_some_and(is_ident) {
            continue;
        }
        if let Some(group) = rest.strip_prefix('{') {
            // `crate::{a, b::c, d::{e}}`: the names at depth one.
            let mut depth = 1;
            let mut name = String::new();
            let mut at_start = true;
            for c in group.chars() {
                if depth == 1 && at_start && is_ident(c) {
                    name.push(c);
                    continue;
                }
                if !name.is_empty() {
                    out.push(std::mem::take(&mut name));
                    at_start = false;
                }
                match c {
                    '{' => depth += 1,
                    '}' => {
                        depth -= 1;
                        if depth == 0 {
                            break;
                        }
                    }
                    ',' if depth == 1 => at_start = true,
                    _ => {}
                }
            }
            if !name.is_empty() {
                out.push(name);
            }
        } else {
            let name: String = rest.chars().take_while(|c| is_ident(*c)).collect();
            if !name.is_empty() {
                out.push(name);
            }
        }
    }
    // `super::` from a file `depth` modules deep climbs to the root after `depth` steps.
    let depth = path.len();
    let mut rest = line;
    while let Some(at) = rest.find("super::") {
        let before = rest[..at].chars().last();
        let mut tail = &rest[at..];
        let mut climbs = 0;
        while let Some(t) = tail.strip_prefix("super::") {
            climbs += 1;
            tail = t;
        }
        rest = tail;
        if before.is_some_and(is_ident) || climbs < depth {
            continue;
        }
        let name: String = tail.chars().take_while(|c| is_ident(*c)).collect();
        if !name.is_empty() {
            out.push(name);
        }
    }
    out
}

/// `from -> {to}` between top-level modules, with one example line per edge.
fn edges() -> BTreeMap<(String, String), String> {
    let mut files = Vec::new();
    rust_files(&root().join("src"), &mut files);
    let mut out = BTreeMap::new();
    for file in files {
        let path = module_path(&file);
        let Some(from) = path.first().cloned() else {
            continue; // lib.rs and main.rs sit above every layer
        };
        let text = std::fs::read_to_string(&file).unwrap();
        for (n, line) in text.lines().enumerate() {
            let code = line.trim_start();
            if code.starts_with("//") {
                continue;
            }
            for to in referenced(code, &path) {
                if to != from && to != "self" && to != "super" {
                    out.entry((from.clone(), to)).or_insert_with(|| {
                        format!(
                            "{}:{}: {}",
                            file.strip_prefix(root()).unwrap().display(),
                            n + 1,
                            code.trim()
                        )
                    });
                }
            }
        }
    }
    out
}

#[test]
fn every_edge_runs_down_the_layers_and_nothing_is_left_out() {
    let layers = layers();
    let edges = edges();
    let mut modules: BTreeSet<String> = BTreeSet::new();
    let mut files = Vec::new();
    rust_files(&root().join("src"), &mut files);
    for f in &files {
        if let Some(m) = module_path(f).first() {
            modules.insert(m.clone());
        }
    }
    let missing: Vec<&String> = modules
        .iter()
        .filter(|m| !layers.contains_key(*m))
        .collect();
    assert!(
        missing.is_empty(),
        "modules not in ARCHITECTURE.md's layer table: {missing:?}"
    );
    let stale: Vec<&String> = layers.keys().filter(|m| !modules.contains(*m)).collect();
    assert!(
        stale.is_empty(),
        "ARCHITECTURE.md's layer table names modules that do not exist: {stale:?}"
    );
    let upward: Vec<String> = edges
        .iter()
        .filter(|((from, to), _)| layers.get(to).is_some_and(|l| *l > layers[from]))
        .map(|((from, to), at)| {
            format!(
                "{from} (layer {}) -> {to} (layer {}): {at}",
                layers[from], layers[to]
            )
        })
        .collect();
    assert!(
        upward.is_empty(),
        "edges against the layer order:\n{}",
        upward.join("\n")
    );
}

#[test]
fn the_module_graph_has_no_cycle() {
    let edges = edges();
    let mut graph: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for (from, to) in edges.keys() {
        graph.entry(from).or_default().push(to);
    }
    // Depth-first search for a back edge; the first cycle found is printed with its edges.
    fn visit<'a>(
        node: &'a str,
        graph: &BTreeMap<&'a str, Vec<&'a str>>,
        stack: &mut Vec<&'a str>,
        done: &mut BTreeSet<&'a str>,
    ) -> Option<Vec<&'a str>> {
        if let Some(at) = stack.iter().position(|n| *n == node) {
            let mut cycle = stack[at..].to_vec();
            cycle.push(node);
            return Some(cycle);
        }
        if done.contains(node) {
            return None;
        }
        stack.push(node);
        for next in graph.get(node).into_iter().flatten() {
            if let Some(cycle) = visit(next, graph, stack, done) {
                return Some(cycle);
            }
        }
        stack.pop();
        done.insert(node);
        None
    }
    let mut done = BTreeSet::new();
    for node in graph.keys() {
        if let Some(cycle) = visit(node, &graph, &mut Vec::new(), &mut done) {
            let detail: Vec<String> = cycle
                .windows(2)
                .map(|w| edges[&(w[0].to_owned(), w[1].to_owned())].clone())
                .collect();
            panic!(
                "import cycle {}:\n{}",
                cycle.join(" -> "),
                detail.join("\n")
            );
        }
    }
}

/// The front's codec is pure like the core although it sits in the front's layer
/// (ARCHITECTURE.md, "Architecture invariants"): it names no I/O, no async runtime and nothing
/// else of the crate, so it can be tested by value and fuzzed without a server.
#[test]
fn the_wire_codec_does_no_io() {
    let file = root().join("src/front/wire.rs");
    let text = std::fs::read_to_string(&file).unwrap();
    let forbidden = [
        "tokio", "std::net", "std::fs", "std::io", "async ", ".await", "crate::", "super::",
    ];
    let mut found = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let code = line.trim_start();
        if code.starts_with("//") {
            continue;
        }
        // The unit tests at the end reach the codec through `super::*`.
        if code.starts_with("use super::*;") {
            continue;
        }
        for word in forbidden {
            if code.contains(word) {
                found.push(format!("src/front/wire.rs:{}: {}", n + 1, code.trim()));
            }
        }
    }
    assert!(
        found.is_empty(),
        "the codec names I/O:\n{}",
        found.join("\n")
    );
}

/// SCRAM and the users file are pure too (ARCHITECTURE.md, "Architecture invariants"): no I/O,
/// no async runtime and no randomness (the handlers bring the nonce, `hash-user` the salt), so
/// the exchange is tested by value against RFC 7677's vector.
#[test]
fn the_scram_logic_does_no_io() {
    let file = root().join("src/front/auth.rs");
    let text = std::fs::read_to_string(&file).unwrap();
    let forbidden = [
        "tokio", "std::net", "std::fs", "std::io", "async ", ".await", "rand", "tracing",
    ];
    let mut found = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let code = line.trim_start();
        if code.starts_with("//") {
            continue;
        }
        for word in forbidden {
            if code.contains(word) {
                found.push(format!("src/front/auth.rs:{}: {}", n + 1, code.trim()));
            }
        }
    }
    assert!(
        found.is_empty(),
        "the SCRAM logic names I/O:\n{}",
        found.join("\n")
    );
}

#[test]
fn the_reader_finds_every_form_of_a_crate_path() {
    let path = vec!["router".to_owned(), "exec".to_owned()];
    assert_eq!(referenced("use crate::store::Store;", &path), ["store"]);
    assert_eq!(
        referenced(
            "use crate::{envelope::META, ids, phase::{Phase, ReadPath}};",
            &path
        ),
        ["envelope", "ids", "phase"]
    );
    assert_eq!(referenced("x = crate::ids::key(&id);", &path), ["ids"]);
    assert_eq!(referenced("use super::Inner;", &path), Vec::<String>::new());
    assert_eq!(
        referenced("use super::super::shards::Shards;", &path),
        ["shards"]
    );
    assert_eq!(
        referenced("use reshard_crate::x;", &path),
        Vec::<String>::new()
    );
}

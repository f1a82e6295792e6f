//! Fuzzing the doors (issue 17): random and mutated YAML into the version-spec and playbook
//! parsers, random argument vectors into the command-line parser, and random commands against
//! a real state store. Never a panic; the command line ends with exit 0 or 2; a refused
//! command changes nothing in the state store.
//!
//! Each property prints its seed; `RESHARD_FUZZ_SEED=N` replays it, `RESHARD_FUZZ_CASES=N` sets
//! the number of cases (parsers: 400 by default, 2,000 with `RESHARD_HEAVY_TESTS=1`; the
//! state-store property runs a tenth of that, each case being a process).

mod support;

use std::path::{Path, PathBuf};

use clap::Parser;
use proptest::prelude::*;
use proptest::test_runner::{Config, RngAlgorithm, TestCaseError, TestRng, TestRunner};
use support::{heavy_tests_enabled, PgDb};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn cases() -> u32 {
    std::env::var("RESHARD_FUZZ_CASES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(if heavy_tests_enabled() { 2000 } else { 400 })
}

/// A runner whose seed is printed and can be given back.
fn runner(name: &str, cases: u32) -> TestRunner {
    let seed: u64 = std::env::var("RESHARD_FUZZ_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(rand::random);
    eprintln!("[fuzz] {name}: {cases} cases, seed {seed} (replay: RESHARD_FUZZ_SEED={seed})");
    let mut bytes = [0u8; 32];
    bytes[..8].copy_from_slice(&seed.to_le_bytes());
    let config = Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    };
    TestRunner::new_with_rng(config, TestRng::from_seed(RngAlgorithm::ChaCha, &bytes))
}

fn yaml_files(dir: &Path, out: &mut Vec<String>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    let mut entries: Vec<_> = entries.flatten().map(|e| e.path()).collect();
    entries.sort();
    for p in entries {
        if p.is_dir() {
            yaml_files(&p, out);
        } else if p.extension().is_some_and(|e| e == "yaml") {
            out.push(std::fs::read_to_string(&p).unwrap());
        }
    }
}

/// Pieces that break YAML and our fields in interesting ways.
const TOKENS: &[&str] = &[
    ":",
    ": ",
    "- ",
    "[",
    "]",
    "{",
    "}",
    ",",
    "\"",
    "'",
    "#",
    "&a ",
    "*a",
    "!!binary ",
    "!!str ",
    "~",
    "null",
    "true",
    "-1",
    "0",
    "4294967296",
    "18446744073709551616",
    "1e309",
    "0x1F",
    ".nan",
    "\t",
    "\n",
    "\n  ",
    "\0",
    "é",
    "𝄞",
    "$",
    "${X}",
    "system.",
    "bad.db",
    "<<: *a",
    "? ",
    "|",
    ">-",
    "---",
    "...",
    "%YAML 1.1\n",
    "vbuckets",
    "shard",
    "buckets",
    "tenant",
    "layout",
    "hashed",
    "fanout",
    "steps",
    "advance",
    "backfill",
    "cleanup",
];

#[derive(Clone, Debug)]
enum Mutation {
    /// Replace bytes `at..at+len` (positions as fractions of the text) with a token.
    Splice {
        at: f64,
        len: usize,
        token: usize,
    },
    DeleteLine(f64),
    DuplicateLine(f64),
    Truncate(f64),
    /// Shift a line's indentation by -2..=2 spaces.
    Indent {
        line: f64,
        by: i8,
    },
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        4 => (0.0..1.0f64, 0usize..6, 0..TOKENS.len())
            .prop_map(|(at, len, token)| Mutation::Splice { at, len, token }),
        1 => (0.0..1.0f64).prop_map(Mutation::DeleteLine),
        1 => (0.0..1.0f64).prop_map(Mutation::DuplicateLine),
        1 => (0.0..1.0f64).prop_map(Mutation::Truncate),
        1 => (0.0..1.0f64, -2i8..=2).prop_map(|(line, by)| Mutation::Indent { line, by }),
    ]
}

fn boundary(text: &str, at: f64) -> usize {
    let mut i = ((text.len() as f64) * at) as usize;
    while i > 0 && !text.is_char_boundary(i) {
        i -= 1;
    }
    i.min(text.len())
}

fn apply(text: &str, m: &Mutation) -> String {
    let mut lines: Vec<String> = text.lines().map(str::to_owned).collect();
    let line = |f: f64, n: usize| ((n as f64) * f) as usize % n.max(1);
    match m {
        Mutation::Splice { at, len, token } => {
            let start = boundary(text, *at);
            let mut end = (start + len).min(text.len());
            while !text.is_char_boundary(end) {
                end += 1;
            }
            format!("{}{}{}", &text[..start], TOKENS[*token], &text[end..])
        }
        Mutation::Truncate(at) => text[..boundary(text, *at)].to_owned(),
        Mutation::DeleteLine(f) if !lines.is_empty() => {
            let i = line(*f, lines.len());
            lines.remove(i);
            lines.join("\n")
        }
        Mutation::DuplicateLine(f) if !lines.is_empty() => {
            let i = line(*f, lines.len());
            lines.insert(i, lines[i].clone());
            lines.join("\n")
        }
        Mutation::Indent { line: f, by } if !lines.is_empty() => {
            let i = line(*f, lines.len());
            if *by > 0 {
                lines[i] = format!("{}{}", " ".repeat(*by as usize), lines[i]);
            } else {
                let cut = lines[i]
                    .chars()
                    .take((-*by) as usize)
                    .take_while(|c| *c == ' ')
                    .count();
                lines[i] = lines[i][cut..].to_owned();
            }
            lines.join("\n")
        }
        _ => text.to_owned(),
    }
}

/// A seed document mutated 1..4 times, or (one case in eight) random text.
fn mutated(seeds: Vec<String>) -> impl Strategy<Value = String> {
    let n = seeds.len();
    prop_oneof![
        7 => (0..n, prop::collection::vec(mutation(), 1..4)).prop_map(move |(i, ms)| {
            ms.iter().fold(seeds[i].clone(), |text, m| apply(&text, m))
        }),
        1 => "(?s).{0,400}",
    ]
}

/// Every problem says where it is: the file's name starts each message.
fn located(file: &str, messages: &[String]) -> Result<(), TestCaseError> {
    prop_assert!(!messages.is_empty(), "a refusal without a message");
    for m in messages {
        prop_assert!(m.starts_with(file), "message without its place: {m:?}");
    }
    Ok(())
}

/// Runs a parser over mutated `seeds`: it either accepts a text or refuses it with messages
/// that each start with the file's name; both outcomes must occur.
fn parser_property(
    name: &str,
    seeds: Vec<String>,
    parse: impl Fn(&str) -> Result<(), Vec<String>>,
) {
    assert!(seeds.len() >= 10, "seed {name}: {}", seeds.len());
    let accepted = std::cell::Cell::new(0u32);
    let refused = std::cell::Cell::new(0u32);
    let mut run = runner(name, cases());
    let result = run.run(&mutated(seeds), |text| match parse(&text) {
        Ok(()) => {
            accepted.set(accepted.get() + 1);
            Ok(())
        }
        Err(messages) => {
            refused.set(refused.get() + 1);
            located("fuzz.yaml", &messages)
        }
    });
    let (accepted, refused) = (accepted.get(), refused.get());
    eprintln!("[fuzz] {name}: {accepted} accepted, {refused} refused");
    result.unwrap();
    assert!(
        refused > 0 && accepted > 0,
        "the mutations reach both sides"
    );
}

fn messages<E: ToString>(errors: Vec<E>) -> Vec<String> {
    errors.iter().map(ToString::to_string).collect()
}

#[test]
fn the_version_spec_parser_refuses_mutated_specs_cleanly() {
    let mut seeds = Vec::new();
    yaml_files(&root().join("tests/fixtures/versions"), &mut seeds);
    yaml_files(&root().join("tests/fixtures/bad_input"), &mut seeds);
    let shards: std::collections::BTreeSet<String> = ["s1", "s2", "s3", "s4"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    parser_property("version specs", seeds, |text| {
        let version =
            reshard::spec::parse_version_spec("fuzz.yaml", text, "orders").map_err(messages)?;
        let ctx = reshard::routing::ValidationContext {
            registered_shards: &shards,
            previous_virtual_buckets: None,
        };
        reshard::spec::check_version_spec("fuzz.yaml", text, &version, &ctx).map_err(messages)
    });
}

#[test]
fn the_playbook_parser_refuses_mutated_playbooks_cleanly() {
    let mut seeds = Vec::new();
    yaml_files(&root().join("playbooks"), &mut seeds);
    yaml_files(&root().join("tests/fixtures/bad_playbooks"), &mut seeds);
    parser_property("playbooks", seeds, |text| {
        reshard::spec::playbook::parse_playbook("fuzz.yaml", text)
            .map(|_| ())
            .map_err(messages)
    });
}

/// Words of the command line: subcommands, flags, and values good and bad.
const WORDS: &[&str] = &[
    "db",
    "migrate",
    "shard",
    "add",
    "list",
    "remove",
    "version",
    "create",
    "migration",
    "show",
    "advance",
    "rollback",
    "pause",
    "resume",
    "history",
    "configure",
    "status",
    "route",
    "explain",
    "router",
    "routers",
    "remove",
    "forget",
    "wait",
    "worker",
    "throttle",
    "set",
    "deadletter",
    "skip",
    "retry",
    "reconcile",
    "playbook",
    "validate",
    "schema",
    "run",
    "approve",
    "plan",
    "repair",
    "front",
    "--listen",
    ":27018",
    "help",
    "--help",
    "-h",
    "--version",
    "--output",
    "json",
    "text",
    "yaml",
    "--collection",
    "orders",
    "--to",
    "--from",
    "--file",
    "--uri",
    "--database",
    "--no-check",
    "--dry-run",
    "--reason",
    "--actor",
    "--timeout",
    "--max-docs-per-sec",
    "--batch-size",
    "--cleanup-waves",
    "--max-missing",
    "--sample",
    "--full",
    "--step",
    "--tenant",
    "--id",
    "--log-format",
    "--migration",
    "--until",
    "--lease-ttl",
    "--recheck-delay",
    "30s",
    "500ms",
    "--concurrency",
    "--exit-when-done",
    "1",
    "0",
    "-1",
    "2",
    "99999999999999999999",
    "1.5",
    "abc",
    "",
    " ",
    "s1",
    "s9",
    "shop",
    "bad.db",
    "mongodb://127.0.0.1:1",
    "--",
    "-",
    "dual_read",
    "completed",
    "bogus_phase",
    "00000000-0000-0000-0000-000000000000",
    "not-a-uuid",
    "é",
    "\u{0}",
    "=",
    "--output=json",
    "--to=2",
    "-x",
];

fn argv() -> impl Strategy<Value = Vec<String>> {
    prop::collection::vec(
        prop_oneof![
            9 => (0..WORDS.len()).prop_map(|i| WORDS[i].to_owned()),
            1 => "[ -~]{0,12}",
        ],
        0..8,
    )
}

#[test]
fn the_command_line_parser_never_panics_and_ends_with_0_or_2() {
    let outcomes = std::cell::RefCell::new(std::collections::BTreeMap::<i32, u32>::new());
    let mut run = runner("command lines", cases() * 5);
    let result = run.run(&argv(), |args| {
        let argv = std::iter::once("reshard".to_owned()).chain(args.iter().cloned());
        let code = match reshard::cli::Cli::try_parse_from(argv) {
            Ok(_) => 0,
            Err(e) => e.exit_code(),
        };
        *outcomes.borrow_mut().entry(code).or_default() += 1;
        prop_assert!(code == 0 || code == 2, "exit {code} for {args:?}");
        Ok(())
    });
    eprintln!("[fuzz] command lines by exit code: {:?}", outcomes.borrow());
    result.unwrap();
}

/// Every row of every table of the state store, as text: what "nothing changed" compares.
async fn state(pool: &sqlx::PgPool) -> Vec<(String, String)> {
    let tables: Vec<String> = sqlx::query_scalar(
        "SELECT table_name::text FROM information_schema.tables
         WHERE table_schema = 'public' AND table_type = 'BASE TABLE' ORDER BY 1",
    )
    .fetch_all(pool)
    .await
    .unwrap();
    let mut out = Vec::new();
    for t in tables {
        let rows: Option<String> = sqlx::query_scalar(&format!(
            "SELECT string_agg(x::text, E'\\n' ORDER BY x::text) FROM \"{t}\" x"
        ))
        .fetch_one(pool)
        .await
        .unwrap();
        out.push((t, rows.unwrap_or_default()));
    }
    out
}

fn reshard(url: &str, args: &[String]) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_reshard"))
        .env("RESHARD_DATABASE_URL", url)
        .env_remove("DATABASE_URL")
        .args(args)
        .output()
        .unwrap()
}

/// Commands that change the state store and check their input first (none of them reaches
/// a shard: `--no-check`, and no phase move), with inputs good and bad.
fn command(spec_files: Vec<String>) -> impl Strategy<Value = Vec<String>> {
    let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
    let name = prop_oneof![
        Just("s5".to_owned()),
        Just("s1".to_owned()),
        "[a-z$. /]{0,6}"
    ];
    let database = prop_oneof![Just("shop".to_owned()), "[a-z$. /\"]{0,8}"];
    let uri = prop_oneof![
        Just("mongodb://127.0.0.1:1".to_owned()),
        Just("mongodb://127.0.0.1:1/?replicaSet=".to_owned()),
        Just("mongodb://127.0.0.1:notaport".to_owned()),
        "[a-z:/.?=]{0,20}",
    ];
    let number = prop_oneof![
        Just("1".to_owned()),
        Just("0".to_owned()),
        Just("-3".to_owned()),
        "[0-9a-z.]{0,6}"
    ];
    let n = spec_files.len();
    prop_oneof![
        (name.clone(), uri, database).prop_map(move |(n, u, d)| {
            let mut v = s(&["shard", "add"]);
            v.extend([
                n,
                "--uri".into(),
                u,
                "--database".into(),
                d,
                "--no-check".into(),
            ]);
            v
        }),
        name.prop_map(move |n| {
            let mut v = s(&["shard", "remove"]);
            v.push(n);
            v
        }),
        (0..n, prop_oneof![Just("orders".to_owned()), "[a-z$.]{0,6}"]).prop_map(move |(i, c)| {
            let mut v = s(&["version", "create", "--collection"]);
            v.extend([c, "--file".into(), spec_files[i].clone()]);
            v
        }),
        (number.clone(), number.clone()).prop_map(move |(a, b)| {
            let mut v = s(&["migration", "create", "--collection", "orders", "--to"]);
            v.push(a);
            v.extend(["--from".into(), b]);
            v
        }),
        (number.clone(), number.clone()).prop_map(move |(m, x)| {
            let mut v = s(&["throttle", "set"]);
            v.extend([m, "--batch-size".into(), x]);
            v
        }),
        (number.clone(), number).prop_map(move |(m, x)| {
            let mut v = s(&["migration", "configure"]);
            v.extend([m, "--max-missing".into(), x]);
            v
        }),
        prop_oneof![
            Just("00000000-0000-0000-0000-000000000000".to_owned()),
            "[a-z0-9-]{0,10}"
        ]
        .prop_map(move |id| {
            let mut v = s(&["router", "remove"]);
            v.push(id);
            v
        }),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_command_changes_nothing_in_the_state_store() {
    let db = PgDb::fresh().await;
    let url = db.url();
    let setup = |args: &[&str]| {
        let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        let out = reshard(&url, &args);
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    setup(&["db", "migrate"]);
    for shard in ["s1", "s2", "s3", "s4"] {
        setup(&[
            "shard",
            "add",
            shard,
            "--uri",
            "mongodb://127.0.0.1:1",
            "--database",
            "shop",
            "--no-check",
        ]);
    }
    let versions = root().join("tests/fixtures/versions");
    setup(&[
        "version",
        "create",
        "--collection",
        "orders",
        "--file",
        versions.join("orders_v1.yaml").to_str().unwrap(),
    ]);
    // Spec files: good ones, the bad-input fixtures, and a few mutated ones on disk.
    let dir = tempfile::tempdir().unwrap();
    let mut files: Vec<String> = ["orders_v1.yaml", "orders_v2.yaml"]
        .iter()
        .map(|f| versions.join(f).display().to_string())
        .collect();
    let mut texts = Vec::new();
    yaml_files(&root().join("tests/fixtures/bad_input"), &mut texts);
    for (i, t) in texts.iter().enumerate() {
        let p = dir.path().join(format!("spec{i}.yaml"));
        std::fs::write(&p, t).unwrap();
        files.push(p.display().to_string());
    }
    let pool = db.pool().await;
    let cases = (cases() / 10).max(20);
    let mut run = runner("commands against the state store", cases);
    let outcomes = std::cell::RefCell::new(std::collections::BTreeMap::<i32, u32>::new());
    let handle = tokio::runtime::Handle::current();
    let result = tokio::task::block_in_place(|| {
        run.run(&command(files), |args| {
            let before = handle.block_on(state(&pool));
            let out = reshard(&url, &args);
            let code = out.status.code().unwrap_or(-1);
            if std::env::var_os("RESHARD_FUZZ_VERBOSE").is_some() {
                eprintln!(
                    "[fuzz] {args:?} -> {code}: {}",
                    String::from_utf8_lossy(&out.stderr).trim()
                );
            }
            *outcomes.borrow_mut().entry(code).or_default() += 1;
            let stderr = String::from_utf8_lossy(&out.stderr);
            prop_assert!(code == 0 || code == 2, "exit {code} for {args:?}: {stderr}");
            prop_assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
            if code == 2 {
                prop_assert!(
                    !stderr.trim().is_empty(),
                    "a refusal without a message: {args:?}"
                );
                let after = handle.block_on(state(&pool));
                prop_assert!(
                    before == after,
                    "{args:?} was refused but changed the state store"
                );
            }
            Ok(())
        })
    });
    eprintln!(
        "[fuzz] commands against the state store by exit code: {:?}",
        outcomes.borrow()
    );
    result.unwrap();
}

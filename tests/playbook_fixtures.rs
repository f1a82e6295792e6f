//! Bad playbooks, as data: every `tests/fixtures/bad_playbooks/<case>.yaml` is a small variation
//! of `playbooks/hot-tenant.yaml` (its first line, a comment, says what is wrong), with
//! `<case>.expected` next to it:
//! - one line per problem that the stderr of `reshard playbook validate <case>.yaml` must
//!   contain: its place (`<case>.yaml:LINE:COLUMN`; a missing top-level field or an empty file
//!   is the whole file, `<case>.yaml`), the field path and, where the tool gives them, the
//!   allowed values;
//! - lines starting with `#` are comments, except a first line `# schema: accepts`: the JSON
//!   Schema cannot express this problem (a duration's text, step order, unique names, the
//!   fields a layout needs, ...); only the checks of meaning after it find it.
//!
//! Each case must exit 2 with every expected line in stderr and nothing on stdout. Then the
//! schema that `reshard playbook schema` prints, compiled with the `jsonschema` crate, must
//! accept every example in `playbooks/`, reject every case not marked `# schema: accepts` and
//! accept every marked one (so a mark cannot be wrong). Cases named `yaml_*` are YAML syntax
//! errors with no JSON form: they skip the schema, and they are the only cases that may fail
//! to parse. `${VAR}` URIs are plain strings to the schema.
//!
//! Adding a case needs no code.

use std::path::{Path, PathBuf};

use serde_json::Value;

/// The first line of an `.expected` file whose case the schema accepts.
const SCHEMA_ACCEPTS: &str = "# schema: accepts";

/// The fewest cases this suite accepts (issue 12 asks for at least 30).
const MIN_CASES: usize = 30;

struct Case {
    name: String,
    yaml: PathBuf,
    /// The lines stderr must contain.
    expected: Vec<String>,
    schema_accepts: bool,
}

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/bad_playbooks")
}

fn files_ending(dir: &Path, suffix: &str) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.is_file() && p.to_string_lossy().ends_with(suffix))
        .collect();
    files.sort();
    files
}

fn stem(path: &Path, suffix: &str) -> String {
    let name = path.file_name().unwrap().to_string_lossy();
    name.strip_suffix(suffix).unwrap().to_owned()
}

fn cases() -> Vec<Case> {
    files_ending(&fixtures(), ".yaml")
        .into_iter()
        .map(|yaml| {
            let name = stem(&yaml, ".yaml");
            let file = yaml.with_extension("expected");
            let text = std::fs::read_to_string(&file)
                .unwrap_or_else(|e| panic!("{name}: no {}: {e}", file.display()));
            let schema_accepts = text.lines().next() == Some(SCHEMA_ACCEPTS);
            let expected = text
                .lines()
                .filter(|l| !l.trim().is_empty() && !l.starts_with('#'))
                .map(str::to_owned)
                .collect();
            Case {
                name,
                yaml,
                expected,
                schema_accepts,
            }
        })
        .collect()
}

fn examples() -> Vec<PathBuf> {
    files_ending(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("playbooks"),
        ".yaml",
    )
}

fn reshard(dir: &Path, args: &[&str]) -> std::process::Output {
    assert_cmd::Command::cargo_bin("reshard")
        .unwrap()
        .env_remove("RESHARD_DATABASE_URL")
        .env_remove("DATABASE_URL")
        .env_remove("RESHARD_LOG")
        .current_dir(dir)
        .args(args)
        .output()
        .unwrap()
}

/// The JSON Schema, as `reshard playbook schema` prints it.
fn schema() -> Value {
    let out = reshard(&fixtures(), &["playbook", "schema"]);
    assert!(
        out.status.success(),
        "reshard playbook schema failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("the schema is JSON")
}

/// Why `instance` fails the schema, one error a line.
fn schema_errors(validator: &jsonschema::Validator, instance: &Value) -> String {
    validator
        .iter_errors(instance)
        .map(|e| format!("  {}: {e}", e.instance_path()))
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn there_are_enough_cases_and_each_is_complete() {
    let cases = cases();
    assert!(
        cases.len() >= MIN_CASES,
        "{} bad playbooks; at least {MIN_CASES} are wanted",
        cases.len()
    );
    let mut problems = Vec::new();
    for expected in files_ending(&fixtures(), ".expected") {
        let name = stem(&expected, ".expected");
        if !fixtures().join(format!("{name}.yaml")).is_file() {
            problems.push(format!("{name}.expected has no {name}.yaml"));
        }
    }
    for case in &cases {
        if case.expected.is_empty() {
            problems.push(format!("{}: no expected line", case.name));
        }
        let file = format!("{}.yaml", case.name);
        for line in &case.expected {
            if !line.starts_with(&file) {
                problems.push(format!(
                    "{}: expected line {line:?} does not start with its place ({file}:LINE:COLUMN)",
                    case.name
                ));
            }
        }
    }
    assert!(problems.is_empty(), "\n{}", problems.join("\n"));
}

#[test]
fn every_example_playbook_is_valid() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    for example in examples() {
        let path = example.to_str().unwrap();
        let out = reshard(dir, &["playbook", "validate", path]);
        assert!(
            out.status.success(),
            "{path}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

#[test]
fn every_bad_playbook_exits_2_with_its_messages() {
    let dir = fixtures();
    let mut failures = Vec::new();
    for case in cases() {
        let file = format!("{}.yaml", case.name);
        let out = reshard(&dir, &["playbook", "validate", &file]);
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        let mut problems = Vec::new();
        if out.status.code() != Some(2) {
            problems.push(format!("exit code {:?}, expected 2", out.status.code()));
        }
        for line in &case.expected {
            if !stderr.contains(line.as_str()) {
                problems.push(format!("stderr lacks {line:?}"));
            }
        }
        if !stdout.trim().is_empty() {
            problems.push(format!("stdout is not empty: {stdout:?}"));
        }
        if !problems.is_empty() {
            failures.push(format!(
                "{}: {}\n--- stderr:\n{stderr}",
                case.name,
                problems.join("; ")
            ));
        }
    }
    assert!(failures.is_empty(), "\n{}", failures.join("\n\n"));
}

#[test]
fn the_schema_accepts_every_example_and_rejects_what_it_can_express() {
    let schema = schema();
    let validator = jsonschema::validator_for(&schema).expect("the schema compiles");
    let mut failures = Vec::new();

    let examples = examples();
    assert!(!examples.is_empty(), "no example playbooks");
    for example in examples {
        let text = std::fs::read_to_string(&example).unwrap();
        let json: Value =
            serde_yaml::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", example.display()));
        if !validator.is_valid(&json) {
            failures.push(format!(
                "example {}: the schema rejects it:\n{}",
                example.display(),
                schema_errors(&validator, &json)
            ));
        }
    }

    let (mut rejected, mut accepted) = (0, 0);
    for case in cases() {
        let text = std::fs::read_to_string(&case.yaml).unwrap();
        let syntax = case.name.starts_with("yaml_");
        let json: Value = match serde_yaml::from_str(&text) {
            Ok(json) if syntax => {
                failures.push(format!(
                    "{}: named yaml_* but it parses; yaml_* cases are YAML syntax errors",
                    case.name
                ));
                json
            }
            Ok(json) => json,
            Err(_) if syntax => continue,
            Err(e) => {
                failures.push(format!(
                    "{}: does not parse ({e}); only yaml_* cases may be syntax errors",
                    case.name
                ));
                continue;
            }
        };
        match (case.schema_accepts, validator.is_valid(&json)) {
            (false, true) => failures.push(format!(
                "{}: the schema accepts it; mark it `{SCHEMA_ACCEPTS}` if only the checks of \
                 meaning can find its problem",
                case.name
            )),
            (true, false) => failures.push(format!(
                "{}: marked `{SCHEMA_ACCEPTS}`, but the schema rejects it:\n{}",
                case.name,
                schema_errors(&validator, &json)
            )),
            (false, false) => rejected += 1,
            (true, true) => accepted += 1,
        }
    }
    assert!(failures.is_empty(), "\n{}", failures.join("\n\n"));
    assert!(rejected > 0 && accepted > 0, "{rejected} {accepted}");
}

/// The README's playbook example is a valid playbook: the format section stays true.
#[test]
fn the_readme_playbook_example_is_valid() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
    let section = &readme[readme
        .find("## Playbook format")
        .expect("README has a playbook format section")..];
    let start = section.find("```yaml\n").expect("with a YAML example") + "```yaml\n".len();
    let end = start + section[start..].find("```").unwrap();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("readme.yaml");
    std::fs::write(&file, &section[start..end]).unwrap();
    let out = reshard(
        dir.path(),
        &["playbook", "validate", file.to_str().unwrap()],
    );
    assert!(
        out.status.success(),
        "the README's playbook: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The hint that points the YAML language server (VS Code, Neovim, Helix, JetBrains) to the
/// schema file beside the examples.
const EDITOR_HINT: &str = "# yaml-language-server: $schema=./schema.json";

#[test]
fn editors_find_the_schema_every_example_names_and_it_is_what_the_binary_prints() {
    let file = Path::new(env!("CARGO_MANIFEST_DIR")).join("playbooks/schema.json");
    let committed: Value = serde_json::from_str(
        &std::fs::read_to_string(&file).unwrap_or_else(|e| panic!("{}: {e}", file.display())),
    )
    .expect("playbooks/schema.json is JSON");
    assert_eq!(
        committed,
        schema(),
        "playbooks/schema.json is not what `reshard playbook schema` prints; \
         run `reshard playbook schema > playbooks/schema.json`"
    );
    assert_eq!(schema()["$id"], "urn:reshard:schema:playbook:v1");
    for example in examples() {
        let text = std::fs::read_to_string(&example).unwrap();
        assert_eq!(
            text.lines().next(),
            Some(EDITOR_HINT),
            "{} does not start with the editor's schema hint",
            example.display()
        );
    }
}

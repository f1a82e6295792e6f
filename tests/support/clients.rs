//! Running a client we did not write (pymongo, the Node driver, mongosh) against a front,
//! for the tests that need no server of their own (`#[path = "support/clients.rs"] mod
//! clients;`). The clients live in `tests/clients`; `scripts/install-secantus.sh` installs
//! them.

use std::path::{Path, PathBuf};
use std::time::Duration;

/// The crate's directory.
pub fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Runs `program` in `tests/clients` and returns the JSON object it printed last. A missing
/// program fails with how to install it (`install_hint`); a failing one with its output.
pub async fn run_client(
    program: &Path,
    args: &[&str],
    env: &[(&str, &str)],
    install_hint: &str,
) -> serde_json::Value {
    assert!(
        program.exists(),
        "{} is missing: run scripts/install-secantus.sh ({install_hint})",
        program.display()
    );
    let out = tokio::time::timeout(
        Duration::from_secs(120),
        tokio::process::Command::new(program)
            .args(args)
            .envs(env.iter().copied())
            .current_dir(root().join("tests/clients"))
            .kill_on_drop(true)
            .output(),
    )
    .await
    .unwrap_or_else(|_| panic!("{} did not finish within 120 s", program.display()))
    .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "{} {args:?} failed ({}):\n{stdout}\n{stderr}",
        program.display(),
        out.status
    );
    let line = stdout
        .lines()
        .rev()
        .find(|l| l.trim_start().starts_with('{'))
        .unwrap_or_else(|| panic!("no JSON from {}:\n{stdout}\n{stderr}", program.display()));
    serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}"))
}

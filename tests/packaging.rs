//! Packaging: the `rust-version` that Cargo.toml declares is true. Every package the lock file
//! builds for this host (dependencies of every kind and feature, the containers feature's
//! too) declares the oldest Rust it compiles with; ours may not be older than the newest of
//! them, or `cargo install` on the Rust we claim fails in a dependency.

use std::process::Command;

/// `1.89` and `1.89.0` alike, as three numbers.
fn version(text: &str) -> [u64; 3] {
    let mut out = [0; 3];
    for (slot, part) in out.iter_mut().zip(text.split('.')) {
        *slot = part
            .parse()
            .unwrap_or_else(|_| panic!("not a version: {text}"));
    }
    out
}

fn host() -> String {
    let out = Command::new(std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into()))
        .arg("-vV")
        .output()
        .unwrap();
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("host: ").map(str::to_owned))
        .expect("rustc -vV names the host")
}

#[test]
fn the_declared_rust_version_is_not_older_than_any_locked_dependency_needs() {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(cargo)
        .args(["metadata", "--format-version", "1", "--locked"])
        .args(["--all-features", "--filter-platform", &host()])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "cargo metadata failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let metadata: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let ours = metadata["packages"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "reshard")
        .and_then(|p| p["rust_version"].as_str())
        .expect("Cargo.toml declares a rust-version");
    let built: Vec<&str> = metadata["resolve"]["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|n| n["id"].as_str())
        .collect();
    let mut newer: Vec<String> = metadata["packages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| built.contains(&p["id"].as_str().unwrap()))
        .filter_map(|p| {
            let needs = p["rust_version"].as_str()?;
            (version(needs) > version(ours))
                .then(|| format!("{} {} needs Rust {needs}", p["name"], p["version"]))
        })
        .collect();
    newer.sort();
    assert!(
        newer.is_empty(),
        "Cargo.toml says rust-version = {ours:?}, but:\n{}",
        newer.join("\n")
    );
}

/// The container image builds with the Rust that Cargo.toml declares, and ships the binary of
/// that name; `cargo install --path .` is what README says.
#[test]
fn the_dockerfile_builds_with_the_declared_rust_version() {
    let root = env!("CARGO_MANIFEST_DIR");
    let manifest = std::fs::read_to_string(format!("{root}/Cargo.toml")).unwrap();
    let ours = manifest
        .lines()
        .find_map(|l| l.strip_prefix("rust-version = "))
        .map(|v| v.trim_matches('"').to_owned())
        .expect("Cargo.toml declares a rust-version");
    let dockerfile = std::fs::read_to_string(format!("{root}/Dockerfile")).unwrap();
    let build = dockerfile
        .lines()
        .find(|l| l.starts_with("FROM rust:"))
        .expect("a build stage FROM rust:VERSION");
    assert!(
        build.starts_with(&format!("FROM rust:{ours}-")),
        "the Dockerfile builds with {build:?}, Cargo.toml says rust-version = {ours:?}"
    );
    assert!(
        dockerfile.contains("--locked --bin reshard"),
        "{dockerfile}"
    );
    assert!(
        dockerfile.contains("ENTRYPOINT [\"reshard\"]"),
        "{dockerfile}"
    );
    let readme = std::fs::read_to_string(format!("{root}/README.md")).unwrap();
    assert!(readme.contains("cargo install --path ."));
    assert!(readme.contains("docker build -t reshard ."));
}

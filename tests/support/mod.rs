#![allow(dead_code, unused_imports)]
//! Real-server fixtures shared by the integration tests (`mod support;`).
//!
//! * [`PgDb`]: a throw-away PostgreSQL database, dropped (`WITH (FORCE)`) on `Drop`.
//! * [`MongoServer`]: one MongoDB-compatible server process per fixture. By default a
//!   SecantusDB process (`secantusd-py`, installed into `.venv` by
//!   `scripts/install-secantus.sh`); with `--features containers` an official `mongo`
//!   image through testcontainers (and `postgres` for [`PgDb`]).
//! * [`Shards`]: `n` servers named `s1..sn`.
//! * [`bin`]: an `assert_cmd::Command` for the `reshard` binary wired to a [`PgDb`].
//!
//! Environment:
//! * `RESHARD_TEST_PG_URL`: admin URL of the PostgreSQL server the test databases are
//!   created on (default `postgres://postgres@127.0.0.1:5432/postgres`). With
//!   `--features containers` it is optional: when unset, each `PgDb` gets its own container.
//! * `RESHARD_SECANTUSD`: path of `secantusd-py` (default `<crate>/.venv/bin/secantusd-py`).
//! * `RESHARD_HEAVY_TESTS=1`: enables the heavy tests (see [`heavy_tests_enabled`]).

mod common;
pub use common::*;
mod pg_common;
pub mod private_pg;
mod spawn;
pub use private_pg::PrivatePg;

#[cfg(not(feature = "containers"))]
mod mongo_local;
#[cfg(not(feature = "containers"))]
pub use mongo_local::*;
#[cfg(not(feature = "containers"))]
mod pg_local;
#[cfg(not(feature = "containers"))]
pub use pg_local::*;

#[cfg(feature = "containers")]
mod containers;
#[cfg(feature = "containers")]
pub use containers::*;

mod shards;
pub use shards::*;
mod world;
pub use world::{reshard, reshard_ok, StateDb, World, TO_BACKFILL};
mod routed_front;
pub use routed_front::RoutedFront;

/// An `assert_cmd::Command` for the `reshard` binary with `RESHARD_DATABASE_URL` pointing
/// at `pg`, otherwise as [`bin_without_db`].
pub fn bin(pg: &PgDb) -> assert_cmd::Command {
    let mut cmd = bin_without_db();
    cmd.env("RESHARD_DATABASE_URL", pg.url());
    cmd
}

/// An `assert_cmd::Command` for the `reshard` binary with none of `RESHARD_DATABASE_URL`,
/// `DATABASE_URL` (its fallback) and `RESHARD_LOG` set.
pub fn bin_without_db() -> assert_cmd::Command {
    // Same file as `Command::cargo_bin("reshard")`, resolved at compile time.
    let mut cmd = assert_cmd::Command::new(env!("CARGO_BIN_EXE_reshard"));
    cmd.env_remove("RESHARD_DATABASE_URL");
    cmd.env_remove("DATABASE_URL");
    cmd.env_remove("RESHARD_LOG");
    cmd
}

/// Adds one figure to the summary `scripts/bench` prints at the end (a JSON line appended to
/// the file `RESHARD_BENCH_SUMMARY` names; nothing without it).
pub fn bench_figure(bench: &str, figure: &str, value: String) {
    let Ok(path) = std::env::var("RESHARD_BENCH_SUMMARY") else {
        return;
    };
    use std::io::Write;
    let line = serde_json::json!({ "bench": bench, "figure": figure, "value": value });
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .unwrap_or_else(|e| panic!("RESHARD_BENCH_SUMMARY={path}: {e}"));
    writeln!(file, "{line}").unwrap();
}

/// The `main` of a benchmark binary (`harness = false`, `benches/`): `cargo bench` passes
/// `--bench` and `bench` runs on a two-thread runtime; under `cargo test --all-targets` the
/// binary is only built, and says how to run it.
pub fn bench_main<F: std::future::Future<Output = ()>>(name: &str, bench: impl FnOnce() -> F) {
    if !std::env::args().any(|a| a == "--bench") {
        eprintln!("{name} is a benchmark: run it with `cargo bench --bench {name}`");
        return;
    }
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime")
        .block_on(bench());
}

//! The processes that serve: `front` (and `front hash-user`) and `exporter`.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Subcommand};

use super::parse::*;

#[derive(Debug, Args)]
pub struct ExporterArgs {
    /// Serve Prometheus metrics at `http://HOST:PORT/metrics` (and `/healthz`).
    #[arg(long, value_name = "HOST:PORT", value_parser = parse_listen_addr)]
    pub metrics_addr: std::net::SocketAddr,
    /// How often the state store is read (1s to 1h). A series not refreshed for three
    /// intervals (a migration deleted, a router forgotten, the store unreachable) is dropped.
    #[arg(long, default_value = "15s", value_parser = parse_refresh_interval, value_name = "DURATION")]
    pub interval: Duration,
}

#[derive(Debug, Args)]
#[command(args_conflicts_with_subcommands = true)]
pub struct FrontArgs {
    #[command(subcommand)]
    pub command: Option<FrontCommand>,
    /// Where to listen: `HOST:PORT` (`localhost:27018`, `10.0.0.5:27018`), or `:PORT` for
    /// every interface.
    #[arg(
        long,
        default_value = "127.0.0.1:27018",
        value_name = "HOST:PORT",
        value_parser = parse_listen_addr
    )]
    pub listen: std::net::SocketAddr,
    /// Require authentication (SCRAM-SHA-256) as one of the users in this JSON file: every
    /// command but the handshake, `ping`, `buildInfo` and `connectionStatus` is refused
    /// (Unauthorized, 13) until the connection authenticated. The file holds
    /// `{"users": [ENTRY, ...]}`, each entry as `reshard front hash-user NAME` prints it (stored
    /// credentials, never a password). Without it, no one authenticates.
    #[arg(long, value_name = "PATH")]
    pub users_file: Option<PathBuf>,
    /// Serve TLS only, with this certificate chain (PEM: the server's certificate first, then
    /// any intermediates). Needs --tls-key-file.
    #[arg(long, value_name = "PATH", requires = "tls_key_file")]
    pub tls_cert_file: Option<PathBuf>,
    /// The private key of --tls-cert-file (PEM: PKCS#8, PKCS#1 RSA or SEC1 EC).
    #[arg(long, value_name = "PATH", requires = "tls_cert_file")]
    pub tls_key_file: Option<PathBuf>,
    /// The logical database the application uses: its collections with a routing version are
    /// routed (each through a router this front registers, as an application's would), every
    /// other collection and database goes to --passthrough-uri. Needed with a state store
    /// (--database-url); without one the front answers the handshake and diagnostics only.
    #[arg(long, value_name = "NAME")]
    pub database: Option<String>,
    /// Where everything the front does not route goes (collections without a routing version,
    /// other databases): a MongoDB connection string (`${VAR}` and `${file:PATH}` are
    /// resolved, as in shard URIs). Without it, such commands are refused.
    #[arg(
        long,
        value_name = "URI",
        env = "RESHARD_PASSTHROUGH_URI",
        hide_env_values = true
    )]
    pub passthrough_uri: Option<String>,
    /// The name this front's routers register under (`reshard router list`); default
    /// `front HOST:PORT` of --listen.
    #[arg(long, value_name = "NAME")]
    pub name: Option<String>,
    /// The lease of this front's routers: how long it serves without reaching the state store
    /// (an outage shorter than it costs the applications nothing), and how long a front that
    /// died without deregistering holds up the migration's phase changes. The routers'
    /// default, ten minutes, unless given.
    #[arg(long, value_parser = parse_lease_ttl, value_name = "DURATION")]
    pub lease_ttl: Option<Duration>,
    #[command(flatten)]
    pub metrics: super::work::MetricsArg,
}

#[derive(Debug, Subcommand)]
pub enum FrontCommand {
    /// Make a users-file entry: reads the password from stdin (asked twice, without echo, on a
    /// terminal; else the first line, without its line ending), prints the entry's JSON with
    /// SCRAM-SHA-256 stored credentials (a random salt, the iteration count, StoredKey,
    /// ServerKey), never the password.
    HashUser(HashUserArgs),
}

#[derive(Debug, Args)]
pub struct HashUserArgs {
    /// The user's name, as clients write it in their connection string.
    pub name: String,
    /// The user's authentication database (`authSource` in the connection string).
    #[arg(long, default_value = "admin", value_name = "DB")]
    pub db: String,
    /// PBKDF2 rounds (MongoDB's default; at least 5000, MongoDB's minimum). More rounds make
    /// a guessed password dearer to check, for an attacker and for each client's first
    /// connection alike.
    #[arg(
        long,
        default_value_t = crate::front::auth::DEFAULT_ITERATIONS,
        value_parser = clap::value_parser!(u32).range(i64::from(crate::front::auth::MIN_ITERATIONS)..)
    )]
    pub iterations: u32,
}

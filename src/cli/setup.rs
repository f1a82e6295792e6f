//! What a migration is set up with: `db`, `shard`, `hook`, `router`.

use std::time::Duration;

use clap::{Args, Subcommand};

use super::parse::*;

#[derive(Debug, Subcommand)]
pub enum HookCommand {
    /// Add a hook: from now on, each event it is on runs `sh -c COMMAND` with the event as one
    /// JSON object on stdin (and RESHARD_EVENT_KIND, RESHARD_MIGRATION, ... in the
    /// environment). `reshard worker` and every move deliver events; so does `hook deliver`.
    Add {
        /// The migration's id (as `reshard migration list` shows it).
        id: i64,
        /// What `hook list`, the event log and `hook remove` call it.
        #[arg(long, value_parser = parse_hook_name)]
        name: String,
        /// Comma-separated: `phase_change`, `failure`, `capacity_signal`, `approval_gate`,
        /// `all`, or any event kind (`rate_cut`, `bypass_found`, ...).
        #[arg(long, value_parser = parse_hook_on, value_name = "EVENTS")]
        on: HookOnList,
        /// The shell command. Keep secrets in the environment (`$PAGER_TOKEN`), not here:
        /// the command is stored and shown as written.
        #[arg(long, value_parser = parse_command)]
        command: String,
        /// A failure pauses the migration (and the event is delivered again after
        /// `migration resume`); without it a failure is logged and the migration goes on.
        #[arg(long)]
        blocking: bool,
        /// How long the command may run before it is killed and counted as failed.
        #[arg(long, default_value = "30s", value_parser = parse_hook_timeout, value_name = "DURATION")]
        timeout: Duration,
        /// Make every check and show what would change; change nothing.
        #[arg(long)]
        dry_run: bool,
    },
    /// The migration's hooks: what they are on, deliveries, failures and the last error.
    List {
        /// The migration's id (as `reshard migration list` shows it).
        id: i64,
    },
    /// Remove a hook.
    Remove {
        /// The migration's id (as `reshard migration list` shows it).
        id: i64,
        /// The hook's name (as `reshard hook list` shows it).
        name: String,
        /// Make every check and show what would change; change nothing.
        #[arg(long)]
        dry_run: bool,
    },
    /// Deliver every event recorded so far to the migration's hooks now.
    Deliver {
        /// The migration's id (as `reshard migration list` shows it).
        id: i64,
        /// Make every check and show what would change; change nothing.
        #[arg(long)]
        dry_run: bool,
    },
}

#[derive(Debug, Subcommand)]
pub enum RouterCommand {
    /// Each router: its epoch, lease age and reported latencies.
    List {
        /// Only this collection (DATABASE.COLLECTION).
        #[arg(long)]
        collection: Option<String>,
    },
    /// Remove the registration of a router that stopped without deregistering (crashed). Refused
    /// while it may still be serving: until a fence margin after its lease ran out.
    Remove(RouterRemoveArgs),
    /// The old name of `remove` (deprecated: accepted until 0.2, with a warning).
    #[command(hide = true)]
    Forget(RouterRemoveArgs),
}

#[derive(Debug, Args)]
pub struct RouterRemoveArgs {
    /// The router's id (`reshard router list`).
    pub id: uuid::Uuid,
    /// Make every check and show what would change; change nothing.
    #[arg(long)]
    pub dry_run: bool,
}

#[derive(Debug, Subcommand)]
pub enum DbCommand {
    /// Apply the state store's migrations (embedded in this binary).
    Migrate {
        /// Show the migrations that would be applied; apply nothing.
        #[arg(long)]
        dry_run: bool,
    },
    /// Show which schema migrations are applied.
    Status,
}

#[derive(Debug, Subcommand)]
pub enum ShardCommand {
    /// Register a shard.
    Add {
        /// Shard name used by placements (letters, digits, '_', '-', '.').
        name: String,
        /// MongoDB connection string, stored as written: put a password in `${ENV_VAR}` or
        /// `${file:PATH}`, resolved by each process when it connects.
        #[arg(
            long,
            required_unless_present = "uri_file",
            conflicts_with = "uri_file"
        )]
        uri: Option<String>,
        /// A file holding the connection string: stored as `${file:PATH}` (absolute), read by
        /// each process when it connects, so the URI and its password stay out of the state
        /// store and off the command line.
        #[arg(long, value_name = "PATH")]
        uri_file: Option<std::path::PathBuf>,
        /// Store a URI with a password in plain text anyway (it is kept in PostgreSQL as
        /// written; output and logs still redact it).
        #[arg(long)]
        allow_inline_password: bool,
        /// Database that holds the collections on this shard.
        #[arg(long)]
        database: String,
        /// Register without checking that the shard answers a ping.
        #[arg(long)]
        no_check: bool,
        /// Make every check and show what would change; change nothing.
        #[arg(long)]
        dry_run: bool,
    },
    /// List registered shards.
    List,
    /// Remove a shard that no routing version uses.
    Remove {
        /// The shard's name (as `reshard shard list` shows it).
        name: String,
        /// Make every check and show what would change; change nothing.
        #[arg(long)]
        dry_run: bool,
    },
}

//! The command line, as clap derive types. Parsing only: every command is resolved and run in
//! `commands`, one module per noun.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};

use crate::phase::Phase;

const EXIT_CODES: &str = "\
Exit codes:
  0  done
  1  the operation failed (a gate is closed, a server failed)
  2  bad input or usage; nothing was changed

Environment:
  RESHARD_DATABASE_URL, DATABASE_URL  PostgreSQL state store (when --database-url is not given)
  RESHARD_LOG                         log filter, e.g. info or reshard=debug";

/// Change how a MongoDB collection is partitioned while the application keeps running.
#[derive(Debug, Parser)]
#[command(name = "reshard", version, after_help = EXIT_CODES)]
pub struct Cli {
    /// PostgreSQL URL of the state store.
    #[arg(
        long,
        global = true,
        env = "RESHARD_DATABASE_URL",
        hide_env_values = true
    )]
    pub database_url: Option<String>,

    /// Output format of read commands.
    #[arg(long, global = true, value_enum, default_value_t = OutputFormat::Text)]
    pub output: OutputFormat,

    /// Log format (logs go to stderr; filter with RESHARD_LOG).
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,

    /// Who is acting, for the event log (default: $USER@hostname).
    #[arg(long, global = true)]
    pub actor: Option<String>,

    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum OutputFormat {
    Text,
    Json,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// The state store's schema.
    #[command(subcommand)]
    Db(DbCommand),
    /// MongoDB locations that versions place documents on.
    #[command(subcommand)]
    Shard(ShardCommand),
    /// Routing versions of a collection.
    #[command(subcommand)]
    Version(VersionCommand),
    /// Migrations between routing versions, and their phases.
    #[command(subcommand)]
    Migration(MigrationCommand),
    /// Where a document lives.
    #[command(subcommand)]
    Route(RouteCommand),
    /// Routers embedded in applications.
    #[command(subcommand)]
    Routers(RoutersCommand),
}

#[derive(Debug, Subcommand)]
pub enum RoutersCommand {
    /// Each router: its epoch, lease age and reported latencies.
    List {
        #[arg(long)]
        collection: Option<String>,
    },
}

#[derive(Debug, Subcommand)]
pub enum DbCommand {
    /// Apply the state store's migrations (embedded in this binary).
    Migrate,
    /// Show which schema migrations are applied.
    Status,
}

#[derive(Debug, Subcommand)]
pub enum ShardCommand {
    /// Register a shard.
    Add {
        /// Shard name used by placements (letters, digits, '_', '-', '.').
        name: String,
        /// MongoDB connection string (stored; shown only with the password redacted).
        #[arg(long)]
        uri: String,
        /// Database that holds the collections on this shard.
        #[arg(long)]
        database: String,
        /// Register without checking that the shard answers a ping.
        #[arg(long)]
        no_check: bool,
    },
    /// List registered shards.
    List,
    /// Remove a shard that no routing version uses.
    Remove { name: String },
}

#[derive(Debug, Subcommand)]
pub enum VersionCommand {
    /// Validate a version spec (YAML) and store it as the collection's next version.
    Create {
        #[arg(long)]
        collection: String,
        #[arg(long)]
        file: PathBuf,
        /// Validate and show the result without storing it.
        #[arg(long)]
        dry_run: bool,
    },
    /// List versions, of one collection or all.
    List {
        #[arg(long)]
        collection: Option<String>,
    },
    /// Show one version (the latest when --version is not given).
    Show {
        #[arg(long)]
        collection: String,
        #[arg(long)]
        version: Option<i32>,
    },
}

#[derive(Debug, Subcommand)]
pub enum MigrationCommand {
    /// Plan a migration of a collection to a routing version.
    Create {
        #[arg(long)]
        collection: String,
        /// Target routing version.
        #[arg(long)]
        to: i32,
        /// Source routing version (default: the collection's current version).
        #[arg(long)]
        from: Option<i32>,
    },
    /// List migrations (active ones unless --all).
    List {
        #[arg(long)]
        all: bool,
    },
    /// Show one migration.
    Show(MigrationId),
    /// Move a migration to its next phase, if the move is allowed and its gates hold.
    Advance {
        id: i64,
        /// The phase to move to.
        #[arg(long, value_parser = parse_phase)]
        to: Phase,
        /// Check the move and its gates, and change nothing.
        #[arg(long)]
        dry_run: bool,
        /// Why, for the event log.
        #[arg(long)]
        reason: Option<String>,
        /// How long to wait for every live router to acknowledge a phase that changes router
        /// behaviour, in seconds.
        #[arg(long, default_value_t = 60)]
        timeout: u64,
        /// How long routers may take to acknowledge the write switch, in seconds; when it runs
        /// out the migration goes back to dual_read and nothing was lost.
        #[arg(long, default_value_t = 10)]
        switch_timeout: u64,
    },
    /// Stop workers from taking new work; routers are unaffected.
    Pause {
        id: i64,
        #[arg(long)]
        reason: Option<String>,
    },
    /// Resume a paused or failed migration.
    Resume {
        id: i64,
        #[arg(long)]
        reason: Option<String>,
    },
    /// The migration's event log.
    History(MigrationId),
}

#[derive(Debug, Args)]
pub struct MigrationId {
    pub id: i64,
}

#[derive(Debug, Subcommand)]
pub enum RouteCommand {
    /// Compute sub-bucket, vbucket and location of a document, and the paths its phase implies.
    ///
    /// Keys: plain text is a string; int:42, oid:<24 hex>, uuid:<uuid>, hex:<bytes>, str:<text>.
    Explain {
        #[arg(long)]
        collection: String,
        #[arg(long)]
        tenant: String,
        #[arg(long)]
        id: String,
        /// Locate in this version only (default: the versions the current phase uses).
        #[arg(long)]
        version: Option<i32>,
    },
}

fn parse_phase(s: &str) -> Result<Phase, String> {
    s.parse::<Phase>().map_err(|e| e.to_string())
}

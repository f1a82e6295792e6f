//! The command line, as clap derive types. Parsing only: every command is resolved and run in
//! `commands`, one module per noun. Here: the global options and the commands; their
//! arguments by group in the submodules, the value parsers in `parse`.

use std::path::PathBuf;

use clap::{Parser, Subcommand, ValueEnum};

mod migration;
mod parse;
mod playbook;
mod serve;
mod setup;
mod work;

pub use migration::*;
pub use parse::{HookOnList, WrittenDuration};
pub use playbook::*;
pub use serve::*;
pub use setup::*;
pub use work::*;

pub use crate::driver::wait::Until;

const EXIT_CODES: &str = "\
Exit codes:
  0  done
  1  the operation failed (a gate is closed, a server or the state store failed or
     cannot be reached)
  2  bad input or usage; nothing was changed

Environment:
  RESHARD_DATABASE_URL, DATABASE_URL  PostgreSQL state store (when --database-url is not given)
  RESHARD_ACTOR                       who acts, for the event log (when --actor is not given)
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

    /// Who is acting, for the event log (default, and when empty: the operating system's
    /// user @ hostname).
    #[arg(long, global = true, env = "RESHARD_ACTOR")]
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
    /// Routers: the library applications embed, and `reshard front`s.
    #[command(subcommand)]
    Router(RouterCommand),
    /// The old name of `router` (deprecated: accepted until 0.2, with a warning).
    #[command(subcommand, hide = true)]
    Routers(RouterCommand),
    /// Run a migration's work (backfill, cleanup waves, the copy back of a rollback): claim
    /// partitions under leases and process them. Run any number, anywhere.
    Worker(WorkerArgs),
    /// A migration's throttle: rate, batch size, in-flight bound (workers apply changes within 2 s).
    #[command(subcommand)]
    Throttle(ThrottleCommand),
    /// Documents a backfill could not write.
    #[command(subcommand)]
    Deadletter(DeadletterCommand),
    /// Writes that bypassed the router: list them, resolve them.
    #[command(subcommand)]
    Bypass(BypassCommand),
    /// Commands a migration runs on its events (phase changes, failures, capacity signals,
    /// approvals), with the event as JSON on stdin.
    #[command(subcommand)]
    Hook(HookCommand),
    /// Check that the target holds what the source held: counts, samples, or everything.
    Reconcile(ReconcileArgs),
    /// Playbooks: check one, or print their JSON Schema.
    #[command(subcommand)]
    Playbook(PlaybookCommand),
    /// Run what remains of a playbook, from the state stored in PostgreSQL. Run it again after
    /// a stop, a crash or an approval: it continues where it stopped.
    Run(RunArgs),
    /// Serve the MongoDB wire protocol: applications connect with their own MongoDB driver
    /// (`mongodb://HOST:PORT/`), as to a `mongos`. The collections of --database with a routing
    /// version go through the router's engine in the migration's phase (the front registers
    /// as a router); everything else goes to --passthrough-uri. Runs until SIGINT/SIGTERM,
    /// then finishes the requests in flight, deregisters and prints what it served. With
    /// --users-file clients authenticate (SCRAM-SHA-256); with --tls-cert-file and
    /// --tls-key-file they connect over TLS (`tls=true`).
    Front(FrontArgs),
    /// Approve a playbook's manual gate; the next `reshard run` goes past it.
    Approve {
        /// The migration the playbook drives (as `reshard run` printed it). A playbook's name
        /// is still accepted, with a warning, until 0.2.
        #[arg(value_name = "MIGRATION_ID")]
        migration: String,
        /// The approval step's name (as `reshard run` printed it).
        #[arg(long)]
        step: String,
        /// Why, for the event log.
        #[arg(long)]
        reason: Option<String>,
        /// Make every check and show what would change; change nothing.
        #[arg(long)]
        dry_run: bool,
    },
    /// Estimate what a playbook moves, per shard, and how many buckets hot tenants need.
    Plan(PlanArgs),
    /// Serve every migration's state as Prometheus metrics, read from the state store
    /// (phase, epoch, documents left, rate, ETA, open findings, bypasses and dead letters,
    /// each router's lag): what a dashboard shows between workers too. Runs until
    /// SIGINT/SIGTERM.
    Exporter(ExporterArgs),
    /// Copy again the documents the latest reconciliation run found missing or mismatched.
    Repair {
        /// The migration whose findings are repaired.
        id: i64,
        /// Repair the findings of this run (default: the latest finished run).
        #[arg(long)]
        run: Option<i64>,
        /// Make every check and show what would change; change nothing.
        #[arg(long)]
        dry_run: bool,
    },
    /// Print a shell completion script to stdout, e.g.
    /// `reshard completion bash > ~/.local/share/bash-completion/completions/reshard`.
    Completion {
        /// The shell the script is for.
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Print the man page (roff) to stdout (`reshard man > reshard.1; man ./reshard.1`), or
    /// with --dir write one page per command there (reshard.1, reshard-migration.1, ...).
    Man {
        /// Write every command's page into this directory instead.
        #[arg(long)]
        dir: Option<PathBuf>,
    },
}

impl Command {
    /// The old words of this command line and the words that replace them, when it uses a
    /// deprecated name ([`crate::vocabulary::RENAMED_COMMANDS`], [`crate::vocabulary::RENAMED_FLAGS`]).
    pub fn deprecated_words(&self) -> Option<(&'static str, &'static str)> {
        use crate::vocabulary::renamed_command as renamed;
        match self {
            Command::Routers(RouterCommand::Forget(_)) => Some(renamed("routers forget")),
            Command::Routers(_) => Some(renamed("routers")),
            Command::Router(RouterCommand::Forget(_)) => Some(renamed("router forget")),
            Command::Migration(MigrationCommand::Configure {
                shadow_reads: Some(_),
                ..
            }) => Some(crate::vocabulary::renamed_flag("--shadow-reads")),
            _ => None,
        }
    }

    /// Whether the command was asked for a dry run whose changes go through the state store
    /// and are rolled back there ([`crate::store::Store::dry_run`]). `migration advance` and
    /// `rollback`, `version create` and `run` check their moves themselves.
    pub fn is_dry_run(&self) -> bool {
        match self {
            Command::Db(DbCommand::Migrate { dry_run })
            | Command::Shard(
                ShardCommand::Add { dry_run, .. } | ShardCommand::Remove { dry_run, .. },
            )
            | Command::Migration(
                MigrationCommand::Create { dry_run, .. }
                | MigrationCommand::Pause { dry_run, .. }
                | MigrationCommand::Resume { dry_run, .. }
                | MigrationCommand::Configure { dry_run, .. },
            )
            | Command::Throttle(ThrottleCommand::Set { dry_run, .. })
            | Command::Deadletter(
                DeadletterCommand::Retry { dry_run, .. } | DeadletterCommand::Skip { dry_run, .. },
            )
            | Command::Bypass(BypassCommand::Resolve { dry_run, .. })
            | Command::Hook(
                HookCommand::Add { dry_run, .. }
                | HookCommand::Remove { dry_run, .. }
                | HookCommand::Deliver { dry_run, .. },
            )
            | Command::Router(
                RouterCommand::Remove(RouterRemoveArgs { dry_run, .. })
                | RouterCommand::Forget(RouterRemoveArgs { dry_run, .. }),
            )
            | Command::Routers(
                RouterCommand::Remove(RouterRemoveArgs { dry_run, .. })
                | RouterCommand::Forget(RouterRemoveArgs { dry_run, .. }),
            )
            | Command::Approve { dry_run, .. }
            | Command::Repair { dry_run, .. } => *dry_run,
            _ => false,
        }
    }
}

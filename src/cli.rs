//! The command line, as clap derive types. Parsing only: every command is resolved and run in
//! `commands`, one module per noun.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};

pub use crate::driver::wait::Until;
use crate::phase::Phase;

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
    /// deprecated name ([`crate::vocabulary::RENAMED_COMMANDS`]).
    pub fn deprecated_words(&self) -> Option<(&'static str, &'static str)> {
        use crate::vocabulary::renamed_command as renamed;
        match self {
            Command::Routers(RouterCommand::Forget(_)) => Some(renamed("routers forget")),
            Command::Routers(_) => Some(renamed("routers")),
            Command::Router(RouterCommand::Forget(_)) => Some(renamed("router forget")),
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

fn parse_refresh_interval(s: &str) -> Result<Duration, String> {
    let d = crate::duration::parse(s)?;
    if d < Duration::from_secs(1) || d > Duration::from_secs(3600) {
        return Err(format!("{s:?} is outside the allowed range: from 1s to 1h"));
    }
    Ok(d)
}

#[derive(Debug, Subcommand)]
pub enum PlaybookCommand {
    /// Check a playbook: every problem at once, each with file:line:column; exit 2 on any.
    Validate {
        /// The playbook (YAML).
        file: PathBuf,
    },
    /// Print the JSON Schema of playbooks (for editors).
    Schema,
}

#[derive(Debug, Args)]
pub struct RunArgs {
    /// The playbook (YAML).
    pub file: PathBuf,
    /// Print the steps that would run from the current state; change nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Workers a step runs in this process when the playbook does not say (0: workers run
    /// elsewhere, with `reshard worker`).
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u16).range(0..=64))]
    pub workers: u16,
    /// Serve Prometheus metrics at `http://HOST:PORT/metrics` (and `/healthz`) while it runs
    /// (`localhost:9000`, `10.0.0.5:9000`; `:9000` listens on every interface).
    #[arg(long, value_name = "HOST:PORT", value_parser = parse_listen_addr)]
    pub metrics_addr: Option<std::net::SocketAddr>,
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
    /// Serve Prometheus metrics at `http://HOST:PORT/metrics` (and `/healthz`) while it runs.
    #[arg(long, value_name = "HOST:PORT", value_parser = parse_listen_addr)]
    pub metrics_addr: Option<std::net::SocketAddr>,
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

#[derive(Debug, Args)]
pub struct PlanArgs {
    /// The playbook (YAML) whose source and target to compare.
    pub file: PathBuf,
    /// Print every tenant, not the hottest 20 (JSON output always has every one).
    #[arg(long)]
    pub all: bool,
}

#[derive(Debug, Args)]
#[command(args_conflicts_with_subcommands = true, subcommand_negates_reqs = true)]
pub struct ReconcileArgs {
    #[command(subcommand)]
    pub command: Option<ReconcileCommand>,
    /// The migration.
    #[arg(required = true)]
    pub id: Option<i64>,
    /// Samples per stratum (each clean stratum of k samples bounds its defect rate by 3/k).
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u64).range(1..=100_000))]
    pub sample: u64,
    /// Check every source document, not samples (partitioned and leased like backfill; run
    /// it in several processes, or continue an interrupted run with --resume).
    #[arg(long)]
    pub full: bool,
    /// Continue the unfinished full run RUN (after a crash, or to help another process).
    #[arg(long, value_name = "RUN")]
    pub resume: Option<i64>,
    /// Partitions verified at once by this process (full runs).
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u16).range(1..=64))]
    pub concurrency: u16,
    /// How long a verify partition's lease lasts without a heartbeat (full runs; 2s to 1h);
    /// another process resumes it after that.
    #[arg(long, default_value = "30s", value_parser = parse_lease_ttl, value_name = "DURATION")]
    pub lease_ttl: Duration,
    /// How samples are grouped.
    #[arg(long, value_enum, default_value_t = StratifyArg::Shard)]
    pub stratify: StratifyArg,
    /// How long to wait before findings are checked again (a write in flight is no defect).
    #[arg(long, default_value = "2s", value_parser = parse_duration, value_name = "DURATION")]
    pub recheck_delay: Duration,
    /// Serve Prometheus metrics at `http://HOST:PORT/metrics` (and `/healthz`) while it runs
    /// (full runs).
    #[arg(long, value_name = "HOST:PORT", value_parser = parse_listen_addr)]
    pub metrics_addr: Option<std::net::SocketAddr>,
    /// Print every stratum and finding, not the first 20 of each (JSON output always has
    /// every one).
    #[arg(long)]
    pub all: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum StratifyArg {
    Bucket,
    Tenant,
    Shard,
}

#[derive(Debug, Subcommand)]
pub enum ReconcileCommand {
    /// A run's verdict, strata and findings (the latest run unless --run).
    Show {
        /// The migration's id (as `reshard migration list` shows it).
        id: i64,
        /// The reconciliation run to show (default: the latest).
        #[arg(long)]
        run: Option<i64>,
        /// Print every stratum and finding, not the first 20 of each (JSON output always
        /// has every one).
        #[arg(long)]
        all: bool,
    },
}

#[derive(Debug, Args)]
pub struct WorkerArgs {
    /// Work only on this migration (default: every migration with work to do: backfill,
    /// cleanup or the copy back of a rollback).
    #[arg(value_name = "ID")]
    pub id: Option<i64>,
    /// The migration, as a flag (older scripts); the positional ID is the way to write it.
    #[arg(
        long = "migration",
        value_name = "ID",
        hide = true,
        conflicts_with = "id"
    )]
    pub migration_flag: Option<i64>,
    /// Partitions worked on at once.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u16).range(1..=64))]
    pub concurrency: u16,
    /// Exit once the migration's current task (backfill, cleanup or copy back) is done instead
    /// of waiting for more work.
    #[arg(long)]
    pub exit_when_done: bool,
    /// How long a partition lease lasts without a heartbeat (2s to 1h); another worker takes
    /// over after that.
    #[arg(long, default_value = "30s", value_parser = parse_lease_ttl, value_name = "DURATION")]
    pub lease_ttl: Duration,
    /// The worker's name in leases and status (default: host:pid).
    #[arg(long)]
    pub name: Option<String>,
    /// Serve Prometheus metrics at `http://HOST:PORT/metrics` (and `/healthz`) while it runs
    /// (`localhost:9000`, `10.0.0.5:9000`; `:9000` listens on every interface).
    #[arg(long, value_name = "HOST:PORT", value_parser = parse_listen_addr)]
    pub metrics_addr: Option<std::net::SocketAddr>,
}

impl WorkerArgs {
    /// The migration to work on, however it was given.
    pub fn migration(&self) -> Option<i64> {
        self.id.or(self.migration_flag)
    }
}

#[derive(Debug, Subcommand)]
pub enum ThrottleCommand {
    /// The configured settings, and what each live worker applies.
    Show(MigrationId),
    /// Change settings; running workers apply them within 2 seconds.
    Set {
        /// The migration's id (as `reshard migration list` shows it).
        id: i64,
        /// Documents per second across all workers.
        #[arg(long)]
        max_docs_per_sec: Option<f64>,
        /// Write commands in flight per target shard, per worker (1 to 64).
        #[arg(long)]
        max_in_flight_per_shard: Option<usize>,
        /// Documents per batch (1 to 100000).
        #[arg(long)]
        batch_size: Option<usize>,
        /// A batch slower than this halves the applied rate (whole milliseconds: 200ms, 1s).
        #[arg(long, value_parser = parse_written_duration, value_name = "DURATION")]
        target_batch_latency: Option<WrittenDuration>,
        /// Overload lasting this long is logged as a capacity signal (whole seconds: 30s, 2m).
        #[arg(long, value_parser = parse_written_duration, value_name = "DURATION")]
        capacity_signal_after: Option<WrittenDuration>,
        /// The application's latency budget: while a router reports a p99 above it (or more
        /// than 1 % errors) workers halve their rate, and step it back once routers recover.
        /// A p99 (`25ms`), a multiple of the p99 routers reported when the backfill was
        /// planned (`1.3x`), or `off`.
        #[arg(long, value_parser = parse_latency_budget, value_name = "BUDGET")]
        latency_budget: Option<crate::settings::LatencyBudget>,
        /// Why, for the event log.
        #[arg(long)]
        reason: Option<String>,
        /// Make every check and show what would change; change nothing.
        #[arg(long)]
        dry_run: bool,
    },
}

#[derive(Debug, Subcommand)]
pub enum DeadletterCommand {
    /// Dead letters of a migration (open ones unless --all).
    List {
        /// The migration's id (as `reshard migration list` shows it).
        id: i64,
        /// Every entry, resolved ones too (default: the open ones).
        #[arg(long)]
        all: bool,
    },
    /// Read the documents again from the source and write them again.
    Retry {
        /// The migration's id (as `reshard migration list` shows it).
        id: i64,
        /// Every open dead letter.
        #[arg(long, conflicts_with = "doc_id", required_unless_present = "doc_id")]
        all: bool,
        /// The `_id` as `deadletter list` shows it: digits for a number, text for a string
        /// (in double quotes when it could read as a number: '"7"'), or Extended JSON
        /// ('{"$numberLong": "7"}', '{"$oid": "..."}').
        #[arg(long = "id", value_name = "ID")]
        doc_id: Option<String>,
        /// Make every check and show what would change; change nothing.
        #[arg(long)]
        dry_run: bool,
    },
    /// Accept that a document will not be copied; the reason goes to the event log.
    Skip {
        /// The migration's id (as `reshard migration list` shows it).
        id: i64,
        /// The `_id` as `deadletter list` shows it: digits for a number, text for a string
        /// (in double quotes when it could read as a number: '"7"'), or Extended JSON
        /// ('{"$numberLong": "7"}', '{"$oid": "..."}').
        #[arg(long = "id", value_name = "ID")]
        doc_id: String,
        /// Why, for the event log.
        #[arg(long)]
        reason: String,
        /// Make every check and show what would change; change nothing.
        #[arg(long)]
        dry_run: bool,
    },
}

#[derive(Debug, Subcommand)]
pub enum BypassCommand {
    /// Writes that bypassed the router (open ones unless --all), after reading every
    /// location's change stream to its end.
    List {
        /// The migration's id (as `reshard migration list` shows it).
        id: i64,
        /// Every entry, resolved ones too (default: the open ones).
        #[arg(long)]
        all: bool,
    },
    /// Resolve a bypass: recopy the write by the protocol's rules, or ignore it.
    Resolve {
        /// The migration's id (as `reshard migration list` shows it).
        id: i64,
        /// The bypass's number, as `bypass list` shows it.
        #[arg(
            long,
            value_name = "N",
            conflicts_with = "doc_id",
            required_unless_present = "doc_id"
        )]
        bypass: Option<i64>,
        /// Every open bypass of this `_id`, as `bypass list` shows it: digits for a number,
        /// text for a string (in double quotes when it could read as a number: '"7"'), or
        /// Extended JSON ('{"$numberLong": "7"}', '{"$oid": "..."}').
        #[arg(long = "id", value_name = "ID")]
        doc_id: Option<String>,
        /// `recopy`: write the document as the bypassed location holds it now through the
        /// router (a document gone from there is deleted); `ignore`: leave it.
        #[arg(long, value_enum)]
        action: BypassAction,
        /// Why, for the event log.
        #[arg(long)]
        reason: String,
        /// Make every check and show what would change; change nothing.
        #[arg(long)]
        dry_run: bool,
    },
}

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

/// The parsed `--on` of `hook add`.
#[derive(Clone, Debug, PartialEq)]
pub struct HookOnList(pub Vec<crate::hooks::HookOn>);

fn parse_hook_on(s: &str) -> Result<HookOnList, String> {
    crate::hooks::HookOn::parse_list(s).map(HookOnList)
}

fn parse_latency_budget(s: &str) -> Result<crate::settings::LatencyBudget, String> {
    crate::settings::LatencyBudget::parse(s)
}

fn parse_hook_name(s: &str) -> Result<String, String> {
    crate::hooks::check_name(s).map(|()| s.to_owned())
}

fn parse_command(s: &str) -> Result<String, String> {
    if s.trim().is_empty() {
        return Err("the command is empty".into());
    }
    Ok(s.to_owned())
}

/// A hook's timeout: 100 ms to 1 h (a hook holds its delivery while it runs), in whole
/// milliseconds (as it is stored).
fn parse_hook_timeout(s: &str) -> Result<Duration, String> {
    let d = crate::duration::parse(s)?;
    if d < Duration::from_millis(100) || d > Duration::from_secs(3600) {
        return Err(format!(
            "{s:?} is outside the allowed range: from 100ms to 1h"
        ));
    }
    crate::duration::whole(d, crate::duration::Unit::Milliseconds)
        .map_err(|why| format!("{s}: {why}"))?;
    Ok(d)
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum BypassAction {
    Recopy,
    Ignore,
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

#[derive(Debug, Subcommand)]
pub enum VersionCommand {
    /// Validate a version spec (YAML) and store it as the collection's next version.
    Create {
        /// The collection (DATABASE.COLLECTION).
        #[arg(long)]
        collection: String,
        /// The routing version's YAML file.
        #[arg(long)]
        file: PathBuf,
        /// Validate and show the result without storing it.
        #[arg(long)]
        dry_run: bool,
    },
    /// List versions, of one collection or all.
    List {
        /// Only this collection (DATABASE.COLLECTION).
        #[arg(long)]
        collection: Option<String>,
    },
    /// Show one version (the latest when --version is not given).
    Show {
        /// The collection (DATABASE.COLLECTION).
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
        /// The collection (DATABASE.COLLECTION).
        #[arg(long)]
        collection: String,
        /// Target routing version.
        #[arg(long)]
        to: i32,
        /// Source routing version (default: the collection's current version).
        #[arg(long)]
        from: Option<i32>,
        /// Make every check and show what would change; change nothing.
        #[arg(long)]
        dry_run: bool,
    },
    /// List migrations (active ones unless --all).
    List {
        /// Every migration, finished ones too (default: the ones under way).
        #[arg(long)]
        all: bool,
    },
    /// Show one migration.
    Show(MigrationId),
    /// Move a migration to its next phase, if the move is allowed and its gates hold.
    Advance {
        /// The migration's id (as `reshard migration list` shows it).
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
        /// behaviour.
        #[arg(long, default_value = "60s", value_parser = parse_duration, value_name = "DURATION")]
        timeout: Duration,
        /// How long routers may take to acknowledge the write switch; when it runs out the
        /// migration goes back to dual_read and nothing was lost.
        #[arg(long, default_value = "10s", value_parser = parse_duration, value_name = "DURATION")]
        switch_timeout: Duration,
    },
    /// Roll back: before new_writes back to planned (the target dropped); from new_writes to
    /// new_reads into reverting, where routers mirror writes to the source and workers copy
    /// the application's target writes back. Refused once cleanup has started.
    Rollback {
        /// The migration's id (as `reshard migration list` shows it).
        id: i64,
        /// Check the move and its gates, and change nothing.
        #[arg(long)]
        dry_run: bool,
        /// Why, for the event log.
        #[arg(long)]
        reason: Option<String>,
        /// How long to wait for routers to acknowledge.
        #[arg(long, default_value = "60s", value_parser = parse_duration, value_name = "DURATION")]
        timeout: Duration,
        /// How long routers may take to acknowledge a write switch.
        #[arg(long, default_value = "10s", value_parser = parse_duration, value_name = "DURATION")]
        switch_timeout: Duration,
    },
    /// Stop workers from taking new work; routers are unaffected.
    Pause {
        /// The migration's id (as `reshard migration list` shows it).
        id: i64,
        /// Why, for the event log.
        #[arg(long)]
        reason: Option<String>,
        /// Make every check and show what would change; change nothing.
        #[arg(long)]
        dry_run: bool,
    },
    /// Resume a paused or failed migration.
    Resume {
        /// The migration's id (as `reshard migration list` shows it).
        id: i64,
        /// Why, for the event log.
        #[arg(long)]
        reason: Option<String>,
        /// Make every check and show what would change; change nothing.
        #[arg(long)]
        dry_run: bool,
    },
    /// The migration's event log.
    History(MigrationId),
    /// Wait until the migration reaches a phase (or passes it on its path), or until a gate
    /// would pass; progress goes to stderr. Exit 0 when reached, 1 on timeout or when the
    /// migration ended elsewhere (e.g. rolled back while waiting for completed).
    Wait {
        /// The migration's id (as `reshard migration list` shows it).
        id: i64,
        /// A phase (planned, dual_read, ..., completed, reverting, revert_switch, rolled_back)
        /// or a gate (routers_acknowledged, backfill_complete, reconciliation_passed,
        /// cleanup_complete, revert_complete, bypasses_resolved).
        #[arg(long, value_name = "PHASE|GATE", value_parser = parse_until)]
        until: Until,
        /// Give up after this long (default: wait until reached).
        #[arg(long, value_parser = parse_duration, value_name = "DURATION")]
        timeout: Option<Duration>,
    },
    /// Gate thresholds, cleanup options, shadow reads and the backfill's partition size stored
    /// with the migration.
    Configure {
        /// The migration's id (as `reshard migration list` shows it).
        id: i64,
        /// Missing documents a passing reconciliation run may find (default 0).
        #[arg(long)]
        max_missing: Option<u64>,
        /// Mismatched pristine copies a passing run may find (default 0).
        #[arg(long)]
        max_mismatched: Option<u64>,
        /// Misplaced documents a passing run may find (default 0).
        #[arg(long)]
        max_misplaced: Option<u64>,
        /// Cleanup waves as three cumulative percentages, e.g. 1,10,100.
        #[arg(long, value_delimiter = ',', num_args = 3)]
        cleanup_waves: Option<Vec<f64>>,
        /// Drop source collections that cleanup emptied (when the migration completes).
        #[arg(long, conflicts_with = "keep_empty_source")]
        drop_empty_source: bool,
        /// Keep source collections that cleanup emptied (the default).
        #[arg(long)]
        keep_empty_source: bool,
        /// The most documents in one backfill partition (default: one partition per worker
        /// registered when the backfill is planned, at least 100,000 documents each); refused
        /// once the backfill is planned (the partitions are cut by then).
        #[arg(long)]
        documents_per_partition: Option<u64>,
        /// Shadow reads: the percentage of reads (0 to 100) for which routers also read the
        /// other side off the application's latency path and compare, in dual_read through
        /// reconcile; mismatches hold the reconcile gate shut (default 0: off).
        #[arg(long, value_name = "PERCENT")]
        shadow_reads: Option<f64>,
        /// Why, for the event log.
        #[arg(long)]
        reason: Option<String>,
        /// Make every check and show what would change; change nothing.
        #[arg(long)]
        dry_run: bool,
    },
    /// Progress: phase, per-shard and per-partition counters, docs/s, ETA, rates, workers.
    Status {
        /// The migration's id (as `reshard migration list` shows it).
        id: i64,
        /// Refresh every second until the migration ends (Ctrl-C to stop): bars for the task
        /// the phase runs (backfill, full reconciliation, cleanup waves, revert) on a terminal,
        /// a plain line per refresh otherwise, one JSON object per line with --output json.
        #[arg(long)]
        watch: bool,
        /// Also list every partition.
        #[arg(long)]
        partitions: bool,
    },
}

#[derive(Debug, Args)]
pub struct MigrationId {
    /// The migration's id (as `reshard migration list` shows it).
    pub id: i64,
}

#[derive(Debug, Subcommand)]
pub enum RouteCommand {
    /// Compute sub-bucket, vbucket and location of a document, and the paths its phase implies.
    ///
    /// Keys: plain text is a string; int:42, oid:<24 hex>, uuid:<uuid>, hex:<bytes>, str:<text>;
    /// or Extended JSON as JSON output writes `_id`s ('{"$numberLong": "42"}', '"42"').
    Explain {
        /// The collection (DATABASE.COLLECTION).
        #[arg(long)]
        collection: String,
        /// The tenant key's value (`int:42`, `oid:<24 hex>`, `uuid:...`, `str:...`; plain
        /// text is a string).
        #[arg(long)]
        tenant: String,
        /// The document's `_id`, written as --tenant is.
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

/// A duration flag: humantime (`500ms`, `30s`, `5m`); a bare number is refused.
fn parse_duration(s: &str) -> Result<Duration, String> {
    crate::duration::parse(s)
}

/// A duration flag whose value is stored in a coarser unit than humantime's (a setting kept
/// in whole seconds or milliseconds): kept as written too, so that a value the unit cannot
/// hold is refused naming what was written.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WrittenDuration {
    pub written: String,
    pub value: Duration,
}

impl WrittenDuration {
    /// The value as a whole, non-zero number of `unit`, or the refusal naming `flag`.
    pub fn whole(&self, flag: &str, unit: crate::duration::Unit) -> Result<u64, String> {
        crate::duration::whole(self.value, unit)
            .map_err(|why| format!("{flag} {}: {why}", self.written.trim()))
    }
}

fn parse_written_duration(s: &str) -> Result<WrittenDuration, String> {
    Ok(WrittenDuration {
        written: s.to_owned(),
        value: crate::duration::parse(s)?,
    })
}

/// An address to listen on (`--metrics-addr`, `front --listen`): `HOST:PORT` (a host name is
/// resolved, its first IPv4 address taken) or `:PORT`, every interface (as Prometheus's own
/// `--web.listen-address=:9090`: an exporter is there to be scraped from elsewhere; write
/// `localhost:PORT` to keep it local).
fn parse_listen_addr(s: &str) -> Result<std::net::SocketAddr, String> {
    use std::net::{SocketAddr, ToSocketAddrs};
    let text = s.trim();
    if let Some(port) = text.strip_prefix(':') {
        let port: u16 = port
            .parse()
            .map_err(|_| format!("{text:?}: the port must be a number from 0 to 65535"))?;
        return Ok(SocketAddr::from(([0, 0, 0, 0], port)));
    }
    if let Ok(addr) = text.parse::<SocketAddr>() {
        return Ok(addr);
    }
    let Some((host, port)) = text.rsplit_once(':') else {
        return Err(format!(
            "{text:?}: write HOST:PORT (localhost:9000, 10.0.0.5:9000) or :PORT"
        ));
    };
    if host.is_empty() || port.parse::<u16>().is_err() {
        return Err(format!(
            "{text:?}: write HOST:PORT (localhost:9000, 10.0.0.5:9000) or :PORT, the port a \
             number from 0 to 65535"
        ));
    }
    let found: Vec<SocketAddr> = text
        .to_socket_addrs()
        .map_err(|e| format!("{text:?}: cannot resolve {host:?}: {e}"))?
        .collect();
    // An IPv4 address first: `localhost` often resolves to `::1` before `127.0.0.1`, and a
    // scraper told `localhost:PORT` may try either.
    found
        .iter()
        .find(|a| a.is_ipv4())
        .or(found.first())
        .copied()
        .ok_or_else(|| format!("{text:?}: {host:?} resolves to no address"))
}

/// A lease's length: 2 s to 1 h.
fn parse_lease_ttl(s: &str) -> Result<Duration, String> {
    let d = crate::duration::parse(s)?;
    if d < Duration::from_secs(2) {
        return Err(format!(
            "{s:?} is too short: a lease is at least 2s. A holder renews its lease every third \
             of it and stops writing a fifth of it before its end, so a shorter lease leaves a \
             command less than a second and its renewals a few hundred milliseconds, less than \
             a loaded state store or shard takes to answer (the allowed range is 2s to 1h)"
        ));
    }
    if d > Duration::from_secs(3600) {
        return Err(format!("{s:?} is outside the allowed range: from 2s to 1h"));
    }
    Ok(d)
}

fn parse_until(s: &str) -> Result<Until, String> {
    Until::parse(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lease_shorter_than_two_seconds_is_refused_with_the_reason() {
        let e = parse_lease_ttl("1500ms").unwrap_err();
        assert!(e.contains("too short") && e.contains("renews"), "{e}");
        assert_eq!(parse_lease_ttl("2s").unwrap(), Duration::from_secs(2));
        assert!(parse_lease_ttl("2h").unwrap_err().contains("2s to 1h"));
    }

    #[test]
    fn a_listen_address_may_name_a_host_or_only_a_port() {
        assert_eq!(
            parse_listen_addr("127.0.0.1:9000").unwrap(),
            "127.0.0.1:9000".parse().unwrap()
        );
        assert_eq!(
            parse_listen_addr(":9000").unwrap(),
            "0.0.0.0:9000".parse().unwrap()
        );
        assert_eq!(parse_listen_addr("[::1]:9000").unwrap().port(), 9000);
        let local = parse_listen_addr("localhost:9000").unwrap();
        assert!(local.ip().is_loopback() && local.port() == 9000, "{local}");
        for bad in ["localhost", ":nine", "localhost:99999", ":"] {
            assert!(parse_listen_addr(bad).is_err(), "{bad}");
        }
    }
}

//! The migration's work and its checks: `worker`, `throttle`, `reconcile`, `deadletter`,
//! `bypass`.

use std::time::Duration;

use clap::{Args, Subcommand, ValueEnum};

use super::parse::*;
use super::MigrationId;

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
    /// Full runs: verify partitions are leased as the workers' partitions are.
    #[command(flatten)]
    pub leased: LeasedArgs,
    /// How samples are grouped.
    #[arg(long, value_enum, default_value_t = StratifyArg::Shard)]
    pub stratify: StratifyArg,
    /// How long to wait before findings are checked again (a write in flight is no defect).
    #[arg(long, default_value = "2s", value_parser = parse_duration, value_name = "DURATION")]
    pub recheck_delay: Duration,
    #[command(flatten)]
    pub metrics: MetricsArg,
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
    #[command(flatten)]
    pub leased: LeasedArgs,
    /// Exit once the migration's current task (backfill, cleanup or copy back) is done instead
    /// of waiting for more work.
    #[arg(long)]
    pub exit_when_done: bool,
    /// The worker's name in leases and status (default: host:pid).
    #[arg(long)]
    pub name: Option<String>,
    #[command(flatten)]
    pub metrics: MetricsArg,
}

/// How a process works on leased partitions (`reshard worker`, `reshard reconcile --full`):
/// one declaration for both.
#[derive(Debug, Args)]
pub struct LeasedArgs {
    /// Partitions this process works on at once (1 to 64).
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u16).range(1..=64))]
    pub concurrency: u16,
    /// How long a partition's lease lasts without a heartbeat (2s to 1h); another process
    /// takes the partition over after that.
    #[arg(long, default_value = "30s", value_parser = parse_lease_ttl, value_name = "DURATION")]
    pub lease_ttl: Duration,
}

/// `--metrics-addr`, as every long-running command takes it.
#[derive(Debug, Args)]
pub struct MetricsArg {
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

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum BypassAction {
    Recopy,
    Ignore,
}

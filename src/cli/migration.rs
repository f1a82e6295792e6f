//! Versions, migrations and their phases, and where documents live: `version`, `migration`,
//! `route`.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Subcommand};

use super::parse::*;
use super::Until;
use crate::phase::Phase;

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
        shadow_read_percent: Option<f64>,
        /// The old name of `--shadow-read-percent` (deprecated: accepted until 0.2, with a
        /// warning).
        #[arg(
            long,
            value_name = "PERCENT",
            hide = true,
            conflicts_with = "shadow_read_percent"
        )]
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

//! What reshard measures, through the `metrics` facade: one name per metric, its help text,
//! and the calls the workers, the router and the event log make. Recording costs nothing
//! until a process installs an exporter (`reshard worker|run|reconcile --metrics-addr`, or an
//! application's own Prometheus recorder for the router library).
//!
//! Names follow Prometheus conventions: `_total` counters, `_seconds` histograms, labels for
//! the migration, the task, the shard and the operation.

use std::time::Duration;

/// The kind of a metric.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Counter,
    Gauge,
    Histogram,
}

/// Every metric: name, kind, labels, meaning. README lists the same (a test checks it).
pub const METRICS: &[(&str, Kind, &str, &str)] = &[
    (
        DOCUMENTS_SCANNED,
        Kind::Counter,
        "migration, task, shard",
        "source documents a worker read and checkpointed (backfill, cleanup, revert)",
    ),
    (
        DOCUMENTS_COPIED,
        Kind::Counter,
        "migration, task, shard",
        "documents written to the other layout (backfill: copied to the target; revert: written back to the source)",
    ),
    (
        DOCUMENTS_ALREADY_PRESENT,
        Kind::Counter,
        "migration, task, shard",
        "documents the other layout already held (a copy, a newer write or a tombstone won)",
    ),
    (
        DOCUMENTS_STAMPED,
        Kind::Counter,
        "migration, task, shard",
        "documents that stay where they are and got the target's routing field",
    ),
    (
        DOCUMENTS_DEAD_LETTERED,
        Kind::Counter,
        "migration, task, shard",
        "documents a target refused for good (see `reshard deadletter list`)",
    ),
    (
        DOCUMENTS_DELETED,
        Kind::Counter,
        "migration, task, shard",
        "cleanup: moved source documents deleted once the target held them",
    ),
    (
        DOCUMENTS_VERIFIED,
        Kind::Counter,
        "migration, shard",
        "full reconciliation: source documents checked against the target",
    ),
    (
        FINDINGS,
        Kind::Counter,
        "migration, shard",
        "full reconciliation: findings (missing, mismatched, misplaced, ...) before their recheck",
    ),
    (
        BATCHES,
        Kind::Counter,
        "migration, task",
        "batches written and checkpointed",
    ),
    (
        BATCH_SECONDS,
        Kind::Histogram,
        "migration, task",
        "time from reading a batch to its checkpoint",
    ),
    (
        PARTITIONS_CLAIMED,
        Kind::Counter,
        "migration, task",
        "partitions a worker leased (a partition leased again counts here and below)",
    ),
    (
        PARTITIONS_RECLAIMED,
        Kind::Counter,
        "migration, task",
        "partitions leased again: an earlier lease ran out (a worker died) or was released",
    ),
    (
        PARTITIONS_DONE,
        Kind::Counter,
        "migration, task",
        "partitions finished",
    ),
    (
        PARTITION_TIMEOUTS,
        Kind::Counter,
        "migration, task",
        "commands that ran out of the time their partition lease left (the partition's batches were halved and it went on from its checkpoint)",
    ),
    (
        PARTITIONS_STALLED,
        Kind::Counter,
        "migration, task",
        "partitions found stalled: several attempts in a row recorded nothing (a `partition_stalled` event names each)",
    ),
    (
        OVERLOADS,
        Kind::Counter,
        "migration, task",
        "writes a target rejected for overload",
    ),
    (
        RATE_CUTS,
        Kind::Counter,
        "migration, task",
        "times a worker halved its rate (overload or slow batches)",
    ),
    (
        RATE_APPLIED,
        Kind::Gauge,
        "migration, task",
        "the rate this worker applies now, documents per second",
    ),
    (
        EVENTS,
        Kind::Counter,
        "migration, kind",
        "events appended to the migration's log, by kind (the log line and the row are written together)",
    ),
    (
        BYPASSES,
        Kind::Counter,
        "migration, operation",
        "writes that bypassed the router, found by the change-stream watch",
    ),
    (
        HOOK_RUNS,
        Kind::Counter,
        "migration, hook, outcome",
        "hook commands run, by migration, hook and ok/failed (a failure is also a hook_failed event)",
    ),
    (
        ROUTER_OPERATIONS,
        Kind::Counter,
        "collection, op, path, outcome",
        "router operations by kind (get, insert, replace, update, delete, list), the path the phase gives them and ok/error",
    ),
    (
        ROUTER_OPERATION_SECONDS,
        Kind::Histogram,
        "collection, op",
        "router operation latency as the application sees it",
    ),
    (
        ROUTER_EPOCH,
        Kind::Gauge,
        "collection",
        "the migration epoch the router applies",
    ),
    (
        ROUTER_PHASE,
        Kind::Gauge,
        "collection, phase",
        "1 for the phase the router applies, 0 for the others it applied before",
    ),
    (
        BUILD_INFO,
        Kind::Gauge,
        "version",
        "1, labelled with the version of the reshard binary that serves these metrics",
    ),
    (
        MIGRATION_PHASE,
        Kind::Gauge,
        "migration, collection, phase",
        "exporter: 1 for the migration's phase, 0 for every other phase",
    ),
    (
        MIGRATION_EPOCH,
        Kind::Gauge,
        "migration, collection",
        "exporter: the migration's epoch (it grows by one at every phase change)",
    ),
    (
        MIGRATION_PAUSED,
        Kind::Gauge,
        "migration, collection",
        "exporter: 1 while the migration is paused",
    ),
    (
        MIGRATION_DOCUMENTS_LEFT,
        Kind::Gauge,
        "migration, collection, task",
        "exporter: documents the phase's task (backfill, verify, cleanup, revert) has left to scan, by the planner's estimate",
    ),
    (
        MIGRATION_RATE,
        Kind::Gauge,
        "migration, collection",
        "exporter: documents per second the migration's live workers report (0 with none)",
    ),
    (
        MIGRATION_ETA,
        Kind::Gauge,
        "migration, collection",
        "exporter: seconds the phase's task needs at that rate (absent while unknown: no rate or no estimate)",
    ),
    (
        MIGRATION_WORKERS,
        Kind::Gauge,
        "migration, collection",
        "exporter: workers holding a live lease on the migration",
    ),
    (
        MIGRATION_FINDINGS_OPEN,
        Kind::Gauge,
        "migration, collection",
        "exporter: reconciliation findings not yet repaired or resolved",
    ),
    (
        MIGRATION_BYPASSES_OPEN,
        Kind::Gauge,
        "migration, collection",
        "exporter: writes that bypassed the router and are not resolved",
    ),
    (
        MIGRATION_DEAD_LETTERS_OPEN,
        Kind::Gauge,
        "migration, collection",
        "exporter: dead letters not retried or skipped",
    ),
    (
        MIGRATION_SHADOW_MISMATCHES_OPEN,
        Kind::Gauge,
        "migration, collection",
        "exporter: shadow-read mismatches not resolved",
    ),
    (
        ROUTER_EPOCHS_BEHIND,
        Kind::Gauge,
        "migration, collection, router",
        "exporter: epochs between the migration's and the one the router acknowledged (its epoch + 1 if it never did); a router behind holds up the next phase change",
    ),
    (
        EXPORTER_REFRESHES,
        Kind::Counter,
        "outcome",
        "exporter: reads of the state store, ok or failed (a failed read keeps the last values until they age out)",
    ),
];

pub const DOCUMENTS_SCANNED: &str = "reshard_documents_scanned_total";
pub const DOCUMENTS_COPIED: &str = "reshard_documents_copied_total";
pub const DOCUMENTS_ALREADY_PRESENT: &str = "reshard_documents_already_present_total";
pub const DOCUMENTS_STAMPED: &str = "reshard_documents_stamped_total";
pub const DOCUMENTS_DEAD_LETTERED: &str = "reshard_documents_dead_lettered_total";
pub const DOCUMENTS_DELETED: &str = "reshard_documents_deleted_total";
pub const DOCUMENTS_VERIFIED: &str = "reshard_documents_verified_total";
pub const FINDINGS: &str = "reshard_findings_total";
pub const BATCHES: &str = "reshard_batches_total";
pub const BATCH_SECONDS: &str = "reshard_batch_seconds";
pub const PARTITIONS_CLAIMED: &str = "reshard_partitions_claimed_total";
pub const PARTITIONS_RECLAIMED: &str = "reshard_partitions_reclaimed_total";
pub const PARTITIONS_DONE: &str = "reshard_partitions_done_total";
pub const PARTITION_TIMEOUTS: &str = "reshard_partition_timeouts_total";
pub const PARTITIONS_STALLED: &str = "reshard_partitions_stalled_total";
pub const OVERLOADS: &str = "reshard_overloads_total";
pub const RATE_CUTS: &str = "reshard_rate_cuts_total";
pub const RATE_APPLIED: &str = "reshard_rate_applied_docs_per_second";
pub const EVENTS: &str = "reshard_events_total";
pub const BYPASSES: &str = "reshard_bypasses_total";
pub const HOOK_RUNS: &str = "reshard_hook_runs_total";
pub const ROUTER_OPERATIONS: &str = "reshard_router_operations_total";
pub const ROUTER_OPERATION_SECONDS: &str = "reshard_router_operation_seconds";
pub const ROUTER_EPOCH: &str = "reshard_router_epoch";
pub const ROUTER_PHASE: &str = "reshard_router_phase";
pub const BUILD_INFO: &str = "reshard_build_info";
pub const MIGRATION_PHASE: &str = "reshard_migration_phase";
pub const MIGRATION_EPOCH: &str = "reshard_migration_epoch";
pub const MIGRATION_PAUSED: &str = "reshard_migration_paused";
pub const MIGRATION_DOCUMENTS_LEFT: &str = "reshard_migration_documents_left";
pub const MIGRATION_RATE: &str = "reshard_migration_rate_docs_per_second";
pub const MIGRATION_ETA: &str = "reshard_migration_eta_seconds";
pub const MIGRATION_WORKERS: &str = "reshard_migration_workers_live";
pub const MIGRATION_FINDINGS_OPEN: &str = "reshard_migration_findings_open";
pub const MIGRATION_BYPASSES_OPEN: &str = "reshard_migration_bypasses_open";
pub const MIGRATION_DEAD_LETTERS_OPEN: &str = "reshard_migration_dead_letters_open";
pub const MIGRATION_SHADOW_MISMATCHES_OPEN: &str = "reshard_migration_shadow_mismatches_open";
pub const ROUTER_EPOCHS_BEHIND: &str = "reshard_router_epochs_behind";
pub const EXPORTER_REFRESHES: &str = "reshard_exporter_refreshes_total";

/// Histogram buckets, in seconds, for every `_seconds` metric.
pub const SECONDS_BUCKETS: &[f64] = &[
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];

/// Registers every metric's help text with the installed recorder.
pub fn describe() {
    for (name, kind, _, help) in METRICS {
        match kind {
            Kind::Counter => metrics::describe_counter!(*name, *help),
            Kind::Gauge => metrics::describe_gauge!(*name, *help),
            Kind::Histogram => {
                metrics::describe_histogram!(*name, metrics::Unit::Seconds, *help)
            }
        }
    }
}

/// `rendered` (a Prometheus text exposition) with a `# HELP` and a `# TYPE` line for every
/// metric it lacks. The exporter renders only the metrics recorded so far, so an idle worker's
/// scrape would list nothing; with these lines every scrape names every metric reshard has,
/// and a dashboard or an alert can tell "none yet" from "not exported".
pub fn with_every_family(rendered: &str) -> String {
    let mut out = rendered.to_owned();
    for (name, kind, _, help) in METRICS {
        let typed = format!("# TYPE {name} ");
        if rendered.lines().any(|l| l.starts_with(&typed)) {
            continue;
        }
        if !out.is_empty() && !out.ends_with('\n') {
            out.push('\n');
        }
        let kind = match kind {
            Kind::Counter => "counter",
            Kind::Gauge => "gauge",
            Kind::Histogram => "histogram",
        };
        out.push_str(&format!("# HELP {name} {help}\n# TYPE {name} {kind}\n"));
    }
    out
}

/// `reshard_build_info`: set once by every process that serves metrics.
pub fn build_info() {
    metrics::gauge!(BUILD_INFO, "version" => env!("CARGO_PKG_VERSION")).set(1.0);
}

/// One value the exporter read from the state store: a gauge, its labels, its value.
#[derive(Clone, Debug, PartialEq)]
pub struct Sample {
    pub name: &'static str,
    pub labels: Vec<(&'static str, String)>,
    pub value: f64,
}

/// Sets the gauge a sample names.
pub fn set(sample: &Sample) {
    let labels: Vec<metrics::Label> = sample
        .labels
        .iter()
        .map(|(k, v)| metrics::Label::new(*k, v.clone()))
        .collect();
    metrics::gauge!(sample.name, labels).set(sample.value);
}

/// The exporter read the state store (`ok`) or could not.
pub fn refreshed(ok: bool) {
    metrics::counter!(EXPORTER_REFRESHES, "outcome" => if ok { "ok" } else { "failed" })
        .increment(1);
}

/// One checkpointed batch's ledger.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Ledger {
    pub scanned: i64,
    pub inserted: i64,
    pub already_present: i64,
    pub stamped: i64,
    pub dead_lettered: i64,
    pub deleted: i64,
}

/// A batch was checkpointed: its ledger is now in the partition's row.
pub fn checkpointed(migration: i64, task: &'static str, shard: &str, l: &Ledger, took: Duration) {
    let m = migration.to_string();
    let labels = [
        ("migration", m.clone()),
        ("task", task.to_owned()),
        ("shard", shard.to_owned()),
    ];
    for (name, n) in [
        (DOCUMENTS_SCANNED, l.scanned),
        (DOCUMENTS_COPIED, l.inserted),
        (DOCUMENTS_ALREADY_PRESENT, l.already_present),
        (DOCUMENTS_STAMPED, l.stamped),
        (DOCUMENTS_DEAD_LETTERED, l.dead_lettered),
        (DOCUMENTS_DELETED, l.deleted),
    ] {
        metrics::counter!(name, &labels).increment(n.max(0) as u64);
    }
    let labels = [("migration", m), ("task", task.to_owned())];
    metrics::counter!(BATCHES, &labels).increment(1);
    metrics::histogram!(BATCH_SECONDS, &labels).record(took.as_secs_f64());
}

/// A full reconciliation checkpointed a batch.
pub fn verified(migration: i64, shard: &str, documents: u64, findings: u64) {
    let labels = [
        ("migration", migration.to_string()),
        ("shard", shard.to_owned()),
    ];
    metrics::counter!(DOCUMENTS_VERIFIED, &labels).increment(documents);
    metrics::counter!(FINDINGS, &labels).increment(findings);
}

/// A partition was leased; `again` when it had been leased before.
pub fn claimed(migration: i64, task: &'static str, again: bool) {
    let labels = [
        ("migration", migration.to_string()),
        ("task", task.to_owned()),
    ];
    metrics::counter!(PARTITIONS_CLAIMED, &labels).increment(1);
    if again {
        metrics::counter!(PARTITIONS_RECLAIMED, &labels).increment(1);
    }
}

pub fn partition_done(migration: i64, task: &'static str) {
    let labels = [
        ("migration", migration.to_string()),
        ("task", task.to_owned()),
    ];
    metrics::counter!(PARTITIONS_DONE, &labels).increment(1);
}

/// A command of a partition ran out of the time its lease left.
pub fn partition_timed_out(migration: i64, task: &'static str) {
    let labels = [
        ("migration", migration.to_string()),
        ("task", task.to_owned()),
    ];
    metrics::counter!(PARTITION_TIMEOUTS, &labels).increment(1);
}

/// A partition was found stalled (attempts in a row that recorded nothing).
pub fn partition_stalled(migration: i64, task: &'static str) {
    let labels = [
        ("migration", migration.to_string()),
        ("task", task.to_owned()),
    ];
    metrics::counter!(PARTITIONS_STALLED, &labels).increment(1);
}

pub fn overloads(migration: i64, task: &'static str, n: u64) {
    let labels = [
        ("migration", migration.to_string()),
        ("task", task.to_owned()),
    ];
    metrics::counter!(OVERLOADS, &labels).increment(n);
}

pub fn rate(migration: i64, task: &'static str, applied: f64, cut: bool) {
    let labels = [
        ("migration", migration.to_string()),
        ("task", task.to_owned()),
    ];
    metrics::gauge!(RATE_APPLIED, &labels).set(applied);
    if cut {
        metrics::counter!(RATE_CUTS, &labels).increment(1);
    }
}

/// An event was appended to a migration's log.
pub fn event(migration: i64, kind: &'static str) {
    metrics::counter!(EVENTS, "migration" => migration.to_string(), "kind" => kind).increment(1);
}

pub fn bypass(migration: i64, operation: &'static str) {
    metrics::counter!(BYPASSES, "migration" => migration.to_string(), "operation" => operation)
        .increment(1);
}

/// A hook's command ran (`outcome`: `ok` or `failed`). Hook names are a migration's own, so
/// the migration is a label too: the same name on two migrations is two hooks.
pub fn hook_run(migration: i64, hook: &str, outcome: &'static str) {
    metrics::counter!(
        HOOK_RUNS,
        "migration" => migration.to_string(),
        "hook" => hook.to_owned(),
        "outcome" => outcome,
    )
    .increment(1);
}

/// The path a phase gives an operation: where it reads (`get`, `list`) or writes.
pub fn path_of(op: &str, phase: crate::phase::Phase) -> &'static str {
    use crate::phase::{ReadPath, WritePath};
    if matches!(op, "get" | "list" | "list_tenant" | "query" | "query_more") {
        match phase.read_path() {
            ReadPath::Source => "source",
            ReadPath::TargetThenSource => "target_then_source",
            ReadPath::Target => "target",
        }
    } else {
        match phase.write_path() {
            WritePath::Source => "source",
            WritePath::Held => "held",
            WritePath::Target => "target",
            WritePath::TargetMirroredToSource => "target_mirrored_to_source",
        }
    }
}

/// A router operation ended.
pub fn router_operation(
    collection: &str,
    op: &'static str,
    path: &'static str,
    ok: bool,
    took: Duration,
) {
    metrics::counter!(
        ROUTER_OPERATIONS,
        "collection" => collection.to_owned(),
        "op" => op,
        "path" => path,
        "outcome" => if ok { "ok" } else { "error" },
    )
    .increment(1);
    metrics::histogram!(
        ROUTER_OPERATION_SECONDS,
        "collection" => collection.to_owned(),
        "op" => op,
    )
    .record(took.as_secs_f64());
}

/// The router applies a new epoch and phase (`previous`: the phase it applied before).
pub fn router_applies(
    collection: &str,
    epoch: i64,
    phase: &'static str,
    previous: Option<&'static str>,
) {
    metrics::gauge!(ROUTER_EPOCH, "collection" => collection.to_owned()).set(epoch as f64);
    if let Some(before) = previous.filter(|p| *p != phase) {
        metrics::gauge!(ROUTER_PHASE, "collection" => collection.to_owned(), "phase" => before)
            .set(0.0);
    }
    metrics::gauge!(ROUTER_PHASE, "collection" => collection.to_owned(), "phase" => phase).set(1.0);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_name_where_the_phase_sends_reads_and_writes() {
        use crate::phase::Phase;
        assert_eq!(path_of("get", Phase::Backfill), "target_then_source");
        assert_eq!(path_of("update", Phase::Backfill), "target");
        assert_eq!(path_of("insert", Phase::WriteSwitch), "held");
        assert_eq!(path_of("list", Phase::Cleanup), "target");
        assert_eq!(
            path_of("delete", Phase::Reverting),
            "target_mirrored_to_source"
        );
        assert_eq!(path_of("get", Phase::Planned), "source");
    }

    #[test]
    fn every_metric_is_named_in_a_scrape_before_it_is_recorded() {
        let idle = with_every_family("");
        for (name, _, _, help) in METRICS {
            assert!(idle.contains(&format!("# HELP {name} {help}\n")), "{name}");
            assert!(idle.contains(&format!("# TYPE {name} ")), "{name}");
        }
        assert!(idle.contains("# TYPE reshard_batch_seconds histogram\n"));
        // A recorded metric keeps its own lines and is not named twice.
        let recorded =
            "# TYPE reshard_batches_total counter\nreshard_batches_total{task=\"backfill\"} 3\n";
        let scrape = with_every_family(recorded);
        assert!(scrape.starts_with(recorded));
        assert_eq!(scrape.matches("# TYPE reshard_batches_total ").count(), 1);
    }

    #[test]
    fn names_follow_prometheus_conventions_and_are_listed_once() {
        let mut seen = std::collections::BTreeSet::new();
        for (name, kind, labels, help) in METRICS {
            assert!(seen.insert(*name), "{name} is listed twice");
            assert!(name.starts_with("reshard_"), "{name}");
            assert!(
                name.chars().all(|c| c.is_ascii_lowercase() || c == '_'),
                "{name}"
            );
            match kind {
                Kind::Counter => assert!(name.ends_with("_total"), "{name}"),
                Kind::Histogram => assert!(name.ends_with("_seconds"), "{name}"),
                Kind::Gauge => assert!(!name.ends_with("_total"), "{name}"),
            }
            assert!(!labels.is_empty() && !help.is_empty(), "{name}");
        }
    }
}

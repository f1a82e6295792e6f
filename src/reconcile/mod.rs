//! Reconciliation: evidence that the target holds everything the source held (the project's design document
//! "Reconciliation"), and repair of what it finds.
//!
//! A run checks, per source location in the backfill's scope:
//! - completeness: a fresh count of each backfill partition equals its ledger (skipped where
//!   the source collection is also a target location and still receives writes; the presence
//!   checks carry completeness there);
//! - presence and content of sampled (or, with `full`, all) source documents: a moved
//!   document exists at the location the target version computes, as a document or a
//!   tombstone; a pristine copy (`_reshard.src = "copy"`) equals its source apart from the
//!   routing fields and `_reshard`; an application-written one is counted as superseded;
//!   a document that stays has the target's routing field;
//! - placement: sampled target documents sit where the target version puts them.
//!
//! Samples are stratified (by source shard, tenant, or target bucket) so a small hot tenant is
//! not missed: with k clean samples in a stratum its defect rate is below 3/k at 95%
//! confidence (the rule of three). Findings are checked again after a short delay and only
//! the ones that persist are reported, so a write in flight is not a false alarm.
//!
//! This file holds a run's options, scene and outcomes, [`run`] and [`verdict`]; `judge` what
//! each document means, `sample` the sampled checks and the re-check, `full` a full run's
//! reads, `verify` its leased verification, `repair` what a run found.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::time::{Duration, Instant};

use mongodb::bson::{doc, Bson, Document};
use serde::Serialize;
use serde_json::json;

pub use crate::envelope::content_differences;
use crate::ids;
use crate::routing::{Location, MoveScope, RoutingVersion};
use crate::scope::location_scope;
use crate::settings::MigrationSettings;
pub use crate::shards::read::ReadError;
use crate::shards::Shards;
use crate::store::partitions::Partition;
use crate::store::reconcile::{FindingKind, NewFinding};
use crate::throttle::AdaptiveRate;
use crate::worker::plan;

mod full;
mod judge;
mod repair;
mod sample;
mod verify;

pub use full::*;
pub use judge::*;
pub use repair::*;
pub use sample::*;
pub use verify::*;

/// How samples are grouped.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Stratify {
    /// Per source location.
    Shard,
    /// Per tenant (the largest `max_strata` tenants each; the rest together).
    Tenant,
    /// Per target sub-bucket.
    Bucket,
}

/// How a run samples and checks.
#[derive(Clone, Debug, Serialize)]
pub struct ReconcileOptions {
    /// Samples per stratum.
    pub sample: usize,
    /// Check every source document instead of samples.
    pub full: bool,
    pub stratify: Stratify,
    /// How long to wait before checking findings again.
    #[serde(with = "millis")]
    pub recheck_delay: Duration,
    /// At most this many tenant strata per location.
    pub max_strata: usize,
    /// Skip the presence, content and placement checks (a leased full run did them
    /// partition by partition, placement in its merge with the targets); counts still run.
    #[serde(skip)]
    pub presence_done: bool,
    /// How many source documents a leased full run read, by backfill partition (with
    /// `presence_done`): the completeness check compares those with the ledger instead of
    /// counting again, and a partition the run counted nothing in held nothing.
    #[serde(skip)]
    pub counted: BTreeMap<i64, i64>,
}

/// A partition's location and `_id` range, as a key that a backfill partition and a verify
/// partition planned by an earlier version of reshard (one per backfill partition) share.
pub type RangeKey = (
    String,
    String,
    Option<Vec<u8>>,
    Option<Vec<u8>>,
    Option<String>,
);

pub fn range_key(p: &Partition) -> RangeKey {
    (
        p.location().to_string(),
        p.id_type.clone(),
        p.lower_bound.clone(),
        p.upper_bound.clone(),
        p.tenant_filter.as_ref().map(|t| t.to_string()),
    )
}

/// The key under which a verify partition planned by an earlier version of reshard counted the
/// source documents it read (its backfill partition's range, [`range_key`]).
pub const SOURCE_READ: &str = "source_documents_read";

mod millis {
    pub fn serialize<S: serde::Serializer>(
        d: &std::time::Duration,
        s: S,
    ) -> Result<S::Ok, S::Error> {
        s.serialize_u64(d.as_millis() as u64)
    }
}

impl Default for ReconcileOptions {
    fn default() -> Self {
        ReconcileOptions {
            sample: 100,
            full: false,
            stratify: Stratify::Shard,
            recheck_delay: Duration::from_secs(2),
            max_strata: 1_000,
            presence_done: false,
            counted: BTreeMap::new(),
        }
    }
}

/// What the shards are and which versions apply.
pub struct Scene {
    pub from: RoutingVersion,
    pub to: RoutingVersion,
    pub shards: Shards,
    /// [`ids::key`]s of the `_id`s of dead letters an operator skipped: known to be absent.
    pub skipped: HashSet<Vec<u8>>,
}

/// How one source document checked out.
#[derive(Clone, Debug, PartialEq)]
pub enum Outcome {
    /// Its pristine copy is in place and equal.
    Copied,
    /// The application rewrote it in the target.
    Superseded,
    /// It was deleted (a tombstone stands in the target).
    Deleted,
    /// It never moves, and carries the target's routing field.
    Stayed,
    /// Not a source document here (a tombstone, a target document in a shared collection),
    /// or a skipped dead letter.
    Ignored,
    /// A target document (written by reshard) sits where the target version puts it.
    Placed,
    /// Something is wrong.
    Finding {
        kind: FindingKind,
        details: serde_json::Value,
    },
}

/// The result of a run before it is stored.
#[derive(Clone, Debug, Default)]
pub struct RunResult {
    pub findings: Vec<NewFinding>,
    pub strata: Vec<Stratum>,
    pub counts: BTreeMap<String, u64>,
    pub counts_checked: Vec<serde_json::Value>,
    pub rechecked_away: u64,
}

/// Runs the checks (without storing anything).
pub async fn run(
    scene: &Scene,
    partitions: &[Partition],
    settings: &MigrationSettings,
    options: &ReconcileOptions,
) -> Result<RunResult, ReadError> {
    let mut result = RunResult::default();
    let targets: BTreeSet<Location> = scene.to.locations().into_iter().collect();
    let mut strata: BTreeMap<String, Stratum> = BTreeMap::new();

    // Completeness: fresh counts against the ledger.
    for p in partitions {
        let location = p.location();
        if targets.contains(&location) {
            result.counts_checked.push(json!({
                "partition": p.id, "location": location.to_string(),
                "skipped": "the source collection is also a target location",
            }));
            continue;
        }
        let filter =
            plan::partition_filter(&scene.from, p, false).map_err(|e| ReadError::Mongo {
                location: location.clone(),
                source: mongodb::error::Error::custom(e),
            })?;
        let count = match options.counted.get(&p.id) {
            Some(read) => *read,
            None if options.presence_done => 0,
            None => scene.shards.count(&location, filter).await? as i64,
        };
        let ledger = p.scanned + p.skipped_foreign;
        result.counts_checked.push(json!({
            "partition": p.id, "location": location.to_string(), "count": count, "ledger": ledger,
        }));
        if count != ledger {
            result.findings.push(NewFinding {
                kind: FindingKind::Count,
                doc_id: None,
                doc_id_text: None,
                stratum: Some(format!("partition:{}", p.id)),
                details: json!({
                    "partition": p.id, "location": location.to_string(),
                    "count": count, "ledger": ledger,
                }),
            });
        }
    }

    // Presence and content: every source document of every location through one merged
    // read (full), or samples per location.
    let mut rate = AdaptiveRate::new(settings.throttle_share(1), Instant::now());
    let mut scoped: BTreeMap<Location, SourceScope> = BTreeMap::new();
    for location in scene.from.locations() {
        let tenants = match location_scope(&scene.from, &scene.to, &location) {
            MoveScope::Nothing => continue,
            MoveScope::Everything { .. } => None,
            MoveScope::Tenants(t) => Some(t),
        };
        scoped.insert(
            location,
            SourceScope {
                tenants,
                partitions: Vec::new(),
            },
        );
    }
    if options.presence_done {
        // A leased full run checked presence, content and placement partition by partition.
    } else if options.full {
        let batch_size = settings.batch_size;
        let mut read =
            FullRead::open(scene, scoped, &ids::IdRange::everything(), None, batch_size).await?;
        loop {
            let mut batch = read.next_batch(scene, batch_size).await?;
            let wait = rate.permit(batch.source_documents, Instant::now());
            tokio::time::sleep(wait).await;
            tally_full(&mut batch, &mut result, &mut strata);
            if batch.done {
                break;
            }
        }
    } else {
        for (location, scope) in scoped {
            let filter = match &scope.tenants {
                Some(t) => crate::scope::tenant_filter(&scene.from.tenant_key, t),
                None => Document::new(),
            };
            for (name, docs) in sample_location(scene, &location, &filter, options).await? {
                let mut stratum = strata.remove(&name).unwrap_or(Stratum {
                    name: name.clone(),
                    ..Stratum::default()
                });
                let checked = check_batch(scene, &location, &docs).await?;
                tally(&mut result, &mut stratum, checked, &location);
                strata.insert(name, stratum);
            }
        }
    }

    // Placement: sampled target documents written by reshard sit where the target puts them
    // (a full run checked every one in its merge).
    let sampled_placement = if options.presence_done || options.full {
        BTreeSet::new()
    } else {
        targets.clone()
    };
    for target in &sampled_placement {
        let name = format!("placement:{target}");
        let mut stratum = Stratum {
            name: name.clone(),
            ..Stratum::default()
        };
        let docs = sample_written(&scene.shards, options.sample.max(1), target).await?;
        for d in docs {
            let id = d.get("_id").cloned().unwrap_or(Bson::Null);
            let Some(outcome) = judge_placement(scene, target, &d) else {
                continue;
            };
            stratum.samples += 1;
            if let Outcome::Finding { kind, details } = outcome {
                stratum.defects += 1;
                *result.counts.entry("misplaced".to_owned()).or_default() += 1;
                result.findings.push(finding(kind, &id, &name, details));
            }
        }
        strata.insert(name, stratum);
    }
    // One document found wrong twice (by the presence check and by a placement sample) is
    // one defect.
    let mut seen = HashSet::new();
    result.findings.retain(|f| match &f.doc_id {
        Some(id) => seen.insert((f.kind, id.clone())),
        None => true,
    });
    result.strata = strata
        .into_values()
        .map(|mut s| {
            s.bound = if s.defects == 0 {
                defect_bound(s.samples)
            } else {
                None
            };
            s
        })
        .collect();
    Ok(result)
}

/// Whether a run's findings are within the migration's thresholds. A count mismatch and a
/// document that cannot be routed never pass.
pub fn verdict(
    findings: &[NewFinding],
    settings: &MigrationSettings,
) -> (bool, BTreeMap<String, u64>) {
    let mut by_kind: BTreeMap<String, u64> = BTreeMap::new();
    for f in findings {
        *by_kind.entry(f.kind.to_string()).or_default() += 1;
    }
    let n = |k: FindingKind| by_kind.get(k.as_str()).copied().unwrap_or(0);
    let passed = n(FindingKind::Count) == 0
        && n(FindingKind::Unroutable) == 0
        && n(FindingKind::Missing) <= settings.max_missing
        && n(FindingKind::Mismatched) <= settings.max_mismatched
        && n(FindingKind::Misplaced) <= settings.max_misplaced;
    (passed, by_kind)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn version(field: Option<&str>) -> RoutingVersion {
        crate::routing::one_shard_version(field)
    }

    #[test]
    fn copies_differ_only_outside_routing_fields_and_metadata() {
        let (from, to) = (version(Some("slot")), version(Some("bucket")));
        let source = doc! { "_id": 1, "customerId": "c", "total": 5, "slot": 0 };
        let copy = doc! { "_id": 1, "customerId": "c", "bucket": 3, "total": 5, "_reshard": { "src": "copy" } };
        assert!(content_differences(&source, &copy, &from, &to).is_empty());
        let changed = doc! { "_id": 1, "customerId": "c", "total": 6, "note": "x" };
        assert_eq!(
            content_differences(&source, &changed, &from, &to),
            vec!["note".to_owned(), "total".to_owned()]
        );
    }

    #[test]
    fn the_rule_of_three() {
        assert_eq!(defect_bound(0), None);
        assert_eq!(defect_bound(300), Some(0.01));
        assert_eq!(defect_bound(1), Some(1.0));
    }

    #[test]
    fn the_verdict_follows_the_thresholds() {
        let f = |kind: &str| NewFinding {
            kind: match kind {
                "missing" => FindingKind::Missing,
                "misplaced" => FindingKind::Misplaced,
                _ => FindingKind::Count,
            },
            doc_id: None,
            doc_id_text: None,
            stratum: None,
            details: json!({}),
        };
        let mut s = MigrationSettings::default();
        assert!(verdict(&[], &s).0);
        assert!(!verdict(&[f("missing")], &s).0);
        s.max_missing = 1;
        assert!(verdict(&[f("missing")], &s).0);
        assert!(!verdict(&[f("missing"), f("missing")], &s).0);
        s.max_misplaced = 5;
        assert!(
            !verdict(&[f("count")], &s).0,
            "a count mismatch never passes"
        );
    }

    /// A backfill partition of `location` over `[lower, upper)` (string ids) that read `read`.
    fn backfill(
        id: i64,
        location: &str,
        lower: Option<&str>,
        upper: Option<&str>,
        read: i64,
    ) -> Partition {
        let (shard, collection) = location.split_once('/').unwrap();
        let bound = |b: Option<&str>| b.map(|b| ids::encode(&Bson::String(b.to_owned())));
        Partition {
            id,
            migration_id: 1,
            task: crate::store::partitions::Task::Backfill,
            source_shard: shard.to_owned(),
            source_collection: collection.to_owned(),
            id_type: ids::ANY_TYPE.to_owned(),
            lower_bound: bound(lower),
            upper_bound: bound(upper),
            tenant_filter: None,
            state: crate::store::partitions::PartitionState::Done,
            lease_token: None,
            lease_owner: None,
            lease_expires_at: None,
            last_id: None,
            scanned: read,
            inserted: read,
            already_present: 0,
            stamped: 0,
            dead_lettered: 0,
            skipped_foreign: 0,
            deleted: 0,
            kept: 0,
            run_id: None,
            outcomes: json!({}),
            approx_documents: None,
            attempts: 1,
            batch_limit: None,
            timeouts: 0,
            stalls: 0,
            last_failure: None,
            created_at: chrono::Utc::now(),
            started_at: None,
            finished_at: None,
            taken_over_from: None,
        }
    }

    #[test]
    fn verify_ranges_read_every_location_over_the_ranges_of_the_most_divided_one() {
        let plan = [
            backfill(1, "s1/orders", None, None, 300),
            backfill(2, "s2/orders", None, Some("m"), 200),
            backfill(3, "s2/orders", Some("m"), Some("t"), 100),
            backfill(4, "s2/orders", Some("t"), None, 100),
            backfill(5, "s3/orders", None, Some("g"), 50),
            backfill(6, "s3/orders", Some("g"), None, 50),
        ];
        let ranges = verify_ranges(&plan);
        let bounds: Vec<(Option<Bson>, Option<Bson>)> = ranges
            .iter()
            .map(|p| {
                let d = |b: &Option<Vec<u8>>| b.as_deref().map(|b| ids::decode(b).unwrap());
                (d(&p.lower_bound), d(&p.upper_bound))
            })
            .collect();
        let s = |t: &str| Some(Bson::String(t.to_owned()));
        assert_eq!(
            bounds,
            vec![(None, s("m")), (s("m"), s("t")), (s("t"), None)],
            "s2's ranges, in order, cover every _id"
        );
        for p in &ranges {
            assert_eq!(p.source_shard, crate::store::partitions::EVERY_LOCATION);
            assert_eq!(
                p.source_collection,
                crate::store::partitions::EVERY_LOCATION
            );
            assert_eq!(p.id_type, ids::ANY_TYPE);
            assert_eq!(p.tenant_filter, None);
        }
        // Sized at each range's share of everything read (800), by s2's shares (2:1:1).
        let sizes: Vec<i64> = ranges.iter().map(|p| p.approx_documents.unwrap()).collect();
        assert_eq!(sizes, vec![400, 200, 200]);

        // One partition per location: one range, everything.
        let one = verify_ranges(&[
            backfill(1, "s1/orders", None, None, 10),
            backfill(2, "s2/orders", None, None, 20),
        ]);
        assert_eq!(one.len(), 1);
        assert_eq!((&one[0].lower_bound, &one[0].upper_bound), (&None, &None));
        assert_eq!(one[0].approx_documents, Some(30));
        assert!(verify_ranges(&[]).is_empty());
    }

    #[test]
    fn full_sources_keep_each_location_s_partitions_and_refuse_mixed_tenants() {
        let plan = [
            backfill(7, "s1/orders", None, Some("m"), 1),
            backfill(8, "s1/orders", Some("m"), None, 1),
            backfill(9, "s2/orders", None, None, 1),
        ];
        let sources = full_sources(&plan).unwrap();
        assert_eq!(sources.len(), 2);
        let s1 = &sources[&Location::new("s1", "orders")];
        assert_eq!(s1.tenants, None);
        let holder = |id: &str| {
            s1.partitions
                .iter()
                .find(|(r, _)| r.contains(&Bson::String(id.to_owned())))
                .map(|(_, p)| *p)
        };
        assert_eq!(
            (holder("a"), holder("m"), holder("z")),
            (Some(7), Some(8), Some(8))
        );

        let mut scoped = backfill(10, "s1/orders", None, Some("m"), 1);
        scoped.tenant_filter = Some(json!([{"type": "string", "value": "cust-1"}]));
        let mixed = [scoped, backfill(11, "s1/orders", Some("m"), None, 1)];
        let err = full_sources(&mixed).unwrap_err();
        assert!(
            err.contains("s1/orders") && err.contains("different tenants"),
            "{err}"
        );
    }
}

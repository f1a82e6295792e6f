//! Sample mode: stratified samples per source location, the rule of three
//! ([`defect_bound`]), documents written during the run, and the re-check of findings after
//! a delay so that a write in flight is not a false alarm.

use std::collections::BTreeMap;

use mongodb::bson::{doc, Bson, Document};
use serde::Serialize;

use crate::envelope::{self};
use crate::ids;
use crate::routing::Location;
use crate::store::partitions::Partition;
use crate::store::reconcile::{FindingKind, NewFinding};
use crate::worker::plan;

use super::*;

pub(super) async fn find_by_ids(
    scene: &Scene,
    at: &Location,
    wanted: &[Bson],
) -> Result<std::collections::HashMap<Vec<u8>, Document>, ReadError> {
    scene.shards.find_by_ids(at, wanted, None).await
}

/// Per-stratum tally.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Stratum {
    pub name: String,
    pub samples: u64,
    pub defects: u64,
    /// Upper bound of the defect rate at 95% confidence when `defects` is 0 (3/k).
    pub bound: Option<f64>,
}

/// The rule of three: with `k` clean samples, the defect rate is below 3/k at 95% confidence.
pub fn defect_bound(k: u64) -> Option<f64> {
    (k > 0).then(|| (3.0 / k as f64).min(1.0))
}

/// Samples of one location, grouped by stratum name.
pub(super) async fn sample_location(
    scene: &Scene,
    location: &Location,
    filter: &Document,
    options: &ReconcileOptions,
) -> Result<Vec<(String, Vec<Document>)>, ReadError> {
    let sample = |filter: Document, size: usize| async move {
        let mut pipeline = Vec::new();
        if !filter.is_empty() {
            pipeline.push(doc! { "$match": filter });
        }
        pipeline.push(doc! { "$sample": { "size": size as i64 } });
        scene.shards.aggregate(location, pipeline).await
    };
    let k = options.sample.max(1);
    // Where the source collection is also a target location, copies that moved in are not
    // source documents: do not spend samples on them.
    let mut filter = filter.clone();
    if scene.to.locations().contains(location) {
        filter.insert(format!("{}.src", envelope::META), doc! { "$ne": "copy" });
    }
    let filter = &filter;
    match options.stratify {
        Stratify::Shard => Ok(vec![(
            format!("shard:{location}"),
            sample(filter.clone(), k).await?,
        )]),
        Stratify::Tenant => {
            let key = &scene.from.tenant_key;
            let mut pipeline = Vec::new();
            if !filter.is_empty() {
                pipeline.push(doc! { "$match": filter.clone() });
            }
            pipeline.push(doc! { "$sortByCount": format!("${key}") });
            let groups: Vec<Document> = scene.shards.aggregate(location, pipeline).await?;
            let mut out = Vec::new();
            let mut named = Vec::new();
            for g in groups.iter().take(options.max_strata) {
                let tenant = g.get("_id").cloned().unwrap_or(Bson::Null);
                let mut f = filter.clone();
                f.insert(key.clone(), tenant.clone());
                let docs = sample(f, k).await?;
                out.push((format!("tenant:{}", ids::text(&tenant)), docs));
                named.push(tenant);
            }
            if groups.len() > options.max_strata {
                let mut f = filter.clone();
                f.insert(key.clone(), doc! { "$nin": named });
                let docs = sample(f, k).await?;
                out.push(("tenant:(others)".to_owned(), docs));
            }
            Ok(out)
        }
        Stratify::Bucket => {
            let docs = sample(filter.clone(), (k * 16).min(50_000)).await?;
            let mut bins: BTreeMap<u32, Vec<Document>> = BTreeMap::new();
            for d in docs {
                let Some((t, i)) = keys_of(&scene.from, &d) else {
                    continue;
                };
                let Ok(l) = scene.to.locate(&t, &i) else {
                    continue;
                };
                let bin = bins.entry(l.sub_bucket).or_default();
                if bin.len() < k {
                    bin.push(d);
                }
            }
            Ok(bins
                .into_iter()
                .map(|(b, docs)| (format!("bucket:{b}"), docs))
                .collect())
        }
    }
}

/// A uniform sample of `k` documents reshard wrote at a target location. `$sample` first:
/// only a first stage is served by a random cursor (a `$match` before it reads the whole
/// collection on MongoDB). A target collection holds little else, so that is the sample; only
/// where it holds too few of reshard's documents (a collection both layouts share) is the
/// sample drawn among them exactly, which reads the collection.
pub(super) async fn sample_written(
    shards: &Shards,
    k: usize,
    target: &Location,
) -> Result<Vec<Document>, ReadError> {
    let run = |pipeline: Vec<Document>| shards.aggregate(target, pipeline);
    let sampled = run(vec![doc! { "$sample": { "size": k as i64 } }]).await?;
    let drawn = sampled.len();
    let written: Vec<Document> = sampled
        .into_iter()
        .filter(|d| d.contains_key(envelope::META))
        .collect();
    if written.len() == k || drawn < k {
        // Enough, or the sample was the whole collection.
        return Ok(written);
    }
    run(vec![
        doc! { "$match": envelope::written_by_reshard() },
        doc! { "$sample": { "size": k as i64 } },
    ])
    .await
}

/// Checks the findings again (after the caller waited) and keeps those that persist.
pub async fn recheck(
    scene: &Scene,
    partitions: &[Partition],
    findings: Vec<NewFinding>,
) -> Result<(Vec<NewFinding>, u64), ReadError> {
    let mut kept = Vec::new();
    let mut gone = 0;
    for f in findings {
        let still = match (f.kind, &f.doc_id) {
            (FindingKind::Count, _) => {
                let id = f.details["partition"].as_i64();
                match partitions.iter().find(|p| Some(p.id) == id) {
                    Some(p) => count_differs(scene, p).await?,
                    None => true,
                }
            }
            (_, Some(raw)) => {
                let id = ids::decode(raw).unwrap_or(Bson::Null);
                match f.details["source"].as_str().and_then(parse_location) {
                    Some(source) => match scene.shards.find_by_id(&source, &id).await? {
                        Some(d) => matches!(
                            check_batch(scene, &source, &[d]).await?.first(),
                            Some((_, Outcome::Finding { kind, .. })) if *kind == f.kind
                        ),
                        None => false,
                    },
                    // A placement finding: is the document still where it should not be?
                    None => match f.details["found"].as_str().and_then(parse_location) {
                        Some(at) => !find_by_ids(scene, &at, std::slice::from_ref(&id))
                            .await?
                            .is_empty(),
                        None => true,
                    },
                }
            }
            _ => true,
        };
        if still {
            kept.push(f);
        } else {
            gone += 1;
        }
    }
    Ok((kept, gone))
}

/// Whether a fresh count of a partition's range differs from its ledger.
pub(super) async fn count_differs(scene: &Scene, p: &Partition) -> Result<bool, ReadError> {
    let location = p.location();
    let filter = plan::partition_filter(&scene.from, p, false).map_err(|e| ReadError::Mongo {
        location: location.clone(),
        source: mongodb::error::Error::custom(e),
    })?;
    let count = scene.shards.count(&location, filter).await? as i64;
    Ok(count != p.scanned + p.skipped_foreign)
}

pub(super) fn parse_location(text: &str) -> Option<Location> {
    let (shard, collection) = text.split_once('/')?;
    Some(Location::new(shard, collection))
}

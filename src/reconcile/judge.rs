//! The judgements: what a source document, a target document or an absence means for the
//! run (an [`Outcome`]), a batch checked at once ([`check_batch`]), and the tallies and
//! findings made of outcomes.

use std::collections::BTreeMap;

use mongodb::bson::{Bson, Document};
use serde_json::json;

use crate::disposition::{self, Disposition};
use crate::envelope::{self, is_tombstone, Writer};
use crate::ids;
use crate::protocol::Side;
use crate::routing::{KeyValue, Location, RoutingVersion};
use crate::store::reconcile::{FindingKind, NewFinding};

use super::*;

pub(super) fn keys_of(version: &RoutingVersion, doc: &Document) -> Option<(KeyValue, KeyValue)> {
    version.document_keys(doc).ok()
}

/// What a source document read at `location` is, before the target is consulted
/// ([`disposition::of`]): settled (a tombstone or a document of the other layout is ignored,
/// as is a skipped dead letter; a document that cannot be routed is a finding; one that stays
/// must carry its routing field), or a document that moved and must be looked for at its
/// target (`Err(target)`).
pub(super) fn judge_source(
    scene: &Scene,
    location: &Location,
    doc: &Document,
) -> (Bson, Result<Outcome, Location>) {
    let id = doc.get("_id").cloned().unwrap_or(Bson::Null);
    if !scene.skipped.is_empty() && scene.skipped.contains(&ids::key(&id)) {
        return (id, Ok(Outcome::Ignored));
    }
    let judged = match disposition::of(Side::Source, &scene.from, &scene.to, location, doc) {
        Disposition::Tombstone { .. } | Disposition::Foreign | Disposition::Placed { .. } => {
            Ok(Outcome::Ignored)
        }
        Disposition::Unroutable { reason } => Ok(Outcome::Finding {
            kind: FindingKind::Unroutable,
            details: json!({ "location": location.to_string(), "reason": reason }),
        }),
        Disposition::Stays {
            stamp: Some((field, _)),
        } => Ok(Outcome::Finding {
            kind: FindingKind::Mismatched,
            details: json!({
                "location": location.to_string(),
                "reason": format!("the routing field {field:?} is not stamped"),
            }),
        }),
        Disposition::Stays { stamp: None } => Ok(Outcome::Stayed),
        Disposition::Moves { target, .. } => Err(target),
    };
    (id, judged)
}

/// What a moved document's image at its target `goal` says (`found`: its envelope at least):
/// a tombstone (deleted), the application's write (superseded), or a copy that must equal the
/// source (`differences`: the fields in which it does not, [`content_differences`]).
pub(super) fn judge_found(
    found: &Document,
    goal: &Location,
    differences: impl FnOnce() -> Vec<String>,
) -> Outcome {
    if is_tombstone(found) {
        return Outcome::Deleted;
    }
    match envelope::writer(found) {
        Some(Writer::App) => Outcome::Superseded,
        _ => {
            let diff = differences();
            if diff.is_empty() {
                Outcome::Copied
            } else {
                Outcome::Finding {
                    kind: FindingKind::Mismatched,
                    details: json!({ "location": goal.to_string(), "fields": diff }),
                }
            }
        }
    }
}

/// Whether a document found at target location `target` sits where the target version puts
/// it ([`Outcome::Placed`] or a misplaced finding); `None` for a document that cannot say
/// (unroutable keys). In a collection both layouts share, a source document (written
/// through the source path before the switch, so it carries `_reshard` too) stays until
/// cleanup.
pub(super) fn judge_placement(scene: &Scene, target: &Location, d: &Document) -> Option<Outcome> {
    let (t, i) = keys_of(&scene.to, d)?;
    let l = scene.to.locate(&t, &i).ok()?;
    let source_here = keys_of(&scene.from, d)
        .and_then(|(t, i)| scene.from.locate(&t, &i).ok())
        .is_some_and(|s| s.locations.contains(target));
    Some(if l.locations.contains(target) || source_here {
        Outcome::Placed
    } else {
        Outcome::Finding {
            kind: FindingKind::Misplaced,
            details: json!({ "found": target.to_string(), "expected": l.locations[0].to_string() }),
        }
    })
}

/// A moved document absent from its target `goal`: misplaced when another target location
/// (`elsewhere`) holds it, else missing.
pub(super) fn judge_absent(
    goal: &Location,
    elsewhere: Option<Location>,
    source: &Location,
) -> Outcome {
    match elsewhere {
        Some(at) => Outcome::Finding {
            kind: FindingKind::Misplaced,
            details: json!({ "expected": goal.to_string(), "found": at.to_string() }),
        },
        None => Outcome::Finding {
            kind: FindingKind::Missing,
            details: json!({ "expected": goal.to_string(), "source": source.to_string() }),
        },
    }
}

/// Checks source documents read at `location` against the target, by their disposition
/// ([`judge_source`]): a document that moved must be at its target, as a copy equal to it,
/// the application's write, or a tombstone. One `$in` query per target location, and one
/// more per other target location for the ids not found where they belong: the lookups of a
/// sample, scattered over the collection.
pub async fn check_batch(
    scene: &Scene,
    location: &Location,
    docs: &[Document],
) -> Result<Vec<(Bson, Outcome)>, ReadError> {
    let mut out: Vec<(Bson, Outcome)> = Vec::with_capacity(docs.len());
    let mut moved: BTreeMap<Location, Vec<usize>> = BTreeMap::new();
    for doc in docs {
        let (id, judged) = judge_source(scene, location, doc);
        let outcome = match judged {
            Ok(outcome) => outcome,
            Err(target) => {
                moved.entry(target).or_default().push(out.len());
                Outcome::Ignored
            }
        };
        out.push((id, outcome));
    }
    let all_targets = scene.to.locations();
    for (goal, indexes) in moved {
        let wanted: Vec<Bson> = indexes.iter().map(|&i| out[i].0.clone()).collect();
        let found = find_by_ids(scene, &goal, &wanted).await?;
        let mut absent: Vec<usize> = Vec::new();
        for &i in &indexes {
            match found.get(&ids::key(&out[i].0)) {
                None => absent.push(i),
                Some(t) => {
                    out[i].1 = judge_found(t, &goal, || {
                        content_differences(&docs[i], t, &scene.from, &scene.to)
                    })
                }
            }
        }
        for i in absent {
            let id = out[i].0.clone();
            let mut elsewhere = None;
            for other in all_targets.iter().filter(|l| **l != goal) {
                if other == location {
                    continue;
                }
                if !find_by_ids(scene, other, std::slice::from_ref(&id))
                    .await?
                    .is_empty()
                {
                    elsewhere = Some(other.clone());
                    break;
                }
            }
            out[i].1 = judge_absent(&goal, elsewhere, location);
        }
    }
    Ok(out)
}

/// Tallies a full run's placement checks into `strata` (`placement:<target>`, created as
/// needed) and `result`.
pub fn tally_placement(
    placement: Vec<(Location, Bson, Outcome)>,
    result: &mut RunResult,
    strata: &mut BTreeMap<String, Stratum>,
) {
    for (target, id, outcome) in placement {
        let name = format!("placement:{target}");
        let stratum = strata.entry(name.clone()).or_insert_with(|| Stratum {
            name,
            ..Stratum::default()
        });
        *result
            .counts
            .entry(outcome_name(&outcome).to_owned())
            .or_default() += 1;
        stratum.samples += 1;
        // Placement findings name where the document was found, not a source: the recheck
        // looks there ([`recheck`]).
        if let Outcome::Finding { kind, details } = outcome {
            stratum.defects += 1;
            result
                .findings
                .push(finding(kind, &id, &stratum.name, details));
        }
    }
}

/// Tallies a full run's batch: each source location's checks into its stratum
/// (`full:<location>`, created as needed), and the placement checks.
pub fn tally_full(
    batch: &mut FullBatch,
    result: &mut RunResult,
    strata: &mut BTreeMap<String, Stratum>,
) {
    for (location, checked) in std::mem::take(&mut batch.checked) {
        let name = format!("full:{location}");
        let stratum = strata.entry(name.clone()).or_insert_with(|| Stratum {
            name,
            ..Stratum::default()
        });
        tally(result, stratum, checked, &location);
    }
    tally_placement(std::mem::take(&mut batch.placement), result, strata);
}

pub(super) fn finding(
    kind: FindingKind,
    id: &Bson,
    stratum: &str,
    details: serde_json::Value,
) -> NewFinding {
    NewFinding {
        kind,
        doc_id: Some(ids::encode(id)),
        doc_id_text: Some(ids::text(id)),
        stratum: Some(stratum.to_owned()),
        details,
    }
}

/// The name an outcome is counted under.
pub(super) fn outcome_name(outcome: &Outcome) -> &'static str {
    match outcome {
        Outcome::Copied => "copied",
        Outcome::Superseded => "superseded",
        Outcome::Deleted => "deleted",
        Outcome::Stayed => "stayed",
        Outcome::Ignored => "ignored",
        Outcome::Placed => "placed",
        Outcome::Finding { kind, .. } => kind.as_str(),
    }
}

pub fn tally(
    result: &mut RunResult,
    stratum: &mut Stratum,
    checked: Vec<(Bson, Outcome)>,
    source: &Location,
) {
    for (id, outcome) in checked {
        *result
            .counts
            .entry(outcome_name(&outcome).to_owned())
            .or_default() += 1;
        if matches!(outcome, Outcome::Ignored) {
            continue;
        }
        stratum.samples += 1;
        if let Outcome::Finding { kind, mut details } = outcome {
            stratum.defects += 1;
            details["source"] = json!(source.to_string());
            result
                .findings
                .push(finding(kind, &id, &stratum.name, details));
        }
    }
}

//! Repair of what a run found, through the protocol's repair steps: a missing or stale copy
//! copied again from its source, a shadow read's mismatch settled.

use mongodb::bson::{Bson, Document};

use crate::disposition;
use crate::envelope::{self};
use crate::ids;
use crate::protocol::{self, Answer, Payload, RepairAction, RepairNext, Repaired, Side, Step};
use crate::routing::Location;
use crate::shards::write::Inserted;
use crate::store::reconcile::FindingKind;

use super::*;

/// Runs a repair's copy of `doc` (a source document) at its target `goal`, from its first
/// step (`first`, [`protocol::repair_copy_step`]) on as [`protocol::repair_next`] says: on a
/// duplicate key [`protocol::repair_replace_step`], which replaces only a pristine copy, never
/// the application's write or a tombstone.
pub(super) async fn repair_copy(
    scene: &Scene,
    goal: &Location,
    first: Step<Document, Document>,
    doc: Document,
    sub_bucket: u32,
    epoch: i64,
) -> Result<&'static str, ReadError> {
    let id = doc.get("_id").cloned().unwrap_or(Bson::Null);
    let copy = |payload: &Payload<Document>| match payload {
        Payload::Copy(d) => envelope::copy(d.clone(), &scene.to, sub_bucket, epoch),
        Payload::App(_) | Payload::Tombstone => unreachable!("a repair writes copies only"),
    };
    let mut step = first;
    loop {
        let answer: Answer<Document> = match &step {
            Step::Insert(Side::Target, payload) => {
                match scene.shards.insert_one(goal, copy(payload)).await? {
                    Inserted::Inserted => Answer::Inserted,
                    Inserted::DuplicateKey => Answer::DuplicateKey,
                }
            }
            Step::ReplaceCopy(Side::Target, payload) => Answer::Matched(
                scene
                    .shards
                    .replace_one(goal, envelope::pristine_copy_of(&id), copy(payload))
                    .await?,
            ),
            other => unreachable!("a repair asks for no {other:?}"),
        };
        match protocol::repair_next(&step, &answer, doc.clone()) {
            RepairNext::Write(next) => step = next,
            RepairNext::Done(Repaired::CopiedAgain) => return Ok("copied again"),
            RepairNext::Done(Repaired::PristineReplaced) => return Ok("pristine copy replaced"),
            RepairNext::Done(Repaired::LeftAlone) => {
                return Ok("left alone: the application wrote it since")
            }
        }
    }
}

/// Brings the target in line with the source document of `id` at `source`, as
/// [`protocol::repair_action`] decides: a document that moves is copied again
/// ([`repair_copy`], never over the application's write), one that stays gets its routing
/// field. Returns what was done.
pub(super) async fn repair_from_source(
    scene: &Scene,
    epoch: i64,
    source: &Location,
    id: &Bson,
) -> Result<String, ReadError> {
    let Some(doc) = scene.shards.find_by_id(source, id).await? else {
        return Ok("the source document is gone".to_owned());
    };
    let d = disposition::of(Side::Source, &scene.from, &scene.to, source, &doc);
    Ok(
        match protocol::repair_action(&d, doc.clone(), envelope::stamp) {
            RepairAction::Stamp(Step::UpdateLive(_, stamp)) => {
                // A document that stays is where both versions place it: at `source`.
                scene
                    .shards
                    .update_one(source, envelope::live(id), stamp)
                    .await?;
                "routing field stamped".to_owned()
            }
            RepairAction::Stamp(other) => unreachable!("a stamp is an update, not {other:?}"),
            RepairAction::Copy {
                target,
                sub_bucket,
                step,
            } => repair_copy(scene, &target, step, doc, sub_bucket, epoch)
                .await?
                .to_owned(),
            RepairAction::Leave => format!("left alone: the source document is {d:?} now"),
        },
    )
}

/// How the repair of a shadow read's mismatch ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ShadowRepair {
    /// The target's copy equals its source again (what was done).
    Repaired(String),
    /// Nothing is left to compare: the application wrote or deleted the document since, or
    /// (rarely) the source document is gone.
    Superseded(crate::shadow::Uncompared),
    /// The copy still differs (the fields).
    StillWrong(Vec<String>),
}

/// Repairs a mismatch shadow reads found: the pristine copy is copied again from its source
/// through the repair path ([`repair_from_source`]: replacing only a pristine copy), then
/// both sides are read and compared again ([`crate::shadow::compare`]).
pub async fn repair_shadow_mismatch(
    scene: &Scene,
    epoch: i64,
    mismatch: &crate::store::shadow::ShadowMismatch,
) -> Result<ShadowRepair, ReadError> {
    let id = ids::decode(&mismatch.doc_id).unwrap_or(Bson::Null);
    let (Some(source), Some(target)) = (
        parse_location(&mismatch.source_location),
        parse_location(&mismatch.target_location),
    ) else {
        return Ok(ShadowRepair::StillWrong(vec![format!(
            "unreadable locations {} / {}",
            mismatch.source_location, mismatch.target_location
        )]));
    };
    let what = repair_from_source(scene, epoch, &source, &id).await?;
    let source_doc = scene.shards.find_by_id(&source, &id).await?;
    let target_doc = scene.shards.find_by_id(&target, &id).await?;
    Ok(
        match crate::shadow::compare(
            source_doc.as_ref(),
            target_doc.as_ref(),
            &scene.from,
            &scene.to,
        ) {
            crate::shadow::Verdict::Equal => ShadowRepair::Repaired(what),
            crate::shadow::Verdict::Mismatch { fields } => ShadowRepair::StillWrong(fields),
            crate::shadow::Verdict::NotCompared(why) => ShadowRepair::Superseded(why),
        },
    )
}

/// Rewrites the documents findings name: a missing or mismatched pristine copy is copied again
/// from the source ([`repair_copy`]), a staying document gets its routing field, a misplaced
/// copy is removed from where it does not belong once the right location holds it. Returns
/// per finding what was done.
pub async fn repair(
    scene: &Scene,
    epoch: i64,
    findings: &[crate::store::reconcile::Finding],
) -> Result<Vec<(i64, String)>, ReadError> {
    let mut done = Vec::new();
    for f in findings {
        let Some(raw) = &f.doc_id else { continue };
        let id = ids::decode(raw).unwrap_or(Bson::Null);
        let source = f.details["source"].as_str().and_then(parse_location);
        let what = match (f.kind, source) {
            (FindingKind::Missing | FindingKind::Mismatched, Some(source)) => {
                repair_from_source(scene, epoch, &source, &id).await?
            }
            (FindingKind::Misplaced, source) => {
                let found = f.details["found"].as_str().and_then(parse_location);
                let expected = f.details["expected"].as_str().and_then(parse_location);
                let (Some(found), Some(expected)) = (found, expected) else {
                    continue;
                };
                let mut what = Vec::new();
                if find_by_ids(scene, &expected, std::slice::from_ref(&id))
                    .await?
                    .is_empty()
                {
                    // Only the stray exists: copy the source document where it belongs first.
                    let doc = match &source {
                        Some(source) => scene.shards.find_by_id(source, &id).await?,
                        None => None,
                    };
                    let d = match (&doc, &source) {
                        (Some(doc), Some(source)) => Some(disposition::of(
                            Side::Source,
                            &scene.from,
                            &scene.to,
                            source,
                            doc,
                        )),
                        _ => None,
                    };
                    let action = match (&doc, &d) {
                        (Some(doc), Some(d)) => {
                            protocol::repair_action(d, doc.clone(), envelope::stamp)
                        }
                        _ => RepairAction::Leave,
                    };
                    match (doc, action) {
                        (
                            Some(doc),
                            RepairAction::Copy {
                                target,
                                sub_bucket,
                                step,
                            },
                        ) if target == expected => {
                            let w =
                                repair_copy(scene, &expected, step, doc, sub_bucket, epoch).await?;
                            what.push(format!("{w} to {expected}"));
                        }
                        _ => {
                            done.push((
                                f.id,
                                format!(
                                    "left alone: {expected} does not hold it and the source \
                                     copy is gone; an operator must decide"
                                ),
                            ));
                            continue;
                        }
                    }
                }
                // Remove the stray only while it is a pristine copy: the application's own
                // write there is for an operator to look at.
                let removed = scene
                    .shards
                    .delete_one(&found, envelope::pristine_copy_of(&id))
                    .await?;
                if removed {
                    what.push(format!("removed from {found}"));
                } else {
                    what.push(format!("left the application's write at {found} alone"));
                }
                what.join("; ")
            }
            _ => continue,
        };
        done.push((f.id, what));
    }
    Ok(done)
}

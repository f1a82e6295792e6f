//! The workers' decisions: what the copier, the cleaner, the revert copier and a repair do
//! with a document they scanned, and how a partition's checkpoint follows its batches.

use super::{mirror_writes, Answer, Found, Payload, Side, Step};
use crate::disposition::Disposition;
use crate::routing::Location;

/// What the backfill makes of the answer to inserting a copy into the target.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CopyResult {
    Inserted,
    /// A copy, a newer application write or a tombstone was there first; all of them win
    /// over the copy, which is why the copier never overwrites.
    AlreadyPresent,
}

/// The copier's one write: insert-if-absent of a pristine copy.
pub fn copy_step<D, U>(doc: D) -> Step<D, U> {
    Step::Insert(Side::Target, Payload::Copy(doc))
}

pub fn copy_result<D>(answer: &Answer<D>) -> Option<CopyResult> {
    match answer {
        Answer::Inserted => Some(CopyResult::Inserted),
        Answer::DuplicateKey => Some(CopyResult::AlreadyPresent),
        Answer::Found(_) | Answer::Matched(_) => None,
    }
}

/// Cleanup's first step for a source id: look it up in the target.
pub fn cleanup_lookup_step<D, U>() -> Step<D, U> {
    Step::Find(Side::Target)
}

/// Cleanup's deletion of a source document, once [`cleanup_decision`] allowed it.
pub fn cleanup_delete_step<D, U>() -> Step<D, U> {
    Step::Delete(Side::Source)
}

/// The tombstone purge that follows cleanup (target side) or a rollback (source side). Run
/// only once nothing can copy or mirror an older version of the id any more and nothing
/// writes tombstones: on the target side once every router acknowledged `completed` (routers
/// in `cleanup` still tombstone, cleanup's presence check needs it); on the source side once
/// every router acknowledged the seal of `rolled_back` (no router in `revert_switch` is left
/// to mirror, and deletes no longer leave source tombstones).
pub fn purge_tombstone_step<D, U>(side: Side) -> Step<D, U> {
    Step::DeleteTombstone(side)
}

/// What a bypass's recopy leaves to do where the bypass wrote, once the document was written
/// again through a router: at a target location, delete the plain document the bypass wrote
/// unless the router's own (enveloped) write is what stands there now; the router's write
/// went where the target layout puts the id, which need not be where the bypass wrote. At a
/// source location nothing: the router replaced the document in place, or the source layout
/// does not hold it.
pub fn bypass_leftover_step<D, U>(side: Side) -> Option<Step<D, U>> {
    (side == Side::Target).then_some(Step::DeleteUnmarked(Side::Target))
}

/// The revert copier's one step per target id: carry the target document back to the source
/// by revision. It must start only once every live router acknowledged `reverting` (a router
/// still in an earlier epoch writes the target without mirroring, and the copier may have
/// passed that id already); from then on routers mirror their own writes, and the copier
/// carries back everything written before. A router whose lease lapses after the pass began
/// may have left a write unmirrored behind it: the pass is then outdated and runs again
/// (docs/decisions/0022-a-lapse-outdates-the-copy-back.md).
pub fn revert_copy_step<D, U>() -> Step<D, U> {
    Step::MirrorToSource
}

/// What a mirror of a target image with revision `image_rev` finds in the source document it
/// would replace: nothing, or a document and, if a mirror of this migration wrote it (its
/// `_reshard.mig`), that mirror's revision.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MirrorSource {
    Absent,
    /// A source document no mirror of this migration wrote: last written before the write
    /// switch, so older than any target version.
    Unmirrored,
    /// A document a mirror of this migration wrote, with its revision (`None`: it carries
    /// none, which a mirror never writes).
    Mirrored(Option<i64>),
}

/// Whether a mirror of an image with revision `image_rev` replaces what the source holds: the
/// condition of `MirrorToSource`'s upsert (`envelope::mirror`: `_reshard.mig` differs, or the
/// revision is lower; revisions are compared only among this migration's mirrors).
///
/// Once false it stays false: in `reverting` and `revert_switch` only this migration's mirrors
/// write the source, each only over a lower revision. So the revert copier, having read the
/// source documents of a batch's mirrors, leaves out the mirrors this says no to (a router
/// already mirrored the write it would carry): the upsert would be refused, now and later.
pub fn mirror_is_newer(source: MirrorSource, image_rev: i64) -> bool {
    match source {
        MirrorSource::Absent | MirrorSource::Unmirrored => true,
        MirrorSource::Mirrored(rev) => rev.is_some_and(|r| r < image_rev),
    }
}

/// What the backfill does with a document it scanned in the source.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum BackfillAction<D, U> {
    /// Write this step: a copy's insert-if-absent ([`copy_step`]) for a document that moves,
    /// a stamp of the routing field for one that stays.
    Write(Step<D, U>),
    /// A source document already where it belongs, as it should be: counted, nothing written.
    InPlace,
    /// Not a source document (a tombstone, a document of the other layout): outside the
    /// partition's ledger.
    Skip,
    /// It cannot be routed: a dead letter, never copied (and so never deleted by cleanup).
    DeadLetter(String),
}

/// The backfill's decision for one scanned source document; `stamp` builds the update that
/// sets a routing field to a value.
pub fn backfill_action<D, U>(
    disposition: &Disposition,
    doc: D,
    stamp: impl FnOnce(&str, i32) -> U,
) -> BackfillAction<D, U> {
    match disposition {
        Disposition::Moves { .. } => BackfillAction::Write(copy_step(doc)),
        Disposition::Stays {
            stamp: Some((field, value)),
        } => BackfillAction::Write(Step::UpdateLive(Side::Target, stamp(field, *value))),
        Disposition::Stays { stamp: None } => BackfillAction::InPlace,
        Disposition::Tombstone { .. } | Disposition::Foreign | Disposition::Placed { .. } => {
            BackfillAction::Skip
        }
        Disposition::Unroutable { reason } => BackfillAction::DeadLetter(reason.clone()),
    }
}

/// What cleanup does with a document it scanned in the source.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CleanupAction {
    /// It moved: look it up in the target ([`cleanup_lookup_step`]), then
    /// [`cleanup_decision`].
    LookUp,
    /// Keep it: it never moves, or it was never copied (it cannot be routed, or an operator
    /// skipped its dead letter). Counted in the ledger as kept.
    Keep,
    /// Not a source document: outside the ledger.
    Skip,
}

/// Cleanup's decision for one scanned source document. `dead_letter_skipped`: an operator
/// skipped this id's dead letter, so it was never copied.
pub fn cleanup_action(disposition: &Disposition, dead_letter_skipped: bool) -> CleanupAction {
    match disposition {
        Disposition::Moves { .. } if dead_letter_skipped => CleanupAction::Keep,
        Disposition::Moves { .. } => CleanupAction::LookUp,
        Disposition::Stays { .. } | Disposition::Unroutable { .. } => CleanupAction::Keep,
        Disposition::Tombstone { .. } | Disposition::Foreign | Disposition::Placed { .. } => {
            CleanupAction::Skip
        }
    }
}

/// What the revert copier does with a document it scanned in the target.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum RevertAction<D, U> {
    /// Carry it back: [`revert_copy_step`], whose first half (reading the target's image) is
    /// the scan itself.
    Write(Step<D, U>),
    /// A pristine copy: the source holds the same document. Or the source version places the
    /// id where it was scanned ([`mirror_writes`]): it is the source's document too.
    InPlace,
    /// Not the target's document here.
    Skip,
}

/// The revert copier's decision for one document it scanned in the target at `scanned`.
pub fn revert_action<D, U>(disposition: &Disposition, scanned: &Location) -> RevertAction<D, U> {
    match disposition {
        Disposition::Placed { source, .. }
        | Disposition::Tombstone {
            source: Some((source, _)),
        } if !mirror_writes(scanned, std::slice::from_ref(source)) => RevertAction::InPlace,
        Disposition::Placed {
            pristine: false, ..
        }
        | Disposition::Tombstone { source: Some(_) } => RevertAction::Write(revert_copy_step()),
        Disposition::Placed { pristine: true, .. } => RevertAction::InPlace,
        Disposition::Tombstone { source: None }
        | Disposition::Moves { .. }
        | Disposition::Stays { .. }
        | Disposition::Foreign
        | Disposition::Unroutable { .. } => RevertAction::Skip,
    }
}

/// What a repair does for a source document it read again, once reconciliation found the
/// target wrong for it.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum RepairAction<D, U> {
    /// It moves: copy it again at `target`, starting with `step` ([`repair_copy_step`]), then
    /// as [`repair_next`] says.
    Copy {
        target: Location,
        sub_bucket: u32,
        step: Step<D, U>,
    },
    /// It stays and lacks its routing field: the backfill's stamp, where it is.
    Stamp(Step<D, U>),
    /// Nothing to repair from the source now: it is a tombstone, a document of the other
    /// layout, one that cannot be routed, or one that stays as it should.
    Leave,
}

/// The repair's decision for the source document `doc` it read; `stamp` builds the update that
/// sets a routing field to a value (as for [`backfill_action`]).
pub fn repair_action<D, U>(
    disposition: &Disposition,
    doc: D,
    stamp: impl FnOnce(&str, i32) -> U,
) -> RepairAction<D, U> {
    match disposition {
        Disposition::Moves { target, sub_bucket } => RepairAction::Copy {
            target: target.clone(),
            sub_bucket: *sub_bucket,
            step: repair_copy_step(doc),
        },
        Disposition::Stays { stamp: Some(_) } => match backfill_action(disposition, doc, stamp) {
            BackfillAction::Write(step) => RepairAction::Stamp(step),
            _ => unreachable!("the backfill stamps a document that stays without its field"),
        },
        Disposition::Stays { stamp: None }
        | Disposition::Tombstone { .. }
        | Disposition::Foreign
        | Disposition::Placed { .. }
        | Disposition::Unroutable { .. } => RepairAction::Leave,
    }
}

/// A repair's first write for a source document the target lacks or holds wrong: the copier's
/// insert-if-absent of a fresh pristine copy.
pub fn repair_copy_step<D, U>(doc: D) -> Step<D, U> {
    copy_step(doc)
}

/// A repair's second write, after its insert met a duplicate: replace the document only while
/// it is still a pristine copy, never over the application's write or a tombstone.
pub fn repair_replace_step<D, U>(doc: D) -> Step<D, U> {
    Step::ReplaceCopy(Side::Target, Payload::Copy(doc))
}

/// How a repair's copy ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Repaired {
    /// The target had nothing: the copy is there now.
    CopiedAgain,
    /// The target held a pristine copy: it is replaced by a fresh one.
    PristineReplaced,
    /// The target holds the application's write or a tombstone, which win over a copy.
    LeftAlone,
}

/// What follows a repair's write.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum RepairNext<D, U> {
    Write(Step<D, U>),
    Done(Repaired),
}

/// The repair's next move after `answer` to its write `step` of the copy of `doc`: an insert
/// that met a duplicate is followed by [`repair_replace_step`]; anything else ends it.
pub fn repair_next<D, U, A>(step: &Step<D, U>, answer: &Answer<A>, doc: D) -> RepairNext<D, U> {
    match (step, answer) {
        (Step::Insert(..), Answer::Inserted) => RepairNext::Done(Repaired::CopiedAgain),
        (Step::Insert(..), _) => RepairNext::Write(repair_replace_step(doc)),
        (_, Answer::Matched(true)) => RepairNext::Done(Repaired::PristineReplaced),
        _ => RepairNext::Done(Repaired::LeftAlone),
    }
}

/// What cleanup may do with a source document once it looked the id up in the target.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CleanupDecision {
    /// The target holds a copy or a tombstone: the source copy may go.
    DeleteSource,
    /// The target holds nothing: deleting would lose the document. Stop and fail.
    Missing,
}

pub fn cleanup_decision<D>(target: &Found<D>) -> CleanupDecision {
    match target {
        Found::Live(_) | Found::Unmatched | Found::Tombstone => CleanupDecision::DeleteSource,
        Found::Absent => CleanupDecision::Missing,
    }
}

/// How many of the deletes a cleanup attempt sent and never checkpointed were applied: those
/// whose ids the source no longer holds (`present`: the ids it holds now, read once the attempt
/// can write no more). Only the cleaner deletes source documents once writes have switched,
/// and it deletes only what it read there, so an id it sent that is gone is one it deleted;
/// one still present is after the checkpoint and is met again by the next scan. Counting the
/// gone ones keeps a taken-over partition's ledger exact: its scan cannot count documents
/// that are no longer there.
pub fn applied_pending_deletes<K: Eq + std::hash::Hash>(
    sent: &[K],
    present: &std::collections::HashSet<K>,
) -> u64 {
    let unique: std::collections::HashSet<&K> = sent.iter().collect();
    unique.into_iter().filter(|k| !present.contains(*k)).count() as u64
}

/// The batches of one partition a worker has in flight at once. They settle in any order,
/// but the partition's checkpoint may pass a batch only once it and every batch before it
/// settled well: a checkpoint is where a re-execution (after a failure, a lost lease, a
/// takeover) starts, so everything after it must be unwritten or harmless to write again.
/// A batch that did not settle well (a transient failure on every attempt, a write past the
/// lease's deadline) ends the window: nothing from it on is recorded, and it and every
/// batch after it are executed again from the checkpoint. `T` is what a batch brings to the
/// checkpoint (its ledger).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct BatchWindow<T> {
    /// Number of the next batch to send.
    sent: u64,
    /// Number of the first batch not yet recorded.
    recorded: u64,
    /// Batches settled after it (`None`: not well).
    settled: std::collections::BTreeMap<u64, Option<T>>,
    /// A batch before which the window ended.
    broken: bool,
    /// Batches settled, well or not.
    settled_count: u64,
}

impl<T> Default for BatchWindow<T> {
    fn default() -> Self {
        BatchWindow {
            sent: 0,
            recorded: 0,
            settled: std::collections::BTreeMap::new(),
            broken: false,
            settled_count: 0,
        }
    }
}

impl<T> BatchWindow<T> {
    /// A batch is sent: its number.
    pub fn send(&mut self) -> u64 {
        self.sent += 1;
        self.sent - 1
    }

    /// Batch `n` settled: well (`Some(ledger)`) or not (`None`).
    pub fn settle(&mut self, n: u64, outcome: Option<T>) {
        debug_assert!(
            n < self.sent && n >= self.recorded,
            "batch {n} was not in flight"
        );
        self.settled.insert(n, outcome);
        self.settled_count += 1;
    }

    /// What the checkpoint may record now, oldest first: the batches that settled well with
    /// every batch before them. Taken out of the window.
    pub fn recordable(&mut self) -> Vec<T> {
        let mut out = Vec::new();
        while !self.broken {
            match self.settled.remove(&self.recorded) {
                Some(Some(ledger)) => {
                    out.push(ledger);
                    self.recorded += 1;
                }
                Some(None) => self.broken = true,
                None => break,
            }
        }
        out
    }

    /// Batches sent and not yet recorded (in flight, or settled behind one that is).
    pub fn in_flight(&self) -> usize {
        (self.sent - self.recorded) as usize
    }

    /// Whether a batch failed: nothing from it on will be recorded; send no more.
    pub fn broken(&self) -> bool {
        self.broken
    }

    /// Whether every batch sent has been settled (recorded, or behind a failed one).
    pub fn idle(&self) -> bool {
        self.settled_count == self.sent
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_recopied_bypass_leaves_its_plain_document_to_delete_only_at_a_target_location() {
        assert_eq!(
            bypass_leftover_step::<(), ()>(Side::Target),
            Some(Step::DeleteUnmarked(Side::Target))
        );
        assert_eq!(bypass_leftover_step::<(), ()>(Side::Source), None);
    }

    #[test]
    fn a_repair_copies_what_moves_stamps_what_stays_and_leaves_the_rest() {
        let there = Location::new("s2", "orders");
        let stamp = |f: &str, v: i32| format!("{f}={v}");
        let moves = Disposition::Moves {
            target: there.clone(),
            sub_bucket: 3,
        };
        assert_eq!(
            repair_action(&moves, 7_u8, stamp),
            RepairAction::Copy {
                target: there.clone(),
                sub_bucket: 3,
                step: Step::Insert(Side::Target, Payload::Copy(7)),
            }
        );
        let stays = Disposition::Stays {
            stamp: Some(("bucket".to_owned(), 2)),
        };
        // The backfill's stamp, the same step.
        let RepairAction::Stamp(step) = repair_action(&stays, 7_u8, stamp) else {
            panic!("a document that stays without its field is stamped");
        };
        let BackfillAction::Write(backfill) = backfill_action(&stays, 7_u8, stamp) else {
            panic!("the backfill stamps it too");
        };
        assert_eq!(step, backfill);
        for d in [
            Disposition::Stays { stamp: None },
            Disposition::Foreign,
            Disposition::Tombstone { source: None },
            Disposition::Unroutable {
                reason: "no tenant".to_owned(),
            },
            Disposition::Placed {
                source: there.clone(),
                sub_bucket: 0,
                pristine: true,
            },
        ] {
            assert_eq!(repair_action(&d, 7_u8, stamp), RepairAction::Leave, "{d:?}");
        }
    }

    #[test]
    fn a_repair_replaces_only_after_a_duplicate_and_ends_after_the_replace() {
        let insert: Step<u8, ()> = repair_copy_step(7);
        let replace: Step<u8, ()> = repair_replace_step(7);
        assert_eq!(
            repair_next(&insert, &Answer::<u8>::Inserted, 7),
            RepairNext::Done(Repaired::CopiedAgain)
        );
        assert_eq!(
            repair_next(&insert, &Answer::<u8>::DuplicateKey, 7),
            RepairNext::Write(replace.clone())
        );
        assert_eq!(
            repair_next(&replace, &Answer::<u8>::Matched(true), 7),
            RepairNext::Done(Repaired::PristineReplaced)
        );
        // The replace matched nothing: the application's write or a tombstone is there.
        assert_eq!(
            repair_next(&replace, &Answer::<u8>::Matched(false), 7),
            RepairNext::Done(Repaired::LeftAlone)
        );
    }

    #[test]
    fn a_checkpoint_passes_a_batch_only_after_every_earlier_batch_settled_well() {
        let mut w = BatchWindow::default();
        let (a, b, c) = (w.send(), w.send(), w.send());
        assert_eq!(w.in_flight(), 3);
        w.settle(b, Some("b"));
        assert!(w.recordable().is_empty(), "b settled before a");
        w.settle(a, Some("a"));
        assert_eq!(w.recordable(), vec!["a", "b"]);
        assert_eq!(w.in_flight(), 1);
        assert!(!w.idle());
        w.settle(c, Some("c"));
        assert_eq!(w.recordable(), vec!["c"]);
        assert!(w.idle());
        // A failed batch ends the window: what settled after it is never recorded.
        let (d, e) = (w.send(), w.send());
        w.settle(e, Some("e"));
        w.settle(d, None);
        assert!(w.recordable().is_empty());
        assert!(w.broken());
        assert!(w.idle());
    }

    #[test]
    fn the_revert_copier_carries_back_only_what_the_source_does_not_hold_already() {
        let (here, there) = (Location::new("s1", "orders"), Location::new("s2", "orders"));
        let placed = |source: &Location, pristine| Disposition::Placed {
            source: source.clone(),
            sub_bucket: 0,
            pristine,
        };
        let tombstone = |source: &Location| Disposition::Tombstone {
            source: Some((source.clone(), 0)),
        };
        let action = |d: &Disposition| revert_action::<u8, u8>(d, &here);
        let mirror = RevertAction::Write(Step::MirrorToSource);
        // Scanned at `here`, placed by the source version elsewhere: carried back unless
        // it is a pristine copy.
        assert_eq!(action(&placed(&there, false)), mirror);
        assert_eq!(action(&tombstone(&there)), mirror);
        assert_eq!(action(&placed(&there, true)), RevertAction::InPlace);
        // Placed `here` by both versions: one document, written or not since.
        for d in [placed(&here, false), placed(&here, true), tombstone(&here)] {
            assert_eq!(action(&d), RevertAction::InPlace, "{d:?}");
        }
        assert!(mirror_writes(&here, std::slice::from_ref(&there)));
        assert!(!mirror_writes(&here, std::slice::from_ref(&here)));
        assert!(!mirror_writes(&here, &[there.clone(), here.clone()]));
        assert_eq!(
            action(&Disposition::Tombstone { source: None }),
            RevertAction::Skip
        );
    }

    #[test]
    fn a_pending_delete_counts_as_applied_once_and_only_when_its_id_is_gone() {
        let present: std::collections::HashSet<&str> = ["b", "d"].into_iter().collect();
        assert_eq!(applied_pending_deletes(&["a", "b", "c", "d"], &present), 2);
        // An id sent twice (two attempts sent the same batch) was deleted once.
        assert_eq!(applied_pending_deletes(&["a", "a", "b"], &present), 1);
        assert_eq!(applied_pending_deletes(&["b", "d"], &present), 0);
        assert_eq!(applied_pending_deletes::<&str>(&[], &present), 0);
    }

    #[test]
    fn a_mirror_replaces_only_what_no_mirror_of_this_migration_wrote_as_new() {
        assert!(mirror_is_newer(MirrorSource::Absent, 1));
        // The source's own revision, counted before the switch, does not count.
        assert!(mirror_is_newer(MirrorSource::Unmirrored, 1));
        assert!(mirror_is_newer(MirrorSource::Mirrored(Some(2)), 3));
        assert!(!mirror_is_newer(MirrorSource::Mirrored(Some(3)), 3));
        assert!(!mirror_is_newer(MirrorSource::Mirrored(Some(4)), 3));
        // `_reshard.rev < r` does not match a document without the field.
        assert!(!mirror_is_newer(MirrorSource::Mirrored(None), 3));
    }
}

//! How a read of many documents at once (the front's `find`, `count`, `distinct` and
//! `aggregate` of one tenant) reads a phase, so that it returns exactly what reading each
//! matching id through the router would return.
//!
//! Each location evaluates the application's filter on the documents it holds, but a
//! location's match is not the answer: while the target is authoritative and the source is
//! still read (`dual_read` to `reconcile`, and `reverting`), an id's answer is the target's
//! document when the target holds one, live or tombstone, whether or not that document
//! matches, and the source's only when the target holds none. A source image that a newer
//! target image (or a tombstone) supersedes must never appear, even when only the older image
//! matches. So the per-id decision is the router's read itself: the `Get` machine, asked with
//! the filter as its condition ([`Found::Unmatched`]), fed from the batched reads
//! ([`query_answer`]). [`query_plan`] derives what to read from the same machine, so the two
//! cannot disagree.
//!
//! While rolling back (`reverting`), a single read mirrors the target document it looked at
//! to the source before it reports; a many-document read answers without those mirrors (one
//! conditional write per id it looked at would make a read of a tenant a write of every one
//! of its documents). Nothing it was told can then be missing from the source once reads move
//! there: a write the read saw is carried back by its own writer's mirror (the writer reports
//! only after it, and the driver leaves `reverting` only once every router acknowledged the
//! next phase, having drained), or, if that writer's lease lapsed first, by the revert copy's
//! next pass (a lapse outdates the pass, and the gate out of `reverting` waits for a complete
//! one). The protocol model explores many-document reads in `reverting` this way (its query
//! actor calls [`query_answer`]) and finds no lost or resurrected document.

use super::{Answer, Found, Next, Operation, OperationMachine, Outcome, ProtocolError, Side, Step};
use crate::phase::Phase;

/// What a many-document read of a phase reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum QueryPlan {
    /// The documents matching the filter on this side alone; tombstones never count.
    One(Side),
    /// Both sides, in this order, each read done before the next starts:
    /// 1. the source's documents matching the filter;
    /// 2. which of those ids the target holds, live or tombstone, at the location the target
    ///    version places each (its document supersedes the source's, matching or not);
    /// 3. the target's live documents matching the filter.
    ///
    /// Each id is then answered by [`query_answer`]: the target's match, else nothing when
    /// the target holds the id, else the source's match. The order is what keeps a document
    /// from vanishing: in these phases a target document is never removed (a delete leaves a
    /// tombstone), so an id the second read finds in the target is still there when the third
    /// read starts and is returned by it if it matches; an id the target gains after the
    /// second read keeps its source answer (what a read at that moment returned) unless the
    /// third read returns the target's. Read the other way round, an id copied to the target
    /// between the target's read and the presence check would be dropped from both.
    TargetThenSource,
    /// `revert_switch`: the router's read first carries the target's image of the id to the
    /// source (a write per id) and then reads there. A many-document read waits for the phase
    /// to move on, as writes do, and fails with the same retryable error if it does not in
    /// time.
    Held,
}

/// The plan of a many-document read in `phase`: the `Get` machine's own path.
pub fn query_plan(phase: Phase) -> QueryPlan {
    let mut get: OperationMachine<(), ()> = OperationMachine::new(phase, Operation::Get);
    match get.next(None) {
        Ok(Next::Do(Step::Find(Side::Source))) => QueryPlan::One(Side::Source),
        Ok(Next::Do(Step::Find(Side::Target))) => {
            match get.next(Some(Answer::Found(Found::Absent))) {
                Ok(Next::Do(Step::Find(Side::Source))) => QueryPlan::TargetThenSource,
                _ => QueryPlan::One(Side::Target),
            }
        }
        _ => QueryPlan::Held,
    }
}

/// Whether a cursor whose reads were planned in `planned` may go on serving in `now`: only
/// while the plan is the same. A cursor of `reconcile` may go on in `new_reads` (both read
/// the target last), but one of `planned` (source alone) may not go on in `dual_read`, where
/// the target's documents start to supersede what it buffered.
pub fn cursor_continues(planned: Phase, now: Phase) -> bool {
    let (a, b) = (query_plan(planned), query_plan(now));
    a == b
        || matches!(
            (a, b),
            (QueryPlan::TargetThenSource, QueryPlan::One(Side::Target))
        )
}

/// One id's answer to a many-document read in `phase`, from what the reads found of it:
/// `target` and `source` answer the machine's `Find` of each side (`Live` for a document
/// matching the filter, `Unmatched` for one that does not, `Tombstone`, `Absent`). `source`
/// is asked only when the machine reads the source for this id. `None`: the id is not in the
/// answer. An error for a phase whose plan is [`QueryPlan::Held`].
pub fn query_answer<D: Clone + std::fmt::Debug>(
    phase: Phase,
    target: impl FnOnce() -> Found<D>,
    source: impl FnOnce() -> Found<D>,
) -> Result<Option<D>, ProtocolError> {
    let mut get: OperationMachine<D, ()> = OperationMachine::new(phase, Operation::Get);
    let (mut target, mut source) = (Some(target), Some(source));
    let mut answer = None;
    loop {
        let found = match get.next(answer.take())? {
            Next::Done(Outcome::Read(doc)) => return Ok(doc),
            Next::Done(other) => {
                return Err(ProtocolError::UnexpectedAnswer {
                    at: "a read".into(),
                    answer: format!("{other:?}"),
                })
            }
            Next::Do(Step::Find(Side::Target)) => target.take().map(|f| f()),
            Next::Do(Step::Find(Side::Source)) => source.take().map(|f| f()),
            // Rolling back, a single read mirrors the target document it looked at before it
            // reports; a many-document read answers without that mirror (see the module doc).
            Next::Do(Step::MirrorToSource) if get.decided().is_some() => {
                return match get.decided() {
                    Some(Outcome::Read(doc)) => Ok(doc.clone()),
                    other => Err(ProtocolError::UnexpectedAnswer {
                        at: "a read".into(),
                        answer: format!("{other:?}"),
                    }),
                };
            }
            Next::Do(step) => {
                return Err(ProtocolError::UnexpectedAnswer {
                    at: format!("{step:?}"),
                    answer: "a many-document read sends no write; the phase holds it".into(),
                })
            }
        };
        let Some(found) = found else {
            return Err(ProtocolError::UnexpectedAnswer {
                at: "a read".into(),
                answer: "a side asked for twice".into(),
            });
        };
        answer = Some(Answer::Found(found));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_plan_follows_the_read_path_of_each_phase() {
        use QueryPlan::*;
        for phase in Phase::ALL {
            let expected = match phase {
                Phase::Planned | Phase::RolledBack => One(Side::Source),
                Phase::DualRead
                | Phase::WriteSwitch
                | Phase::NewWrites
                | Phase::Backfill
                | Phase::Reconcile
                | Phase::Reverting => TargetThenSource,
                Phase::NewReads | Phase::Cleanup | Phase::Completed => One(Side::Target),
                Phase::RevertSwitch => Held,
            };
            assert_eq!(query_plan(phase), expected, "{phase}");
        }
    }

    fn answer_in(
        phase: Phase,
        target: Found<&'static str>,
        source: Found<&'static str>,
    ) -> Option<&'static str> {
        query_answer(phase, || target, || source).unwrap()
    }

    #[test]
    fn a_target_document_supersedes_the_source_match_whether_it_matches_or_not() {
        let answer = |target: Found<&'static str>, source: Found<&'static str>| {
            query_answer(Phase::Backfill, || target, || source).unwrap()
        };
        use Found::*;
        // The target's match wins; the source's stale image never appears.
        assert_eq!(answer(Live("new"), Live("old")), Some("new"));
        assert_eq!(answer(Unmatched, Live("old")), None);
        assert_eq!(answer(Tombstone, Live("old")), None);
        // Only in the source: its match is the answer.
        assert_eq!(answer(Absent, Live("old")), Some("old"));
        assert_eq!(answer(Absent, Unmatched), None);
        assert_eq!(answer(Absent, Absent), None);
        // Reading the target alone, the source is never asked.
        let asked = std::cell::Cell::new(false);
        let only_target = query_answer(
            Phase::Cleanup,
            || Absent::<&str>,
            || {
                asked.set(true);
                Live("old")
            },
        );
        assert_eq!(only_target, Ok(None));
        assert!(!asked.get());
        // Reading the source alone: its tombstone (after a rollback) is no document.
        assert_eq!(
            query_answer(Phase::RolledBack, || Live("x"), || Tombstone::<&str>),
            Ok(None)
        );
        assert!(query_answer(Phase::RevertSwitch, || Absent::<&str>, || Absent).is_err());
        // Rolling back: the target's image (or the source's), without the single read's mirror.
        assert_eq!(
            answer_in(Phase::Reverting, Live("new"), Live("old")),
            Some("new")
        );
        assert_eq!(answer_in(Phase::Reverting, Tombstone, Live("old")), None);
        assert_eq!(
            answer_in(Phase::Reverting, Absent, Live("old")),
            Some("old")
        );
    }

    #[test]
    fn a_cursor_goes_on_only_while_its_plan_holds() {
        assert!(cursor_continues(Phase::Backfill, Phase::Reconcile));
        assert!(cursor_continues(Phase::Reconcile, Phase::NewReads));
        assert!(cursor_continues(Phase::Cleanup, Phase::Completed));
        assert!(!cursor_continues(Phase::Planned, Phase::DualRead));
        assert!(!cursor_continues(Phase::Reverting, Phase::RevertSwitch));
        assert!(!cursor_continues(Phase::Reverting, Phase::RolledBack));
        assert!(!cursor_continues(Phase::NewReads, Phase::Backfill));
    }
}

//! Where a step goes among the locations a layout lists for an id (a `fanout` source), and
//! whether and where a mirror writes.

use super::{Answer, Found, Step};

/// Whether a mirror ([`Step::MirrorToSource`]) writes the target image it read, found at
/// `image_at`, to the source: not when the source version places the id at `image_at` too
/// (`source_at`: every location it places the id at, one for a hashed layout, each listed
/// shard for a fanout one). In a collection both layouts share, such an id has one document
/// for both sides, so the source already holds the image; and the conditional replace would
/// write an image read a moment earlier over that very document, where a newer application
/// write may have landed meanwhile (its replace or tombstone drops `_reshard.mig`, so the
/// mirror's condition lets the older image through: a lost update, or a resurrected
/// delete). Found by the rollback test with the example application (reads in `reverting`
/// one version behind, a deleted order back), and by the model once it had ids both layouts
/// place in one collection.
pub fn mirror_writes<L: PartialEq>(image_at: &L, source_at: &[L]) -> bool {
    !source_at.contains(image_at)
}

/// Where a mirror that writes ([`mirror_writes`]) goes among `source_at`, the locations the
/// source version places the id at in the version's order, given which of them hold a
/// document with the id (`holds`, one flag per location): the first that holds it, where a
/// read finds the source document, so that the conditional replace lands on that document;
/// the first listed when none holds it (an id created since the switch, or deleted for good).
/// A hashed source places an id at one location; a fanout source lists several, and the
/// source document sits on one of them. Writing to the first listed regardless put a second
/// document beside the source's on another listed shard: a mirrored delete left the order
/// live after the rollback, a mirrored update left two versions of it.
pub fn mirror_location<'a, L>(source_at: &'a [L], holds: &[bool]) -> Option<&'a L> {
    first_holding(source_at, holds).or(source_at.first())
}

/// The first of `listed` whose flag in `holds` is set.
fn first_holding<'a, L>(listed: &'a [L], holds: &[bool]) -> Option<&'a L> {
    listed
        .iter()
        .zip(holds)
        .find_map(|(l, held)| held.then_some(l))
}

/// Where a router's step goes in a layout that lists several locations for its id, or the
/// answer it gets without being sent: see [`listed_location`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Listed<'a, L, D> {
    /// Send the step to this listed location.
    At(&'a L),
    /// Send nothing: this is the step's answer.
    Answered(Answer<D>),
}

/// Where a router's step on a side goes when that side's version lists several locations for
/// the id (`listed`, a `fanout` source: the id's document sits on one of them, not
/// necessarily the first), given which of them hold a document with the id (`holds`: live or
/// tombstone, one flag per listed location, all asked at once). The listed locations then
/// behave as one collection with a unique index on `_id`, holding one document per id:
/// - a find reads the first listed location holding the id (none: absent);
/// - an insert is a duplicate key when any listed location holds the id, as it is in one
///   collection: over a live document the machine then reports the duplicate, over a
///   tombstone it replaces the tombstone where it is ([`Step::ReplaceTombstone`], which finds
///   it there). Sent to the first listed location without looking at the others (the
///   router's rule before this decision), an insert beside a live document made two
///   versions of the id; beside a tombstone, a second document too, and after a rollback
///   one whose revision starts afresh, which a late mirror of an older image (its condition
///   compares revisions with the first document holding the id) overwrites. When none holds
///   the id the insert goes to the first listed location, where documents of ids held
///   nowhere appear (inserts, and mirrors: [`mirror_location`]), so two inserts that raced
///   past their probes meet at that location's unique index;
/// - every other write (a replace, an update, a delete, live or not) acts on the document
///   holding the id: at the first listed location holding it, where a find reads it; when
///   none holds it, it matches nothing and is not sent. Sent to the first listed location
///   regardless (as the router sent every write the machine did not precede with a find,
///   before this decision), an update or a delete of a document on another listed location
///   matched nothing and was lost;
/// - a mirror goes where [`mirror_location`] says.
///
/// A version that places the id at one location sends every step there, without a probe.
pub fn listed_location<'a, L, D, U>(
    step: &Step<D, U>,
    listed: &'a [L],
    holds: &[bool],
) -> Listed<'a, L, D> {
    let holder = first_holding(listed, holds);
    let at = |location: Option<&'a L>, otherwise: Answer<D>| match location {
        Some(l) => Listed::At(l),
        None => Listed::Answered(otherwise),
    };
    match step {
        Step::Find(_) => at(holder, Answer::Found(Found::Absent)),
        Step::Insert(..) if holder.is_some() => Listed::Answered(Answer::DuplicateKey),
        Step::Insert(..) => at(listed.first(), Answer::DuplicateKey),
        Step::MirrorToSource => at(mirror_location(listed, holds), Answer::Matched(false)),
        Step::ReplaceLive(..)
        | Step::ReplaceTombstone(..)
        | Step::ReplaceCopy(..)
        | Step::UpdateLive(..)
        | Step::Delete(_)
        | Step::DeleteLive(_)
        | Step::DeleteTombstone(_)
        | Step::DeleteUnmarked(_) => at(holder, Answer::Matched(false)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::{Payload, Side::Source as S};

    #[test]
    fn a_mirror_goes_where_the_source_document_is_else_to_the_first_listed() {
        let listed = ["s1", "s2", "s3"];
        // The source document sits on the second listed shard: the mirror replaces it there.
        assert_eq!(mirror_location(&listed, &[false, true, false]), Some(&"s2"));
        // On two (a stray copy): the first holding one, where a read finds it.
        assert_eq!(mirror_location(&listed, &[false, true, true]), Some(&"s2"));
        assert_eq!(mirror_location(&listed, &[true, true, false]), Some(&"s1"));
        // On none (created since the switch), or not asked (one location): the first listed.
        assert_eq!(mirror_location(&listed, &[false; 3]), Some(&"s1"));
        assert_eq!(mirror_location(&listed[..1], &[]), Some(&"s1"));
        assert_eq!(mirror_location::<&str>(&[], &[]), None);
    }

    #[test]
    fn the_locations_a_fanout_source_lists_hold_one_document_per_id() {
        let listed = ["s1", "s2"];
        let step = |s: Step<&'static str, &'static str>, holds: &[bool]| {
            listed_location(&s, &listed, holds)
        };
        let (insert, update) = (Step::Insert(S, Payload::App("d")), Step::UpdateLive(S, "u"));
        // The document sits on the second listed shard: every step goes there, and an
        // insert is a duplicate key without being sent, whether it is live or a tombstone.
        for s in [Step::Find(S), update.clone(), Step::DeleteLive(S)] {
            assert_eq!(step(s, &[false, true]), Listed::At(&"s2"));
        }
        assert_eq!(
            step(Step::ReplaceTombstone(S, Payload::App("d")), &[false, true]),
            Listed::At(&"s2")
        );
        assert_eq!(
            step(insert.clone(), &[false, true]),
            Listed::Answered(Answer::DuplicateKey)
        );
        // Held nowhere: an insert goes to the first listed shard, a find is absent, and
        // a write matches nothing without being sent.
        assert_eq!(step(insert, &[false, false]), Listed::At(&"s1"));
        assert_eq!(
            step(Step::Find(S), &[false, false]),
            Listed::Answered(Answer::Found(Found::Absent))
        );
        assert_eq!(
            step(update, &[false, false]),
            Listed::Answered(Answer::Matched(false))
        );
        // A mirror of an id held nowhere goes to the first listed shard (`mirror_location`).
        assert_eq!(
            step(Step::MirrorToSource, &[false, false]),
            Listed::At(&"s1")
        );
        assert_eq!(
            step(Step::MirrorToSource, &[false, true]),
            Listed::At(&"s2")
        );
    }
}

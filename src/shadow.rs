//! Shadow reads (issue 14): while a router reads the target first and the source second, it may
//! also read the other side for a share of its reads, off the application's latency path, and
//! compare the two images of the document. This module owns the decisions: in which phases a
//! router shadows reads, which reads it samples, and what a comparison says. Pure; the router
//! reads the two sides (`router::shadow`) and the store keeps the counts and the mismatches.
//!
//! Only one comparison is meaningful: a **live pristine copy** in the target
//! ([`envelope::is_pristine_copy`]) must equal its source document, apart from `_reshard` and
//! the routing fields of both versions ([`envelope::content_differences`]). Once writes have
//! switched to the target the source of a moved document no longer changes (until cleanup
//! deletes it), and a copy keeps its source's revision, so a pristine copy that differs from
//! its source was altered behind reshard's back (or copied wrongly). Everything else is not a
//! defect a read can see: an application's write in the target is newer than its source, a
//! tombstone means the document was deleted, a target without the id means the backfill has
//! not copied it yet, and a source without it means cleanup has begun.

use mongodb::bson::Document;
use serde::Serialize;

use crate::envelope::{self, Writer};
use crate::phase::Phase;
use crate::routing::RoutingVersion;

/// Whether routers shadow reads in `phase`: the phases that read the target, then the source,
/// except `reverting`, whose mirrors rewrite the source.
///
/// In `dual_read` and `write_switch` the target holds no copy yet (nothing is compared, but the
/// cost is the same, so an operator sees it before the backfill starts).
pub fn applies(phase: Phase) -> bool {
    match phase {
        Phase::DualRead
        | Phase::WriteSwitch
        | Phase::NewWrites
        | Phase::Backfill
        | Phase::Reconcile => true,
        Phase::Planned
        | Phase::NewReads
        | Phase::Cleanup
        | Phase::Completed
        | Phase::Reverting
        | Phase::RevertSwitch
        | Phase::RolledBack => false,
    }
}

/// Whether a read with the uniform draw `draw` (in `[0, 1)`) is shadowed at `percent` (0 to
/// 100): 0 never, 100 always.
pub fn sampled(percent: f64, draw: f64) -> bool {
    draw * 100.0 < percent
}

/// What a shadow read found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// The target's pristine copy equals its source document.
    Equal,
    /// The target's pristine copy differs from its source document in these fields.
    Mismatch { fields: Vec<String> },
    /// Nothing could be compared, and why.
    NotCompared(Uncompared),
}

/// Why a shadow read compared nothing.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Uncompared {
    /// The target has no document of the id: the backfill has not copied it yet.
    NotCopied,
    /// The target holds a tombstone: the document was deleted.
    Deleted,
    /// The application wrote the target document: it is newer than its source.
    Superseded,
    /// The target document carries no copy's envelope (a document that stays where it is).
    NotACopy,
    /// The source no longer holds the document (cleanup removes moved documents).
    SourceGone,
}

impl Uncompared {
    pub fn as_str(self) -> &'static str {
        match self {
            Uncompared::NotCopied => "not copied yet",
            Uncompared::Deleted => "deleted since",
            Uncompared::Superseded => "the application wrote it since",
            Uncompared::NotACopy => "not a copy",
            Uncompared::SourceGone => "the source document is gone",
        }
    }
}

impl Verdict {
    /// Whether two images were compared (what `reads compared` counts).
    pub fn compared(&self) -> bool {
        !matches!(self, Verdict::NotCompared(_))
    }
}

/// Compares what the source and the target hold for one id (`None`: nothing there; tombstones
/// included as read). See the module's docs for what is compared and why.
pub fn compare(
    source: Option<&Document>,
    target: Option<&Document>,
    from: &RoutingVersion,
    to: &RoutingVersion,
) -> Verdict {
    let Some(target) = target else {
        return Verdict::NotCompared(Uncompared::NotCopied);
    };
    if envelope::is_tombstone(target) {
        return Verdict::NotCompared(Uncompared::Deleted);
    }
    if !envelope::is_pristine_copy(target) {
        return Verdict::NotCompared(match envelope::writer(target) {
            Some(Writer::App) => Uncompared::Superseded,
            Some(Writer::Copy) | None => Uncompared::NotACopy,
        });
    }
    let source = match source {
        Some(s) if !envelope::is_tombstone(s) => s,
        _ => return Verdict::NotCompared(Uncompared::SourceGone),
    };
    let fields = envelope::content_differences(source, target, from, to);
    if fields.is_empty() {
        Verdict::Equal
    } else {
        Verdict::Mismatch { fields }
    }
}

#[cfg(test)]
mod tests {
    use mongodb::bson::doc;

    use super::*;

    fn version(field: Option<&str>) -> RoutingVersion {
        crate::routing::one_shard_version(field)
    }

    /// One case: what the source and the target hold, and the verdict.
    fn case(source: Option<Document>, target: Option<Document>, want: Verdict) {
        let (from, to) = (version(Some("slot")), version(Some("bucket")));
        let got = compare(source.as_ref(), target.as_ref(), &from, &to);
        assert_eq!(got, want, "source {source:?}, target {target:?}");
    }

    fn source() -> Document {
        doc! { "_id": "o-1", "customerId": "c", "total": 5, "slot": 0, "_reshard": { "rev": 3_i64 } }
    }

    fn copy(total: i32) -> Document {
        doc! {
            "_id": "o-1", "customerId": "c", "total": total, "bucket": 2,
            "_reshard": { "src": "copy", "epoch": 4_i64, "rev": 3_i64 },
        }
    }

    #[test]
    fn a_pristine_copy_equal_to_its_source_apart_from_envelope_and_routing_fields_is_equal() {
        case(Some(source()), Some(copy(5)), Verdict::Equal);
    }

    #[test]
    fn a_pristine_copy_altered_behind_reshards_back_is_a_mismatch_naming_the_fields() {
        let mut altered = copy(6);
        altered.insert("note", "edited by hand");
        case(
            Some(source()),
            Some(altered),
            Verdict::Mismatch {
                fields: vec!["note".into(), "total".into()],
            },
        );
        // A field missing on one side differs too.
        let mut lost = copy(5);
        lost.remove("customerId");
        case(
            Some(source()),
            Some(lost),
            Verdict::Mismatch {
                fields: vec!["customerId".into()],
            },
        );
    }

    #[test]
    fn what_a_read_cannot_judge_is_not_compared() {
        let app = doc! { "_id": "o-1", "customerId": "c", "total": 9, "_reshard": { "src": "app", "rev": 4_i64 } };
        let tombstone =
            doc! { "_id": "o-1", "customerId": "c", "_reshard": { "deleted": true, "rev": 4_i64 } };
        let copied_tombstone =
            doc! { "_id": "o-1", "_reshard": { "src": "copy", "deleted": true } };
        let stays = doc! { "_id": "o-1", "customerId": "c", "total": 5, "bucket": 0 };
        let n = Verdict::NotCompared;
        case(Some(source()), None, n(Uncompared::NotCopied));
        case(Some(source()), Some(tombstone), n(Uncompared::Deleted));
        case(
            Some(source()),
            Some(copied_tombstone),
            n(Uncompared::Deleted),
        );
        case(Some(source()), Some(app), n(Uncompared::Superseded));
        case(Some(source()), Some(stays), n(Uncompared::NotACopy));
        case(None, Some(copy(5)), n(Uncompared::SourceGone));
        let source_tombstone = doc! { "_id": "o-1", "_reshard": { "deleted": true } };
        case(
            Some(source_tombstone),
            Some(copy(6)),
            n(Uncompared::SourceGone),
        );
        case(None, None, n(Uncompared::NotCopied));
    }

    #[test]
    fn only_comparisons_count_as_compared() {
        assert!(Verdict::Equal.compared());
        assert!(Verdict::Mismatch { fields: vec![] }.compared());
        assert!(!Verdict::NotCompared(Uncompared::NotCopied).compared());
    }

    #[test]
    fn reads_are_shadowed_only_while_the_target_is_read_first_and_the_source_is_still() {
        use crate::phase::ReadPath;
        let all = [
            Phase::Planned,
            Phase::DualRead,
            Phase::WriteSwitch,
            Phase::NewWrites,
            Phase::Backfill,
            Phase::Reconcile,
            Phase::NewReads,
            Phase::Cleanup,
            Phase::Completed,
            Phase::Reverting,
            Phase::RevertSwitch,
            Phase::RolledBack,
        ];
        for phase in all {
            let want = phase.read_path() == ReadPath::TargetThenSource && phase != Phase::Reverting;
            assert_eq!(applies(phase), want, "{phase}");
        }
        assert!(applies(Phase::Reconcile) && !applies(Phase::Reverting));
    }

    #[test]
    fn sampling_follows_the_percentage() {
        assert!(!sampled(0.0, 0.0));
        assert!(sampled(100.0, 0.999_999));
        assert!(sampled(10.0, 0.099));
        assert!(!sampled(10.0, 0.1));
        let hits = (0..1000)
            .filter(|i| sampled(10.0, f64::from(*i) / 1000.0))
            .count();
        assert_eq!(hits, 100);
    }
}

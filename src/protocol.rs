//! The write protocol as pure decisions: what a router operation, a backfill copy or a cleanup
//! deletion does next, given the phase and what its last step answered.
//!
//! Every operation is a small state machine over single-document steps, each of which MongoDB
//! makes atomic (a find, an insert, a conditional replace, a conditional update, a delete by
//! `_id`). The router executes the steps against real shards; the model checker in
//! `tests/protocol_model.rs` executes the very same machines against an in-memory store and
//! explores every interleaving. Keeping the decisions here, free of I/O, is what lets the model
//! check the product rather than a description of it.
//!
//! The rules they implement (DESIGN.md, "Write protocol"):
//! - while the target is authoritative, writes go to the target; a document that only exists in
//!   the source is copied with insert-if-absent before a partial update;
//! - a delete writes a tombstone, which makes every later insert-if-absent of the old copy fail,
//!   so a delete can never be resurrected; re-creating a deleted id replaces its tombstone;
//! - reads look at the target first, then at the source while the phase still reads it, and a
//!   tombstone means "not found";
//! - the copier inserts if absent; cleanup deletes a source document only once the target holds
//!   a copy or a tombstone of it;
//! - while rolling back (`reverting`), every write to the target is mirrored to the source by
//!   revision, so that the source holds the newest data once writes move back to it;
//! - the locations a `fanout` source lists for an id hold one document of it between them, as
//!   one collection would: every step goes where that document is ([`listed_location`],
//!   [`mirror_location`]), and only an id held nowhere is inserted, at the first listed one.
//!
//! Revisions: every application write or tombstone the executor puts in the target carries
//! `_reshard.rev` = the previous revision of that id in the target + 1, computed atomically by
//! the write itself (a pipeline update or `$inc`); a copy carries revision 0, and source
//! documents written before the migration have none (read as 0). Target revisions of an id only
//! grow, because nothing deletes a target document before cleanup. The machines never see
//! revisions: only [`Step::MirrorToSource`] compares them, inside the executor.

use crate::disposition::Disposition;
use crate::phase::{Phase, ReadPath, WritePath};
use crate::routing::Location;

pub use crate::phase::Side;

/// A document a step writes. The executor materialises it: the product stamps `_reshard`
/// fields (source of the write, epoch, routing field); the model keeps plain values.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Payload<D> {
    /// A document the application wrote (`_reshard.src = "app"`).
    App(D),
    /// A pristine copy of a source document (`_reshard.src = "copy"`).
    Copy(D),
    /// The marker that the id was deleted while the source may still hold a copy.
    Tombstone,
}

/// What a lookup of one id on one side found.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Found<D> {
    Absent,
    Live(D),
    Tombstone,
}

/// One single-document step against one side. Each is atomic in MongoDB.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Step<D, U> {
    /// Find the id. Answered by [`Answer::Found`].
    Find(Side),
    /// Insert; fails with a duplicate key if any document (live or tombstone) holds the id.
    /// Answered by [`Answer::Inserted`] or [`Answer::DuplicateKey`].
    Insert(Side, Payload<D>),
    /// Replace the document only if it is live (filter `_reshard.deleted != true`), never
    /// upserting. Answered by [`Answer::Matched`].
    ReplaceLive(Side, Payload<D>),
    /// Replace the document only if it is a tombstone. Answered by [`Answer::Matched`].
    ReplaceTombstone(Side, Payload<D>),
    /// Apply a partial update to the live document, if there is one. Answered by
    /// [`Answer::Matched`].
    UpdateLive(Side, U),
    /// Delete whatever document holds the id. Answered by [`Answer::Matched`].
    Delete(Side),
    /// Delete the document only if it is live (filter `_reshard.deleted != true`). Answered by
    /// [`Answer::Matched`].
    DeleteLive(Side),
    /// Delete the document only if it is a tombstone: the purge. Answered by
    /// [`Answer::Matched`].
    DeleteTombstone(Side),
    /// Replace the document only if it is a live pristine copy (written by a copier and by no
    /// one since): a repair's second try. Answered by [`Answer::Matched`].
    ReplaceCopy(Side, Payload<D>),
    /// Carry the target's document of the id (live or tombstone) to the source, unless the
    /// source already holds an equal or higher revision. Two single-document operations, in
    /// this order: read the target document with its revision `r` (absent: nothing to do,
    /// answer `Matched(false)`); then replace the source document with that image, upserting,
    /// only where the source's revision is lower than `r` (filter
    /// `_reshard.rev: {$not: {$gte: r}}`; the duplicate key of the failed upsert means the
    /// source is already newer). Answered by [`Answer::Matched`]: whether the source changed.
    /// Mirrors of one id may land in any order; the revision makes the newest one win.
    MirrorToSource,
}

impl<D, U> Step<D, U> {
    /// Whether the step can change a document.
    pub fn writes(&self) -> bool {
        !matches!(self, Step::Find(_))
    }
}

/// What the store answered to the last step.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Answer<D> {
    Found(Found<D>),
    Inserted,
    DuplicateKey,
    /// Whether a document matched the step's filter (and so was changed).
    Matched(bool),
}

/// An operation of the router's API on one document.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Operation<D, U> {
    Get,
    /// Insert a new document; refused when the id exists in either layout.
    Insert(D),
    /// Replace the whole document; with `upsert`, create it when absent.
    Replace {
        doc: D,
        upsert: bool,
    },
    /// Apply a partial update.
    Update(U),
    Delete,
}

/// The result an operation reports to the application.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Outcome<D> {
    /// `Get`: the document, or `None` when it does not exist.
    Read(Option<D>),
    /// `Insert`: done.
    Inserted,
    /// `Insert`: the id already exists.
    Duplicate,
    /// `Replace`, `Update`, `Delete`: whether a document was changed.
    Changed(bool),
    /// The phase holds writes (the write switch); retry once the phase has moved on.
    Held,
}

/// What to do next: run a step and feed its answer back, or report the outcome.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Next<D, U> {
    Do(Step<D, U>),
    Done(Outcome<D>),
}

/// Where the machine stands; the step it last asked for determines how the answer is read.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum At {
    Start,
    /// Get: looked in the target / in the source; in `revert_switch`, carried the target's
    /// document to the source before looking there.
    GetTarget,
    GetSource,
    GetMirror,
    /// Insert: looked in the target; looked in the source; re-checked the target after
    /// finding the id in the source; replacing a tombstone; inserting.
    InsFindTarget,
    InsFindSource,
    InsRecheckTarget,
    InsReplaceTombstone,
    InsInsert,
    /// Replace: replacing the live target document; looking in the target; in the source;
    /// replacing a tombstone; inserting.
    RepLive,
    RepFindTarget,
    RepFindSource,
    RepReplaceTombstone,
    RepInsert,
    /// Update: updating the live target document; looking in the source; copying the
    /// source document into the target; updating again after the copy.
    UpdLive,
    UpdFindSource,
    UpdCopy,
    UpdAfterCopy,
    /// Delete: looking in the target; in the source; tombstoning the live target document;
    /// inserting a tombstone where only the source had the document.
    DelFindTarget,
    DelFindSource,
    DelReplaceLive,
    DelInsertTombstone,
    /// Delete once the migration completed: the source is gone, no tombstone is needed.
    DelPlain,
    /// Writes to the source layout (before the write switch, and after a rollback, when the
    /// source may hold tombstones mirrored from the target): inserting; the id was taken, so
    /// looking at what holds it; replacing a tombstone; replacing the live document; looking
    /// after no live document matched; replacing a tombstone for an upsert; inserting for an
    /// upsert; updating; deleting.
    SrcInsert,
    SrcInsFind,
    SrcInsReplaceTombstone,
    SrcReplace,
    SrcRepFind,
    SrcRepReplaceTombstone,
    SrcUpsertInsert,
    SrcUpdate,
    SrcDelete,
    /// Rolling back: the write to the target is done; carrying it to the source.
    Mirror,
    Finished,
}

/// A router operation in progress. Feed [`OperationMachine::next`] the answer to each step
/// until it returns [`Next::Done`].
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct OperationMachine<D, U> {
    read: ReadPath,
    write: WritePath,
    op: Operation<D, U>,
    at: At,
    /// Restarts caused by concurrent writers; bounded so a pathological loop surfaces.
    restarts: u32,
    /// The outcome of an operation whose mirror to the source is in flight.
    mirrored: Option<Outcome<D>>,
    /// Whether a delete leaves a tombstone: in every phase but `completed`.
    tombstones: bool,
    /// `revert_switch`: a read carries the target's document of the id to the source first
    /// (its writer may have been cut off by its lease before mirroring it), then reads the
    /// source, so that it agrees with readers still in `reverting`.
    mirror_then_read: bool,
    /// `rolled_back` until it is sealed: deletes leave a source tombstone (a late mirror of
    /// an older target image by a router still in `revert_switch` must not bring the
    /// document back); once every router acknowledged `rolled_back` the driver seals it, and
    /// after every router acknowledged the seal it purges the source tombstones.
    source_tombstones: bool,
    /// Whether a step that can change a document was sent: one that was answered, or an
    /// earlier one (the executor sends a step before it feeds back its answer).
    wrote: bool,
    /// Whether the step asked for last can change a document.
    pending_write: bool,
}

/// What an operation cut short by its router's lease may have done. The router stops before
/// each step once its lease is about to run out, and every step it sent ends before the lease
/// does (ARCHITECTURE.md, "Leases fence every step"), so nothing of the operation can land
/// after the driver counts the router out: it either happened by then or never will.
/// [`OperationMachine::interrupted`] tells which, for an operation stopped before the step it
/// asked for last was sent; [`OperationMachine::interrupted_in_flight`] once that step was
/// sent and its answer did not come.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Interrupted {
    /// Only reads were sent: nothing changed.
    NothingApplied,
    /// A write was sent: it may or may not have been applied (like MongoDB's unknown commit
    /// result); read the document back, or retry an idempotent write.
    MayHaveApplied,
}

/// How many times an operation may start over because a concurrent writer changed the
/// document between two of its steps. Every restart means another writer made progress.
pub const MAX_RESTARTS: u32 = 16;

/// The protocol was driven with an answer its last step cannot produce, or a document kept
/// changing under an operation.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ProtocolError {
    #[error("answer {answer} does not fit step {at}")]
    UnexpectedAnswer { at: String, answer: String },
    #[error("the document changed under the operation {0} times in a row; try again")]
    Contention(u32),
}

impl<D: Clone + std::fmt::Debug, U: Clone + std::fmt::Debug> OperationMachine<D, U> {
    /// Starts `op` under `phase`. The phase is fixed for the operation's whole life: the
    /// router drains operations of an old epoch before it acknowledges a new one.
    pub fn new(phase: Phase, op: Operation<D, U>) -> Self {
        OperationMachine {
            read: phase.read_path(),
            write: phase.write_path(),
            op,
            at: At::Start,
            restarts: 0,
            mirrored: None,
            tombstones: phase != Phase::Completed,
            mirror_then_read: phase == Phase::RevertSwitch,
            source_tombstones: phase == Phase::RolledBack,
            wrote: false,
            pending_write: false,
        }
    }

    /// The machine of a migration that rolled back and was sealed (no mirror can land any
    /// more): deletes remove the source document without a tombstone.
    pub fn sealed(mut self, sealed: bool) -> Self {
        if sealed {
            self.source_tombstones = false;
        }
        self
    }

    /// What the operation may have done if it stops before sending the step it asked for last
    /// (its router's lease is running out).
    pub fn interrupted(&self) -> Interrupted {
        if self.wrote {
            Interrupted::MayHaveApplied
        } else {
            Interrupted::NothingApplied
        }
    }

    /// What the operation may have done if it stops while the step it asked for last is in
    /// flight (sent, no answer by the lease's deadline).
    pub fn interrupted_in_flight(&self) -> Interrupted {
        if self.wrote || self.pending_write {
            Interrupted::MayHaveApplied
        } else {
            Interrupted::NothingApplied
        }
    }

    fn reads_source(&self) -> bool {
        matches!(self.read, ReadPath::Source | ReadPath::TargetThenSource)
    }

    fn go(&mut self, at: At, step: Step<D, U>) -> Result<Next<D, U>, ProtocolError> {
        self.at = at;
        self.pending_write = step.writes();
        Ok(Next::Do(step))
    }

    fn done(&mut self, outcome: Outcome<D>) -> Result<Next<D, U>, ProtocolError> {
        // While rolling back, every operation reports only once the target document it acted
        // on or looked at is mirrored to the source: whatever anyone was told (a write, a
        // read, a duplicate, a miss) is then in the source too, which is what lets
        // `revert_switch` read the source (after one mirror of its own, for an operation a
        // lease cut off before its mirror) while late mirrors are still in flight.
        if self.write == WritePath::TargetMirroredToSource && self.at != At::Mirror {
            self.mirrored = Some(outcome);
            return self.go(At::Mirror, Step::MirrorToSource);
        }
        self.at = At::Finished;
        Ok(Next::Done(outcome))
    }

    fn restart(&mut self) -> Result<Next<D, U>, ProtocolError> {
        self.restarts += 1;
        if self.restarts > MAX_RESTARTS {
            return Err(ProtocolError::Contention(self.restarts - 1));
        }
        self.at = At::Start;
        self.next(None)
    }

    /// The next step, given the answer to the previous one (`None` to start).
    pub fn next(&mut self, answer: Option<Answer<D>>) -> Result<Next<D, U>, ProtocolError> {
        use Answer as A;
        if answer.is_some() {
            self.wrote |= std::mem::take(&mut self.pending_write);
        }
        use Side::{Source as S, Target as T};
        let unexpected = |at: &At, answer: &Option<Answer<D>>| ProtocolError::UnexpectedAnswer {
            at: format!("{at:?}"),
            answer: format!("{answer:?}"),
        };
        match (&self.at, answer) {
            (At::Start, None) => self.start(),

            // Get.
            (At::GetTarget, Some(A::Found(Found::Live(d)))) => self.done(Outcome::Read(Some(d))),
            (At::GetTarget, Some(A::Found(Found::Tombstone))) => self.done(Outcome::Read(None)),
            (At::GetTarget, Some(A::Found(Found::Absent))) => {
                if self.read == ReadPath::TargetThenSource {
                    self.go(At::GetSource, Step::Find(S))
                } else {
                    self.done(Outcome::Read(None))
                }
            }
            (At::GetMirror, Some(A::Matched(_))) => self.go(At::GetSource, Step::Find(S)),
            (At::GetSource, Some(A::Found(found))) => self.done(Outcome::Read(match found {
                Found::Live(d) => Some(d),
                Found::Absent | Found::Tombstone => None,
            })),

            // Insert into the target.
            (At::InsFindTarget, Some(A::Found(Found::Live(_)))) => self.done(Outcome::Duplicate),
            (At::InsFindTarget, Some(A::Found(Found::Tombstone)))
            | (At::InsRecheckTarget, Some(A::Found(Found::Tombstone))) => {
                let doc = self.app_doc();
                self.go(At::InsReplaceTombstone, Step::ReplaceTombstone(T, doc))
            }
            (At::InsFindTarget, Some(A::Found(Found::Absent))) => {
                if self.reads_source() {
                    self.go(At::InsFindSource, Step::Find(S))
                } else {
                    let doc = self.app_doc();
                    self.go(At::InsInsert, Step::Insert(T, doc))
                }
            }
            (At::InsFindSource, Some(A::Found(Found::Live(_)))) => {
                // The id sits in the source; it is a duplicate unless it was deleted (by a
                // tombstone in the target) since the first look.
                self.go(At::InsRecheckTarget, Step::Find(T))
            }
            (At::InsFindSource, Some(A::Found(_))) => {
                let doc = self.app_doc();
                self.go(At::InsInsert, Step::Insert(T, doc))
            }
            (At::InsRecheckTarget, Some(A::Found(_))) => self.done(Outcome::Duplicate),
            (At::InsReplaceTombstone, Some(A::Matched(true)))
            | (At::InsInsert, Some(A::Inserted)) => self.done(Outcome::Inserted),
            (At::InsReplaceTombstone, Some(A::Matched(false)))
            | (At::InsInsert, Some(A::DuplicateKey)) => self.restart(),

            // Replace in the target.
            (At::RepLive, Some(A::Matched(true))) => self.done(Outcome::Changed(true)),
            (At::RepLive, Some(A::Matched(false))) => self.go(At::RepFindTarget, Step::Find(T)),
            (At::RepFindTarget, Some(A::Found(Found::Live(_)))) => self.restart(),
            (At::RepFindTarget, Some(A::Found(Found::Tombstone))) => {
                if self.upsert() {
                    let doc = self.app_doc();
                    self.go(At::RepReplaceTombstone, Step::ReplaceTombstone(T, doc))
                } else {
                    self.done(Outcome::Changed(false))
                }
            }
            (At::RepFindTarget, Some(A::Found(Found::Absent))) => {
                if self.reads_source() {
                    self.go(At::RepFindSource, Step::Find(S))
                } else {
                    self.replace_absent()
                }
            }
            (At::RepFindSource, Some(A::Found(Found::Live(_)))) => {
                // The document lives in the source only: its replacement goes to the target,
                // where it wins over the source copy.
                let doc = self.app_doc();
                self.go(At::RepInsert, Step::Insert(T, doc))
            }
            (At::RepFindSource, Some(A::Found(_))) => self.replace_absent(),
            (At::RepReplaceTombstone, Some(A::Matched(true)))
            | (At::RepInsert, Some(A::Inserted)) => self.done(Outcome::Changed(true)),
            (At::RepReplaceTombstone, Some(A::Matched(false)))
            | (At::RepInsert, Some(A::DuplicateKey)) => self.restart(),

            // Partial update in the target, with copy-on-write from the source.
            (At::UpdLive, Some(A::Matched(true))) => self.done(Outcome::Changed(true)),
            (At::UpdLive, Some(A::Matched(false))) => {
                if self.reads_source() {
                    self.go(At::UpdFindSource, Step::Find(S))
                } else {
                    self.done(Outcome::Changed(false))
                }
            }
            (At::UpdFindSource, Some(A::Found(Found::Live(d)))) => {
                self.go(At::UpdCopy, Step::Insert(T, Payload::Copy(d)))
            }
            (At::UpdFindSource, Some(A::Found(_))) => self.done(Outcome::Changed(false)),
            // Inserted, or someone else put a copy, a newer version or a tombstone there
            // first: either way the update now applies to whatever the target holds.
            (At::UpdCopy, Some(A::Inserted | A::DuplicateKey)) => {
                let update = self.update();
                self.go(At::UpdAfterCopy, Step::UpdateLive(T, update))
            }
            (At::UpdAfterCopy, Some(A::Matched(changed))) => self.done(Outcome::Changed(changed)),

            // Delete in the target: a tombstone, conditional so that exactly one of two
            // concurrent deletes reports the document as deleted.
            (At::DelFindTarget, Some(A::Found(Found::Live(_)))) => {
                self.go(At::DelReplaceLive, Step::ReplaceLive(T, Payload::Tombstone))
            }
            (At::DelFindTarget, Some(A::Found(Found::Tombstone))) => {
                self.done(Outcome::Changed(false))
            }
            (At::DelFindTarget, Some(A::Found(Found::Absent))) => {
                if self.reads_source() {
                    self.go(At::DelFindSource, Step::Find(S))
                } else {
                    self.done(Outcome::Changed(false))
                }
            }
            (At::DelFindSource, Some(A::Found(Found::Live(_)))) => {
                self.go(At::DelInsertTombstone, Step::Insert(T, Payload::Tombstone))
            }
            (At::DelFindSource, Some(A::Found(_))) => self.done(Outcome::Changed(false)),
            (At::DelReplaceLive, Some(A::Matched(true)))
            | (At::DelInsertTombstone, Some(A::Inserted)) => self.done(Outcome::Changed(true)),
            (At::DelReplaceLive, Some(A::Matched(false)))
            | (At::DelInsertTombstone, Some(A::DuplicateKey)) => self.restart(),
            (At::DelPlain, Some(A::Matched(changed))) => self.done(Outcome::Changed(changed)),

            // Writes to the source layout. Before the write switch these are plain MongoDB
            // semantics; after a rollback the source may hold tombstones that mirrors left
            // there, which count as absent and which a re-creation replaces.
            (At::SrcInsert, Some(A::Inserted)) => self.done(Outcome::Inserted),
            (At::SrcInsert, Some(A::DuplicateKey)) => self.go(At::SrcInsFind, Step::Find(S)),
            (At::SrcInsFind, Some(A::Found(Found::Live(_)))) => self.done(Outcome::Duplicate),
            (At::SrcInsFind, Some(A::Found(Found::Tombstone))) => {
                let doc = self.app_doc();
                self.go(At::SrcInsReplaceTombstone, Step::ReplaceTombstone(S, doc))
            }
            (At::SrcInsFind, Some(A::Found(Found::Absent))) => self.restart(),
            (At::SrcInsReplaceTombstone, Some(A::Matched(true))) => self.done(Outcome::Inserted),
            (At::SrcReplace, Some(A::Matched(true))) => self.done(Outcome::Changed(true)),
            (At::SrcReplace, Some(A::Matched(false))) => {
                if self.upsert() {
                    self.go(At::SrcRepFind, Step::Find(S))
                } else {
                    self.done(Outcome::Changed(false))
                }
            }
            (At::SrcRepFind, Some(A::Found(Found::Live(_)))) => self.restart(),
            (At::SrcRepFind, Some(A::Found(Found::Tombstone))) => {
                let doc = self.app_doc();
                self.go(At::SrcRepReplaceTombstone, Step::ReplaceTombstone(S, doc))
            }
            (At::SrcRepFind, Some(A::Found(Found::Absent))) => {
                let doc = self.app_doc();
                self.go(At::SrcUpsertInsert, Step::Insert(S, doc))
            }
            (At::SrcUpsertInsert, Some(A::Inserted))
            | (At::SrcRepReplaceTombstone, Some(A::Matched(true))) => {
                self.done(Outcome::Changed(true))
            }
            (At::SrcUpsertInsert, Some(A::DuplicateKey))
            | (At::SrcInsReplaceTombstone, Some(A::Matched(false)))
            | (At::SrcRepReplaceTombstone, Some(A::Matched(false))) => self.restart(),
            (At::SrcUpdate, Some(A::Matched(changed)))
            | (At::SrcDelete, Some(A::Matched(changed))) => self.done(Outcome::Changed(changed)),

            // Rolling back: the mirror landed or was superseded by a newer one; either way the
            // source now holds this write or a later one.
            (At::Mirror, Some(A::Matched(_))) => match self.mirrored.take() {
                Some(outcome) => self.done(outcome),
                None => Err(unexpected(&self.at, &Some(A::Matched(false)))),
            },

            (at, answer) => Err(unexpected(at, &answer)),
        }
    }

    fn start(&mut self) -> Result<Next<D, U>, ProtocolError> {
        use Side::{Source as S, Target as T};
        if let Operation::Get = self.op {
            return match self.read {
                ReadPath::Source if self.mirror_then_read => {
                    self.go(At::GetMirror, Step::MirrorToSource)
                }
                ReadPath::Source => self.go(At::GetSource, Step::Find(S)),
                ReadPath::TargetThenSource | ReadPath::Target => {
                    self.go(At::GetTarget, Step::Find(T))
                }
            };
        }
        match self.write {
            WritePath::Held => self.done(Outcome::Held),
            WritePath::Source => match self.op.clone() {
                Operation::Get => unreachable_get(),
                Operation::Insert(d) => self.go(At::SrcInsert, Step::Insert(S, Payload::App(d))),
                Operation::Replace { doc, .. } => {
                    self.go(At::SrcReplace, Step::ReplaceLive(S, Payload::App(doc)))
                }
                Operation::Update(u) => self.go(At::SrcUpdate, Step::UpdateLive(S, u)),
                // Only a live document: a tombstone left by a rollback's mirror is absent.
                Operation::Delete if self.source_tombstones => {
                    self.go(At::SrcDelete, Step::ReplaceLive(S, Payload::Tombstone))
                }
                Operation::Delete => self.go(At::SrcDelete, Step::DeleteLive(S)),
            },
            // Rolling back takes the same decisions in the target, then mirrors the write to
            // the source (see `done`).
            WritePath::Target | WritePath::TargetMirroredToSource => match self.op.clone() {
                Operation::Get => unreachable_get(),
                Operation::Insert(_) => self.go(At::InsFindTarget, Step::Find(T)),
                Operation::Replace { doc, .. } => {
                    self.go(At::RepLive, Step::ReplaceLive(T, Payload::App(doc)))
                }
                Operation::Update(u) => self.go(At::UpdLive, Step::UpdateLive(T, u)),
                // Once completed, nothing can copy the id back from the source, so a delete
                // leaves no tombstone behind for the purge to chase.
                Operation::Delete if !self.tombstones => self.go(At::DelPlain, Step::DeleteLive(T)),
                Operation::Delete => self.go(At::DelFindTarget, Step::Find(T)),
            },
        }
    }

    fn replace_absent(&mut self) -> Result<Next<D, U>, ProtocolError> {
        if self.upsert() {
            let doc = self.app_doc();
            self.go(At::RepInsert, Step::Insert(Side::Target, doc))
        } else {
            self.done(Outcome::Changed(false))
        }
    }

    fn app_doc(&self) -> Payload<D> {
        match &self.op {
            Operation::Insert(d) | Operation::Replace { doc: d, .. } => Payload::App(d.clone()),
            Operation::Get | Operation::Update(_) | Operation::Delete => {
                panic!("only insert and replace carry a document")
            }
        }
    }

    fn update(&self) -> U {
        match &self.op {
            Operation::Update(u) => u.clone(),
            _ => panic!("only update carries an update"),
        }
    }

    fn upsert(&self) -> bool {
        matches!(self.op, Operation::Replace { upsert: true, .. })
    }
}

fn unreachable_get<T>() -> T {
    panic!("get is handled before the write path is consulted")
}

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

/// The revert copier's one step per target id: carry the target document back to the source
/// by revision. It must start only once every live router acknowledged `reverting` (a router
/// still in an earlier epoch writes the target without mirroring, and the copier may have
/// passed that id already); from then on routers mirror their own writes, and the copier
/// carries back everything written before. A router whose lease lapses after the pass began
/// may have left a write unmirrored behind it: the pass is then outdated and runs again
/// (ARCHITECTURE.md, "A lapse outdates the copy back").
pub fn revert_copy_step<D, U>() -> Step<D, U> {
    Step::MirrorToSource
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
        | Step::DeleteTombstone(_) => at(holder, Answer::Matched(false)),
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
        Found::Live(_) | Found::Tombstone => CleanupDecision::DeleteSource,
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
    use Side::{Source as S, Target as T};

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

    type Script<'a> = &'a [(Step<&'static str, &'static str>, Answer<&'static str>)];

    /// Runs `op` in `phase`, checking that it asks for each scripted step in turn and feeding
    /// it the scripted answer; returns the outcome.
    fn run(
        phase: Phase,
        op: Operation<&'static str, &'static str>,
        script: Script,
    ) -> Outcome<&'static str> {
        let mut machine = OperationMachine::new(phase, op);
        let mut next = machine.next(None).unwrap();
        for (i, (step, answer)) in script.iter().enumerate() {
            match next {
                Next::Do(asked) => assert_eq!(&asked, step, "step {i} in {phase}"),
                Next::Done(outcome) => panic!("done with {outcome:?} before step {i}"),
            }
            next = machine.next(Some(answer.clone())).unwrap();
        }
        match next {
            Next::Done(outcome) => outcome,
            Next::Do(step) => panic!("asked for {step:?} after the script"),
        }
    }

    #[test]
    fn reverting_mirrors_before_reporting_whatever_the_answer() {
        let cases: &[(Operation<_, _>, Script, Outcome<_>)] = &[
            (
                Operation::Update("u"),
                &[
                    (Step::UpdateLive(T, "u"), Answer::Matched(true)),
                    (Step::MirrorToSource, Answer::Matched(false)),
                ],
                Outcome::Changed(true),
            ),
            (
                Operation::Get,
                &[
                    (Step::Find(T), Answer::Found(Found::Live("d"))),
                    (Step::MirrorToSource, Answer::Matched(true)),
                ],
                Outcome::Read(Some("d")),
            ),
            (
                Operation::Insert("d"),
                &[
                    (Step::Find(T), Answer::Found(Found::Live("e"))),
                    (Step::MirrorToSource, Answer::Matched(true)),
                ],
                Outcome::Duplicate,
            ),
            (
                Operation::Delete,
                &[
                    (Step::Find(T), Answer::Found(Found::Live("e"))),
                    (
                        Step::ReplaceLive(T, Payload::Tombstone),
                        Answer::Matched(true),
                    ),
                    (Step::MirrorToSource, Answer::Matched(true)),
                ],
                Outcome::Changed(true),
            ),
        ];
        for (op, script, outcome) in cases {
            assert_eq!(
                run(Phase::Reverting, op.clone(), script),
                *outcome,
                "{op:?}"
            );
        }
    }

    #[test]
    fn after_a_rollback_source_tombstones_count_as_absent() {
        let cases: &[(Phase, Operation<_, _>, Script, Outcome<_>)] = &[
            (
                Phase::RolledBack,
                Operation::Insert("d"),
                &[
                    (Step::Insert(S, Payload::App("d")), Answer::DuplicateKey),
                    (Step::Find(S), Answer::Found(Found::Tombstone)),
                    (
                        Step::ReplaceTombstone(S, Payload::App("d")),
                        Answer::Matched(true),
                    ),
                ],
                Outcome::Inserted,
            ),
            (
                Phase::RolledBack,
                Operation::Insert("d"),
                &[
                    (Step::Insert(S, Payload::App("d")), Answer::DuplicateKey),
                    (Step::Find(S), Answer::Found(Found::Live("e"))),
                ],
                Outcome::Duplicate,
            ),
            (
                Phase::RolledBack,
                Operation::Replace {
                    doc: "d",
                    upsert: true,
                },
                &[
                    (
                        Step::ReplaceLive(S, Payload::App("d")),
                        Answer::Matched(false),
                    ),
                    (Step::Find(S), Answer::Found(Found::Tombstone)),
                    (
                        Step::ReplaceTombstone(S, Payload::App("d")),
                        Answer::Matched(true),
                    ),
                ],
                Outcome::Changed(true),
            ),
            // A delete after a rollback leaves a source tombstone: a late mirror of an older
            // target image must not bring the document back before the purge.
            (
                Phase::RolledBack,
                Operation::Delete,
                &[(
                    Step::ReplaceLive(S, Payload::Tombstone),
                    Answer::Matched(false),
                )],
                Outcome::Changed(false),
            ),
            // In the revert switch a read carries the target's image to the source first.
            (
                Phase::RevertSwitch,
                Operation::Get,
                &[
                    (Step::MirrorToSource, Answer::Matched(false)),
                    (Step::Find(S), Answer::Found(Found::Tombstone)),
                ],
                Outcome::Read(None),
            ),
        ];
        for (phase, op, script, outcome) in cases {
            assert_eq!(run(*phase, op.clone(), script), *outcome, "{phase} {op:?}");
        }
    }

    #[test]
    fn a_completed_migration_deletes_without_a_tombstone() {
        let script: Script = &[(Step::DeleteLive(T), Answer::Matched(true))];
        assert_eq!(
            run(Phase::Completed, Operation::Delete, script),
            Outcome::Changed(true)
        );
        let script: Script = &[
            (Step::Find(T), Answer::Found(Found::Live("d"))),
            (
                Step::ReplaceLive(T, Payload::Tombstone),
                Answer::Matched(true),
            ),
        ];
        assert_eq!(
            run(Phase::Cleanup, Operation::Delete, script),
            Outcome::Changed(true)
        );
    }

    #[test]
    fn an_interrupted_operation_knows_whether_it_wrote() {
        let mut m: OperationMachine<&str, &str> =
            OperationMachine::new(Phase::Backfill, Operation::Delete);
        assert_eq!(m.interrupted(), Interrupted::NothingApplied);
        assert_eq!(m.next(None).unwrap(), Next::Do(Step::Find(T)));
        assert_eq!(m.interrupted(), Interrupted::NothingApplied);
        let tombstone = m.next(Some(Answer::Found(Found::Live("d")))).unwrap();
        assert_eq!(
            tombstone,
            Next::Do(Step::ReplaceLive(T, Payload::Tombstone))
        );
        // Asked for but not sent: nothing happened. Sent without an answer: it may have.
        assert_eq!(m.interrupted(), Interrupted::NothingApplied);
        assert_eq!(m.interrupted_in_flight(), Interrupted::MayHaveApplied);
        // Answered: it happened, whatever comes next.
        let mut m2 = m.clone();
        assert!(m2.next(Some(Answer::Matched(false))).is_ok());
        assert_eq!(m2.interrupted(), Interrupted::MayHaveApplied);
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
    fn a_pending_delete_counts_as_applied_once_and_only_when_its_id_is_gone() {
        let present: std::collections::HashSet<&str> = ["b", "d"].into_iter().collect();
        assert_eq!(applied_pending_deletes(&["a", "b", "c", "d"], &present), 2);
        // An id sent twice (two attempts sent the same batch) was deleted once.
        assert_eq!(applied_pending_deletes(&["a", "a", "b"], &present), 1);
        assert_eq!(applied_pending_deletes(&["b", "d"], &present), 0);
        assert_eq!(applied_pending_deletes::<&str>(&[], &present), 0);
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

    #[test]
    fn writes_are_held_in_both_switches() {
        for phase in [Phase::WriteSwitch, Phase::RevertSwitch] {
            assert_eq!(run(phase, Operation::Delete, &[]), Outcome::Held, "{phase}");
        }
    }
}

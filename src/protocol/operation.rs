//! The router's operations as state machines over single-document steps: what an insert,
//! a replace, an update, a delete or a read does next in a phase, given the answer to its last
//! step.

use super::{Answer, Found, Payload, Side, Step};
use crate::phase::{Phase, ReadPath, WritePath};

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
    /// Apply a partial update, or, when no document matches (none holds the id, it was
    /// deleted, or the operation's condition fails: [`Found::Unmatched`]), insert `insert`:
    /// MongoDB's update with `upsert: true`. The caller builds `insert` from the query's
    /// equality fields and the update. After the insert meets a document holding the id
    /// (another upsert inserted it first), the update is tried once more, as MongoDB's own
    /// upsert retries on a duplicate key; a second duplicate is reported.
    Upsert {
        update: U,
        insert: D,
    },
}

/// The result an operation reports to the application.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Outcome<D> {
    /// `Get`: the document, or `None` when it does not exist.
    Read(Option<D>),
    /// `Insert`: done. `Upsert`: no document matched, and `insert` was inserted. `Replace`
    /// with `upsert`: no document held the id (or only a tombstone did), and `doc` was
    /// inserted, which MongoDB reports as an upsert (`upserted`, `matched: 0`).
    Inserted,
    /// `Insert`: the id already exists. `Upsert`, and `Replace` with `upsert`: a document
    /// holds the id but does not match the condition, so the insert would duplicate it.
    Duplicate,
    /// `Replace`, `Update`, `Delete`: whether a document was changed. `Upsert`: `true`, a
    /// document matched and was updated.
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
    /// replacing a tombstone (an upsert); inserting over a source-only document; inserting a
    /// new one (an upsert).
    RepLive,
    RepFindTarget,
    RepFindSource,
    RepReplaceTombstone,
    RepInsert,
    RepUpsertInsert,
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
    /// Upsert into the target: updating the live target document; looking in the source;
    /// copying the source document into the target; updating again after the copy. When
    /// nothing matched, the insert's states follow with the document to insert.
    UpsLive,
    UpsFindSource,
    UpsCopy,
    UpsAfterCopy,
    /// Upsert into the source: updating; when nothing matched, the insert's states follow.
    SrcUpsUpdate,
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
    /// An upsert whose insert met a document holding the id, and which tried its update
    /// again: the next such duplicate is reported.
    upsert_retried: bool,
}

/// What an operation cut short by its router's lease may have done. The router stops before
/// each step once its lease is about to run out, and every step it sent ends before the lease
/// does (docs/decisions/0006-leases-fence-every-step.md), so nothing of the operation can land
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
            upsert_retried: false,
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

    /// The outcome an operation has decided while rolling back, waiting for the mirror that
    /// carries the target document it acted on or looked at to the source before it reports
    /// ([`Step::MirrorToSource`] is the step asked for): what a many-document read answers
    /// without mirroring (see `protocol::query`).
    pub fn decided(&self) -> Option<&Outcome<D>> {
        match self.at {
            At::Mirror => self.mirrored.as_ref(),
            _ => None,
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
            // A tombstone, or a live document the condition does not match: the target's
            // document supersedes whatever the source holds.
            (At::GetTarget, Some(A::Found(Found::Tombstone | Found::Unmatched))) => {
                self.done(Outcome::Read(None))
            }
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
                Found::Absent | Found::Tombstone | Found::Unmatched => None,
            })),

            // Insert into the target.
            (At::InsFindTarget, Some(A::Found(Found::Live(_) | Found::Unmatched))) => {
                self.duplicate()
            }
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
            (At::InsFindSource, Some(A::Found(Found::Live(_) | Found::Unmatched))) => {
                // The id sits in the source; it is a duplicate unless it was deleted (by a
                // tombstone in the target) since the first look.
                self.go(At::InsRecheckTarget, Step::Find(T))
            }
            (At::InsFindSource, Some(A::Found(_))) => {
                let doc = self.app_doc();
                self.go(At::InsInsert, Step::Insert(T, doc))
            }
            (At::InsRecheckTarget, Some(A::Found(_))) => self.duplicate(),
            (At::InsReplaceTombstone, Some(A::Matched(true)))
            | (At::InsInsert, Some(A::Inserted)) => self.done(Outcome::Inserted),
            (At::InsReplaceTombstone, Some(A::Matched(false)))
            | (At::InsInsert, Some(A::DuplicateKey)) => self.restart(),

            // Replace in the target.
            (At::RepLive, Some(A::Matched(true))) => self.done(Outcome::Changed(true)),
            (At::RepLive, Some(A::Matched(false))) => self.go(At::RepFindTarget, Step::Find(T)),
            (At::RepFindTarget, Some(A::Found(Found::Live(_)))) => self.restart(),
            (At::RepFindTarget | At::RepFindSource, Some(A::Found(Found::Unmatched))) => {
                self.replace_unmatched()
            }
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
            (At::RepInsert, Some(A::Inserted)) => self.done(Outcome::Changed(true)),
            // An upsert that created the document (over a tombstone, or where nothing held
            // the id): an insert, as MongoDB reports it.
            (At::RepReplaceTombstone, Some(A::Matched(true)))
            | (At::RepUpsertInsert, Some(A::Inserted)) => self.done(Outcome::Inserted),
            (At::RepReplaceTombstone, Some(A::Matched(false)))
            | (At::RepInsert | At::RepUpsertInsert, Some(A::DuplicateKey)) => self.restart(),

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
            (At::DelFindTarget, Some(A::Found(Found::Tombstone | Found::Unmatched))) => {
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

            // Upsert into the target: the update's path, with copy-on-write from the source;
            // when nothing matched, the insert's path with the document to insert.
            (At::UpsLive | At::UpsAfterCopy | At::SrcUpsUpdate, Some(A::Matched(true))) => {
                self.done(Outcome::Changed(true))
            }
            (At::UpsLive, Some(A::Matched(false))) => {
                if self.reads_source() {
                    self.go(At::UpsFindSource, Step::Find(S))
                } else {
                    self.upsert_insert()
                }
            }
            (At::UpsFindSource, Some(A::Found(Found::Live(d)))) => {
                self.go(At::UpsCopy, Step::Insert(T, Payload::Copy(d)))
            }
            (At::UpsFindSource, Some(A::Found(_))) => self.upsert_insert(),
            (At::UpsCopy, Some(A::Inserted | A::DuplicateKey)) => {
                let update = self.update();
                self.go(At::UpsAfterCopy, Step::UpdateLive(T, update))
            }
            (At::UpsAfterCopy, Some(A::Matched(false))) => self.upsert_insert(),
            (At::SrcUpsUpdate, Some(A::Matched(false))) => {
                let doc = self.app_doc();
                self.go(At::SrcInsert, Step::Insert(S, doc))
            }

            // Writes to the source layout. Before the write switch these are plain MongoDB
            // semantics; after a rollback the source may hold tombstones that mirrors left
            // there, which count as absent and which a re-creation replaces.
            (At::SrcInsert, Some(A::Inserted)) => self.done(Outcome::Inserted),
            (At::SrcInsert, Some(A::DuplicateKey)) => self.go(At::SrcInsFind, Step::Find(S)),
            (At::SrcInsFind, Some(A::Found(Found::Live(_) | Found::Unmatched))) => self.duplicate(),
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
            (At::SrcRepFind, Some(A::Found(Found::Unmatched))) => self.replace_unmatched(),
            (At::SrcRepFind, Some(A::Found(Found::Tombstone))) => {
                let doc = self.app_doc();
                self.go(At::SrcRepReplaceTombstone, Step::ReplaceTombstone(S, doc))
            }
            (At::SrcRepFind, Some(A::Found(Found::Absent))) => {
                let doc = self.app_doc();
                self.go(At::SrcUpsertInsert, Step::Insert(S, doc))
            }
            (At::SrcUpsertInsert, Some(A::Inserted))
            | (At::SrcRepReplaceTombstone, Some(A::Matched(true))) => self.done(Outcome::Inserted),
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
                Operation::Upsert { update, .. } => {
                    self.go(At::SrcUpsUpdate, Step::UpdateLive(S, update))
                }
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
                Operation::Upsert { update, .. } => {
                    self.go(At::UpsLive, Step::UpdateLive(T, update))
                }
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
            self.go(At::RepUpsertInsert, Step::Insert(Side::Target, doc))
        } else {
            self.done(Outcome::Changed(false))
        }
    }

    /// A replace whose condition fails on the document holding the id: nothing is changed,
    /// and an upsert would insert a second document of the id, which MongoDB refuses with a
    /// duplicate key.
    fn replace_unmatched(&mut self) -> Result<Next<D, U>, ProtocolError> {
        if self.upsert() {
            self.done(Outcome::Duplicate)
        } else {
            self.done(Outcome::Changed(false))
        }
    }

    /// An upsert's update matched nothing: insert its document, along the insert's path.
    fn upsert_insert(&mut self) -> Result<Next<D, U>, ProtocolError> {
        self.go(At::InsFindTarget, Step::Find(Side::Target))
    }

    /// The insert's path met a document holding the id. An insert reports the duplicate; an
    /// upsert tries its update once more first (the document may be one a concurrent upsert
    /// inserted, which its update now matches).
    fn duplicate(&mut self) -> Result<Next<D, U>, ProtocolError> {
        if matches!(self.op, Operation::Upsert { .. }) && !self.upsert_retried {
            self.upsert_retried = true;
            self.at = At::Start;
            return self.start();
        }
        self.done(Outcome::Duplicate)
    }

    fn app_doc(&self) -> Payload<D> {
        match &self.op {
            Operation::Insert(d)
            | Operation::Replace { doc: d, .. }
            | Operation::Upsert { insert: d, .. } => Payload::App(d.clone()),
            Operation::Get | Operation::Update(_) | Operation::Delete => {
                panic!("only insert, replace and upsert carry a document")
            }
        }
    }

    fn update(&self) -> U {
        match &self.op {
            Operation::Update(u) | Operation::Upsert { update: u, .. } => u.clone(),
            _ => panic!("only update and upsert carry an update"),
        }
    }

    fn upsert(&self) -> bool {
        matches!(self.op, Operation::Replace { upsert: true, .. })
    }
}

fn unreachable_get<T>() -> T {
    panic!("get is handled before the write path is consulted")
}

#[cfg(test)]
mod tests;

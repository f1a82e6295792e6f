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
//!   a copy or a tombstone of it.

use crate::phase::{Phase, ReadPath, WritePath};

/// Which layout a step addresses: the document's location in the source or in the target
/// routing version.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Side {
    Source,
    Target,
}

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
    /// Get: looked in the target / in the source.
    GetTarget,
    GetSource,
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
    /// Writes to the source layout (before the write switch).
    SrcInsert,
    SrcReplace,
    SrcUpsertInsert,
    SrcUpdate,
    SrcDelete,
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
        }
    }

    fn reads_source(&self) -> bool {
        matches!(self.read, ReadPath::Source | ReadPath::TargetThenSource)
    }

    fn go(&mut self, at: At, step: Step<D, U>) -> Result<Next<D, U>, ProtocolError> {
        self.at = at;
        Ok(Next::Do(step))
    }

    fn done(&mut self, outcome: Outcome<D>) -> Result<Next<D, U>, ProtocolError> {
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

            // Writes to the source layout, before the write switch: plain MongoDB semantics.
            (At::SrcInsert, Some(A::Inserted)) => self.done(Outcome::Inserted),
            (At::SrcInsert, Some(A::DuplicateKey)) => self.done(Outcome::Duplicate),
            (At::SrcReplace, Some(A::Matched(true))) => self.done(Outcome::Changed(true)),
            (At::SrcReplace, Some(A::Matched(false))) => {
                if self.upsert() {
                    let doc = self.app_doc();
                    self.go(At::SrcUpsertInsert, Step::Insert(S, doc))
                } else {
                    self.done(Outcome::Changed(false))
                }
            }
            (At::SrcUpsertInsert, Some(A::Inserted)) => self.done(Outcome::Changed(true)),
            (At::SrcUpsertInsert, Some(A::DuplicateKey)) => self.restart(),
            (At::SrcUpdate, Some(A::Matched(changed)))
            | (At::SrcDelete, Some(A::Matched(changed))) => self.done(Outcome::Changed(changed)),

            (at, answer) => Err(unexpected(at, &answer)),
        }
    }

    fn start(&mut self) -> Result<Next<D, U>, ProtocolError> {
        use Side::{Source as S, Target as T};
        if let Operation::Get = self.op {
            return match self.read {
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
                Operation::Delete => self.go(At::SrcDelete, Step::Delete(S)),
            },
            // Rolling back mirrors writes to the source; the mirror is the reverting
            // module's concern, the target-side decisions are the same.
            WritePath::Target | WritePath::TargetMirroredToSource => match self.op.clone() {
                Operation::Get => unreachable_get(),
                Operation::Insert(_) => self.go(At::InsFindTarget, Step::Find(T)),
                Operation::Replace { doc, .. } => {
                    self.go(At::RepLive, Step::ReplaceLive(T, Payload::App(doc)))
                }
                Operation::Update(u) => self.go(At::UpdLive, Step::UpdateLive(T, u)),
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

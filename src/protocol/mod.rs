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
//! This file holds the steps and their answers; `operation` the router's operations (what
//! an insert, a replace, an update, a delete or a read does next); `workers` the copier's,
//! the cleaner's, the revert copier's and a repair's decisions, and the checkpoint's window
//! over batches in flight; `fanout` where a step goes among the locations a layout lists;
//! `query` how a read of many documents at once reads a phase and answers each id.
//!
//! The rules they implement (ARCHITECTURE.md, "The write protocol and its model"):
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

mod fanout;
mod operation;
mod query;
mod workers;

pub use crate::phase::Side;
pub use fanout::{listed_location, mirror_location, mirror_writes, Listed};
pub use operation::{
    Interrupted, Next, Operation, OperationMachine, Outcome, ProtocolError, MAX_RESTARTS,
};
pub use query::{cursor_continues, query_answer, query_plan, QueryPlan};
pub use workers::{
    applied_pending_deletes, backfill_action, bypass_leftover_step, cleanup_action,
    cleanup_decision, cleanup_delete_step, cleanup_lookup_step, copy_result, copy_step,
    mirror_is_newer, purge_tombstone_step, repair_action, repair_copy_step, repair_next,
    repair_replace_step, revert_action, revert_copy_step, BackfillAction, BatchWindow,
    CleanupAction, CleanupDecision, CopyResult, MirrorSource, RepairAction, RepairNext, Repaired,
    RevertAction,
};

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
    /// A live document that does not match the operation's condition: the filter an
    /// application gave beside the id (`updateOne({_id, status: "ready"}, ...)`, a queue's
    /// `findOneAndUpdate`), which the executor checks on the server with the find and puts in
    /// the filter of every conditional write it sends for the operation (`ReplaceLive`,
    /// `UpdateLive`, `DeleteLive`). Only an executor running a conditional operation answers
    /// it; to everyone else a live document is `Live`. It holds the id all the same: an
    /// insert of the id is a duplicate, and a source copy of it is superseded.
    Unmatched,
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
    /// Delete the document only if it carries no envelope (no `_reshard`): a plain document
    /// no router, copier or mirror wrote, as a bypass leaves one. Answered by
    /// [`Answer::Matched`].
    DeleteUnmarked(Side),
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

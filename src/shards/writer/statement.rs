//! The statements a [`BulkWriter`](super::BulkWriter) sends ([`Statement`]: one write to one
//! document at one location) and what became of each ([`StatementResult`]).

use mongodb::bson::{doc, Bson, Document, RawDocumentBuf};

use super::super::classify::FailureClass;
use crate::routing::Location;

/// The change an update statement makes.
#[derive(Clone, Debug, PartialEq)]
pub enum Modification {
    /// An update document (`{$set: ...}`) or a replacement.
    Document(Document),
    /// An aggregation pipeline.
    Pipeline(Vec<Document>),
}

impl From<Document> for Modification {
    fn from(update: Document) -> Self {
        Modification::Document(update)
    }
}

impl From<Vec<Document>> for Modification {
    fn from(pipeline: Vec<Document>) -> Self {
        Modification::Pipeline(pipeline)
    }
}

/// What a statement does.
#[derive(Clone, Debug, PartialEq)]
pub enum WriteOp {
    /// Insert this document (the router's copies, a repair's).
    Insert(Document),
    /// Insert this document as it is encoded (the backfill's copies, built from the bytes
    /// read: [`crate::envelope::copy_raw`]).
    InsertRaw(RawDocumentBuf),
    /// Delete at most one document matching `filter` (cleanup): a statement stands for one
    /// document.
    Delete {
        /// Which document.
        filter: Document,
    },
    /// Update at most one document matching `filter` (stamping in place). Sent again after a
    /// transient failure, so the update must be idempotent (`$set`, not `$inc`).
    Update {
        /// Which document.
        filter: Document,
        /// An update document or an aggregation pipeline.
        update: Modification,
        /// Insert when nothing matches.
        upsert: bool,
    },
}

/// The command a [`WriteOp`] is sent with.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum OpKind {
    /// `insert`
    Insert,
    /// `delete`
    Delete,
    /// `update`
    Update,
}

impl OpKind {
    pub(super) fn command_name(self) -> &'static str {
        match self {
            OpKind::Insert => "insert",
            OpKind::Delete => "delete",
            OpKind::Update => "update",
        }
    }

    pub(super) fn array_name(self) -> &'static str {
        match self {
            OpKind::Insert => "documents",
            OpKind::Delete => "deletes",
            OpKind::Update => "updates",
        }
    }
}

impl WriteOp {
    /// The command this operation is sent with.
    pub fn kind(&self) -> OpKind {
        match self {
            WriteOp::Insert(_) | WriteOp::InsertRaw(_) => OpKind::Insert,
            WriteOp::Delete { .. } => OpKind::Delete,
            WriteOp::Update { .. } => OpKind::Update,
        }
    }

    /// The element of the command's array: the document, `{q, limit: 1}` or
    /// `{q, u, upsert, multi: false}`.
    pub(super) fn encode(&self) -> Result<RawDocumentBuf, mongodb::bson::raw::Error> {
        match self {
            WriteOp::Insert(document) => RawDocumentBuf::from_document(document),
            WriteOp::InsertRaw(document) => Ok(document.clone()),
            WriteOp::Delete { filter } => {
                RawDocumentBuf::from_document(&doc! { "q": filter, "limit": 1 })
            }
            WriteOp::Update {
                filter,
                update,
                upsert,
            } => {
                let u = match update {
                    Modification::Document(d) => Bson::Document(d.clone()),
                    Modification::Pipeline(stages) => {
                        Bson::Array(stages.iter().cloned().map(Bson::Document).collect())
                    }
                };
                RawDocumentBuf::from_document(
                    &doc! { "q": filter, "u": u, "upsert": upsert, "multi": false },
                )
            }
        }
    }
}

/// One write to one document at one location.
#[derive(Clone, Debug, PartialEq)]
pub struct Statement {
    /// Where it goes.
    pub location: Location,
    /// The document's id: de-duplication within a batch and reports use it.
    pub id: Bson,
    /// What it does.
    pub op: WriteOp,
}

/// An insert of a document without `_id`: the writer cannot de-duplicate it, and a retry
/// would copy it twice.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[error("a document to insert has no _id")]
pub struct MissingId;

impl Statement {
    /// A statement with an explicit id.
    pub fn new(location: Location, id: Bson, op: WriteOp) -> Self {
        Statement { location, id, op }
    }

    /// Inserts `document`, keyed by its `_id`.
    pub fn insert(location: Location, document: Document) -> Result<Self, MissingId> {
        let id = document.get("_id").cloned().ok_or(MissingId)?;
        Ok(Statement::new(location, id, WriteOp::Insert(document)))
    }

    /// Deletes the document with `_id` `id`.
    pub fn delete(location: Location, id: Bson) -> Self {
        let filter = doc! { "_id": id.clone() };
        Statement::new(location, id, WriteOp::Delete { filter })
    }

    /// Applies `update` to the document with `_id` `id`.
    pub fn update(
        location: Location,
        id: Bson,
        update: impl Into<Modification>,
        upsert: bool,
    ) -> Self {
        let filter = doc! { "_id": id.clone() };
        let op = WriteOp::Update {
            filter,
            update: update.into(),
            upsert,
        };
        Statement::new(location, id, op)
    }
}

/// What became of one statement.
#[derive(Clone, Debug, PartialEq)]
pub enum StatementResult {
    /// The document was inserted.
    Inserted,
    /// The delete or update was applied (which may have matched nothing).
    Applied,
    /// A duplicate key on `_id`: the document was already there. This includes a document
    /// this writer inserted in an earlier attempt whose reply was lost (a dropped connection),
    /// so `Inserted + AlreadyPresent` is what the completeness ledger counts on.
    AlreadyPresent,
    /// A later statement of the batch had the same location and id and replaced this one.
    DroppedDuplicate {
        /// The index (in the batch) of the statement that was sent instead.
        kept: usize,
    },
    /// Not settled by the batch's deadline (the worker's partition lease): it may or may not
    /// have been applied (by the deadline, never later). The batch must not be checkpointed;
    /// whoever takes the partition over re-executes it.
    Expired,
    /// It failed permanently, or transiently on every attempt: record it as a dead letter.
    DeadLettered {
        /// The server's code of the last failure (`None`: no answer).
        code: Option<i32>,
        /// The code's name.
        code_name: Option<String>,
        /// The last failure's message.
        message: String,
        /// The server's `errInfo`, if any.
        info: Option<Document>,
        /// How the last failure was classified (`Permanent`, or `Transient` / `Overload`
        /// when the attempts ran out).
        class: FailureClass,
        /// How many times the statement was sent.
        attempts: u32,
    },
}

impl StatementResult {
    /// What an insert-if-absent's result answers, as a protocol step's answer
    /// ([`crate::protocol::copy_result`] judges it): inserted, or a duplicate key (a document
    /// already there, or the same id sent by a later statement of the batch, which settles it
    /// the same way). `None` for any other result.
    pub fn insert_answer(&self) -> Option<crate::protocol::Answer<()>> {
        match self {
            StatementResult::Inserted => Some(crate::protocol::Answer::Inserted),
            StatementResult::AlreadyPresent | StatementResult::DroppedDuplicate { .. } => {
                Some(crate::protocol::Answer::DuplicateKey)
            }
            StatementResult::Applied
            | StatementResult::Expired
            | StatementResult::DeadLettered { .. } => None,
        }
    }
}

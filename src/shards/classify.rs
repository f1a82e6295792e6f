//! What a failed write statement means for the copy: already there, try again, slow down, or
//! give up on it.
//!
//! [`classify`] is a pure function over codes and labels. It never reads message text: messages
//! change between server versions and products, codes and labels are the contract. The
//! conversions in this module turn what a server or the driver said ([`failures_from_reply`],
//! [`failure_from_error`], [`failures_from_driver_error`]) into [`WriteFailure`]s, one per
//! statement, so the writer can decide statement by statement.

use mongodb::bson::{Bson, Document};
use mongodb::error::ErrorKind;

/// Duplicate key: the document (or another one with the same unique key) is already there.
pub const DUPLICATE_KEY: i32 = 11000;
/// The label an overloaded server puts on a rejection, whatever the code (489 in the search
/// tier, other codes elsewhere).
pub const SYSTEM_OVERLOADED_LABEL: &str = "SystemOverloadedError";
/// The label a server (or the driver, for network errors) puts on a write that may be retried.
pub const RETRYABLE_WRITE_LABEL: &str = "RetryableWriteError";
/// The label of an error that aborted a transaction and may be retried.
pub const TRANSIENT_TRANSACTION_LABEL: &str = "TransientTransactionError";

/// Codes after which the same statement may succeed when sent again: network trouble, a
/// primary stepping down or shutting down, an interrupted operation, a write conflict, a time
/// limit, and a write concern that was not satisfied in time.
pub const TRANSIENT_CODES: &[i32] = &[
    6,     // HostUnreachable
    7,     // HostNotFound
    50,    // MaxTimeMSExpired
    64,    // WriteConcernFailed (wtimeout: applied, durability unconfirmed)
    89,    // NetworkTimeout
    91,    // ShutdownInProgress
    112,   // WriteConflict
    189,   // PrimarySteppedDown
    262,   // ExceededTimeLimit
    9001,  // SocketException
    10107, // NotWritablePrimary
    11600, // InterruptedAtShutdown
    11602, // InterruptedDueToReplStateChange
    13435, // NotPrimaryNoSecondaryOk
    13436, // NotPrimaryOrSecondary
];

/// Names of the codes this module cares about, for messages when a reply carries no
/// `codeName` (write errors often do not).
const CODE_NAMES: &[(i32, &str)] = &[
    (2, "BadValue"),
    (6, "HostUnreachable"),
    (7, "HostNotFound"),
    (9, "FailedToParse"),
    (13, "Unauthorized"),
    (14, "TypeMismatch"),
    (26, "NamespaceNotFound"),
    (50, "MaxTimeMSExpired"),
    (64, "WriteConcernFailed"),
    (66, "ImmutableField"),
    (79, "UnknownReplWriteConcern"),
    (89, "NetworkTimeout"),
    (91, "ShutdownInProgress"),
    (100, "UnsatisfiableWriteConcern"),
    (112, "WriteConflict"),
    (121, "DocumentValidationFailure"),
    (189, "PrimarySteppedDown"),
    (262, "ExceededTimeLimit"),
    (9001, "SocketException"),
    (10107, "NotWritablePrimary"),
    (10334, "BSONObjectTooLarge"),
    (11000, "DuplicateKey"),
    (11600, "InterruptedAtShutdown"),
    (11602, "InterruptedDueToReplStateChange"),
    (13435, "NotPrimaryNoSecondaryOk"),
    (13436, "NotPrimaryOrSecondary"),
];

/// The name of a server error code, if this module knows it.
pub fn code_name(code: i32) -> Option<&'static str> {
    CODE_NAMES
        .iter()
        .find(|(c, _)| *c == code)
        .map(|(_, name)| *name)
}

/// Where a failure was reported.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FailureOrigin {
    /// An entry of the reply's `writeErrors`: this statement, and only it, failed.
    WriteError,
    /// The reply's `writeConcernError`: the statement was applied on the primary but its
    /// durability was not confirmed.
    WriteConcern,
    /// The whole command failed (`ok: 0`): no statement of it is known to have been applied.
    Command,
    /// No answer: the connection failed, timed out, or no server could be selected.
    Network,
    /// Refused before sending (e.g. a statement larger than a command may be), or an error of
    /// the driver that no retry can fix.
    Client,
}

/// One statement's failure, as reported: codes and labels to decide on, the message and
/// details to show an operator.
#[derive(Clone, Debug, PartialEq)]
pub struct WriteFailure {
    /// Where the failure was reported.
    pub origin: FailureOrigin,
    /// The server's error code; `None` when no server answered.
    pub code: Option<i32>,
    /// The server's `codeName`, else the name from this module's table.
    pub code_name: Option<String>,
    /// Error labels of the reply (`errorLabels`) or added by the driver.
    pub labels: Vec<String>,
    /// The message, for people only: never used to decide anything.
    pub message: String,
    /// The server's `errInfo`, if any (e.g. which validation rule failed).
    pub info: Option<Document>,
    /// For a duplicate key: the `keyPattern` of the unique index that refused the statement.
    pub key_pattern: Option<Document>,
}

impl WriteFailure {
    /// A failure of `origin` with `code` and `message`, no labels, and the code's name from the
    /// table.
    pub fn new(origin: FailureOrigin, code: Option<i32>, message: impl Into<String>) -> Self {
        WriteFailure {
            origin,
            code,
            code_name: code.and_then(code_name).map(str::to_owned),
            labels: Vec::new(),
            message: message.into(),
            info: None,
            key_pattern: None,
        }
    }

    /// The same failure with `label` added.
    pub fn with_label(mut self, label: impl Into<String>) -> Self {
        self.labels.push(label.into());
        self
    }

    /// Whether the failure carries `label`.
    pub fn has_label(&self, label: &str) -> bool {
        self.labels.iter().any(|l| l == label)
    }

    /// One line for people: `code 121 (DocumentValidationFailure): Document failed validation`.
    pub fn describe(&self) -> String {
        match (self.code, &self.code_name) {
            (Some(code), Some(name)) => format!("code {code} ({name}): {}", self.message),
            (Some(code), None) => format!("code {code}: {}", self.message),
            (None, _) => self.message.clone(),
        }
    }
}

/// What the writer does with a failed statement.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FailureClass {
    /// A duplicate `_id`: the document is already at the target (an earlier attempt, a crash
    /// between write and checkpoint, or the application). Counts as done.
    AlreadyPresent,
    /// May succeed when sent again: retry this statement only, with backoff.
    Transient,
    /// The server sheds load: retry this statement with backoff and lower the sending rate.
    Overload,
    /// Will fail again: record it as a dead letter.
    Permanent,
}

/// A driver error that is a duplicate key on `_id` (a document with the id exists), and not on
/// another unique index.
pub fn is_duplicate_key(error: &mongodb::error::Error) -> bool {
    let failure = match error.kind.as_ref() {
        ErrorKind::Write(mongodb::error::WriteFailure::WriteError(we)) => {
            let mut f = WriteFailure::new(FailureOrigin::WriteError, Some(we.code), &we.message);
            f.key_pattern = we
                .details
                .as_ref()
                .and_then(|d| d.get_document("keyPattern").ok().cloned());
            f
        }
        _ => failure_from_error(error),
    };
    classify(&failure) == FailureClass::AlreadyPresent
}

/// Decides what a failure means, from its label set and code only.
///
/// In order: the `SystemOverloadedError` label is overload whatever the code (an overloaded
/// server does not add the retryable label); a duplicate key is already present unless the
/// reply names a unique index other than `_id` (then another document holds that key, and
/// sending again cannot help); network failures, the retryable labels and [`TRANSIENT_CODES`]
/// are transient; everything else, including a client-side refusal, is permanent.
pub fn classify(failure: &WriteFailure) -> FailureClass {
    if failure.has_label(SYSTEM_OVERLOADED_LABEL) {
        return FailureClass::Overload;
    }
    if failure.code == Some(DUPLICATE_KEY) {
        return match &failure.key_pattern {
            Some(pattern) if !is_id_pattern(pattern) => FailureClass::Permanent,
            _ => FailureClass::AlreadyPresent,
        };
    }
    if failure.origin == FailureOrigin::Client {
        return FailureClass::Permanent;
    }
    if failure.origin == FailureOrigin::Network
        || failure.has_label(RETRYABLE_WRITE_LABEL)
        || failure.has_label(TRANSIENT_TRANSACTION_LABEL)
        || failure.code.is_some_and(|c| TRANSIENT_CODES.contains(&c))
    {
        return FailureClass::Transient;
    }
    FailureClass::Permanent
}

fn is_id_pattern(pattern: &Document) -> bool {
    pattern.len() == 1 && pattern.contains_key("_id")
}

/// Whether a command that failed can have reached its server, and so been applied.
///
/// MongoDB's retryable-writes rules are the model: a write whose first attempt may have been
/// received may be sent again only with a transaction number the server deduplicates it by,
/// which the router's raw commands do not carry; a write that certainly was not received may
/// be sent again as it is. The driver does not say which phase of a command failed, so this
/// is read from the error's kind and, for an I/O error, the kind of the system call's error,
/// never from a message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Delivery {
    /// No server could be selected (or its name resolved): nothing was sent.
    NoServer,
    /// The connection was found closed while the command was being written: a broken pipe
    /// (`EPIPE`) comes from a send, never from a receive, and only once the peer has reset
    /// the connection, so the message did not leave whole, and a server executes no partial
    /// message. This is what a pooled connection the server closed while it sat idle gives
    /// when the reset arrived before the write (a command larger than the driver's 8 KiB
    /// write buffer is written in two sends, and the first one draws the reset).
    NotSent,
    /// The connection failed once the whole command may have been written: the server closed
    /// or reset it (a reset is also what a send into a reset connection reports first, but
    /// it cannot be told apart from a reset while the answer was read), a timeout, a pool
    /// cleared while the command ran, a reply that could not be read. The command may have
    /// been received and applied.
    MayHaveArrived,
    /// The server answered (a command or write error), or the driver refused the command
    /// before sending it (an invalid argument, a failed authentication): what happened is
    /// known, and sending it again changes nothing.
    Settled,
}

/// Where a command that failed with `error` got to ([`Delivery`]).
pub fn delivery(error: &mongodb::error::Error) -> Delivery {
    match error.kind.as_ref() {
        ErrorKind::ServerSelection { .. } | ErrorKind::DnsResolve { .. } => Delivery::NoServer,
        ErrorKind::Io(io) if io.kind() == std::io::ErrorKind::BrokenPipe => Delivery::NotSent,
        ErrorKind::Command(_)
        | ErrorKind::Write(_)
        | ErrorKind::InsertMany(_)
        | ErrorKind::BulkWrite(_)
        | ErrorKind::Authentication { .. }
        | ErrorKind::InvalidArgument { .. } => Delivery::Settled,
        _ => match source_error(error) {
            Some(source) => delivery(source),
            // Whatever else failed, nothing says the command did not arrive.
            None => Delivery::MayHaveArrived,
        },
    }
}

/// Whether a router's protocol step whose command failed so may be sent once more, on a
/// fresh connection and within the step's deadline.
///
/// - A read (`find`) after any failed connection: it changes nothing however often it
///   arrives (MongoDB's retryable reads do the same).
/// - A write only when it certainly did not reach its server ([`Delivery::NotSent`]). The
///   server then sees it once, later than the router planned, which is what a first send held
///   up in transit does, and what the protocol's steps are built for: each names the state it
///   acts on (insert-if-absent by the unique `_id`, replace by revision, update or delete of
///   the live document, a mirror only over an older revision) and applies to what holds when
///   it lands.
/// - Never after an answer ([`Delivery::Settled`]), after a failure that may have reached the
///   server with a write (its outcome is unknown: a second send could apply it twice, or
///   apply it after the application was told it failed), nor when no server could be
///   selected (the driver waited its selection timeout already, and does not retry that
///   either).
pub fn may_send_again(delivery: Delivery, read: bool) -> bool {
    match delivery {
        Delivery::NotSent => true,
        Delivery::MayHaveArrived => read,
        Delivery::NoServer | Delivery::Settled => false,
    }
}

/// What one command's reply (`ok: 1`) says about its statements.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ReplyOutcome {
    /// `(index within the command, failure)` for every statement that failed; at most one per
    /// index, a write error taking precedence over the write concern error.
    pub failures: Vec<(usize, WriteFailure)>,
    /// The reply's `n`: documents inserted, deleted, or matched by updates (plus upserts).
    pub n: u64,
    /// The reply's `nModified` (updates only).
    pub modified: u64,
}

/// Reads an `ok: 1` reply of an `insert`, `update` or `delete` command of `statements`
/// statements: `writeErrors[].index` names the failed statements; a `writeConcernError`
/// applies to every statement that has no write error. Top-level `errorLabels` belong to the
/// write concern error; a write error's own `errorLabels`, if a server sends them, to it.
pub fn failures_from_reply(reply: &Document, statements: usize) -> ReplyOutcome {
    let top_labels = labels_of(reply);
    let mut failures = Vec::new();
    if let Ok(errors) = reply.get_array("writeErrors") {
        for error in errors {
            let Bson::Document(error) = error else {
                continue;
            };
            let Some(index) = error.get("index").and_then(as_u64) else {
                continue;
            };
            let index = index as usize;
            if index >= statements {
                continue;
            }
            let mut failure = failure_from_doc(FailureOrigin::WriteError, error);
            failure.key_pattern = error.get_document("keyPattern").ok().cloned();
            failures.push((index, failure));
        }
    }
    if let Ok(wce) = reply.get_document("writeConcernError") {
        let mut failure = failure_from_doc(FailureOrigin::WriteConcern, wce);
        for label in &top_labels {
            if !failure.has_label(label) {
                failure.labels.push(label.clone());
            }
        }
        let mut failed = vec![false; statements];
        for (index, _) in &failures {
            failed[*index] = true;
        }
        for (index, _) in failed.iter().enumerate().filter(|(_, f)| !**f) {
            failures.push((index, failure.clone()));
        }
    }
    failures.sort_by_key(|(index, _)| *index);
    ReplyOutcome {
        failures,
        n: reply.get("n").and_then(as_u64).unwrap_or(0),
        modified: reply.get("nModified").and_then(as_u64).unwrap_or(0),
    }
}

fn failure_from_doc(origin: FailureOrigin, doc: &Document) -> WriteFailure {
    let code = doc.get("code").and_then(as_u64).map(|c| c as i32);
    let mut failure = WriteFailure::new(origin, code, doc.get_str("errmsg").unwrap_or_default());
    if let Ok(name) = doc.get_str("codeName") {
        failure.code_name = Some(name.to_owned());
    }
    failure.labels = labels_of(doc);
    failure.info = doc.get_document("errInfo").ok().cloned();
    failure
}

fn labels_of(doc: &Document) -> Vec<String> {
    doc.get_array("errorLabels")
        .map(|labels| {
            labels
                .iter()
                .filter_map(|l| l.as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

fn as_u64(value: &Bson) -> Option<u64> {
    match value {
        Bson::Int32(v) => u64::try_from(*v).ok(),
        Bson::Int64(v) => u64::try_from(*v).ok(),
        Bson::Double(v) if *v >= 0.0 && v.fract() == 0.0 => Some(*v as u64),
        _ => None,
    }
}

/// Turns a driver error for a whole command (nothing in it is known to have been applied) into
/// the failure every statement of that command gets: a command error keeps its code, name,
/// labels and the reply's `errInfo`; an I/O error, a cleared pool or a failed server selection
/// is a network failure; anything else is a client failure.
/// A driver-reported write concern error as a failure of the statements it covers.
fn write_concern_failure(w: &mongodb::error::WriteConcernError, labels: &[String]) -> WriteFailure {
    let mut f = WriteFailure::new(FailureOrigin::WriteConcern, Some(w.code), &w.message);
    if !w.code_name.is_empty() {
        f.code_name = Some(w.code_name.clone());
    }
    f.info = w.details.clone();
    f.labels = labels.to_vec();
    f
}

pub fn failure_from_error(error: &mongodb::error::Error) -> WriteFailure {
    let labels: Vec<String> = {
        let mut labels: Vec<String> = error.labels().iter().cloned().collect();
        labels.sort();
        labels
    };
    let mut failure = match error.kind.as_ref() {
        ErrorKind::Command(command) => {
            let mut failure = WriteFailure::new(
                FailureOrigin::Command,
                Some(command.code),
                command.message.clone(),
            );
            if !command.code_name.is_empty() {
                failure.code_name = Some(command.code_name.clone());
            }
            failure.info = error
                .server_response()
                .and_then(|raw| raw.to_document().ok())
                .and_then(|reply| reply.get_document("errInfo").ok().cloned());
            failure
        }
        ErrorKind::Io(_)
        | ErrorKind::ConnectionPoolCleared { .. }
        | ErrorKind::ServerSelection { .. } => {
            WriteFailure::new(FailureOrigin::Network, None, error.to_string())
        }
        _ => match source_error(error) {
            Some(source) => return failure_from_error(source),
            None => WriteFailure::new(FailureOrigin::Client, None, error.to_string()),
        },
    };
    for label in labels {
        if !failure.has_label(&label) {
            failure.labels.push(label);
        }
    }
    failure
}

fn source_error(error: &mongodb::error::Error) -> Option<&mongodb::error::Error> {
    std::error::Error::source(error).and_then(|s| s.downcast_ref::<mongodb::error::Error>())
}

/// Turns any driver error for a command of `statements` statements into per-statement
/// failures, for callers that use the driver's helpers (`insert_many`, `bulk_write`) rather
/// than raw commands: write errors go to their index, a write concern error to every other
/// statement; any other error (including a bulk write's top-level error) fails every statement
/// without a write error, as [`failure_from_error`] describes.
pub fn failures_from_driver_error(
    error: &mongodb::error::Error,
    statements: usize,
) -> Vec<(usize, WriteFailure)> {
    let labels: Vec<String> = error.labels().iter().cloned().collect();
    let indexed: Vec<(usize, WriteFailure)>;
    let rest: Option<WriteFailure>;
    match error.kind.as_ref() {
        ErrorKind::InsertMany(im) => {
            indexed = im
                .write_errors
                .iter()
                .flatten()
                .map(|w| {
                    let mut f =
                        WriteFailure::new(FailureOrigin::WriteError, Some(w.code), &w.message);
                    if let Some(name) = &w.code_name {
                        f.code_name = Some(name.clone());
                    }
                    f.info = w.details.clone();
                    (w.index, f)
                })
                .collect();
            rest = im
                .write_concern_error
                .as_ref()
                .map(|w| write_concern_failure(w, &labels));
        }
        ErrorKind::BulkWrite(bw) => {
            indexed = bw
                .write_errors
                .iter()
                .map(|(index, w)| {
                    let mut f =
                        WriteFailure::new(FailureOrigin::WriteError, Some(w.code), &w.message);
                    if let Some(name) = &w.code_name {
                        f.code_name = Some(name.clone());
                    }
                    f.info = w.details.clone();
                    (*index, f)
                })
                .collect();
            rest = match (source_error(error), bw.write_concern_errors.first()) {
                (Some(top), _) => Some(failure_from_error(top)),
                (None, Some(w)) => Some(write_concern_failure(w, &labels)),
                (None, None) => None,
            };
        }
        ErrorKind::Write(mongodb::error::WriteFailure::WriteError(w)) if statements == 1 => {
            let mut f = WriteFailure::new(FailureOrigin::WriteError, Some(w.code), &w.message);
            if let Some(name) = &w.code_name {
                f.code_name = Some(name.clone());
            }
            f.info = w.details.clone();
            indexed = vec![(0, f)];
            rest = None;
        }
        _ => {
            indexed = Vec::new();
            rest = Some(failure_from_error(error));
        }
    }
    let mut failed = vec![false; statements];
    let mut failures: Vec<(usize, WriteFailure)> = indexed
        .into_iter()
        .filter(|(index, _)| *index < statements)
        .inspect(|(index, _)| failed[*index] = true)
        .collect();
    if let Some(rest) = rest {
        for (index, _) in failed.iter().enumerate().filter(|(_, f)| !**f) {
            failures.push((index, rest.clone()));
        }
    }
    failures.sort_by_key(|(index, _)| *index);
    failures
}

#[cfg(test)]
mod tests {
    use super::*;
    use mongodb::bson::doc;
    use FailureClass::*;
    use FailureOrigin::*;

    fn failure(origin: FailureOrigin, code: Option<i32>, labels: &[&str]) -> WriteFailure {
        let mut f = WriteFailure::new(origin, code, "any text: never read");
        f.labels = labels.iter().map(|l| l.to_string()).collect();
        f
    }

    #[test]
    fn classification_table() {
        let cases: &[(FailureOrigin, Option<i32>, &[&str], FailureClass)] = &[
            // Duplicate key is success.
            (WriteError, Some(11000), &[], AlreadyPresent),
            // Overload is the label, whatever the code.
            (Command, Some(489), &["SystemOverloadedError"], Overload),
            (Command, Some(462), &["SystemOverloadedError"], Overload),
            (
                Network,
                None,
                &["SystemOverloadedError", "RetryableError"],
                Overload,
            ),
            (WriteError, Some(2), &["SystemOverloadedError"], Overload),
            // 489 without the label is not overload: the label is the contract.
            (Command, Some(489), &[], Permanent),
            // Transient codes.
            (Command, Some(6), &[], Transient),
            (Command, Some(7), &[], Transient),
            (Command, Some(50), &[], Transient),
            (WriteConcern, Some(64), &[], Transient),
            (Command, Some(89), &[], Transient),
            (Command, Some(91), &[], Transient),
            (WriteError, Some(112), &[], Transient),
            (Command, Some(189), &[], Transient),
            (Command, Some(262), &[], Transient),
            (Command, Some(9001), &[], Transient),
            (Command, Some(10107), &[], Transient),
            (Command, Some(11600), &[], Transient),
            (Command, Some(11602), &[], Transient),
            (Command, Some(13435), &[], Transient),
            (Command, Some(13436), &[], Transient),
            // Transient labels, whatever the code.
            (Command, Some(12345), &["RetryableWriteError"], Transient),
            (
                Command,
                Some(12345),
                &["TransientTransactionError"],
                Transient,
            ),
            // No answer at all.
            (Network, None, &[], Transient),
            // Everything else is a dead letter.
            (WriteError, Some(121), &[], Permanent),
            (WriteError, Some(10334), &[], Permanent),
            (Command, Some(13), &[], Permanent),
            (WriteConcern, Some(100), &[], Permanent),
            (Command, None, &[], Permanent),
            (Client, None, &[], Permanent),
            (Client, Some(10334), &["RetryableWriteError"], Permanent),
        ];
        for (origin, code, labels, expected) in cases {
            let f = failure(*origin, *code, labels);
            assert_eq!(classify(&f), *expected, "{origin:?} {code:?} {labels:?}");
        }
    }

    #[test]
    fn message_text_is_never_read() {
        let mut f = failure(WriteError, Some(121), &[]);
        f.message = "E11000 duplicate key error; NotWritablePrimary; SystemOverloadedError".into();
        assert_eq!(classify(&f), Permanent);
    }

    #[test]
    fn duplicate_key_on_another_unique_index_is_permanent() {
        let cases = [
            (None, AlreadyPresent),
            (Some(doc! { "_id": 1 }), AlreadyPresent),
            (Some(doc! { "email": 1 }), Permanent),
            (Some(doc! { "_id": 1, "email": 1 }), Permanent),
        ];
        for (pattern, expected) in cases {
            let mut f = failure(WriteError, Some(11000), &[]);
            f.key_pattern = pattern.clone();
            assert_eq!(classify(&f), expected, "{pattern:?}");
        }
    }

    #[test]
    fn code_names() {
        assert_eq!(code_name(11000), Some("DuplicateKey"));
        assert_eq!(code_name(121), Some("DocumentValidationFailure"));
        assert_eq!(code_name(10107), Some("NotWritablePrimary"));
        assert_eq!(code_name(424242), None);
        // Every transient code has a name for messages.
        for code in TRANSIENT_CODES {
            assert!(code_name(*code).is_some(), "{code}");
        }
    }

    #[test]
    fn reply_write_errors_go_to_their_index() {
        let reply = doc! {
            "n": 3, "ok": 1.0,
            "writeErrors": [
                { "index": 1, "code": 11000, "errmsg": "dup", "keyPattern": { "_id": 1 }, "keyValue": { "_id": 7 } },
                { "index": 3, "code": 121, "errmsg": "Document failed validation",
                  "errInfo": { "failingDocumentId": 9 } },
            ],
        };
        let outcome = failures_from_reply(&reply, 5);
        assert_eq!(outcome.n, 3);
        let got: Vec<(usize, Option<i32>, FailureClass)> = outcome
            .failures
            .iter()
            .map(|(i, f)| (*i, f.code, classify(f)))
            .collect();
        assert_eq!(
            got,
            vec![(1, Some(11000), AlreadyPresent), (3, Some(121), Permanent)]
        );
        let validation = &outcome.failures[1].1;
        assert_eq!(
            validation.code_name.as_deref(),
            Some("DocumentValidationFailure")
        );
        assert_eq!(validation.info, Some(doc! { "failingDocumentId": 9 }));
        assert_eq!(validation.message, "Document failed validation");
    }

    #[test]
    fn reply_write_concern_error_covers_the_statements_without_a_write_error() {
        let reply = doc! {
            "n": 2, "ok": 1,
            "writeErrors": [ { "index": 0, "code": 11000, "errmsg": "dup" } ],
            "writeConcernError": { "code": 64, "codeName": "WriteConcernFailed", "errmsg": "waiting for replication timed out" },
            "errorLabels": ["RetryableWriteError"],
        };
        let outcome = failures_from_reply(&reply, 3);
        let got: Vec<(usize, FailureOrigin, FailureClass, bool)> = outcome
            .failures
            .iter()
            .map(|(i, f)| {
                (
                    *i,
                    f.origin,
                    classify(f),
                    f.has_label(RETRYABLE_WRITE_LABEL),
                )
            })
            .collect();
        assert_eq!(
            got,
            vec![
                (0, WriteError, AlreadyPresent, false),
                (1, WriteConcern, Transient, true),
                (2, WriteConcern, Transient, true),
            ]
        );
    }

    #[test]
    fn reply_without_errors_has_no_failures() {
        let outcome = failures_from_reply(&doc! { "n": 4, "nModified": 2, "ok": 1 }, 4);
        assert_eq!(
            outcome,
            ReplyOutcome {
                failures: vec![],
                n: 4,
                modified: 2
            }
        );
    }

    #[test]
    fn reply_indices_out_of_range_are_ignored() {
        let reply = doc! { "n": 0, "ok": 1, "writeErrors": [ { "index": 9, "code": 121, "errmsg": "x" }, { "code": 121 } ] };
        assert!(failures_from_reply(&reply, 2).failures.is_empty());
    }

    fn io_error(kind: std::io::ErrorKind, message: &str) -> mongodb::error::Error {
        mongodb::error::Error::from(std::io::Error::new(kind, message.to_owned()))
    }

    #[test]
    fn only_a_broken_pipe_says_a_command_did_not_leave() {
        use std::io::ErrorKind as Io;
        let cases = [
            (Io::BrokenPipe, Delivery::NotSent),
            // The server closed the connection after the command was written: it may have
            // run it (a failpoint's `closeConnection` does exactly that, without running it).
            (Io::UnexpectedEof, Delivery::MayHaveArrived),
            // A reset is reported by a send and by a receive alike.
            (Io::ConnectionReset, Delivery::MayHaveArrived),
            (Io::ConnectionAborted, Delivery::MayHaveArrived),
            (Io::TimedOut, Delivery::MayHaveArrived),
        ];
        for (kind, expected) in cases {
            assert_eq!(delivery(&io_error(kind, "x")), expected, "{kind:?}");
        }
        // The message is never read.
        assert_eq!(
            delivery(&io_error(Io::Other, "Broken pipe (os error 32)")),
            Delivery::MayHaveArrived
        );
        assert_eq!(
            delivery(&mongodb::error::Error::custom("anything")),
            Delivery::MayHaveArrived
        );
    }

    #[tokio::test]
    async fn a_refusal_before_sending_is_settled_and_no_server_is_no_server() {
        let refused = mongodb::options::ClientOptions::parse("mongodb://127.0.0.1:notaport")
            .await
            .unwrap_err();
        assert_eq!(delivery(&refused), Delivery::Settled);

        let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = closed.local_addr().unwrap().port();
        drop(closed);
        let client = mongodb::Client::with_uri_str(format!(
            "mongodb://127.0.0.1:{port}/?serverSelectionTimeoutMS=200&directConnection=true"
        ))
        .await
        .unwrap();
        let none = client
            .database("admin")
            .run_command(doc! { "ping": 1 })
            .await
            .unwrap_err();
        assert_eq!(delivery(&none), Delivery::NoServer);
    }

    #[test]
    fn a_read_is_sent_again_after_any_lost_connection_a_write_only_when_it_never_left() {
        use Delivery::*;
        let cases = [
            (NotSent, true, true),
            (NotSent, false, true),
            (MayHaveArrived, true, true),
            (MayHaveArrived, false, false),
            (NoServer, true, false),
            (NoServer, false, false),
            (Settled, true, false),
            (Settled, false, false),
        ];
        for (delivery, read, expected) in cases {
            assert_eq!(
                may_send_again(delivery, read),
                expected,
                "{delivery:?} read={read}"
            );
        }
    }
}

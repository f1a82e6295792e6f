//! The one error a command handler returns, and the table of MongoDB error codes the front
//! uses. A command error leaves the server as MongoDB writes it, `{ok: 0, errmsg, code,
//! codeName}`, with the code a `mongos` would use, so that a driver's retry and error
//! handling behave as they do against MongoDB (drivers decide by code and label, never by
//! message).

use bson::{doc, Document};

/// MongoDB's error codes that the front answers with, by their names in MongoDB's
/// `error_codes.yml`. Add a code here, with the number and name MongoDB gives it, before a
/// handler uses it. A code a shard or the passthrough answered is passed on as it came
/// ([`CommandError::passed`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorCode {
    /// Something the front itself got wrong (a reply it could not encode).
    InternalError,
    BadValue,
    /// A location (a shard, the passthrough, the state store) did not answer.
    HostUnreachable,
    FailedToParse,
    /// A command other than the few allowed before authentication, on a connection that has
    /// not authenticated while the front has users.
    Unauthorized,
    TypeMismatch,
    /// A SASL message out of order: `saslContinue` without a conversation, or of another
    /// conversation.
    ProtocolError,
    /// A SASL step that failed, whatever the reason (the log says which).
    AuthenticationFailed,
    /// What a standalone server answers to a transaction: the front holds none.
    IllegalOperation,
    NamespaceNotFound,
    ConflictingUpdateOperators,
    /// `getMore` of a cursor the front does not hold.
    CursorNotFound,
    /// A write cut short by the router's lease: it may or may not have been applied.
    MaxTimeMSExpired,
    /// A command no handler answers.
    CommandNotFound,
    /// A document without the tenant key of a routed collection.
    ShardKeyNotFound,
    ImmutableField,
    ShardNotFound,
    InvalidOptions,
    InvalidNamespace,
    ShutdownInProgress,
    /// A request MongoDB refuses with a message of its own and no more specific code (a
    /// `getLog` of a log that does not exist).
    OperationFailed,
    /// A document that kept changing under a write: transient.
    WriteConflict,
    /// A command or a form of it the front does not run on a routed collection.
    CommandNotSupported,
    /// A cursor whose reads the migration's new phase outdated.
    QueryPlanKilled,
    /// A second `client` metadata document on one connection.
    ClientMetadataCannotBeMutated,
    /// Held by a switch past its bounded pause: transient, try again.
    ExceededTimeLimit,
    OperationNotSupportedInTransaction,
    QueryExceededMemoryLimitNoDiskUseAllowed,
    /// A SASL mechanism other than SCRAM-SHA-256.
    MechanismUnavailable,
    /// A command other than the handshake over the legacy `OP_QUERY` (removed in MongoDB 5.1).
    UnsupportedOpQueryCommand,
    DuplicateKey,
    /// The router's lease could not be renewed in time: nothing was applied; transient.
    StaleConfig,
    /// A required field of a command is missing (an IDL parser's location code).
    Location40414,
    /// An `OP_MSG` body without `$db` (a location code: MongoDB names it after its number).
    Location40571,
}

impl ErrorCode {
    pub const ALL: [ErrorCode; 34] = [
        ErrorCode::InternalError,
        ErrorCode::BadValue,
        ErrorCode::HostUnreachable,
        ErrorCode::FailedToParse,
        ErrorCode::Unauthorized,
        ErrorCode::TypeMismatch,
        ErrorCode::ProtocolError,
        ErrorCode::AuthenticationFailed,
        ErrorCode::IllegalOperation,
        ErrorCode::NamespaceNotFound,
        ErrorCode::ConflictingUpdateOperators,
        ErrorCode::CursorNotFound,
        ErrorCode::MaxTimeMSExpired,
        ErrorCode::CommandNotFound,
        ErrorCode::ShardKeyNotFound,
        ErrorCode::ImmutableField,
        ErrorCode::ShardNotFound,
        ErrorCode::InvalidOptions,
        ErrorCode::InvalidNamespace,
        ErrorCode::ShutdownInProgress,
        ErrorCode::OperationFailed,
        ErrorCode::WriteConflict,
        ErrorCode::CommandNotSupported,
        ErrorCode::QueryPlanKilled,
        ErrorCode::ClientMetadataCannotBeMutated,
        ErrorCode::ExceededTimeLimit,
        ErrorCode::OperationNotSupportedInTransaction,
        ErrorCode::QueryExceededMemoryLimitNoDiskUseAllowed,
        ErrorCode::MechanismUnavailable,
        ErrorCode::UnsupportedOpQueryCommand,
        ErrorCode::DuplicateKey,
        ErrorCode::StaleConfig,
        ErrorCode::Location40414,
        ErrorCode::Location40571,
    ];

    /// The number MongoDB gives the code.
    pub fn code(self) -> i32 {
        match self {
            ErrorCode::InternalError => 1,
            ErrorCode::BadValue => 2,
            ErrorCode::HostUnreachable => 6,
            ErrorCode::FailedToParse => 9,
            ErrorCode::Unauthorized => 13,
            ErrorCode::TypeMismatch => 14,
            ErrorCode::ProtocolError => 17,
            ErrorCode::AuthenticationFailed => 18,
            ErrorCode::IllegalOperation => 20,
            ErrorCode::NamespaceNotFound => 26,
            ErrorCode::ConflictingUpdateOperators => 40,
            ErrorCode::CursorNotFound => 43,
            ErrorCode::MaxTimeMSExpired => 50,
            ErrorCode::CommandNotFound => 59,
            ErrorCode::ShardKeyNotFound => 61,
            ErrorCode::ImmutableField => 66,
            ErrorCode::ShardNotFound => 70,
            ErrorCode::InvalidOptions => 72,
            ErrorCode::InvalidNamespace => 73,
            ErrorCode::ShutdownInProgress => 91,
            ErrorCode::OperationFailed => 96,
            ErrorCode::WriteConflict => 112,
            ErrorCode::CommandNotSupported => 115,
            ErrorCode::QueryPlanKilled => 175,
            ErrorCode::ClientMetadataCannotBeMutated => 186,
            ErrorCode::ExceededTimeLimit => 262,
            ErrorCode::OperationNotSupportedInTransaction => 263,
            ErrorCode::QueryExceededMemoryLimitNoDiskUseAllowed => 292,
            ErrorCode::MechanismUnavailable => 334,
            ErrorCode::UnsupportedOpQueryCommand => 352,
            ErrorCode::DuplicateKey => 11000,
            ErrorCode::StaleConfig => 13388,
            ErrorCode::Location40414 => 40414,
            ErrorCode::Location40571 => 40571,
        }
    }

    /// The `codeName` MongoDB sends with the code.
    pub fn name(self) -> &'static str {
        match self {
            ErrorCode::InternalError => "InternalError",
            ErrorCode::BadValue => "BadValue",
            ErrorCode::HostUnreachable => "HostUnreachable",
            ErrorCode::FailedToParse => "FailedToParse",
            ErrorCode::Unauthorized => "Unauthorized",
            ErrorCode::TypeMismatch => "TypeMismatch",
            ErrorCode::ProtocolError => "ProtocolError",
            ErrorCode::AuthenticationFailed => "AuthenticationFailed",
            ErrorCode::IllegalOperation => "IllegalOperation",
            ErrorCode::NamespaceNotFound => "NamespaceNotFound",
            ErrorCode::ConflictingUpdateOperators => "ConflictingUpdateOperators",
            ErrorCode::CursorNotFound => "CursorNotFound",
            ErrorCode::MaxTimeMSExpired => "MaxTimeMSExpired",
            ErrorCode::CommandNotFound => "CommandNotFound",
            ErrorCode::ShardKeyNotFound => "ShardKeyNotFound",
            ErrorCode::ImmutableField => "ImmutableField",
            ErrorCode::ShardNotFound => "ShardNotFound",
            ErrorCode::InvalidOptions => "InvalidOptions",
            ErrorCode::InvalidNamespace => "InvalidNamespace",
            ErrorCode::ShutdownInProgress => "ShutdownInProgress",
            ErrorCode::OperationFailed => "OperationFailed",
            ErrorCode::WriteConflict => "WriteConflict",
            ErrorCode::CommandNotSupported => "CommandNotSupported",
            ErrorCode::QueryPlanKilled => "QueryPlanKilled",
            ErrorCode::ClientMetadataCannotBeMutated => "ClientMetadataCannotBeMutated",
            ErrorCode::ExceededTimeLimit => "ExceededTimeLimit",
            ErrorCode::OperationNotSupportedInTransaction => "OperationNotSupportedInTransaction",
            ErrorCode::QueryExceededMemoryLimitNoDiskUseAllowed => {
                "QueryExceededMemoryLimitNoDiskUseAllowed"
            }
            ErrorCode::MechanismUnavailable => "MechanismUnavailable",
            ErrorCode::UnsupportedOpQueryCommand => "UnsupportedOpQueryCommand",
            ErrorCode::DuplicateKey => "DuplicateKey",
            ErrorCode::StaleConfig => "StaleConfig",
            ErrorCode::Location40414 => "Location40414",
            ErrorCode::Location40571 => "Location40571",
        }
    }
}

/// A command that failed, as the client is told.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{message} ({} {})", self.code_name(), self.number())]
pub struct CommandError {
    pub code: ErrorCode,
    pub message: String,
    /// A code a shard answered, passed on instead of `code` (its number and name).
    pub passed: Option<(i32, String)>,
    /// `errorLabels`, as MongoDB labels the error.
    pub labels: Vec<String>,
}

impl CommandError {
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        CommandError {
            code,
            message: message.into(),
            passed: None,
            labels: Vec::new(),
        }
    }

    /// An error a shard answered with its own code and name, passed on as it came
    /// (`InternalError` stands for it where a code of the table is needed).
    pub fn passed(code: i32, name: impl Into<String>, message: impl Into<String>) -> Self {
        CommandError {
            passed: Some((code, name.into())),
            ..CommandError::new(ErrorCode::InternalError, message)
        }
    }

    /// With an error label.
    pub fn label(mut self, label: &str) -> Self {
        self.labels.push(label.to_owned());
        self
    }

    /// The code number the client is told.
    pub fn number(&self) -> i32 {
        self.passed.as_ref().map_or(self.code.code(), |(c, _)| *c)
    }

    /// The code name the client is told.
    pub fn code_name(&self) -> &str {
        self.passed
            .as_ref()
            .map_or(self.code.name(), |(_, n)| n.as_str())
    }

    /// The answer to a command no handler knows, worded as MongoDB words it.
    pub fn command_not_found(name: &str) -> Self {
        CommandError::new(
            ErrorCode::CommandNotFound,
            format!("no such command: '{name}'"),
        )
    }

    /// A field of the wrong BSON type, worded as MongoDB's command parsers word it.
    pub fn type_mismatch(command: &str, field: &str, expected: &str) -> Self {
        CommandError::new(
            ErrorCode::TypeMismatch,
            format!("BSON field '{command}.{field}' is the wrong type, expected type '{expected}'"),
        )
    }

    /// A required field left out, worded as MongoDB's command parsers word it.
    pub fn missing_field(command: &str, field: &str) -> Self {
        CommandError::new(
            ErrorCode::Location40414,
            format!("BSON field '{command}.{field}' is missing but a required field"),
        )
    }

    /// The reply document: `{ok: 0, errmsg, code, codeName}` (and `errorLabels`).
    pub fn to_document(&self) -> Document {
        let mut reply = doc! {
            "ok": 0.0,
            "errmsg": &self.message,
            "code": self.number(),
            "codeName": self.code_name(),
        };
        if !self.labels.is_empty() {
            reply.insert("errorLabels", self.labels.clone());
        }
        reply
    }

    /// The error as one entry of a write command's `writeErrors`: `{index, code, errmsg}`.
    pub fn write_error(&self, index: usize) -> Document {
        doc! { "index": index as i32, "code": self.number(), "errmsg": &self.message }
    }
}

impl From<crate::mql::MqlError> for CommandError {
    fn from(e: crate::mql::MqlError) -> Self {
        CommandError::passed(e.code, e.code_name, e.message)
    }
}

impl From<crate::router::RouterError> for CommandError {
    /// A router's error as a `mongos` would answer it: the code by what happened (and, for a
    /// shard's refusal, the shard's own code), the router's own words as the message.
    fn from(e: crate::router::RouterError) -> Self {
        use crate::router::RouterError as R;
        let message = crate::redact::redact_uri(&e.to_string());
        let code = match &e {
            R::RoutingStale => ErrorCode::StaleConfig,
            R::ShutDown => ErrorCode::ShutdownInProgress,
            R::StoreUnreachable { .. } | R::Store(_) => ErrorCode::HostUnreachable,
            R::OutcomeUnknown => ErrorCode::MaxTimeMSExpired,
            R::Write(failure) => {
                return match (failure.code, &failure.code_name) {
                    (Some(code), Some(name)) => {
                        CommandError::passed(code, name.clone(), failure.message.clone())
                    }
                    (Some(code), None) => {
                        CommandError::passed(code, "Location", failure.message.clone())
                    }
                    (None, _) => CommandError::new(ErrorCode::HostUnreachable, message),
                };
            }
            R::WriteHeld(_) | R::ReadHeld(_) => ErrorCode::ExceededTimeLimit,
            R::DuplicateId(_) => ErrorCode::DuplicateKey,
            R::MissingField(_) => ErrorCode::ShardKeyNotFound,
            R::ImmutableField(_) => ErrorCode::ImmutableField,
            R::InvalidUpdate(_) | R::InvalidCursor(_) | R::PageTooLarge { .. } | R::Routing(_) => {
                ErrorCode::BadValue
            }
            R::UnknownShard(_) => ErrorCode::ShardNotFound,
            R::Protocol(_) => ErrorCode::WriteConflict,
            R::CursorOutdated { .. } => ErrorCode::QueryPlanKilled,
            R::QueryTooLarge(_) => ErrorCode::QueryExceededMemoryLimitNoDiskUseAllowed,
            R::Mongo(inner) => match crate::shards::server_refusal(inner) {
                Some((code, name, message)) => return CommandError::passed(code, name, message),
                None => ErrorCode::HostUnreachable,
            },
        };
        CommandError::new(code, message)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_and_names_are_mongodb_s() {
        // From MongoDB's src/mongo/base/error_codes.yml.
        let expected = [
            (1, "InternalError"),
            (2, "BadValue"),
            (6, "HostUnreachable"),
            (9, "FailedToParse"),
            (13, "Unauthorized"),
            (14, "TypeMismatch"),
            (17, "ProtocolError"),
            (18, "AuthenticationFailed"),
            (20, "IllegalOperation"),
            (26, "NamespaceNotFound"),
            (40, "ConflictingUpdateOperators"),
            (43, "CursorNotFound"),
            (50, "MaxTimeMSExpired"),
            (59, "CommandNotFound"),
            (61, "ShardKeyNotFound"),
            (66, "ImmutableField"),
            (70, "ShardNotFound"),
            (72, "InvalidOptions"),
            (73, "InvalidNamespace"),
            (91, "ShutdownInProgress"),
            (96, "OperationFailed"),
            (112, "WriteConflict"),
            (115, "CommandNotSupported"),
            (175, "QueryPlanKilled"),
            (186, "ClientMetadataCannotBeMutated"),
            (262, "ExceededTimeLimit"),
            (263, "OperationNotSupportedInTransaction"),
            (292, "QueryExceededMemoryLimitNoDiskUseAllowed"),
            (334, "MechanismUnavailable"),
            (352, "UnsupportedOpQueryCommand"),
            (11000, "DuplicateKey"),
            (13388, "StaleConfig"),
            (40414, "Location40414"),
            (40571, "Location40571"),
        ];
        let got: Vec<(i32, &str)> = ErrorCode::ALL
            .iter()
            .map(|c| (c.code(), c.name()))
            .collect();
        assert_eq!(got, expected);
    }

    #[test]
    fn an_error_leaves_as_mongodb_writes_it() {
        assert_eq!(
            CommandError::command_not_found("frobnicate").to_document(),
            doc! {
                "ok": 0.0,
                "errmsg": "no such command: 'frobnicate'",
                "code": 59,
                "codeName": "CommandNotFound",
            }
        );
    }
}

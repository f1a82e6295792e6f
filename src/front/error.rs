//! The one error a command handler returns, and the table of MongoDB error codes the front
//! uses. A command error leaves the server as MongoDB writes it, `{ok: 0, errmsg, code,
//! codeName}`, with the code a `mongos` would use, so that a driver's retry and error
//! handling behave as they do against MongoDB (drivers decide by code and label, never by
//! message).

use bson::{doc, Document};

/// MongoDB's error codes that the front answers with, by their names in MongoDB's
/// `error_codes.yml`. Add a code here, with the number and name MongoDB gives it, before a
/// handler uses it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorCode {
    /// Something the front itself got wrong (a reply it could not encode).
    InternalError,
    BadValue,
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
    /// `getMore` of a cursor the front does not hold.
    CursorNotFound,
    /// A command no handler answers.
    CommandNotFound,
    InvalidOptions,
    InvalidNamespace,
    /// A request MongoDB refuses with a message of its own and no more specific code (a
    /// `getLog` of a log that does not exist).
    OperationFailed,
    /// A second `client` metadata document on one connection.
    ClientMetadataCannotBeMutated,
    /// A SASL mechanism other than SCRAM-SHA-256.
    MechanismUnavailable,
    /// A command other than the handshake over the legacy `OP_QUERY` (removed in MongoDB 5.1).
    UnsupportedOpQueryCommand,
    /// A required field of a command is missing (an IDL parser's location code).
    Location40414,
    /// An `OP_MSG` body without `$db` (a location code: MongoDB names it after its number).
    Location40571,
}

impl ErrorCode {
    pub const ALL: [ErrorCode; 17] = [
        ErrorCode::InternalError,
        ErrorCode::BadValue,
        ErrorCode::FailedToParse,
        ErrorCode::Unauthorized,
        ErrorCode::TypeMismatch,
        ErrorCode::ProtocolError,
        ErrorCode::AuthenticationFailed,
        ErrorCode::CursorNotFound,
        ErrorCode::CommandNotFound,
        ErrorCode::InvalidOptions,
        ErrorCode::InvalidNamespace,
        ErrorCode::OperationFailed,
        ErrorCode::ClientMetadataCannotBeMutated,
        ErrorCode::MechanismUnavailable,
        ErrorCode::UnsupportedOpQueryCommand,
        ErrorCode::Location40414,
        ErrorCode::Location40571,
    ];

    /// The number MongoDB gives the code.
    pub fn code(self) -> i32 {
        match self {
            ErrorCode::InternalError => 1,
            ErrorCode::BadValue => 2,
            ErrorCode::FailedToParse => 9,
            ErrorCode::Unauthorized => 13,
            ErrorCode::TypeMismatch => 14,
            ErrorCode::ProtocolError => 17,
            ErrorCode::AuthenticationFailed => 18,
            ErrorCode::CursorNotFound => 43,
            ErrorCode::CommandNotFound => 59,
            ErrorCode::InvalidOptions => 72,
            ErrorCode::InvalidNamespace => 73,
            ErrorCode::OperationFailed => 96,
            ErrorCode::ClientMetadataCannotBeMutated => 186,
            ErrorCode::MechanismUnavailable => 334,
            ErrorCode::UnsupportedOpQueryCommand => 352,
            ErrorCode::Location40414 => 40414,
            ErrorCode::Location40571 => 40571,
        }
    }

    /// The `codeName` MongoDB sends with the code.
    pub fn name(self) -> &'static str {
        match self {
            ErrorCode::InternalError => "InternalError",
            ErrorCode::BadValue => "BadValue",
            ErrorCode::FailedToParse => "FailedToParse",
            ErrorCode::Unauthorized => "Unauthorized",
            ErrorCode::TypeMismatch => "TypeMismatch",
            ErrorCode::ProtocolError => "ProtocolError",
            ErrorCode::AuthenticationFailed => "AuthenticationFailed",
            ErrorCode::CursorNotFound => "CursorNotFound",
            ErrorCode::CommandNotFound => "CommandNotFound",
            ErrorCode::InvalidOptions => "InvalidOptions",
            ErrorCode::InvalidNamespace => "InvalidNamespace",
            ErrorCode::OperationFailed => "OperationFailed",
            ErrorCode::ClientMetadataCannotBeMutated => "ClientMetadataCannotBeMutated",
            ErrorCode::MechanismUnavailable => "MechanismUnavailable",
            ErrorCode::UnsupportedOpQueryCommand => "UnsupportedOpQueryCommand",
            ErrorCode::Location40414 => "Location40414",
            ErrorCode::Location40571 => "Location40571",
        }
    }
}

/// A command that failed, as the client is told.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{message} ({} {})", .code.name(), .code.code())]
pub struct CommandError {
    pub code: ErrorCode,
    pub message: String,
}

impl CommandError {
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        CommandError {
            code,
            message: message.into(),
        }
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

    /// The reply document: `{ok: 0, errmsg, code, codeName}`.
    pub fn to_document(&self) -> Document {
        doc! {
            "ok": 0.0,
            "errmsg": &self.message,
            "code": self.code.code(),
            "codeName": self.code.name(),
        }
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
            (9, "FailedToParse"),
            (13, "Unauthorized"),
            (14, "TypeMismatch"),
            (17, "ProtocolError"),
            (18, "AuthenticationFailed"),
            (43, "CursorNotFound"),
            (59, "CommandNotFound"),
            (72, "InvalidOptions"),
            (73, "InvalidNamespace"),
            (96, "OperationFailed"),
            (186, "ClientMetadataCannotBeMutated"),
            (334, "MechanismUnavailable"),
            (352, "UnsupportedOpQueryCommand"),
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

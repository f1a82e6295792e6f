//! The error every command returns, and the exit code each kind maps to.
//!
//! | code | meaning |
//! |------|---------|
//! | 0    | done |
//! | 1    | the operation failed (a gate is closed, a server failed or the state store cannot be reached, a fault while working) |
//! | 2    | bad input or usage: nothing was changed |

use std::process::ExitCode;

/// Exit code of a command that did what it was asked.
pub const EXIT_OK: u8 = 0;
/// Exit code of a command whose operation failed.
pub const EXIT_FAILED: u8 = 1;
/// Exit code of a command refused for bad input or usage; nothing was changed.
pub const EXIT_BAD_INPUT: u8 = 2;

/// An error that knows its kind: a stable code, a hint, and whether it is bad input. The
/// state store's errors are one (`store::StoreError`); this module names none of them, so it
/// stays below every module that returns it.
pub trait Kind: std::error::Error + Send + Sync + 'static {
    /// A stable name of the kind, for errors printed as JSON (`store_unreachable`, ...).
    fn code(&self) -> &'static str;
    /// What an operator checks next, where there is something to say.
    fn hint(&self) -> Option<String>;
    /// Whether the request itself is wrong (exit 2, nothing changed) rather than failed.
    fn is_bad_input(&self) -> bool;
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The request itself is wrong (a bad file, an unknown name, a move that is not allowed).
    /// Nothing was changed.
    #[error("{0}")]
    BadInput(String),
    /// An error of a known kind (the state store said no or could not answer); its kind
    /// decides the exit code (a store that cannot be reached is a failure, exit 1; a URL it
    /// refuses, or a schema it lacks, is bad input, exit 2).
    #[error("{0}")]
    Known(Box<dyn Kind>),
    /// The request was fine but the operation did not succeed.
    #[error("{0:#}")]
    Failed(#[from] anyhow::Error),
    /// Another error, with what to check next ([`Error::with_hint`]).
    #[error("{error}")]
    Hinted { error: Box<Error>, hint: String },
}

impl Error {
    pub fn bad_input(message: impl Into<String>) -> Self {
        Error::BadInput(message.into())
    }

    pub fn failed(message: impl Into<String>) -> Self {
        Error::Failed(anyhow::anyhow!(message.into()))
    }

    /// The error with what an operator checks next; its kind and exit code stay.
    pub fn with_hint(self, hint: impl Into<String>) -> Self {
        Error::Hinted {
            error: Box::new(self),
            hint: hint.into(),
        }
    }

    /// [`Error::with_hint`] when there is a hint, else the error as it is.
    pub fn with_some_hint(self, hint: Option<String>) -> Self {
        match hint {
            Some(hint) => self.with_hint(hint),
            None => self,
        }
    }

    pub fn exit(&self) -> u8 {
        match self {
            Error::Hinted { error, .. } => error.exit(),
            Error::BadInput(_) => EXIT_BAD_INPUT,
            Error::Known(e) if e.is_bad_input() => EXIT_BAD_INPUT,
            Error::Known(_) | Error::Failed(_) => EXIT_FAILED,
        }
    }

    pub fn exit_code(&self) -> ExitCode {
        ExitCode::from(self.exit())
    }

    /// A stable name of the error's kind (`bad_input`, `failed`, or a known kind such as
    /// `store_unreachable`), for errors printed as JSON.
    pub fn code(&self) -> &'static str {
        match self {
            Error::BadInput(_) => "bad_input",
            Error::Known(e) => e.code(),
            Error::Failed(_) => "failed",
            Error::Hinted { error, .. } => error.code(),
        }
    }

    /// What to check next, where there is something to say.
    pub fn hint(&self) -> Option<String> {
        match self {
            Error::Known(e) => e.hint(),
            Error::Hinted { hint, .. } => Some(hint.clone()),
            Error::BadInput(_) | Error::Failed(_) => None,
        }
    }

    /// The error as one JSON object (`code`, `message`, `hint`, `exit`), for `--output json`.
    /// `message` is redacted: it can quote a connection string.
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "error": {
                "code": self.code(),
                "message": crate::redact::redact_uri(&self.to_string()),
                "hint": self.hint(),
                "exit": self.exit(),
            }
        })
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

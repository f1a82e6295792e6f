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

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The request itself is wrong (a bad file, an unknown name, a move that is not allowed).
    /// Nothing was changed.
    #[error("{0}")]
    BadInput(String),
    /// The state store said no or could not answer; its kind decides the exit code (a store
    /// that cannot be reached is a failure, exit 1; a URL it refuses, or a schema it lacks, is
    /// bad input, exit 2).
    #[error(transparent)]
    Store(crate::store::StoreError),
    /// The request was fine but the operation did not succeed.
    #[error("{0:#}")]
    Failed(#[from] anyhow::Error),
}

impl Error {
    pub fn bad_input(message: impl Into<String>) -> Self {
        Error::BadInput(message.into())
    }

    pub fn failed(message: impl Into<String>) -> Self {
        Error::Failed(anyhow::anyhow!(message.into()))
    }

    /// The state store's error inside, if any (directly, or under an operation's context).
    fn store(&self) -> Option<&crate::store::StoreError> {
        match self {
            Error::Store(e) => Some(e),
            Error::Failed(e) => e.chain().find_map(|c| c.downcast_ref()),
            Error::BadInput(_) => None,
        }
    }

    pub fn exit(&self) -> u8 {
        match self {
            Error::BadInput(_) => EXIT_BAD_INPUT,
            Error::Store(e) if e.is_bad_input() => EXIT_BAD_INPUT,
            Error::Store(_) | Error::Failed(_) => EXIT_FAILED,
        }
    }

    pub fn exit_code(&self) -> ExitCode {
        ExitCode::from(self.exit())
    }

    /// A stable name of the error's kind (`bad_input`, `failed`, or the state store's kind,
    /// such as `store_unreachable`), for errors printed as JSON.
    pub fn code(&self) -> &'static str {
        match (self, self.store()) {
            (_, Some(e)) => e.code(),
            (Error::BadInput(_), None) => "bad_input",
            _ => "failed",
        }
    }

    /// What to check next, where there is something to say.
    pub fn hint(&self) -> Option<String> {
        self.store().and_then(|e| e.hint())
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

//! The error every command returns, and the exit code each kind maps to.
//!
//! | code | meaning |
//! |------|---------|
//! | 0    | done |
//! | 1    | the operation failed (a gate is closed, a server failed, a fault while working) |
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
    /// The request itself is wrong (a bad file, an unknown name, a move that is not allowed,
    /// a database that cannot be reached or is not migrated). Nothing was changed.
    #[error("{0}")]
    BadInput(String),
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

    pub fn exit_code(&self) -> ExitCode {
        ExitCode::from(match self {
            Error::BadInput(_) => EXIT_BAD_INPUT,
            Error::Failed(_) => EXIT_FAILED,
        })
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

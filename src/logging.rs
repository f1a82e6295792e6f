//! Log output: `tracing` events filtered by `RESHARD_LOG` (an `EnvFilter` directive such as
//! `info` or `reshard=debug,sqlx=warn`), written to stderr as text or JSON lines.

use std::io::IsTerminal;

use tracing_subscriber::EnvFilter;

use crate::cli::LogFormat;

/// The filter without `RESHARD_LOG`: warnings and errors only.
pub const DEFAULT_FILTER: &str = "warn,sqlx=error";

/// The filter of a long-running process (`reshard worker`) without `RESHARD_LOG`: also what
/// it claimed, finished and took over, and a progress line per interval (nothing per batch or
/// per document is logged at info).
pub const PROCESS_FILTER: &str = "warn,reshard=info,sqlx=error";

/// Installs the global subscriber. Logs go to stderr so that stdout stays machine-readable.
/// `default` applies when `RESHARD_LOG` is not set.
pub fn init(format: LogFormat, default: &str) {
    let filter = EnvFilter::try_from_env("RESHARD_LOG").unwrap_or_else(|_| EnvFilter::new(default));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        // Colours only on a terminal: a log file or a pipe gets plain `key=value` text.
        .with_ansi(std::io::stderr().is_terminal());
    // A second call (tests that run commands in-process) keeps the first subscriber.
    let _ = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().flatten_event(true).try_init(),
    };
}

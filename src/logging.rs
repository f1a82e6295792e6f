//! Log output: `tracing` events filtered by `RESHARD_LOG` (an `EnvFilter` directive such as
//! `info` or `reshard=debug,sqlx=warn`), written to stderr as text or JSON lines.

use tracing_subscriber::EnvFilter;

use crate::cli::LogFormat;

/// Installs the global subscriber. Logs go to stderr so that stdout stays machine-readable.
pub fn init(format: LogFormat) {
    let filter = EnvFilter::try_from_env("RESHARD_LOG")
        .unwrap_or_else(|_| EnvFilter::new("warn,sqlx=error"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    // A second call (tests that run commands in-process) keeps the first subscriber.
    let _ = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().flatten_event(true).try_init(),
    };
}

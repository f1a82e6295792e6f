//! reshard changes how a MongoDB collection is partitioned while the application keeps running.
//!
//! Start with `ARCHITECTURE.md` for the map. The pure core ([`routing`], [`phase`]) knows
//! nothing of Postgres, MongoDB or the terminal; [`store`] holds every SQL statement; the
//! [`commands`] module is the command line's one entry point, [`run`].

pub mod bypass;
pub mod capacity;
pub mod cli;
pub mod collection_options;
mod commands;
pub mod copy;
pub mod disposition;
pub mod driver;
pub mod duration;
pub mod envelope;
pub mod error;
pub mod estimate;
pub mod events;
pub mod finish;
pub mod front;
pub mod hooks;
pub mod identity;
pub mod ids;
pub mod ledger;
mod logging;
pub mod mql;
pub mod names;
pub mod output;
pub mod phase;
pub mod prepare;
pub mod protocol;
pub mod reconcile;
pub mod redact;
pub mod router;
pub mod routing;
pub mod scope;
pub mod settings;
pub mod shadow;
pub mod shards;
pub mod spec;
pub mod store;
pub mod telemetry;
pub mod throttle;
pub mod vocabulary;
pub mod watch;
pub mod worker;

use std::process::ExitCode;

pub use cli::Cli;
pub use error::{Error, Result};

/// Parses a command line. `--help` and `--version` print and exit 0 as clap does; a usage
/// error (an unknown flag, a missing argument, a bad value) exits 2, printed by clap, or, under
/// `--output json` or `--log-format json`, as one JSON object on stderr like every other
/// error (`code` "usage", the usage and `--help` pointer as its `hint`).
pub fn parse_args<I, T>(args: I) -> std::result::Result<Cli, ExitCode>
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    use clap::Parser;
    let args: Vec<std::ffi::OsString> = args.into_iter().map(Into::into).collect();
    match Cli::try_parse_from(&args) {
        Ok(cli) => Ok(cli),
        Err(e) if !e.use_stderr() || !json_requested(&args) => e.exit(),
        Err(e) => {
            eprintln!("{}", usage_error_json(&e));
            Err(ExitCode::from(error::EXIT_BAD_INPUT))
        }
    }
}

/// Whether a command line asks for JSON output or JSON logs, read from its words (clap could
/// not parse it).
fn json_requested(args: &[std::ffi::OsString]) -> bool {
    let words: Vec<String> = args
        .iter()
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    words.iter().enumerate().any(|(i, w)| {
        let flag = |name: &str| {
            w == &format!("{name}=json")
                || (w == name && words.get(i + 1).map(String::as_str) == Some("json"))
        };
        flag("--output") || flag("--log-format")
    })
}

/// A usage error as the JSON object every error is under `--output json`.
fn usage_error_json(e: &clap::Error) -> serde_json::Value {
    let rendered = e.render().to_string();
    let lines: Vec<&str> = rendered
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect();
    // clap writes the problem first, then a tip, the usage and where to read more.
    let split = lines
        .iter()
        .position(|l| {
            l.starts_with("tip:")
                || l.starts_with("Usage:")
                || l.starts_with("For more information")
        })
        .unwrap_or(lines.len());
    let message = lines[..split]
        .join(" ")
        .trim_start_matches("error: ")
        .to_owned();
    let hint = &lines[split..];
    serde_json::json!({
        "error": {
            "code": "usage",
            "message": redact::redact_uri(&message),
            "hint": (!hint.is_empty()).then(|| hint.join(" ")),
            "exit": error::EXIT_BAD_INPUT,
        }
    })
}

/// Runs one command line to completion and returns its exit code (see [`error`]).
pub async fn run(cli: Cli) -> ExitCode {
    let default_filter = match cli.command {
        cli::Command::Worker(_) | cli::Command::Front(_) | cli::Command::Exporter(_) => {
            logging::PROCESS_FILTER
        }
        _ => logging::DEFAULT_FILTER,
    };
    logging::init(cli.log_format, default_filter);
    // Under `--output json` or `--log-format json`, stderr is read by a program: the error
    // is one JSON object there too.
    let json_errors =
        cli.output == cli::OutputFormat::Json || cli.log_format == cli::LogFormat::Json;
    match commands::run(cli).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            // Messages can quote a connection string; redact once more at the edge.
            if json_errors {
                eprintln!("{}", err.to_json());
            } else {
                eprintln!("error: {}", redact::redact_uri(&err.to_string()));
                if let Some(hint) = err.hint() {
                    eprintln!("hint: {hint}");
                }
            }
            err.exit_code()
        }
    }
}

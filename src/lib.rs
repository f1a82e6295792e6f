//! reshard changes how a MongoDB collection is partitioned while the application keeps running.
//!
//! Start with `ARCHITECTURE.md` for the map. The pure core ([`routing`], [`phase`]) knows
//! nothing of Postgres, MongoDB or the terminal; [`store`] holds every SQL statement; the
//! [`commands`] module is the command line's one entry point, [`run`].

pub mod backfill;
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
pub mod watch;

use std::process::ExitCode;

pub use cli::Cli;
pub use error::{Error, Result};

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

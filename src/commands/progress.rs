//! The driver's progress on the command line: moves on stdout (text as they happen, or one
//! JSON object at the end), waiting and other notes on stderr.

use std::sync::Mutex;
use std::time::Duration;

use crate::cli::OutputFormat;
use crate::driver::Progress;
use crate::error::Result;
use crate::output;
use crate::store::events::EventKind;
use crate::store::migrations::{Migration, Transition};
use crate::store::routers::Unacknowledged;

/// Reports a driver's progress for one command.
pub struct Stderr {
    output: OutputFormat,
    moves: Mutex<Vec<serde_json::Value>>,
}

impl Stderr {
    pub fn new(output: OutputFormat) -> Self {
        Stderr {
            output,
            moves: Mutex::default(),
        }
    }

    /// In JSON mode, prints the moves made as one object (the last move's fields plus
    /// `moves`), then passes `result` on.
    pub fn finish(&self, _ctx: &super::Ctx, result: Result<()>) -> Result<()> {
        let moves = self.moves.lock().expect("moves lock").clone();
        if let Some(last) = moves.last() {
            let mut summary = last.clone();
            summary["moves"] = serde_json::Value::Array(moves.clone());
            output::json(&summary)?;
        }
        result
    }
}

impl Progress for Stderr {
    fn moved(&self, t: &Transition, dry_run: bool) {
        match self.output {
            OutputFormat::Text => super::migration::print_move(t, dry_run),
            OutputFormat::Json => self
                .moves
                .lock()
                .expect("moves lock")
                .push(super::migration::move_json(t, dry_run)),
        }
    }

    fn waiting(&self, migration: &Migration, routers: &[Unacknowledged]) {
        let names = routers
            .iter()
            .map(|r| r.label())
            .collect::<Vec<_>>()
            .join(", ");
        eprintln!(
            "waiting for {} router(s) to acknowledge epoch {}: {names}",
            routers.len(),
            migration.epoch
        );
    }

    fn silent(&self, to: crate::phase::Phase, routers: &[crate::store::routers::SilentRouter]) {
        if routers.is_empty() {
            eprintln!("no silent router is counted any more: the {to} begins");
            return;
        }
        let names = routers
            .iter()
            .map(|r| r.label())
            .collect::<Vec<_>>()
            .join("; ");
        eprintln!(
            "before the {to}: waiting for {} router(s) that stopped heartbeating to be counted \
             out (writes flow meanwhile; a switch now would hold them until it timed out): \
             {names}",
            routers.len()
        );
    }

    fn counted_out(&self, r: &Unacknowledged) {
        eprintln!(
            "router {} counted out: its lease ran out at {} and a fence margin has passed, so \
             none of its operations can land any more; it loads the phase again before it serves",
            r.label(),
            r.lease_expires_at.to_rfc3339()
        );
    }

    fn barrier_passed(&self, migration: &Migration, waited: Duration, counted_out: usize) {
        eprintln!(
            "every router still counted acknowledged epoch {} after {:.1}s{}",
            migration.epoch,
            waited.as_secs_f64(),
            if counted_out == 0 {
                String::new()
            } else {
                format!("; {counted_out} counted out (above)")
            }
        );
    }

    fn prepared(&self, location: &str, action: &str, dry_run: bool) {
        tracing::info!(location, dry_run, "prepare: {action}");
    }

    fn finished(&self, migration: i64, kind: EventKind, details: &serde_json::Value) {
        eprintln!("migration {migration}: {kind}: {details}");
    }

    fn note(&self, message: &str) {
        tracing::info!("{message}");
    }
}

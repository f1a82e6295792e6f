//! Waiting for a migration, for scripts (`reshard migration wait`): until it reaches a phase
//! ([`Phase::reached`] decides what counts), or until a gate would pass (the check a move
//! makes, read-only: [`Store::check_gate`]). It wakes on the store's notifications and looks
//! again at least every second, since a gate can open without a notification (a partition
//! done, a router acknowledging).

use std::time::{Duration, Instant};

use crate::error::Result;
use crate::phase::{Gate, Phase, Reached};
use crate::store::migrations::Migration;
use crate::store::{Store, CHANNEL};

use super::Progress;

/// What to wait for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Until {
    Phase(Phase),
    Gate(Gate),
}

impl Until {
    pub fn as_str(self) -> &'static str {
        match self {
            Until::Phase(p) => p.as_str(),
            Until::Gate(g) => g.as_str(),
        }
    }

    /// A phase or gate name; `Err` lists the allowed ones.
    pub fn parse(name: &str) -> std::result::Result<Until, String> {
        if let Ok(phase) = name.parse::<Phase>() {
            return Ok(Until::Phase(phase));
        }
        if let Some(gate) = Gate::ALL.iter().find(|g| g.as_str() == name) {
            return Ok(Until::Gate(*gate));
        }
        let phases: Vec<&str> = Phase::ALL.iter().map(|p| p.as_str()).collect();
        let gates: Vec<&str> = Gate::ALL.iter().map(|g| g.as_str()).collect();
        Err(format!(
            "{name:?} is neither a phase nor a gate; phases: {}; gates: {}",
            phases.join(", "),
            gates.join(", ")
        ))
    }
}

/// How a wait ended.
#[derive(Debug)]
pub enum Outcome {
    /// Reached (the migration as it was then).
    Reached(Migration),
    /// It will not be reached: the migration is on the other path, or ended.
    Never(Migration),
    /// Time ran out; what was missing last.
    TimedOut {
        migration: Migration,
        missing: String,
    },
}

/// Waits for `until` on migration `id`, telling `progress` what it still waits for whenever
/// that changes.
pub async fn wait(
    store: &Store,
    id: i64,
    until: Until,
    timeout: Option<Duration>,
    progress: &dyn Progress,
) -> Result<Outcome> {
    let deadline = timeout.map(|t| Instant::now() + t);
    // The notification is a nudge; without one the loop still looks every second.
    let mut listener = match sqlx::postgres::PgListener::connect_with(store.pool()).await {
        Ok(mut l) => l.listen(CHANNEL).await.ok().map(|_| l),
        Err(_) => None,
    };
    let mut last_said = String::new();
    loop {
        let (migration, missing) = match until {
            Until::Phase(wanted) => {
                let m = store.migration(id).await?;
                match m.phase().reached(wanted) {
                    Reached::Yes => return Ok(Outcome::Reached(m)),
                    Reached::Never => return Ok(Outcome::Never(m)),
                    Reached::NotYet => {
                        let missing = format!("in {}", m.status_text());
                        (m, missing)
                    }
                }
            }
            Until::Gate(gate) => {
                let (m, verdict) = store.check_gate(id, gate).await?;
                match verdict {
                    Ok(()) => return Ok(Outcome::Reached(m)),
                    Err(_) if m.phase().is_terminal() => return Ok(Outcome::Never(m)),
                    Err(detail) => {
                        let missing = format!("in {}; {gate} is closed: {detail}", m.status_text());
                        (m, missing)
                    }
                }
            }
        };
        if missing != last_said {
            progress.note(&format!(
                "migration {id} is {missing}; waiting for {}",
                until.as_str()
            ));
            last_said = missing.clone();
        }
        let mut nap = Duration::from_secs(1);
        if let Some(deadline) = deadline {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Ok(Outcome::TimedOut { migration, missing });
            }
            nap = nap.min(left);
        }
        match listener.as_mut() {
            Some(l) => {
                if let Ok(Err(_)) = tokio::time::timeout(nap, l.recv()).await {
                    // The connection broke: poll from now on.
                    listener = None;
                }
            }
            None => tokio::time::sleep(nap).await,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_phases_or_gates_and_anything_else_lists_both() {
        assert_eq!(Until::parse("backfill"), Ok(Until::Phase(Phase::Backfill)));
        assert_eq!(
            Until::parse("backfill_complete"),
            Ok(Until::Gate(Gate::BackfillComplete))
        );
        let refused = Until::parse("done").unwrap_err();
        assert!(refused.contains("phases: planned, dual_read"), "{refused}");
        assert!(refused.contains("gates: routers_acknowledged"), "{refused}");
    }
}

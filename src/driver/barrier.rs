//! The router barrier: waiting until every router still counted acknowledged an epoch, and
//! counting out the routers whose lease ran out or that stopped heartbeating.

use std::time::{Duration, Instant};

use crate::error::{Error, Result};
use crate::phase::Phase;
use crate::store::events::EventKind;
use crate::store::migrations::Migration;

use super::*;

/// How a barrier ended, when it did not fail.
pub(super) enum Barrier {
    Passed,
    /// The routers still missing when the time ran out, by label.
    TimedOut {
        missing: Vec<String>,
    },
    /// In a switch: these routers, not acknowledged, stopped heartbeating (by the label of
    /// [`SilentRouter`](crate::store::routers::SilentRouter)), so they never will.
    Stopped {
        stopped: Vec<String>,
    },
}

impl Driver {
    /// Waits until every router that still counts has acknowledged the migration's epoch. A
    /// router is counted out a fence margin after its lease ran out: it sends no command after
    /// that, and it loads the phase again before it serves. The routers counted out while the
    /// barrier waited for them are reported, with why.
    ///
    /// A barrier that had to wait records a `barrier_waited` event, one that timed out a
    /// `barrier_timed_out` event (a failure).
    pub async fn barrier(&self, migration: &Migration, timeout: Duration) -> Result<()> {
        match self.await_routers(migration, timeout, false).await? {
            Barrier::Passed => Ok(()),
            Barrier::TimedOut { missing } | Barrier::Stopped { stopped: missing } => {
                let why = format!(
                    "{} router(s) did not acknowledge epoch {} of migration {} within {}: {}",
                    missing.len(),
                    migration.epoch,
                    migration.id,
                    humantime::format_duration(timeout),
                    missing.join(", ")
                );
                self.record_barrier_timeout(migration, timeout, &missing, None, &why)
                    .await;
                Err(Error::failed(format!(
                    "{why}; the phase is {} and the next move waits for them",
                    migration.phase()
                )))
            }
        }
    }

    pub(super) async fn record_barrier_timeout(
        &self,
        migration: &Migration,
        timeout: Duration,
        missing: &[String],
        back_to: Option<Phase>,
        why: &str,
    ) {
        self.record(
            migration.id,
            EventKind::BarrierTimedOut,
            Some(why),
            serde_json::json!({
                "epoch": migration.epoch,
                "phase": migration.phase().as_str(),
                "timeout_ms": timeout.as_millis() as u64,
                "missing": missing,
                "back_to": back_to.map(|p| p.as_str()),
            }),
        )
        .await;
    }

    /// Waits for every router still counted to acknowledge the migration's epoch, up to
    /// `timeout` (see [`Driver::barrier`]); records a `barrier_waited` event when it passed
    /// after waiting.
    /// In a write switch (`switch`), a missing router that stopped heartbeating ends the wait
    /// at once ([`Barrier::Stopped`]).
    pub(super) async fn await_routers(
        &self,
        migration: &Migration,
        timeout: Duration,
        switch: bool,
    ) -> Result<Barrier> {
        let started = Instant::now();
        let mut last_report: Option<Instant> = None;
        let mut waited_for = std::collections::BTreeSet::new();
        loop {
            // Through a state-store outage the barrier waits (routers serve meanwhile).
            let behind = match self.store.routers_behind(migration).await {
                Ok(behind) => behind,
                Err(e) if e.is_unavailable() && started.elapsed() < timeout => {
                    if last_report.is_none_or(|at| at.elapsed() >= Duration::from_secs(2)) {
                        self.progress.note(&format!(
                            "the state store is unreachable ({e}); waiting for it"
                        ));
                        last_report = Some(Instant::now());
                    }
                    tokio::time::sleep(Duration::from_millis(500)).await;
                    continue;
                }
                Err(e) => return Err(e.into()),
            };
            let (counted_out, missing): (Vec<_>, Vec<_>) =
                behind.into_iter().partition(|r| r.counted_out);
            if missing.is_empty() {
                let gone: Vec<_> = counted_out
                    .iter()
                    .filter(|r| waited_for.contains(&r.label()))
                    .collect();
                for r in &gone {
                    self.progress.counted_out(r);
                }
                if last_report.is_some() {
                    self.progress
                        .barrier_passed(migration, started.elapsed(), gone.len());
                }
                if !waited_for.is_empty() {
                    let waited = started.elapsed();
                    self.record(
                        migration.id,
                        EventKind::BarrierWaited,
                        None,
                        serde_json::json!({
                            "epoch": migration.epoch,
                            "phase": migration.phase().as_str(),
                            "waited_ms": waited.as_millis() as u64,
                            "waited_for": waited_for,
                            "counted_out": gone.iter().map(|r| r.label()).collect::<Vec<_>>(),
                        }),
                    )
                    .await;
                }
                return Ok(Barrier::Passed);
            }
            waited_for.extend(missing.iter().map(|r| r.label()));
            // In a switch, every router's writes are held until the last one acknowledges: one
            // that stopped heartbeating meanwhile (it died after its last heartbeat before the
            // switch) never will, so the switch goes back now rather than at the timeout.
            if switch {
                let stopped: Vec<String> = self
                    .store
                    .silent_routers(&migration.collection, None)
                    .await?
                    .into_iter()
                    .filter(|s| {
                        missing
                            .iter()
                            .any(|m| (&m.name, &m.host, m.pid) == (&s.name, &s.host, s.pid))
                    })
                    .map(|s| s.label())
                    .collect();
                if !stopped.is_empty() {
                    return Ok(Barrier::Stopped { stopped });
                }
            }
            if started.elapsed() >= timeout {
                return Ok(Barrier::TimedOut {
                    missing: missing.iter().map(|r| r.label()).collect(),
                });
            }
            if last_report.is_none_or(|at| at.elapsed() >= Duration::from_secs(2)) {
                self.progress.waiting(migration, &missing);
                last_report = Some(Instant::now());
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Waits, up to `timeout`, until no router of the migration's collection is silent and
    /// still counted ([`Store::silent_routers`]), before a move to `to` (a switch) holds
    /// writes. Nothing is held meanwhile: the routers serve in the current phase. A router
    /// that heartbeats again stops being waited for; one that is counted out was never going
    /// to acknowledge the switch. Past the timeout the move is not made, and the error says
    /// when each router is counted out.
    ///
    /// A router that died a moment ago is not silent for long enough yet to tell it from a
    /// live one: so every counted router must also heartbeat once after the wait begins (one
    /// interval, while writes flow). One that does not is silent soon, and waited out. Only a
    /// router that dies after that heartbeat and before the switch reaches it is left; the
    /// switch goes back as soon as it is silent ([`Driver::write_switch`]).
    pub(super) async fn await_silent_routers(
        &self,
        migration: &Migration,
        to: Phase,
        timeout: Duration,
    ) -> Result<()> {
        let started = Instant::now();
        let since = self.store.clock().await?;
        let mut last_report: Option<Instant> = None;
        let mut waited_for = std::collections::BTreeSet::new();
        loop {
            let rows = self
                .store
                .silent_routers(&migration.collection, Some(since))
                .await?;
            // A router not heard from since the wait began but not silent long yet is waited
            // for without a word, and only until the timeout: past it, the switch begins and
            // goes back if that router never acknowledges.
            let (silent, unheard): (Vec<_>, Vec<_>) = rows.into_iter().partition(|r| r.stopped);
            if silent.is_empty() && (unheard.is_empty() || started.elapsed() >= timeout) {
                if !waited_for.is_empty() {
                    let waited = started.elapsed();
                    self.progress.silent(to, &[]);
                    self.record(
                        migration.id,
                        EventKind::BarrierWaited,
                        None,
                        serde_json::json!({
                            "epoch": migration.epoch,
                            "phase": migration.phase().as_str(),
                            "before": to.as_str(),
                            "waited_ms": waited.as_millis() as u64,
                            "silent": waited_for,
                        }),
                    )
                    .await;
                }
                return Ok(());
            }
            waited_for.extend(silent.iter().map(|r| r.name.clone()));
            let names = silent
                .iter()
                .map(|r| r.label())
                .collect::<Vec<_>>()
                .join("; ");
            if started.elapsed() >= timeout {
                return Err(Error::failed(format!(
                    "the {to} of migration {} did not start: {} router(s) stopped heartbeating \
                     and cannot acknowledge it before they are counted out: {names}. Writes \
                     were not held; move again once they are counted out (or once they \
                     heartbeat again), or give a longer --timeout",
                    migration.id,
                    silent.len(),
                )));
            }
            if !silent.is_empty()
                && last_report.is_none_or(|at| at.elapsed() >= Duration::from_secs(2))
            {
                self.progress.silent(to, &silent);
                last_report = Some(Instant::now());
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }
}

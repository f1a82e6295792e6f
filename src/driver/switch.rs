//! The write switch: every router holds its writes and drains, then the migration moves on;
//! a switch that cannot complete goes back, and nothing is lost.

use crate::error::{Error, Result};
use crate::phase::{Action, Gate, Phase};
use crate::store::events::EventKind;
use crate::store::migrations::Migration;
use crate::store::StoreError;

use super::barrier::Barrier;
use super::*;

/// Why a write switch goes back.
pub(super) enum SwitchBack {
    /// These routers did not acknowledge in time.
    Routers(Vec<String>),
    /// These routers stopped heartbeating while writes were held.
    Stopped(Vec<String>),
    /// Something else failed (the bypass watch, the state store).
    Failed(String),
}

impl Driver {
    /// The write switch: once every router still counted holds its writes and has drained,
    /// no one writes the old side, and the migration moves on at once. If the
    /// acknowledgements do not all arrive in time, the migration goes back and nothing was
    /// lost.
    ///
    /// A router that stops heartbeating while writes are held sends the switch back at once;
    /// then the driver waits it out with writes flowing and makes the switch once more.
    pub(super) async fn write_switch(
        &self,
        entered: &Migration,
        options: &MoveOptions,
    ) -> Result<()> {
        self.write_switch_with(entered, options, 1).await
    }

    pub(super) async fn write_switch_with(
        &self,
        entered: &Migration,
        options: &MoveOptions,
        again: u8,
    ) -> Result<()> {
        let (forward, back) = match entered.phase() {
            Phase::RevertSwitch => (Phase::RolledBack, Phase::Reverting),
            _ => (Phase::NewWrites, Phase::DualRead),
        };
        let id = entered.id;
        let write_switch = entered.phase() == Phase::WriteSwitch;
        // Why the switch goes back, if it does: the routers missing, or another failure.
        let mut waited: std::result::Result<(), SwitchBack> = match self
            .await_routers(entered, options.switch_timeout, true)
            .await
        {
            Ok(Barrier::Passed) => Ok(()),
            Ok(Barrier::TimedOut { missing }) => Err(SwitchBack::Routers(missing)),
            Ok(Barrier::Stopped { stopped }) => Err(SwitchBack::Stopped(stopped)),
            Err(e) => Err(SwitchBack::Failed(e.to_string())),
        };
        if waited.is_ok() && write_switch {
            // Every router holds its writes and none is in flight: from here on, a plain
            // write to the source bypassed the router. Whatever came before is judged as
            // before the switch.
            if let Err(e) = self.catch_up_bypasses(entered, Some(true)).await {
                waited = Err(SwitchBack::Failed(format!(
                    "the bypass watch could not catch up: {e}"
                )));
            }
        }
        match waited {
            Ok(()) => {
                let moved = self
                    .store
                    .transition(
                        id,
                        &Action::Advance(forward),
                        &self.actor,
                        Some("write switch acknowledged"),
                        false,
                    )
                    .await;
                let t = match moved {
                    // A router lapsed behind the copy back: writes resume (mirrored) while
                    // it runs again, rather than stay held.
                    Err(StoreError::GateClosed {
                        gate: Gate::RevertComplete,
                        detail,
                    }) => {
                        let why = format!("the copy back must run again: {detail}");
                        let t = self
                            .store
                            .transition(id, &Action::Advance(back), &self.actor, Some(&why), false)
                            .await?;
                        self.progress.moved(&t, false);
                        self.barrier(&t.migration, options.timeout).await?;
                        return Err(Error::failed(format!(
                            "{why}; migration {id} went back to {back} (writes resume, \
                             mirrored), nothing was lost"
                        )));
                    }
                    moved => moved?,
                };
                self.progress.moved(&t, false);
                self.barrier(&t.migration, options.timeout).await
            }
            Err(waited) => {
                let why = match &waited {
                    SwitchBack::Routers(missing) => {
                        let why = format!(
                            "write switch timed out: {} router(s) did not acknowledge epoch {} \
                             within {}: {}",
                            missing.len(),
                            entered.epoch,
                            humantime::format_duration(options.switch_timeout),
                            missing.join(", ")
                        );
                        self.record_barrier_timeout(
                            entered,
                            options.switch_timeout,
                            missing,
                            Some(back),
                            &why,
                        )
                        .await;
                        why
                    }
                    SwitchBack::Stopped(stopped) => {
                        let why = format!(
                            "write switch went back: {} router(s) stopped heartbeating while \
                             writes were held and cannot acknowledge epoch {}: {}",
                            stopped.len(),
                            entered.epoch,
                            stopped.join("; ")
                        );
                        self.record(
                            id,
                            EventKind::SwitchFailed,
                            Some(&why),
                            serde_json::json!({
                                "epoch": entered.epoch,
                                "phase": entered.phase().as_str(),
                                "back_to": back.as_str(),
                                "stopped": stopped,
                            }),
                        )
                        .await;
                        why
                    }
                    SwitchBack::Failed(error) => {
                        let why = format!("write switch failed: {error}");
                        self.record(
                            id,
                            EventKind::SwitchFailed,
                            Some(&why),
                            serde_json::json!({
                                "epoch": entered.epoch,
                                "phase": entered.phase().as_str(),
                                "back_to": back.as_str(),
                                "error": error,
                            }),
                        )
                        .await;
                        why
                    }
                };
                if write_switch {
                    // Routers write the source plainly again once they see `dual_read`.
                    self.catch_up_bypasses(entered, Some(false)).await?;
                }
                let t = self
                    .store
                    .transition(id, &Action::Advance(back), &self.actor, Some(&why), false)
                    .await?;
                self.progress.moved(&t, false);
                if matches!(waited, SwitchBack::Stopped(_)) && again > 0 {
                    // The same move once more, as `advance` makes it (the blocking hooks ran
                    // for it already): every router applies the phase gone back to, the
                    // stopped ones are waited out while writes flow, the bypasses are read.
                    tracing::warn!(
                        migration_id = id,
                        "{why}; migration {id} went back to {back} (writes resume); waiting \
                         them out, then switching again"
                    );
                    self.barrier(&t.migration, options.timeout).await?;
                    self.await_silent_routers(&t.migration, entered.phase(), options.timeout)
                        .await?;
                    if write_switch {
                        self.catch_up_bypasses(&t.migration, None).await?;
                    }
                    let again_t = self
                        .store
                        .transition(
                            id,
                            &Action::Advance(entered.phase()),
                            &self.actor,
                            Some("switch again: the routers that stopped are counted out"),
                            false,
                        )
                        .await?;
                    self.progress.moved(&again_t, false);
                    return Box::pin(self.write_switch_with(
                        &again_t.migration,
                        options,
                        again - 1,
                    ))
                    .await;
                }
                Err(Error::failed(format!(
                    "{why}; migration {id} went back to {back}, nothing was lost"
                )))
            }
        }
    }
}

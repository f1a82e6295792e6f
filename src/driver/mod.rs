//! The migration driver, as a library: everything that moves a migration and that a
//! command, a playbook or another program needs alike.
//!
//! - [`Driver::advance`]: one move with everything around it: the preparation before
//!   `dual_read` ([`crate::prepare`]), the move itself ([`Store::transition`]), the router
//!   barrier or the write switch, and the last steps of `completed`, `rolled_back` and a return
//!   to `planned` ([`crate::finish`]);
//! - [`Driver::rollback`]: the moves of [`crate::phase::rollback_path`];
//! - [`Driver::barrier`]: waiting for every router still counted to acknowledge an epoch;
//! - [`reconcile`]: a reconciliation run (sampled, or full: partitioned, leased, resumable)
//!   and repair;
//! - [`deadletters`]: retrying dead letters.
//!
//! The driver prints nothing: it tells a [`Progress`] what happens (the command line prints
//! it to stderr; a playbook runner draws it), and returns what it did.

mod barrier;
pub mod bypass;
pub mod capacity;
pub mod deadletters;
pub mod hooks;
pub mod playbook;
pub mod reconcile;
pub mod status;
mod switch;
pub mod wait;

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::error::{Error, Result};
use crate::phase::{self, Action, Gate, Phase};
use crate::settings::MigrationSettings;
use crate::shards::Shards;
use crate::store::events::{EventKind, NewEvent};
use crate::store::migrations::{Migration, Transition};
use crate::store::routers::Unacknowledged;
use crate::store::Store;

/// How long the driver tries to read every bypass watch to its end before a move fails.
const CATCH_UP_PATIENCE: Duration = Duration::from_secs(60);

/// What the driver tells whoever runs it. Every method has a default that does nothing.
pub trait Progress: Send + Sync {
    /// A move was made (or, in a dry run, checked).
    fn moved(&self, _transition: &Transition, _dry_run: bool) {}
    /// The barrier is still waiting for these routers (reported every few seconds).
    fn waiting(&self, _migration: &Migration, _routers: &[Unacknowledged]) {}
    /// Before a switch: these routers stopped heartbeating and are not counted out yet; the
    /// switch waits for them, writes flowing (reported every few seconds).
    fn silent(&self, _to: Phase, _routers: &[crate::store::routers::SilentRouter]) {}
    /// A router the barrier waited for was counted out (its lease ran out, plus the margin).
    fn counted_out(&self, _router: &Unacknowledged) {}
    /// The barrier passed after waiting `waited`, `counted_out` routers counted out.
    fn barrier_passed(&self, _migration: &Migration, _waited: Duration, _counted_out: usize) {}
    /// Leaving `planned` created (or, in a dry run, would create) something.
    fn prepared(&self, _location: &str, _action: &str, _dry_run: bool) {}
    /// A last step ran: `tombstones_purged` or `target_removed`, with what it did.
    fn finished(&self, _migration: i64, _kind: EventKind, _details: &serde_json::Value) {}
    /// A full reconciliation waits for partitions another process holds, a soak goes on, ...
    fn note(&self, _message: &str) {}
    /// A playbook's step changed state.
    fn step(&self, _position: usize, _count: usize, _name: &str, _state: &StepState) {}
    /// Workers made progress (reported about every second while a step waits for them).
    fn task(&self, _progress: &TaskProgress) {}
}

/// Where a playbook's step stands.
#[derive(Clone, Debug, PartialEq)]
pub enum StepState {
    /// Done in an earlier run.
    AlreadyDone,
    Started,
    Done(serde_json::Value),
    /// It waits for an operator (an approval).
    Waiting(String),
    /// It failed; the run stops.
    Failed(String),
}

/// Progress of a task's workers.
#[derive(Clone, Debug, PartialEq)]
pub struct TaskProgress {
    pub migration: i64,
    pub task: crate::store::partitions::Task,
    pub partitions: i64,
    pub done: i64,
    /// Documents scanned so far.
    pub documents: i64,
    /// The documents in all, as far as the planner's estimates say; `None` while a running
    /// partition has none ([`crate::estimate::TaskSize`]).
    pub approx_documents: Option<i64>,
    pub docs_per_sec: f64,
}

/// A [`Progress`] that reports nothing.
pub struct Quiet;

impl Progress for Quiet {}

/// How a move is made.
#[derive(Clone, Debug)]
pub struct MoveOptions {
    /// Check the move (and its gates) without changing anything.
    pub dry_run: bool,
    /// Why, for the event log.
    pub reason: Option<String>,
    /// How long a barrier waits for routers.
    pub timeout: Duration,
    /// How long the write switch holds writes before it goes back.
    pub switch_timeout: Duration,
}

impl Default for MoveOptions {
    fn default() -> Self {
        MoveOptions {
            dry_run: false,
            reason: None,
            timeout: Duration::from_secs(60),
            switch_timeout: Duration::from_secs(5),
        }
    }
}

/// Drives migrations in one state store, as one actor.
#[derive(Clone)]
pub struct Driver {
    pub store: Store,
    /// Who acts, for the event log.
    pub actor: String,
    progress: Arc<dyn Progress>,
}

impl Driver {
    pub fn new(store: Store, actor: impl Into<String>, progress: Arc<dyn Progress>) -> Driver {
        Driver {
            store,
            actor: actor.into(),
            progress,
        }
    }

    pub fn progress(&self) -> &dyn Progress {
        &*self.progress
    }

    /// A connection to every registered shard. With `bulk_writer`, the driver's own write
    /// retries are off (the bulk writer owns them).
    pub async fn shards(&self, bulk_writer: bool) -> Result<Shards> {
        Shards::connect(&self.store.shards().await?, bulk_writer)
            .await
            .map_err(|e| Error::bad_input(e.to_string()))
    }

    /// Moves migration `id` to `to`, with everything around the move (see the module docs).
    /// The write switch makes two moves, or goes back when a router does not answer in time.
    pub async fn advance(&self, id: i64, to: Phase, options: &MoveOptions) -> Result<()> {
        // A move asked for while the state store is down waits for it (up to the timeout):
        // routers serve on meanwhile, and nothing moves without the store.
        let current = self.migration_when_reachable(id, options.timeout).await?;
        // A driver that stopped inside a write switch left it there (routers hold writes):
        // finish the switch, forward or back, before anything else. No hook runs while
        // writes are held; they hear about the switch once it is over.
        if matches!(current.phase(), Phase::WriteSwitch | Phase::RevertSwitch) && !options.dry_run {
            let switched = self.write_switch(&current, options).await;
            let delivered = self.deliver_hooks_after_move(id).await;
            switched?;
            delivered?;
            if self.store.migration(id).await?.phase() == to {
                return Ok(());
            }
            return Box::pin(self.advance(id, to, options)).await;
        }
        // Blocking hooks have run for everything recorded so far before anything moves: they
        // may stop the move. The others are told after it, so that none delays it.
        if !options.dry_run {
            self.deliver_blocking_hooks(id).await?;
        }
        // A move gated on every router applying the current epoch (`routers_acknowledged`)
        // waits for them first: a driver re-run after it stopped inside a barrier, or a move
        // right after a barrier that timed out, continues the wait (a dead router until it is
        // counted out) rather than fail at the gate.
        if !options.dry_run
            && current
                .phase()
                .gates_to(to)
                .contains(&Gate::RoutersAcknowledged)
        {
            self.barrier(&current, options.timeout).await?;
        }
        // A write switch holds every router's writes until all of them acknowledged it: a
        // router that stopped heartbeating (crashed, cut off) cannot, and would hold them for
        // the whole switch timeout before the switch went back. Such a router is waited out
        // first, while writes flow: it is counted out when its lease and fence margin end.
        if matches!(to, Phase::WriteSwitch | Phase::RevertSwitch) && !options.dry_run {
            self.await_silent_routers(&current, to, options.timeout)
                .await?;
        }
        if current.phase() == Phase::Planned && to == Phase::DualRead {
            self.prepare(&current, options.dry_run).await?;
        }
        // Every write that bypassed the router up to now is judged before a move that
        // requires them resolved; and the source's stream is read before the write switch,
        // so that little is left to read while writes are held.
        if current
            .phase()
            .gates_to(to)
            .contains(&Gate::BypassesResolved)
            || (to == Phase::WriteSwitch && !options.dry_run)
        {
            self.catch_up_bypasses(&current, None).await?;
        }
        let t = self
            .store
            .transition(
                id,
                &Action::Advance(to),
                &self.actor,
                options.reason.as_deref(),
                options.dry_run,
            )
            .await?;
        self.progress.moved(&t, options.dry_run);
        if options.dry_run {
            return Ok(());
        }
        // The move is made: whatever follows it (a barrier that times out, a switch that goes
        // back) is delivered to the hooks too, the failure events with it.
        let followed = self.after_move(&current, &t, to, options).await;
        let delivered = self.deliver_hooks_after_move(id).await;
        followed?;
        delivered
    }

    /// What a move needs after it: the barrier or the write switch, and the last steps of an
    /// ended migration.
    async fn after_move(
        &self,
        current: &Migration,
        t: &Transition,
        to: Phase,
        options: &MoveOptions,
    ) -> Result<()> {
        if t.change.from.phase.changes_router_behaviour(to) {
            if matches!(to, Phase::WriteSwitch | Phase::RevertSwitch) {
                self.write_switch(&t.migration, options).await?;
            } else {
                self.barrier(&t.migration, options.timeout).await?;
            }
        }
        // The revert switch moves on to rolled_back by itself once every router acknowledged.
        let reached = self.store.migration(current.id).await?;
        if matches!(
            reached.phase(),
            Phase::Completed | Phase::RolledBack | Phase::Planned
        ) && reached.phase() != current.phase()
        {
            // Nothing may be purged or dropped while a router could still act on the old
            // phase.
            self.barrier(&reached, options.timeout).await?;
            self.finish(&reached, options.timeout).await?;
        }
        Ok(())
    }

    /// Delivers to every hook once a move is made (or a switch is over): a store that went
    /// away since only delays the hooks (the next delivery sends what is pending), but a
    /// blocking hook that failed is the move's news.
    async fn deliver_hooks_after_move(&self, id: i64) -> Result<()> {
        match hooks::deliver(
            &self.store,
            Some(id),
            hooks::Which::Every,
            hooks::Wait::ForOthers,
            &self.actor,
        )
        .await
        {
            Err(e) if e.is_unavailable() => {
                tracing::warn!(migration_id = id, "hooks not delivered after the move: {e}");
                Ok(())
            }
            Err(e) => Err(e.into()),
            Ok(done) => self.held(id, &done).await,
        }
    }

    /// Delivers the migration's events to its hooks, waiting for a delivery another process
    /// has under way. Fails when a blocking hook failed (the migration is paused then).
    /// Nothing is delivered while a write switch holds writes.
    pub async fn deliver_hooks(&self, id: i64) -> Result<()> {
        let done = hooks::deliver(
            &self.store,
            Some(id),
            hooks::Which::Every,
            hooks::Wait::ForOthers,
            &self.actor,
        )
        .await?;
        self.held(id, &done).await
    }

    /// Delivers the migration's events to its blocking hooks only: what must have run before
    /// a move.
    async fn deliver_blocking_hooks(&self, id: i64) -> Result<()> {
        let done = hooks::deliver(
            &self.store,
            Some(id),
            hooks::Which::Blocking,
            hooks::Wait::ForOthers,
            &self.actor,
        )
        .await?;
        self.held(id, &done).await
    }

    /// Appends an event the driver observed (a barrier that waited or timed out, a failed
    /// preparation). A store that fails here costs the event (logged), never the outcome the
    /// caller reports.
    async fn record(
        &self,
        id: i64,
        kind: EventKind,
        reason: Option<&str>,
        details: serde_json::Value,
    ) {
        let event = NewEvent::new(kind, details).reason(reason);
        if let Err(e) = self.store.record_event(id, &self.actor, &event).await {
            tracing::warn!(
                migration_id = id,
                kind = kind.as_str(),
                "event not recorded: {e}"
            );
        }
    }

    /// The error of a delivery in which a blocking hook failed.
    async fn held(&self, id: i64, done: &hooks::Delivered) -> Result<()> {
        if done.held.is_empty() {
            return Ok(());
        }
        let hooks = self.store.hooks(id).await?;
        let errors: Vec<String> = hooks
            .iter()
            .filter(|h| done.held.contains(&h.name))
            .map(|h| {
                format!(
                    "{:?}: {}",
                    h.name,
                    h.last_error.as_deref().unwrap_or("failed")
                )
            })
            .collect();
        Err(Error::failed(format!(
            "blocking hook {} failed, and migration {id} is paused; fix the hook (or `reshard \
             hook remove {id} NAME`), then `reshard migration resume {id}` delivers the event \
             again",
            errors.join("; ")
        )))
    }

    /// Migration `id`, waiting through a state-store outage for up to `timeout`.
    async fn migration_when_reachable(&self, id: i64, timeout: Duration) -> Result<Migration> {
        let started = Instant::now();
        let mut last_report: Option<Instant> = None;
        loop {
            match self.store.migration(id).await {
                Err(e) if e.is_unavailable() && started.elapsed() < timeout => {
                    if last_report.is_none_or(|at| at.elapsed() >= Duration::from_secs(5)) {
                        self.progress.note(&format!(
                            "the state store is unreachable ({e}); the move waits for it"
                        ));
                        last_report = Some(Instant::now());
                    }
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
                other => return Ok(other?),
            }
        }
    }

    /// Rolls migration `id` back from where it is: the moves of [`phase::rollback_path`].
    /// Returns the phase reached.
    pub async fn rollback(&self, id: i64, options: &MoveOptions) -> Result<Phase> {
        let m = self.store.migration(id).await?;
        let path = phase::rollback_path(m.phase())
            .map_err(|why| Error::bad_input(format!("migration {id} cannot roll back: {why}")))?;
        for to in path {
            self.advance(id, *to, options).await?;
            if options.dry_run {
                break;
            }
        }
        Ok(self.store.migration(id).await?.phase())
    }

    /// Runs the last steps of an ended migration if a driver stopped before them: the purge
    /// after `completed`, the removal of the target after `rolled_back` (each once every
    /// router acknowledged the final epoch). Does nothing otherwise.
    pub async fn finalize(&self, id: i64, timeout: Duration) -> Result<()> {
        let m = self.store.migration(id).await?;
        let pending = match m.phase() {
            Phase::Completed => m.tombstones_purged_at.is_none(),
            Phase::RolledBack => m.target_removed_at.is_none(),
            _ => false,
        };
        if pending {
            self.barrier(&m, timeout).await?;
            self.finish(&m, timeout).await?;
        }
        Ok(())
    }

    /// Creates the target collections, with the source's options, and indexes before routers
    /// start reading the target. A refusal (options reshard cannot carry) is recorded as
    /// `prepare_failed` too, for whoever follows the log, and changes nothing else.
    async fn prepare(&self, m: &Migration, dry_run: bool) -> Result<()> {
        let prepared = self.prepare_locations(m, dry_run).await;
        if let (Err(e), false) = (&prepared, dry_run) {
            self.record(
                m.id,
                EventKind::PrepareFailed,
                Some(&e.to_string()),
                serde_json::json!({ "error": e.to_string() }),
            )
            .await;
        }
        prepared
    }

    async fn prepare_locations(&self, m: &Migration, dry_run: bool) -> Result<()> {
        let (from, to) = self.store.migration_versions(m).await?;
        let shards = self.shards(false).await?;
        // Options reshard cannot carry are the operator's to change: bad input, like a
        // version that does not validate; a server that fails is a failure.
        let done = crate::prepare::prepare(&from, &to, &shards, dry_run)
            .await
            .map_err(|e| match e {
                crate::prepare::PrepareError::Refused(refused) => Error::bad_input(format!(
                    "migration {} cannot leave planned: {refused}",
                    m.id
                )),
                e => Error::failed(crate::redact::redact_uri(&e.to_string())),
            })?;
        for p in &done {
            self.progress.prepared(&p.location, &p.action, dry_run);
        }
        if !dry_run {
            // Every location is watched for writes that bypass the router from here on.
            crate::watch::start(&self.store, &shards, m, &from, &to, true)
                .await
                .map_err(|e| Error::failed(format!("cannot start the bypass watch: {e}")))?;
        }
        Ok(())
    }

    /// Reads every bypass watch of the migration to the end of its change stream (waiting
    /// for a watch another process reads), and reports what it found. `switched`: flips the
    /// source side's write-switch flag (see `crate::bypass`).
    pub async fn catch_up_bypasses(
        &self,
        m: &Migration,
        switched: Option<bool>,
    ) -> Result<crate::watch::CatchUp> {
        let (from, to) = self.store.migration_versions(m).await?;
        let shards = self.shards(false).await?;
        // A shard that does not answer (stopped, overloaded) delays the move rather than
        // fail it at once: the read is tried again for up to a minute.
        let started = Instant::now();
        let caught = loop {
            match crate::watch::catch_up(
                &self.store,
                &shards,
                m,
                (&from, &to),
                true,
                switched,
                &self.actor,
            )
            .await
            {
                Ok(caught) => break caught,
                Err(e) if started.elapsed() < CATCH_UP_PATIENCE => {
                    self.progress.note(&format!(
                        "the bypass watch cannot read to the end yet ({}); trying again",
                        crate::redact::redact_uri(&e.to_string())
                    ));
                    tokio::time::sleep(Duration::from_secs(2)).await;
                }
                Err(e) => {
                    return Err(Error::failed(crate::redact::redact_uri(&e.to_string())));
                }
            }
        };
        if !caught.started_late.is_empty() {
            let names: Vec<String> = caught.started_late.iter().map(|l| l.to_string()).collect();
            self.progress.note(&format!(
                "migration {} left `planned` without the driver: {} watched for bypasses \
                 from now only",
                m.id,
                names.join(", ")
            ));
        }
        if caught.bypasses > 0 {
            self.progress.note(&format!(
                "{} write(s) bypassed the router (`reshard bypass list {}`)",
                caught.bypasses, m.id
            ));
        }
        Ok(caught)
    }

    /// Purges after `completed`; removes the target layout after a rollback.
    async fn finish(&self, m: &Migration, timeout: Duration) -> Result<()> {
        let (from, target) = self.store.migration_versions(m).await?;
        let shards = self.shards(false).await?;
        let failed = |e: crate::finish::FinishError| {
            Error::failed(crate::redact::redact_uri(&e.to_string()))
        };
        let (kind, details) = if m.phase() == Phase::Completed {
            let settings = MigrationSettings::from_json(&m.settings).map_err(Error::failed)?;
            let d =
                crate::finish::purge_completed(&from, &target, &shards, settings.drop_empty_source)
                    .await
                    .map_err(failed)?;
            self.store.mark_tombstones_purged(m.id).await?;
            (EventKind::TombstonesPurged, d)
        } else {
            let mut d = crate::finish::remove_target_layout(&from, &target, &shards)
                .await
                .map_err(failed)?;
            // Routers of a rollback leave source tombstones until they acknowledge the seal
            // (a router in `revert_switch` may have mirrored an older image); then purge.
            if m.phase() == Phase::RolledBack && m.sealed_at.is_none() {
                let t = self
                    .store
                    .transition(m.id, &Action::Seal, &self.actor, None, false)
                    .await?;
                self.progress.moved(&t, false);
                self.barrier(&t.migration, timeout).await?;
            }
            let purged = crate::finish::purge_source_tombstones(&from, &shards)
                .await
                .map_err(failed)?;
            if let (Some(d), serde_json::Value::Object(p)) = (d.as_object_mut(), purged) {
                d.extend(p);
            }
            self.store.mark_target_removed(m.id).await?;
            (EventKind::TargetRemoved, d)
        };
        self.store
            .record_event(m.id, &self.actor, &NewEvent::new(kind, details.clone()))
            .await?;
        self.progress.finished(m.id, kind, &details);
        Ok(())
    }
}

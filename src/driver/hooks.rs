//! Delivering a migration's events to its hooks (`crate::hooks`): each hook's command runs
//! once per event it wants, in the order of the log, with the event as JSON on stdin.
//!
//! Who delivers: `reshard worker` every second (so events that workers record, like a
//! capacity signal, reach hooks while the worker runs), the driver after each move and when a
//! playbook stops at an approval, blocking hooks also before each move (so a blocking hook on
//! a phase change has run before the next move; the others never delay one, and nothing is
//! delivered while a write switch holds writes), and `reshard hook deliver`. A hook's row is locked while its command
//! runs, so two processes never deliver the same event to it at once; a process that dies
//! mid-command leaves the event to be delivered again (at least once).

use std::process::Stdio;
use std::time::Duration;

use tokio::io::AsyncWriteExt;

use crate::hooks::{self, EventFacts, MigrationFacts, Payload};
use crate::phase::Phase;
use crate::store::hooks::{Hook, HookLock};
use crate::store::migrations::Event;
use crate::store::{Store, StoreError, StoreResult};

/// Events read per round trip while a hook catches up.
const PAGE: i64 = 100;

/// What a delivery round did.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct Delivered {
    /// Commands that ran and succeeded.
    pub delivered: u64,
    /// Commands that failed or timed out.
    pub failed: u64,
    /// Blocking hooks that failed: the migration was paused for each.
    pub held: Vec<String>,
}

/// How a delivery round treats a hook another process is delivering to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Wait {
    /// Wait for it (the driver: a blocking hook must have run before the next move).
    ForOthers,
    /// Leave it to them (a worker's background round).
    No,
}

/// Which hooks a delivery round runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Which {
    Every,
    /// Only the blocking ones: what the driver delivers before a move, since only they may
    /// stop it; the others wait until after the move, so that no command they run delays it.
    Blocking,
}

/// Delivers every event recorded so far to the hooks of `migration` (of every migration
/// with `None`). A blocking hook that fails pauses its migration (reason: the hook and its
/// error) and stays at the event until the migration is resumed.
pub async fn deliver(
    store: &Store,
    migration: Option<i64>,
    which: Which,
    wait: Wait,
    actor: &str,
) -> StoreResult<Delivered> {
    let mut out = Delivered::default();
    for hook in store.hooks_behind(migration).await? {
        if which == Which::Blocking && !hook.blocking {
            continue;
        }
        deliver_hook(store, hook.id, wait, actor, &mut out).await?;
    }
    Ok(out)
}

async fn deliver_hook(
    store: &Store,
    hook_id: i64,
    wait: Wait,
    actor: &str,
    out: &mut Delivered,
) -> StoreResult<()> {
    loop {
        let Some(mut lock) = store.lock_hook(hook_id, wait == Wait::ForOthers).await? else {
            return Ok(());
        };
        // Nothing runs while a write switch holds the application's writes (a blocking hook
        // that failed there would pause the migration with the switch unfinished): the
        // driver delivers once the switch is over.
        if lock.migration.phase().write_path() == crate::phase::WritePath::Held {
            return Ok(());
        }
        let events = lock.pending(PAGE).await?;
        let on = lock.hook.on();
        let Some(event) = events.iter().find(|e| hooks::wanted(&on, e.kind)) else {
            match events.last() {
                Some(last) => {
                    let full = events.len() as i64 == PAGE;
                    lock.passed(last.id, false).await?;
                    if full {
                        continue;
                    }
                }
                None => drop(lock),
            }
            return Ok(());
        };
        // A blocking hook held at this event waits for the operator's resume.
        if lock.hook.held_at_event == Some(event.id) && lock.migration.paused {
            return Ok(());
        }
        match run(&lock, event).await {
            Ok(()) => {
                out.delivered += 1;
                crate::telemetry::hook_run(lock.migration.id, &lock.hook.name, "ok");
                lock.passed(event.id, true).await?;
            }
            Err(error) => {
                out.failed += 1;
                crate::telemetry::hook_run(lock.migration.id, &lock.hook.name, "failed");
                let hook = lock.hook.clone();
                let migration = lock.migration.id;
                tracing::warn!(
                    migration,
                    hook = %hook.name,
                    event = event.id,
                    kind = event.kind.as_str(),
                    blocking = hook.blocking,
                    "hook failed: {error}"
                );
                lock.failed(event, &error, actor).await?;
                if hook.blocking {
                    hold(store, migration, &hook, event, &error, actor).await?;
                    out.held.push(hook.name.clone());
                    return Ok(());
                }
            }
        }
    }
}

/// Pauses the migration for a blocking hook that failed (already paused: nothing to do).
async fn hold(
    store: &Store,
    migration: i64,
    hook: &Hook,
    event: &Event,
    error: &str,
    actor: &str,
) -> StoreResult<()> {
    let reason = format!(
        "blocking hook {:?} failed on event {} ({}): {error}; fix it, then `reshard migration \
         resume {migration}` delivers the event again",
        hook.name,
        event.id,
        event.kind.as_str()
    );
    match store
        .transition(
            migration,
            &crate::phase::Action::Pause,
            actor,
            Some(&reason),
            false,
        )
        .await
    {
        Ok(_) => Ok(()),
        Err(StoreError::Move(crate::phase::MoveError::AlreadyPaused)) => Ok(()),
        Err(e) => Err(e),
    }
}

/// Runs the hook's command for `event`: `sh -c COMMAND`, the payload on stdin, within the
/// hook's timeout. The error is one line: the exit status or the timeout, and the end of what
/// the command wrote to stderr (credentials in URIs hidden).
async fn run(lock: &HookLock, event: &Event) -> std::result::Result<(), String> {
    let m = &lock.migration;
    let at = event.at.to_rfc3339();
    let phase = m.phase();
    let payload = Payload {
        hook: &lock.hook.name,
        migration: MigrationFacts {
            id: m.id,
            collection: &m.collection,
            phase: phase.as_str(),
            epoch: m.epoch,
            paused: m.paused,
            failure_reason: m.failure_reason.as_deref(),
            failure: m.failure_reason.as_deref(),
        },
        event: EventFacts {
            id: event.id,
            kind: event.kind,
            at: at.clone(),
            actor: &event.actor,
            from_phase: event.from_phase.0.map(Phase::as_str),
            to_phase: event.to_phase.0.map(Phase::as_str),
            epoch: event.epoch,
            reason: event.reason.as_deref(),
            details: &event.details,
        },
    };
    let json = serde_json::to_vec(&payload).map_err(|e| e.to_string())?;
    let mut child = tokio::process::Command::new("sh")
        .arg("-c")
        .arg(&lock.hook.command)
        .envs(payload.env())
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| format!("cannot start `sh`: {e}"))?;
    let mut stdin = child.stdin.take().expect("stdin is piped");
    let timeout = lock.hook.timeout();
    let outcome = tokio::time::timeout(timeout, async move {
        // A command that does not read its stdin closes the pipe early: that is its right.
        let _ = stdin.write_all(&json).await;
        let _ = stdin.write_all(b"\n").await;
        drop(stdin);
        child.wait_with_output().await
    })
    .await;
    match outcome {
        Err(_) => Err(format!(
            "timed out after {} (the command was killed)",
            humantime::format_duration(timeout)
        )),
        Ok(Err(e)) => Err(format!("cannot run the command: {e}")),
        Ok(Ok(output)) if output.status.success() => Ok(()),
        Ok(Ok(output)) => {
            let stderr = crate::redact::redact_uri(&String::from_utf8_lossy(&output.stderr));
            let stderr = hooks::tail(&stderr, 300).replace('\n', " | ");
            let status = match output.status.code() {
                Some(code) => format!("exit status {code}"),
                None => "killed by a signal".to_owned(),
            };
            Err(if stderr.is_empty() {
                status
            } else {
                format!("{status}: {stderr}")
            })
        }
    }
}

/// Delivers in the background every `interval` until `shutdown` (what `reshard worker` runs).
pub async fn follow(
    store: Store,
    migration: Option<i64>,
    actor: String,
    interval: Duration,
    mut shutdown: tokio::sync::watch::Receiver<bool>,
) {
    loop {
        if *shutdown.borrow() {
            return;
        }
        if let Err(e) = deliver(&store, migration, Which::Every, Wait::No, &actor).await {
            tracing::warn!("hooks: {e}");
        }
        tokio::select! {
            _ = tokio::time::sleep(interval) => {}
            _ = shutdown.changed() => {}
        }
    }
}

//! A `soak` step: the migration held in its phase for a while, watched, and failed (or rolled
//! back) when what it watches goes wrong.

use std::time::Duration;

use serde_json::json;

use crate::driver::Driver;
use crate::error::{Error, Result};
use crate::settings::MigrationSettings;
use crate::spec::playbook::Soak;
use crate::store::events::{EventKind, NewEvent};

use super::*;

/// Waits out the soak (from its first start), failing on what the step does not allow; a
/// failure is recorded as a `soak_failed` event (what was found, what was allowed).
pub(super) async fn soak(
    driver: &Driver,
    id: i64,
    step: &str,
    s: &Soak,
    started_at: Option<chrono::DateTime<chrono::Utc>>,
    options: &RunOptions,
) -> Result<Option<Outcome>> {
    let started = started_at.unwrap_or_else(chrono::Utc::now);
    let until = started + chrono::Duration::from_std(s.duration).unwrap_or_default();
    let mut shutdown = options.shutdown.clone();
    let mut router_errors: std::collections::BTreeMap<(uuid::Uuid, i64), u64> = Default::default();
    loop {
        let m = driver.store.migration(id).await?;
        // New findings: reconciliation runs that finished failing since the soak started.
        let findings: u64 = driver
            .store
            .reconciliation_runs(id)
            .await?
            .iter()
            .filter(|r| r.finished_at.is_some_and(|f| f >= started) && r.passed == Some(false))
            .map(|r| {
                r.summary["findings"]
                    .as_object()
                    .map_or(0, |o| o.values().filter_map(|v| v.as_u64()).sum())
            })
            .sum();
        let letters = driver.store.dead_letters(id, false).await?.len() as u64;
        let overload = driver
            .store
            .events(id)
            .await?
            .into_iter()
            .filter(|e| e.kind == EventKind::CapacitySignal && e.at >= started)
            .count();
        let signal_window = MigrationSettings::from_json(&m.settings)
            .map(|st| Duration::from_secs(st.capacity_signal_after_secs))
            .unwrap_or(Duration::from_secs(30));
        let lasting = match s.overload_for {
            None => overload > 0,
            // Each capacity signal stands for a window of overload.
            Some(limit) => signal_window * overload as u32 >= limit,
        };
        for r in driver.store.routers(Some(&m.collection)).await? {
            if r.heartbeat_at >= started {
                let errors = r.stats["errors"].as_u64().unwrap_or(0);
                router_errors.insert((r.id, r.heartbeat_at.timestamp_millis()), errors);
            }
        }
        let errors: u64 = router_errors.values().sum();
        let failed = if findings > s.max_findings {
            Some(SoakFailure {
                limit: "findings",
                found: findings,
                allowed: Some(s.max_findings),
                message: format!(
                    "soak: reconciliation found {findings} problem(s) since it started (at most \
                     {} allowed)",
                    s.max_findings
                ),
            })
        } else if letters > s.max_dead_letters {
            Some(SoakFailure {
                limit: "dead_letters",
                found: letters,
                allowed: Some(s.max_dead_letters),
                message: format!(
                    "soak: {letters} open dead letter(s) (at most {} allowed)",
                    s.max_dead_letters
                ),
            })
        } else if lasting {
            Some(SoakFailure {
                limit: "overload",
                found: overload as u64,
                allowed: None,
                message: format!(
                    "soak: the targets were overloaded ({overload} capacity signal(s) since it \
                     started); add capacity or lower the rate"
                ),
            })
        } else if errors > s.max_router_errors {
            Some(SoakFailure {
                limit: "router_errors",
                found: errors,
                allowed: Some(s.max_router_errors),
                message: format!(
                    "soak: routers reported {errors} error(s) since it started (at most {} \
                     allowed)",
                    s.max_router_errors
                ),
            })
        } else {
            None
        };
        if let Some(f) = failed {
            let event = NewEvent::new(
                EventKind::SoakFailed,
                json!({
                    "step": step,
                    "limit": f.limit,
                    "found": f.found,
                    "allowed": f.allowed,
                    "since": started,
                }),
            )
            .reason(Some(&f.message));
            if let Err(e) = driver.store.record_event(id, &driver.actor, &event).await {
                tracing::warn!(migration_id = id, step, "soak_failed not recorded: {e}");
            }
            return Err(Error::failed(f.message));
        }
        let now = chrono::Utc::now();
        if now >= until {
            return Ok(Some(json!({
                "seconds": s.duration.as_secs_f64(),
                "findings": findings,
                "dead_letters": letters,
                "router_errors": errors,
            })));
        }
        driver.progress().note(&format!(
            "soak: {}s left",
            (until - now).num_seconds().max(0)
        ));
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_secs(1)) => {}
            _ = shutdown.changed() => {}
        }
        if *shutdown.borrow() {
            return Ok(None);
        }
    }
}

/// What a soak found that it does not allow.
pub(super) struct SoakFailure {
    /// Which limit: `findings`, `dead_letters`, `overload`, `router_errors`.
    limit: &'static str,
    found: u64,
    /// The most allowed (`None`: none, for overload without `overload_for`).
    allowed: Option<u64>,
    message: String,
}

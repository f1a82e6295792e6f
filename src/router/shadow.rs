//! Shadow reads (issue 14; the decisions are [`crate::shadow`]'s): for the migration's share of
//! `get`s, in the phases that read the target and then the source, the router reads the id on
//! both sides from a task of its own, after the application has its answer, and compares.
//!
//! Off the latency path and bounded: the application's read only draws a number and, when it
//! is sampled, spawns a task; at most [`RouterConfig::shadow_reads_in_flight`] tasks run at
//! once and a sampled read beyond them is skipped (counted as `busy`), never queued. Every read
//! of a task ends by the router's step deadline (a router that may have been counted out reads
//! nothing), and its report to the state store is bounded like every store call of the router;
//! nothing of it can fail or slow the application's read.
//!
//! [`RouterConfig::shadow_reads_in_flight`]: super::RouterConfig::shadow_reads_in_flight

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use mongodb::bson::{Bson, Document};
use serde_json::{json, Value};
use tokio::sync::Semaphore;
use tokio::time::Instant;

use super::{Inner, Snapshot, STORE_CALL_LIMIT};
use crate::routing::{KeyValue, Location, RoutingVersion};
use crate::shadow::{self, Verdict};
use crate::shards::command;
use crate::store::shadow::NewShadowMismatch;
use crate::store::within;

/// The longest a shadow read's two lookups may take together.
const SHADOW_READ_LIMIT: Duration = Duration::from_secs(5);

/// A router's shadow reads: the configured share, the bound on tasks in flight, the counts.
pub(super) struct ShadowReads {
    /// The migration's `shadow_read_percent`, as `f64` bits; refreshed with every poll.
    percent: AtomicU64,
    in_flight: Arc<Semaphore>,
    counts: Mutex<Counts>,
    /// The counts last stored, so that a heartbeat writes them only when they changed.
    stored: Mutex<Option<Counts>>,
}

/// What this router counted since it started following `migration_id`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct Counts {
    migration_id: Option<i64>,
    /// Reads whose two sides were compared.
    compared: u64,
    /// Of them, the ones that differed.
    mismatches: u64,
    /// Sampled reads skipped because too many shadow reads were in flight.
    busy: u64,
    /// Shadow reads that failed (a shard did not answer in time, ...).
    failed: u64,
}

impl ShadowReads {
    pub(super) fn new(percent: f64, in_flight: usize) -> ShadowReads {
        ShadowReads {
            percent: AtomicU64::new(percent.to_bits()),
            in_flight: Arc::new(Semaphore::new(in_flight)),
            counts: Mutex::new(Counts::default()),
            stored: Mutex::new(None),
        }
    }

    pub(super) fn set_percent(&self, percent: f64) {
        self.percent.store(percent.to_bits(), Ordering::Relaxed);
    }

    fn percent(&self) -> f64 {
        f64::from_bits(self.percent.load(Ordering::Relaxed))
    }

    fn count(&self, migration_id: i64, change: impl FnOnce(&mut Counts)) {
        let mut counts = self.counts.lock().expect("shadow counts lock");
        if counts.migration_id != Some(migration_id) {
            *counts = Counts {
                migration_id: Some(migration_id),
                ..Counts::default()
            };
        }
        change(&mut counts);
    }

    /// The counts for the heartbeat's stats: `{"shadow_read_percent", "migration_id",
    /// "compared", "mismatches", "busy", "failed"}` since the router started following the
    /// migration (with the old names beside the new until 0.2).
    pub(super) fn report(&self) -> Value {
        let c = *self.counts.lock().expect("shadow counts lock");
        crate::vocabulary::with_old_names(json!({
            "shadow_read_percent": self.percent(),
            "migration_id": c.migration_id,
            "compared": c.compared,
            "mismatches": c.mismatches,
            "busy": c.busy,
            "failed": c.failed,
        }))
    }

    /// Stores the counts when they changed since they were stored last.
    pub(super) async fn store_counts(&self, inner: &Inner) {
        let counts = *self.counts.lock().expect("shadow counts lock");
        let Some(migration_id) = counts.migration_id else {
            return;
        };
        let stored = |c: &Option<Counts>| {
            c.is_some_and(|c| {
                c.migration_id == counts.migration_id
                    && (c.compared, c.mismatches) == (counts.compared, counts.mismatches)
            })
        };
        if stored(&self.stored.lock().expect("shadow stored lock")) {
            return;
        }
        match within(
            STORE_CALL_LIMIT,
            inner.store.record_shadow_counts(
                migration_id,
                inner.id,
                &inner.config.name,
                counts.compared,
                counts.mismatches,
            ),
        )
        .await
        {
            Ok(()) => *self.stored.lock().expect("shadow stored lock") = Some(counts),
            Err(e) => {
                tracing::warn!(router = %inner.config.name, error = %e, "cannot store the shadow-read counts")
            }
        }
    }
}

/// After a `get` answered from `snapshot`: shadows it when the phase and the sample say so.
/// Returns at once; the shadow read runs in a task of its own.
pub(super) fn after_get(inner: &Arc<Inner>, snapshot: Arc<Snapshot>, tenant: Bson, id: Bson) {
    let Some(migration_id) = snapshot.migration_id else {
        return;
    };
    let percent = inner.shadow.percent();
    if percent <= 0.0
        || !shadow::applies(snapshot.phase)
        || !shadow::sampled(percent, rand::random::<f64>())
    {
        return;
    }
    let Ok(permit) = inner.shadow.in_flight.clone().try_acquire_owned() else {
        inner.shadow.count(migration_id, |c| c.busy += 1);
        return;
    };
    let inner = inner.clone();
    tokio::spawn(async move {
        shadow_read(&inner, &snapshot, migration_id, &tenant, &id).await;
        drop(permit);
    });
}

/// Reads `id` on both sides, compares, counts, and reports a mismatch.
async fn shadow_read(
    inner: &Inner,
    snapshot: &Snapshot,
    migration_id: i64,
    tenant: &Bson,
    id: &Bson,
) {
    // A router that may have been counted out reads nothing.
    let Some(deadline) = inner.step_deadline() else {
        return;
    };
    let deadline = deadline.min(Instant::now() + SHADOW_READ_LIMIT);
    let read = async {
        let tenant_key = KeyValue::from_bson(tenant).map_err(|e| e.to_string())?;
        let id_key = KeyValue::from_bson(id).map_err(|e| e.to_string())?;
        // The read path's order: the target, then the source.
        let target = find(inner, &snapshot.target, &tenant_key, &id_key, id, deadline).await?;
        let source = find(inner, &snapshot.source, &tenant_key, &id_key, id, deadline).await?;
        Ok::<_, String>((source, target))
    };
    let (source, target) = match read.await {
        Ok(found) => found,
        Err(e) => {
            inner.shadow.count(migration_id, |c| c.failed += 1);
            tracing::debug!(router = %inner.config.name, error = %e, "a shadow read failed");
            return;
        }
    };
    let verdict = shadow::compare(
        source.as_ref().map(|(d, _)| d),
        target.as_ref().map(|(d, _)| d),
        &snapshot.source,
        &snapshot.target,
    );
    let fields = match verdict {
        Verdict::NotCompared(_) => return,
        Verdict::Equal => {
            inner.shadow.count(migration_id, |c| c.compared += 1);
            return;
        }
        Verdict::Mismatch { fields } => fields,
    };
    inner.shadow.count(migration_id, |c| {
        c.compared += 1;
        c.mismatches += 1;
    });
    let (Some((_, source_at)), Some((_, target_at))) = (&source, &target) else {
        unreachable!("a mismatch compared two documents");
    };
    let id_text = crate::ids::text(id);
    tracing::warn!(
        router = %inner.config.name, migration_id = migration_id, id = %id_text,
        source = %source_at, target = %target_at, fields = ?fields,
        "shadow read mismatch: the target's pristine copy differs from its source document"
    );
    let encoded = crate::ids::encode(id);
    let (source_at, target_at) = (source_at.to_string(), target_at.to_string());
    let report = NewShadowMismatch {
        migration_id,
        doc_id: &encoded,
        doc_id_text: &id_text,
        source_location: &source_at,
        target_location: &target_at,
        fields: &fields,
        router_name: &inner.config.name,
    };
    if let Err(e) = within(
        STORE_CALL_LIMIT,
        inner.store.report_shadow_mismatch(&report),
    )
    .await
    {
        // The next shadow read of the document reports it again.
        tracing::warn!(router = %inner.config.name, error = %e, "cannot report a shadow read mismatch");
    }
}

/// The document of `id` in `version`'s layout and where it was found (the first of the
/// candidate locations that holds it), tombstones included.
async fn find(
    inner: &Inner,
    version: &RoutingVersion,
    tenant: &KeyValue,
    id_key: &KeyValue,
    id: &Bson,
    deadline: Instant,
) -> Result<Option<(Document, Location)>, String> {
    let located = version.locate(tenant, id_key).map_err(|e| e.to_string())?;
    for location in located.locations {
        let at = inner
            .shards
            .at(&location)
            .map_err(|e| format!("unknown shard {}", e.0))?;
        let found = command::find_one(&at, mongodb::bson::doc! { "_id": id.clone() }, deadline)
            .await
            .map_err(|e| format!("{location}: {e}"))?;
        if let Some(doc) = found {
            return Ok(Some((doc, location)));
        }
    }
    Ok(None)
}

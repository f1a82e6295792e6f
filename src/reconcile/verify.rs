//! Leased verification: the partitions of a full run claimed under leases, each read and
//! judged, its figures recorded fenced by the lease token, so that a run resumes after a
//! killed process.

use std::collections::{BTreeMap, HashSet};
use std::time::{Duration, Instant};

use serde_json::json;

use crate::ids;
use crate::routing::Location;
use crate::settings::MigrationSettings;
use crate::store::partitions::{Claim, Partition};
use crate::store::reconcile::{NewFinding, VerifiedBatch};
use crate::store::StoreError;
use crate::throttle::AdaptiveRate;

use super::*;

#[derive(Debug, thiserror::Error)]
pub enum VerifyError {
    #[error(transparent)]
    Read(#[from] ReadError),
    #[error(transparent)]
    Store(#[from] crate::store::StoreError),
}

/// The presence and content checks of a full run, partitioned and leased like backfill: every
/// process running this for the same run (`reshard reconcile ID --full`, `--resume RUN`)
/// claims `verify` partitions, reads each through one cursor in `_id` order from its
/// checkpoint, checks batch by batch at the migration's throttled rate, and stores each
/// batch's findings with its checkpoint. Returns when no partition is left to claim.
#[allow(clippy::too_many_arguments)]
pub async fn verify_leased(
    store: &crate::store::Store,
    scene: &Scene,
    backfill: &[Partition],
    run_id: i64,
    settings: &MigrationSettings,
    owner: &str,
    concurrency: usize,
    ttl: Duration,
) -> Result<(), VerifyError> {
    let sources = full_sources(backfill).map_err(|e| ReadError::Mongo {
        location: Location::new("*", "*"),
        source: mongodb::error::Error::custom(e),
    })?;
    let sources = &sources;
    let rate = std::sync::Mutex::new(AdaptiveRate::new(
        settings.throttle_share(1),
        Instant::now(),
    ));
    let one_loop = || async {
        loop {
            // Verification only reads: no fence margin is needed before a takeover.
            let claim = Claim {
                token: uuid::Uuid::new_v4(),
                owner: owner.to_owned(),
                ttl,
                fence_margin: Duration::ZERO,
            };
            let Some(p) = store.claim_verify_partition(run_id, &claim).await? else {
                return Ok::<(), VerifyError>(());
            };
            let token = claim.token;
            let keeper = {
                let (store, id) = (store.clone(), p.id);
                tokio::spawn(async move {
                    loop {
                        tokio::time::sleep(ttl / 3).await;
                        if !matches!(store.extend_partition_lease(id, token, ttl).await, Ok(true)) {
                            return;
                        }
                    }
                })
            };
            let result =
                verify_partition(store, scene, sources, &p, token, ttl, settings, &rate).await;
            keeper.abort();
            result?;
        }
    };
    let loops = (0..concurrency.max(1)).map(|_| one_loop());
    for r in futures::future::join_all(loops).await {
        r?;
    }
    Ok(())
}

/// The key of a verify partition's outcomes that counts the source documents it read in a
/// backfill partition's range (`read:<partition id>`): the fresh count completeness needs.
pub const READ_PREFIX: &str = "read:";

/// Checks one `verify` partition: its `_id` range at every location ([`FullRead`]), or, for a
/// partition planned by an earlier version of reshard, at its one source location (and every
/// target location).
#[allow(clippy::too_many_arguments)]
pub(super) async fn verify_partition(
    store: &crate::store::Store,
    scene: &Scene,
    sources: &BTreeMap<Location, SourceScope>,
    p: &Partition,
    token: uuid::Uuid,
    ttl: Duration,
    settings: &MigrationSettings,
    rate: &std::sync::Mutex<AdaptiveRate>,
) -> Result<(), VerifyError> {
    let unreadable = |e: String| ReadError::Mongo {
        location: p.location(),
        source: mongodb::error::Error::custom(e),
    };
    let sources = if p.every_location() {
        sources.clone()
    } else {
        let location = p.location();
        let scope = match sources.get(&location) {
            Some(scope) => scope.clone(),
            None => SourceScope {
                tenants: p
                    .tenant_filter
                    .as_ref()
                    .map(|t| serde_json::from_value(t.clone()))
                    .transpose()
                    .map_err(|e| unreadable(format!("tenant filter unreadable: {e}")))?,
                partitions: Vec::new(),
            },
        };
        BTreeMap::from([(location, scope)])
    };
    let range = p.range().map_err(unreadable)?;
    let resume = p
        .last_id
        .as_deref()
        .map(ids::decode)
        .transpose()
        .map_err(unreadable)?;
    let mut outcomes: BTreeMap<String, u64> =
        serde_json::from_value(p.outcomes.clone()).unwrap_or_default();
    let batch_size = settings.batch_size;
    let mut read = FullRead::open(scene, sources, &range, resume.as_ref(), batch_size).await?;
    // Checkpoints are written off the checks' path, one statement at a time: what was checked
    // while one was in flight goes into the next. Verification only reads, so work checked
    // after a checkpoint that finds the lease gone is simply dropped (the new holder goes on
    // from the last checkpoint), and work lost with the process is checked again.
    let mut unrecorded = Unrecorded::default();
    let mut recording: Option<tokio::task::JoinHandle<Result<Recorded, StoreError>>> = None;
    loop {
        let mut batch = read.next_batch(scene, batch_size).await?;
        let done = batch.done;
        let wait = rate
            .lock()
            .unwrap()
            .permit(batch.source_documents, Instant::now());
        tokio::time::sleep(wait).await;
        let mut result = RunResult::default();
        let mut strata = BTreeMap::new();
        let last_id = batch.last_id.as_ref().map(ids::encode);
        for (partition, n) in std::mem::take(&mut batch.reads) {
            *outcomes
                .entry(format!("{READ_PREFIX}{partition}"))
                .or_default() += n;
        }
        tally_full(&mut batch, &mut result, &mut strata);
        // Each source location's checks and each target's placement checks are a stratum of
        // the run: the partition keeps their counts beside its outcomes.
        let mut checked = 0;
        for (name, st) in strata {
            if name.starts_with("full:") {
                checked += st.samples as i64;
            }
            *outcomes.entry(name).or_default() += st.samples;
        }
        // A document in the wrong place is found from its source and again where it sits:
        // one defect.
        let mut seen = HashSet::new();
        result.findings.retain(|f| match &f.doc_id {
            Some(id) => seen.insert((f.kind, id.clone())),
            None => true,
        });
        for (k, n) in std::mem::take(&mut result.counts) {
            *outcomes.entry(k).or_default() += n;
        }
        unrecorded.checked += checked;
        unrecorded.findings.append(&mut result.findings);
        if last_id.is_some() {
            unrecorded.last_id = last_id;
        }
        if done || recording.as_ref().is_none_or(|r| r.is_finished()) {
            if let Some(previous) = recording.take() {
                if !recorded(p, previous.await)? {
                    // The lease was taken over: whoever holds it goes on from the last
                    // checkpoint.
                    return Ok(());
                }
            }
            let batch = std::mem::take(&mut unrecorded);
            let (store, partition, outcomes) = (store.clone(), p.clone(), json!(outcomes));
            recording = Some(tokio::spawn(async move {
                let kept = store
                    .checkpoint_verify(
                        &partition,
                        token,
                        ttl,
                        &VerifiedBatch {
                            last_id: batch.last_id.as_deref(),
                            checked: batch.checked,
                            outcomes: &outcomes,
                            findings: &batch.findings,
                            done,
                        },
                    )
                    .await?;
                Ok(Recorded {
                    kept,
                    checked: batch.checked as u64,
                    findings: batch.findings.len() as u64,
                })
            }));
        }
        if done {
            let last = recording.take().expect("the last checkpoint was sent");
            recorded(p, last.await)?;
            return Ok(());
        }
    }
}

/// What a full run's partition checked since its last checkpoint was sent.
#[derive(Default)]
pub(super) struct Unrecorded {
    last_id: Option<Vec<u8>>,
    checked: i64,
    findings: Vec<NewFinding>,
}

/// A verify checkpoint's answer: whether the lease was still held, and what it recorded.
pub(super) struct Recorded {
    kept: bool,
    checked: u64,
    findings: u64,
}

/// Counts what a checkpoint recorded; `false` when the lease was gone.
pub(super) fn recorded(
    p: &Partition,
    done: Result<Result<Recorded, StoreError>, tokio::task::JoinError>,
) -> Result<bool, StoreError> {
    let r = match done {
        Ok(r) => r?,
        Err(e) => std::panic::resume_unwind(e.into_panic()),
    };
    if r.kept {
        crate::telemetry::verified(p.migration_id, &p.source_shard, r.checked, r.findings);
    }
    Ok(r.kept)
}

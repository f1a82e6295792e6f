//! The bypass watch: reads each location's change stream from where its watch stopped, judges
//! every event (`crate::bypass::classify`) and records the bypasses, moving the stored resume
//! token in the same transaction, so each event is judged once whoever reads the stream.
//!
//! Who reads: the driver, right before every move guarded by `bypasses_resolved` (and at the
//! write switch, which flips the source side from "not judged" to "judged"), `reshard bypass
//! list`, and every `reshard worker` continuously. A reader that finds a watch locked by
//! another skips it (or, for the driver, waits for it).

use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use mongodb::bson::{self, doc, Bson, Document};
use mongodb::change_stream::event::ResumeToken;
use mongodb::change_stream::ChangeStream;

use crate::bypass::{self, Change, Context, Verdict};
use crate::envelope::META;
use crate::ids;
use crate::routing::{Location, RoutingVersion};
use crate::shards::{self, Shards};
use crate::store::bypasses::{NewBypass, WatchLock};
use crate::store::migrations::Migration;
use crate::store::partitions::Task;
use crate::store::{Store, StoreError};

/// Events judged under one lock of a watch's row before its position is saved.
const EVENTS_PER_SAVE: i64 = 1_000;

/// How long one read of a stream may take: a server that stopped answering must not hold the
/// watch's row (and the driver waiting for it) for longer.
const READ_LIMIT: Duration = Duration::from_secs(30);

#[derive(Debug, thiserror::Error)]
pub enum WatchError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("the change stream of {location} failed: {reason}")]
    Stream { location: Location, reason: String },
    #[error("{0}")]
    Unknown(#[from] shards::UnknownShard),
    #[error("{0}")]
    Shards(String),
}

impl WatchError {
    fn stream(location: &Location) -> impl Fn(mongodb::error::Error) -> WatchError + '_ {
        move |e| WatchError::Stream {
            location: location.clone(),
            reason: shards::describe(&e),
        }
    }
}

/// What a catch-up read.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CatchUp {
    pub events: u64,
    pub bypasses: u64,
    /// Locations another reader held (skipped, when not waiting).
    pub busy: Vec<Location>,
    /// Locations watched from now because they had no watch (a migration moved past
    /// `planned` without the driver).
    pub started_late: Vec<Location>,
}

/// Opens a stream on every location of the migration and stores where each starts: every
/// watch afresh (`restart`, when the driver leaves `planned`), or only the missing ones.
pub async fn start(
    store: &Store,
    shards: &Shards,
    migration: &Migration,
    from: &RoutingVersion,
    to: &RoutingVersion,
    restart: bool,
) -> Result<Vec<Location>, WatchError> {
    let mut starts = Vec::new();
    let known: Vec<Location> = if restart {
        Vec::new()
    } else {
        store
            .watches(migration.id)
            .await?
            .iter()
            .map(|w| w.location())
            .collect()
    };
    for (location, role) in bypass::locations(from, to) {
        if known.contains(&location) {
            continue;
        }
        let stream = open(shards, &location, None).await?;
        starts.push((location, role, encode_token(stream.resume_token())));
    }
    Ok(store.start_watches(migration.id, &starts, restart).await?)
}

/// Reads every watch of the migration to the end of its stream. `wait`: wait for a watch
/// another reader holds rather than skip it. `switched`: set every source-side watch's
/// write-switch flag once it is read to the end (the driver, with writes held).
pub async fn catch_up(
    store: &Store,
    shards: &Shards,
    migration: &Migration,
    (from, to): (&RoutingVersion, &RoutingVersion),
    wait: bool,
    switched: Option<bool>,
    actor: &str,
) -> Result<CatchUp, WatchError> {
    let mut out = CatchUp {
        started_late: start(store, shards, migration, from, to, false).await?,
        ..CatchUp::default()
    };
    let mut cleaned = Cleaned::read(store, migration.id).await?;
    for watch in store.watches(migration.id).await? {
        let location = watch.location();
        let (events, bypasses) = match read_watch(
            store,
            shards,
            migration.id,
            &location,
            to,
            &mut cleaned,
            wait,
            switched,
            actor,
        )
        .await?
        {
            Some(read) => read,
            None => {
                out.busy.push(location);
                continue;
            }
        };
        out.events += events;
        out.bypasses += bypasses;
    }
    Ok(out)
}

/// Reads one watch to the end of its stream; `None` when another reader holds it.
#[allow(clippy::too_many_arguments)]
async fn read_watch(
    store: &Store,
    shards: &Shards,
    migration_id: i64,
    location: &Location,
    to: &RoutingVersion,
    cleaned: &mut Cleaned,
    wait: bool,
    switched: Option<bool>,
    actor: &str,
) -> Result<Option<(u64, u64)>, WatchError> {
    let (mut events_total, mut bypasses_total) = (0_u64, 0_u64);
    let horizon = Horizon::now(shards, location).await;
    loop {
        let Some(mut lock) = store.lock_watch(migration_id, location, wait).await? else {
            return Ok(None);
        };
        let token = lock.watch.resume_token.as_deref().and_then(decode_token);
        let mut stream = match open_raw(shards, location, token.clone()).await? {
            Ok(s) => s,
            Err(e) if token.is_some() && cannot_resume(&e) => {
                // The stream's history is gone (or the token is not valid here): what
                // happened since is unknown. Record the gap and watch from now.
                let why = format!("cannot resume: {}", shards::describe(&e));
                record_gap(&mut lock, to, &why).await?;
                bypasses_total += lock.recorded() as u64;
                let fresh = open(shards, location, None).await?;
                let token = encode_token(fresh.resume_token());
                lock.save(Some(token), 0, false, None, actor).await?;
                continue;
            }
            Err(e) => return Err(WatchError::stream(location)(e)),
        };
        let mut seen = 0_i64;
        let mut ended = false;
        let mut lost = false;
        while seen < EVENTS_PER_SAVE {
            let next = tokio::time::timeout(READ_LIMIT, stream.next_if_any())
                .await
                .map_err(|_| WatchError::Stream {
                    location: location.clone(),
                    reason: format!("no answer within {READ_LIMIT:?}"),
                })?;
            let Some(event) = next.map_err(WatchError::stream(location))? else {
                ended = true;
                break;
            };
            let arrived = Instant::now();
            seen += 1;
            if judge(store, &mut lock, location, to, (cleaned, arrived), &event).await? {
                lost = true;
                break;
            }
            if horizon.reached_by(&event) {
                // Everything written before this read began has been judged: with writes
                // going on, the stream never runs dry, so "the end" is this moment.
                ended = true;
                break;
            }
        }
        let recorded = lock.recorded() as u64;
        let token = if lost {
            // The stream ended for good (the collection was dropped or renamed): go on from
            // a fresh stream.
            let fresh = open(shards, location, None).await?;
            Some(encode_token(fresh.resume_token()))
        } else {
            Some(encode_token(stream.resume_token()))
        };
        let done = ended && !lost;
        lock.save(token, seen, done, if done { switched } else { None }, actor)
            .await?;
        events_total += seen as u64;
        bypasses_total += recorded;
        if done {
            return Ok(Some((events_total, bypasses_total)));
        }
    }
}

/// Reads the watches of every migration being watched (or of one) every `interval` until
/// `shutdown` turns true, skipping watches another reader holds. Errors are logged and the
/// next round tries again: the stored positions make every round resumable.
pub async fn follow(
    store: Store,
    migration: Option<i64>,
    actor: String,
    interval: Duration,
    mut shutdown: tokio::sync::watch::Receiver<bool>,
) {
    let mut shards: Option<Shards> = None;
    loop {
        if *shutdown.borrow() {
            return;
        }
        if let Err(e) = follow_round(&store, &mut shards, migration, &actor).await {
            tracing::warn!("bypass watch: {e}");
            shards = None;
        }
        tokio::select! {
            _ = tokio::time::sleep(interval) => {}
            _ = shutdown.changed() => {}
        }
    }
}

async fn follow_round(
    store: &Store,
    shards: &mut Option<Shards>,
    migration: Option<i64>,
    actor: &str,
) -> Result<(), WatchError> {
    let migrations = match migration {
        Some(id) => vec![store.migration(id).await?],
        None => store.migrations(false).await?,
    };
    for m in migrations {
        if m.phase().is_terminal() || store.watches(m.id).await?.is_empty() {
            continue;
        }
        if shards.is_none() {
            let registered = store.shards().await?;
            *shards = Some(
                Shards::connect(&registered, false)
                    .await
                    .map_err(|e| WatchError::Shards(e.to_string()))?,
            );
        }
        let Some(connected) = shards.as_ref() else {
            continue;
        };
        let (from, to) = store.migration_versions(&m).await?;
        let caught = catch_up(store, connected, &m, (&from, &to), false, None, actor).await?;
        if caught.bypasses > 0 {
            tracing::warn!(
                migration_id = m.id,
                bypasses = caught.bypasses,
                "writes bypassed the router (`reshard bypass list {}`)",
                m.id
            );
        }
    }
    Ok(())
}

/// The moment a read began, by the server's clock where it tells it (the `operationTime` of a
/// `ping`), else by this process's: an event at or past it ends the read.
enum Horizon {
    Cluster(bson::Timestamp),
    Wall(DateTime<Utc>),
}

impl Horizon {
    async fn now(shards: &Shards, location: &Location) -> Horizon {
        match shards.operation_time(location).await {
            Some(t) => Horizon::Cluster(t),
            None => Horizon::Wall(Utc::now()),
        }
    }

    fn reached_by(&self, event: &Document) -> bool {
        match self {
            Horizon::Cluster(h) => event
                .get_timestamp("clusterTime")
                .is_ok_and(|t| (t.time, t.increment) >= (h.time, h.increment)),
            Horizon::Wall(h) => happened_at(event) >= *h,
        }
    }
}

/// Judges one event (`arrived`: when this reader received it) and records it when it is a
/// bypass. Returns whether the stream ended for good.
async fn judge(
    store: &Store,
    lock: &mut WatchLock,
    location: &Location,
    to: &RoutingVersion,
    (cleaned, arrived): (&mut Cleaned, Instant),
    event: &Document,
) -> Result<bool, WatchError> {
    let op = event.get_str("operationType").unwrap_or("");
    let id = event
        .get_document("documentKey")
        .ok()
        .and_then(|k| k.get("_id"))
        .cloned();
    let empty = Document::new();
    let full = event.get_document("fullDocument").unwrap_or(&empty);
    let change = match op {
        "insert" => Change::Insert(full),
        "replace" => Change::Replace(full),
        "update" => Change::Update(
            event
                .get_document("updateDescription")
                .map(bypass::update_paths)
                .unwrap_or_default(),
        ),
        "delete" => Change::Delete,
        "invalidate" | "drop" | "rename" | "dropDatabase" => {
            Change::Lost(format!("the stream saw `{op}`"))
        }
        _ => Change::Other,
    };
    let lost = matches!(change, Change::Lost(_));
    let role = lock.watch.role;
    let in_cleaned_range = match (&change, &id) {
        (Change::Delete, Some(id)) if role.holds_source() => {
            cleaned.cover(store, location, id, arrived).await?
        }
        _ => false,
    };
    let ctx = Context {
        role,
        switched: lock.watch.switched,
        routing_field: to.routing_field(),
        in_cleaned_range,
    };
    if let Verdict::Bypass(operation) = bypass::classify(&ctx, &change) {
        let details = match &change {
            Change::Update(paths) => serde_json::json!({ "fields": paths }),
            Change::Lost(why) => serde_json::json!({ "why": why }),
            _ => serde_json::json!({}),
        };
        lock.record(&NewBypass {
            doc_id: id.as_ref().map(ids::encode),
            doc_id_text: id.as_ref().map(ids::text),
            operation,
            happened_at: happened_at(event),
            details,
        })
        .await?;
    }
    Ok(lost)
}

async fn record_gap(
    lock: &mut WatchLock,
    to: &RoutingVersion,
    why: &str,
) -> Result<(), WatchError> {
    let ctx = Context {
        role: lock.watch.role,
        switched: lock.watch.switched,
        routing_field: to.routing_field(),
        in_cleaned_range: false,
    };
    if let Verdict::Bypass(operation) = bypass::classify(&ctx, &Change::Lost(why.to_owned())) {
        lock.record(&NewBypass {
            doc_id: None,
            doc_id_text: None,
            operation,
            happened_at: Utc::now(),
            details: serde_json::json!({ "why": why }),
        })
        .await?;
    }
    Ok(())
}

/// When the server made the write: the event's wall time, else its cluster time's seconds.
fn happened_at(event: &Document) -> DateTime<Utc> {
    if let Ok(t) = event.get_datetime("wallTime") {
        return DateTime::from_timestamp_millis(t.timestamp_millis()).unwrap_or_else(Utc::now);
    }
    if let Ok(ts) = event.get_timestamp("clusterTime") {
        return DateTime::from_timestamp(i64::from(ts.time), 0).unwrap_or_else(Utc::now);
    }
    Utc::now()
}

async fn open(
    shards: &Shards,
    location: &Location,
    resume_after: Option<ResumeToken>,
) -> Result<ChangeStream<Document>, WatchError> {
    open_raw(shards, location, resume_after)
        .await?
        .map_err(WatchError::stream(location))
}

/// The stream, or the server's refusal to open it (kept whole, to tell why).
async fn open_raw(
    shards: &Shards,
    location: &Location,
    resume_after: Option<ResumeToken>,
) -> Result<Result<ChangeStream<Document>, mongodb::error::Error>, WatchError> {
    // Only what the judgement reads: a copy's or a router's whole document would otherwise
    // cross the network again for every write the migration makes.
    let pipeline = vec![doc! {
        "$project": {
            "operationType": 1, "documentKey": 1, "updateDescription": 1,
            "wallTime": 1, "clusterTime": 1, format!("fullDocument.{META}.src"): 1,
        }
    }];
    Ok(shards
        .change_stream(location, pipeline, resume_after, Duration::from_millis(200))
        .await?)
}

/// Whether resuming failed because the token cannot be resumed from (its history is gone, or
/// it is not a token of this stream), rather than for a passing reason.
fn cannot_resume(e: &mongodb::error::Error) -> bool {
    use mongodb::error::ErrorKind;
    let ErrorKind::Command(c) = &*e.kind else {
        return false;
    };
    // ChangeStreamHistoryLost, ChangeStreamFatalError, InvalidResumeToken, and FailedToParse
    // (a token the server cannot read).
    matches!(c.code, 286 | 280 | 260 | 9) || c.code_name == "ChangeStreamHistoryLost"
}

fn encode_token(token: Option<ResumeToken>) -> Vec<u8> {
    let value = token
        .and_then(|t| bson::to_bson(&t).ok())
        .unwrap_or(Bson::Null);
    bson::to_vec(&doc! { "t": value }).unwrap_or_default()
}

fn decode_token(bytes: &[u8]) -> Option<ResumeToken> {
    let d: Document = bson::from_slice(bytes).ok()?;
    match d.get("t")? {
        Bson::Null => None,
        t => bson::from_bson(t.clone()).ok(),
    }
}

/// An `_id` range the cleaner has claimed on a source location.
struct CleanedRange {
    location: Location,
    range: ids::IdRange,
}

impl CleanedRange {
    fn contains(&self, location: &Location, id: &Bson) -> bool {
        &self.location == location && self.range.contains(id)
    }
}

/// The `_id` ranges the cleaner has claimed, as last read from the store. A cleaner commits its
/// claim before it deletes anything in the range, so any read of the store begun after a
/// delete event arrived sees the claim behind it: a delete outside the ranges read before it
/// arrived is checked against a fresh read before it is called a bypass. (Judged against the
/// ranges read when a catch-up began, a range claimed while it read was missed, and the
/// cleaner's deletes in it were recorded as bypasses, closing `bypasses_resolved` before
/// `completed`.)
struct Cleaned {
    migration_id: i64,
    ranges: Vec<CleanedRange>,
    /// When the read of `ranges` began.
    read_at: Instant,
}

impl Cleaned {
    async fn read(store: &Store, migration_id: i64) -> Result<Cleaned, WatchError> {
        let read_at = Instant::now();
        let ranges = store
            .partitions(migration_id, Task::Cleanup)
            .await?
            .into_iter()
            .filter(|p| p.started_at.is_some())
            // A range that cannot be read is no claim.
            .filter_map(|p| {
                Some(CleanedRange {
                    location: p.location(),
                    range: p.range().ok()?,
                })
            })
            .collect();
        Ok(Cleaned {
            migration_id,
            ranges,
            read_at,
        })
    }

    fn holds(&self, location: &Location, id: &Bson) -> bool {
        self.ranges.iter().any(|r| r.contains(location, id))
    }

    /// Whether the cleaner had claimed `id` on `location` when its delete, received at
    /// `arrived`, was read: the ranges are read again unless they were read after it.
    async fn cover(
        &mut self,
        store: &Store,
        location: &Location,
        id: &Bson,
        arrived: Instant,
    ) -> Result<bool, WatchError> {
        if self.holds(location, id) {
            return Ok(true);
        }
        if self.read_at > arrived {
            return Ok(false);
        }
        *self = Cleaned::read(store, self.migration_id).await?;
        Ok(self.holds(location, id))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_survive_the_round_trip_and_none_stays_none() {
        assert!(decode_token(&encode_token(None)).is_none());
        assert!(decode_token(b"not bson").is_none());
        let token: ResumeToken = bson::from_bson(Bson::Document(doc! { "_data": "82AB" })).unwrap();
        let back = decode_token(&encode_token(Some(token.clone()))).unwrap();
        assert_eq!(back, token);
    }

    #[test]
    fn cleaned_ranges_hold_ids_of_their_location_and_bracket_only() {
        let here = Location::new("s1", "orders");
        let r = CleanedRange {
            location: here.clone(),
            range: ids::IdRange {
                bracket: Some(ids::Bracket::Number),
                lower: Some(Bson::Int32(10)),
                upper: Some(Bson::Int32(20)),
            },
        };
        assert!(r.contains(&here, &Bson::Int64(10)));
        assert!(r.contains(&here, &Bson::Double(19.0)));
        assert!(!r.contains(&here, &Bson::Int32(20)));
        assert!(!r.contains(&here, &Bson::Int32(9)));
        assert!(!r.contains(&here, &Bson::String("15".into())));
        assert!(!r.contains(&Location::new("s2", "orders"), &Bson::Int32(15)));
        let open = CleanedRange {
            location: here.clone(),
            range: ids::IdRange {
                lower: None,
                upper: None,
                ..r.range.clone()
            },
        };
        assert!(open.contains(&here, &Bson::Int64(i64::MAX)));
        // A range across types holds every type between its bounds.
        let across = CleanedRange {
            location: here.clone(),
            range: ids::IdRange {
                bracket: None,
                lower: Some(Bson::Int32(10)),
                upper: Some(Bson::String("m".into())),
            },
        };
        assert!(across.contains(&here, &Bson::String("a".into())));
        assert!(across.contains(&here, &Bson::Int64(i64::MAX)));
        assert!(!across.contains(&here, &Bson::String("m".into())));
        assert!(!across.contains(&here, &Bson::Int32(9)));
        assert!(!across.contains(&here, &Bson::Null));
    }
}

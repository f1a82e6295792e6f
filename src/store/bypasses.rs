//! Bypass watches (one change stream position per location of a migration) and the bypasses
//! they recorded (`crate::bypass`).

use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::{Postgres, Transaction};

use super::events::{self, EventKind, NewEvent};
use super::migrations::{Migration, MIGRATION_COLUMNS};
use super::{Store, StoreError, StoreResult};
use crate::bypass::{Operation, Resolution, Role};
use crate::phase::Phase;
use crate::routing::Location;

/// The phases in which a bypass is recorded: from the moment the driver leaves `planned` until
/// the migration ends (what is written after that is no longer the migration's business).
const WATCHED_PHASES: &str = "('dual_read', 'write_switch', 'new_writes', 'backfill', \
     'reconcile', 'new_reads', 'cleanup', 'reverting', 'revert_switch')";

/// How recently every watch must have read its stream to the end for the
/// `bypasses_resolved` gate (the driver catches up right before the moves it guards).
pub const CAUGHT_UP_WITHIN_SECS: i64 = 120;

/// One watched location.
#[derive(Clone, Debug, Serialize, sqlx::FromRow)]
pub struct Watch {
    pub migration_id: i64,
    pub shard: String,
    pub collection: String,
    #[sqlx(try_from = "String")]
    pub role: Role,
    #[serde(skip)]
    pub resume_token: Option<Vec<u8>>,
    pub switched: bool,
    pub events_seen: i64,
    pub started_at: DateTime<Utc>,
    pub caught_up_at: Option<DateTime<Utc>>,
}

impl Watch {
    pub fn location(&self) -> Location {
        Location::new(self.shard.clone(), self.collection.clone())
    }
}

/// A bypass as the watch found it.
#[derive(Clone, Debug)]
pub struct NewBypass {
    pub doc_id: Option<Vec<u8>>,
    pub doc_id_text: Option<String>,
    pub operation: Operation,
    pub happened_at: DateTime<Utc>,
    pub details: serde_json::Value,
}

/// A recorded bypass.
#[derive(Clone, Debug, Serialize, sqlx::FromRow)]
pub struct Bypass {
    pub id: i64,
    pub migration_id: i64,
    pub shard: String,
    pub collection: String,
    /// The document's `_id` (Extended JSON), when the event named one.
    #[serde(rename = "_id", serialize_with = "crate::ids::serialize_encoded_opt")]
    pub doc_id: Option<Vec<u8>>,
    #[serde(rename = "id_text")]
    pub doc_id_text: Option<String>,
    #[sqlx(try_from = "String")]
    pub operation: Operation,
    #[sqlx(try_from = "String")]
    pub phase: Phase,
    pub happened_at: DateTime<Utc>,
    pub seen_at: DateTime<Utc>,
    pub details: serde_json::Value,
    pub resolution: Option<String>,
    pub resolved_at: Option<DateTime<Utc>>,
    pub resolved_by: Option<String>,
    pub reason: Option<String>,
}

impl Bypass {
    pub fn location(&self) -> Location {
        Location::new(self.shard.clone(), self.collection.clone())
    }
}

/// Open and total bypasses of a migration, and its watches.
#[derive(Clone, Debug, Default, Serialize)]
pub struct BypassSummary {
    pub open: i64,
    pub total: i64,
    pub watches: Vec<Watch>,
}

/// A watch's row, locked for one reader of its stream until [`WatchLock::save`].
pub struct WatchLock {
    tx: Transaction<'static, Postgres>,
    pub watch: Watch,
    recorded: Vec<(Operation, Option<String>)>,
}

const WATCH_COLUMNS: &str = "migration_id, shard, collection, role, resume_token, switched, \
     events_seen, started_at, caught_up_at";
const BYPASS_COLUMNS: &str = "id, migration_id, shard, collection, doc_id, doc_id_text, \
     operation, phase, happened_at, seen_at, details, resolution, resolved_at, resolved_by, reason";

impl Store {
    /// Records where each location's stream starts. `restart`: every watch starts again here
    /// (leaving `planned`); otherwise only locations not watched yet get a row. Returns the
    /// locations that got a new starting point.
    pub async fn start_watches(
        &self,
        migration_id: i64,
        watches: &[(Location, Role, Vec<u8>)],
        restart: bool,
    ) -> StoreResult<Vec<Location>> {
        let mut tx = self.pool().begin().await?;
        let mut started = Vec::new();
        for (location, role, token) in watches {
            let sql = if restart {
                "INSERT INTO bypass_watches (migration_id, shard, collection, role, resume_token)
                 VALUES ($1, $2, $3, $4, $5)
                 ON CONFLICT (migration_id, shard, collection) DO UPDATE
                 SET role = $4, resume_token = $5, switched = false, started_at = now(),
                     caught_up_at = NULL
                 RETURNING true"
            } else {
                "INSERT INTO bypass_watches (migration_id, shard, collection, role, resume_token)
                 VALUES ($1, $2, $3, $4, $5)
                 ON CONFLICT (migration_id, shard, collection) DO NOTHING
                 RETURNING true"
            };
            let inserted: Option<bool> = sqlx::query_scalar(sql)
                .bind(migration_id)
                .bind(&location.shard)
                .bind(&location.collection)
                .bind(role.as_str())
                .bind(token)
                .fetch_optional(&mut *tx)
                .await?;
            if inserted.is_some() {
                started.push(location.clone());
            }
        }
        tx.commit().await?;
        Ok(started)
    }

    pub async fn watches(&self, migration_id: i64) -> StoreResult<Vec<Watch>> {
        Ok(sqlx::query_as(&format!(
            "SELECT {WATCH_COLUMNS} FROM bypass_watches WHERE migration_id = $1
             ORDER BY shard, collection"
        ))
        .bind(migration_id)
        .fetch_all(self.pool())
        .await?)
    }

    /// Locks a watch's row for reading its stream. `wait`: until another reader is done;
    /// otherwise `None` while another reader holds it.
    pub async fn lock_watch(
        &self,
        migration_id: i64,
        location: &Location,
        wait: bool,
    ) -> StoreResult<Option<WatchLock>> {
        let mut tx = self.pool().begin().await?;
        if wait {
            // Another reader holds the row at most for one bounded read of its stream.
            sqlx::query("SET LOCAL lock_timeout = '90s'")
                .execute(&mut *tx)
                .await?;
        }
        let watch: Option<Watch> = sqlx::query_as(&format!(
            "SELECT {WATCH_COLUMNS} FROM bypass_watches
             WHERE migration_id = $1 AND shard = $2 AND collection = $3
             FOR UPDATE {}",
            if wait { "" } else { "SKIP LOCKED" }
        ))
        .bind(migration_id)
        .bind(&location.shard)
        .bind(&location.collection)
        .fetch_optional(&mut *tx)
        .await?;
        Ok(watch.map(|watch| WatchLock {
            tx,
            watch,
            recorded: Vec::new(),
        }))
    }

    /// Bypasses of a migration, oldest first: the open ones, or all.
    pub async fn bypasses(&self, migration_id: i64, all: bool) -> StoreResult<Vec<Bypass>> {
        self.migration(migration_id).await?;
        Ok(sqlx::query_as(&format!(
            "SELECT {BYPASS_COLUMNS} FROM bypasses
             WHERE migration_id = $1 AND ($2 OR resolved_at IS NULL) ORDER BY id"
        ))
        .bind(migration_id)
        .bind(all)
        .fetch_all(self.pool())
        .await?)
    }

    pub async fn bypass_summary(&self, migration_id: i64) -> StoreResult<BypassSummary> {
        let (open, total): (i64, i64) = sqlx::query_as(
            "SELECT count(*) FILTER (WHERE resolved_at IS NULL), count(*)
             FROM bypasses WHERE migration_id = $1",
        )
        .bind(migration_id)
        .fetch_one(self.pool())
        .await?;
        Ok(BypassSummary {
            open,
            total,
            watches: self.watches(migration_id).await?,
        })
    }

    /// Marks an open bypass resolved and logs it. Fails when it is not open.
    pub async fn resolve_bypass(
        &self,
        migration_id: i64,
        bypass_id: i64,
        resolution: Resolution,
        reason: &str,
        outcome: &str,
        actor: &str,
    ) -> StoreResult<Bypass> {
        let mut tx = self.pool().begin().await?;
        let resolved: Option<Bypass> = sqlx::query_as(&format!(
            "UPDATE bypasses SET resolution = $3, resolved_at = now(), resolved_by = $4,
                 reason = $5, details = details || jsonb_build_object('outcome', $6::text)
             WHERE migration_id = $1 AND id = $2 AND resolved_at IS NULL
             RETURNING {BYPASS_COLUMNS}"
        ))
        .bind(migration_id)
        .bind(bypass_id)
        .bind(resolution.as_str())
        .bind(actor)
        .bind(reason)
        .bind(outcome)
        .fetch_optional(&mut *tx)
        .await?;
        let Some(b) = resolved else {
            return Err(StoreError::NotFound(format!(
                "migration {migration_id} has no open bypass {bypass_id} \
                 (`reshard bypass list {migration_id}`)"
            )));
        };
        let migration = migration_in(&mut tx, migration_id).await?;
        let details = serde_json::json!({
            "bypass": b.id,
            "location": b.location().to_string(),
            "_id": b.doc_id.as_deref().map(crate::ids::extjson_encoded),
            "operation": b.operation,
            "resolution": resolution.as_str(),
            "outcome": outcome,
        });
        events::insert(
            &mut tx,
            &migration,
            actor,
            &NewEvent::new(EventKind::BypassResolved, details).reason(Some(reason)),
        )
        .await?;
        self.finish(tx).await?;
        Ok(b)
    }
}

impl WatchLock {
    /// Records a bypass, unless the migration is no longer in a watched phase (a write made
    /// after it ended, such as the purge of tombstones, is not its business). Returns whether
    /// it was recorded.
    pub async fn record(&mut self, bypass: &NewBypass) -> StoreResult<bool> {
        let recorded: Option<i64> = sqlx::query_scalar(&format!(
            "INSERT INTO bypasses (migration_id, shard, collection, doc_id, doc_id_text,
                                   operation, phase, happened_at, details)
             SELECT m.id, $2, $3, $4, $5, $6, m.phase, $7, $8 FROM migrations m
             WHERE m.id = $1 AND m.phase IN {WATCHED_PHASES}
             RETURNING id"
        ))
        .bind(self.watch.migration_id)
        .bind(&self.watch.shard)
        .bind(&self.watch.collection)
        .bind(&bypass.doc_id)
        .bind(&bypass.doc_id_text)
        .bind(bypass.operation.as_str())
        .bind(bypass.happened_at)
        .bind(&bypass.details)
        .fetch_optional(&mut *self.tx)
        .await?;
        if recorded.is_some() {
            crate::telemetry::bypass(self.watch.migration_id, bypass.operation.as_str());
            self.recorded
                .push((bypass.operation, bypass.doc_id_text.clone()));
        }
        Ok(recorded.is_some())
    }

    /// Saves the stream's new position and commits what was recorded, with one event for
    /// the bypasses found. `caught_up`: the stream was read to its end. `switched`: the
    /// write switch was passed (or undone) for this location.
    pub async fn save(
        mut self,
        token: Option<Vec<u8>>,
        events_seen: i64,
        caught_up: bool,
        switched: Option<bool>,
        actor: &str,
    ) -> StoreResult<()> {
        sqlx::query(
            "UPDATE bypass_watches
             SET resume_token = coalesce($4, resume_token), events_seen = events_seen + $5,
                 caught_up_at = CASE WHEN $6 THEN clock_timestamp() ELSE caught_up_at END,
                 switched = coalesce($7, switched)
             WHERE migration_id = $1 AND shard = $2 AND collection = $3",
        )
        .bind(self.watch.migration_id)
        .bind(&self.watch.shard)
        .bind(&self.watch.collection)
        .bind(token)
        .bind(events_seen)
        .bind(caught_up)
        .bind(switched)
        .execute(&mut *self.tx)
        .await?;
        if !self.recorded.is_empty() {
            let migration = migration_in(&mut self.tx, self.watch.migration_id).await?;
            let ids: Vec<_> = self
                .recorded
                .iter()
                .take(20)
                .map(|(op, id)| format!("{} {}", op.as_str(), id.as_deref().unwrap_or("-")))
                .collect();
            let details = serde_json::json!({
                "location": self.watch.location().to_string(),
                "count": self.recorded.len(),
                "first": ids,
            });
            events::insert(
                &mut self.tx,
                &migration,
                actor,
                &NewEvent::new(EventKind::BypassFound, details),
            )
            .await?;
        }
        self.tx.commit().await?;
        Ok(())
    }

    /// What was recorded under this lock so far.
    pub fn recorded(&self) -> usize {
        self.recorded.len()
    }
}

async fn migration_in(tx: &mut Transaction<'static, Postgres>, id: i64) -> StoreResult<Migration> {
    sqlx::query_as(&format!(
        "SELECT {MIGRATION_COLUMNS} FROM migrations WHERE id = $1"
    ))
    .bind(id)
    .fetch_optional(&mut **tx)
    .await?
    .ok_or_else(|| StoreError::NotFound(format!("no migration with id {id}")))
}

/// The gate `bypasses_resolved`: nothing open, and every watch read to its end lately.
pub(super) async fn gate_detail(
    conn: &mut sqlx::PgConnection,
    migration: &Migration,
) -> StoreResult<Option<String>> {
    let open: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM bypasses WHERE migration_id = $1 AND resolved_at IS NULL",
    )
    .bind(migration.id)
    .fetch_one(&mut *conn)
    .await?;
    if open > 0 {
        return Ok(Some(format!(
            "{open} write(s) bypassed the router and are unresolved (`reshard bypass list {id}`, \
             then `reshard bypass resolve {id} --bypass N --action recopy|ignore --reason ...`)",
            id = migration.id
        )));
    }
    let behind: Vec<String> = sqlx::query_scalar(
        "SELECT shard || '/' || collection FROM bypass_watches
         WHERE migration_id = $1
           AND (caught_up_at IS NULL
                OR caught_up_at < clock_timestamp() - make_interval(secs => $2))
         ORDER BY shard, collection",
    )
    .bind(migration.id)
    .bind(CAUGHT_UP_WITHIN_SECS as f64)
    .fetch_all(&mut *conn)
    .await?;
    if !behind.is_empty() {
        return Ok(Some(format!(
            "the bypass watch of {} has not read its change stream to the end in the last \
             {CAUGHT_UP_WITHIN_SECS} s (the driver catches up before this move; \
             `reshard bypass list {}` catches up too)",
            behind.join(", "),
            migration.id
        )));
    }
    Ok(None)
}

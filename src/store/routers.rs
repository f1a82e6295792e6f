//! Routers embedded in applications: their registrations, leases and acknowledged epochs.

use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::PgConnection;

use super::migrations::Migration;
use super::{Store, StoreError, StoreResult};
use crate::throttle::{LatencyHistogram, RouterReport};

/// A router that has not acknowledged a migration's current epoch.
#[derive(Clone, Debug, Serialize)]
pub struct Unacknowledged {
    pub name: String,
    pub host: String,
    pub pid: i32,
    /// The epoch it last acknowledged, `-` when none for this migration.
    pub acked: String,
    /// When its lease ran out or runs out (PostgreSQL's clock).
    pub lease_expires_at: DateTime<Utc>,
    /// Whether it is counted out: a fence margin has passed since its lease ran out, so no
    /// step of it can land any more and it loads the phase again before it serves.
    pub counted_out: bool,
}

impl Unacknowledged {
    /// `name (host, pid N, epoch E)`.
    pub fn label(&self) -> String {
        format!(
            "{} ({}, pid {}, epoch {})",
            self.name, self.host, self.pid, self.acked
        )
    }
}

/// Routers of the migration's collection that have not acknowledged its current epoch, the
/// ones still counted and the ones counted out alike ([`Unacknowledged::counted_out`]).
///
/// A router is counted out only once a fence margin has passed since its lease ran out, by
/// `clock_timestamp()` (the time now, not the transaction's start): it stops sending commands
/// a margin before its lease ends and every command ends by then, so nothing of it lands
/// afterwards. The rows are locked (`FOR SHARE`): a renewal racing this check either commits
/// first and is seen, or waits and then finds its lease lapsed (see
/// [`Store::router_heartbeat`]), so the driver and the router never disagree on whether the
/// router was counted.
pub async fn unacknowledged(
    conn: &mut PgConnection,
    migration: &Migration,
) -> StoreResult<Vec<Unacknowledged>> {
    #[derive(sqlx::FromRow)]
    struct Row {
        name: String,
        host: String,
        pid: i32,
        migration_id: Option<i64>,
        acked_epoch: Option<i64>,
        lease_expires_at: DateTime<Utc>,
        counted_out: bool,
    }
    let rows: Vec<Row> = sqlx::query_as(
        "SELECT name, host, pid, migration_id, acked_epoch, lease_expires_at,
                lease_expires_at + fence_margin <= clock_timestamp() AS counted_out
         FROM routers
         WHERE collection = $1
           AND (migration_id IS DISTINCT FROM $2 OR acked_epoch IS NULL OR acked_epoch < $3)
         ORDER BY name, host, pid
         FOR SHARE",
    )
    .bind(&migration.collection)
    .bind(migration.id)
    .bind(migration.epoch)
    .fetch_all(conn)
    .await?;
    Ok(rows
        .into_iter()
        .map(|r| Unacknowledged {
            name: r.name,
            host: r.host,
            pid: r.pid,
            acked: match (r.migration_id, r.acked_epoch) {
                (Some(m), Some(e)) if m == migration.id => e.to_string(),
                _ => "-".to_owned(),
            },
            lease_expires_at: r.lease_expires_at,
            counted_out: r.counted_out,
        })
        .collect())
}

/// The latest time until which a step of a router of `collection` whose lease lapsed may have
/// landed: the lapses renewals found ([`Renewal::Lapsed`]) and the routers counted out now
/// (whose lease ended and never came back). `None` when no router of it ever lapsed.
///
/// A copy back to the source that began before this time may have passed an id such a router
/// then wrote in the target without mirroring it (see [`super::gates`]).
pub async fn last_lapse(
    conn: &mut PgConnection,
    collection: &str,
) -> StoreResult<Option<DateTime<Utc>>> {
    Ok(sqlx::query_scalar(
        "SELECT max(t) FROM (
             SELECT lapsed_until AS t FROM routers WHERE collection = $1
             UNION ALL
             SELECT lease_expires_at + fence_margin FROM routers
             WHERE collection = $1 AND lease_expires_at + fence_margin <= clock_timestamp()
         ) lapses",
    )
    .bind(collection)
    .fetch_one(conn)
    .await?)
}

/// A router that stopped heartbeating (or was not heard from since a moment) and is not
/// counted out yet ([`Store::silent_routers`]).
#[derive(Clone, Debug, Serialize, sqlx::FromRow)]
pub struct SilentRouter {
    pub name: String,
    pub kind: RouterKind,
    pub host: String,
    pub pid: i32,
    /// Seconds since its last heartbeat.
    pub silent_secs: f64,
    /// Silent for three of its heartbeat intervals: it stopped. Otherwise it is only not
    /// heard from since the moment asked about (and may be alive).
    pub stopped: bool,
    /// When it is counted out: its lease plus its fence margin.
    pub counted_out_at: DateTime<Utc>,
}

impl SilentRouter {
    /// `name (host, pid N), silent for 12s, counted out at 2026-12-04 17:40:00 UTC`.
    pub fn label(&self) -> String {
        format!(
            "{} ({}, pid {}, {}), silent for {:.0}s, counted out at {}",
            self.name,
            self.host,
            self.pid,
            self.kind.as_str(),
            self.silent_secs,
            self.counted_out_at.format("%Y-%m-%d %H:%M:%S UTC")
        )
    }
}

/// What a renewal found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Renewal {
    /// The lease had not lapsed: the driver was still counting this router.
    Continuous,
    /// The lease had lapsed (a fence margin past its end): the driver may have counted the
    /// router out and moved on. It must load the phase again before it serves.
    Lapsed,
    /// The registration is gone (removed by an operator): register again.
    Gone,
}

/// A router as `router list` shows it.
#[derive(Clone, Debug, Serialize, sqlx::FromRow)]
pub struct RouterRow {
    pub id: uuid::Uuid,
    pub collection: String,
    pub name: String,
    pub kind: RouterKind,
    pub host: String,
    pub pid: i32,
    pub migration_id: Option<i64>,
    pub acked_epoch: Option<i64>,
    pub heartbeat_at: DateTime<Utc>,
    pub lease_expires_at: DateTime<Utc>,
    pub live: bool,
    /// Seconds since the last heartbeat, by the database's clock.
    pub lease_age_secs: f64,
    /// Seconds until the lease runs out (negative: since it ran out), by the database's clock.
    pub lease_left_secs: f64,
    /// What the router reported with its last heartbeat (latencies, error counts).
    pub stats: serde_json::Value,
}

/// What registered a router row.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, sqlx::Type)]
#[sqlx(type_name = "text", rename_all = "snake_case")]
#[serde(rename_all = "snake_case")]
pub enum RouterKind {
    /// The router library, embedded in an application.
    Library,
    /// A `reshard front`, a MongoDB server to the applications.
    Front,
}

impl RouterKind {
    pub fn as_str(self) -> &'static str {
        match self {
            RouterKind::Library => "library",
            RouterKind::Front => "front",
        }
    }
}

/// Who a router is: what `register_router` records.
#[derive(Clone, Debug)]
pub struct Registration<'a> {
    pub id: uuid::Uuid,
    pub collection: &'a str,
    pub name: &'a str,
    pub host: &'a str,
    pub pid: i32,
    /// How long a renewal keeps the lease.
    pub ttl: std::time::Duration,
    /// How long after its lease the router may still have a command in transit.
    pub fence_margin: std::time::Duration,
    pub kind: RouterKind,
    /// How often it heartbeats: three intervals without one and it is silent (see
    /// [`Store::silent_routers`]).
    pub heartbeat_interval: std::time::Duration,
}

/// What a router's heartbeat reports.
#[derive(Clone, Debug)]
pub struct Heartbeat<'a> {
    pub migration_id: Option<i64>,
    pub acked_epoch: Option<i64>,
    pub stats: &'a serde_json::Value,
}

impl Store {
    /// Registers a router (or renews a registration with the same id) with a lease and its
    /// fence margin. A registration acknowledges nothing yet.
    pub async fn register_router(&self, r: &Registration<'_>) -> StoreResult<()> {
        sqlx::query(
            "INSERT INTO routers (id, collection, name, host, pid, lease_expires_at, fence_margin,
                                  kind, heartbeat_interval)
             VALUES ($1, $2, $3, $4, $5, clock_timestamp() + make_interval(secs => $6),
                     make_interval(secs => $7), $8, make_interval(secs => $9))
             ON CONFLICT (id) DO UPDATE
             SET heartbeat_at = now(), lease_expires_at = EXCLUDED.lease_expires_at,
                 fence_margin = EXCLUDED.fence_margin, kind = EXCLUDED.kind,
                 heartbeat_interval = EXCLUDED.heartbeat_interval",
        )
        .bind(r.id)
        .bind(r.collection)
        .bind(r.name)
        .bind(r.host)
        .bind(r.pid)
        .bind(r.ttl.as_secs_f64())
        .bind(r.fence_margin.as_secs_f64())
        .bind(r.kind)
        .bind(r.heartbeat_interval.as_secs_f64())
        .execute(self.pool())
        .await?;
        Ok(())
    }

    /// Renews the lease and records the epoch the router applies, and says whether the lease
    /// had lapsed meanwhile ([`Renewal`]), by `clock_timestamp()` under the row lock, the same
    /// rule and clock the barrier counts routers out by ([`unacknowledged`]).
    pub async fn router_heartbeat(
        &self,
        id: uuid::Uuid,
        ttl: std::time::Duration,
        fence_margin: std::time::Duration,
        beat: &Heartbeat<'_>,
    ) -> StoreResult<Renewal> {
        // Lock first, in a statement of its own: a statement that waits for a row lock may
        // have read the clock before the wait, and the lapse must be judged by the clock
        // after it (a barrier holding the row meanwhile may have counted the router out).
        let mut tx = self.pool().begin().await?;
        let exists: Option<uuid::Uuid> =
            sqlx::query_scalar("SELECT id FROM routers WHERE id = $1 FOR UPDATE")
                .bind(id)
                .fetch_optional(&mut *tx)
                .await?;
        if exists.is_none() {
            return Ok(Renewal::Gone);
        }
        let continuous: Option<bool> = sqlx::query_scalar(
            "WITH old AS (
                 SELECT id, lease_expires_at + fence_margin > clock_timestamp() AS continuous,
                        lease_expires_at + fence_margin AS fenced_at
                 FROM routers WHERE id = $1 FOR UPDATE
             )
             UPDATE routers r SET heartbeat_at = now(),
                    lease_expires_at = clock_timestamp() + make_interval(secs => $2),
                    fence_margin = make_interval(secs => $3),
                    migration_id = $4, acked_epoch = $5, stats = $6,
                    lapsed_until = CASE WHEN old.continuous THEN r.lapsed_until
                                        ELSE old.fenced_at END
             FROM old WHERE r.id = old.id
             RETURNING old.continuous",
        )
        .bind(id)
        .bind(ttl.as_secs_f64())
        .bind(fence_margin.as_secs_f64())
        .bind(beat.migration_id)
        .bind(beat.acked_epoch)
        .bind(beat.stats)
        .fetch_optional(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(match continuous {
            None => Renewal::Gone,
            Some(true) => Renewal::Continuous,
            Some(false) => Renewal::Lapsed,
        })
    }

    /// Removes a router's registration (on orderly shutdown), so it holds up no barrier.
    pub async fn deregister_router(&self, id: uuid::Uuid) -> StoreResult<()> {
        sqlx::query("DELETE FROM routers WHERE id = $1")
            .bind(id)
            .execute(self.pool())
            .await?;
        Ok(())
    }

    /// Removes the registration of a router that stopped without deregistering. Refused while
    /// it may still be serving (until a fence margin after its lease ran out: it may only be
    /// cut off from the state store, and then it serves on), and while a migration of its
    /// collection is rolling back (its lapse may outdate the copy back, which its row records).
    pub async fn forget_router(&self, id: uuid::Uuid) -> StoreResult<RouterRow> {
        let mut tx = self.pool().begin().await?;
        let row: Option<RouterRow> = sqlx::query_as(
            "SELECT id, collection, name, kind, host, pid, migration_id, acked_epoch, heartbeat_at,
                    lease_expires_at, lease_expires_at > now() AS live,
                    extract(epoch FROM now() - heartbeat_at)::float8 AS lease_age_secs,
                    extract(epoch FROM lease_expires_at - now())::float8 AS lease_left_secs, stats
             FROM routers WHERE id = $1 FOR UPDATE",
        )
        .bind(id)
        .fetch_optional(&mut *tx)
        .await?;
        let Some(row) = row else {
            return Err(StoreError::NotFound(format!(
                "no router {id} is registered (`reshard router list`)"
            )));
        };
        // A statement of its own, after the lock: the clock of now.
        let serving_until: Option<DateTime<Utc>> = sqlx::query_scalar(
            "SELECT lease_expires_at + fence_margin FROM routers
             WHERE id = $1 AND lease_expires_at + fence_margin > clock_timestamp()",
        )
        .bind(id)
        .fetch_optional(&mut *tx)
        .await?;
        if let Some(until) = serving_until {
            return Err(StoreError::Conflict(format!(
                "router {} ({}, pid {}) may still be serving until {} (its lease plus its fence \
                 margin): it may only be cut off from the state store. It is counted out then \
                 without being forgotten; forget it after that",
                row.name,
                row.host,
                row.pid,
                until.format("%Y-%m-%d %H:%M:%S UTC")
            )));
        }
        let rolling_back: Option<i64> = sqlx::query_scalar(
            "SELECT id FROM migrations WHERE collection = $1
             AND phase IN ('reverting', 'revert_switch')",
        )
        .bind(&row.collection)
        .fetch_optional(&mut *tx)
        .await?;
        if let Some(m) = rolling_back {
            return Err(StoreError::Conflict(format!(
                "migration {m} of {} is rolling back, and this router's lapse decides whether \
                 its copy back must run again; forget the router once the rollback has ended",
                row.collection
            )));
        }
        sqlx::query("DELETE FROM routers WHERE id = $1")
            .bind(id)
            .execute(&mut *tx)
            .await?;
        self.finish(tx).await?;
        Ok(row)
    }

    /// Routers of the migration's collection that still count and have not acknowledged its
    /// current epoch.
    pub async fn unacknowledged_routers(
        &self,
        migration: &Migration,
    ) -> StoreResult<Vec<Unacknowledged>> {
        Ok(self
            .routers_behind(migration)
            .await?
            .into_iter()
            .filter(|r| !r.counted_out)
            .collect())
    }

    /// Every router of the migration's collection that has not acknowledged its current epoch,
    /// counted out or not.
    pub async fn routers_behind(&self, migration: &Migration) -> StoreResult<Vec<Unacknowledged>> {
        let mut tx = self.pool().begin().await?;
        let rows = unacknowledged(&mut tx, migration).await?;
        tx.commit().await?;
        Ok(rows)
    }

    /// The routers of `collection` that are silent but not yet counted out: their last
    /// heartbeat is three of their intervals old (at least a second; two seconds for a row that
    /// recorded none), by `clock_timestamp()`, while their lease plus its fence margin has not
    /// run out ([`SilentRouter::stopped`]). Such a router (crashed, or cut off from the state
    /// store) cannot acknowledge a new epoch before it is counted out, so a write switch
    /// entered now would hold every other router's writes for nothing (see `Driver::advance`).
    ///
    /// With `unheard_since`, also the counted routers not heard from since that moment (of
    /// [`Store::clock`]) that are not silent that long yet: a router that died a moment ago
    /// looks like a live one until three of its intervals have passed, and only a heartbeat
    /// after the moment shows that it lives.
    pub async fn silent_routers(
        &self,
        collection: &str,
        unheard_since: Option<DateTime<Utc>>,
    ) -> StoreResult<Vec<SilentRouter>> {
        Ok(sqlx::query_as(
            "SELECT name, kind, host, pid, stopped,
                    extract(epoch FROM clock_timestamp() - heartbeat_at)::float8 AS silent_secs,
                    lease_expires_at + fence_margin AS counted_out_at
             FROM (SELECT *,
                          heartbeat_at + greatest(3 * coalesce(heartbeat_interval, interval '2 s'),
                                                  interval '1 s') < clock_timestamp() AS stopped
                   FROM routers
                   WHERE collection = $1
                     AND lease_expires_at + fence_margin > clock_timestamp()) r
             WHERE stopped OR heartbeat_at < $2
             ORDER BY name, host, pid",
        )
        .bind(collection)
        .bind(unheard_since)
        .fetch_all(self.pool())
        .await?)
    }

    /// The state store's clock now (`clock_timestamp()`), the one leases and heartbeats are
    /// stamped with.
    pub async fn clock(&self) -> StoreResult<DateTime<Utc>> {
        Ok(sqlx::query_scalar("SELECT clock_timestamp()")
            .fetch_one(self.pool())
            .await?)
    }

    /// What the collection's live routers reported with their last heartbeat, one report
    /// each (the throttle's view of the application).
    pub async fn app_reports(&self, collection: &str) -> StoreResult<Vec<RouterReport>> {
        let mut conn = self.pool().acquire().await?;
        Ok(reports(&live_routers_in(&mut conn, collection).await?))
    }

    pub async fn routers(&self, collection: Option<&str>) -> StoreResult<Vec<RouterRow>> {
        Ok(sqlx::query_as(
            "SELECT id, collection, name, kind, host, pid, migration_id, acked_epoch, heartbeat_at,
                    lease_expires_at, lease_expires_at > now() AS live,
                    extract(epoch FROM now() - heartbeat_at)::float8 AS lease_age_secs,
                    extract(epoch FROM lease_expires_at - now())::float8 AS lease_left_secs, stats
             FROM routers WHERE $1::text IS NULL OR collection = $1
             ORDER BY collection, name, host, pid",
        )
        .bind(collection)
        .fetch_all(self.pool())
        .await?)
    }
}

/// The live routers of `collection`.
pub(super) async fn live_routers_in(
    conn: &mut sqlx::PgConnection,
    collection: &str,
) -> StoreResult<Vec<RouterRow>> {
    Ok(sqlx::query_as(
        "SELECT id, collection, name, kind, host, pid, migration_id, acked_epoch, heartbeat_at,
                lease_expires_at, lease_expires_at > now() AS live,
                extract(epoch FROM now() - heartbeat_at)::float8 AS lease_age_secs,
                    extract(epoch FROM lease_expires_at - now())::float8 AS lease_left_secs, stats
         FROM routers WHERE collection = $1 AND lease_expires_at > now()",
    )
    .bind(collection)
    .fetch_all(conn)
    .await?)
}

/// Each router's last report over all its operations.
pub(super) fn reports(rows: &[RouterRow]) -> Vec<RouterReport> {
    rows.iter()
        .map(|r| {
            let all = &r.stats["all"];
            RouterReport {
                router: r.id.to_string(),
                reported_at: r.heartbeat_at.timestamp_micros(),
                p99_ms: all["p99_ms"].as_f64(),
                count: all["count"].as_u64().unwrap_or(0),
                errors: all["errors"].as_u64().unwrap_or(0),
                histogram: serde_json::from_value::<Vec<(u16, u64)>>(all["histogram"].clone())
                    .ok()
                    .map(LatencyHistogram::from_pairs),
                recent_p99_ms: all["recent_p99_ms"].as_f64(),
                recent_count: all["recent_count"].as_u64().unwrap_or(0),
            }
        })
        .collect()
}

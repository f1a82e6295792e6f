//! Playbooks: the migration each drives, its pinned content, the steps done and approved, and
//! the lock that lets one process at a time run it.

use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::{Connection, PgConnection};

use super::events::{self, EventKind, NewEvent};
use super::migrations::{migration_in, Migration};
use super::{Store, StoreError, StoreResult};
use crate::settings::MigrationSettings;

/// A playbook as stored.
#[derive(Clone, Debug, Serialize, sqlx::FromRow)]
pub struct PlaybookRow {
    pub name: String,
    pub migration_id: i64,
    /// The normalized playbook pinned when it was created, updated by accepted edits.
    pub content: serde_json::Value,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

/// The columns of a [`PlaybookRow`].
const SELECT_PLAYBOOK: &str =
    "SELECT name, migration_id, content, created_at, updated_at FROM playbooks";

/// A step's record.
#[derive(Clone, Debug, Serialize, sqlx::FromRow)]
pub struct StepRow {
    pub position: i32,
    pub name: String,
    pub started_at: Option<DateTime<Utc>>,
    pub finished_at: Option<DateTime<Utc>>,
    pub approved_by: Option<String>,
    pub approved_at: Option<DateTime<Utc>>,
    pub outcome: serde_json::Value,
}

/// Who runs a playbook now.
#[derive(Clone, Debug, Serialize, sqlx::FromRow)]
pub struct Holder {
    pub host: String,
    pub pid: i32,
    pub started_at: DateTime<Utc>,
}

/// The lock of one running playbook: a session advisory lock on its own connection, released
/// when this value is dropped or the process dies (PostgreSQL ends the session).
pub struct PlaybookLock {
    _connection: PgConnection,
}

/// What a new playbook creates, in one transaction.
pub struct NewPlaybook<'a> {
    pub name: &'a str,
    pub collection: &'a str,
    pub from_version: i32,
    pub to_version: i32,
    pub content: &'a serde_json::Value,
    pub settings: &'a MigrationSettings,
}

fn lock_key(name: &str) -> String {
    format!("reshard.playbook.{name}")
}

impl Store {
    /// Takes the playbook's lock, or says who holds it.
    pub async fn lock_playbook(
        &self,
        name: &str,
        host: &str,
        pid: i32,
    ) -> StoreResult<Result<PlaybookLock, Holder>> {
        let mut connection = PgConnection::connect(self.url().expose()).await?;
        let locked: bool = sqlx::query_scalar("SELECT pg_try_advisory_lock(hashtext($1))")
            .bind(lock_key(name))
            .fetch_one(&mut connection)
            .await?;
        if !locked {
            let holder: Option<Holder> = sqlx::query_as(
                "SELECT host, pid, started_at FROM playbook_drivers WHERE playbook = $1",
            )
            .bind(name)
            .fetch_optional(self.pool())
            .await?;
            return Ok(Err(holder.unwrap_or(Holder {
                host: "another process".into(),
                pid: 0,
                started_at: Utc::now(),
            })));
        }
        sqlx::query(
            "INSERT INTO playbook_drivers (playbook, host, pid) VALUES ($1, $2, $3)
             ON CONFLICT (playbook) DO UPDATE SET host = $2, pid = $3, started_at = now()",
        )
        .bind(name)
        .bind(host)
        .bind(pid)
        .execute(&mut connection)
        .await?;
        Ok(Ok(PlaybookLock {
            _connection: connection,
        }))
    }

    /// The playbook that drives a migration now (its runner holds the playbook's lock), if
    /// any: its next moves come without an operator.
    pub async fn playbook_driving(&self, migration_id: i64) -> StoreResult<Option<String>> {
        // A session advisory lock on a bigint key shows in `pg_locks` as its high and low
        // 32 bits (`classid`, `objid`) with `objsubid` 1.
        Ok(sqlx::query_scalar(
            "SELECT p.name FROM playbooks p
             WHERE p.migration_id = $1 AND EXISTS (
                 SELECT 1 FROM pg_locks l
                 WHERE l.locktype = 'advisory' AND l.objsubid = 1 AND l.granted
                   AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
                   AND ((l.classid::bigint << 32) | l.objid::bigint)
                       = hashtext('reshard.playbook.' || p.name)::bigint)",
        )
        .bind(migration_id)
        .fetch_optional(self.pool())
        .await?)
    }

    /// The playbook that drives migration `migration_id`, if one does (one at most).
    pub async fn playbook_of(&self, migration_id: i64) -> StoreResult<Option<PlaybookRow>> {
        Ok(
            sqlx::query_as(&format!("{SELECT_PLAYBOOK} WHERE migration_id = $1"))
                .bind(migration_id)
                .fetch_optional(self.pool())
                .await?,
        )
    }

    pub async fn playbook(&self, name: &str) -> StoreResult<Option<PlaybookRow>> {
        Ok(
            sqlx::query_as(&format!("{SELECT_PLAYBOOK} WHERE name = $1"))
                .bind(name)
                .fetch_optional(self.pool())
                .await?,
        )
    }

    /// Creates the migration a playbook drives, the playbook row pinning its content, and its
    /// settings, in one transaction: a process killed in between leaves nothing half made.
    pub async fn create_playbook_migration(
        &self,
        new: &NewPlaybook<'_>,
        actor: &str,
    ) -> StoreResult<Migration> {
        let mut tx = self.pool().begin().await?;
        let migration = super::migrations::create_in(
            &mut tx,
            new.collection,
            new.from_version,
            new.to_version,
            actor,
        )
        .await?;
        sqlx::query("UPDATE migrations SET settings = $2 WHERE id = $1")
            .bind(migration.id)
            .bind(new.settings.to_json())
            .execute(&mut *tx)
            .await?;
        sqlx::query("INSERT INTO playbooks (name, migration_id, content) VALUES ($1, $2, $3)")
            .bind(new.name)
            .bind(migration.id)
            .bind(new.content)
            .execute(&mut *tx)
            .await?;
        let migration = migration_in(&mut tx, migration.id).await?;
        tx.commit().await?;
        Ok(migration)
    }

    /// Accepts an edit of later steps or settings: the new content is pinned, and the event
    /// log says what changed.
    pub async fn update_playbook(
        &self,
        name: &str,
        content: &serde_json::Value,
        diff: &str,
        actor: &str,
    ) -> StoreResult<()> {
        let mut tx = self.pool().begin().await?;
        let migration_id: i64 = sqlx::query_scalar(
            "UPDATE playbooks SET content = $2, updated_at = now() WHERE name = $1
             RETURNING migration_id",
        )
        .bind(name)
        .bind(content)
        .fetch_one(&mut *tx)
        .await?;
        let migration = migration_in(&mut tx, migration_id).await?;
        let event = NewEvent::new(
            EventKind::PlaybookChanged,
            serde_json::json!({ "playbook": name, "diff": diff }),
        );
        events::insert(&mut tx, &migration, actor, &event).await?;
        tx.commit().await?;
        Ok(())
    }

    pub async fn playbook_steps(&self, name: &str) -> StoreResult<Vec<StepRow>> {
        Ok(sqlx::query_as(
            "SELECT position, name, started_at, finished_at, approved_by, approved_at, outcome
             FROM playbook_steps WHERE playbook = $1 ORDER BY position",
        )
        .bind(name)
        .fetch_all(self.pool())
        .await?)
    }

    /// Notes that a step started (the first time only: a soak counts from its first start).
    pub async fn step_started(&self, name: &str, position: i32, step: &str) -> StoreResult<()> {
        sqlx::query(
            "INSERT INTO playbook_steps (playbook, position, name, started_at)
             VALUES ($1, $2, $3, now())
             ON CONFLICT (playbook, position)
             DO UPDATE SET name = $3, started_at = coalesce(playbook_steps.started_at, now())",
        )
        .bind(name)
        .bind(position)
        .bind(step)
        .execute(self.pool())
        .await?;
        Ok(())
    }

    /// Notes that a step finished, with what it came to, in the event log too.
    pub async fn step_done(
        &self,
        name: &str,
        position: i32,
        step: &str,
        outcome: &serde_json::Value,
        actor: &str,
    ) -> StoreResult<()> {
        let mut tx = self.pool().begin().await?;
        let migration_id: i64 =
            sqlx::query_scalar("SELECT migration_id FROM playbooks WHERE name = $1")
                .bind(name)
                .fetch_one(&mut *tx)
                .await?;
        sqlx::query(
            "INSERT INTO playbook_steps (playbook, position, name, started_at, finished_at, outcome)
             VALUES ($1, $2, $3, now(), now(), $4)
             ON CONFLICT (playbook, position)
             DO UPDATE SET finished_at = now(), outcome = $4",
        )
        .bind(name)
        .bind(position)
        .bind(step)
        .bind(outcome)
        .execute(&mut *tx)
        .await?;
        let migration = migration_in(&mut tx, migration_id).await?;
        let event = NewEvent::new(
            EventKind::StepDone,
            serde_json::json!({ "playbook": name, "step": step, "position": position, "outcome": outcome }),
        );
        events::insert(&mut tx, &migration, actor, &event).await?;
        tx.commit().await?;
        Ok(())
    }

    /// Records an approval of the playbook's step named `step` (which must be an approval
    /// step, `position` given by the caller from the pinned content).
    /// Records that a playbook stopped at approval step `step` (an `approval_requested`
    /// event), once per step: a re-run that stops there again records nothing new.
    pub async fn request_approval(
        &self,
        migration_id: i64,
        step: &str,
        message: Option<&str>,
        command: &str,
        actor: &str,
    ) -> StoreResult<()> {
        let mut tx = self.pool().begin().await?;
        let migration = super::migrations::migration_for_update(&mut tx, migration_id).await?;
        let asked: bool = sqlx::query_scalar(
            "SELECT EXISTS (SELECT 1 FROM migration_events
                            WHERE migration_id = $1 AND kind = 'approval_requested'
                              AND details->>'step' = $2)",
        )
        .bind(migration_id)
        .bind(step)
        .fetch_one(&mut *tx)
        .await?;
        if !asked {
            let event = NewEvent::new(
                EventKind::ApprovalRequested,
                serde_json::json!({ "step": step, "message": message, "approve_with": command }),
            );
            events::insert(&mut tx, &migration, actor, &event).await?;
        }
        tx.commit().await?;
        Ok(())
    }

    pub async fn approve_step(
        &self,
        name: &str,
        position: i32,
        step: &str,
        actor: &str,
        reason: Option<&str>,
    ) -> StoreResult<()> {
        let mut tx = self.pool().begin().await?;
        let migration_id: Option<i64> =
            sqlx::query_scalar("SELECT migration_id FROM playbooks WHERE name = $1")
                .bind(name)
                .fetch_optional(&mut *tx)
                .await?;
        let Some(migration_id) = migration_id else {
            return Err(StoreError::NotFound(format!(
                "no playbook named {name:?} has run yet (`reshard run FILE` starts it)"
            )));
        };
        sqlx::query(
            "INSERT INTO playbook_steps (playbook, position, name, approved_by, approved_at)
             VALUES ($1, $2, $3, $4, now())
             ON CONFLICT (playbook, position)
             DO UPDATE SET approved_by = $4, approved_at = now()",
        )
        .bind(name)
        .bind(position)
        .bind(step)
        .bind(actor)
        .execute(&mut *tx)
        .await?;
        let migration = migration_in(&mut tx, migration_id).await?;
        let event = NewEvent::new(
            EventKind::Approved,
            serde_json::json!({ "playbook": name, "step": step }),
        )
        .reason(reason);
        events::insert(&mut tx, &migration, actor, &event).await?;
        self.finish(tx).await?;
        Ok(())
    }
}

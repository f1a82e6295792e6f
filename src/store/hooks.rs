//! A migration's hooks and their position in its event log (`crate::hooks`).

use chrono::{DateTime, Utc};
use serde::Serialize;
use serde_json::json;
use sqlx::{Postgres, Transaction};

use super::events::{self, EventKind, NewEvent};
use super::migrations::{migration_in, Event, Migration};
use super::{Store, StoreError, StoreResult};
use crate::hooks::{HookOn, NewHook};

/// Who declared a hook: `reshard hook add`, or a playbook's `hooks:` (which the playbook then
/// owns: it replaces or removes them on its next run). Stored as its name (the column's CHECK
/// allows these two).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, sqlx::Type)]
#[sqlx(type_name = "text", rename_all = "snake_case")]
#[serde(rename_all = "snake_case")]
pub enum HookOrigin {
    Cli,
    Playbook,
}

/// A hook as stored.
#[derive(Clone, Debug, Serialize, sqlx::FromRow)]
pub struct Hook {
    pub id: i64,
    pub migration_id: i64,
    pub name: String,
    pub on_events: Vec<String>,
    pub command: String,
    pub blocking: bool,
    pub timeout_ms: i64,
    pub origin: HookOrigin,
    pub delivered_through: i64,
    pub deliveries: i64,
    pub failures: i64,
    pub last_error: Option<String>,
    pub last_failed_at: Option<DateTime<Utc>>,
    pub held_at_event: Option<i64>,
    pub created_at: DateTime<Utc>,
}

impl Hook {
    /// What the hook is on (names the store holds were checked when they were written).
    pub fn on(&self) -> Vec<HookOn> {
        self.on_events
            .iter()
            .filter_map(|n| HookOn::parse(n).ok())
            .collect()
    }

    pub fn timeout(&self) -> std::time::Duration {
        std::time::Duration::from_millis(self.timeout_ms.max(1) as u64)
    }
}

const HOOK_COLUMNS: &str = "id, migration_id, name, on_events, command, blocking, timeout_ms, \
     origin, delivered_through, deliveries, failures, last_error, last_failed_at, \
     held_at_event, created_at";

/// One hook, locked for delivery: its row stays locked until this is committed or dropped, so
/// no other process delivers to it meanwhile, and each event is handed over once per success.
pub struct HookLock {
    tx: Transaction<'static, Postgres>,
    pub hook: Hook,
    pub migration: Migration,
}

impl Store {
    /// The migration's hooks, by name.
    pub async fn hooks(&self, migration_id: i64) -> StoreResult<Vec<Hook>> {
        self.migration(migration_id).await?;
        Ok(sqlx::query_as(&format!(
            "SELECT {HOOK_COLUMNS} FROM migration_hooks WHERE migration_id = $1 ORDER BY name"
        ))
        .bind(migration_id)
        .fetch_all(self.pool())
        .await?)
    }

    /// Adds a hook: it is told about the events recorded from now on.
    pub async fn add_hook(
        &self,
        migration_id: i64,
        hook: &NewHook,
        actor: &str,
    ) -> StoreResult<Hook> {
        let mut tx = self.pool().begin().await?;
        let added = insert_hook(&mut tx, migration_id, hook, HookOrigin::Cli, actor).await?;
        self.finish(tx).await?;
        Ok(added)
    }

    /// Removes a hook.
    pub async fn remove_hook(&self, migration_id: i64, name: &str, actor: &str) -> StoreResult<()> {
        let mut tx = self.pool().begin().await?;
        let migration = migration_in(&mut tx, migration_id).await?;
        let removed =
            sqlx::query("DELETE FROM migration_hooks WHERE migration_id = $1 AND name = $2")
                .bind(migration_id)
                .bind(name)
                .execute(&mut *tx)
                .await?
                .rows_affected();
        if removed == 0 {
            return Err(StoreError::NotFound(format!(
                "migration {migration_id} has no hook named {name:?} (`reshard hook list \
                 {migration_id}`)"
            )));
        }
        let event = NewEvent::new(EventKind::SettingsChanged, json!({ "hook_removed": name }));
        events::insert(&mut tx, &migration, actor, &event).await?;
        self.finish(tx).await?;
        Ok(())
    }

    /// Keeps the hooks a playbook declares in step with it: adds the new ones, updates the
    /// changed ones (they keep their place in the log), removes the ones it no longer names.
    /// Hooks added with `reshard hook add` are left alone; a playbook hook may not take the
    /// name of one.
    pub async fn sync_playbook_hooks(
        &self,
        migration_id: i64,
        declared: &[NewHook],
        actor: &str,
    ) -> StoreResult<()> {
        let mut tx = self.pool().begin().await?;
        let migration = migration_in(&mut tx, migration_id).await?;
        let existing: Vec<Hook> = sqlx::query_as(&format!(
            "SELECT {HOOK_COLUMNS} FROM migration_hooks WHERE migration_id = $1 FOR UPDATE"
        ))
        .bind(migration_id)
        .fetch_all(&mut *tx)
        .await?;
        for hook in declared {
            match existing.iter().find(|h| h.name == hook.name) {
                None => {
                    insert_hook(&mut tx, migration_id, hook, HookOrigin::Playbook, actor).await?;
                }
                Some(h) if h.origin != HookOrigin::Playbook => {
                    return Err(StoreError::Conflict(format!(
                        "the playbook declares hook {:?}, and migration {migration_id} has a \
                         hook of that name added with `reshard hook add`; rename one",
                        hook.name
                    )))
                }
                Some(h) => {
                    let same = h.on_events == hook.on_names()
                        && h.command == hook.command
                        && h.blocking == hook.blocking
                        && h.timeout_ms == hook.timeout_ms();
                    if !same {
                        sqlx::query(
                            "UPDATE migration_hooks
                             SET on_events = $2, command = $3, blocking = $4, timeout_ms = $5
                             WHERE id = $1",
                        )
                        .bind(h.id)
                        .bind(hook.on_names())
                        .bind(&hook.command)
                        .bind(hook.blocking)
                        .bind(hook.timeout_ms())
                        .execute(&mut *tx)
                        .await?;
                        let event = NewEvent::new(
                            EventKind::SettingsChanged,
                            json!({ "hook_changed": hook.name }),
                        );
                        events::insert(&mut tx, &migration, actor, &event).await?;
                    }
                }
            }
        }
        for h in existing.iter().filter(|h| {
            h.origin == HookOrigin::Playbook && !declared.iter().any(|d| d.name == h.name)
        }) {
            sqlx::query("DELETE FROM migration_hooks WHERE id = $1")
                .bind(h.id)
                .execute(&mut *tx)
                .await?;
            let event = NewEvent::new(
                EventKind::SettingsChanged,
                json!({ "hook_removed": h.name }),
            );
            events::insert(&mut tx, &migration, actor, &event).await?;
        }
        tx.commit().await?;
        Ok(())
    }

    /// Hooks with events after their position, of one migration or of all.
    pub async fn hooks_behind(&self, migration_id: Option<i64>) -> StoreResult<Vec<Hook>> {
        Ok(sqlx::query_as(&format!(
            "SELECT {HOOK_COLUMNS} FROM migration_hooks h
             WHERE ($1::bigint IS NULL OR h.migration_id = $1)
               AND EXISTS (SELECT 1 FROM migration_events e
                           WHERE e.migration_id = h.migration_id AND e.id > h.delivered_through)
             ORDER BY h.migration_id, h.name"
        ))
        .bind(migration_id)
        .fetch_all(self.pool())
        .await?)
    }

    /// Locks hook `id` for delivery. With `wait`, waits for another process delivering to it
    /// to finish; without, `None` when one is.
    pub async fn lock_hook(&self, id: i64, wait: bool) -> StoreResult<Option<HookLock>> {
        let mut tx = self.pool().begin().await?;
        let skip = if wait { "" } else { " SKIP LOCKED" };
        let hook: Option<Hook> = sqlx::query_as(&format!(
            "SELECT {HOOK_COLUMNS} FROM migration_hooks WHERE id = $1 FOR UPDATE{skip}"
        ))
        .bind(id)
        .fetch_optional(&mut *tx)
        .await?;
        let Some(hook) = hook else {
            return Ok(None);
        };
        let migration = migration_in(&mut tx, hook.migration_id).await?;
        Ok(Some(HookLock {
            tx,
            hook,
            migration,
        }))
    }
}

impl HookLock {
    /// The events after the hook's position, oldest first (at most `limit`).
    pub async fn pending(&mut self, limit: i64) -> StoreResult<Vec<Event>> {
        Ok(sqlx::query_as(
            "SELECT id, migration_id, at, actor, kind, from_phase, to_phase, epoch, reason, details
             FROM migration_events WHERE migration_id = $1 AND id > $2 ORDER BY id LIMIT $3",
        )
        .bind(self.hook.migration_id)
        .bind(self.hook.delivered_through)
        .bind(limit)
        .fetch_all(&mut *self.tx)
        .await?)
    }

    /// Moves the hook's position to `event_id` (delivered, or not for it) and commits.
    pub async fn passed(mut self, event_id: i64, delivered: bool) -> StoreResult<()> {
        sqlx::query(
            "UPDATE migration_hooks
             SET delivered_through = $2, deliveries = deliveries + $3::bigint,
                 held_at_event = NULL
             WHERE id = $1",
        )
        .bind(self.hook.id)
        .bind(event_id)
        .bind(i64::from(delivered))
        .execute(&mut *self.tx)
        .await?;
        self.tx.commit().await?;
        Ok(())
    }

    /// Records that the command failed on `event` (a `hook_failed` event) and commits. A
    /// blocking hook stays at the event (held: delivered again after a resume); any other moves
    /// past it.
    pub async fn failed(mut self, event: &Event, error: &str, actor: &str) -> StoreResult<()> {
        let blocking = self.hook.blocking;
        sqlx::query(
            "UPDATE migration_hooks
             SET failures = failures + 1, last_error = $2, last_failed_at = now(),
                 delivered_through = CASE WHEN blocking THEN delivered_through ELSE $3 END,
                 held_at_event = CASE WHEN blocking THEN $3 ELSE NULL END
             WHERE id = $1",
        )
        .bind(self.hook.id)
        .bind(error)
        .bind(event.id)
        .execute(&mut *self.tx)
        .await?;
        let record = NewEvent::new(
            EventKind::HookFailed,
            json!({
                "hook": self.hook.name,
                "event": event.id,
                "event_kind": event.kind.as_str(),
                "blocking": blocking,
                "error": error,
            }),
        );
        events::insert(&mut self.tx, &self.migration, actor, &record).await?;
        self.tx.commit().await?;
        Ok(())
    }
}

async fn insert_hook(
    tx: &mut Transaction<'static, Postgres>,
    migration_id: i64,
    hook: &NewHook,
    origin: HookOrigin,
    actor: &str,
) -> StoreResult<Hook> {
    let migration = migration_in(tx, migration_id).await?;
    // The event first: the hook starts after it, so it is not told about its own arrival.
    let event = NewEvent::new(
        EventKind::SettingsChanged,
        json!({
            "hook_added": hook.name,
            "on": hook.on_names(),
            "blocking": hook.blocking,
            // As `hook list` shows it: humantime text.
            "timeout_ms": hook.timeout.as_millis() as u64,
            "origin": origin,
        }),
    );
    let event_id = events::insert(tx, &migration, actor, &event).await?;
    let inserted: Option<Hook> = sqlx::query_as(&format!(
        "INSERT INTO migration_hooks
             (migration_id, name, on_events, command, blocking, timeout_ms, origin,
              delivered_through)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8)
         ON CONFLICT (migration_id, name) DO NOTHING
         RETURNING {HOOK_COLUMNS}"
    ))
    .bind(migration_id)
    .bind(&hook.name)
    .bind(hook.on_names())
    .bind(&hook.command)
    .bind(hook.blocking)
    .bind(hook.timeout_ms())
    .bind(origin)
    .bind(event_id)
    .fetch_optional(&mut **tx)
    .await?;
    inserted.ok_or_else(|| {
        StoreError::Conflict(format!(
            "migration {migration_id} already has a hook named {:?} (`reshard hook remove \
             {migration_id} {}` first)",
            hook.name, hook.name
        ))
    })
}

//! Gate checks, evaluated inside the transaction that would make a move. Each returns `Ok` when
//! the gate holds and `GateClosed` naming what is missing when it does not.

use sqlx::PgConnection;

use super::migrations::{migration_in, Migration};
use super::{Store, StoreError, StoreResult};
use crate::phase::Gate;

impl Store {
    /// Whether `gate` would pass for migration `id` now: the check a move makes, in a
    /// transaction that is rolled back, so nothing moves (for those who wait for a gate).
    /// `Err` of the inner result says what is missing. Not `READ ONLY`: some checks take
    /// share locks, released at the rollback.
    pub async fn check_gate(
        &self,
        id: i64,
        gate: Gate,
    ) -> StoreResult<(Migration, Result<(), String>)> {
        let mut tx = self.pool().begin().await?;
        let migration = migration_in(&mut tx, id).await?;
        let verdict = match check(&mut tx, &migration, gate).await {
            Ok(()) => Ok(()),
            Err(StoreError::GateClosed { detail, .. }) => Err(detail),
            Err(e) => return Err(e),
        };
        tx.rollback().await?;
        Ok((migration, verdict))
    }
}

pub(super) async fn check(
    conn: &mut PgConnection,
    migration: &Migration,
    gate: Gate,
) -> StoreResult<()> {
    let closed = |detail: String| Err(StoreError::GateClosed { gate, detail });
    match gate {
        Gate::RoutersAcknowledged => {
            let missing: Vec<_> = super::routers::unacknowledged(conn, migration)
                .await?
                .into_iter()
                .filter(|r| !r.counted_out)
                .collect();
            if missing.is_empty() {
                Ok(())
            } else {
                let names = missing
                    .iter()
                    .map(|r| r.label())
                    .collect::<Vec<_>>()
                    .join(", ");
                closed(format!(
                    "{} router(s) have not acknowledged epoch {}: {names}",
                    missing.len(),
                    migration.epoch
                ))
            }
        }
        Gate::BypassesResolved => super::bypasses::gate_detail(conn, migration)
            .await?
            .map_or(Ok(()), closed),
        Gate::BackfillComplete => {
            if migration.backfill_planned_at.is_none() {
                return closed(
                    "the backfill has not been planned yet (run `reshard worker`)".into(),
                );
            }
            work_left(conn, migration, "backfill")
                .await?
                .map_or(Ok(()), closed)?;
            let open: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM dead_letters WHERE migration_id = $1 AND status = 'open'",
            )
            .bind(migration.id)
            .fetch_one(&mut *conn)
            .await?;
            if open > 0 {
                return closed(format!(
                    "{open} dead letter(s) are unresolved (`reshard deadletter list {}`)",
                    migration.id
                ));
            }
            Ok(())
        }
        Gate::ReconciliationPassed => {
            // The latest finished run since the backfill ended decides: an older pass does
            // not outweigh a newer run that found problems.
            let latest: Option<(i64, bool)> = sqlx::query_as(
                "SELECT r.id, coalesce(r.passed, false) FROM reconciliation_runs r
                 JOIN migrations m ON m.id = r.migration_id
                 WHERE r.migration_id = $1 AND r.finished_at IS NOT NULL
                   AND m.backfill_completed_at IS NOT NULL
                   AND r.started_at >= m.backfill_completed_at
                 ORDER BY r.id DESC LIMIT 1",
            )
            .bind(migration.id)
            .fetch_optional(&mut *conn)
            .await?;
            match latest {
                Some((_, true)) => Ok(()),
                Some((run, false)) => closed(format!(
                    "the latest reconciliation run ({run}) found problems \
                     (`reshard reconcile show {} --run {run}`, `reshard repair {}`)",
                    migration.id, migration.id
                )),
                None => closed(format!(
                    "no passing reconciliation run since the backfill ended (`reshard reconcile {}`)",
                    migration.id
                )),
            }?;
            // Shadow reads saw pristine copies that differ from their source documents: each
            // is a defect until repaired (or superseded by the application's write).
            let open: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM shadow_mismatches
                 WHERE migration_id = $1 AND resolved_at IS NULL",
            )
            .bind(migration.id)
            .fetch_one(&mut *conn)
            .await?;
            if open > 0 {
                return closed(format!(
                    "{open} shadow read mismatch(es) are unresolved: pristine copies in the \
                     target that differ from their source documents (`reshard migration status \
                     {id}` lists them; `reshard repair {id}` copies them again)",
                    id = migration.id
                ));
            }
            Ok(())
        }
        Gate::CleanupComplete => {
            if migration.cleanup_planned_at.is_none() {
                return closed("the cleanup has not been planned yet".into());
            }
            work_left(conn, migration, "cleanup")
                .await?
                .map_or(Ok(()), closed)
        }
        Gate::RevertComplete => {
            if migration.revert_planned_at.is_none() {
                return closed("the copy back to the source has not been planned yet".into());
            }
            work_left(conn, migration, "revert")
                .await?
                .map_or(Ok(()), closed)?;
            if let Some(lapse) = revert_outdated(conn, migration).await? {
                return closed(format!(
                    "a router's lease lapsed after the copy back began (its last step may have \
                     landed until {}), so it may have written the target without mirroring \
                     behind the copier; the copy back runs again (`reshard worker {}`)",
                    lapse.format("%Y-%m-%d %H:%M:%S%.3f UTC"),
                    migration.id
                ));
            }
            Ok(())
        }
    }
}

/// `Some(description)` when partitions of `task` are not done yet.
async fn work_left(
    conn: &mut PgConnection,
    migration: &Migration,
    task: &str,
) -> StoreResult<Option<String>> {
    let (left, total): (i64, i64) = sqlx::query_as(
        "SELECT count(*) FILTER (WHERE state <> 'done'), count(*)
         FROM partitions WHERE migration_id = $1 AND task = $2",
    )
    .bind(migration.id)
    .bind(task)
    .fetch_one(&mut *conn)
    .await?;
    Ok((left > 0).then(|| format!("{left} of {total} {task} partition(s) are not done")))
}

/// When a router's lease lapsed after the copy back to the source was planned: until when its
/// last step may have landed. Such a router may have written the target in `reverting` and
/// been cut off by its lease before mirroring the write, after the copier passed the id; only
/// a copy planned after that time has certainly seen the write. `None` when the copy is
/// current (or not planned).
pub(super) async fn revert_outdated(
    conn: &mut PgConnection,
    migration: &Migration,
) -> StoreResult<Option<chrono::DateTime<chrono::Utc>>> {
    let Some(planned) = migration.revert_planned_at else {
        return Ok(None);
    };
    Ok(super::routers::last_lapse(conn, &migration.collection)
        .await?
        .filter(|lapse| *lapse > planned))
}

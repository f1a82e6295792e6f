//! `reshard worker [ID]`: runs a migration's partitioned work (backfill, cleanup waves, the
//! copy back of a rollback) until stopped (SIGINT/SIGTERM) or, with `--exit-when-done`, until
//! the current task is done.

use std::time::Duration;

use tokio::sync::watch;

use crate::cli::WorkerArgs;
use crate::commands::Ctx;
use crate::error::{Error, Result};
use crate::output;
use crate::worker::{Worker, WorkerConfig};

pub async fn run(ctx: &Ctx, args: WorkerArgs) -> Result<()> {
    if let Some(addr) = args.metrics.metrics_addr {
        super::exporter::serve(addr).await?;
    }
    let migration = args.migration();
    if let Some(id) = migration {
        ctx.store.migration(id).await?;
    }
    let name = args
        .name
        .unwrap_or_else(|| format!("{}:{}", crate::identity::hostname(), std::process::id()));
    let mut config = WorkerConfig::new(name.clone());
    config.migration = migration;
    config.concurrency = usize::from(args.leased.concurrency);
    config.exit_when_done = args.exit_when_done;
    config.lease_ttl = args.leased.lease_ttl;
    config.actor = format!("{} (worker {name})", ctx.actor);
    let config_actor = config.actor.clone();
    let worker = Worker::connect(ctx.store.clone(), config).await?;

    let (stop, shutdown) = watch::channel(false);
    tokio::spawn(async move {
        wait_for_signal().await;
        tracing::info!("stopping: finishing the batches in flight and releasing leases");
        let _ = stop.send(true);
    });
    // Writes that bypass the router are found while they happen, not only at the gates.
    tokio::spawn(crate::watch::follow(
        ctx.store.clone(),
        migration,
        config_actor.clone(),
        Duration::from_secs(5),
        shutdown.clone(),
    ));
    // Events reach the migration's hooks while the worker runs (a capacity signal, a failure).
    tokio::spawn(crate::driver::hooks::follow(
        ctx.store.clone(),
        migration,
        config_actor.clone(),
        Duration::from_secs(1),
        shutdown.clone(),
    ));
    tracing::info!(worker = %name, migration_id = ?migration, "worker started");
    let summary = worker.run(shutdown).await.map_err(|e| match e {
        crate::worker::WorkerError::Store(s) => Error::from(s),
        other => Error::failed(other.to_string()),
    })?;
    let value = serde_json::json!({
        "worker": name,
        "partitions_done": summary.partitions_done,
        "batches": summary.batches,
        "documents": summary.documents,
        "leases_lost": summary.leases_lost,
        "nothing_to_do": summary.nothing_to_do,
    });
    output::emit(ctx.output, &value, || {
        let mut fields = vec![
            ("worker", name.clone()),
            ("partitions done", summary.partitions_done.to_string()),
            ("batches", summary.batches.to_string()),
            ("documents", summary.documents.to_string()),
            ("leases lost", summary.leases_lost.to_string()),
        ];
        for line in &summary.nothing_to_do {
            fields.push(("nothing to do", line.clone()));
        }
        output::fields(&fields)
    })
}

/// Resolves on SIGINT or SIGTERM.
pub(super) async fn wait_for_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        let mut term = signal(SignalKind::terminate()).expect("SIGTERM handler");
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}

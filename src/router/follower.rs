//! How a router follows the migration: it heartbeats its lease, listens for and polls the
//! phase, switches epochs (draining the operations of the old one), and connects the shards
//! the versions in play name.

use super::*;

impl Inner {
    /// Renews the lease and acknowledges the epoch applied now (the epoch switched to last,
    /// read without waiting for a switch in progress).
    pub(super) async fn heartbeat(&self) {
        let started = Instant::now();
        let (migration_id, epoch) = *self.epochs.borrow();
        let mut stats = self.stats.lock().expect("stats lock").take_report();
        stats["shadow"] = self.shadow.report();
        let beat = Heartbeat {
            migration_id,
            acked_epoch: migration_id.map(|_| epoch),
            stats: &stats,
        };
        let renewal = match within(
            STORE_CALL_LIMIT,
            self.store.router_heartbeat(
                self.id,
                self.config.lease_ttl,
                self.config.fence_margin(),
                &beat,
            ),
        )
        .await
        {
            Ok(Renewal::Gone) => match within(
                STORE_CALL_LIMIT,
                self.store.register_router(&Registration {
                    id: self.id,
                    collection: &self.collection,
                    name: &self.config.name,
                    host: &crate::identity::hostname(),
                    pid: std::process::id() as i32,
                    ttl: self.config.lease_ttl,
                    fence_margin: self.config.fence_margin(),
                    kind: self.config.kind,
                    heartbeat_interval: self.config.heartbeat_interval,
                }),
            )
            .await
            {
                // A new registration is a lapse: the driver did not wait for this router.
                Ok(()) => Renewal::Lapsed,
                Err(e) => {
                    tracing::warn!(router = %self.config.name, error = %e, "registration failed");
                    return;
                }
            },
            Ok(renewal) => renewal,
            Err(e) => {
                tracing::warn!(router = %self.config.name, error = %e, "heartbeat failed");
                return;
            }
        };
        {
            let mut lease = self.lease.lock().expect("lease lock");
            if renewal == Renewal::Lapsed {
                // The driver may have counted this router out and moved on: serve again only
                // once the phase was loaded after this renewal.
                lease.lapses += 1;
            } else if lease.loaded >= lease.lapses {
                lease.valid_until = started + self.config.lease_ttl;
            }
        }
        if renewal == Renewal::Lapsed {
            tracing::warn!(
                router = %self.config.name,
                "the lease had lapsed; loading the phase again before serving"
            );
            self.reload_now.notify_one();
            return;
        }
        // The store answered: store the shadow-read counts too (when they changed).
        self.shadow.store_counts(self).await;
    }

    /// Loads the state and, when the epoch changed, drains and switches.
    pub(super) async fn refresh(&self) -> bool {
        let lapses = self.lease.lock().expect("lease lock").lapses;
        let switched = self.load().await;
        if let Some(switched) = switched {
            let mut lease = self.lease.lock().expect("lease lock");
            let covers_a_lapse = lapses > lease.loaded;
            lease.loaded = lease.loaded.max(lapses);
            drop(lease);
            // Acknowledge a switch, or renew a lapsed lease, without waiting for the interval.
            if switched || covers_a_lapse {
                self.beat_now.notify_one();
            }
        }
        switched.unwrap_or(false)
    }

    /// One load of the migration state: `Some(true)` when it switched epochs, `Some(false)`
    /// when the epoch is current, `None` when the state store could not be read.
    pub(super) async fn load(&self) -> Option<bool> {
        let warn = |e: StoreError| {
            tracing::warn!(router = %self.config.name, error = %e, "cannot load the migration state");
            None
        };
        // Polls are frequent: read the migration row alone, and the versions only on a change.
        let active = match within(
            STORE_CALL_LIMIT,
            self.store.followed_migration(&self.collection),
        )
        .await
        {
            Ok(m) => m,
            Err(e) => return warn(e),
        };
        // Settings change without a new epoch: the share of shadow reads follows every poll.
        self.shadow
            .set_percent(active.as_ref().map_or(0.0, shadow_read_percent));
        let current = self.snapshot.read().await.clone();
        let key = (active.as_ref().map(|m| m.id), active.map_or(0, |m| m.epoch));
        if key == (current.migration_id, current.epoch) {
            return Some(false);
        }
        let fresh = match within(
            STORE_CALL_LIMIT,
            Snapshot::load(&self.store, &self.collection),
        )
        .await
        {
            Ok(s) => s,
            Err(e) => return warn(e),
        };
        if current.same_epoch(&fresh) {
            return Some(false);
        }
        // A version of the new epoch may name a shard registered since this router started:
        // it is connected before the router switches (and acknowledges); until it is, the
        // router stays in its epoch and the driver's barrier names it.
        if let Err(e) = connect_shards(&self.store, &self.shards, &fresh).await {
            tracing::warn!(router = %self.config.name, epoch = fresh.epoch, "cannot switch epoch: {e}");
            return None;
        }
        let mut guard = self.snapshot.write().await;
        tracing::info!(
            router = %self.config.name,
            from = %current.phase, to = %fresh.phase, epoch = fresh.epoch,
            "switching epoch"
        );
        let key = (fresh.migration_id, fresh.epoch);
        crate::telemetry::router_applies(
            &self.collection,
            fresh.epoch,
            fresh.phase.as_str(),
            Some(current.phase.as_str()),
        );
        *self.applied_phase.lock().expect("phase lock") = fresh.phase;
        *guard = Arc::new(fresh);
        drop(guard);
        self.epochs.send_replace(key);
        Some(true)
    }
}

/// Connects every shard the snapshot's versions name that `shards` lacks, from the store's
/// registry.
pub(super) async fn connect_shards(
    store: &Store,
    shards: &Shards,
    snapshot: &Snapshot,
) -> Result<(), RouterError> {
    let mut wanted = snapshot.source.shards();
    wanted.extend(snapshot.target.shards());
    if wanted.iter().all(|s| shards.contains(s)) {
        return Ok(());
    }
    let registered = within(STORE_CALL_LIMIT, store.shards()).await?;
    match shards.ensure(&wanted, &registered).await {
        Ok(connected) => {
            for shard in connected {
                tracing::info!(
                    shard,
                    "connected to a shard registered since this router started"
                );
            }
            Ok(())
        }
        Err(crate::shards::EnsureError::Unregistered(e)) => Err(RouterError::UnknownShard(e.0)),
        Err(e) => Err(RouterError::InvalidUpdate(e.to_string())),
    }
}

/// The follower: listens for changes, polls anyway, loads the state and switches epochs. A
/// switch waits for the operations of the old epoch to drain; the heartbeat task goes on
/// meanwhile.
pub(super) async fn follow(inner: Arc<Inner>) {
    let mut listener = listen(&inner).await;
    loop {
        let poll = inner.config.heartbeat_interval;
        match listener.as_mut() {
            Some(l) => tokio::select! {
                n = l.recv() => if let Err(e) = n {
                    tracing::warn!(error = %e, "lost the NOTIFY listener; polling");
                    listener = None;
                },
                _ = tokio::time::sleep(poll) => {}
                _ = inner.reload_now.notified() => {}
            },
            None => {
                tokio::select! {
                    _ = tokio::time::sleep(poll) => {}
                    _ = inner.reload_now.notified() => {}
                }
                listener = listen(&inner).await;
            }
        }
        inner.refresh().await;
    }
}

/// The heartbeat task: renews the lease every interval, and at once after an epoch switch.
pub(super) async fn heartbeats(inner: Arc<Inner>) {
    loop {
        tokio::select! {
            _ = tokio::time::sleep(inner.config.heartbeat_interval) => {}
            _ = inner.beat_now.notified() => {}
        }
        inner.heartbeat().await;
    }
}

async fn listen(inner: &Inner) -> Option<sqlx::postgres::PgListener> {
    let subscribe = async {
        let mut listener = sqlx::postgres::PgListener::connect_with(inner.store.pool())
            .await
            .ok()?;
        listener.listen(CHANNEL).await.ok()?;
        Some(listener)
    };
    tokio::time::timeout(STORE_CALL_LIMIT, subscribe)
        .await
        .ok()
        .flatten()
}

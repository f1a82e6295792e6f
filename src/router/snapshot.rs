//! What a router applies ([`Snapshot`]): the phase and the two layouts, loaded from the
//! store, and the view of a stored document the application is shown.

use std::sync::Arc;

use mongodb::bson::Document;

use crate::phase::Phase;
use crate::routing::RoutingVersion;
use crate::store::{Store, StoreError};

/// What the router applies: the phase of the collection's migration and the two layouts.
/// Without an active migration, both layouts are the collection's current version and the
/// phase is `completed` (read and write the current version).
#[derive(Clone, Debug)]
pub struct Snapshot {
    pub migration_id: Option<i64>,
    pub epoch: i64,
    pub phase: Phase,
    /// A rolled-back migration that was sealed: deletes leave no source tombstone.
    pub sealed: bool,
    /// The migration's share of reads shadowed when the snapshot was loaded (routers follow
    /// changes of it with every poll, without a new epoch).
    pub shadow_read_percent: f64,
    pub source: Arc<RoutingVersion>,
    pub target: Arc<RoutingVersion>,
}

impl Snapshot {
    /// A stored document as the application sees it: without `_reshard` and without the
    /// routing fields of the two versions (reshard derives them; no write may set them).
    pub fn view(&self, doc: Document) -> Document {
        let mut doc = crate::envelope::strip(doc);
        for field in [self.source.routing_field(), self.target.routing_field()]
            .into_iter()
            .flatten()
        {
            doc.remove(field);
        }
        doc
    }

    pub(super) async fn load(store: &Store, collection: &str) -> Result<Snapshot, StoreError> {
        match store.followed_migration(collection).await? {
            Some(m) => Ok(Snapshot {
                migration_id: Some(m.id),
                epoch: m.epoch,
                phase: m.phase(),
                sealed: m.sealed_at.is_some(),
                shadow_read_percent: shadow_read_percent(&m),
                source: Arc::new(
                    store
                        .version(collection, Some(m.from_version))
                        .await?
                        .version,
                ),
                target: Arc::new(store.version(collection, Some(m.to_version)).await?.version),
            }),
            None => {
                let current = store.current_version(collection).await?;
                let v = Arc::new(store.version(collection, Some(current)).await?.version);
                Ok(Snapshot {
                    migration_id: None,
                    epoch: 0,
                    phase: Phase::Completed,
                    sealed: false,
                    shadow_read_percent: 0.0,
                    source: v.clone(),
                    target: v,
                })
            }
        }
    }

    pub(super) fn same_epoch(&self, other: &Snapshot) -> bool {
        self.migration_id == other.migration_id && self.epoch == other.epoch
    }
}

/// The migration's `shadow_read_percent` (0 when its settings cannot be read).
pub(super) fn shadow_read_percent(m: &crate::store::migrations::Migration) -> f64 {
    crate::settings::MigrationSettings::from_json(&m.settings)
        .map(|s| s.shadow_read_percent)
        .unwrap_or(0.0)
}

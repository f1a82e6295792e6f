//! `reshard plan`: samples each source location of a playbook and estimates with
//! [`crate::capacity`].

use std::time::Duration;

use mongodb::bson::{doc, Bson, Document};

use super::Driver;
use crate::capacity::{self, Inputs, LocationSample, Report, SampledDoc};
use crate::error::{Error, Result};
use crate::routing::{KeyValue, RoutingVersion};
use crate::shards::read::ReadError;
use crate::shards::Shards;
use crate::spec::playbook::{Playbook, Source};

/// Samples the playbook's source and estimates what the migration to its target means.
pub async fn plan(driver: &Driver, pb: &Playbook) -> Result<Report> {
    let from: RoutingVersion = match &pb.source {
        Source::Version(n) => {
            driver
                .store
                .version(&pb.doc.collection, Some(*n))
                .await?
                .version
        }
        Source::Spec(v) => v.clone(),
    };
    let to = &pb.target;
    let mut shards = driver.store.shards().await?;
    for s in &pb.doc.shards {
        if !shards.iter().any(|r| r.name == s.name) {
            shards.push(crate::store::shards::Shard {
                name: s.name.clone(),
                uri: crate::redact::Redacted::new(&s.uri),
                database: s.database.clone(),
                created_at: chrono::Utc::now(),
            });
        }
    }
    let shards = Shards::connect(&shards, false)
        .await
        .map_err(|e| Error::bad_input(e.to_string()))?;
    let capacity = pb.doc.capacity.clone();
    let window = capacity
        .as_ref()
        .and_then(|c| c.window.as_deref())
        .and_then(|w| humantime::parse_duration(w).ok())
        .unwrap_or(Duration::from_secs(600));
    let timestamp_field = capacity.as_ref().and_then(|c| c.timestamp_field.clone());
    let sample_size = capacity.as_ref().and_then(|c| c.sample).unwrap_or(2000);
    let since = chrono::Utc::now() - chrono::Duration::from_std(window).unwrap_or_default();
    let mut samples = Vec::new();
    for location in from.locations() {
        let failed = |e: ReadError| match e {
            ReadError::UnknownShard(e) => Error::bad_input(e.to_string()),
            e => Error::failed(crate::redact::redact_uri(&e.to_string())),
        };
        let documents = shards.estimated_count(&location).await.map_err(failed)?;
        let docs: Vec<Document> = shards
            .aggregate(
                &location,
                vec![doc! { "$sample": { "size": sample_size as i64 } }],
            )
            .await
            .map_err(failed)?;
        let sampled = docs
            .iter()
            .filter(|d| !crate::envelope::is_tombstone(d))
            .filter_map(|d| {
                let (tenant, id) = from.document_keys(d).ok()?;
                let in_window = timestamp_field
                    .as_ref()
                    .and_then(|f| match d.get(f) {
                        Some(Bson::DateTime(t)) => Some(t.to_chrono() >= since),
                        _ => None,
                    })
                    .unwrap_or(false);
                Some(SampledDoc {
                    tenant,
                    id,
                    bytes: mongodb::bson::to_vec(d).map_or(0, |b| b.len() as u64),
                    in_window,
                })
            })
            .collect();
        samples.push(LocationSample {
            shard: location.shard.clone(),
            documents,
            docs: sampled,
        });
    }
    let given = capacity
        .as_ref()
        .map(|c| {
            c.tenant_rates
                .iter()
                .filter_map(|r| Some((KeyValue::from_yaml(&r.tenant)?, r.peak_writes_per_sec)))
                .collect()
        })
        .unwrap_or_default();
    let inputs = Inputs {
        per_shard_write_limit: capacity
            .as_ref()
            .map_or(f64::INFINITY, |c| c.per_shard_write_limit),
        headroom: capacity.as_ref().and_then(|c| c.headroom).unwrap_or(0.25),
        window_secs: if timestamp_field.is_some() {
            window.as_secs_f64()
        } else {
            0.0
        },
        given,
        max_docs_per_sec: pb.settings.max_docs_per_sec,
    };
    Ok(capacity::estimate(&from, to, &samples, &inputs))
}

//! The capacity planner's arithmetic (`reshard plan`): from documents sampled at each source
//! location and the tenants' write rates, what moves and what stays per shard, how long the
//! copy takes at the configured rate, each shard's write load before and after, and how many
//! buckets a hot tenant needs. Pure: the sampling is the driver's (`driver::capacity`).
//!
//! The bucket count of a hot tenant (seed 004): at least its peak write rate divided by what
//! one shard may take, plus headroom: `ceil(peak × (1 + headroom) / per_shard_write_limit)`.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::routing::{KeyValue, RoutingVersion};

/// What one source location's sample says.
#[derive(Clone, Debug)]
pub struct LocationSample {
    pub shard: String,
    /// The location's estimated document count.
    pub documents: u64,
    /// Sampled documents: tenant, id, BSON size, and whether the timestamp field puts it in
    /// the rate window.
    pub docs: Vec<SampledDoc>,
}

#[derive(Clone, Debug)]
pub struct SampledDoc {
    pub tenant: KeyValue,
    pub id: KeyValue,
    pub bytes: u64,
    pub in_window: bool,
}

/// Where a tenant's write rate comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum RateSource {
    /// Given in the playbook (`capacity.tenant_rates`).
    Given,
    /// Counted from the timestamp field over the window (an average, scaled from the sample).
    Measured,
}

/// The planner's inputs besides the sample.
#[derive(Clone, Debug)]
pub struct Inputs {
    pub per_shard_write_limit: f64,
    pub headroom: f64,
    pub window_secs: f64,
    /// Peak write rates from the playbook.
    pub given: Vec<(KeyValue, f64)>,
    /// The migration's configured copy rate.
    pub max_docs_per_sec: f64,
}

#[derive(Clone, Debug, Default, Serialize, PartialEq)]
pub struct ShardLoad {
    pub shard: String,
    pub documents_before: u64,
    pub documents_after: u64,
    pub bytes_before: u64,
    pub bytes_after: u64,
    /// Documents (and bytes) that leave this shard, arrive at it, or stay on it.
    pub moving_out: u64,
    pub moving_in: u64,
    pub staying: u64,
    pub bytes_moving_in: u64,
    /// Writes per second of the rated tenants, before and after.
    pub writes_before: f64,
    pub writes_after: f64,
}

#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct TenantPlan {
    pub tenant: String,
    pub writes_per_sec: f64,
    pub source: RateSource,
    pub buckets_now: u32,
    pub buckets_in_target: u32,
    /// `ceil(rate × (1 + headroom) / per_shard_write_limit)`, at least 1.
    pub recommended_buckets: u32,
}

#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct Report {
    pub shards: Vec<ShardLoad>,
    pub documents_moving: u64,
    pub bytes_moving: u64,
    pub documents_staying: u64,
    /// The copy at the configured rate.
    pub copy_seconds: f64,
    pub max_docs_per_sec: f64,
    pub per_shard_write_limit: f64,
    pub headroom: f64,
    /// Tenants with a known rate, hottest first.
    pub tenants: Vec<TenantPlan>,
    /// Shards whose write load after exceeds the per-shard limit.
    pub over_limit_after: Vec<String>,
    /// Whether the target meets the limit, and what would when it does not.
    pub limit: LimitVerdict,
}

/// Whether the target keeps every shard within the per-shard write limit, and, when it does
/// not, what would: more buckets for a tenant that has fewer than its formula asks, more
/// shards, or a higher limit. Buckets spread a tenant's writes over shards; they cannot make
/// the shards take more than all of them together can.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct LimitVerdict {
    /// Every shard of the target stays within the limit.
    pub within_limit: bool,
    /// The rated tenants' writes per second together, and with the headroom.
    pub writes_per_sec: f64,
    pub writes_with_headroom_per_sec: f64,
    /// The shards the target places data on.
    pub target_shards: usize,
    /// `ceil(writes × (1 + headroom) / limit)`: the fewest shards that take the load at the
    /// limit, spread evenly.
    pub shards_needed: u64,
    /// The limit each shard of the target must take: its hottest shard's writes after,
    /// with the headroom.
    pub limit_needed_per_sec: f64,
    /// The same with the load spread evenly over the target's shards.
    pub limit_needed_evenly_per_sec: f64,
    /// Tenants whose target has fewer buckets than the formula recommends, hottest first.
    pub too_few_buckets: Vec<String>,
    /// What to do, in words (empty when within the limit).
    pub advice: Vec<String>,
}

impl LimitVerdict {
    fn of(
        shards: &[ShardLoad],
        tenants: &[TenantPlan],
        target_shards: usize,
        inputs: &Inputs,
    ) -> Self {
        let limit = inputs.per_shard_write_limit;
        let writes: f64 = tenants.iter().map(|t| t.writes_per_sec).sum();
        let with_headroom = writes * (1.0 + inputs.headroom);
        let hottest = shards
            .iter()
            .max_by(|a, b| a.writes_after.total_cmp(&b.writes_after));
        let within_limit = shards.iter().all(|s| s.writes_after <= limit);
        let shards_needed = if limit > 0.0 {
            ((with_headroom / limit).ceil() as u64).max(1)
        } else {
            0
        };
        let n = target_shards.max(1);
        let limit_needed = hottest.map_or(0.0, |s| s.writes_after) * (1.0 + inputs.headroom);
        let evenly = with_headroom / n as f64;
        let too_few: Vec<&TenantPlan> = tenants
            .iter()
            .filter(|t| t.buckets_in_target < t.recommended_buckets)
            .collect();
        let mut advice = Vec::new();
        if !within_limit {
            let hottest = hottest.expect("a shard is over the limit");
            if shards_needed > n as u64 {
                advice.push(format!(
                    "buckets alone cannot meet the limit: {writes:.0} writes/s with {:.0} % \
                     headroom ({with_headroom:.0}/s) need at least {shards_needed} shards at \
                     {limit:.0}/s each, or a limit of {limit_needed:.0}/s per shard on these \
                     {n} ({evenly:.0}/s if the load spread evenly)",
                    inputs.headroom * 100.0
                ));
            }
            for t in &too_few {
                advice.push(format!(
                    "give {} {} buckets: it writes {:.0}/s and the target gives it {}",
                    t.tenant, t.recommended_buckets, t.writes_per_sec, t.buckets_in_target
                ));
            }
            if advice.is_empty() {
                advice.push(format!(
                    "the shards have room ({with_headroom:.0} of {:.0} writes/s) but the load \
                     lands unevenly ({} takes {:.0}/s): give the hottest tenants more buckets, \
                     or move vbuckets off {}",
                    limit * n as f64,
                    hottest.shard,
                    hottest.writes_after,
                    hottest.shard
                ));
            }
        }
        LimitVerdict {
            within_limit,
            writes_per_sec: writes,
            writes_with_headroom_per_sec: with_headroom,
            target_shards,
            shards_needed,
            limit_needed_per_sec: limit_needed,
            limit_needed_evenly_per_sec: evenly,
            too_few_buckets: too_few.iter().map(|t| t.tenant.clone()).collect(),
            advice,
        }
    }
}

/// `ceil(rate × (1 + headroom) / limit)`, at least 1.
pub fn recommended_buckets(rate: f64, headroom: f64, limit: f64) -> u32 {
    if limit <= 0.0 || !rate.is_finite() || rate <= 0.0 {
        return 1;
    }
    ((rate * (1.0 + headroom) / limit).ceil() as u32).max(1)
}

/// A tenant's write rate spread over its buckets' shards under `version`: each bucket gets an
/// equal share (a document's bucket comes from a hash of its id).
fn spread(version: &RoutingVersion, tenant: &KeyValue, rate: f64) -> Vec<(String, f64)> {
    let n = version.buckets_of(tenant).max(1);
    let mut out: BTreeMap<String, f64> = BTreeMap::new();
    match version.layout() {
        crate::routing::Layout::Hashed {
            virtual_buckets, ..
        } => {
            let v = std::num::NonZeroU32::new(*virtual_buckets).expect("validated V > 0");
            for s in 0..n {
                let vb = crate::routing::vbucket(tenant, s, v);
                if let Some(l) = version.location_of_vbucket(vb) {
                    *out.entry(l.shard).or_default() += rate / n as f64;
                }
            }
        }
        _ => {
            if let Ok(l) = version.locate(tenant, &KeyValue::Int(0)) {
                let k = l.locations.len().max(1) as f64;
                for loc in l.locations {
                    *out.entry(loc.shard).or_default() += rate / k;
                }
            }
        }
    }
    out.into_iter().collect()
}

/// The estimate.
pub fn estimate(
    from: &RoutingVersion,
    to: &RoutingVersion,
    samples: &[LocationSample],
    inputs: &Inputs,
) -> Report {
    let mut shards: BTreeMap<String, ShardLoad> = BTreeMap::new();
    for s in from.shards().into_iter().chain(to.shards()) {
        shards.entry(s.clone()).or_insert_with(|| ShardLoad {
            shard: s,
            ..ShardLoad::default()
        });
    }
    let mut measured: BTreeMap<KeyValue, f64> = BTreeMap::new();
    let (mut moving, mut bytes_moving, mut staying) = (0u64, 0u64, 0u64);
    for sample in samples {
        if sample.docs.is_empty() {
            continue;
        }
        // Each sampled document stands for this many.
        let weight = sample.documents as f64 / sample.docs.len() as f64;
        for d in &sample.docs {
            let Ok(there) = to.locate(&d.tenant, &d.id) else {
                continue;
            };
            let Some(target) = there.locations.first() else {
                continue;
            };
            let docs = weight.round() as u64;
            let bytes = (weight * d.bytes as f64).round() as u64;
            let before = shards.entry(sample.shard.clone()).or_default();
            before.shard = sample.shard.clone();
            before.documents_before += docs;
            before.bytes_before += bytes;
            if target.shard == sample.shard {
                before.staying += docs;
                before.documents_after += docs;
                before.bytes_after += bytes;
                staying += docs;
            } else {
                before.moving_out += docs;
                moving += docs;
                bytes_moving += bytes;
                let after = shards.entry(target.shard.clone()).or_default();
                after.shard = target.shard.clone();
                after.moving_in += docs;
                after.bytes_moving_in += bytes;
                after.documents_after += docs;
                after.bytes_after += bytes;
            }
            if d.in_window && inputs.window_secs > 0.0 {
                *measured.entry(d.tenant.clone()).or_default() += weight / inputs.window_secs;
            }
        }
    }
    // Rates: given ones win over measured ones.
    let mut rates: BTreeMap<KeyValue, (f64, RateSource)> = measured
        .into_iter()
        .map(|(t, r)| (t, (r, RateSource::Measured)))
        .collect();
    for (t, r) in &inputs.given {
        rates.insert(t.clone(), (*r, RateSource::Given));
    }
    let mut tenants = Vec::new();
    for (tenant, (rate, source)) in &rates {
        for (shard, share) in spread(from, tenant, *rate) {
            shards.entry(shard.clone()).or_default().writes_before += share;
        }
        for (shard, share) in spread(to, tenant, *rate) {
            shards.entry(shard.clone()).or_default().writes_after += share;
        }
        tenants.push(TenantPlan {
            tenant: tenant.to_string(),
            writes_per_sec: *rate,
            source: *source,
            buckets_now: from.buckets_of(tenant),
            buckets_in_target: to.buckets_of(tenant),
            recommended_buckets: recommended_buckets(
                *rate,
                inputs.headroom,
                inputs.per_shard_write_limit,
            ),
        });
    }
    tenants.sort_by(|a, b| b.writes_per_sec.total_cmp(&a.writes_per_sec));
    let shards: Vec<ShardLoad> = shards
        .into_iter()
        .map(|(name, mut l)| {
            l.shard = name;
            l
        })
        .collect();
    let over_limit_after = shards
        .iter()
        .filter(|s| s.writes_after > inputs.per_shard_write_limit)
        .map(|s| s.shard.clone())
        .collect();
    let limit = LimitVerdict::of(&shards, &tenants, to.shards().len(), inputs);
    Report {
        documents_moving: moving,
        bytes_moving,
        documents_staying: staying,
        copy_seconds: moving as f64 / inputs.max_docs_per_sec.max(1.0),
        max_docs_per_sec: inputs.max_docs_per_sec,
        per_shard_write_limit: inputs.per_shard_write_limit,
        headroom: inputs.headroom,
        shards,
        tenants,
        over_limit_after,
        limit,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::routing::{Layout, PlacementRange, TenantBuckets};

    fn version(hot_buckets: u32) -> RoutingVersion {
        RoutingVersion::new(
            "orders",
            "customerId",
            Layout::Hashed {
                virtual_buckets: 1024,
                default_buckets: 1,
                tenant_buckets: vec![TenantBuckets {
                    tenant: KeyValue::String("hot".into()),
                    buckets: hot_buckets,
                }],
                placement: (0..4)
                    .map(|i| PlacementRange {
                        start: i * 256,
                        end: (i + 1) * 256,
                        shard: format!("s{}", i + 1),
                    })
                    .collect(),
                routing_field: None,
            },
        )
    }

    /// The hot tenant alone (1,200 writes/s) on the four shards of `version(buckets)`.
    fn hot_report(buckets_before: u32, buckets_after: u32, limit: f64) -> Report {
        let (from, to) = (version(buckets_before), version(buckets_after));
        let inputs = Inputs {
            per_shard_write_limit: limit,
            headroom: 0.3,
            window_secs: 600.0,
            given: vec![(KeyValue::String("hot".into()), 1200.0)],
            max_docs_per_sec: 1000.0,
        };
        estimate(&from, &to, &[], &inputs)
    }

    #[test]
    fn the_planner_says_what_meets_the_limit_when_buckets_alone_cannot() {
        // 1,560 writes/s with headroom over 4 shards of 100/s: no bucket count meets it.
        let r = hot_report(1, 16, 100.0);
        let v = &r.limit;
        assert!(!v.within_limit);
        assert_eq!(v.target_shards, 4);
        assert_eq!(v.shards_needed, 16);
        assert!(
            (v.limit_needed_evenly_per_sec - 390.0).abs() < 1e-9,
            "{v:?}"
        );
        let hottest = r.shards.iter().map(|s| s.writes_after).fold(0.0, f64::max);
        assert!(
            (v.limit_needed_per_sec - hottest * 1.3).abs() < 1e-9,
            "{v:?}"
        );
        assert!(v.too_few_buckets.is_empty(), "{v:?}");
        assert_eq!(v.advice.len(), 1, "{v:?}");
        assert!(
            v.advice[0].contains("at least 16 shards"),
            "{}",
            v.advice[0]
        );
        assert!(
            v.advice[0].contains("390/s if the load spread evenly"),
            "{}",
            v.advice[0]
        );

        // At a limit the hottest shard's load meets, the same target is within it.
        let r = hot_report(1, 16, (hottest * 1.3).ceil());
        assert!(r.limit.within_limit, "{:?}", r.limit);
        assert!(r.limit.advice.is_empty() && r.over_limit_after.is_empty());

        // The shards could take it, but the target keeps the tenant on one bucket.
        let r = hot_report(1, 1, 500.0);
        let v = &r.limit;
        assert!(!v.within_limit);
        assert_eq!(v.shards_needed, 4);
        assert_eq!(v.too_few_buckets, [r.tenants[0].tenant.clone()]);
        assert_eq!(v.advice.len(), 1, "{v:?}");
        assert!(v.advice[0].starts_with("give "), "{}", v.advice[0]);
        assert!(v.advice[0].contains(" 4 buckets"), "{}", v.advice[0]);
    }

    #[test]
    fn the_bucket_count_follows_the_formula() {
        assert_eq!(recommended_buckets(1200.0, 0.3, 100.0), 16);
        assert_eq!(recommended_buckets(1000.0, 0.0, 100.0), 10);
        assert_eq!(recommended_buckets(50.0, 0.25, 100.0), 1);
        assert_eq!(recommended_buckets(0.0, 0.25, 100.0), 1);
    }

    #[test]
    fn a_hot_tenant_spread_over_buckets_spreads_its_load_and_moves_its_documents() {
        let (from, to) = (version(1), version(16));
        let hot = KeyValue::String("hot".into());
        let here = from.locate(&hot, &KeyValue::Int(0)).unwrap().locations[0]
            .shard
            .clone();
        let docs: Vec<SampledDoc> = (0..1000)
            .map(|i| SampledDoc {
                tenant: hot.clone(),
                id: KeyValue::Int(i),
                bytes: 100,
                in_window: false,
            })
            .collect();
        let sample = LocationSample {
            shard: here.clone(),
            documents: 10_000,
            docs,
        };
        let inputs = Inputs {
            per_shard_write_limit: 100.0,
            headroom: 0.3,
            window_secs: 600.0,
            given: vec![(hot.clone(), 1200.0)],
            max_docs_per_sec: 1000.0,
        };
        let r = estimate(&from, &to, &[sample], &inputs);
        assert_eq!(r.tenants[0].recommended_buckets, 16);
        assert_eq!(r.tenants[0].buckets_in_target, 16);
        let before = r.shards.iter().find(|s| s.shard == here).unwrap();
        assert!((before.writes_before - 1200.0).abs() < 1e-6);
        // Spread over 16 buckets on 4 shards, the hot shard keeps well under all of it.
        assert!(before.writes_after < 800.0, "{before:?}");
        let total_after: f64 = r.shards.iter().map(|s| s.writes_after).sum();
        assert!((total_after - 1200.0).abs() < 1e-6);
        // Every bucket but the first moves, unless it lands on the same shard.
        assert!(
            r.documents_moving > 5_000 && r.documents_moving < 10_000,
            "{r:?}"
        );
        assert_eq!(r.documents_moving + r.documents_staying, 10_000);
        assert!((r.copy_seconds - r.documents_moving as f64 / 1000.0).abs() < 1e-9);
    }
}

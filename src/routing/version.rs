//! Routing versions: the immutable description of where a collection's documents
//! live, and the lookup from (tenant, id) to a location.
//!
//! A [`RoutingVersion`] is what the store keeps (as JSON) and what a spec file
//! describes. It is plain data, except for one thing: [`RoutingVersion::locate`]
//! runs once per document in the router and in backfill loops, so the version
//! builds a lookup index (tenant -> bucket count, sorted placement, one
//! [`Location`] per shard) the first time it is asked, and keeps it. To make a
//! stale index impossible, the layout is reachable only through
//! [`RoutingVersion::layout`] and [`RoutingVersion::layout_mut`]; the latter
//! drops the index, which is rebuilt on the next lookup.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::num::NonZeroU32;
use std::sync::OnceLock;

use serde::{Deserialize, Serialize};

use super::{sub_bucket, vbucket, KeyValue, RoutingError};

/// The id field when a version does not name one.
pub const DEFAULT_ID_FIELD: &str = "_id";
/// The number of virtual buckets the project's design document suggests for a new collection.
pub const DEFAULT_VIRTUAL_BUCKETS: u32 = 1024;

/// One place documents can live: a collection on a shard.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Location {
    /// The registered shard name.
    pub shard: String,
    /// The collection name on that shard.
    pub collection: String,
}

impl Location {
    /// A location from its parts.
    pub fn new(shard: impl Into<String>, collection: impl Into<String>) -> Self {
        Location {
            shard: shard.into(),
            collection: collection.into(),
        }
    }
}

/// Prints `shard/collection`.
impl fmt::Display for Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.shard, self.collection)
    }
}

/// The vbuckets `[start, end)` live on `shard`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlacementRange {
    /// First vbucket of the range.
    pub start: u32,
    /// One past the last vbucket of the range.
    pub end: u32,
    /// The shard holding the range.
    pub shard: String,
}

impl PlacementRange {
    /// Whether `vbucket` falls in `[start, end)`.
    pub fn contains(&self, vbucket: u32) -> bool {
        self.start <= vbucket && vbucket < self.end
    }
}

/// A tenant whose bucket count differs from the default.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TenantBuckets {
    /// The tenant key value.
    pub tenant: KeyValue,
    /// How many buckets the tenant's documents spread over.
    pub buckets: u32,
}

/// One row of an explicit tenant -> shard table.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TenantShard {
    /// The tenant key value.
    pub tenant: KeyValue,
    /// The shard that holds all of the tenant's documents.
    pub shard: String,
}

/// How the documents of a version are spread over shards.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Layout {
    /// The layout reshard makes: tenants hash to vbuckets, vbuckets are placed on shards.
    Hashed {
        /// `V`, the number of vbuckets; fixed for a collection.
        virtual_buckets: u32,
        /// `n(t)` of every tenant not listed in `tenant_buckets` (usually 1).
        default_buckets: u32,
        /// Tenants with their own bucket count.
        #[serde(default)]
        tenant_buckets: Vec<TenantBuckets>,
        /// Ranges covering `[0, V)` exactly once.
        placement: Vec<PlacementRange>,
        /// A field every document written in this layout carries its sub-bucket in.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        routing_field: Option<String>,
    },
    /// A source layout not made by reshard: a document may be in any listed shard.
    Fanout {
        /// Every shard to look in.
        shards: Vec<String>,
    },
    /// A source layout given as an explicit tenant -> shard table.
    TenantTable {
        /// The table.
        tenants: Vec<TenantShard>,
        /// The shard of every tenant not in the table; without it such tenants cannot be located.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        default_shard: Option<String>,
    },
}

impl Layout {
    /// `hashed`, `fanout` or `tenant_table`, as in the JSON and spec forms.
    pub fn kind(&self) -> &'static str {
        match self {
            Layout::Hashed { .. } => "hashed",
            Layout::Fanout { .. } => "fanout",
            Layout::TenantTable { .. } => "tenant_table",
        }
    }
}

/// Where one document lives under a routing version.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Located {
    /// The document's sub-bucket (0 for layouts without buckets).
    pub sub_bucket: u32,
    /// The document's vbucket, for hashed layouts.
    pub vbucket: Option<u32>,
    /// Where to find it: exactly one location, except for a fanout layout,
    /// where it may be in any of them.
    pub locations: Vec<Location>,
}

/// An immutable, numbered description of where a collection's documents live.
#[derive(Clone, Serialize, Deserialize)]
pub struct RoutingVersion {
    /// The collection name, also the collection on every shard not listed in `collections`.
    pub collection: String,
    /// The version number; 0 until the store assigns one.
    pub version: i32,
    /// The document field that routes, e.g. `customerId`.
    pub tenant_key: String,
    /// The document id field, usually `_id`.
    #[serde(default = "default_id_field")]
    pub id_field: String,
    layout: Layout,
    /// Per-shard collection names; a shard not listed uses `collection`.
    #[serde(default)]
    pub collections: BTreeMap<String, String>,
    #[serde(skip)]
    index: IndexCell,
}

fn default_id_field() -> String {
    DEFAULT_ID_FIELD.to_owned()
}

impl RoutingVersion {
    /// Whether two versions describe the same layout, whatever their numbers.
    pub fn same_layout(&self, other: &RoutingVersion) -> bool {
        let shape = |v: &RoutingVersion| {
            let mut json = serde_json::to_value(v).expect("a version serialises");
            json["version"] = serde_json::Value::Null;
            json
        };
        shape(self) == shape(other)
    }
}

impl fmt::Debug for RoutingVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RoutingVersion")
            .field("collection", &self.collection)
            .field("version", &self.version)
            .field("tenant_key", &self.tenant_key)
            .field("id_field", &self.id_field)
            .field("layout", &self.layout)
            .field("collections", &self.collections)
            .finish()
    }
}

/// Versions are equal when their data is; the lookup index does not count.
impl PartialEq for RoutingVersion {
    fn eq(&self, other: &Self) -> bool {
        self.collection == other.collection
            && self.version == other.version
            && self.tenant_key == other.tenant_key
            && self.id_field == other.id_field
            && self.layout == other.layout
            && self.collections == other.collections
    }
}

impl RoutingVersion {
    /// A version 0 with id field `_id` and the same collection name on every shard.
    pub fn new(
        collection: impl Into<String>,
        tenant_key: impl Into<String>,
        layout: Layout,
    ) -> Self {
        RoutingVersion {
            collection: collection.into(),
            version: 0,
            tenant_key: tenant_key.into(),
            id_field: default_id_field(),
            layout,
            collections: BTreeMap::new(),
            index: IndexCell::default(),
        }
    }

    /// The same version with another id field.
    pub fn with_id_field(mut self, id_field: impl Into<String>) -> Self {
        self.id_field = id_field.into();
        self
    }

    /// The same version with per-shard collection names.
    pub fn with_collections(mut self, collections: BTreeMap<String, String>) -> Self {
        self.collections = collections;
        self
    }

    /// How documents are spread over shards.
    pub fn layout(&self) -> &Layout {
        &self.layout
    }

    /// Changes the layout; the lookup index is rebuilt on the next lookup.
    pub fn layout_mut(&mut self) -> &mut Layout {
        self.index = IndexCell::default();
        &mut self.layout
    }

    /// Every shard this version uses.
    pub fn shards(&self) -> BTreeSet<String> {
        match &self.layout {
            Layout::Hashed { placement, .. } => {
                placement.iter().map(|range| range.shard.clone()).collect()
            }
            Layout::Fanout { shards } => shards.iter().cloned().collect(),
            Layout::TenantTable {
                tenants,
                default_shard,
            } => tenants
                .iter()
                .map(|row| row.shard.clone())
                .chain(default_shard.iter().cloned())
                .collect(),
        }
    }

    /// `V`, for a hashed layout.
    pub fn virtual_buckets(&self) -> Option<u32> {
        match &self.layout {
            Layout::Hashed {
                virtual_buckets, ..
            } => Some(*virtual_buckets),
            _ => None,
        }
    }

    /// The field documents carry their sub-bucket in, if the layout names one.
    pub fn routing_field(&self) -> Option<&str> {
        match &self.layout {
            Layout::Hashed { routing_field, .. } => routing_field.as_deref(),
            _ => None,
        }
    }

    /// `n(t)`: the tenant's own bucket count, else the default. Layouts without
    /// buckets give 1. If a tenant is listed twice (which validation rejects),
    /// the first entry counts.
    pub fn buckets_of(&self, tenant: &KeyValue) -> u32 {
        match self.index() {
            LookupIndex::Hashed {
                default_buckets,
                tenant_buckets,
                ..
            } => tenant_buckets
                .get(tenant)
                .copied()
                .unwrap_or(*default_buckets),
            _ => 1,
        }
    }

    /// The location of this collection on `shard`.
    pub fn location_on(&self, shard: &str) -> Location {
        let collection = self.collections.get(shard).unwrap_or(&self.collection);
        Location::new(shard, collection.clone())
    }

    /// Every location of this version, sorted.
    pub fn locations(&self) -> Vec<Location> {
        self.shards()
            .iter()
            .map(|shard| self.location_on(shard))
            .collect()
    }

    /// The tenant key and id of a stored document, as this version reads them; the error
    /// names the missing or unroutable field.
    pub fn document_keys(
        &self,
        doc: &mongodb::bson::Document,
    ) -> Result<(KeyValue, KeyValue), String> {
        let tenant = doc
            .get(&self.tenant_key)
            .ok_or_else(|| format!("the document has no tenant key field {:?}", self.tenant_key))?;
        let id = doc
            .get(&self.id_field)
            .ok_or_else(|| format!("the document has no id field {:?}", self.id_field))?;
        let tenant = KeyValue::from_bson(tenant).map_err(|e| format!("tenant key: {e}"))?;
        let id = KeyValue::from_bson(id).map_err(|e| format!("id: {e}"))?;
        Ok((tenant, id))
    }

    /// Where the document with this tenant key and id lives.
    ///
    /// Hashed: exactly one location, by the rules in the module docs. Fanout:
    /// every listed location. Tenant table: the tenant's shard, else the default
    /// shard, else [`RoutingError::TenantNotInTable`].
    pub fn locate(&self, tenant: &KeyValue, id: &KeyValue) -> Result<Located, RoutingError> {
        match self.index() {
            LookupIndex::Hashed {
                virtual_buckets,
                default_buckets,
                tenant_buckets,
                placement,
                locations,
            } => {
                let virtual_buckets = virtual_buckets.ok_or(RoutingError::NoVirtualBuckets)?;
                let buckets = tenant_buckets
                    .get(tenant)
                    .copied()
                    .unwrap_or(*default_buckets);
                let buckets = NonZeroU32::new(buckets).ok_or_else(|| RoutingError::NoBuckets {
                    tenant: tenant.clone(),
                })?;
                let sub_bucket = sub_bucket(id, buckets);
                let vbucket = vbucket(tenant, sub_bucket, virtual_buckets);
                let location = placed_location(placement, vbucket)
                    .ok_or(RoutingError::VbucketNotPlaced { vbucket })?;
                Ok(Located {
                    sub_bucket,
                    vbucket: Some(vbucket),
                    locations: vec![locations[location].clone()],
                })
            }
            LookupIndex::Fanout { locations } => Ok(Located {
                sub_bucket: 0,
                vbucket: None,
                locations: locations.clone(),
            }),
            LookupIndex::TenantTable {
                tenant_shards,
                default_location,
                locations,
            } => {
                let location = tenant_shards
                    .get(tenant)
                    .copied()
                    .or(*default_location)
                    .ok_or_else(|| RoutingError::TenantNotInTable {
                        tenant: tenant.clone(),
                    })?;
                Ok(Located {
                    sub_bucket: 0,
                    vbucket: None,
                    locations: vec![locations[location].clone()],
                })
            }
        }
    }

    /// The location of a vbucket, for hashed layouts (`None` for other layouts
    /// and for a vbucket no range places).
    pub fn location_of_vbucket(&self, vbucket: u32) -> Option<Location> {
        match self.index() {
            LookupIndex::Hashed {
                placement,
                locations,
                ..
            } => placed_location(placement, vbucket).map(|index| locations[index].clone()),
            _ => None,
        }
    }

    /// The lookup index, built on first use.
    fn index(&self) -> &LookupIndex {
        self.index.0.get_or_init(|| LookupIndex::build(self))
    }
}

/// The location index (into the index's `locations`) of the placement range
/// containing `vbucket`. `placement` is sorted by start; ranges of a validated
/// version do not overlap, so the last range starting at or before `vbucket`
/// is the only candidate. Invalid, overlapping placements fall back to a scan.
fn placed_location(placement: &[PlacedRange], vbucket: u32) -> Option<usize> {
    let after = placement.partition_point(|range| range.start <= vbucket);
    let candidate = after.checked_sub(1).map(|i| &placement[i]);
    match candidate {
        Some(range) if vbucket < range.end => Some(range.location),
        _ => placement[..after]
            .iter()
            .find(|range| vbucket < range.end)
            .map(|range| range.location),
    }
}

/// A placement range with its shard resolved to a location index.
#[derive(Debug)]
struct PlacedRange {
    start: u32,
    end: u32,
    location: usize,
}

/// The lookup index of a version: empty until the first lookup fills it.
#[derive(Debug, Default)]
struct IndexCell(OnceLock<LookupIndex>);

/// A clone starts without an index; it is cheap to rebuild and the clone may be changed.
impl Clone for IndexCell {
    fn clone(&self) -> Self {
        IndexCell::default()
    }
}

/// What `locate` needs, in the shape it needs it.
#[derive(Debug)]
enum LookupIndex {
    Hashed {
        virtual_buckets: Option<NonZeroU32>,
        default_buckets: u32,
        tenant_buckets: BTreeMap<KeyValue, u32>,
        placement: Vec<PlacedRange>,
        locations: Vec<Location>,
    },
    Fanout {
        locations: Vec<Location>,
    },
    TenantTable {
        tenant_shards: BTreeMap<KeyValue, usize>,
        default_location: Option<usize>,
        locations: Vec<Location>,
    },
}

impl LookupIndex {
    fn build(version: &RoutingVersion) -> LookupIndex {
        let locations = version.locations();
        let location_of = |shard: &str| {
            locations
                .binary_search_by(|location| location.shard.as_str().cmp(shard))
                .expect("locations() lists every shard the layout uses")
        };
        match &version.layout {
            Layout::Hashed {
                virtual_buckets,
                default_buckets,
                tenant_buckets,
                placement,
                ..
            } => {
                let mut by_tenant = BTreeMap::new();
                for entry in tenant_buckets {
                    by_tenant
                        .entry(entry.tenant.clone())
                        .or_insert(entry.buckets);
                }
                let mut placed: Vec<PlacedRange> = placement
                    .iter()
                    .filter(|range| range.start < range.end)
                    .map(|range| PlacedRange {
                        start: range.start,
                        end: range.end,
                        location: location_of(&range.shard),
                    })
                    .collect();
                placed.sort_by_key(|range| range.start);
                LookupIndex::Hashed {
                    virtual_buckets: NonZeroU32::new(*virtual_buckets),
                    default_buckets: *default_buckets,
                    tenant_buckets: by_tenant,
                    placement: placed,
                    locations,
                }
            }
            Layout::Fanout { .. } => LookupIndex::Fanout { locations },
            Layout::TenantTable {
                tenants,
                default_shard,
            } => {
                let mut tenant_shards = BTreeMap::new();
                for row in tenants {
                    tenant_shards
                        .entry(row.tenant.clone())
                        .or_insert_with(|| location_of(&row.shard));
                }
                let default_location = default_shard.as_deref().map(location_of);
                LookupIndex::TenantTable {
                    tenant_shards,
                    default_location,
                    locations,
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::routing::hash;

    fn string(text: &str) -> KeyValue {
        KeyValue::String(text.to_owned())
    }

    fn hashed(virtual_buckets: u32, tenant_buckets: Vec<TenantBuckets>) -> RoutingVersion {
        RoutingVersion::new(
            "orders",
            "customerId",
            Layout::Hashed {
                virtual_buckets,
                default_buckets: 1,
                tenant_buckets,
                placement: vec![
                    PlacementRange {
                        start: 512,
                        end: virtual_buckets,
                        shard: "s2".into(),
                    },
                    PlacementRange {
                        start: 0,
                        end: 512,
                        shard: "s1".into(),
                    },
                ],
                routing_field: Some("bucket".into()),
            },
        )
    }

    #[test]
    fn hashed_locates_by_tenant_hash_with_one_bucket() {
        let version = hashed(1024, vec![]);
        let tenant = string("cust-1");
        let located = version.locate(&tenant, &KeyValue::Int(7)).unwrap();
        let expected_vbucket = (hash(b"cust-1") % 1024) as u32;
        let shard = if expected_vbucket < 512 { "s1" } else { "s2" };
        assert_eq!(
            located,
            Located {
                sub_bucket: 0,
                vbucket: Some(expected_vbucket),
                locations: vec![Location::new(shard, "orders")],
            }
        );
    }

    #[test]
    fn hot_tenant_spreads_over_its_buckets() {
        let hot = string("hot");
        let version = hashed(
            1024,
            vec![TenantBuckets {
                tenant: hot.clone(),
                buckets: 16,
            }],
        );
        assert_eq!(version.buckets_of(&hot), 16);
        assert_eq!(version.buckets_of(&string("cold")), 1);
        let sub_buckets: BTreeSet<u32> = (0..400)
            .map(|id| version.locate(&hot, &KeyValue::Int(id)).unwrap().sub_bucket)
            .collect();
        assert_eq!(sub_buckets, (0..16).collect());
    }

    #[test]
    fn per_shard_collection_names_resolve() {
        let mut collections = BTreeMap::new();
        collections.insert("s2".to_owned(), "orders_v2".to_owned());
        let version = hashed(1024, vec![]).with_collections(collections);
        assert_eq!(version.location_on("s2"), Location::new("s2", "orders_v2"));
        assert_eq!(version.location_on("s1"), Location::new("s1", "orders"));
        assert_eq!(
            version.locations(),
            vec![
                Location::new("s1", "orders"),
                Location::new("s2", "orders_v2")
            ]
        );
        assert_eq!(
            version.location_of_vbucket(600),
            Some(Location::new("s2", "orders_v2"))
        );
        assert_eq!(version.location_on("s2").to_string(), "s2/orders_v2");
    }

    #[test]
    fn fanout_locates_everywhere() {
        let version = RoutingVersion::new(
            "orders",
            "customerId",
            Layout::Fanout {
                shards: vec!["s2".into(), "s1".into()],
            },
        );
        let located = version.locate(&string("a"), &KeyValue::Int(1)).unwrap();
        assert_eq!(
            located.locations,
            vec![Location::new("s1", "orders"), Location::new("s2", "orders")]
        );
        assert_eq!(located.vbucket, None);
        assert_eq!(version.virtual_buckets(), None);
    }

    #[test]
    fn tenant_table_uses_row_then_default_then_fails() {
        let mut version = RoutingVersion::new(
            "orders",
            "customerId",
            Layout::TenantTable {
                tenants: vec![TenantShard {
                    tenant: string("a"),
                    shard: "s1".into(),
                }],
                default_shard: None,
            },
        );
        let id = KeyValue::Int(1);
        assert_eq!(
            version.locate(&string("a"), &id).unwrap().locations,
            vec![Location::new("s1", "orders")]
        );
        assert_eq!(
            version.locate(&string("b"), &id).unwrap_err(),
            RoutingError::TenantNotInTable {
                tenant: string("b")
            }
        );
        if let Layout::TenantTable { default_shard, .. } = version.layout_mut() {
            *default_shard = Some("s3".into());
        }
        assert_eq!(
            version.locate(&string("b"), &id).unwrap().locations,
            vec![Location::new("s3", "orders")]
        );
        assert_eq!(version.shards(), ["s1", "s3"].map(String::from).into());
    }

    #[test]
    fn unvalidated_versions_fail_instead_of_panicking() {
        let gap = RoutingVersion::new(
            "c",
            "t",
            Layout::Hashed {
                virtual_buckets: 8,
                default_buckets: 1,
                tenant_buckets: vec![],
                placement: vec![],
                routing_field: None,
            },
        );
        assert!(matches!(
            gap.locate(&string("a"), &KeyValue::Int(1)),
            Err(RoutingError::VbucketNotPlaced { .. })
        ));
        let zero = hashed(0, vec![]);
        assert_eq!(
            zero.locate(&string("a"), &KeyValue::Int(1)),
            Err(RoutingError::NoVirtualBuckets)
        );
        let no_buckets = hashed(
            1024,
            vec![TenantBuckets {
                tenant: string("a"),
                buckets: 0,
            }],
        );
        assert!(matches!(
            no_buckets.locate(&string("a"), &KeyValue::Int(1)),
            Err(RoutingError::NoBuckets { .. })
        ));
    }

    #[test]
    fn layout_mut_rebuilds_the_index() {
        let mut version = hashed(1024, vec![]);
        let hot = string("hot");
        assert_eq!(version.buckets_of(&hot), 1);
        if let Layout::Hashed { tenant_buckets, .. } = version.layout_mut() {
            tenant_buckets.push(TenantBuckets {
                tenant: hot.clone(),
                buckets: 4,
            });
        }
        assert_eq!(version.buckets_of(&hot), 4);
    }

    #[test]
    fn json_round_trip_is_tagged_by_kind() {
        let version = hashed(1024, vec![]);
        let json = serde_json::to_value(&version).unwrap();
        assert_eq!(json["layout"]["kind"], "hashed");
        assert_eq!(json["id_field"], "_id");
        assert!(json.get("index").is_none());
        let back: RoutingVersion = serde_json::from_value(json).unwrap();
        assert_eq!(back, version);
        let fanout: RoutingVersion = serde_json::from_str(
            r#"{"collection":"c","version":3,"tenant_key":"t",
                "layout":{"kind":"fanout","shards":["s1"]}}"#,
        )
        .unwrap();
        assert_eq!(fanout.id_field, "_id");
        assert_eq!(fanout.layout().kind(), "fanout");
    }
}

//! What a document a worker scanned at a location is to the migration: the one place that
//! classifies a scanned document. The backfill, the cleanup, the revert copier,
//! reconciliation and repair all ask [`of`], and act on the answer through the protocol's
//! worker decisions ([`crate::protocol::backfill_action`], [`crate::protocol::cleanup_action`],
//! [`crate::protocol::revert_action`]). `docs/decisions/0012-one-disposition-one-decision-per-writer.md` has the table of
//! what each writer does with each case. Pure.

use mongodb::bson::{Bson, Document};

use crate::envelope;
use crate::phase::Side;
use crate::routing::{Location, RoutingVersion};

/// What a scanned document is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Disposition {
    /// Scanning the source: a source document the target version places elsewhere. It moves
    /// to `target`, at `sub_bucket`.
    Moves { target: Location, sub_bucket: u32 },
    /// Scanning the source: a source document the target version places where it already is
    /// (the collection belongs to both layouts). It stays; `stamp` is the routing field and
    /// value it must be given, when it does not carry them yet.
    Stays { stamp: Option<(String, i32)> },
    /// Scanning the target: a document the target version places here, written by reshard.
    /// `source` is where the source version places it; `pristine` whether it is a copy no one
    /// wrote since.
    Placed {
        source: Location,
        sub_bucket: u32,
        pristine: bool,
    },
    /// reshard's tombstone of a deleted id. Scanning the target: a tombstone the target places
    /// here (the source's `source` location, to carry a delete back). Scanning the source:
    /// `source` is `None`; it is not a source document.
    Tombstone { source: Option<(Location, u32)> },
    /// Not a document of the scanned side here: in a collection both layouts share, a document
    /// of the other layout; or one its side's version does not place at this location.
    Foreign,
    /// Its tenant key or id cannot be routed (missing, or of a type reshard does not route).
    Unroutable { reason: String },
}

/// Classifies `doc`, read at `location` while scanning `side`, under versions `from`
/// (source) and `to` (target).
pub fn of(
    side: Side,
    from: &RoutingVersion,
    to: &RoutingVersion,
    location: &Location,
    doc: &Document,
) -> Disposition {
    let (scanned, other) = match side {
        Side::Source => (from, to),
        Side::Target => (to, from),
    };
    let (tenant, id) = match scanned.document_keys(doc) {
        Ok(keys) => keys,
        Err(reason) => return Disposition::Unroutable { reason },
    };
    let (here, there) = match (scanned.locate(&tenant, &id), other.locate(&tenant, &id)) {
        (Ok(here), Ok(there)) => (here, there),
        (Err(e), _) | (_, Err(e)) => {
            return Disposition::Unroutable {
                reason: e.to_string(),
            }
        }
    };
    if !here.locations.contains(location) {
        return if envelope::is_tombstone(doc) && side == Side::Source {
            Disposition::Tombstone { source: None }
        } else {
            Disposition::Foreign
        };
    }
    let Some(there_first) = there.locations.first().cloned() else {
        return Disposition::Unroutable {
            reason: "the other version names no location".to_owned(),
        };
    };
    // Scanning the target: where the source version places the id, here when it places it
    // here among others (a fanout source listing this collection): then this document is the
    // source's too, and nothing is to be carried back (`protocol::mirror_writes`).
    let source_of = || {
        if there.locations.contains(location) {
            location.clone()
        } else {
            there_first.clone()
        }
    };
    match side {
        Side::Source if envelope::is_tombstone(doc) => Disposition::Tombstone { source: None },
        Side::Source if &there_first == location => Disposition::Stays {
            stamp: to.routing_field().and_then(|field| {
                let value = there.sub_bucket as i32;
                (doc.get(field) != Some(&Bson::Int32(value))).then(|| (field.to_owned(), value))
            }),
        },
        Side::Source => Disposition::Moves {
            target: there_first,
            sub_bucket: there.sub_bucket,
        },
        Side::Target if envelope::is_tombstone(doc) => Disposition::Tombstone {
            source: Some((source_of(), there.sub_bucket)),
        },
        // A document the application wrote before the switch in a shared collection carries
        // no envelope of the target's: only what reshard wrote here is the target's.
        Side::Target if envelope::writer(doc).is_none() => Disposition::Foreign,
        Side::Target => Disposition::Placed {
            source: source_of(),
            sub_bucket: there.sub_bucket,
            pristine: envelope::is_pristine_copy(doc),
        },
    }
}

impl Disposition {
    /// Whether the document counts in a source partition's ledger (`scanned`): source
    /// documents do, tombstones and the other layout's documents do not.
    pub fn is_source_document(&self) -> bool {
        matches!(
            self,
            Disposition::Moves { .. } | Disposition::Stays { .. } | Disposition::Unroutable { .. }
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::routing::{KeyValue, Layout, PlacementRange, TenantBuckets};
    use mongodb::bson::doc;

    /// Two shards; the hot tenant has `hot` buckets; `field` is the routing field.
    fn version(hot: u32, field: Option<&str>) -> RoutingVersion {
        RoutingVersion::new(
            "orders",
            "customerId",
            Layout::Hashed {
                virtual_buckets: 1024,
                default_buckets: 1,
                tenant_buckets: vec![TenantBuckets {
                    tenant: KeyValue::String("hot".into()),
                    buckets: hot,
                }],
                placement: vec![
                    PlacementRange {
                        start: 0,
                        end: 512,
                        shard: "s1".into(),
                    },
                    PlacementRange {
                        start: 512,
                        end: 1024,
                        shard: "s2".into(),
                    },
                ],
                routing_field: field.map(String::from),
            },
        )
    }

    fn versions() -> (RoutingVersion, RoutingVersion) {
        (version(1, None), version(16, Some("bucket")))
    }

    /// An id of the hot tenant that moves (or stays), and where it is and goes.
    fn hot_id(moves: bool) -> (String, Location, Location, u32) {
        let (from, to) = versions();
        (0..)
            .map(|i| format!("o-{i}"))
            .find_map(|id| {
                let (t, k) = (KeyValue::String("hot".into()), KeyValue::String(id.clone()));
                let a = from.locate(&t, &k).unwrap();
                let b = to.locate(&t, &k).unwrap();
                ((a.locations != b.locations) == moves).then(|| {
                    (
                        id,
                        a.locations[0].clone(),
                        b.locations[0].clone(),
                        b.sub_bucket,
                    )
                })
            })
            .unwrap()
    }

    #[test]
    fn a_source_document_placed_elsewhere_moves() {
        let (from, to) = versions();
        let (id, here, there, sub) = hot_id(true);
        let d = doc! { "_id": id, "customerId": "hot" };
        assert_eq!(
            of(Side::Source, &from, &to, &here, &d),
            Disposition::Moves {
                target: there,
                sub_bucket: sub
            }
        );
    }

    #[test]
    fn a_source_document_placed_here_stays_and_is_stamped_only_when_it_lacks_the_field() {
        let (from, to) = versions();
        let (id, here, _, sub) = hot_id(false);
        let mut d = doc! { "_id": id, "customerId": "hot" };
        assert_eq!(
            of(Side::Source, &from, &to, &here, &d),
            Disposition::Stays {
                stamp: Some(("bucket".into(), sub as i32))
            }
        );
        d.insert("bucket", sub as i32);
        assert_eq!(
            of(Side::Source, &from, &to, &here, &d),
            Disposition::Stays { stamp: None }
        );
    }

    #[test]
    fn tombstones_and_the_other_layouts_documents_are_not_source_documents() {
        let (from, to) = versions();
        let (id, here, there, _) = hot_id(true);
        let tomb = doc! { "_id": &id, "customerId": "hot", "_reshard": { "deleted": true } };
        let d = of(Side::Source, &from, &to, &here, &tomb);
        assert_eq!(d, Disposition::Tombstone { source: None });
        assert!(!d.is_source_document());
        // Read at the target location while scanning the source: not placed there by `from`.
        let copy = doc! { "_id": &id, "customerId": "hot", "_reshard": { "src": "copy" } };
        assert_eq!(
            of(Side::Source, &from, &to, &there, &copy),
            Disposition::Foreign
        );
    }

    #[test]
    fn a_document_that_cannot_be_routed_says_why() {
        let (from, to) = versions();
        let here = from.location_on("s1");
        for d in [
            doc! { "_id": 1, "total": 5 },
            doc! { "_id": 1.5, "customerId": "c" },
        ] {
            match of(Side::Source, &from, &to, &here, &d) {
                Disposition::Unroutable { reason } => assert!(!reason.is_empty()),
                other => panic!("{other:?}"),
            }
        }
    }

    #[test]
    fn scanning_the_target_finds_what_reshard_wrote_there() {
        let (from, to) = versions();
        let (id, here, there, _) = hot_id(true);
        let copy = doc! { "_id": &id, "customerId": "hot", "_reshard": { "src": "copy" } };
        let app = doc! { "_id": &id, "customerId": "hot", "_reshard": { "src": "app", "rev": 2 } };
        let tomb = doc! { "_id": &id, "customerId": "hot", "_reshard": { "deleted": true } };
        let source_sub = from
            .locate(
                &KeyValue::String("hot".into()),
                &KeyValue::String(id.clone()),
            )
            .unwrap()
            .sub_bucket;
        assert_eq!(
            of(Side::Target, &from, &to, &there, &copy),
            Disposition::Placed {
                source: here.clone(),
                sub_bucket: source_sub,
                pristine: true
            }
        );
        assert_eq!(
            of(Side::Target, &from, &to, &there, &app),
            Disposition::Placed {
                source: here.clone(),
                sub_bucket: source_sub,
                pristine: false
            }
        );
        assert_eq!(
            of(Side::Target, &from, &to, &there, &tomb),
            Disposition::Tombstone {
                source: Some((here.clone(), source_sub))
            }
        );
        // The source's own document, in a location the target does not place it at.
        assert_eq!(
            of(Side::Target, &from, &to, &here, &copy),
            Disposition::Foreign
        );
    }

    #[test]
    fn a_target_document_a_fanout_source_also_places_here_names_this_location_as_its_source() {
        let to = version(16, Some("bucket"));
        let (id, _, there, _) = hot_id(true);
        let other = if there.shard == "s1" { "s2" } else { "s1" };
        let from = RoutingVersion::new(
            "orders",
            "customerId",
            Layout::Fanout {
                shards: vec![other.into(), there.shard.clone()],
            },
        );
        let app = doc! { "_id": &id, "customerId": "hot", "_reshard": { "src": "app", "rev": 2 } };
        // The fanout source lists the target's shard, though not first: one document for
        // both sides, nothing to carry back to another of its shards.
        let Disposition::Placed { source, .. } = of(Side::Target, &from, &to, &there, &app) else {
            panic!("not placed");
        };
        // The revert copier then finds its source where it scanned it: in place
        // (`protocol::revert_action`).
        assert_eq!(source, there);
    }
}

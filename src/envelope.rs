//! reshard's envelope: the `_reshard` metadata every document written through reshard carries,
//! and how each kind of write builds it. Pure; every reader and writer goes through here.
//!
//! - `src`: who wrote the document: `"app"` (the application, through a router) or `"copy"` (a
//!   pristine copy of a source document, by the backfill or a copy-on-write);
//! - `epoch`: the migration epoch the write was made in;
//! - `rev`: the document's revision in the target: an application write or a tombstone takes the
//!   previous revision + 1, a copy keeps its source's (0 when it has none);
//! - `deleted: true` and `at` on a tombstone, the marker that an id was deleted while the
//!   source may still hold a copy of it;
//! - `mig`: set by a rollback's mirror on the source document it wrote: mirrors compare
//!   revisions only among the documents this migration mirrored.

use mongodb::bson::{doc, rawdoc, Bson, DateTime, Document, RawDocument, RawDocumentBuf};

use crate::routing::RoutingVersion;

/// The field every document written through reshard carries.
pub const META: &str = "_reshard";

/// Who wrote a document.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Writer {
    /// The application, through a router.
    App,
    /// A pristine copy of a source document.
    Copy,
}

/// A document's revision: `_reshard.rev`; 0 for pristine copies of documents never written
/// through reshard.
pub fn revision(doc: &Document) -> i64 {
    doc.get_document(META)
        .ok()
        .and_then(|m| match m.get("rev") {
            Some(Bson::Int32(r)) => Some(i64::from(*r)),
            Some(Bson::Int64(r)) => Some(*r),
            _ => None,
        })
        .unwrap_or(0)
}

/// Whether the document is a tombstone.
pub fn is_tombstone(doc: &Document) -> bool {
    doc.get_document(META)
        .ok()
        .and_then(|m| m.get_bool("deleted").ok())
        .unwrap_or(false)
}

/// Who wrote the document, when reshard did.
pub fn writer(doc: &Document) -> Option<Writer> {
    match doc.get_document(META).ok()?.get_str("src").ok()? {
        "app" => Some(Writer::App),
        "copy" => Some(Writer::Copy),
        _ => None,
    }
}

/// A live pristine copy: written by a copier and by no one since.
pub fn is_pristine_copy(doc: &Document) -> bool {
    writer(doc) == Some(Writer::Copy) && !is_tombstone(doc)
}

/// `{_id: id}` restricted to a live document (not a tombstone).
pub fn live(id: &Bson) -> Document {
    doc! { "_id": id.clone(), format!("{META}.deleted"): { "$ne": true } }
}

/// Every live document (no tombstone).
pub fn live_documents() -> Document {
    doc! { format!("{META}.deleted"): { "$ne": true } }
}

/// `{_id: id}` restricted to a tombstone.
pub fn tombstone_of(id: &Bson) -> Document {
    doc! { "_id": id.clone(), format!("{META}.deleted"): true }
}

/// Every tombstone.
pub fn tombstones() -> Document {
    doc! { format!("{META}.deleted"): true }
}

/// `{_id: id}` restricted to a document without the envelope: one no router, copier or
/// mirror wrote.
pub fn unmarked_of(id: &Bson) -> Document {
    doc! { "_id": id.clone(), META: { "$exists": false } }
}

/// Every document reshard wrote (it carries the envelope).
pub fn written_by_reshard() -> Document {
    doc! { META: { "$exists": true } }
}

/// `{_id: id}` restricted to a pristine copy.
pub fn pristine_copy_of(id: &Bson) -> Document {
    doc! {
        "_id": id.clone(),
        format!("{META}.src"): "copy",
        format!("{META}.deleted"): { "$ne": true },
    }
}

/// The document as the application sees it: without reshard's bookkeeping.
pub fn strip(mut doc: Document) -> Document {
    doc.remove(META);
    doc
}

/// The copy of a source document that the backfill, a copy-on-write or a repair puts in the
/// target: the source document with the target's routing field and `_reshard: {src: "copy",
/// epoch, rev}`, `rev` being the source document's revision (0 when it has none), so that
/// revisions only grow across the two sides. Inserted only if absent (or replacing only a
/// pristine copy), so it never overwrites what the application wrote.
pub fn copy(mut doc: Document, version: &RoutingVersion, sub_bucket: u32, epoch: i64) -> Document {
    if let Some(field) = version.routing_field() {
        doc.insert(field, sub_bucket as i32);
    }
    let rev = revision(&doc);
    doc.insert(META, doc! { "src": "copy", "epoch": epoch, "rev": rev });
    doc
}

/// [`copy`] of a document as read, in its raw bytes: the same fields in the same order (the
/// routing field and `_reshard` replaced where they stand, else appended, as [`copy`] does),
/// the rest carried over without being parsed. The backfill's copies take this path
/// ([`crate::copy::steps::Scanned`]): parsing every document into a [`Document`] and encoding
/// it again was most of the copier's own CPU. `Err`: the bytes are not a valid document.
pub fn copy_raw(
    doc: &RawDocument,
    version: &RoutingVersion,
    sub_bucket: u32,
    epoch: i64,
) -> Result<RawDocumentBuf, mongodb::bson::raw::Error> {
    let field = version.routing_field();
    let rev = match doc.get(META)? {
        Some(mongodb::bson::RawBsonRef::Document(m)) => match m.get("rev")? {
            Some(mongodb::bson::RawBsonRef::Int32(r)) => i64::from(r),
            Some(mongodb::bson::RawBsonRef::Int64(r)) => r,
            _ => 0,
        },
        _ => 0,
    };
    let meta = rawdoc! { "src": "copy", "epoch": epoch, "rev": rev };
    let mut out = RawDocumentBuf::new();
    let (mut field_set, mut meta_set) = (false, false);
    for element in doc {
        let (key, value) = element?;
        if Some(key) == field {
            if !field_set {
                out.append(key, sub_bucket as i32);
                field_set = true;
            }
        } else if key == META {
            if !meta_set {
                out.append(key, meta.clone());
                meta_set = true;
            }
        } else {
            out.append_ref(key, value);
        }
    }
    if let Some(field) = field.filter(|_| !field_set) {
        out.append(field, sub_bucket as i32);
    }
    if !meta_set {
        out.append(META, meta);
    }
    Ok(out)
}

/// The fields named in `fields` of a document as read, parsed (the rest is not): what routing
/// and the disposition of a scanned document read ([`crate::copy::steps::Scanned`]).
pub fn head(doc: &RawDocument, fields: &[&str]) -> Result<Document, mongodb::bson::raw::Error> {
    let mut head = Document::new();
    for element in doc {
        let (key, value) = element?;
        if fields.contains(&key) && !head.contains_key(key) {
            let value = Bson::try_from(value.to_raw_bson())?;
            head.insert(key, value);
        }
    }
    Ok(head)
}

/// What the application wrote, as stored: its document with the version's routing field and
/// `_reshard: {src: "app", epoch, rev}`.
pub fn app_write(
    mut doc: Document,
    version: &RoutingVersion,
    sub_bucket: u32,
    epoch: i64,
    rev: i64,
) -> Document {
    if let Some(field) = version.routing_field() {
        doc.insert(field, sub_bucket as i32);
    }
    doc.insert(META, doc! { "src": "app", "epoch": epoch, "rev": rev });
    doc
}

/// The marker that an id was deleted: `_id`, the tenant key, the routing field, and
/// `_reshard: {deleted: true, at, epoch, rev}`.
pub fn tombstone(
    id: &Bson,
    tenant: &Bson,
    version: &RoutingVersion,
    sub_bucket: u32,
    epoch: i64,
    rev: i64,
) -> Document {
    let mut doc = doc! { "_id": id.clone() };
    doc.insert(version.tenant_key.clone(), tenant.clone());
    if let Some(field) = version.routing_field() {
        doc.insert(field, sub_bucket as i32);
    }
    doc.insert(
        META,
        doc! { "deleted": true, "at": DateTime::now(), "epoch": epoch, "rev": rev },
    );
    doc
}

/// An application's partial update, stamped: `_reshard.src = "app"`, the epoch, the routing
/// field, and the revision bumped by the update itself (`$inc`).
pub fn app_update(
    mut update: Document,
    version: &RoutingVersion,
    sub_bucket: u32,
    epoch: i64,
) -> Document {
    let mut set = update.get_document("$set").cloned().unwrap_or_default();
    set.insert(format!("{META}.src"), "app");
    set.insert(format!("{META}.epoch"), epoch);
    let mut inc = update.get_document("$inc").cloned().unwrap_or_default();
    inc.insert(format!("{META}.rev"), 1_i64);
    update.insert("$inc", inc);
    if let Some(field) = version.routing_field() {
        set.insert(field, sub_bucket as i32);
    }
    update.insert("$set", set);
    update
}

/// The stamp of a document that stays where it is: its routing field under the target
/// version.
pub fn stamp(field: &str, sub_bucket: i32) -> Document {
    doc! { "$set": { field: sub_bucket } }
}

/// What a mirror writes to the source for a target `image` of migration `migration`: the
/// filter of a conditional replace (upsert) and the replacement.
///
/// Revisions are counted by the target, so they are compared only between documents this
/// migration mirrored (`_reshard.mig`): the newer one wins. A source document this migration
/// never mirrored was last written before its write switch, so any target version is newer.
/// (Comparing raw revisions would let a source document's own revision, counted on the
/// source before the switch, hide a newer target write that started its count afresh.)
pub fn mirror(
    mut image: Document,
    migration: i64,
    source: &RoutingVersion,
    target: &RoutingVersion,
    source_sub_bucket: u32,
) -> (Document, Document) {
    let rev = revision(&image);
    let id = image.get("_id").cloned().unwrap_or(Bson::Null);
    // The image takes the source layout's routing field, not the target's.
    if let Some(field) = target.routing_field() {
        image.remove(field);
    }
    if let Some(field) = source.routing_field() {
        image.insert(field, source_sub_bucket as i32);
    }
    let mut meta = image.get_document(META).cloned().unwrap_or_default();
    meta.insert("mig", migration);
    image.insert(META, meta);
    let filter = doc! {
        "_id": id,
        "$or": [
            { format!("{META}.mig"): { "$ne": migration } },
            { format!("{META}.rev"): { "$lt": rev } },
        ],
    };
    (filter, image)
}

/// The fields that are reshard's, not the application's: the envelope and both versions'
/// routing fields.
pub fn bookkeeping<'a>(
    from: &'a RoutingVersion,
    to: &'a RoutingVersion,
) -> impl Iterator<Item = &'a str> {
    [Some(META), from.routing_field(), to.routing_field()]
        .into_iter()
        .flatten()
}

/// The top-level fields in which two images of one document differ, apart from `_reshard` and
/// the routing fields of both versions (a copy carries the target's, its source the source's):
/// empty when a pristine copy equals its source. Reconciliation's content check and shadow
/// reads ([`crate::shadow::compare`]) both decide by it.
pub fn content_differences(
    source: &Document,
    target: &Document,
    from: &RoutingVersion,
    to: &RoutingVersion,
) -> Vec<String> {
    // Runs once per document of a full reconciliation: nothing is allocated unless the two
    // differ. The source's fields and the target's own are disjoint: no name twice.
    let ignored = |k: &str| bookkeeping(from, to).any(|b| b == k);
    let mut differing: Vec<String> = source
        .iter()
        .filter(|(k, v)| !ignored(k) && target.get(k.as_str()) != Some(*v))
        .chain(
            target
                .iter()
                .filter(|(k, _)| !ignored(k) && !source.contains_key(k.as_str())),
        )
        .map(|(k, _)| k.clone())
        .collect();
    differing.sort_unstable();
    differing
}

/// [`content_differences`] of two documents as read, in their raw bytes. A pristine copy
/// keeps its source's fields in their order ([`copy_raw`]), so the top-level fields apart from
/// the bookkeeping are first compared in step, as they were read (a nested document or array
/// by its bytes): when every one matches the copy equals its source and nothing is parsed. Only when that finds a difference are both
/// documents parsed and compared as values ([`content_differences`]): a nested document
/// whose fields came back in another order is the same value, and the fields named are the
/// ones that differ as values. One difference from the parsed comparison: a field holding the
/// same NaN in both is equal here (the same bytes) where parsed values never are.
/// `Err`: the bytes are not a valid document.
pub fn content_differences_raw(
    source: &RawDocument,
    target: &RawDocument,
    from: &RoutingVersion,
    to: &RoutingVersion,
) -> Result<Vec<String>, mongodb::bson::raw::Error> {
    if same_content_bytes(source, target, from, to)? {
        return Ok(Vec::new());
    }
    let (source, target) = (Document::try_from(source)?, Document::try_from(target)?);
    Ok(content_differences(&source, &target, from, to))
}

/// Whether the two documents hold the same fields apart from the bookkeeping, in the same
/// order, each with the same value as read.
fn same_content_bytes(
    source: &RawDocument,
    target: &RawDocument,
    from: &RoutingVersion,
    to: &RoutingVersion,
) -> Result<bool, mongodb::bson::raw::Error> {
    let ignored = |key: &str| bookkeeping(from, to).any(|b| b == key);
    let mut s = source
        .iter()
        .filter(|e| !matches!(e, Ok((k, _)) if ignored(k)));
    let mut t = target
        .iter()
        .filter(|e| !matches!(e, Ok((k, _)) if ignored(k)));
    loop {
        match (s.next().transpose()?, t.next().transpose()?) {
            (None, None) => return Ok(true),
            (Some(a), Some(b)) if a == b => {}
            _ => return Ok(false),
        }
    }
}

/// Whether `path` (a field or a dotted path) is one no application write may set: the id, the
/// tenant key, either version's routing field, or the envelope.
pub fn immutable(path: &str, tenant_key: &str, routing_fields: &[&str]) -> bool {
    ["_id", META, tenant_key]
        .iter()
        .chain(routing_fields.iter())
        .any(|f| path == *f || path.starts_with(&format!("{f}.")))
}

#[cfg(test)]
mod tests {
    use super::*;

    mod raw {
        use super::*;
        use proptest::prelude::*;

        /// A field value of a few kinds, nested once.
        fn value() -> impl Strategy<Value = Bson> {
            let leaf = prop_oneof![
                any::<i32>().prop_map(Bson::Int32),
                any::<i64>().prop_map(Bson::Int64),
                "[a-z]{0,6}".prop_map(Bson::String),
                any::<bool>().prop_map(Bson::Boolean),
                Just(Bson::Null),
            ];
            leaf.prop_recursive(2, 8, 4, |inner| {
                prop_oneof![
                    prop::collection::vec(inner.clone(), 0..4).prop_map(Bson::Array),
                    prop::collection::vec(("[a-c]", inner), 0..4)
                        .prop_map(|kv| Bson::Document(kv.into_iter().collect())),
                ]
            })
        }

        /// Documents whose fields may include the routing field and `_reshard` (with or
        /// without a revision, of either integer type), anywhere.
        fn document() -> impl Strategy<Value = Document> {
            let key = prop_oneof![
                Just("bucket".to_owned()),
                Just(META.to_owned()),
                "[a-e]{1,2}",
            ];
            let meta = prop_oneof![
                Just(Bson::Document(doc! { "src": "app", "rev": 3 })),
                Just(Bson::Document(
                    doc! { "src": "app", "rev": 4_i64, "epoch": 2_i64 }
                )),
                Just(Bson::Document(doc! { "deleted": true })),
                Just(Bson::Int32(1)),
            ];
            (
                prop::collection::vec((key, value()), 0..8),
                meta,
                any::<bool>(),
            )
                .prop_map(|(fields, meta, id_first)| {
                    let mut d = Document::new();
                    if id_first {
                        d.insert("_id", 1);
                    }
                    for (k, v) in fields {
                        let v = if k == META { meta.clone() } else { v };
                        d.insert(k, v);
                    }
                    d.insert("_id", 1);
                    d
                })
        }

        /// The document with the fields of every level in reverse order.
        fn reversed(d: &Document) -> Document {
            let flip = |v: &Bson| match v {
                Bson::Document(d) => Bson::Document(reversed(d)),
                other => other.clone(),
            };
            let mut fields: Vec<(String, Bson)> =
                d.iter().map(|(k, v)| (k.clone(), flip(v))).collect();
            fields.reverse();
            fields.into_iter().collect()
        }

        proptest! {
            #[test]
            fn a_raw_copy_is_the_parsed_copy_encoded(d in document(), epoch in 0_i64..100, sub in 0_u32..64) {
                for field in [None, Some("bucket")] {
                    let version = crate::routing::one_shard_version(field);
                    let want = RawDocumentBuf::from_document(&copy(d.clone(), &version, sub, epoch)).unwrap();
                    let raw = RawDocumentBuf::from_document(&d).unwrap();
                    let got = copy_raw(&raw, &version, sub, epoch).unwrap();
                    prop_assert_eq!(got.as_bytes(), want.as_bytes(), "{:?}", d);
                    let head = head(&raw, &["_id", META, "bucket"]).unwrap();
                    prop_assert_eq!(head.get("_id"), d.get("_id"));
                    prop_assert_eq!(head.get(META), d.get(META));
                    prop_assert_eq!(head.get("bucket"), d.get("bucket"));
                    prop_assert!(head.len() <= 3);
                }
            }

            #[test]
            fn a_raw_comparison_names_what_a_parsed_one_names(
                a in document(),
                other in document(),
                how in 0_u8..4,
                sub in 0_u32..64,
            ) {
                let (from, to) = (
                    crate::routing::one_shard_version(Some("slot")),
                    crate::routing::one_shard_version(Some("bucket")),
                );
                // The copy itself, the copy with every level's fields in reverse order (a
                // server may return them so), a copy with one field changed, another document.
                let b = match how {
                    0 => copy(a.clone(), &to, sub, 1),
                    1 => reversed(&copy(a.clone(), &to, sub, 1)),
                    2 => {
                        let mut b = copy(a.clone(), &to, sub, 1);
                        b.insert("b", "changed");
                        b
                    }
                    _ => other,
                };
                let raw = |d: &Document| RawDocumentBuf::from_document(d).unwrap();
                let got = content_differences_raw(&raw(&a), &raw(&b), &from, &to).unwrap();
                prop_assert_eq!(&got, &content_differences(&a, &b, &from, &to), "{:?} {:?}", a, b);
                if how < 2 {
                    prop_assert!(got.is_empty());
                }
            }
        }
    }

    fn version(field: Option<&str>) -> RoutingVersion {
        crate::routing::one_shard_version(field)
    }

    #[test]
    fn a_copy_keeps_the_source_revision_and_takes_the_routing_field() {
        let source = doc! { "_id": 1, "customerId": "c", "_reshard": { "src": "app", "rev": 4 } };
        let c = copy(source, &version(Some("bucket")), 3, 9);
        assert_eq!(c.get_i32("bucket").unwrap(), 3);
        assert_eq!(
            c.get_document(META).unwrap(),
            &doc! { "src": "copy", "epoch": 9_i64, "rev": 4_i64 }
        );
        assert!(is_pristine_copy(&c));
        assert_eq!(writer(&c), Some(Writer::Copy));
    }

    #[test]
    fn tombstones_are_recognised_and_never_pristine() {
        let t = tombstone(
            &Bson::Int32(1),
            &Bson::String("c".into()),
            &version(None),
            3,
            2,
            5,
        );
        assert!(is_tombstone(&t));
        assert!(!is_pristine_copy(&t));
        assert_eq!(revision(&t), 5);
        assert_eq!(t.get_str("customerId").unwrap(), "c");
        assert!(!is_tombstone(&doc! { "_id": 1 }));
        assert_eq!(revision(&doc! { "_id": 1 }), 0);
    }

    #[test]
    fn a_mirror_swaps_routing_fields_and_compares_only_its_own_revisions() {
        let image = doc! { "_id": 7, "bucket": 3, "_reshard": { "src": "app", "rev": 2 } };
        let (filter, written) = mirror(
            image,
            11,
            &version(Some("slot")),
            &version(Some("bucket")),
            0,
        );
        assert_eq!(written.get("bucket"), None);
        assert_eq!(written.get_i32("slot").unwrap(), 0);
        assert_eq!(
            written.get_document(META).unwrap().get_i64("mig").unwrap(),
            11
        );
        assert_eq!(
            filter,
            doc! { "_id": 7, "$or": [
                { "_reshard.mig": { "$ne": 11_i64 } },
                { "_reshard.rev": { "$lt": 2_i64 } },
            ] }
        );
    }

    #[test]
    fn the_ids_keys_routing_fields_and_envelope_are_immutable() {
        let fields = ["bucket"];
        for path in ["_id", "customerId", "bucket", "bucket.x", "_reshard.rev"] {
            assert!(immutable(path, "customerId", &fields), "{path}");
        }
        for path in ["total", "customerIdx", "buckets"] {
            assert!(!immutable(path, "customerId", &fields), "{path}");
        }
    }

    #[test]
    fn an_update_bumps_the_revision_and_stamps_the_writer() {
        let u = app_update(
            doc! { "$inc": { "total": 1 } },
            &version(Some("bucket")),
            3,
            4,
        );
        assert_eq!(
            u,
            doc! {
                "$inc": { "total": 1, "_reshard.rev": 1_i64 },
                "$set": { "_reshard.src": "app", "_reshard.epoch": 4_i64, "bucket": 3 },
            }
        );
    }
}

//! What a batch does, decided without I/O but for the mirrors' reads: the backfill's copies
//! and stamps ([`prepare_batch`]), the copy back's mirrors ([`prepare_revert`],
//! [`place_mirrors`], [`skip_mirrored`]) and cleanup's candidates ([`cleanup_candidates`]),
//! each through disposition and protocol.

use std::collections::{BTreeMap, HashMap};

use mongodb::bson::{doc, Bson, Document};

use crate::copy::steps;
use crate::disposition::{self, Disposition};
use crate::envelope;
use crate::ids;
use crate::protocol::{self, BackfillAction, CleanupAction, RevertAction, Side, Step};
use crate::routing::{Location, RoutingVersion};
use crate::shards::Statement;
use crate::store::dead_letters::NewDeadLetter;
use crate::store::partitions::Checkpoint;

/// What a statement of a batch does, for the ledger.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// Insert a copy into the target (inserted / already present).
    Copy,
    /// Stamp the routing field on a document that stays (stamped).
    Stamp,
    /// Delete a moved document from the source (cleanup: deleted).
    Delete,
    /// Carry a target document back to the source by revision (revert: inserted / already
    /// present when the source is as new).
    Mirror,
}

/// A batch ready to write: the statements, the id and target of each, and what was settled
/// without writing (documents that stay without stamping, foreign documents, documents that
/// cannot be routed).
#[derive(Debug, Default)]
pub struct PreparedBatch {
    pub statements: Vec<Statement>,
    /// What each statement is, for the ledger.
    pub kinds: Vec<Kind>,
    pub ids: Vec<Bson>,
    pub targets: Vec<Location>,
    pub checkpoint: Checkpoint,
    /// Mirrors whose source version lists several locations for their id (a `fanout`
    /// source): statement index and the listed locations. Each goes where the id's source
    /// document is, looked up before the batch is written ([`place_mirrors`]).
    pub lookups: Vec<(usize, Vec<Location>)>,
    /// The revert copier's mirrors: statement index and the revision of the target image it
    /// carries. Those a router already mirrored are left out before the batch is written
    /// ([`skip_mirrored`]).
    pub mirrors: Vec<(usize, i64)>,
}

impl PreparedBatch {
    /// Adds the statement of a protocol step. A step that does not fit its document is a bug
    /// in the decisions: it becomes a dead letter naming it, so nothing is written blindly
    /// and the ledger still balances.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn push<D: steps::Scanned>(
        &mut self,
        step: Step<D, Document>,
        kind: Kind,
        id: &Bson,
        scanned: &Location,
        d: &Disposition,
        image: Option<&Document>,
        context: &steps::Context<'_>,
    ) {
        match steps::statement(step, id, scanned, d, image, context) {
            Ok(statement) => {
                self.targets.push(statement.location.clone());
                self.statements.push(statement);
                self.kinds.push(kind);
                self.ids.push(id.clone());
            }
            Err(e) => {
                self.checkpoint.dead_lettered += 1;
                self.checkpoint.dead_letters.push(NewDeadLetter {
                    doc_id: ids::encode(id),
                    doc_id_text: ids::text(id),
                    target: None,
                    code: None,
                    code_name: None,
                    message: e.to_string(),
                    attempts: 1,
                });
            }
        }
    }
}

/// The backfill's batch: for each document read at `location`, its disposition
/// ([`disposition::of`]) and the protocol's decision ([`protocol::backfill_action`]), the
/// step it asks for turned into a statement ([`crate::copy::steps::statement`]). Pure.
///
/// - a document that moves: the insert-if-absent of its pristine copy at its target;
/// - a document that stays: its routing field stamped when missing or different, else
///   nothing to do (`already_present`);
/// - a tombstone, or a document of the other layout in a collection both share: not a source
///   document, outside the ledger (`skipped_foreign`);
/// - a document that cannot be routed: a dead letter.
pub fn prepare_batch<D: steps::Scanned>(
    from: &RoutingVersion,
    to: &RoutingVersion,
    location: &Location,
    epoch: i64,
    docs: Vec<D>,
) -> PreparedBatch {
    let context = steps::Context {
        from,
        to,
        migration: 0,
        epoch,
    };
    let mut batch = PreparedBatch::default();
    for doc in docs {
        // What routing reads, parsed (a raw document's other fields are copied unparsed).
        let (id, d) = match doc.head(from, to) {
            Ok(head) => (
                head.get("_id").cloned().unwrap_or(Bson::Null),
                disposition::of(Side::Source, from, to, location, &head),
            ),
            Err(reason) => (Bson::Null, Disposition::Unroutable { reason }),
        };
        if d.is_source_document() {
            batch.checkpoint.scanned += 1;
        }
        match protocol::backfill_action(&d, doc, envelope::stamp) {
            BackfillAction::Write(step) => {
                let kind = match step {
                    Step::UpdateLive(..) => Kind::Stamp,
                    _ => Kind::Copy,
                };
                batch.push(step, kind, &id, location, &d, None, &context);
            }
            BackfillAction::InPlace => batch.checkpoint.already_present += 1,
            BackfillAction::Skip => batch.checkpoint.skipped_foreign += 1,
            BackfillAction::DeadLetter(message) => {
                batch.checkpoint.dead_lettered += 1;
                batch.checkpoint.dead_letters.push(NewDeadLetter {
                    doc_id: ids::encode(&id),
                    doc_id_text: ids::text(&id),
                    target: None,
                    code: None,
                    code_name: None,
                    message,
                    attempts: 1,
                });
            }
        }
    }
    batch
}

/// The revert copier's batch: what reshard wrote at target location `location` goes back to
/// the source ([`protocol::revert_action`]): a pristine copy needs nothing (the source holds
/// the original); a document the application wrote, or a tombstone, replaces the source
/// document when it is newer by revision (a router mirroring the same write may have been
/// first). Pure.
pub fn prepare_revert(
    from: &RoutingVersion,
    to: &RoutingVersion,
    migration: i64,
    location: &Location,
    docs: Vec<Document>,
) -> PreparedBatch {
    let context = steps::Context {
        from,
        to,
        migration,
        epoch: 0,
    };
    let mut batch = PreparedBatch::default();
    for doc in docs {
        let id = doc.get("_id").cloned().unwrap_or(Bson::Null);
        let d = disposition::of(Side::Target, from, to, location, &doc);
        match protocol::revert_action::<Document, Document>(&d, location) {
            RevertAction::Write(step) => {
                batch.checkpoint.scanned += 1;
                let at = batch.statements.len();
                batch.push(step, Kind::Mirror, &id, location, &d, Some(&doc), &context);
                if batch.statements.len() > at {
                    batch.mirrors.push((at, envelope::revision(&doc)));
                }
                let listed = from
                    .document_keys(&doc)
                    .ok()
                    .and_then(|(t, i)| from.locate(&t, &i).ok())
                    .map(|l| l.locations)
                    .unwrap_or_default();
                if batch.statements.len() > at && listed.len() > 1 {
                    batch.lookups.push((at, listed));
                }
            }
            RevertAction::InPlace => {
                batch.checkpoint.scanned += 1;
                batch.checkpoint.already_present += 1;
            }
            RevertAction::Skip => batch.checkpoint.skipped_foreign += 1,
        }
    }
    batch
}

/// Sends each mirror of `batch` whose source version lists several locations for its id (a
/// `fanout` source, [`PreparedBatch::lookups`]) to where the id's source document is: the
/// first listed location that holds it, as a router's read finds it, or the first listed when
/// none does (an id created since the switch). Writing to the first listed location
/// regardless would leave the source document beside a new one: after the rollback a read
/// could find the older one, and a mirrored delete would not remove it. One `$in` query per
/// listed location.
pub async fn place_mirrors(
    shards: &crate::shards::Shards,
    batch: &mut PreparedBatch,
) -> Result<(), crate::shards::read::ReadError> {
    let lookups = std::mem::take(&mut batch.lookups);
    let mut wanted: BTreeMap<Location, Vec<Bson>> = BTreeMap::new();
    for (i, listed) in &lookups {
        for l in listed {
            wanted
                .entry(l.clone())
                .or_default()
                .push(batch.ids[*i].clone());
        }
    }
    let mut held: BTreeMap<Location, std::collections::HashSet<Vec<u8>>> = BTreeMap::new();
    for (location, ids) in wanted {
        let found = shards
            .find_by_ids(&location, &ids, Some(doc! { "_id": 1 }))
            .await?;
        held.insert(location, found.into_keys().collect());
    }
    for (i, listed) in lookups {
        let key = ids::key(&batch.ids[i]);
        let holds: Vec<bool> = listed
            .iter()
            .map(|l| held.get(l).is_some_and(|h| h.contains(&key)))
            .collect();
        if let Some(holder) = protocol::mirror_location(&listed, &holds) {
            batch.statements[i].location = holder.clone();
            batch.targets[i] = holder.clone();
        }
    }
    Ok(())
}

/// Leaves out the mirrors of `batch` that would change nothing: the source document each
/// would replace (where [`place_mirrors`] put it) already holds this migration's mirror of an
/// equal or newer revision ([`protocol::mirror_is_newer`]), because a router in `reverting`
/// mirrored the write before it answered. Their upserts would be refused, now and later (only
/// newer mirrors write the source meanwhile), and each costs the source's primary a write (and
/// its write concern) for nothing; they count as already present, as a refused upsert does.
/// One `$in` query per location.
pub async fn skip_mirrored(
    shards: &crate::shards::Shards,
    batch: &mut PreparedBatch,
    migration: i64,
) -> Result<(), crate::shards::read::ReadError> {
    let mirrors = std::mem::take(&mut batch.mirrors);
    if mirrors.is_empty() {
        return Ok(());
    }
    let mut wanted: BTreeMap<Location, Vec<Bson>> = BTreeMap::new();
    for (i, _) in &mirrors {
        wanted
            .entry(batch.statements[*i].location.clone())
            .or_default()
            .push(batch.ids[*i].clone());
    }
    let meta = envelope::META;
    let mut found: BTreeMap<Location, HashMap<Vec<u8>, Document>> = BTreeMap::new();
    for (location, ids) in wanted {
        let projection = doc! { "_id": 1, format!("{meta}.mig"): 1, format!("{meta}.rev"): 1 };
        found.insert(
            location.clone(),
            shards
                .find_by_ids(&location, &ids, Some(projection))
                .await?,
        );
    }
    let mut keep = vec![true; batch.statements.len()];
    for (i, image_rev) in mirrors {
        let held = found
            .get(&batch.statements[i].location)
            .and_then(|f| f.get(&ids::key(&batch.ids[i])));
        let source = match held.map(|d| d.get_document(meta).ok()) {
            None => protocol::MirrorSource::Absent,
            Some(meta) => match meta {
                Some(m) if m.get("mig").and_then(bson_i64) == Some(migration) => {
                    protocol::MirrorSource::Mirrored(m.get("rev").and_then(bson_i64))
                }
                _ => protocol::MirrorSource::Unmirrored,
            },
        };
        if !protocol::mirror_is_newer(source, image_rev) {
            keep[i] = false;
            batch.checkpoint.already_present += 1;
        }
    }
    retain_kept(&mut batch.statements, &keep);
    retain_kept(&mut batch.kinds, &keep);
    retain_kept(&mut batch.ids, &keep);
    retain_kept(&mut batch.targets, &keep);
    Ok(())
}

/// Keeps the entries of `v` whose `keep` flag (by position) is set.
fn retain_kept<T>(v: &mut Vec<T>, keep: &[bool]) {
    let mut flags = keep.iter();
    v.retain(|_| *flags.next().expect("one flag per entry"));
}

/// An integer field, whatever its width.
fn bson_i64(b: &Bson) -> Option<i64> {
    match b {
        Bson::Int32(v) => Some(i64::from(*v)),
        Bson::Int64(v) => Some(*v),
        _ => None,
    }
}

/// Cleanup's decision for the documents of one batch, before the target is consulted
/// ([`protocol::cleanup_action`]): which are source documents that moved (and where to), and
/// what is settled without a lookup (documents that never move, cannot be routed, or whose
/// dead letter an operator skipped are kept; tombstones and the other layout's documents are
/// outside the ledger). Pure.
pub fn cleanup_candidates(
    from: &RoutingVersion,
    to: &RoutingVersion,
    location: &Location,
    skipped: &std::collections::HashSet<Vec<u8>>,
    docs: &[Document],
) -> (Checkpoint, Vec<(Bson, Disposition)>) {
    let mut checkpoint = Checkpoint::default();
    let mut moved = Vec::new();
    for doc in docs {
        let id = doc.get("_id").cloned().unwrap_or(Bson::Null);
        let d = disposition::of(Side::Source, from, to, location, doc);
        match protocol::cleanup_action(&d, !skipped.is_empty() && skipped.contains(&ids::key(&id)))
        {
            CleanupAction::LookUp => {
                checkpoint.scanned += 1;
                moved.push((id, d));
            }
            CleanupAction::Keep => {
                checkpoint.scanned += 1;
                checkpoint.kept += 1;
            }
            CleanupAction::Skip => checkpoint.skipped_foreign += 1,
        }
    }
    (checkpoint, moved)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::routing::{KeyValue, Layout, PlacementRange, TenantBuckets};
    use mongodb::bson::RawDocumentBuf;

    fn version(
        hot_buckets: u32,
        placement: &[(u32, u32, &str)],
        field: Option<&str>,
    ) -> RoutingVersion {
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
                placement: placement
                    .iter()
                    .map(|(start, end, shard)| PlacementRange {
                        start: *start,
                        end: *end,
                        shard: (*shard).into(),
                    })
                    .collect(),
                routing_field: field.map(String::from),
            },
        )
    }

    const TWO: &[(u32, u32, &str)] = &[(0, 512, "s1"), (512, 1024, "s2")];

    /// A source document of `tenant` with an id chosen so that it moves (or stays).
    fn doc_that(
        from: &RoutingVersion,
        to: &RoutingVersion,
        tenant: &str,
        moves: bool,
    ) -> (Document, Location) {
        for i in 0.. {
            let id = format!("o-{i}");
            let t = KeyValue::String(tenant.into());
            let k = KeyValue::String(id.clone());
            let a = from.locate(&t, &k).unwrap().locations[0].clone();
            let b = to.locate(&t, &k).unwrap().locations[0].clone();
            if (a != b) == moves {
                return (doc! { "_id": id, "customerId": tenant, "total": 5 }, a);
            }
        }
        unreachable!()
    }

    #[test]
    fn moving_documents_are_copied_with_the_routing_field_and_copy_metadata() {
        let (from, to) = (version(1, TWO, None), version(16, TWO, Some("bucket")));
        let (d, here) = doc_that(&from, &to, "hot", true);
        let b = prepare_batch(&from, &to, &here, 7, vec![d.clone()]);
        assert_eq!(b.statements.len(), 1);
        assert_eq!(b.checkpoint.scanned, 1);
        let crate::shards::WriteOp::Insert(copy) = &b.statements[0].op else {
            panic!("{:?}", b.statements[0].op)
        };
        assert_eq!(copy.get_str("_id").unwrap(), d.get_str("_id").unwrap());
        assert!(copy.get_i32("bucket").unwrap() > 0);
        assert_eq!(
            copy.get_document("_reshard").unwrap(),
            &doc! { "src": "copy", "epoch": 7_i64, "rev": 0_i64 }
        );
        assert_ne!(b.targets[0], here);
    }

    #[test]
    fn staying_documents_are_stamped_only_when_the_field_is_missing_or_wrong() {
        let (from, to) = (version(1, TWO, None), version(16, TWO, Some("bucket")));
        let (mut d, here) = doc_that(&from, &to, "hot", false);
        let b = prepare_batch(&from, &to, &here, 1, vec![d.clone()]);
        assert_eq!(b.statements.len(), 1);
        assert!(matches!(
            b.statements[0].op,
            crate::shards::WriteOp::Update { upsert: false, .. }
        ));
        assert_eq!(b.targets[0], here);
        let sub = to
            .locate(
                &KeyValue::String("hot".into()),
                &KeyValue::from_bson(d.get("_id").unwrap()).unwrap(),
            )
            .unwrap()
            .sub_bucket;
        d.insert("bucket", sub as i32);
        let b = prepare_batch(&from, &to, &here, 1, vec![d]);
        assert!(b.statements.is_empty());
        assert_eq!((b.checkpoint.scanned, b.checkpoint.already_present), (1, 1));
    }

    #[test]
    fn foreign_documents_and_tombstones_are_outside_the_ledger_and_unroutable_ones_dead_letter() {
        let (from, to) = (version(1, TWO, None), version(16, TWO, Some("bucket")));
        let (d, here) = doc_that(&from, &to, "hot", true);
        let elsewhere = if here.shard == "s1" {
            from.location_on("s2")
        } else {
            from.location_on("s1")
        };
        let tomb = doc! { "_id": "t", "customerId": "hot", "_reshard": { "deleted": true } };
        let no_tenant = doc! { "_id": "x", "total": 1 };
        let b = prepare_batch(&from, &to, &elsewhere, 1, vec![d, tomb, no_tenant]);
        assert!(b.statements.is_empty());
        assert_eq!(b.checkpoint.skipped_foreign, 2);
        assert_eq!((b.checkpoint.scanned, b.checkpoint.dead_lettered), (1, 1));
        let dl = &b.checkpoint.dead_letters[0];
        assert_eq!(dl.doc_id_text, "x");
        assert!(dl.message.contains("customerId"), "{}", dl.message);
    }

    /// A skipped dead letter is matched by value: skipping the int `_id` N keeps the int and
    /// the double N (one document to MongoDB) and not the string "N", which moves and is
    /// looked up (found when skips were matched by their text, where 7 and "7" are alike).
    #[test]
    fn a_skipped_int_id_keeps_its_numbers_and_not_the_string_that_reads_alike() {
        let (from, to) = (version(1, TWO, None), version(16, TWO, Some("bucket")));
        let t = KeyValue::String("hot".into());
        let (n, here) = (0..)
            .find_map(|n: i64| {
                let at = |k: KeyValue, v: &RoutingVersion| {
                    v.locate(&t, &k).unwrap().locations[0].clone()
                };
                let (int, text) = (KeyValue::Int(n), KeyValue::String(n.to_string()));
                let here = at(int.clone(), &from);
                (here == at(text.clone(), &from) && here != at(int, &to) && here != at(text, &to))
                    .then_some((n, here))
            })
            .unwrap();
        let docs = [
            doc! { "_id": n as i32, "customerId": "hot" },
            doc! { "_id": n as f64, "customerId": "hot" },
            doc! { "_id": n.to_string(), "customerId": "hot" },
        ];
        let skipped = ids::keys_of_encoded(&[ids::encode(&Bson::Int64(n))]);
        let (checkpoint, moved) = cleanup_candidates(&from, &to, &here, &skipped, &docs);
        assert_eq!((checkpoint.scanned, checkpoint.kept), (3, 2));
        assert_eq!(moved.len(), 1, "{moved:?}");
        assert_eq!(moved[0].0, Bson::String(n.to_string()));
        let (checkpoint, moved) = cleanup_candidates(&from, &to, &here, &Default::default(), &docs);
        assert_eq!((checkpoint.kept, moved.len()), (0, 3));
    }

    /// The backfill reads raw documents and copies their bytes; what it decides and writes
    /// must be exactly what it would from the parsed documents.
    #[test]
    fn raw_and_parsed_batches_make_the_same_statements_and_ledger() {
        let (from, to) = (version(1, TWO, None), version(16, TWO, Some("bucket")));
        let (moves, here) = doc_that(&from, &to, "hot", true);
        let mut moves_written = moves.clone();
        moves_written.insert("bucket", 3);
        moves_written.insert("_reshard", doc! { "src": "app", "epoch": 2, "rev": 5 });
        moves_written.insert("nested", doc! { "a": [1, "two", { "b": 3.5 }] });
        let mut docs = vec![moves, moves_written];
        for tenant in ["hot", "a", "b", "c"] {
            for i in 0..30 {
                let id = format!("{tenant}-{i}");
                let at = from
                    .locate(
                        &KeyValue::String(tenant.into()),
                        &KeyValue::String(id.clone()),
                    )
                    .unwrap()
                    .locations[0]
                    .clone();
                if at == here {
                    docs.push(doc! { "_id": id, "customerId": tenant, "total": i });
                }
            }
        }
        docs.push(doc! { "_id": "t", "customerId": "hot", "_reshard": { "deleted": true } });
        docs.push(doc! { "_id": "x", "total": 1 });
        let raw: Vec<RawDocumentBuf> = docs
            .iter()
            .map(|d| RawDocumentBuf::from_document(d).unwrap())
            .collect();
        let parsed = prepare_batch(&from, &to, &here, 9, docs);
        let unparsed = prepare_batch(&from, &to, &here, 9, raw);
        assert!(parsed.statements.len() > 4, "{parsed:?}");
        let encoded = |b: &PreparedBatch| -> Vec<(Location, Bson, Vec<u8>)> {
            b.statements
                .iter()
                .map(|st| {
                    let bytes = match &st.op {
                        crate::shards::WriteOp::Insert(d) => {
                            RawDocumentBuf::from_document(d).unwrap().into_bytes()
                        }
                        crate::shards::WriteOp::InsertRaw(r) => r.as_bytes().to_vec(),
                        other => format!("{other:?}").into_bytes(),
                    };
                    (st.location.clone(), st.id.clone(), bytes)
                })
                .collect()
        };
        assert_eq!(encoded(&parsed), encoded(&unparsed));
        assert!(unparsed
            .statements
            .iter()
            .any(|st| matches!(st.op, crate::shards::WriteOp::InsertRaw(_))));
        assert_eq!(parsed.kinds, unparsed.kinds);
        assert_eq!(parsed.targets, unparsed.targets);
        assert_eq!(parsed.checkpoint, unparsed.checkpoint);
    }
}

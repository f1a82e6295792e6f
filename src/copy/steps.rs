//! The workers' executor: a protocol step a worker's decision asked for
//! ([`crate::protocol::backfill_action`], [`crate::protocol::cleanup_decision`],
//! [`crate::protocol::revert_action`]) turned into one bulk statement, with the envelope the
//! step's payload gets. The router executes the same steps one document at a time
//! (`router::exec`); here they are batched, and a batch's statements land in any order.

use std::borrow::Cow;

use mongodb::bson::{Bson, Document, RawDocumentBuf};

use crate::disposition::Disposition;
use crate::envelope;
use crate::protocol::{Payload, Side, Step};
use crate::routing::{Location, RoutingVersion};
use crate::shards::writer::{Modification, Statement, WriteOp};

/// What stamps a worker's writes: the two versions, the migration and its epoch.
#[derive(Clone, Copy, Debug)]
pub struct Context<'a> {
    pub from: &'a RoutingVersion,
    pub to: &'a RoutingVersion,
    pub migration: i64,
    pub epoch: i64,
}

/// A source document as a worker read it: parsed ([`Document`]), or the bytes the server sent
/// ([`RawDocumentBuf`], the backfill's scan), which are copied without being parsed.
pub trait Scanned: std::fmt::Debug + Sized {
    /// What routing and the disposition read (`_id`, the tenant key and id field, the routing
    /// fields of both versions, `_reshard`), parsed: the whole document when it is parsed
    /// already. `Err`: the bytes are not a valid document.
    fn head(&self, from: &RoutingVersion, to: &RoutingVersion)
        -> Result<Cow<'_, Document>, String>;

    /// The insert of its pristine copy for version `to` ([`envelope::copy`]).
    fn into_copy(self, to: &RoutingVersion, sub_bucket: u32, epoch: i64)
        -> Result<WriteOp, String>;
}

/// The fields a decision on a scanned document reads (`_id`, `_reshard`, the tenant key and
/// id field and the routing field of both versions): what [`Scanned::head`] parses.
pub fn head_fields<'a>(from: &'a RoutingVersion, to: &'a RoutingVersion) -> Vec<&'a str> {
    let mut fields = vec![
        "_id",
        envelope::META,
        from.tenant_key.as_str(),
        from.id_field.as_str(),
        to.tenant_key.as_str(),
        to.id_field.as_str(),
    ];
    fields.extend(from.routing_field());
    fields.extend(to.routing_field());
    fields
}

impl Scanned for Document {
    fn head(&self, _: &RoutingVersion, _: &RoutingVersion) -> Result<Cow<'_, Document>, String> {
        Ok(Cow::Borrowed(self))
    }

    fn into_copy(
        self,
        to: &RoutingVersion,
        sub_bucket: u32,
        epoch: i64,
    ) -> Result<WriteOp, String> {
        Ok(WriteOp::Insert(envelope::copy(self, to, sub_bucket, epoch)))
    }
}

impl Scanned for RawDocumentBuf {
    fn head(
        &self,
        from: &RoutingVersion,
        to: &RoutingVersion,
    ) -> Result<Cow<'_, Document>, String> {
        envelope::head(self, &head_fields(from, to))
            .map(Cow::Owned)
            .map_err(|e| format!("the document read is not valid BSON: {e}"))
    }

    fn into_copy(
        self,
        to: &RoutingVersion,
        sub_bucket: u32,
        epoch: i64,
    ) -> Result<WriteOp, String> {
        envelope::copy_raw(&self, to, sub_bucket, epoch)
            .map(WriteOp::InsertRaw)
            .map_err(|e| format!("the document read is not valid BSON: {e}"))
    }
}

/// A step a worker cannot send as a bulk statement (a router's step, or a step that does not
/// fit the document's disposition): a bug, reported rather than guessed at.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("a worker cannot send {step} for a document that is {disposition}")]
pub struct NotAWorkerStep {
    pub step: String,
    pub disposition: String,
}

/// The statement of `step`, decided for the document `id` read at `scanned` with disposition
/// `disposition`. `image` is the document as scanned: the first half of a mirror.
pub fn statement<D: Scanned>(
    step: Step<D, Document>,
    id: &Bson,
    scanned: &Location,
    disposition: &Disposition,
    image: Option<&Document>,
    context: &Context<'_>,
) -> Result<Statement, NotAWorkerStep> {
    let refuse = |step: &Step<D, Document>| NotAWorkerStep {
        step: format!("{step:?}").chars().take(80).collect(),
        disposition: format!("{disposition:?}"),
    };
    // By value: the copy is the scanned document itself, never a clone of it.
    match (step, disposition) {
        // The copier's insert-if-absent of a pristine copy, at the target location.
        (
            Step::Insert(Side::Target, Payload::Copy(doc)),
            Disposition::Moves { target, sub_bucket },
        ) => {
            let copy = doc
                .into_copy(context.to, *sub_bucket, context.epoch)
                .map_err(|reason| NotAWorkerStep {
                    step: "Insert(Target, Copy(..))".to_owned(),
                    disposition: reason,
                })?;
            Ok(Statement::new(target.clone(), id.clone(), copy))
        }
        // The stamp of a document that stays: the routing field, on the live document only.
        (Step::UpdateLive(Side::Target, update), Disposition::Stays { .. }) => Ok(Statement::new(
            scanned.clone(),
            id.clone(),
            WriteOp::Update {
                filter: envelope::live(id),
                update: Modification::Document(update),
                upsert: false,
            },
        )),
        // Cleanup's delete of a moved source document, once the target held it.
        (Step::Delete(Side::Source), Disposition::Moves { .. }) => {
            Ok(Statement::delete(scanned.clone(), id.clone()))
        }
        // The revert copier's mirror: the scanned target image, carried back by revision.
        (
            step @ Step::MirrorToSource,
            Disposition::Placed {
                source, sub_bucket, ..
            }
            | Disposition::Tombstone {
                source: Some((source, sub_bucket)),
            },
        ) => {
            let image = image.ok_or_else(|| refuse(&step))?.clone();
            let (filter, image) = envelope::mirror(
                image,
                context.migration,
                context.from,
                context.to,
                *sub_bucket,
            );
            Ok(Statement::new(
                source.clone(),
                id.clone(),
                WriteOp::Update {
                    filter,
                    update: Modification::Document(image),
                    upsert: true,
                },
            ))
        }
        (step, _) => Err(refuse(&step)),
    }
}

/// The filter of a purge: every document a purge step ([`crate::protocol::purge_tombstone_step`])
/// removes at a location, all at once (the step's one id at a time, as the model runs it, is
/// the same set). Any other step is refused.
pub fn purge_filter<D: std::fmt::Debug, U: std::fmt::Debug>(
    step: &Step<D, U>,
) -> Result<Document, String> {
    match step {
        Step::DeleteTombstone(_) => Ok(envelope::tombstones()),
        other => Err(format!("{other:?} is not a purge")),
    }
}

/// The side a read step ([`Step::Find`]) reads: where a worker that reads by scans (cleanup's
/// lookup, [`crate::protocol::cleanup_lookup_step`]) opens them. Any other step is refused.
pub fn read_side<D: std::fmt::Debug, U: std::fmt::Debug>(
    step: &Step<D, U>,
) -> Result<Side, String> {
    match step {
        Step::Find(side) => Ok(*side),
        other => Err(format!("{other:?} is not a read")),
    }
}

/// The filter of a step the protocol leaves to run at one named location, for one id, rather
/// than where the layouts route it: a bypass's leftover ([`crate::protocol::bypass_leftover_step`]).
/// Any other step is refused.
pub fn at_location_filter<D: std::fmt::Debug, U: std::fmt::Debug>(
    step: &Step<D, U>,
    id: &Bson,
) -> Result<Document, String> {
    match step {
        Step::DeleteUnmarked(_) => Ok(envelope::unmarked_of(id)),
        other => Err(format!("{other:?} does not run at a named location")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cleanup_looks_its_documents_up_in_the_target() {
        let lookup = crate::protocol::cleanup_lookup_step::<(), ()>();
        assert_eq!(read_side(&lookup), Ok(Side::Target));
        assert!(read_side(&Step::<(), ()>::Delete(Side::Target)).is_err());
    }

    #[test]
    fn a_bypass_leftover_deletes_the_id_only_without_the_envelope() {
        use mongodb::bson::doc;
        let id = Bson::String("o-1".into());
        let step = crate::protocol::bypass_leftover_step::<(), ()>(Side::Target).unwrap();
        assert_eq!(
            at_location_filter(&step, &id),
            Ok(doc! { "_id": "o-1", envelope::META: { "$exists": false } })
        );
        assert!(at_location_filter(&Step::<(), ()>::Delete(Side::Target), &id).is_err());
    }

    #[test]
    fn a_purge_deletes_tombstones_only_and_nothing_else_is_a_purge() {
        for side in [Side::Source, Side::Target] {
            let step = crate::protocol::purge_tombstone_step::<(), ()>(side);
            assert_eq!(purge_filter(&step), Ok(envelope::tombstones()));
        }
        assert!(purge_filter(&Step::<(), ()>::Delete(Side::Source)).is_err());
        assert!(purge_filter(&Step::<(), ()>::DeleteLive(Side::Target)).is_err());
    }
    use mongodb::bson::doc;

    fn version(field: Option<&str>) -> RoutingVersion {
        crate::routing::one_shard_version(field)
    }

    #[test]
    fn each_worker_step_becomes_its_statement_and_nothing_else_does() {
        let (from, to) = (version(None), version(Some("bucket")));
        let context = Context {
            from: &from,
            to: &to,
            migration: 3,
            epoch: 9,
        };
        let here = Location::new("s1", "orders");
        let there = Location::new("s2", "orders");
        let id = Bson::Int32(1);
        let d = doc! { "_id": 1, "customerId": "c" };
        let moves = Disposition::Moves {
            target: there.clone(),
            sub_bucket: 2,
        };
        let copy = statement(
            Step::Insert(Side::Target, Payload::Copy(d.clone())),
            &id,
            &here,
            &moves,
            None,
            &context,
        )
        .unwrap();
        assert_eq!(copy.location, there);
        let WriteOp::Insert(written) = &copy.op else {
            panic!("{copy:?}")
        };
        assert_eq!(written.get_i32("bucket").unwrap(), 2);
        assert!(envelope::is_pristine_copy(written));

        let delete = statement::<Document>(
            Step::Delete(Side::Source),
            &id,
            &here,
            &moves,
            None,
            &context,
        )
        .unwrap();
        assert_eq!(delete, Statement::delete(here.clone(), id.clone()));

        let placed = Disposition::Placed {
            source: here.clone(),
            sub_bucket: 0,
            pristine: false,
        };
        let image = doc! { "_id": 1, "customerId": "c", "bucket": 2, "_reshard": { "src": "app", "rev": 3 } };
        let mirror = statement::<Document>(
            Step::MirrorToSource,
            &id,
            &there,
            &placed,
            Some(&image),
            &context,
        )
        .unwrap();
        assert_eq!(mirror.location, here);
        assert!(matches!(mirror.op, WriteOp::Update { upsert: true, .. }));

        // A router's step, or a step that does not fit the disposition, is refused.
        assert!(statement::<Document>(
            Step::Find(Side::Target),
            &id,
            &here,
            &moves,
            None,
            &context
        )
        .is_err());
        assert!(statement::<Document>(
            Step::Delete(Side::Source),
            &id,
            &here,
            &Disposition::Foreign,
            None,
            &context
        )
        .is_err());
    }
}

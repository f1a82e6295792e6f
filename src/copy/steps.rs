//! The workers' executor: a protocol step a worker's decision asked for
//! ([`crate::protocol::backfill_action`], [`crate::protocol::cleanup_decision`],
//! [`crate::protocol::revert_action`]) turned into one bulk statement, with the envelope the
//! step's payload gets. The router executes the same steps one document at a time
//! (`router::exec`); here they are batched, and a batch's statements land in any order.

use mongodb::bson::{Bson, Document};

use super::writer::{Modification, Statement, WriteOp};
use crate::disposition::Disposition;
use crate::envelope;
use crate::protocol::{Payload, Side, Step};
use crate::routing::{Location, RoutingVersion};

/// What stamps a worker's writes: the two versions, the migration and its epoch.
#[derive(Clone, Copy, Debug)]
pub struct Context<'a> {
    pub from: &'a RoutingVersion,
    pub to: &'a RoutingVersion,
    pub migration: i64,
    pub epoch: i64,
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
pub fn statement(
    step: Step<Document, Document>,
    id: &Bson,
    scanned: &Location,
    disposition: &Disposition,
    image: Option<&Document>,
    context: &Context<'_>,
) -> Result<Statement, NotAWorkerStep> {
    let refuse = |step: &Step<Document, Document>| NotAWorkerStep {
        step: format!("{step:?}").chars().take(80).collect(),
        disposition: format!("{disposition:?}"),
    };
    match (&step, disposition) {
        // The copier's insert-if-absent of a pristine copy, at the target location.
        (
            Step::Insert(Side::Target, Payload::Copy(doc)),
            Disposition::Moves { target, sub_bucket },
        ) => Ok(Statement::new(
            target.clone(),
            id.clone(),
            WriteOp::Insert(envelope::copy(
                doc.clone(),
                context.to,
                *sub_bucket,
                context.epoch,
            )),
        )),
        // The stamp of a document that stays: the routing field, on the live document only.
        (Step::UpdateLive(Side::Target, update), Disposition::Stays { .. }) => Ok(Statement::new(
            scanned.clone(),
            id.clone(),
            WriteOp::Update {
                filter: envelope::live(id),
                update: Modification::Document(update.clone()),
                upsert: false,
            },
        )),
        // Cleanup's delete of a moved source document, once the target held it.
        (Step::Delete(Side::Source), Disposition::Moves { .. }) => {
            Ok(Statement::delete(scanned.clone(), id.clone()))
        }
        // The revert copier's mirror: the scanned target image, carried back by revision.
        (
            Step::MirrorToSource,
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
        _ => Err(refuse(&step)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
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

        let delete = statement(
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
        let mirror = statement(
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
        assert!(statement(Step::Find(Side::Target), &id, &here, &moves, None, &context).is_err());
        assert!(statement(
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

//! `findAndModify` on a routed collection (`findOneAndUpdate`, `findOneAndReplace` and
//! `findOneAndDelete` in the drivers), which applications use for queues and counters.
//!
//! The document is the one the filter names (its tenant and `_id`), or the first the filter
//! matches in the sort's order, read through the router. It is then changed by one protocol
//! operation conditional on the filter, which returns the image asked for from the write
//! itself (a `findAndModify` on the shard holding it, for an update), so two clients taking
//! the same queue item cannot both get it: the second one's conditional write matches
//! nothing, and it looks again for the next.

use bson::{doc, Bson, DateTime, Document};
use futures::future::BoxFuture;

use super::routed::{query, route, Routed, MAX_RETARGETS};
use super::write::{duplicate, replacement, retargeted, upserted_document};
use super::{Command, Context, Reply};
use crate::front::error::CommandError;
use crate::front::plan::{self, Change, FindAndModify};
use crate::protocol::{Operation, Outcome};
use crate::router::{Image, Router, Terms};

pub fn find_and_modify<'a>(cx: &'a mut Context<'_>, command: &'a Command) -> BoxFuture<'a, Reply> {
    Box::pin(async move {
        let (router, collection, tenant_key) = match route(cx, command).await? {
            Routed::To {
                router,
                collection,
                tenant_key,
            } => (router, collection, tenant_key),
            Routed::Answered(reply) => return Ok(reply),
        };
        let plan = plan::find_and_modify(&command.body, &tenant_key)?;
        let namespace = format!("{}.{collection}", command.database);
        let now = DateTime::now();
        for _ in 0..MAX_RETARGETS {
            let target = match (plan.pinned.one(), &plan.sort) {
                (Some(one), None) => Some(one),
                _ => first_match(&router, &plan, &tenant_key).await?,
            };
            let Some((tenant, id)) = target else {
                return upsert_or_nothing(&router, &plan, &tenant_key, &namespace, now).await;
            };
            // A document named by the filter is upserted by the operation itself; one found
            // by a read is only changed (if it changed meanwhile, look again).
            let named = plan.pinned.one().is_some() && plan.sort.is_none();
            if let Some(reply) = modify_one(
                &router,
                &plan,
                &tenant_key,
                &namespace,
                tenant,
                id,
                named,
                now,
            )
            .await?
            {
                return Ok(reply);
            }
            if named {
                return upsert_or_nothing(&router, &plan, &tenant_key, &namespace, now).await;
            }
        }
        Err(retargeted())
    })
}

/// The tenant and id of the first document the filter matches, in the sort's order.
async fn first_match(
    router: &Router,
    plan: &FindAndModify,
    tenant_key: &str,
) -> Result<Option<(Bson, Bson)>, CommandError> {
    let mut q = query(
        plan.pinned.tenants.clone(),
        plan.filter.clone(),
        plan.sort.as_ref(),
        None,
        tenant_key,
        Some(1),
    );
    let mut keep = vec!["_id", tenant_key];
    if let Some(sort) = &plan.sort {
        keep.extend(sort.paths());
    }
    q.projection = Some(
        keep.into_iter()
            .map(|k| (first_segment(k).to_owned(), Bson::Int32(1)))
            .collect(),
    );
    let mut cursor = router.query(q).await?;
    let first = router.next_batch(&mut cursor, 1).await?;
    Ok(first
        .into_iter()
        .next()
        .and_then(|d| Some((d.get(tenant_key)?.clone(), d.get("_id")?.clone()))))
}

fn first_segment(path: &str) -> &str {
    path.split('.').next().unwrap_or(path)
}

/// Changes the one document conditionally on the filter: the reply, or `None` when it did
/// not match any more.
#[allow(clippy::too_many_arguments)]
async fn modify_one(
    router: &Router,
    plan: &FindAndModify,
    tenant_key: &str,
    namespace: &str,
    tenant: Bson,
    id: Bson,
    named: bool,
    now: DateTime,
) -> Result<Option<Document>, CommandError> {
    let image = if plan.new {
        Image::After
    } else {
        Image::Before
    };
    let terms = Terms {
        condition: Some(plan.filter.clone()),
        image,
    };
    let upsert = plan.upsert && named;
    let op = match &plan.change {
        None => Operation::Delete,
        Some(Change::Operators(u)) if upsert => Operation::Upsert {
            update: u.clone(),
            insert: upserted_document(
                &plan.filter,
                plan.change.as_ref().expect("a change"),
                now,
                tenant_key,
            )?
            .1,
        },
        Some(Change::Operators(u)) => Operation::Update(u.clone()),
        Some(Change::Replacement(r)) => Operation::Replace {
            doc: replacement(r, &id, &tenant, tenant_key)?,
            upsert,
        },
    };
    let done = router
        .execute("find_and_modify", tenant, id.clone(), op, &terms)
        .await?;
    let shaped = |d: Option<Document>| match (&plan.fields, d) {
        (Some(p), Some(d)) => Bson::Document(p.apply(&d)),
        (None, Some(d)) => Bson::Document(d),
        (_, None) => Bson::Null,
    };
    Ok(match done.outcome {
        Outcome::Changed(true) => {
            let mut last = doc! { "n": 1 };
            if plan.change.is_some() {
                last.insert("updatedExisting", true);
            }
            Some(doc! { "lastErrorObject": last, "value": shaped(done.image) })
        }
        Outcome::Inserted => Some(doc! {
            "lastErrorObject": { "n": 1, "updatedExisting": false, "upserted": id },
            "value": shaped(done.image.filter(|_| plan.new)),
        }),
        Outcome::Changed(false) => None,
        _ => return Err(duplicate(namespace, &id)),
    })
}

/// Nothing matched: with `upsert`, the new document is inserted; else the empty answer.
async fn upsert_or_nothing(
    router: &Router,
    plan: &FindAndModify,
    tenant_key: &str,
    namespace: &str,
    now: DateTime,
) -> Reply {
    let nothing = || {
        let mut last = doc! { "n": 0 };
        if plan.change.is_some() {
            last.insert("updatedExisting", false);
        }
        Ok(doc! { "lastErrorObject": last, "value": Bson::Null })
    };
    let (Some(change), true) = (&plan.change, plan.upsert) else {
        return nothing();
    };
    let (id, doc) = upserted_document(&plan.filter, change, now, tenant_key)?;
    let tenant = doc.get(tenant_key).cloned().unwrap_or(Bson::Null);
    let terms = Terms {
        condition: None,
        image: Image::After,
    };
    let done = router
        .execute(
            "find_and_modify",
            tenant,
            id.clone(),
            Operation::Insert(doc),
            &terms,
        )
        .await?;
    match done.outcome {
        Outcome::Inserted => {
            let value = match (plan.new, done.image) {
                (true, Some(d)) => match &plan.fields {
                    Some(p) => Bson::Document(p.apply(&d)),
                    None => Bson::Document(d),
                },
                _ => Bson::Null,
            };
            Ok(doc! {
                "lastErrorObject": { "n": 1, "updatedExisting": false, "upserted": id },
                "value": value,
            })
        }
        _ => Err(duplicate(namespace, &id)),
    }
}

//! `insert`, `update` and `delete` on a routed collection: each statement through the router's
//! engine, one document at a time, as the protocol's single-document operations.
//!
//! A statement whose filter names one document (its tenant and `_id`) is one operation, with
//! the filter as its condition. Any other filter is read first, through the router, for the
//! ids it matches at that moment (the first of them for a single-document statement), and
//! each id is then written by its own operation with the filter as its condition, so a
//! document that stopped matching in between is left alone, and a single-document statement
//! that lost its document that way looks again. As on a `mongos`, a statement over several
//! documents is not atomic across them.
//!
//! An ordered command stops at its first failed statement; an unordered one goes on and
//! reports every failure by index in `writeErrors`. `nModified` counts the documents a
//! statement matched: every update through reshard stamps its bookkeeping, so a matched
//! document is always modified.

use bson::{doc, oid::ObjectId, Bson, DateTime, Document};
use futures::future::BoxFuture;

use super::routed::{ids_query, route, Routed, MAX_RETARGETS};
use super::{Command, Context, Reply};
use crate::front::error::{CommandError, ErrorCode};
use crate::front::plan::{self, Change, DeleteStatement, Pinned, UpdateStatement};
use crate::protocol::{Operation, Outcome};
use crate::router::{Router, Terms};

pub fn insert<'a>(cx: &'a mut Context<'_>, command: &'a Command) -> BoxFuture<'a, Reply> {
    Box::pin(async move {
        let (router, collection, tenant_key) = match route(cx, command).await? {
            Routed::To {
                router,
                collection,
                tenant_key,
            } => (router, collection, tenant_key),
            Routed::Answered(reply) => return Ok(reply),
        };
        let plan = plan::insert(&command.body, &tenant_key)?;
        let namespace = format!("{}.{collection}", command.database);
        let mut n = 0_i32;
        let mut errors = Vec::new();
        for (index, statement) in plan.statements.into_iter().enumerate() {
            let result = match statement {
                Ok(doc) => insert_one(&router, &tenant_key, &namespace, doc).await,
                Err(e) => Err(e),
            };
            match result {
                Ok(()) => n += 1,
                Err(e) => {
                    errors.push(e.write_error(index));
                    if plan.ordered {
                        break;
                    }
                }
            }
        }
        Ok(write_reply(n, None, errors, Vec::new()))
    })
}

/// The document with an `_id` first: the one it has, or a new ObjectId, as drivers and
/// MongoDB add it.
fn with_id(doc: Document) -> (Bson, Document) {
    if let Some(id) = doc.get("_id") {
        return (id.clone(), doc);
    }
    let id = Bson::ObjectId(ObjectId::new());
    let mut out = doc! { "_id": id.clone() };
    out.extend(doc);
    (id, out)
}

async fn insert_one(
    router: &Router,
    tenant_key: &str,
    namespace: &str,
    doc: Document,
) -> Result<(), CommandError> {
    let (id, doc) = with_id(doc);
    let tenant = doc.get(tenant_key).cloned().unwrap_or(Bson::Null);
    let done = router
        .execute(
            "insert",
            tenant,
            id.clone(),
            Operation::Insert(doc),
            &Terms::default(),
        )
        .await?;
    match done.outcome {
        Outcome::Inserted => Ok(()),
        _ => Err(duplicate(namespace, &id)),
    }
}

/// MongoDB's duplicate key error on `_id`.
pub fn duplicate(namespace: &str, id: &Bson) -> CommandError {
    CommandError::new(
        ErrorCode::DuplicateKey,
        format!(
            "E11000 duplicate key error collection: {namespace} index: _id_ dup key: {{ _id: {} }}",
            crate::mql::shell(id)
        ),
    )
}

/// `{n, nModified, upserted, writeErrors}`, as MongoDB answers a write command.
fn write_reply(
    n: i32,
    modified: Option<i32>,
    errors: Vec<Document>,
    upserted: Vec<Document>,
) -> Document {
    let mut reply = doc! { "n": n };
    if let Some(m) = modified {
        reply.insert("nModified", m);
    }
    if !upserted.is_empty() {
        reply.insert("upserted", upserted);
    }
    if !errors.is_empty() {
        reply.insert("writeErrors", errors);
    }
    reply
}

/// What one update statement did.
#[derive(Default)]
struct Updated {
    matched: i32,
    upserted: Option<Bson>,
}

pub fn update<'a>(cx: &'a mut Context<'_>, command: &'a Command) -> BoxFuture<'a, Reply> {
    Box::pin(async move {
        let (router, collection, tenant_key) = match route(cx, command).await? {
            Routed::To {
                router,
                collection,
                tenant_key,
            } => (router, collection, tenant_key),
            Routed::Answered(reply) => return Ok(reply),
        };
        let plan = plan::update(&command.body, &tenant_key)?;
        let namespace = format!("{}.{collection}", command.database);
        let (mut n, mut errors, mut upserted) = (0, Vec::new(), Vec::new());
        for (index, statement) in plan.statements.into_iter().enumerate() {
            let result = match statement {
                Ok(s) => update_statement(&router, &tenant_key, &namespace, &s).await,
                Err(e) => Err(e),
            };
            match result {
                Ok(done) => {
                    n += done.matched;
                    if let Some(id) = done.upserted {
                        n += 1;
                        upserted.push(doc! { "index": index as i32, "_id": id });
                    }
                }
                Err(e) => {
                    errors.push(e.write_error(index));
                    if plan.ordered {
                        break;
                    }
                }
            }
        }
        let modified = n - upserted.len() as i32;
        Ok(write_reply(n, Some(modified), errors, upserted))
    })
}

async fn update_statement(
    router: &Router,
    tenant_key: &str,
    namespace: &str,
    s: &UpdateStatement,
) -> Result<Updated, CommandError> {
    let now = DateTime::now();
    if let (Some((tenant, id)), false) = (s.pinned.one(), s.multi) {
        return update_one(router, tenant_key, namespace, s, tenant, id, s.upsert, now).await;
    }
    if s.multi {
        let mut done = Updated::default();
        for (tenant, id) in matching(router, &s.pinned, &s.filter, tenant_key, None).await? {
            done.matched += update_one(router, tenant_key, namespace, s, tenant, id, false, now)
                .await?
                .matched;
        }
        if done.matched == 0 && s.upsert {
            done.upserted = Some(insert_new(router, tenant_key, namespace, s, now).await?);
        }
        return Ok(done);
    }
    for _ in 0..MAX_RETARGETS {
        let Some((tenant, id)) = matching(router, &s.pinned, &s.filter, tenant_key, Some(1))
            .await?
            .into_iter()
            .next()
        else {
            if s.upsert {
                let id = insert_new(router, tenant_key, namespace, s, now).await?;
                return Ok(Updated {
                    matched: 0,
                    upserted: Some(id),
                });
            }
            return Ok(Updated::default());
        };
        let done = update_one(router, tenant_key, namespace, s, tenant, id, false, now).await?;
        if done.matched > 0 {
            return Ok(done);
        }
    }
    Err(retargeted())
}

/// The conflict of a write whose documents kept changing under it.
pub fn retargeted() -> CommandError {
    CommandError::new(
        ErrorCode::WriteConflict,
        format!(
            "the document the filter matched changed before the write reached it, {MAX_RETARGETS} \
             times in a row; try again"
        ),
    )
}

/// The update of the one document `tenant`, `id`, conditional on the statement's filter.
#[allow(clippy::too_many_arguments)]
async fn update_one(
    router: &Router,
    tenant_key: &str,
    namespace: &str,
    s: &UpdateStatement,
    tenant: Bson,
    id: Bson,
    upsert: bool,
    now: DateTime,
) -> Result<Updated, CommandError> {
    let terms = Terms {
        condition: Some(s.filter.clone()),
        ..Terms::default()
    };
    let op = match (&s.change, upsert) {
        (Change::Operators(u), false) => Operation::Update(u.clone()),
        (Change::Operators(u), true) => Operation::Upsert {
            update: u.clone(),
            insert: new_document(s, now, tenant_key)?.1,
        },
        (Change::Replacement(r), upsert) => Operation::Replace {
            doc: replacement(r, &id, &tenant, tenant_key)?,
            upsert,
        },
    };
    let done = router
        .execute("update", tenant, id.clone(), op, &terms)
        .await?;
    Ok(match done.outcome {
        Outcome::Changed(true) => Updated {
            matched: 1,
            upserted: None,
        },
        Outcome::Changed(false) => Updated::default(),
        Outcome::Inserted => Updated {
            matched: 0,
            upserted: Some(id),
        },
        _ => return Err(duplicate(namespace, &id)),
    })
}

/// A replacement as the router writes it: the id first, the tenant key kept.
pub fn replacement(
    r: &Document,
    id: &Bson,
    tenant: &Bson,
    tenant_key: &str,
) -> Result<Document, CommandError> {
    let existing = doc! { "_id": id.clone() };
    let doc = crate::mql::update::replace(&existing, r)?;
    match doc.get(tenant_key) {
        Some(t) if crate::mql::order::equal(t, tenant) => Ok(doc),
        Some(_) => Err(CommandError::new(
            ErrorCode::ImmutableField,
            format!("the replacement changes '{tenant_key}', the tenant key: it is immutable"),
        )),
        None => Err(CommandError::new(
            ErrorCode::ShardKeyNotFound,
            format!("the replacement document has no '{tenant_key}', the tenant key of the routed collection"),
        )),
    }
}

/// The document an upsert of statement `s` inserts, with its `_id` (a new ObjectId when the
/// filter gives none).
fn new_document(
    s: &UpdateStatement,
    now: DateTime,
    tenant_key: &str,
) -> Result<(Bson, Document), CommandError> {
    upserted_document(&s.filter, &s.change, now, tenant_key)
}

/// The document an upsert with `filter` and `change` inserts, with its `_id`.
pub fn upserted_document(
    filter: &Document,
    change: &Change,
    now: DateTime,
    tenant_key: &str,
) -> Result<(Bson, Document), CommandError> {
    let doc = crate::mql::update::upsert_document(filter, &change.as_bson(), now)?;
    if !doc.contains_key(tenant_key) {
        return Err(CommandError::new(
            ErrorCode::ShardKeyNotFound,
            format!(
                "the document an upsert would insert has no '{tenant_key}': its filter must pin \
                 the tenant key to one value"
            ),
        ));
    }
    Ok(with_id(doc))
}

/// An upsert that matched nothing: inserts its new document; its id.
async fn insert_new(
    router: &Router,
    tenant_key: &str,
    namespace: &str,
    s: &UpdateStatement,
    now: DateTime,
) -> Result<Bson, CommandError> {
    let (id, doc) = new_document(s, now, tenant_key)?;
    insert_one(router, tenant_key, namespace, doc).await?;
    Ok(id)
}

/// The tenants and ids of the documents `filter` matches now (at most `limit`).
pub async fn matching(
    router: &Router,
    pinned: &Pinned,
    filter: &Document,
    tenant_key: &str,
    limit: Option<u64>,
) -> Result<Vec<(Bson, Bson)>, CommandError> {
    let mut cursor = router
        .query(ids_query(
            pinned.tenants.clone(),
            filter.clone(),
            tenant_key,
            limit,
        ))
        .await?;
    let max = limit.map_or(super::read::MAX_MERGED, |l| l as usize);
    let mut docs = super::routed::all(router, &mut cursor, max).await?;
    if let Some(l) = limit {
        docs.truncate(l as usize);
    }
    Ok(docs
        .into_iter()
        .filter_map(|d| Some((d.get(tenant_key)?.clone(), d.get("_id")?.clone())))
        .collect())
}

pub fn delete<'a>(cx: &'a mut Context<'_>, command: &'a Command) -> BoxFuture<'a, Reply> {
    Box::pin(async move {
        let (router, tenant_key) = match route(cx, command).await? {
            Routed::To {
                router, tenant_key, ..
            } => (router, tenant_key),
            Routed::Answered(reply) => return Ok(reply),
        };
        let plan = plan::delete(&command.body, &tenant_key)?;
        let (mut n, mut errors) = (0, Vec::new());
        for (index, statement) in plan.statements.into_iter().enumerate() {
            let result = match statement {
                Ok(s) => delete_statement(&router, &tenant_key, &s).await,
                Err(e) => Err(e),
            };
            match result {
                Ok(deleted) => n += deleted,
                Err(e) => {
                    errors.push(e.write_error(index));
                    if plan.ordered {
                        break;
                    }
                }
            }
        }
        Ok(write_reply(n, None, errors, Vec::new()))
    })
}

async fn delete_statement(
    router: &Router,
    tenant_key: &str,
    s: &DeleteStatement,
) -> Result<i32, CommandError> {
    let terms = Terms {
        condition: Some(s.filter.clone()),
        ..Terms::default()
    };
    let delete = |tenant: Bson, id: Bson| {
        let terms = terms.clone();
        async move {
            let done = router
                .execute("delete", tenant, id, Operation::Delete, &terms)
                .await?;
            Ok::<_, CommandError>(i32::from(done.outcome == Outcome::Changed(true)))
        }
    };
    if s.just_one {
        if let Some((tenant, id)) = s.pinned.one() {
            return delete(tenant, id).await;
        }
        for _ in 0..MAX_RETARGETS {
            let Some((tenant, id)) = matching(router, &s.pinned, &s.filter, tenant_key, Some(1))
                .await?
                .into_iter()
                .next()
            else {
                return Ok(0);
            };
            if delete(tenant, id).await? == 1 {
                return Ok(1);
            }
        }
        return Err(retargeted());
    }
    let mut n = 0;
    for (tenant, id) in matching(router, &s.pinned, &s.filter, tenant_key, None).await? {
        n += delete(tenant, id).await?;
    }
    Ok(n)
}

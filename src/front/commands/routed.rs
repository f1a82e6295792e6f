//! What the routed commands share: where a command on a collection goes (its router, or the
//! passthrough, which answers it there and then), the tenant key a routed collection is read
//! by, reads of matching documents through the router, and a cursor's next batch.

use bson::{doc, Bson, Document};

use super::{Command, Context};
use crate::front::cursors::{Open, Source};
use crate::front::engine::{Destination, Engine};
use crate::front::error::{CommandError, ErrorCode};
use crate::mql::projection::Projection;
use crate::mql::sort::SortSpec;
use crate::router::{Query, QueryCursor, Router};

/// The largest batch of documents a reply carries, in bytes: MongoDB's replies stay within
/// its 16 MiB document limit.
pub const MAX_BATCH_BYTES: usize = 15 * 1024 * 1024;

/// A `getMore` without `batchSize` returns up to this many documents (and
/// [`MAX_BATCH_BYTES`]).
pub const DEFAULT_MORE_BATCH: u64 = 10_000;

/// How many times a write that found a document by its filter and lost it to a concurrent
/// change before its conditional write landed looks again before it reports a conflict.
pub const MAX_RETARGETS: usize = 8;

/// A command on a routed collection, or the answer another destination gave.
pub enum Routed {
    /// The collection's router and the collection's name and tenant key.
    To {
        router: Router,
        collection: String,
        tenant_key: String,
    },
    /// The passthrough answered (or the front refused) already.
    Answered(Document),
}

/// The engine, or the refusal of a front that runs without one.
pub fn engine<'a>(cx: &Context<'a>) -> Result<&'a Engine, CommandError> {
    cx.engine.ok_or_else(|| {
        CommandError::new(
            ErrorCode::CommandNotSupported,
            "this front serves no collections: it was started without a state store",
        )
    })
}

/// Where a command on the collection it names goes: the router of a routed collection, or
/// the passthrough location (whose reply is the answer), or a refusal when there is none.
pub async fn route(cx: &mut Context<'_>, command: &Command) -> Result<Routed, CommandError> {
    let engine = engine(cx)?;
    let collection = crate::front::plan::collection_of(&command.body, &command.name)?;
    match engine.destination(&command.database, &collection).await? {
        Destination::Routed(router) => {
            let tenant_key = router.snapshot().await.target.tenant_key.clone();
            Ok(Routed::To {
                router,
                collection,
                tenant_key,
            })
        }
        Destination::Passthrough(p) => Ok(Routed::Answered(
            super::passthrough::forward(engine, p, command).await,
        )),
        Destination::Unserved => Err(unserved(engine, &command.database, &collection)),
    }
}

/// The refusal of a namespace the front does not route, with no passthrough location.
pub fn unserved(engine: &Engine, database: &str, collection: &str) -> CommandError {
    let routed: Vec<String> = engine.routed_collections().into_iter().collect();
    CommandError::new(
        ErrorCode::CommandNotSupported,
        format!(
            "'{database}.{collection}' is not routed by this front and no passthrough location \
             is configured (reshard front --passthrough-uri): it serves the routed collections \
             of database '{}' only ({})",
            engine.database(),
            if routed.is_empty() {
                "none yet".to_owned()
            } else {
                routed.join(", ")
            }
        ),
    )
}

/// A read of the documents matching `filter` of the `tenants`, in the order of `sort`, each
/// location returning the fields `projection` needs plus the tenant key and the sort's.
pub fn query(
    tenants: Vec<Bson>,
    filter: Document,
    sort: Option<&SortSpec>,
    projection: Option<&Projection>,
    tenant_key: &str,
    limit: Option<u64>,
) -> Query {
    let mut also: Vec<&str> = vec![tenant_key];
    if let Some(sort) = sort {
        also.extend(sort.paths());
    }
    let order = sort.cloned().map(|s| {
        std::sync::Arc::new(move |a: &Document, b: &Document| s.compare(a, b))
            as crate::router::Order
    });
    Query {
        tenants,
        filter,
        projection: projection.and_then(|p| p.for_servers(&also)),
        sort: sort.map(SortSpec::to_document),
        order,
        limit,
        batch_size: limit.map_or(1000, |l| l.clamp(1, 1000) as u32),
    }
}

/// A read of the ids (and tenants) of matching documents only.
pub fn ids_query(
    tenants: Vec<Bson>,
    filter: Document,
    tenant_key: &str,
    limit: Option<u64>,
) -> Query {
    Query {
        tenants,
        filter,
        projection: Some(doc! { "_id": 1, tenant_key: 1 }),
        sort: None,
        order: None,
        limit,
        batch_size: 1000,
    }
}

/// Every document `cursor` yields, up to `max` (then `QueryExceededMemoryLimit`).
pub async fn all(
    router: &Router,
    cursor: &mut QueryCursor,
    max: usize,
) -> Result<Vec<Document>, CommandError> {
    let mut out = Vec::new();
    loop {
        let batch = router.next_batch(cursor, 1000).await?;
        let ended = batch.len() < 1000;
        out.extend(batch);
        if out.len() > max {
            return Err(CommandError::new(
                ErrorCode::QueryExceededMemoryLimitNoDiskUseAllowed,
                format!(
                    "the front merges at most {max} documents in memory for one command on a \
                     routed collection; narrow the filter"
                ),
            ));
        }
        if ended {
            return Ok(out);
        }
    }
}

/// The next batch of an open cursor: at most `n` documents and [`MAX_BATCH_BYTES`], and
/// whether the cursor is exhausted.
pub async fn next_batch(open: &mut Open, n: u64) -> Result<(Vec<Document>, bool), CommandError> {
    let n = n.max(1);
    let mut out = Vec::new();
    let mut bytes = 0usize;
    let mut full = |out: &mut Vec<Document>, doc: Document| {
        bytes += doc_size(&doc);
        out.push(doc);
        out.len() as u64 >= n || bytes >= MAX_BATCH_BYTES
    };
    match &mut open.source {
        Source::Computed(docs) => {
            while let Some(doc) = docs.pop_front() {
                if full(&mut out, doc) {
                    break;
                }
            }
            let ended = docs.is_empty();
            Ok((out, ended))
        }
        Source::Passthrough(cursor) => {
            let batch = cursor
                .next_batch(n.min(100_000) as usize)
                .await
                .map_err(|reply| passed_error(&reply))?;
            let ended = (batch.len() as u64) < n;
            Ok((batch, ended))
        }
        Source::Routed {
            router,
            cursor,
            skip,
            left,
            projection,
            held,
            ended,
        } => loop {
            // Documents read before and not returned yet (a batch the byte budget cut) first.
            while let Some(doc) = held.pop_front() {
                if *skip > 0 {
                    *skip -= 1;
                    continue;
                }
                if *left == Some(0) {
                    held.clear();
                    return Ok((out, true));
                }
                if let Some(l) = left.as_mut() {
                    *l -= 1;
                }
                let doc = match projection {
                    Some(p) => p.apply(&doc),
                    None => doc,
                };
                if full(&mut out, doc) {
                    let done = (*ended && held.is_empty()) || *left == Some(0);
                    return Ok((out, done));
                }
            }
            if *ended || *left == Some(0) {
                return Ok((out, true));
            }
            let want = (n - out.len() as u64 + *skip).clamp(1, 1000) as usize;
            let batch = router.next_batch(cursor, want).await?;
            *ended = batch.len() < want;
            held.extend(batch);
        },
    }
}

fn doc_size(doc: &Document) -> usize {
    bson::to_vec(doc).map(|v| v.len()).unwrap_or(0)
}

/// A reply's error as a command error (a passthrough cursor's failure).
pub fn passed_error(reply: &Document) -> CommandError {
    CommandError::passed(
        reply.get_i32("code").unwrap_or(1),
        reply
            .get_str("codeName")
            .unwrap_or("InternalError")
            .to_owned(),
        reply
            .get_str("errmsg")
            .unwrap_or("the passthrough location failed")
            .to_owned(),
    )
}

/// A cursor reply: `{cursor: {firstBatch | nextBatch, id, ns}}`.
pub fn cursor_reply(batch: Vec<Document>, id: i64, namespace: &str, first: bool) -> Document {
    let key = if first { "firstBatch" } else { "nextBatch" };
    doc! { "cursor": { key: batch, "id": id, "ns": namespace } }
}

/// Answers the first batch of `open` and registers it when documents are left.
pub async fn first_batch(
    engine: &Engine,
    mut open: Open,
    n: u64,
    single_batch: bool,
) -> Result<Document, CommandError> {
    let (batch, ended) = next_batch(&mut open, n).await?;
    let namespace = open.namespace.clone();
    let id = if ended || single_batch {
        0
    } else {
        engine
            .cursors
            .register(open)
            .map_err(|e| CommandError::new(ErrorCode::OperationFailed, e.to_string()))?
    };
    Ok(cursor_reply(batch, id, &namespace, true))
}

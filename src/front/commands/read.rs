//! `find`, `count`, `distinct` and `aggregate` on a routed collection: the locations of the
//! tenants the filter pins are read through the router's many-document read, which answers
//! each id as the router's read of it would (a source image a newer target image or a
//! tombstone supersedes never appears); the front then sorts, skips, limits, projects,
//! counts or runs the aggregation's later stages on what the router merged, as MongoDB would
//! (`crate::mql`).
//!
//! A `find` whose filter names one document (its tenant and `_id`) is the router's read of
//! that document, with the filter as its condition.

use bson::{doc, Bson, Document};
use futures::future::BoxFuture;

use super::routed::{all, engine, first_batch, query, route, Routed};
use super::{Command, Context, Reply};
use crate::front::cursors::{Open, Source};
use crate::front::plan::{self, DEFAULT_FIRST_BATCH};
use crate::protocol::{Operation, Outcome};
use crate::router::Terms;

/// The most documents one command on a routed collection merges in memory (an aggregation's
/// input, a `distinct`'s, the ids of a multi-document write).
pub const MAX_MERGED: usize = 1_000_000;

pub fn find<'a>(cx: &'a mut Context<'_>, command: &'a Command) -> BoxFuture<'a, Reply> {
    Box::pin(async move {
        let (router, collection, tenant_key) = match route(cx, command).await? {
            Routed::To {
                router,
                collection,
                tenant_key,
            } => (router, collection, tenant_key),
            Routed::Answered(reply) => return Ok(reply),
        };
        let engine = engine(cx)?;
        let plan = plan::find(&command.body, &tenant_key)?;
        let namespace = format!("{}.{collection}", command.database);
        let first = plan
            .batch_size
            .unwrap_or(DEFAULT_FIRST_BATCH)
            .min(plan.limit.unwrap_or(u64::MAX));
        if let Some((tenant, id)) = plan.pinned.one() {
            let terms = Terms {
                condition: Some(plan.filter.clone()),
                ..Terms::default()
            };
            let done = router
                .execute("get", tenant, id, Operation::Get, &terms)
                .await?;
            let found = match done.outcome {
                Outcome::Read(Some(d)) if plan.skip == 0 => Some(d),
                _ => None,
            };
            let batch: Vec<Document> = found
                .map(|d| match &plan.projection {
                    Some(p) => p.apply(&d),
                    None => d,
                })
                .into_iter()
                .collect();
            return Ok(super::routed::cursor_reply(batch, 0, &namespace, true));
        }
        let limit = plan.limit.map(|l| l + plan.skip);
        let q = query(
            plan.pinned.tenants.clone(),
            plan.filter.clone(),
            plan.sort.as_ref(),
            plan.projection.as_ref(),
            &tenant_key,
            limit,
        );
        let cursor = router.query(q).await?;
        let source = Source::routed(router, cursor, plan.skip, plan.limit, plan.projection);
        first_batch(
            engine,
            Open::new(namespace, source),
            first.max(1),
            plan.single_batch,
        )
        .await
    })
}

pub fn count<'a>(cx: &'a mut Context<'_>, command: &'a Command) -> BoxFuture<'a, Reply> {
    Box::pin(async move {
        let (router, tenant_key) = match route(cx, command).await? {
            Routed::To {
                router, tenant_key, ..
            } => (router, tenant_key),
            Routed::Answered(reply) => return Ok(reply),
        };
        let plan = plan::count(&command.body, &tenant_key)?;
        let limit = plan.limit.map(|l| l + plan.skip);
        let mut cursor = router
            .query(super::routed::ids_query(
                plan.pinned.tenants,
                plan.filter,
                &tenant_key,
                limit,
            ))
            .await?;
        let mut n: u64 = 0;
        loop {
            let batch = router.next_batch(&mut cursor, 1000).await?;
            n += batch.len() as u64;
            if batch.len() < 1000 || limit.is_some_and(|l| n >= l) {
                break;
            }
        }
        let mut counted = n.saturating_sub(plan.skip);
        if let Some(l) = plan.limit {
            counted = counted.min(l);
        }
        Ok(doc! { "n": counted as i64 })
    })
}

pub fn distinct<'a>(cx: &'a mut Context<'_>, command: &'a Command) -> BoxFuture<'a, Reply> {
    Box::pin(async move {
        let (router, tenant_key) = match route(cx, command).await? {
            Routed::To {
                router, tenant_key, ..
            } => (router, tenant_key),
            Routed::Answered(reply) => return Ok(reply),
        };
        let plan = plan::distinct(&command.body, &tenant_key)?;
        let top = plan.key.split('.').next().unwrap_or(&plan.key).to_owned();
        let mut q = query(
            plan.pinned.tenants,
            plan.filter,
            None,
            None,
            &tenant_key,
            None,
        );
        q.projection = Some(doc! { "_id": 1, tenant_key.clone(): 1, top: 1 });
        let mut cursor = router.query(q).await?;
        let docs = all(&router, &mut cursor, MAX_MERGED).await?;
        let mut values: Vec<Bson> = Vec::new();
        for doc in &docs {
            for v in distinct_values(doc, &plan.key) {
                if !values.iter().any(|seen| crate::mql::order::equal(seen, &v)) {
                    values.push(v);
                }
            }
        }
        values.sort_by(crate::mql::order::compare);
        Ok(doc! { "values": values })
    })
}

/// The values `distinct` takes from `doc` at `path`: through arrays of documents on the way,
/// and the elements of an array at its end (not the array itself), as MongoDB does.
fn distinct_values(doc: &Document, path: &str) -> Vec<Bson> {
    fn walk(value: &Bson, parts: &[&str], out: &mut Vec<Bson>) {
        match (value, parts.split_first()) {
            (Bson::Array(items), None) => out.extend(items.iter().cloned()),
            (v, None) => out.push(v.clone()),
            (Bson::Document(d), Some((part, rest))) => {
                if let Some(next) = d.get(*part) {
                    walk(next, rest, out);
                }
            }
            (Bson::Array(items), Some((part, rest))) => {
                if let Some(i) = crate::mql::path::element_index(part) {
                    if let Some(next) = items.get(i) {
                        walk(next, rest, out);
                    }
                }
                for item in items {
                    if let Bson::Document(_) = item {
                        walk(item, parts, out);
                    }
                }
            }
            _ => {}
        }
    }
    let mut out = Vec::new();
    walk(
        &Bson::Document(doc.clone()),
        &path.split('.').collect::<Vec<_>>(),
        &mut out,
    );
    out
}

pub fn aggregate<'a>(cx: &'a mut Context<'_>, command: &'a Command) -> BoxFuture<'a, Reply> {
    Box::pin(async move {
        // `aggregate: 1` runs on the database, not on a collection.
        if !matches!(command.value(), Bson::String(_)) {
            return super::passthrough::unknown(cx, command).await;
        }
        let (router, collection, tenant_key) = match route(cx, command).await? {
            Routed::To {
                router,
                collection,
                tenant_key,
            } => (router, collection, tenant_key),
            Routed::Answered(reply) => return Ok(reply),
        };
        let engine = engine(cx)?;
        let plan = plan::aggregate(&command.body, &tenant_key)?;
        let namespace = format!("{}.{collection}", command.database);
        let mut q = query(
            plan.pinned.tenants.clone(),
            plan.filter.clone(),
            None,
            None,
            &tenant_key,
            None,
        );
        if plan.counts_only {
            q.projection = Some(doc! { "_id": 1, tenant_key.clone(): 1 });
        }
        let mut cursor = router.query(q).await?;
        let source = if plan.stages.is_empty() {
            Source::routed(router, cursor, 0, None, None)
        } else {
            let docs = all(&router, &mut cursor, MAX_MERGED).await?;
            Source::Computed(plan.stages.run(docs)?.into())
        };
        let first = plan.batch_size.unwrap_or(DEFAULT_FIRST_BATCH).max(1);
        first_batch(engine, Open::new(namespace, source), first, false).await
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn distinct_takes_array_elements_and_walks_arrays_of_documents() {
        let doc =
            doc! {"tags": ["a", "b"], "items": [{"sku": 1}, {"sku": 2}, {"other": 3}], "n": 5};
        assert_eq!(
            distinct_values(&doc, "tags"),
            vec![Bson::from("a"), Bson::from("b")]
        );
        assert_eq!(
            distinct_values(&doc, "items.sku"),
            vec![Bson::from(1), Bson::from(2)]
        );
        assert_eq!(distinct_values(&doc, "n"), vec![Bson::from(5)]);
        assert!(distinct_values(&doc, "missing").is_empty());
    }
}

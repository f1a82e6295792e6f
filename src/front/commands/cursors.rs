//! `getMore` and `killCursors` of the cursors the front holds ([`crate::front::cursors`]): a
//! routed query's merge, a passthrough location's cursor, or documents the front computed.
//! A `killCursors` of cursors the front does not know reports them as not found, as `mongos`
//! does (with `ok: 1`: a driver closing a cursor ignores the outcome).

use bson::{doc, Bson};
use futures::future::BoxFuture;

use super::routed::{cursor_reply, next_batch, DEFAULT_MORE_BATCH};
use super::{Command, Context, Reply};
use crate::front::error::{CommandError, ErrorCode};

pub fn get_more<'a>(cx: &'a mut Context<'_>, command: &'a Command) -> BoxFuture<'a, Reply> {
    Box::pin(async move {
        let Bson::Int64(id) = command.value() else {
            return Err(CommandError::type_mismatch("getMore", "getMore", "long"));
        };
        let id = *id;
        let collection = match command.body.get("collection") {
            Some(Bson::String(c)) => c.clone(),
            Some(_) => {
                return Err(CommandError::type_mismatch(
                    "getMore",
                    "collection",
                    "string",
                ))
            }
            None => return Err(CommandError::missing_field("getMore", "collection")),
        };
        let n = match command.body.get("batchSize") {
            Some(Bson::Int32(n)) if *n > 0 => *n as u64,
            Some(Bson::Int64(n)) if *n > 0 => *n as u64,
            _ => DEFAULT_MORE_BATCH,
        };
        let not_found = || {
            CommandError::new(
                ErrorCode::CursorNotFound,
                format!("cursor id {id} not found"),
            )
        };
        let Some(engine) = cx.engine else {
            return Err(not_found());
        };
        let Some(open) = engine.cursors.get(id).await else {
            return Err(not_found());
        };
        let mut open = open.lock().await;
        let namespace = format!("{}.{collection}", command.database);
        let listing = open.namespace.contains(".$cmd.")
            && open
                .namespace
                .starts_with(&format!("{}.", command.database));
        if open.namespace != namespace && !listing {
            return Err(CommandError::new(
                ErrorCode::Unauthorized,
                format!(
                    "Requested getMore on namespace '{namespace}', but cursor belongs to a different \
                     namespace {}",
                    open.namespace
                ),
            ));
        }
        let result = next_batch(&mut open, n).await;
        let namespace = open.namespace.clone();
        drop(open);
        match result {
            Ok((batch, ended)) => {
                if ended {
                    engine.cursors.close(id);
                }
                Ok(cursor_reply(
                    batch,
                    if ended { 0 } else { id },
                    &namespace,
                    false,
                ))
            }
            Err(e) => {
                // A cursor that failed is closed, as MongoDB kills a cursor whose getMore failed.
                engine.cursors.close(id);
                Err(e)
            }
        }
    })
}

pub fn kill_cursors(cx: &mut Context<'_>, command: &Command) -> Reply {
    if !matches!(command.value(), Bson::String(_)) {
        return Err(CommandError::type_mismatch(
            "killCursors",
            "killCursors",
            "string",
        ));
    }
    let Ok(ids) = command.body.get_array("cursors") else {
        return Err(CommandError::type_mismatch(
            "killCursors",
            "cursors",
            "array",
        ));
    };
    if !ids.iter().all(|id| matches!(id, Bson::Int64(_))) {
        return Err(CommandError::type_mismatch(
            "killCursors",
            "cursors",
            "long",
        ));
    }
    let (mut killed, mut not_found) = (Vec::new(), Vec::new());
    for id in ids {
        let Bson::Int64(n) = id else { continue };
        if cx.engine.is_some_and(|e| e.cursors.close(*n)) {
            killed.push(id.clone());
        } else {
            not_found.push(id.clone());
        }
    }
    Ok(doc! {
        "cursorsKilled": killed,
        "cursorsNotFound": not_found,
        "cursorsAlive": [],
        "cursorsUnknown": [],
    })
}

#[cfg(test)]
mod tests {
    use crate::front::commands::tests::answer;
    use bson::doc;

    #[test]
    fn without_an_engine_no_cursor_exists_for_get_more() {
        assert_eq!(
            answer(doc! {"getMore": 42_i64, "collection": "orders", "$db": "shop"}),
            doc! {
                "ok": 0.0,
                "errmsg": "cursor id 42 not found",
                "code": 43,
                "codeName": "CursorNotFound",
            }
        );
        let reply = answer(doc! {"getMore": 42, "collection": "orders", "$db": "shop"});
        assert_eq!(reply.get_str("codeName"), Ok("TypeMismatch"));
    }

    #[test]
    fn a_kill_reports_every_unknown_cursor_as_not_found() {
        assert_eq!(
            answer(doc! {"killCursors": "orders", "cursors": [42_i64, 43_i64], "$db": "shop"}),
            doc! {
                "cursorsKilled": [],
                "cursorsNotFound": [42_i64, 43_i64],
                "cursorsAlive": [],
                "cursorsUnknown": [],
                "ok": 1.0,
            }
        );
        for wrong in [
            doc! {"killCursors": "orders", "$db": "shop"},
            doc! {"killCursors": "orders", "cursors": [42], "$db": "shop"},
            doc! {"killCursors": 1, "cursors": [], "$db": "shop"},
        ] {
            assert_eq!(answer(wrong).get_i32("code"), Ok(14));
        }
    }
}

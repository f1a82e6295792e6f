//! `getMore` and `killCursors`, until the front holds cursors: no cursor exists, so every
//! `getMore` is `CursorNotFound` (43), and `killCursors` reports every id as not found, as
//! `mongos` answers a kill of cursors it does not know (with `ok: 1`: a driver closing a
//! cursor ignores the outcome).

use bson::{doc, Bson};

use super::{Command, Context, Reply};
use crate::front::error::{CommandError, ErrorCode};

pub fn get_more(_: &mut Context<'_>, command: &Command) -> Reply {
    let Bson::Int64(id) = command.value() else {
        return Err(CommandError::type_mismatch("getMore", "getMore", "long"));
    };
    Err(CommandError::new(
        ErrorCode::CursorNotFound,
        format!("cursor id {id} not found"),
    ))
}

pub fn kill_cursors(_: &mut Context<'_>, command: &Command) -> Reply {
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
    Ok(doc! {
        "cursorsKilled": [],
        "cursorsNotFound": ids.clone(),
        "cursorsAlive": [],
        "cursorsUnknown": [],
    })
}

#[cfg(test)]
mod tests {
    use crate::front::commands::tests::answer;
    use bson::doc;

    #[test]
    fn no_cursor_exists_for_get_more() {
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
    fn a_kill_reports_every_cursor_as_not_found() {
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

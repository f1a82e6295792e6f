//! `endSessions`. The front holds no sessions (it does not advertise them: see
//! `Settings::logical_session_timeout_minutes`), so there is nothing to end; a driver that
//! created sessions anyway (a shell does on its own) is told they ended.

use bson::{Bson, Document};

use super::{Command, Context, Reply};
use crate::front::error::{CommandError, ErrorCode};

pub fn end_sessions(_: &mut Context<'_>, command: &Command) -> Reply {
    let Bson::Array(sessions) = command.value() else {
        return Err(CommandError::type_mismatch(
            "endSessions",
            "endSessions",
            "array",
        ));
    };
    if !sessions.iter().all(|s| matches!(s, Bson::Document(_))) {
        return Err(CommandError::type_mismatch(
            "endSessions",
            "endSessions",
            "object",
        ));
    }
    Ok(Document::new())
}

/// The front runs no transactions and no retryable writes: it advertises no sessions, so
/// drivers send neither; a command that carries a transaction's fields anyway is refused as a
/// standalone server refuses it.
pub fn refuse_transactions(command: &Command) -> Result<(), CommandError> {
    let transactional = ["txnNumber", "startTransaction", "autocommit"]
        .iter()
        .any(|f| command.body.contains_key(*f));
    if transactional {
        return Err(no_transaction_error());
    }
    Ok(())
}

fn no_transaction_error() -> CommandError {
    CommandError::new(
        ErrorCode::IllegalOperation,
        "Transaction numbers are only allowed on a replica set member or mongos: the reshard \
         front runs no transactions and no retryable writes (it advertises no sessions)",
    )
}

/// `commitTransaction` and `abortTransaction`: there is no transaction to end.
pub fn no_transactions(_: &mut Context<'_>, _: &Command) -> Reply {
    Err(no_transaction_error())
}

#[cfg(test)]
mod tests {
    use crate::front::commands::tests::answer;
    use bson::doc;

    #[test]
    fn ending_sessions_answers_ok_and_checks_the_list() {
        let sessions = doc! {"endSessions": [{"id": 1}], "$db": "admin"};
        assert_eq!(answer(sessions), doc! {"ok": 1.0});
        for wrong in [
            doc! {"endSessions": 1, "$db": "admin"},
            doc! {"endSessions": [1], "$db": "admin"},
        ] {
            assert_eq!(answer(wrong).get_i32("code"), Ok(14));
        }
    }
}

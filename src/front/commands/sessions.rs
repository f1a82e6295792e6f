//! `endSessions`. The front holds no sessions (it does not advertise them: see
//! `Settings::logical_session_timeout_minutes`), so there is nothing to end; a driver that
//! created sessions anyway (a shell does on its own) is told they ended.

use bson::{Bson, Document};

use super::{Command, Context, Reply};
use crate::front::error::CommandError;

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

//! The handshake: `hello`, and the legacy `isMaster` (`ismaster`) that drivers send first.
//! The front answers as a `mongos` does (`msg: "isdbgrid"`), so a driver treats it as one: a
//! writable router, never a replica set member to monitor or fail over between.
//!
//! Deliberately absent from the reply, and why:
//! - `topologyVersion`: without it drivers poll `hello` instead of streaming it (exhaust),
//!   and the front answers one request at a time.
//! - `logicalSessionTimeoutMinutes`: only when [`Settings::logical_session_timeout_minutes`]
//!   is set (see there: sessions bring retryable writes).
//! - `compression`: the front does not implement `OP_COMPRESSED`, so it names no compressor
//!   and drivers send uncompressed messages.
//! - `saslSupportedMechs` and `speculativeAuthenticate`: only when the front has users
//!   (`--users-file`; `super::auth::handshake`).
//!
//! [`Settings::logical_session_timeout_minutes`]: crate::front::Settings

use bson::{doc, Bson, DateTime};

use super::{Command, Context, Reply};
use crate::front::error::{CommandError, ErrorCode};
use crate::front::{MAX_BSON_OBJECT_SIZE, MAX_WIRE_VERSION, MAX_WRITE_BATCH_SIZE};

pub fn hello(context: &mut Context<'_>, command: &Command) -> Reply {
    answer(context, command, "isWritablePrimary")
}

pub fn is_master(context: &mut Context<'_>, command: &Command) -> Reply {
    answer(context, command, "ismaster")
}

/// The reply of either spelling; they differ only in the name of the primary flag.
fn answer(context: &mut Context<'_>, command: &Command, primary_field: &str) -> Reply {
    if let Some(client) = command.body.get("client") {
        let Bson::Document(client) = client else {
            return Err(CommandError::type_mismatch(
                &command.name,
                "client",
                "object",
            ));
        };
        // MongoDB keeps the metadata of a connection's first handshake and refuses a change:
        // logs and `currentOp` name the connection by it.
        if context.connection.client_metadata.is_some() {
            return Err(CommandError::new(
                ErrorCode::ClientMetadataCannotBeMutated,
                "The client metadata document may only be sent in the first hello",
            ));
        }
        context.connection.client_metadata = Some(client.clone());
    }
    let settings = context.settings;
    let max_message_size = i32::try_from(settings.limits.max_message_size).unwrap_or(i32::MAX);
    let mut reply = doc! {
        primary_field: true,
        "msg": "isdbgrid",
        "maxBsonObjectSize": MAX_BSON_OBJECT_SIZE,
        "maxMessageSizeBytes": max_message_size,
        "maxWriteBatchSize": MAX_WRITE_BATCH_SIZE,
        "localTime": DateTime::now(),
    };
    if let Some(minutes) = settings.logical_session_timeout_minutes {
        reply.insert("logicalSessionTimeoutMinutes", i64::from(minutes));
    }
    reply.insert("connectionId", number(context.connection.id));
    reply.insert("maxWireVersion", MAX_WIRE_VERSION);
    reply.insert("minWireVersion", 0);
    // A driver that asks `helloOk` in its legacy handshake switches to `hello` when told yes.
    if command.body.get_bool("helloOk") == Ok(true) {
        reply.insert("helloOk", true);
    }
    super::auth::handshake(context, command, &mut reply)?;
    Ok(reply)
}

/// A number as MongoDB appends it: a 32-bit integer while it fits.
fn number(n: i64) -> Bson {
    i32::try_from(n).map_or(Bson::Int64(n), Bson::Int32)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::front::commands::tests::{answer, answer_on, connection, msg};
    use crate::front::Settings;
    use bson::Document;

    /// The reply without `localTime`, which changes, after checking that it is a date.
    fn without_time(mut reply: Document) -> Document {
        assert!(
            matches!(reply.remove("localTime"), Some(Bson::DateTime(_))),
            "{reply}"
        );
        reply
    }

    #[test]
    fn hello_answers_as_a_mongos_7_0_without_sessions() {
        assert_eq!(
            without_time(answer(doc! {"hello": 1, "$db": "admin"})),
            doc! {
                "isWritablePrimary": true,
                "msg": "isdbgrid",
                "maxBsonObjectSize": 16_777_216,
                "maxMessageSizeBytes": 48_000_000,
                "maxWriteBatchSize": 100_000,
                "connectionId": 7,
                "maxWireVersion": 21,
                "minWireVersion": 0,
                "ok": 1.0,
            }
        );
    }

    #[test]
    fn the_legacy_spelling_answers_ismaster_and_hello_ok() {
        for name in ["isMaster", "ismaster"] {
            let reply = without_time(answer(doc! {name: 1, "helloOk": true, "$db": "admin"}));
            assert_eq!(reply.get_bool("ismaster"), Ok(true), "{name}");
            assert_eq!(reply.get_bool("helloOk"), Ok(true), "{name}");
            assert!(!reply.contains_key("isWritablePrimary"), "{name}");
        }
        let reply = answer(doc! {"isMaster": 1, "$db": "admin"});
        assert!(!reply.contains_key("helloOk"));
    }

    #[test]
    fn sessions_are_advertised_only_when_set() {
        let settings = Settings {
            logical_session_timeout_minutes: Some(30),
            ..Settings::default()
        };
        let reply = answer_on(
            &mut connection(),
            &settings,
            msg(doc! {"hello": 1, "$db": "admin"}),
        );
        assert_eq!(reply.get_i64("logicalSessionTimeoutMinutes"), Ok(30));
        // Nor compression, topology versions (streaming) or SASL mechanisms, asked or not.
        let reply = answer(doc! {
            "hello": 1,
            "$db": "admin",
            "compression": ["zstd", "snappy"],
            "saslSupportedMechs": "admin.user",
        });
        for absent in [
            "logicalSessionTimeoutMinutes",
            "compression",
            "topologyVersion",
            "saslSupportedMechs",
        ] {
            assert!(!reply.contains_key(absent), "{absent}: {reply}");
        }
    }

    #[test]
    fn client_metadata_is_kept_from_the_first_handshake_and_never_changed() {
        let mut connection = connection();
        let settings = Settings::default();
        let first =
            doc! {"isMaster": 1, "$db": "admin", "client": {"application": {"name": "orders"}}};
        let reply = answer_on(&mut connection, &settings, msg(first));
        assert_eq!(reply.get_f64("ok"), Ok(1.0));
        assert_eq!(
            connection.client_metadata,
            Some(doc! {"application": {"name": "orders"}})
        );
        // Later rounds without metadata are answered; a second metadata document is refused.
        let reply = answer_on(
            &mut connection,
            &settings,
            msg(doc! {"hello": 1, "$db": "admin"}),
        );
        assert_eq!(reply.get_f64("ok"), Ok(1.0));
        let again = doc! {"hello": 1, "$db": "admin", "client": {"application": {"name": "x"}}};
        let reply = answer_on(&mut connection, &settings, msg(again));
        assert_eq!(reply.get_i32("code"), Ok(186));
        assert_eq!(
            connection.client_metadata,
            Some(doc! {"application": {"name": "orders"}})
        );
        let wrong = doc! {"hello": 1, "$db": "admin", "client": "orders"};
        let reply = answer_on(
            &mut super::super::tests::connection(),
            &settings,
            msg(wrong),
        );
        assert_eq!(reply.get_str("codeName"), Ok("TypeMismatch"));
    }

    #[test]
    fn a_connection_id_beyond_32_bits_is_a_64_bit_integer() {
        assert_eq!(number(7), Bson::Int32(7));
        assert_eq!(number(1 << 40), Bson::Int64(1 << 40));
    }
}

//! Authentication's commands: `saslStart` and `saslContinue` (SCRAM-SHA-256 against the users
//! file), the handshake's part (`saslSupportedMechs`, `speculativeAuthenticate` in `hello`), and
//! the gate ([`admit`]) that refuses every other command on a connection that has not
//! authenticated while the front has users. The exchange itself is `front::auth`, pure; this
//! module parses the commands, draws the server's nonce, keeps the conversation on the
//! connection and logs (never a payload: the client-final message carries the proof).
//!
//! As MongoDB 7.0 answers:
//! - the conversation id is always 1; the payload is BinData (or a base64 string, answered
//!   in kind);
//! - a step that fails ends the conversation and answers `AuthenticationFailed` (18)
//!   "Authentication failed.", whatever the reason (an unknown user, a wrong password, a
//!   malformed message); the reason goes to the log;
//! - a mechanism other than SCRAM-SHA-256 is `MechanismUnavailable` (334), as on a server
//!   whose `authenticationMechanisms` is `SCRAM-SHA-256`;
//! - `saslContinue` without a conversation, or with another conversation id, is
//!   `ProtocolError` (17);
//! - `speculativeAuthenticate` (a `saslStart` inside the first `hello`, which modern drivers
//!   send to save a round trip) is answered in `hello`'s reply when its step succeeds, and
//!   left out otherwise, so the driver falls back to `saslStart`.
//!
//! Where the front departs from MongoDB: `saslSupportedMechs: "db.user"` is answered
//! `["SCRAM-SHA-256"]` for every well-formed name, whether or not the users file holds it
//! (MongoDB leaves the field out for an unknown user, and drivers then try SCRAM-SHA-1, which
//! the front does not speak: the client would get 334 about SCRAM-SHA-1 instead of 18). So an
//! unknown user fails with 18 as a wrong password does, and `hello` tells no one which users
//! exist (`saslStart` still does, as MongoDB's: it fails at once for an unknown user, at the
//! proof for a known one).

use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine as _;
use bson::spec::BinarySubtype;
use bson::{doc, Binary, Bson, Document};
use rand::RngCore;

use super::{Command, Connection, Context, Reply};
use crate::front::auth::{self, Conversation, Step, UserName};
use crate::front::error::{CommandError, ErrorCode};

/// The commands a connection may run before it authenticated: those MongoDB 7.0 marks
/// `requiresAuth() == false` among the front's. The handshake and the SASL conversation
/// (without them no one could authenticate), `ping` (load balancers and drivers' health
/// checks), `buildInfo` (tools ask it before they authenticate; it names only versions) and
/// `connectionStatus` (which says who is authenticated: no one). `logout` is not among the
/// front's commands (deprecated since MongoDB 5.0: a connection authenticates once; close
/// it instead), nor `authenticate` (X.509, which the front does not do).
pub const WITHOUT_AUTHENTICATION: &[&str] = &[
    "hello",
    "isMaster",
    "ismaster",
    "saslStart",
    "saslContinue",
    "ping",
    "buildInfo",
    "buildinfo",
    "connectionStatus",
];

/// The conversation id MongoDB gives every SASL conversation.
const CONVERSATION_ID: i32 = 1;

/// Whether `command` may run on this connection: always without users, else once the
/// connection authenticated or when the command is one of [`WITHOUT_AUTHENTICATION`].
pub(super) fn admit(context: &Context<'_>, command: &Command) -> Result<(), CommandError> {
    if context.settings.users.is_none()
        || context.connection.authentication.is_authenticated()
        || WITHOUT_AUTHENTICATION.contains(&command.name.as_str())
    {
        return Ok(());
    }
    Err(CommandError::new(
        ErrorCode::Unauthorized,
        format!("command {} requires authentication", command.name),
    ))
}

/// `connectionStatus`'s `authenticatedUsers`: the user the connection authenticated as.
pub(super) fn authenticated_users(connection: &Connection) -> Bson {
    Bson::Array(
        connection
            .authentication
            .user()
            .map(|user| Bson::Document(doc! {"user": &user.user, "db": &user.db}))
            .into_iter()
            .collect(),
    )
}

/// How the client sent its payload, which the reply's follows.
#[derive(Clone, Copy)]
enum PayloadForm {
    Binary,
    Base64,
}

fn payload(command: &str, body: &Document) -> Result<(Vec<u8>, PayloadForm), CommandError> {
    match body.get("payload") {
        Some(Bson::Binary(binary)) => Ok((binary.bytes.clone(), PayloadForm::Binary)),
        Some(Bson::String(text)) => BASE64
            .decode(text)
            .map(|bytes| (bytes, PayloadForm::Base64))
            .map_err(|_| CommandError::new(ErrorCode::BadValue, "Invalid base64 in the payload")),
        Some(_) => Err(CommandError::type_mismatch(command, "payload", "binData")),
        None => Err(CommandError::missing_field(command, "payload")),
    }
}

fn reply_payload(bytes: Vec<u8>, form: PayloadForm) -> Bson {
    match form {
        PayloadForm::Binary => Bson::Binary(Binary {
            subtype: BinarySubtype::Generic,
            bytes,
        }),
        PayloadForm::Base64 => Bson::String(BASE64.encode(bytes)),
    }
}

/// The server's nonce: [`auth::SERVER_NONCE_LEN`] random bytes in base64 (no comma).
fn server_nonce() -> String {
    let mut bytes = [0u8; auth::SERVER_NONCE_LEN];
    rand::rngs::OsRng.fill_bytes(&mut bytes);
    BASE64.encode(bytes)
}

/// What the client is told of any failed step.
fn authentication_failed() -> CommandError {
    CommandError::new(ErrorCode::AuthenticationFailed, "Authentication failed.")
}

/// Logs a failed step (at warn; a speculative one at debug, since the driver tries again with
/// `saslStart` and that attempt is logged) and answers it.
fn failed(
    context: &Context<'_>,
    user: Option<&UserName>,
    reason: &dyn std::fmt::Display,
    speculative: bool,
) -> CommandError {
    let user = user.map_or_else(|| "-".to_owned(), ToString::to_string);
    let connection = &*context.connection;
    if speculative {
        tracing::debug!(peer = %connection.peer, connection = connection.id, %user,
            mechanism = %auth::MECHANISM, %reason, "front: speculative authentication failed");
    } else {
        tracing::warn!(peer = %connection.peer, connection = connection.id, %user,
            mechanism = %auth::MECHANISM, %reason, "front: authentication failed");
    }
    authentication_failed()
}

pub fn sasl_start(context: &mut Context<'_>, command: &Command) -> Reply {
    start(
        context,
        "saslStart",
        &command.body,
        &command.database,
        false,
    )
}

/// A `saslStart`, sent as a command or inside `hello` (`speculative`).
fn start(
    context: &mut Context<'_>,
    name: &str,
    body: &Document,
    database: &str,
    speculative: bool,
) -> Reply {
    // A new conversation abandons the one under way, whatever becomes of it.
    context.connection.authentication.abandon();
    let mechanism = match body.get("mechanism") {
        Some(Bson::String(mechanism)) => mechanism,
        Some(_) => return Err(CommandError::type_mismatch(name, "mechanism", "string")),
        None => return Err(CommandError::missing_field(name, "mechanism")),
    };
    if mechanism != auth::MECHANISM {
        return Err(CommandError::new(
            ErrorCode::MechanismUnavailable,
            format!("Received authentication for mechanism {mechanism} which is not enabled"),
        ));
    }
    let (client_first, form) = payload(name, body)?;
    let skip_empty_exchange = match body.get("options") {
        None => false,
        Some(Bson::Document(options)) => match options.get("skipEmptyExchange") {
            None => false,
            Some(Bson::Boolean(skip)) => *skip,
            Some(_) => {
                return Err(CommandError::new(
                    ErrorCode::BadValue,
                    "skipEmptyExchange must be boolean",
                ))
            }
        },
        Some(_) => return Err(CommandError::type_mismatch(name, "options", "object")),
    };
    let Some(users) = context.settings.users.clone() else {
        return Err(failed(
            context,
            None,
            &"the front runs without --users-file: no one authenticates",
            speculative,
        ));
    };
    match Conversation::start(
        &users,
        database,
        &client_first,
        &server_nonce(),
        skip_empty_exchange,
    ) {
        Ok((conversation, server_first)) => {
            context.connection.authentication.begin(conversation);
            Ok(doc! {
                "conversationId": CONVERSATION_ID,
                "done": false,
                "payload": reply_payload(server_first, form),
            })
        }
        Err(rejected) => Err(failed(
            context,
            rejected.user.as_ref(),
            &rejected.reason,
            speculative,
        )),
    }
}

pub fn sasl_continue(context: &mut Context<'_>, command: &Command) -> Reply {
    let result = continue_conversation(context, command);
    if result.is_err() {
        // Any error ends the conversation, as in MongoDB.
        context.connection.authentication.abandon();
    }
    result
}

fn continue_conversation(context: &mut Context<'_>, command: &Command) -> Reply {
    if !context.connection.authentication.in_conversation() {
        return Err(CommandError::new(
            ErrorCode::ProtocolError,
            "No SASL session state found",
        ));
    }
    let id = match command.body.get("conversationId") {
        Some(Bson::Int32(id)) => i64::from(*id),
        Some(Bson::Int64(id)) => *id,
        Some(Bson::Double(id)) if id.fract() == 0.0 => *id as i64,
        Some(_) => {
            return Err(CommandError::type_mismatch(
                "saslContinue",
                "conversationId",
                "int",
            ))
        }
        None => {
            return Err(CommandError::missing_field(
                "saslContinue",
                "conversationId",
            ))
        }
    };
    if id != i64::from(CONVERSATION_ID) {
        return Err(CommandError::new(
            ErrorCode::ProtocolError,
            "sasl: Mismatched conversation id",
        ));
    }
    let (message, form) = payload("saslContinue", &command.body)?;
    match context.connection.authentication.step(&message) {
        Ok(Step::Continue(reply)) => Ok(doc! {
            "conversationId": CONVERSATION_ID,
            "done": false,
            "payload": reply_payload(reply, form),
        }),
        Ok(Step::Done { payload, user }) => {
            let connection = &*context.connection;
            tracing::debug!(peer = %connection.peer, connection = connection.id,
                user = %user, mechanism = %auth::MECHANISM, "front: authenticated");
            Ok(doc! {
                "conversationId": CONVERSATION_ID,
                "done": true,
                "payload": reply_payload(payload, form),
            })
        }
        Err(auth::ContinueError::NoConversation) => Err(CommandError::new(
            ErrorCode::ProtocolError,
            "No SASL session state found",
        )),
        Err(auth::ContinueError::Failed { user, reason }) => {
            Err(failed(context, Some(&user), &reason, false))
        }
    }
}

/// `hello`'s part when the front has users: `saslSupportedMechs` for the user the client names
/// (`"db.user"`), and the answer to a `speculativeAuthenticate`. Without users it adds nothing
/// (the front advertises no mechanism it does not ask for).
pub(super) fn handshake(
    context: &mut Context<'_>,
    command: &Command,
    reply: &mut Document,
) -> Result<(), CommandError> {
    if context.settings.users.is_none() {
        return Ok(());
    }
    if let Some(Bson::String(name)) = command.body.get("saslSupportedMechs") {
        if name.split_once('.').is_none() {
            return Err(CommandError::new(
                ErrorCode::BadValue,
                "UserName must contain a '.' separated database.user pair",
            ));
        }
        reply.insert("saslSupportedMechs", vec![auth::MECHANISM]);
    }
    if let Some(Bson::Document(speculative)) = command.body.get("speculativeAuthenticate") {
        // MongoDB reads the database of a speculative saslStart from its `db` field, and
        // ignores one without it; an error of any kind leaves the field out of the reply.
        let is_sasl_start = speculative.keys().next().map(String::as_str) == Some("saslStart");
        if let (true, Ok(database)) = (is_sasl_start, speculative.get_str("db")) {
            let database = database.to_owned();
            match start(context, "saslStart", speculative, &database, true) {
                Ok(answer) => {
                    reply.insert("speculativeAuthenticate", answer);
                }
                Err(error) => {
                    tracing::debug!(connection = context.connection.id, %error,
                        "front: speculative authentication not answered");
                }
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::front::auth::tests::{
        rfc_users, RFC_CLIENT_FINAL, RFC_CLIENT_FIRST, RFC_SERVER_FINAL,
    };
    use crate::front::commands::tests::{answer, answer_on, connection, msg};
    use crate::front::Settings;
    use std::sync::Arc;

    fn with_users() -> Settings {
        Settings {
            users: Some(Arc::new(rfc_users())),
            ..Settings::default()
        }
    }

    fn binary(bytes: &[u8]) -> Bson {
        Bson::Binary(Binary {
            subtype: BinarySubtype::Generic,
            bytes: bytes.to_vec(),
        })
    }

    fn payload_text(reply: &Document) -> String {
        match reply.get("payload") {
            Some(Bson::Binary(b)) => String::from_utf8(b.bytes.clone()).unwrap(),
            other => panic!("payload {other:?} in {reply}"),
        }
    }

    /// The RFC client's final message for the server-first `reply` names (its nonce is random,
    /// so the RFC's own final message does not apply): computed as a client does.
    fn client_final(server_first: &str, password: &str) -> String {
        use hmac::{Hmac, KeyInit, Mac};
        use sha2::{Digest, Sha256};
        let fields: Vec<&str> = server_first.split(',').collect();
        let nonce = fields[0].strip_prefix("r=").unwrap();
        let salt = BASE64
            .decode(fields[1].strip_prefix("s=").unwrap())
            .unwrap();
        let iterations: u32 = fields[2].strip_prefix("i=").unwrap().parse().unwrap();
        let mut salted = [0u8; 32];
        pbkdf2::pbkdf2::<Hmac<Sha256>>(password.as_bytes(), &salt, iterations, &mut salted)
            .unwrap();
        let mac = |key: &[u8], data: &[u8]| {
            let mut m = <Hmac<Sha256> as KeyInit>::new_from_slice(key).unwrap();
            m.update(data);
            m.finalize().into_bytes().to_vec()
        };
        let client_key = mac(&salted, b"Client Key");
        let stored_key = Sha256::digest(&client_key);
        let without_proof = format!("c=biws,r={nonce}");
        let auth_message = format!(
            "{},{server_first},{without_proof}",
            RFC_CLIENT_FIRST.strip_prefix("n,,").unwrap()
        );
        let signature = mac(&stored_key, auth_message.as_bytes());
        let proof: Vec<u8> = client_key
            .iter()
            .zip(&signature)
            .map(|(a, b)| a ^ b)
            .collect();
        format!("{without_proof},p={}", BASE64.encode(proof))
    }

    fn sasl_start_command(options: Document) -> Document {
        doc! {
            "saslStart": 1,
            "mechanism": "SCRAM-SHA-256",
            "payload": binary(RFC_CLIENT_FIRST.as_bytes()),
            "options": options,
            "$db": "admin",
        }
    }

    #[test]
    fn an_unauthenticated_connection_is_refused_all_but_the_handshake_and_a_few_diagnostics() {
        let settings = with_users();
        let mut conn = connection();
        for name in [
            "getCmdLineOpts",
            "hostInfo",
            "getParameter",
            "whatsmyuri",
            "endSessions",
        ] {
            let reply = answer_on(&mut conn, &settings, msg(doc! {name: 1, "$db": "admin"}));
            assert_eq!(
                reply,
                doc! {
                    "ok": 0.0,
                    "errmsg": format!("command {name} requires authentication"),
                    "code": 13,
                    "codeName": "Unauthorized",
                }
            );
        }
        for name in [
            "ping",
            "buildInfo",
            "buildinfo",
            "hello",
            "isMaster",
            "connectionStatus",
        ] {
            let reply = answer_on(&mut conn, &settings, msg(doc! {name: 1, "$db": "admin"}));
            assert_eq!(reply.get_f64("ok"), Ok(1.0), "{name}: {reply}");
        }
        // An unknown command is not found, authenticated or not, as in MongoDB.
        let reply = answer_on(
            &mut conn,
            &settings,
            msg(doc! {"logout": 1, "$db": "admin"}),
        );
        assert_eq!(reply.get_i32("code"), Ok(59));
        // Without users nothing is refused.
        let reply = answer(doc! {"getCmdLineOpts": 1, "$db": "admin"});
        assert_eq!(reply.get_f64("ok"), Ok(1.0));
    }

    #[test]
    fn a_sasl_conversation_authenticates_the_connection_and_only_it() {
        let settings = with_users();
        let mut conn = connection();
        let reply = answer_on(&mut conn, &settings, msg(sasl_start_command(doc! {})));
        assert_eq!(reply.get_i32("conversationId"), Ok(1), "{reply}");
        assert_eq!(reply.get_bool("done"), Ok(false));
        let server_first = payload_text(&reply);
        assert!(
            server_first.starts_with("r=rOprNGfwEbeRWgbNEkqO"),
            "{server_first}"
        );
        assert!(server_first.ends_with(",s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096"));
        // 24 random bytes, 32 base64 characters, follow the client's nonce.
        assert_eq!(
            server_first.split(',').next().unwrap().len(),
            "r=rOprNGfwEbeRWgbNEkqO".len() + 32
        );

        let final_message = client_final(&server_first, "pencil");
        let continue_with = |payload: &[u8]| {
            msg(
                doc! {"saslContinue": 1, "conversationId": 1, "payload": binary(payload), "$db": "admin"},
            )
        };
        let reply = answer_on(
            &mut conn,
            &settings,
            continue_with(final_message.as_bytes()),
        );
        assert_eq!(reply.get_bool("done"), Ok(false), "{reply}");
        assert!(payload_text(&reply).starts_with("v="));
        assert!(!conn.authentication.is_authenticated());
        let reply = answer_on(&mut conn, &settings, continue_with(b""));
        assert_eq!(
            reply,
            doc! {"conversationId": 1, "done": true, "payload": binary(b""), "ok": 1.0}
        );
        assert_eq!(
            conn.authentication.user(),
            Some(&UserName::new("user", "admin"))
        );

        let reply = answer_on(
            &mut conn,
            &settings,
            msg(doc! {"getCmdLineOpts": 1, "$db": "admin"}),
        );
        assert_eq!(reply.get_f64("ok"), Ok(1.0), "{reply}");
        let reply = answer_on(
            &mut conn,
            &settings,
            msg(doc! {"connectionStatus": 1, "$db": "admin"}),
        );
        assert_eq!(
            reply
                .get_document("authInfo")
                .unwrap()
                .get_array("authenticatedUsers")
                .unwrap(),
            &vec![Bson::Document(doc! {"user": "user", "db": "admin"})]
        );
        // Another connection is not authenticated.
        let reply = answer_on(
            &mut connection(),
            &settings,
            msg(doc! {"getCmdLineOpts": 1, "$db": "admin"}),
        );
        assert_eq!(reply.get_i32("code"), Ok(13));
    }

    #[test]
    fn skip_empty_exchange_ends_the_conversation_with_the_server_signature() {
        let settings = with_users();
        let mut conn = connection();
        let reply = answer_on(
            &mut conn,
            &settings,
            msg(sasl_start_command(doc! {"skipEmptyExchange": true})),
        );
        let final_message = client_final(&payload_text(&reply), "pencil");
        let reply = answer_on(
            &mut conn,
            &settings,
            msg(
                doc! {"saslContinue": 1, "conversationId": 1, "payload": binary(final_message.as_bytes()), "$db": "admin"},
            ),
        );
        assert_eq!(reply.get_bool("done"), Ok(true), "{reply}");
        assert!(payload_text(&reply).starts_with("v="));
        assert!(conn.authentication.is_authenticated());
    }

    #[test]
    fn a_wrong_password_fails_as_mongodb_words_it_and_ends_the_conversation() {
        let settings = with_users();
        let mut conn = connection();
        let reply = answer_on(&mut conn, &settings, msg(sasl_start_command(doc! {})));
        let final_message = client_final(&payload_text(&reply), "pencils");
        let continue_with = |payload: &[u8]| {
            msg(
                doc! {"saslContinue": 1, "conversationId": 1, "payload": binary(payload), "$db": "admin"},
            )
        };
        let reply = answer_on(
            &mut conn,
            &settings,
            continue_with(final_message.as_bytes()),
        );
        assert_eq!(
            reply,
            doc! {
                "ok": 0.0,
                "errmsg": "Authentication failed.",
                "code": 18,
                "codeName": "AuthenticationFailed",
            }
        );
        assert!(!conn.authentication.is_authenticated());
        let reply = answer_on(&mut conn, &settings, continue_with(b""));
        assert_eq!(
            reply.get_i32("code"),
            Ok(17),
            "the conversation ended: {reply}"
        );
        assert_eq!(reply.get_str("errmsg"), Ok("No SASL session state found"));
    }

    #[test]
    fn an_unknown_user_or_database_fails_as_a_wrong_password_does() {
        let settings = with_users();
        for (payload, database) in [
            ("n,,n=nobody,r=abcdef", "admin"),
            (RFC_CLIENT_FIRST, "shop"),
            ("garbage", "admin"),
        ] {
            let reply = answer_on(
                &mut connection(),
                &settings,
                msg(doc! {"saslStart": 1, "mechanism": "SCRAM-SHA-256",
                "payload": binary(payload.as_bytes()), "$db": database}),
            );
            assert_eq!(reply.get_i32("code"), Ok(18), "{payload}: {reply}");
            assert_eq!(reply.get_str("errmsg"), Ok("Authentication failed."));
        }
        // Without a users file no one authenticates.
        let reply = answer(sasl_start_command(doc! {}));
        assert_eq!(reply.get_i32("code"), Ok(18), "{reply}");
    }

    #[test]
    fn sasl_commands_are_checked_as_mongodb_checks_them() {
        let settings = with_users();
        let start = |body: Document| answer_on(&mut connection(), &settings, msg(body));
        let reply = start(
            doc! {"saslStart": 1, "mechanism": "SCRAM-SHA-1", "payload": binary(b"n,,n=user,r=abcd"), "$db": "admin"},
        );
        assert_eq!(reply.get_str("codeName"), Ok("MechanismUnavailable"));
        assert_eq!(
            reply.get_str("errmsg"),
            Ok("Received authentication for mechanism SCRAM-SHA-1 which is not enabled")
        );
        let reply = start(doc! {"saslStart": 1, "payload": binary(b""), "$db": "admin"});
        assert_eq!(
            reply.get_str("errmsg"),
            Ok("BSON field 'saslStart.mechanism' is missing but a required field")
        );
        assert_eq!(reply.get_i32("code"), Ok(40414));
        let reply = start(
            doc! {"saslStart": 1, "mechanism": "SCRAM-SHA-256", "payload": 5, "$db": "admin"},
        );
        assert_eq!(reply.get_str("codeName"), Ok("TypeMismatch"));
        let reply = start(sasl_start_command(doc! {"skipEmptyExchange": 1}));
        assert_eq!(
            reply.get_str("errmsg"),
            Ok("skipEmptyExchange must be boolean")
        );

        let mut conn = connection();
        let reply = answer_on(
            &mut conn,
            &settings,
            msg(
                doc! {"saslContinue": 1, "conversationId": 1, "payload": binary(b""), "$db": "admin"},
            ),
        );
        assert_eq!(reply.get_str("codeName"), Ok("ProtocolError"), "{reply}");
        answer_on(&mut conn, &settings, msg(sasl_start_command(doc! {})));
        let reply = answer_on(
            &mut conn,
            &settings,
            msg(
                doc! {"saslContinue": 1, "conversationId": 2, "payload": binary(b""), "$db": "admin"},
            ),
        );
        assert_eq!(
            reply.get_str("errmsg"),
            Ok("sasl: Mismatched conversation id")
        );
        assert!(
            !conn.authentication.in_conversation(),
            "an error ends the conversation"
        );
    }

    #[test]
    fn a_base64_string_payload_is_answered_in_kind() {
        let settings = with_users();
        let reply = answer_on(
            &mut connection(),
            &settings,
            msg(doc! {"saslStart": 1, "mechanism": "SCRAM-SHA-256",
            "payload": BASE64.encode(RFC_CLIENT_FIRST), "$db": "admin"}),
        );
        let payload = BASE64.decode(reply.get_str("payload").unwrap()).unwrap();
        assert!(String::from_utf8(payload)
            .unwrap()
            .starts_with("r=rOprNGfwEbeRWgbNEkqO"));
    }

    #[test]
    fn hello_advertises_scram_sha_256_and_answers_a_speculative_sasl_start() {
        let settings = with_users();
        let mut conn = connection();
        let reply = answer_on(
            &mut conn,
            &settings,
            msg(doc! {
                "hello": 1,
                "$db": "admin",
                "saslSupportedMechs": "admin.user",
                "speculativeAuthenticate": {
                    "saslStart": 1,
                    "mechanism": "SCRAM-SHA-256",
                    "payload": binary(RFC_CLIENT_FIRST.as_bytes()),
                    "options": {"skipEmptyExchange": true},
                    "db": "admin",
                },
            }),
        );
        assert_eq!(
            reply.get_array("saslSupportedMechs").unwrap(),
            &vec![Bson::from("SCRAM-SHA-256")]
        );
        let speculative = reply.get_document("speculativeAuthenticate").unwrap();
        assert_eq!(speculative.get_i32("conversationId"), Ok(1));
        assert_eq!(speculative.get_bool("done"), Ok(false));
        let final_message = client_final(&payload_text(speculative), "pencil");
        let reply = answer_on(
            &mut conn,
            &settings,
            msg(
                doc! {"saslContinue": 1, "conversationId": 1, "payload": binary(final_message.as_bytes()), "$db": "admin"},
            ),
        );
        assert_eq!(reply.get_bool("done"), Ok(true), "{reply}");
        assert!(conn.authentication.is_authenticated());

        // An unknown user is advertised the mechanism too; a speculative step that fails is
        // left out, and hello still answers.
        let reply = answer_on(
            &mut connection(),
            &settings,
            msg(doc! {
                "hello": 1,
                "$db": "admin",
                "saslSupportedMechs": "admin.nobody",
                "speculativeAuthenticate": {"saslStart": 1, "mechanism": "SCRAM-SHA-256",
                    "payload": binary(b"n,,n=nobody,r=abcd"), "db": "admin"},
            }),
        );
        assert_eq!(reply.get_f64("ok"), Ok(1.0));
        assert_eq!(reply.get_array("saslSupportedMechs").unwrap().len(), 1);
        assert!(!reply.contains_key("speculativeAuthenticate"), "{reply}");
        let reply = answer_on(
            &mut connection(),
            &settings,
            msg(doc! {"hello": 1, "$db": "admin", "saslSupportedMechs": "nodot"}),
        );
        assert_eq!(
            reply.get_str("errmsg"),
            Ok("UserName must contain a '.' separated database.user pair")
        );
        // Without users, neither is answered.
        let reply = answer(doc! {
            "hello": 1, "$db": "admin", "saslSupportedMechs": "admin.user",
            "speculativeAuthenticate": {"saslStart": 1, "mechanism": "SCRAM-SHA-256",
                "payload": binary(RFC_CLIENT_FIRST.as_bytes()), "db": "admin"},
        });
        assert!(!reply.contains_key("saslSupportedMechs"));
        assert!(!reply.contains_key("speculativeAuthenticate"));
    }

    #[test]
    fn the_rfc_exchange_runs_through_the_commands() {
        // The RFC's final message needs the RFC's server nonce, which the handler draws at
        // random; the conversation itself is tested with it in `front::auth`. Here: the RFC's
        // server-final is what a conversation started by the command would answer, given
        // the RFC's nonce.
        let (mut conversation, _) = Conversation::start(
            &rfc_users(),
            "admin",
            RFC_CLIENT_FIRST.as_bytes(),
            crate::front::auth::tests::RFC_SERVER_NONCE,
            true,
        )
        .unwrap();
        let mut conn = connection();
        conn.authentication.begin(conversation.clone());
        let reply = answer_on(
            &mut conn,
            &with_users(),
            msg(
                doc! {"saslContinue": 1, "conversationId": 1, "payload": binary(RFC_CLIENT_FINAL.as_bytes()), "$db": "admin"},
            ),
        );
        assert_eq!(payload_text(&reply), RFC_SERVER_FINAL);
        assert!(matches!(
            conversation.step(RFC_CLIENT_FINAL.as_bytes()),
            Ok(Step::Done { .. })
        ));
    }
}

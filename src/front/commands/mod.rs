//! Dispatch: one table ([`COMMANDS`]) from command name to one handler, and the handlers.
//!
//! Command names are case-sensitive, as MongoDB treats them; the legacy spellings MongoDB
//! also accepts (`ismaster`, `buildinfo`) are rows of their own. A handler gets the parsed
//! [`Command`] and a [`Context`] (the front's settings, the connection it came on) and returns
//! the reply document or a [`CommandError`]; dispatch adds `ok: 1` to a reply, and an error
//! leaves as `{ok: 0, errmsg, code, codeName}`.
//!
//! To add a command: write its handler in the module of its kind (one of those below, or a
//! new one), and add its row to [`COMMANDS`]. A handler that answers from what the front
//! knows is [`Handler::Sync`]; one that waits on I/O (the routed commands, through the router's
//! engine) is [`Handler::Async`]. When the front has users, a new command runs only on an
//! authenticated connection unless it is listed in [`auth::WITHOUT_AUTHENTICATION`].

pub mod auth;
mod catalog;
mod cursors;
mod diagnostics;
mod handshake;
mod modify;
mod passthrough;
mod read;
pub(crate) mod routed;
mod sessions;
mod write;

use std::collections::HashMap;
use std::net::SocketAddr;

use bson::{Bson, Document};
use futures::future::BoxFuture;

use super::error::{CommandError, ErrorCode};
use super::wire::{Request, RequestForm};
use super::Settings;

/// A command as a handler sees it.
#[derive(Clone, Debug, PartialEq)]
pub struct Command {
    /// The command's name, its first key, as the client spelled it.
    pub name: String,
    /// The database the command runs on (`$db`).
    pub database: String,
    /// The whole command document: the command's own field first, then its arguments and
    /// the generic ones (`$db`, `lsid`, `$readPreference`, `comment`, ...). An `OP_MSG`'s
    /// document sequences are array fields of it.
    pub body: Document,
}

impl Command {
    /// The value of the command's own field (`1` in `{ping: 1}`, the collection in
    /// `{find: "orders"}`).
    pub fn value(&self) -> &Bson {
        // The name is the body's first key, so the field is there.
        self.body.get(&self.name).unwrap_or(&Bson::Null)
    }
}

/// What the front knows of one client connection.
#[derive(Clone, Debug, PartialEq)]
pub struct Connection {
    /// This process's number for the connection, as `hello` reports it (`connectionId`).
    pub id: i64,
    pub peer: SocketAddr,
    /// The address the client reached.
    pub local: SocketAddr,
    /// The `client` document of the connection's first `hello` (driver, application name).
    pub client_metadata: Option<Document>,
    /// Whom the connection authenticated as, and the SASL conversation under way.
    pub authentication: crate::front::auth::Authentication,
}

/// What a handler may use besides its command.
pub struct Context<'a> {
    pub settings: &'a Settings,
    pub connection: &'a mut Connection,
    /// What the routed commands run on; `None` for a front without a state store, which
    /// answers the handshake and diagnostics only.
    pub engine: Option<&'a crate::front::engine::Engine>,
}

/// A handler's answer: the reply document (without `ok`) or a MongoDB error.
pub type Reply = Result<Document, CommandError>;

/// A command's handler.
#[derive(Clone, Copy)]
pub enum Handler {
    /// Answers from what the front knows, without waiting on anything.
    Sync(fn(&mut Context<'_>, &Command) -> Reply),
    /// Waits on I/O (a shard, the state store) before it answers.
    Async(for<'a, 'b> fn(&'a mut Context<'b>, &'a Command) -> BoxFuture<'a, Reply>),
}

/// One row of the dispatch table.
#[derive(Clone, Copy)]
pub struct Spec {
    pub name: &'static str,
    pub handler: Handler,
    /// Whether the command is also answered over the legacy `OP_QUERY`. MongoDB answers only
    /// the handshake there since 5.1; every other command over it is refused with
    /// `UnsupportedOpQueryCommand`.
    pub handshake: bool,
}

impl Spec {
    pub const fn sync(
        name: &'static str,
        handler: fn(&mut Context<'_>, &Command) -> Reply,
    ) -> Self {
        Spec {
            name,
            handler: Handler::Sync(handler),
            handshake: false,
        }
    }

    pub const fn handshake(
        name: &'static str,
        handler: fn(&mut Context<'_>, &Command) -> Reply,
    ) -> Self {
        Spec {
            name,
            handler: Handler::Sync(handler),
            handshake: true,
        }
    }

    pub const fn asynchronous(
        name: &'static str,
        handler: for<'a, 'b> fn(&'a mut Context<'b>, &'a Command) -> BoxFuture<'a, Reply>,
    ) -> Self {
        Spec {
            name,
            handler: Handler::Async(handler),
            handshake: false,
        }
    }
}

/// Every command the front answers.
pub const COMMANDS: &[Spec] = &[
    // The handshake: drivers send it first, over OP_QUERY or OP_MSG, and on every monitoring
    // round.
    Spec::handshake("hello", handshake::hello),
    Spec::handshake("isMaster", handshake::is_master),
    Spec::handshake("ismaster", handshake::is_master),
    // What drivers and shells ask about the server.
    Spec::sync("ping", diagnostics::ping),
    Spec::sync("buildInfo", diagnostics::build_info),
    Spec::sync("buildinfo", diagnostics::build_info),
    Spec::sync("getParameter", diagnostics::get_parameter),
    Spec::sync("getLog", diagnostics::get_log),
    Spec::sync("hostInfo", diagnostics::host_info),
    Spec::sync("getCmdLineOpts", diagnostics::get_cmd_line_opts),
    Spec::sync("whatsmyuri", diagnostics::whatsmyuri),
    Spec::sync("connectionStatus", diagnostics::connection_status),
    // Authentication (SCRAM-SHA-256, users from `--users-file`; see `auth::admit` for what
    // runs before it).
    Spec::sync("saslStart", auth::sasl_start),
    Spec::sync("saslContinue", auth::sasl_continue),
    // Sessions, which the front does not hold; transactions, which it does not run.
    Spec::sync("endSessions", sessions::end_sessions),
    Spec::sync("commitTransaction", sessions::no_transactions),
    Spec::sync("abortTransaction", sessions::no_transactions),
    // Cursors the front holds: a routed query's, a passthrough location's, its own.
    Spec::asynchronous("getMore", cursors::get_more),
    Spec::sync("killCursors", cursors::kill_cursors),
    // CRUD on a routed collection, through its router; on any other, to the passthrough.
    Spec::asynchronous("insert", write::insert),
    Spec::asynchronous("update", write::update),
    Spec::asynchronous("delete", write::delete),
    Spec::asynchronous("findAndModify", modify::find_and_modify),
    Spec::asynchronous("findandmodify", modify::find_and_modify),
    Spec::asynchronous("find", read::find),
    Spec::asynchronous("count", read::count),
    Spec::asynchronous("distinct", read::distinct),
    Spec::asynchronous("aggregate", read::aggregate),
    // Databases, collections and indexes.
    Spec::asynchronous("listDatabases", catalog::list_databases),
    Spec::asynchronous("listCollections", catalog::list_collections),
    Spec::asynchronous("listIndexes", catalog::list_indexes),
    Spec::asynchronous("createIndexes", catalog::create_indexes),
    Spec::asynchronous("dropIndexes", catalog::drop_indexes),
    Spec::asynchronous("deleteIndexes", catalog::drop_indexes),
    Spec::asynchronous("drop", catalog::collection_command),
    Spec::asynchronous("create", catalog::collection_command),
];

/// The dispatch table, by name.
pub struct Dispatch {
    by_name: HashMap<&'static str, &'static Spec>,
}

impl Dispatch {
    /// The table of [`COMMANDS`].
    pub fn standard() -> Dispatch {
        Dispatch::new(COMMANDS)
    }

    /// A table of `specs`. Two rows of one name are a programming error, caught by the tests
    /// of [`COMMANDS`].
    pub fn new(specs: &'static [Spec]) -> Dispatch {
        let mut by_name = HashMap::with_capacity(specs.len());
        for spec in specs {
            let earlier = by_name.insert(spec.name, spec);
            assert!(earlier.is_none(), "two handlers for {:?}", spec.name);
        }
        Dispatch { by_name }
    }

    /// The names the table answers.
    pub fn names(&self) -> impl Iterator<Item = &'static str> + '_ {
        self.by_name.keys().copied()
    }

    /// Answers one request: the reply document, `ok: 1` or a MongoDB error. Whether it is
    /// sent is the server's decision (a `moreToCome` request gets none).
    pub async fn answer(&self, context: &mut Context<'_>, request: &Request) -> Document {
        let passthrough = context.engine.is_some_and(|e| e.passthrough().is_some());
        let admitted = self.route(request).and_then(|(spec, command)| {
            // A command no handler answers is the passthrough's, when there is one.
            if spec.is_none() && !passthrough {
                return Err(CommandError::command_not_found(&command.name));
            }
            auth::admit(context, &command)?;
            sessions::refuse_transactions(&command)?;
            Ok((spec, command))
        });
        let reply = match admitted {
            Ok((Some(spec), command)) => match spec.handler {
                Handler::Sync(handler) => handler(context, &command),
                Handler::Async(handler) => handler(context, &command).await,
            },
            Ok((None, command)) => passthrough::unknown(context, &command).await,
            Err(error) => Err(error),
        };
        match reply {
            Ok(mut document) => {
                if !document.contains_key("ok") {
                    document.insert("ok", 1.0);
                }
                document
            }
            Err(error) => error.to_document(),
        }
    }

    /// The handler of a request (`None`: no handler answers the command it names) and the
    /// command it gets, or why the request is refused before any handler runs: it names no
    /// command, has no database, or came over `OP_QUERY` and is not the handshake.
    fn route(&self, request: &Request) -> Result<(Option<&'static Spec>, Command), CommandError> {
        let name = request.command_name().unwrap_or_default();
        let database = match request.command.get("$db") {
            Some(Bson::String(database)) if !database.is_empty() => database.clone(),
            Some(Bson::String(_)) => {
                return Err(CommandError::new(
                    ErrorCode::InvalidNamespace,
                    "Invalid database name: ''",
                ))
            }
            Some(_) => return Err(CommandError::type_mismatch(name, "$db", "string")),
            None => {
                return Err(CommandError::new(
                    ErrorCode::Location40571,
                    "OP_MSG requests require a $db argument",
                ))
            }
        };
        let spec = self.by_name.get(name).copied();
        if name.is_empty() || (spec.is_none() && matches!(request.form, RequestForm::Query { .. }))
        {
            return Err(CommandError::command_not_found(name));
        }
        if matches!(request.form, RequestForm::Query { .. }) && spec.is_some_and(|s| !s.handshake) {
            return Err(CommandError::new(
                ErrorCode::UnsupportedOpQueryCommand,
                format!(
                    "Unsupported OP_QUERY command: {name}. The client driver may require an \
                     upgrade. For more details see \
                     https://dochub.mongodb.org/core/legacy-opcode-removal"
                ),
            ));
        }
        Ok((
            spec,
            Command {
                name: name.to_owned(),
                database,
                body: request.command.clone(),
            },
        ))
    }
}

/// Whether a field of a command is one of MongoDB's generic arguments, which any command may
/// carry and which are not the command's own options.
pub(crate) fn is_generic_argument(field: &str) -> bool {
    field.starts_with('$')
        || matches!(
            field,
            "lsid"
                | "txnNumber"
                | "autocommit"
                | "startTransaction"
                | "comment"
                | "maxTimeMS"
                | "readConcern"
                | "writeConcern"
                | "apiVersion"
                | "apiStrict"
                | "apiDeprecationErrors"
        )
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::front::wire::MsgFlags;
    use bson::doc;

    pub(crate) fn connection() -> Connection {
        Connection {
            id: 7,
            peer: "127.0.0.1:50000".parse().unwrap(),
            local: "127.0.0.1:27018".parse().unwrap(),
            client_metadata: None,
            authentication: Default::default(),
        }
    }

    pub(crate) fn msg(command: Document) -> Request {
        Request {
            request_id: 1,
            command,
            form: RequestForm::Msg { flags: MsgFlags(0) },
        }
    }

    /// The reply of the standard table to `command` sent as an OP_MSG.
    pub(crate) fn answer(command: Document) -> Document {
        answer_on(&mut connection(), &Settings::default(), msg(command))
    }

    pub(crate) fn answer_on(
        connection: &mut Connection,
        settings: &Settings,
        request: Request,
    ) -> Document {
        let mut context = Context {
            settings,
            connection,
            engine: None,
        };
        futures::executor::block_on(Dispatch::standard().answer(&mut context, &request))
    }

    #[test]
    fn the_table_has_one_handler_per_name_and_the_legacy_spellings() {
        let dispatch = Dispatch::standard();
        let names: std::collections::BTreeSet<&str> = dispatch.names().collect();
        assert_eq!(names.len(), COMMANDS.len());
        for name in ["hello", "isMaster", "ismaster", "buildInfo", "buildinfo"] {
            assert!(names.contains(name), "{name}");
        }
    }

    #[test]
    fn an_unknown_command_is_command_not_found_as_mongodb_words_it() {
        assert_eq!(
            answer(doc! {"frobnicate": 1, "$db": "admin"}),
            doc! {
                "ok": 0.0,
                "errmsg": "no such command: 'frobnicate'",
                "code": 59,
                "codeName": "CommandNotFound",
            }
        );
    }

    #[test]
    fn command_names_are_case_sensitive_but_for_the_legacy_spellings() {
        for name in ["PING", "Ping", "HELLO", "isMASTER", "BuildInfo"] {
            let reply = answer(doc! {name: 1, "$db": "admin"});
            assert_eq!(reply.get_i32("code"), Ok(59), "{name}: {reply}");
        }
        for name in ["ismaster", "isMaster", "buildinfo", "buildInfo"] {
            let reply = answer(doc! {name: 1, "$db": "admin"});
            assert_eq!(reply.get_f64("ok"), Ok(1.0), "{name}: {reply}");
        }
    }

    #[test]
    fn a_request_without_a_command_or_a_database_is_refused() {
        assert_eq!(answer(doc! {}).get_str("codeName"), Ok("Location40571"));
        assert_eq!(
            answer(doc! {"$db": "admin"}).get_str("errmsg"),
            Ok("no such command: '$db'")
        );
        assert_eq!(answer(doc! {"ping": 1}).get_i32("code"), Ok(40571));
        assert_eq!(
            answer(doc! {"ping": 1, "$db": 3}).get_str("codeName"),
            Ok("TypeMismatch")
        );
        assert_eq!(
            answer(doc! {"ping": 1, "$db": ""}).get_str("codeName"),
            Ok("InvalidNamespace")
        );
    }

    #[test]
    fn over_op_query_only_the_handshake_is_answered() {
        let legacy = |command: Document| Request {
            request_id: 1,
            command,
            form: RequestForm::Query {
                full_collection_name: "admin.$cmd".into(),
            },
        };
        let settings = Settings::default();
        let reply = answer_on(
            &mut connection(),
            &settings,
            legacy(doc! {"isMaster": 1, "$db": "admin"}),
        );
        assert_eq!(reply.get_bool("ismaster"), Ok(true));
        let reply = answer_on(
            &mut connection(),
            &settings,
            legacy(doc! {"ping": 1, "$db": "admin"}),
        );
        assert_eq!(reply.get_i32("code"), Ok(352));
        assert_eq!(reply.get_str("codeName"), Ok("UnsupportedOpQueryCommand"));
    }

    fn slow_echo<'a>(context: &'a mut Context<'_>, command: &'a Command) -> BoxFuture<'a, Reply> {
        Box::pin(async move {
            tokio::task::yield_now().await;
            Ok(doc! {"echo": command.value().clone(), "connection": context.connection.id})
        })
    }

    fn refuse(_: &mut Context<'_>, _: &Command) -> Reply {
        Err(CommandError::new(ErrorCode::BadValue, "no"))
    }

    #[tokio::test]
    async fn an_async_handler_is_awaited_and_a_handler_s_error_leaves_as_a_mongodb_error() {
        static TABLE: &[Spec] = &[
            Spec::asynchronous("echo", slow_echo),
            Spec::sync("refuse", refuse),
        ];
        let dispatch = Dispatch::new(TABLE);
        let settings = Settings::default();
        let mut connection = connection();
        let mut context = Context {
            settings: &settings,
            connection: &mut connection,
            engine: None,
        };
        let reply = dispatch
            .answer(&mut context, &msg(doc! {"echo": "hi", "$db": "x"}))
            .await;
        assert_eq!(reply, doc! {"echo": "hi", "connection": 7_i64, "ok": 1.0});
        let reply = dispatch
            .answer(&mut context, &msg(doc! {"refuse": 1, "$db": "x"}))
            .await;
        assert_eq!(
            reply,
            doc! {"ok": 0.0, "errmsg": "no", "code": 2, "codeName": "BadValue"}
        );
    }
}

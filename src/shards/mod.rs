//! The shard access layer: the only holder of MongoDB client and database handles.
//!
//! [`Shards`] maps each registered shard's name to its database handle and resolves a
//! [`Location`] to its collection. The router's single-document steps go through
//! [`command`] (every command carries a deadline), scans and lookups by id through [`read`],
//! a collection's listing, creation and indexes through [`collections`], change streams
//! through [`watch`], purges, repairs and drops through [`write`], and the workers'
//! bulk writes through [`writer`]'s [`BulkWriter`] over the same handles, and what a failed
//! write means through [`classify`].

pub mod classify;
pub mod collections;
pub mod command;
pub mod passthrough;
mod reachability;
pub mod read;
pub mod watch;
pub mod write;
pub mod writer;

pub use classify::{classify, FailureClass, FailureOrigin, WriteFailure};
pub use writer::{
    BatchCounts, BatchReport, BulkWriter, Deadline, Modification, OverloadSink, RetryPolicy,
    ShardReport, Statement, StatementResult, WriteOp, WriterError, WriterOptions,
};

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use mongodb::bson::{doc, Document};
use mongodb::options::ClientOptions;
use mongodb::{Client, Collection, Database};

use crate::redact::{redact_uri, Redacted};
use crate::routing::Location;

/// A database handle per shard name. Cheap to clone; clones share the handles, and a shard
/// connected later ([`Shards::ensure`]) is seen by every clone.
#[derive(Clone, Debug, Default)]
pub struct Shards {
    databases: Arc<std::sync::RwLock<BTreeMap<String, Database>>>,
    /// Whether the clients opened here leave write retries to the bulk writer.
    bulk_writer: bool,
}

/// A location names a shard this process has no connection for.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("shard {0:?} is used by a routing version but has no connection")]
pub struct UnknownShard(pub String);

impl Shards {
    /// Handles the caller opened itself (an application's own clients, a test's).
    pub fn new(databases: impl IntoIterator<Item = (String, Database)>) -> Shards {
        Shards {
            databases: Arc::new(std::sync::RwLock::new(databases.into_iter().collect())),
            bulk_writer: false,
        }
    }

    /// Opens a client per registered shard. With `bulk_writer`, the clients leave write
    /// retries to the bulk writer ([`writer_client`]).
    pub async fn connect(
        shards: &[crate::store::shards::Shard],
        bulk_writer: bool,
    ) -> Result<Shards, ShardConnectError> {
        let mut databases = BTreeMap::new();
        for shard in shards {
            let client = connect(shard.uri.expose(), bulk_writer).await?;
            databases.insert(shard.name.clone(), client.database(&shard.database));
        }
        Ok(Shards {
            databases: Arc::new(std::sync::RwLock::new(databases)),
            bulk_writer,
        })
    }

    /// Connects every shard of `wanted` this process has no connection for yet, from its
    /// registration in `registered` (workers, routers and fronts started before a shard was
    /// registered learn it here: at their poll, and before they work on anything that names
    /// it). Returns the shards it connected. A wanted shard that is not registered is an
    /// [`EnsureError::Unregistered`]; one that does not answer, [`EnsureError::Connect`].
    pub async fn ensure(
        &self,
        wanted: &std::collections::BTreeSet<String>,
        registered: &[crate::store::shards::Shard],
    ) -> Result<Vec<String>, EnsureError> {
        let missing: Vec<&String> = wanted.iter().filter(|s| !self.contains(s)).collect();
        let mut connected = Vec::new();
        for name in missing {
            let shard = registered
                .iter()
                .find(|r| &r.name == name)
                .ok_or_else(|| EnsureError::Unregistered(UnknownShard(name.clone())))?;
            let client = connect(shard.uri.expose(), self.bulk_writer)
                .await
                .map_err(|e| EnsureError::Connect(name.clone(), e))?;
            self.databases
                .write()
                .expect("the shard map lock is never poisoned")
                .entry(name.clone())
                .or_insert_with(|| client.database(&shard.database));
            connected.push(name.clone());
        }
        Ok(connected)
    }

    /// The database handle of `shard`: for this module's operations only.
    fn database(&self, shard: &str) -> Result<Database, UnknownShard> {
        self.databases
            .read()
            .expect("the shard map lock is never poisoned")
            .get(shard)
            .cloned()
            .ok_or_else(|| UnknownShard(shard.to_owned()))
    }

    /// The collection handle of `location`: for this module's operations only.
    fn collection(&self, location: &Location) -> Result<Collection<Document>, UnknownShard> {
        Ok(self
            .database(&location.shard)?
            .collection::<Document>(&location.collection))
    }

    pub fn contains(&self, shard: &str) -> bool {
        self.databases
            .read()
            .expect("the shard map lock is never poisoned")
            .contains_key(shard)
    }

    /// The collection at `location`, as the single-document step commands run on it
    /// ([`command`]).
    pub fn at(&self, location: &Location) -> Result<At, UnknownShard> {
        Ok(At {
            database: self.database(&location.shard)?,
            location: location.clone(),
        })
    }

    /// Every shard name and its database handle, by name, as connected now.
    fn entries(&self) -> Vec<(String, Database)> {
        self.databases
            .read()
            .expect("the shard map lock is never poisoned")
            .iter()
            .map(|(n, d)| (n.clone(), d.clone()))
            .collect()
    }
}

/// A location's collection as this process reaches it, for the step commands ([`command`]).
/// Opaque: what can be done with it is what this module offers.
#[derive(Clone, Debug)]
pub struct At {
    database: Database,
    location: Location,
}

impl From<BTreeMap<String, Database>> for Shards {
    fn from(databases: BTreeMap<String, Database>) -> Shards {
        Shards::new(databases)
    }
}

impl From<std::collections::HashMap<String, Database>> for Shards {
    fn from(databases: std::collections::HashMap<String, Database>) -> Shards {
        Shards::new(databases)
    }
}

/// Why [`Shards::ensure`] could not connect a shard.
#[derive(Debug, thiserror::Error)]
pub enum EnsureError {
    #[error("{0}, and it is not registered (`reshard shard add`)")]
    Unregistered(UnknownShard),
    #[error(
        "shard {0:?} was registered after this process started, and connecting to it failed: {1}"
    )]
    Connect(String, ShardConnectError),
}

#[derive(Debug, thiserror::Error)]
pub enum ShardConnectError {
    #[error("{uri} is not a usable MongoDB connection string: {reason}")]
    BadUri { uri: Redacted, reason: String },
    #[error("{uri} uses ${{{name}}}, which is not set in this process's environment")]
    MissingVariable { uri: Redacted, name: String },
    #[error("{uri} did not answer a ping on database {database:?}: {reason}")]
    NoAnswer {
        uri: Redacted,
        database: String,
        reason: String,
    },
}

/// A client for `uri`, with timeouts short enough that a dead shard is reported, not waited on.
pub async fn client(uri: &str) -> Result<Client, ShardConnectError> {
    connect(uri, false).await
}

/// A client for the code that writes in bulk: the driver does not retry writes itself, so the
/// bulk writer sees every failure (overload included) and owns the retries.
pub async fn writer_client(uri: &str) -> Result<Client, ShardConnectError> {
    connect(uri, true).await
}

/// A shard URI with every `${NAME}` replaced by the environment variable `NAME` of this
/// process, and every `${file:PATH}` by the content of that file (without its final newline).
/// URIs are stored as written, so a password given as `${MONGO_PASSWORD}` or kept in a file
/// never reaches the state store; each process resolves it when it connects.
pub fn resolve_uri(uri: &str) -> Result<String, ShardConnectError> {
    resolve(uri).map(|r| r.uri)
}

/// A shard URI with its references resolved, and what they stood for.
struct Resolved {
    uri: String,
    /// The text each `${...}` was replaced by: kept out of error messages
    /// ([`crate::redact::scrub`]).
    values: Vec<String>,
}

fn resolve(uri: &str) -> Result<Resolved, ShardConnectError> {
    let mut values = Vec::new();
    let mut out = String::with_capacity(uri.len());
    let mut rest = uri;
    while let Some(at) = rest.find("${") {
        out.push_str(&rest[..at]);
        let after = &rest[at + 2..];
        let Some(end) = after.find('}') else {
            return Err(ShardConnectError::BadUri {
                uri: Redacted::new(uri),
                reason: "an unclosed ${ in the URI".into(),
            });
        };
        let name = &after[..end];
        if let Some(path) = name.strip_prefix("file:") {
            // `${file:PATH}`: the file's content (a whole URI, or a password), read now.
            match std::fs::read_to_string(path) {
                Ok(text) => {
                    let text = text.trim_end_matches(['\n', '\r']);
                    out.push_str(text);
                    values.push(text.to_owned());
                }
                Err(e) => {
                    return Err(ShardConnectError::BadUri {
                        uri: Redacted::new(uri),
                        reason: format!("cannot read {path}: {e}"),
                    })
                }
            }
            rest = &after[end + 1..];
            continue;
        }
        if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
            return Err(ShardConnectError::BadUri {
                uri: Redacted::new(uri),
                reason: format!("${{{name}}} is not an environment variable name"),
            });
        }
        match std::env::var(name) {
            Ok(value) => {
                out.push_str(&value);
                values.push(value);
            }
            Err(_) => {
                return Err(ShardConnectError::MissingVariable {
                    uri: Redacted::new(uri),
                    name: name.to_owned(),
                })
            }
        }
        rest = &after[end + 1..];
    }
    out.push_str(rest);
    Ok(Resolved { uri: out, values })
}

async fn connect(uri: &str, bulk_writer: bool) -> Result<Client, ShardConnectError> {
    let resolved = resolve(uri)?;
    // The driver's reason may quote the resolved text, so what the references stood for is
    // scrubbed from it, in the line and in the debug log alike.
    let bad = |e: mongodb::error::Error| {
        let detail = crate::redact::scrub(&e.to_string(), &resolved.values);
        tracing::debug!(target: "reshard::mongodb", "{}", redact_uri(&detail));
        ShardConnectError::BadUri {
            uri: Redacted::new(uri),
            reason: crate::redact::scrub(&one_line(&e), &resolved.values),
        }
    };
    let mut options = ClientOptions::parse(&resolved.uri).await.map_err(bad)?;
    if bulk_writer {
        crate::shards::writer::disable_driver_write_retries(&mut options);
    }
    options.app_name.get_or_insert_with(|| "reshard".to_owned());
    // Each server's failed heartbeats are kept, typed, to say why a selection timed out.
    options
        .sdam_event_handler
        .get_or_insert_with(reachability::handler);
    options
        .server_selection_timeout
        .get_or_insert(Duration::from_secs(10));
    options
        .connect_timeout
        .get_or_insert(Duration::from_secs(5));
    Client::with_options(options).map_err(bad)
}

/// The code, code name and message of a server's refusal of a command (not of a network or
/// driver failure), for passing it on as the server said it.
pub fn server_refusal(e: &mongodb::error::Error) -> Option<(i32, String, String)> {
    match e.kind.as_ref() {
        mongodb::error::ErrorKind::Command(c) => {
            Some((c.code, c.code_name.clone(), c.message.clone()))
        }
        _ => None,
    }
}

/// A driver error as one line an operator can read: what failed, where (the servers a
/// selection could not reach, by `host:port`), the cause in plain words, the server's code and
/// message where there is one, never a password. The driver's own rendering (`Kind: ...,
/// labels: {}, source: None, server response: None`, a topology dump for a selection timeout)
/// is logged at debug level (target `reshard::mongodb`), for `RESHARD_LOG=debug`.
pub fn describe(e: &mongodb::error::Error) -> String {
    tracing::debug!(target: "reshard::mongodb", "{}", redact_uri(&e.to_string()));
    one_line(e)
}

/// [`describe`]'s line, without the debug log.
fn one_line(e: &mongodb::error::Error) -> String {
    use mongodb::error::{ErrorKind, WriteFailure};
    let text = match &*e.kind {
        ErrorKind::InvalidArgument { message, .. } => format!("invalid argument: {message}"),
        ErrorKind::Authentication { message, .. } => authentication(e, message),
        ErrorKind::Command(c) => format!(
            "the server refused the command: {} (code {}{})",
            c.message,
            c.code,
            code_name(&c.code_name)
        ),
        ErrorKind::Write(WriteFailure::WriteError(w)) => format!(
            "the server refused the write: {} (code {}{})",
            w.message,
            w.code,
            code_name(w.code_name.as_deref().unwrap_or_default())
        ),
        ErrorKind::Write(WriteFailure::WriteConcernError(w)) => format!(
            "the write concern was not satisfied: {} (code {}{})",
            w.message,
            w.code,
            code_name(&w.code_name)
        ),
        ErrorKind::InsertMany(i) => {
            let errors = i.write_errors.as_deref().unwrap_or_default();
            match errors.first() {
                Some(first) => format!(
                    "the server refused {} of the documents, first: {} (code {}{})",
                    errors.len(),
                    first.message,
                    first.code,
                    code_name(first.code_name.as_deref().unwrap_or_default())
                ),
                None => match &i.write_concern_error {
                    Some(w) => format!(
                        "the write concern was not satisfied: {} (code {})",
                        w.message, w.code
                    ),
                    None => "the server refused the documents".to_owned(),
                },
            }
        }
        ErrorKind::Io(io) => network(io),
        ErrorKind::ServerSelection { message, .. } => server_selection(message),
        ErrorKind::DnsResolve { message, .. } => format!("DNS resolution failed: {message}"),
        ErrorKind::ConnectionPoolCleared { message, .. } => {
            format!("the connection pool was cleared: {message}")
        }
        ErrorKind::InvalidTlsConfig { message, .. } => {
            format!("invalid TLS configuration: {message}")
        }
        ErrorKind::IncompatibleServer { message, .. } => format!("incompatible server: {message}"),
        other => other.to_string(),
    };
    let one_line = text.split_whitespace().collect::<Vec<_>>().join(" ");
    redact_uri(&one_line)
}

fn code_name(name: &str) -> String {
    if name.is_empty() {
        String::new()
    } else {
        format!(" {name}")
    }
}

/// An authentication failure with the server's code and message, which the driver keeps as
/// the error's source (its own message names only the mechanism).
fn authentication(e: &mongodb::error::Error, message: &str) -> String {
    use mongodb::error::ErrorKind;
    // The source is the boxed driver error (`Box<Error>` is what the driver's `source()`
    // hands out), or the error itself.
    let server = std::error::Error::source(e)
        .and_then(|s| {
            s.downcast_ref::<Box<mongodb::error::Error>>()
                .map(|b| &**b)
                .or_else(|| s.downcast_ref::<mongodb::error::Error>())
        })
        .and_then(|s| match &*s.kind {
            ErrorKind::Command(c) => Some(c.clone()),
            _ => None,
        });
    match server {
        Some(c) => format!(
            "authentication failed: {} (code {}{})",
            c.message,
            c.code,
            code_name(&c.code_name)
        ),
        None => format!("authentication failed: {message}"),
    }
}

/// A network error in plain words, by its I/O kind.
fn network(io: &std::io::Error) -> String {
    use std::io::ErrorKind;
    match io.kind() {
        ErrorKind::ConnectionRefused => "connection refused".to_owned(),
        ErrorKind::TimedOut => "timed out".to_owned(),
        ErrorKind::ConnectionReset => "the connection was reset".to_owned(),
        ErrorKind::ConnectionAborted | ErrorKind::BrokenPipe | ErrorKind::UnexpectedEof => {
            "the server closed the connection".to_owned()
        }
        _ => format!("network error: {io}"),
    }
}

/// A server-selection timeout: each server the selection names, with why its monitor could
/// not reach it ([`reachability`]).
fn server_selection(message: &str) -> String {
    let unreachable = reachability::named_in(message);
    if unreachable.is_empty() {
        // The servers answered (or this process's clients were opened elsewhere, without the
        // monitor's reports), but none could serve the operation: no primary, a replica set
        // name the servers do not have, ...
        return "no server that can serve the operation answered in time (no primary, or a \
                replica set other than the one named; RESHARD_LOG=debug shows the driver's view \
                of the servers)"
            .to_owned();
    }
    let causes: Vec<String> = unreachable
        .iter()
        .map(|(address, e)| format!("{address}: {}", cause(e)))
        .collect();
    format!("no server could be reached in time: {}", causes.join("; "))
}

/// Why a heartbeat failed, in a few words.
fn cause(e: &mongodb::error::Error) -> String {
    match &*e.kind {
        mongodb::error::ErrorKind::ServerSelection { .. } => "not reachable".to_owned(),
        _ => one_line(e),
    }
}

/// Checks that the shard answers on its database.
pub async fn ping(uri: &str, database: &str) -> Result<(), ShardConnectError> {
    let client = client(uri).await?;
    client
        .database(database)
        .run_command(doc! { "ping": 1 })
        .await
        .map(|_| ())
        .map_err(|e| ShardConnectError::NoAnswer {
            uri: Redacted::new(uri),
            database: database.to_owned(),
            reason: describe(&e),
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_driver_error_reads_as_one_sentence_without_the_password() {
        let e = ClientOptions::parse("mongodb://app:s3cret@127.0.0.1:notaport")
            .await
            .unwrap_err();
        assert!(
            e.to_string().contains("Kind:"),
            "the driver's own dump: {e}"
        );
        let line = describe(&e);
        assert!(line.starts_with("invalid argument: "), "{line}");
        assert!(line.contains("notaport"), "{line}");
        for noise in ["Kind:", "labels", "source: None", "\n", "s3cret"] {
            assert!(!line.contains(noise), "{noise:?} in {line}");
        }
    }

    /// The error of a ping to `uri` (which must fail).
    async fn ping_error(uri: &str) -> mongodb::error::Error {
        client(uri)
            .await
            .unwrap()
            .database("admin")
            .run_command(doc! { "ping": 1 })
            .await
            .unwrap_err()
    }

    /// Regression (issue 15): a server-selection timeout reached the operator as the driver's
    /// topology dump (`Topology: { Type: Unknown, Servers: [ { ... Error: Kind: I/O error:
    /// Connection refused (os error 111), labels: {}, ... } ] }`).
    #[tokio::test]
    async fn an_unreachable_server_is_named_with_why_in_one_line() {
        let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = closed.local_addr().unwrap().port();
        drop(closed);
        let refused = ping_error(&format!(
            "mongodb://app:s3cret@127.0.0.1:{port}/?serverSelectionTimeoutMS=500&directConnection=true"
        ))
        .await;
        assert!(
            refused.to_string().contains("Topology"),
            "the driver's own dump: {refused}"
        );
        let line = describe(&refused);
        assert_eq!(
            line,
            format!("no server could be reached in time: 127.0.0.1:{port}: connection refused")
        );

        // A server that accepts the connection and never answers.
        let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = silent.local_addr().unwrap().port();
        // Connections are held open, unanswered, until the test process ends.
        std::thread::spawn(move || {
            let mut held = Vec::new();
            for stream in silent.incoming() {
                held.push(stream);
            }
        });
        let timed_out = ping_error(&format!(
            "mongodb://127.0.0.1:{port}/?serverSelectionTimeoutMS=1500&connectTimeoutMS=200&directConnection=true"
        ))
        .await;
        let line = describe(&timed_out);
        assert_eq!(
            line,
            format!("no server could be reached in time: 127.0.0.1:{port}: timed out")
        );
        for noise in ["Kind:", "labels", "Topology", "s3cret"] {
            assert!(!line.contains(noise), "{noise:?} in {line}");
        }
    }

    /// Regression (issue 14's secrets test): a password put in a variable without
    /// percent-encoding its `?` made the driver's parse error quote a piece of it.
    #[tokio::test]
    async fn a_password_with_an_unencoded_question_mark_is_not_quoted() {
        std::env::set_var("RESHARD_TEST_UNENCODED_PASSWORD", "Xy7pQ2?mZ9/kL4@");
        let uri = "mongodb://app:${RESHARD_TEST_UNENCODED_PASSWORD}@127.0.0.1:27017/?x=1";
        let driver = ClientOptions::parse(resolve_uri(uri).unwrap())
            .await
            .unwrap_err();
        assert!(
            describe(&driver).contains("Xy7pQ2"),
            "the driver's own reason quotes the password: {}",
            describe(&driver)
        );
        let e = client(uri).await.unwrap_err().to_string();
        assert!(
            e.contains("is not a usable MongoDB connection string"),
            "{e}"
        );
        for piece in ["Xy7pQ2", "mZ9", "kL4"] {
            assert!(!e.contains(piece), "{piece:?} in {e}");
        }
    }

    #[test]
    fn variables_in_a_uri_come_from_the_environment() {
        std::env::set_var("RESHARD_TEST_URI_PASSWORD", "s3cret");
        assert_eq!(
            resolve_uri("mongodb://app:${RESHARD_TEST_URI_PASSWORD}@h/?x=1").unwrap(),
            "mongodb://app:s3cret@h/?x=1"
        );
        assert_eq!(resolve_uri("mongodb://h").unwrap(), "mongodb://h");
        let missing = resolve_uri("mongodb://${RESHARD_TEST_URI_NOT_SET_ANYWHERE}").unwrap_err();
        assert!(
            missing
                .to_string()
                .contains("RESHARD_TEST_URI_NOT_SET_ANYWHERE"),
            "{missing}"
        );
        assert!(resolve_uri("mongodb://${oops").is_err());

        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("pw");
        std::fs::write(&file, "s3cret\n").unwrap();
        let uri = format!("mongodb://app:${{file:{}}}@h", file.display());
        assert_eq!(resolve_uri(&uri).unwrap(), "mongodb://app:s3cret@h");
        let missing = format!("mongodb://app:${{file:{}/nope}}@h", dir.path().display());
        let e = resolve_uri(&missing).unwrap_err().to_string();
        assert!(e.contains("cannot read") && !e.contains("s3cret"), "{e}");
    }
}

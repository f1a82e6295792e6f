//! The front's passthrough: the one client of the location that serves what reshard does not
//! route (collections without routing versions, other databases), so an application keeps
//! one connection string for all of them. Commands go to it as the application sent them,
//! minus the generic arguments the front answers itself, and its replies, errors included,
//! come back as the server wrote them.

use futures::TryStreamExt;
use mongodb::bson::{doc, Bson, Document};
use mongodb::error::ErrorKind;
use mongodb::{Client, Cursor};

use super::ShardConnectError;
use crate::redact::Redacted;

/// A client of the passthrough location.
#[derive(Clone, Debug)]
pub struct Passthrough {
    client: Client,
    uri: Redacted,
}

/// A cursor the passthrough location holds, read on by the front's `getMore`.
pub struct PassCursor {
    cursor: Cursor<Document>,
}

/// The generic arguments the front keeps to itself: the database it sends to, the session
/// and transaction fields (the front advertises no sessions), and the read preference and
/// cluster time, which the passthrough client sets as its own.
const KEPT_BACK: &[&str] = &[
    "$db",
    "lsid",
    "txnNumber",
    "autocommit",
    "startTransaction",
    "$clusterTime",
    "$readPreference",
];

impl Passthrough {
    /// Opens the client (the connection string may use `${VAR}` and `${file:PATH}` like a
    /// shard's). The location is not reached until the first command.
    pub async fn connect(uri: &str) -> Result<Passthrough, ShardConnectError> {
        Ok(Passthrough {
            client: super::client(uri).await?,
            uri: Redacted::new(uri),
        })
    }

    /// The connection string, redacted.
    pub fn uri(&self) -> &Redacted {
        &self.uri
    }

    /// Runs `command` on `database` and returns the server's reply: `ok: 0` with the
    /// server's code when it refused the command, a reply of the front's own (`HostUnreachable`
    /// and the reason) when it could not be reached.
    pub async fn run(&self, database: &str, command: &Document) -> Document {
        let db = self.client.database(database);
        match db.run_command(forwarded(command)).await {
            Ok(reply) => reply,
            Err(e) => error_reply(&e),
        }
    }

    /// Runs a command that opens a cursor (`find`, `aggregate`, `listCollections`,
    /// `listIndexes`) and returns the cursor, or the server's refusal as a reply.
    pub async fn open_cursor(
        &self,
        database: &str,
        command: &Document,
    ) -> Result<PassCursor, Document> {
        let db = self.client.database(database);
        match db.run_cursor_command(forwarded(command)).await {
            Ok(cursor) => Ok(PassCursor { cursor }),
            Err(e) => Err(error_reply(&e)),
        }
    }
}

impl PassCursor {
    /// The next at most `n` documents (fewer at the end, none once exhausted).
    pub async fn next_batch(&mut self, n: usize) -> Result<Vec<Document>, Document> {
        let mut out = Vec::new();
        while out.len() < n {
            match self.cursor.try_next().await {
                Ok(Some(d)) => out.push(d),
                Ok(None) => break,
                Err(e) => return Err(error_reply(&e)),
            }
        }
        Ok(out)
    }
}

fn forwarded(command: &Document) -> Document {
    let mut out = command.clone();
    for field in KEPT_BACK {
        out.remove(field);
    }
    out
}

/// A driver error as the reply a MongoDB server would have sent: the server's own code, name,
/// message and labels when it answered; `HostUnreachable` (6) with the reason when it did not.
fn error_reply(e: &mongodb::error::Error) -> Document {
    let labels: Vec<Bson> = e.labels().iter().map(|l| Bson::String(l.clone())).collect();
    let mut reply = match e.kind.as_ref() {
        ErrorKind::Command(c) => doc! {
            "ok": 0.0,
            "errmsg": &c.message,
            "code": c.code,
            "codeName": &c.code_name,
        },
        _ => doc! {
            "ok": 0.0,
            "errmsg": format!("the passthrough location did not answer: {}", super::describe(e)),
            "code": 6,
            "codeName": "HostUnreachable",
        },
    };
    if !labels.is_empty() {
        reply.insert("errorLabels", labels);
    }
    reply
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_session_and_routing_arguments_stay_with_the_front() {
        let command = doc! {
            "find": "events", "filter": {"a": 1}, "$db": "shop", "lsid": {"id": 1},
            "txnNumber": 3_i64, "$readPreference": {"mode": "primary"}, "comment": "kept",
        };
        assert_eq!(
            forwarded(&command),
            doc! { "find": "events", "filter": {"a": 1}, "comment": "kept" }
        );
    }
}

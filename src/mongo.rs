//! Connections to shards. The MongoDB driver is used only through this module and the
//! modules that move data.

use std::time::Duration;

use mongodb::bson::doc;
use mongodb::options::ClientOptions;
use mongodb::Client;

use crate::redact::{redact_uri, Redacted};

#[derive(Debug, thiserror::Error)]
pub enum ShardConnectError {
    #[error("{uri} is not a usable MongoDB connection string: {reason}")]
    BadUri { uri: Redacted, reason: String },
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

async fn connect(uri: &str, bulk_writer: bool) -> Result<Client, ShardConnectError> {
    let bad = |e: mongodb::error::Error| ShardConnectError::BadUri {
        uri: Redacted::new(uri),
        reason: redact_uri(&e.to_string()),
    };
    let mut options = ClientOptions::parse(uri).await.map_err(bad)?;
    if bulk_writer {
        crate::copy::writer::disable_driver_write_retries(&mut options);
    }
    options.app_name.get_or_insert_with(|| "reshard".to_owned());
    options
        .server_selection_timeout
        .get_or_insert(Duration::from_secs(10));
    options
        .connect_timeout
        .get_or_insert(Duration::from_secs(5));
    Client::with_options(options).map_err(bad)
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
            reason: redact_uri(&e.to_string()),
        })
}

/// A database handle per shard, by shard name. With `bulk_writer`, the clients leave write
/// retries to the bulk writer ([`writer_client`]).
pub async fn databases(
    shards: Vec<crate::store::shards::Shard>,
    bulk_writer: bool,
) -> Result<std::collections::BTreeMap<String, mongodb::Database>, ShardConnectError> {
    let mut databases = std::collections::BTreeMap::new();
    for shard in shards {
        let client = connect(shard.uri.expose(), bulk_writer).await?;
        databases.insert(shard.name, client.database(&shard.database));
    }
    Ok(databases)
}

//! A location's collection as a whole: what `listCollections` says of it, its creation with
//! options, and its indexes. What [`crate::prepare`] reads and makes before routers may read
//! the target.

use std::collections::BTreeSet;

use futures::TryStreamExt;
use mongodb::bson::{doc, Document};

use super::{Shards, UnknownShard};
use crate::collection_options::Listing;
use crate::routing::Location;

/// A collection-level command that failed, and where.
#[derive(Debug, thiserror::Error)]
pub enum CollectionError {
    #[error("{location} failed: {}", super::describe(source))]
    Mongo {
        location: Location,
        #[source]
        source: mongodb::error::Error,
    },
    #[error(transparent)]
    UnknownShard(#[from] UnknownShard),
}

fn at(location: &Location) -> impl Fn(mongodb::error::Error) -> CollectionError + '_ {
    move |source| CollectionError::Mongo {
        location: location.clone(),
        source,
    }
}

impl Shards {
    /// What `listCollections` says of the collection at `location` (its type and options, as
    /// the server lists them: options it does not know too), or `None` when there is none.
    pub async fn listing(&self, location: &Location) -> Result<Option<Listing>, CollectionError> {
        let reply = self
            .database(&location.shard)?
            .run_command(doc! {
                "listCollections": 1,
                "filter": { "name": &location.collection },
            })
            .await
            .map_err(at(location))?;
        // A name matches one collection at most: the first batch holds it.
        Ok(reply
            .get_document("cursor")
            .ok()
            .and_then(|cursor| cursor.get_array("firstBatch").ok())
            .and_then(|batch| batch.first())
            .and_then(|entry| entry.as_document())
            .map(Listing::from_entry))
    }

    /// Creates the collection at `location` with `options`, as the `create` command takes them.
    pub async fn create_collection(
        &self,
        location: &Location,
        options: &Document,
    ) -> Result<(), CollectionError> {
        let mut command = doc! { "create": &location.collection };
        command.extend(options.clone());
        self.database(&location.shard)?
            .run_command(command)
            .await
            .map_err(at(location))?;
        Ok(())
    }

    /// The index specifications of the collection at `location`, as the driver models them.
    pub async fn index_specs(&self, location: &Location) -> Result<Vec<Document>, CollectionError> {
        Ok(self
            .collection(location)?
            .list_indexes()
            .await
            .map_err(at(location))?
            .try_collect::<Vec<_>>()
            .await
            .map_err(at(location))?
            .into_iter()
            .map(|model| mongodb::bson::to_document(&model).unwrap_or_default())
            .collect())
    }

    /// The names of the indexes of the collection at `location`.
    pub async fn index_names(
        &self,
        location: &Location,
    ) -> Result<BTreeSet<String>, CollectionError> {
        Ok(self
            .collection(location)?
            .list_index_names()
            .await
            .map_err(at(location))?
            .into_iter()
            .collect())
    }

    /// Creates one index at `location` (`spec` as `createIndexes` takes it).
    pub async fn create_index(
        &self,
        location: &Location,
        spec: Document,
    ) -> Result<(), CollectionError> {
        self.database(&location.shard)?
            .run_command(doc! { "createIndexes": &location.collection, "indexes": [spec] })
            .await
            .map_err(at(location))?;
        Ok(())
    }

    /// Creates the indexes `specs` (as `createIndexes` takes them) at `location`, all in one
    /// command: the server's reply (`numIndexesBefore`, `numIndexesAfter`, ...).
    pub async fn create_indexes(
        &self,
        location: &Location,
        specs: Vec<Document>,
    ) -> Result<Document, CollectionError> {
        self.database(&location.shard)?
            .run_command(doc! { "createIndexes": &location.collection, "indexes": specs })
            .await
            .map_err(at(location))
    }

    /// Drops the indexes `which` names at `location` (`dropIndexes`' `index`: a name, a key
    /// pattern, a list of names, or `"*"`): the server's reply.
    pub async fn drop_indexes(
        &self,
        location: &Location,
        which: mongodb::bson::Bson,
    ) -> Result<Document, CollectionError> {
        self.database(&location.shard)?
            .run_command(doc! { "dropIndexes": &location.collection, "index": which })
            .await
            .map_err(at(location))
    }

    /// The indexes of the collection at `location`, as `listIndexes` lists them (`v`, `key`,
    /// `name` and the options), for the front's `listIndexes` of a routed collection.
    pub async fn list_indexes(
        &self,
        location: &Location,
    ) -> Result<Vec<Document>, CollectionError> {
        self.database(&location.shard)?
            .run_cursor_command(doc! { "listIndexes": &location.collection })
            .await
            .map_err(at(location))?
            .try_collect()
            .await
            .map_err(at(location))
    }
}

//! Reads the workers share: documents by id, and a partition's scan through one cursor with a
//! batch read ahead.

use std::collections::HashMap;
use std::sync::Arc;

use futures::TryStreamExt;
use mongodb::bson::{doc, Bson, Document};

use super::{Shards, UnknownShard};
use crate::ids;
use crate::routing::Location;

/// A read that failed, and where.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error("reading {location} failed: {}", super::describe(source))]
    Mongo {
        location: Location,
        #[source]
        source: mongodb::error::Error,
    },
    #[error("writing {location} failed: {}", super::describe(source))]
    Write {
        location: Location,
        #[source]
        source: mongodb::error::Error,
    },
    #[error(transparent)]
    UnknownShard(#[from] UnknownShard),
}

impl ReadError {
    pub fn at(location: &Location) -> impl Fn(mongodb::error::Error) -> ReadError + '_ {
        move |source| ReadError::Mongo {
            location: location.clone(),
            source,
        }
    }

    /// A write at `location` failed ([`super::write`]).
    pub fn writing(location: &Location) -> impl Fn(mongodb::error::Error) -> ReadError + '_ {
        move |source| ReadError::Write {
            location: location.clone(),
            source,
        }
    }
}

impl Shards {
    /// The documents at `location` with these ids, by [`ids::key`] (MongoDB's equality: `7`
    /// finds `7.0`). With `projection`, only those fields.
    pub async fn find_by_ids(
        &self,
        location: &Location,
        wanted: &[Bson],
        projection: Option<Document>,
    ) -> Result<HashMap<Vec<u8>, Document>, ReadError> {
        if wanted.is_empty() {
            return Ok(HashMap::new());
        }
        let found: Vec<Document> = self
            .collection(location)?
            .find(doc! { "_id": { "$in": wanted.to_vec() } })
            .with_options(
                mongodb::options::FindOptions::builder()
                    .projection(projection)
                    .build(),
            )
            .await
            .map_err(ReadError::at(location))?
            .try_collect()
            .await
            .map_err(ReadError::at(location))?;
        Ok(found
            .into_iter()
            .filter_map(|d| d.get("_id").map(|id| (ids::key(id), d.clone())))
            .collect())
    }

    /// The first document at `location` with this id.
    pub async fn find_by_id(
        &self,
        location: &Location,
        id: &Bson,
    ) -> Result<Option<Document>, ReadError> {
        self.collection(location)?
            .find_one(doc! { "_id": id.clone() })
            .await
            .map_err(ReadError::at(location))
    }

    /// The number of documents at `location` matching `filter` (`countDocuments`: an index
    /// count where an index serves the filter).
    pub async fn count(&self, location: &Location, filter: Document) -> Result<u64, ReadError> {
        self.collection(location)?
            .count_documents(filter)
            .await
            .map_err(ReadError::at(location))
    }

    /// The number of documents at `location` by the collection's metadata (no scan).
    pub async fn estimated_count(&self, location: &Location) -> Result<u64, ReadError> {
        self.collection(location)?
            .estimated_document_count()
            .await
            .map_err(ReadError::at(location))
    }

    /// The documents `pipeline` yields at `location`, all of them (samples, small
    /// projections: not for results of unbounded size).
    pub async fn aggregate(
        &self,
        location: &Location,
        pipeline: Vec<Document>,
    ) -> Result<Vec<Document>, ReadError> {
        self.collection(location)?
            .aggregate(pipeline)
            .await
            .map_err(ReadError::at(location))?
            .try_collect()
            .await
            .map_err(ReadError::at(location))
    }

    /// The server's `operationTime` now, by a `ping` to the shard of `location`; `None` when
    /// the shard is unknown, does not answer, or does not tell it (a server outside a replica
    /// set).
    pub async fn operation_time(&self, location: &Location) -> Option<mongodb::bson::Timestamp> {
        let reply = self
            .database(&location.shard)
            .ok()?
            .run_command(doc! { "ping": 1 })
            .await
            .ok()?;
        reply.get_timestamp("operationTime").ok()
    }

    /// Opens a scan of `filter` at `location` in `_id` order, read through one cursor in
    /// batches of `batch_size()` documents (asked again for every batch, so a changed setting
    /// applies at once), one batch read ahead while the caller works on the last one.
    pub async fn scan(
        &self,
        location: &Location,
        filter: Document,
        batch_size: Arc<dyn Fn() -> usize + Send + Sync>,
    ) -> Result<Scan, ReadError> {
        self.scan_with(location, filter, None, batch_size).await
    }

    /// [`Shards::scan`], only the fields of `projection` (when given).
    pub async fn scan_with(
        &self,
        location: &Location,
        filter: Document,
        projection: Option<Document>,
        batch_size: Arc<dyn Fn() -> usize + Send + Sync>,
    ) -> Result<Scan, ReadError> {
        self.scan_as(location, filter, projection, batch_size).await
    }

    /// [`Shards::scan`] of the documents as the server sent them, unparsed: the backfill
    /// copies them without parsing more than their routing fields.
    pub async fn scan_raw(
        &self,
        location: &Location,
        filter: Document,
        batch_size: Arc<dyn Fn() -> usize + Send + Sync>,
    ) -> Result<Scan<mongodb::bson::RawDocumentBuf>, ReadError> {
        self.scan_as(location, filter, None, batch_size).await
    }

    /// The documents at `location` matching `filter`, read as `options` says, through one
    /// cursor with a batch read ahead (the front's reads of a routed collection: the server
    /// evaluates the application's filter, sort and projection; the caller merges).
    pub async fn query(
        &self,
        location: &Location,
        filter: Document,
        options: QueryOptions,
    ) -> Result<Scan, ReadError> {
        let batch = options.batch_size.max(1) as usize;
        let find = mongodb::options::FindOptions::builder()
            .sort(options.sort)
            .projection(options.projection)
            .limit(options.limit)
            .batch_size(batch.min(u32::MAX as usize) as u32)
            .max_time(options.max_time)
            .build();
        self.read_as(location, filter, find, Arc::new(move || batch))
            .await
    }

    /// The documents at `location` matching `filter`, read as `options` says, lazily: a
    /// batch is asked of the server only when the last one is used up (a page of a listing
    /// reads no more than it needs).
    pub async fn rows(
        &self,
        location: &Location,
        filter: Document,
        options: QueryOptions,
    ) -> Result<Rows, ReadError> {
        let find = mongodb::options::FindOptions::builder()
            .sort(options.sort)
            .projection(options.projection)
            .limit(options.limit)
            .batch_size((options.batch_size > 0).then_some(options.batch_size))
            .max_time(options.max_time)
            .build();
        let cursor = self
            .collection(location)?
            .find(filter)
            .with_options(find)
            .await
            .map_err(ReadError::at(location))?;
        Ok(Rows {
            cursor,
            location: location.clone(),
        })
    }

    async fn scan_as<T>(
        &self,
        location: &Location,
        filter: Document,
        projection: Option<Document>,
        batch_size: Arc<dyn Fn() -> usize + Send + Sync>,
    ) -> Result<Scan<T>, ReadError>
    where
        T: serde::de::DeserializeOwned + Send + Sync + Unpin + 'static,
    {
        let first = batch_size().clamp(1, u32::MAX as usize) as u32;
        let options = mongodb::options::FindOptions::builder()
            .sort(doc! { "_id": 1 })
            .projection(projection)
            .batch_size(first)
            .build();
        self.read_as(location, filter, options, batch_size).await
    }

    async fn read_as<T>(
        &self,
        location: &Location,
        filter: Document,
        options: mongodb::options::FindOptions,
        batch_size: Arc<dyn Fn() -> usize + Send + Sync>,
    ) -> Result<Scan<T>, ReadError>
    where
        T: serde::de::DeserializeOwned + Send + Sync + Unpin + 'static,
    {
        let cursor = self
            .collection(location)?
            .clone_with_type::<T>()
            .find(filter)
            .with_options(options)
            .await
            .map_err(ReadError::at(location))?;
        // One batch ahead at most, so memory stays at two batches per scan.
        let (tx, rx) = tokio::sync::mpsc::channel::<Result<Vec<T>, ReadError>>(1);
        let location = location.clone();
        let reader = tokio::spawn(async move {
            let mut cursor = cursor;
            loop {
                let size = batch_size().max(1);
                let mut docs = Vec::with_capacity(size);
                let mut failed = None;
                while docs.len() < size {
                    match cursor.try_next().await {
                        Ok(Some(d)) => docs.push(d),
                        Ok(None) => break,
                        Err(e) => {
                            failed = Some(ReadError::at(&location)(e));
                            break;
                        }
                    }
                }
                let end = docs.len() < size || failed.is_some();
                if !docs.is_empty() && tx.send(Ok(docs)).await.is_err() {
                    return;
                }
                if let Some(e) = failed {
                    let _ = tx.send(Err(e)).await;
                    return;
                }
                if end {
                    return;
                }
            }
        });
        Ok(Scan { rx, reader })
    }
}

/// How a [`Shards::query`] reads.
#[derive(Clone, Debug, Default)]
pub struct QueryOptions {
    /// Only these fields (`None`: whole documents).
    pub projection: Option<Document>,
    /// In this order (`None`: the server's).
    pub sort: Option<Document>,
    /// At most this many (`None`: all).
    pub limit: Option<i64>,
    /// Documents per batch.
    pub batch_size: u32,
    /// The server gives up on the query by then (`maxTimeMS`).
    pub max_time: Option<std::time::Duration>,
}

/// A lazy read in progress ([`Shards::rows`]).
pub struct Rows {
    cursor: mongodb::Cursor<Document>,
    location: Location,
}

impl Rows {
    /// The next document; `None` at the end.
    pub async fn next(&mut self) -> Result<Option<Document>, ReadError> {
        self.cursor
            .try_next()
            .await
            .map_err(ReadError::at(&self.location))
    }
}

/// A scan in progress ([`Shards::scan`]). Dropping it stops the reader.
pub struct Scan<T = Document> {
    rx: tokio::sync::mpsc::Receiver<Result<Vec<T>, ReadError>>,
    reader: tokio::task::JoinHandle<()>,
}

impl<T> Scan<T> {
    /// The next batch; an empty one at the end of the scan.
    pub async fn next_batch(&mut self) -> Result<Vec<T>, ReadError> {
        match self.rx.recv().await {
            Some(batch) => batch,
            None => Ok(Vec::new()),
        }
    }
}

impl<T> Drop for Scan<T> {
    fn drop(&mut self) {
        self.reader.abort();
    }
}

/// A scan read beside another one in `_id` order: looking an id up is a step forward in a
/// merge rather than a query, so that each document of both sides is read once and in order.
/// The ids looked up must come in `_id` order (another scan's).
pub struct Merge {
    scan: Scan,
    buffer: std::collections::VecDeque<Document>,
    ended: bool,
    /// The document the last seek found (passed already).
    matched: Option<Document>,
}

impl Merge {
    pub fn new(scan: Scan) -> Merge {
        Merge {
            scan,
            buffer: Default::default(),
            ended: false,
            matched: None,
        }
    }

    /// The document with this `_id` if the scan holds it (`id: None`: none, read to the
    /// end); every document up to it, found or not, is handed to `passed` once.
    pub async fn seek(
        &mut self,
        id: Option<&Bson>,
        mut passed: impl FnMut(&Document),
    ) -> Result<Option<&Document>, ReadError> {
        self.matched = None;
        loop {
            while let Some(front) = self.buffer.front() {
                let at = front.get("_id").unwrap_or(&Bson::Null);
                let order = id.map_or(std::cmp::Ordering::Less, |id| ids::compare(at, id));
                if order == std::cmp::Ordering::Greater {
                    return Ok(None);
                }
                let front = self.buffer.pop_front().expect("a front");
                passed(&front);
                if order == std::cmp::Ordering::Equal {
                    self.matched = Some(front);
                    return Ok(self.matched.as_ref());
                }
            }
            if self.ended {
                return Ok(None);
            }
            let batch = self.scan.next_batch().await?;
            if batch.is_empty() {
                self.ended = true;
            }
            self.buffer.extend(batch);
        }
    }
}

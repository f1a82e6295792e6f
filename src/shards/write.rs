//! Writes outside the bulk writer and the step commands: a purge, a stray's removal, a
//! repair's single document, a collection's drop. Each waits for the client's own timeouts
//! (the bulk writer and [`super::command`] are for writes that must end by a lease).

use mongodb::bson::Document;

use super::read::ReadError;
use super::Shards;
use crate::routing::Location;

/// What an [`Shards::insert_one`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Inserted {
    Inserted,
    /// A unique index (`_id`'s) already holds the key: nothing was written.
    DuplicateKey,
}

impl Shards {
    /// Inserts `document` at `location`.
    pub async fn insert_one(
        &self,
        location: &Location,
        document: Document,
    ) -> Result<Inserted, ReadError> {
        match self.collection(location)?.insert_one(document).await {
            Ok(_) => Ok(Inserted::Inserted),
            Err(e) if super::classify::is_duplicate_key(&e) => Ok(Inserted::DuplicateKey),
            Err(e) => Err(ReadError::writing(location)(e)),
        }
    }

    /// Replaces the first document at `location` matching `filter` by `replacement`: whether
    /// one matched.
    pub async fn replace_one(
        &self,
        location: &Location,
        filter: Document,
        replacement: Document,
    ) -> Result<bool, ReadError> {
        let r = self
            .collection(location)?
            .replace_one(filter, replacement)
            .await
            .map_err(ReadError::writing(location))?;
        Ok(r.matched_count == 1)
    }

    /// Applies `update` (operators) to the first document at `location` matching `filter`:
    /// whether one matched.
    pub async fn update_one(
        &self,
        location: &Location,
        filter: Document,
        update: Document,
    ) -> Result<bool, ReadError> {
        let r = self
            .collection(location)?
            .update_one(filter, update)
            .await
            .map_err(ReadError::writing(location))?;
        Ok(r.matched_count == 1)
    }

    /// Deletes the first document at `location` matching `filter`: whether one was deleted.
    pub async fn delete_one(
        &self,
        location: &Location,
        filter: Document,
    ) -> Result<bool, ReadError> {
        let r = self
            .collection(location)?
            .delete_one(filter)
            .await
            .map_err(ReadError::writing(location))?;
        Ok(r.deleted_count == 1)
    }

    /// Deletes every document at `location` matching `filter`: how many.
    pub async fn delete_many(
        &self,
        location: &Location,
        filter: Document,
    ) -> Result<u64, ReadError> {
        Ok(self
            .collection(location)?
            .delete_many(filter)
            .await
            .map_err(ReadError::writing(location))?
            .deleted_count)
    }

    /// Drops the collection at `location` (none there: nothing to do).
    pub async fn drop_collection(&self, location: &Location) -> Result<(), ReadError> {
        self.collection(location)?
            .drop()
            .await
            .map_err(ReadError::writing(location))
    }
}

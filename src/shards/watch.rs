//! Change streams: a location's stream of changes, opened (or resumed after a token) here
//! and read by [`crate::watch`].

use std::time::Duration;

use mongodb::bson::Document;
use mongodb::change_stream::event::ResumeToken;
use mongodb::change_stream::ChangeStream;

use super::{Shards, UnknownShard};
use crate::routing::Location;

impl Shards {
    /// The change stream of the collection at `location` through `pipeline`, after
    /// `resume_after` when given, each wait for an event lasting at most `max_await`: the
    /// stream, or the server's refusal to open it (kept whole, so that the caller can tell
    /// why).
    pub async fn change_stream(
        &self,
        location: &Location,
        pipeline: Vec<Document>,
        resume_after: Option<ResumeToken>,
        max_await: Duration,
    ) -> Result<Result<ChangeStream<Document>, mongodb::error::Error>, UnknownShard> {
        Ok(self
            .collection(location)?
            .watch()
            .pipeline(pipeline)
            .resume_after(resume_after)
            .max_await_time(max_await)
            .await
            .map(|s| s.with_type::<Document>()))
    }
}

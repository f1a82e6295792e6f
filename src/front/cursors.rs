//! The cursors the front holds for its clients: a routed query's merge, a passthrough
//! location's cursor, or documents the front computed (an aggregation's result, a listing),
//! each under an id of the front's own that `getMore` continues and `killCursors` ends.
//!
//! A cursor idle for [`IDLE_TIMEOUT`] is closed, as MongoDB closes one after
//! `cursorTimeoutMillis` (ten minutes); at most [`MAX_OPEN`] are open at once.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bson::Document;
use tokio::sync::Mutex;

use crate::mql::projection::Projection;
use crate::router::{QueryCursor, Router};
use crate::shards::passthrough::PassCursor;

/// How long a cursor may stay unused before the front closes it (MongoDB's default
/// `cursorTimeoutMillis`).
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(600);

/// The most cursors open at once; a query past it is refused until some close.
pub const MAX_OPEN: usize = 20_000;

/// Where a cursor's documents come from.
pub enum Source {
    /// A routed query's merge: documents past `skip` are the answer, at most `left` more of
    /// them (`None`: no limit), each shaped by `projection`. Build it with [`Source::routed`].
    Routed {
        router: Router,
        cursor: QueryCursor,
        skip: u64,
        left: Option<u64>,
        projection: Option<Projection>,
        /// Documents the router returned that no batch carried yet.
        held: VecDeque<Document>,
        /// Whether the router's cursor is exhausted (what is `held` is all that is left).
        ended: bool,
    },
    /// A cursor the passthrough location holds.
    Passthrough(PassCursor),
    /// Documents the front computed.
    Computed(VecDeque<Document>),
}

impl Source {
    pub fn routed(
        router: Router,
        cursor: QueryCursor,
        skip: u64,
        limit: Option<u64>,
        projection: Option<Projection>,
    ) -> Source {
        Source::Routed {
            router,
            cursor,
            skip,
            left: limit,
            projection,
            held: VecDeque::new(),
            ended: false,
        }
    }
}

/// One open cursor.
pub struct Open {
    /// The namespace it reads (`database.collection`), as replies name it.
    pub namespace: String,
    pub source: Source,
    last_used: Instant,
}

impl Open {
    pub fn new(namespace: String, source: Source) -> Open {
        Open {
            namespace,
            source,
            last_used: Instant::now(),
        }
    }
}

/// The open cursors, by id.
pub struct Cursors {
    next_id: AtomicI64,
    open: std::sync::Mutex<HashMap<i64, Arc<Mutex<Open>>>>,
}

impl Default for Cursors {
    fn default() -> Self {
        // Ids start at a random point, so that a client that reconnects to another front (or
        // to this one after a restart) does not continue someone else's cursor by mistake.
        let start = rand::random::<u32>() as i64 + 1;
        Cursors {
            next_id: AtomicI64::new(start << 20),
            open: std::sync::Mutex::new(HashMap::new()),
        }
    }
}

/// Why a cursor could not be registered.
#[derive(Debug, thiserror::Error)]
#[error("the front holds {0} open cursors already; close some (or let them time out) first")]
pub struct TooManyCursors(pub usize);

impl Cursors {
    /// Registers `open`: its id.
    pub fn register(&self, open: Open) -> Result<i64, TooManyCursors> {
        let mut all = self.open.lock().expect("cursor lock");
        if all.len() >= MAX_OPEN {
            self.reap_locked(&mut all);
            if all.len() >= MAX_OPEN {
                return Err(TooManyCursors(all.len()));
            }
        }
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        all.insert(id, Arc::new(Mutex::new(open)));
        Ok(id)
    }

    /// The cursor with this id, marked used.
    pub async fn get(&self, id: i64) -> Option<Arc<Mutex<Open>>> {
        let found = self.open.lock().expect("cursor lock").get(&id).cloned()?;
        found.lock().await.last_used = Instant::now();
        Some(found)
    }

    /// Closes the cursor: whether it was open.
    pub fn close(&self, id: i64) -> bool {
        self.open.lock().expect("cursor lock").remove(&id).is_some()
    }

    /// How many are open.
    pub fn len(&self) -> usize {
        self.open.lock().expect("cursor lock").len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Closes the cursors idle for longer than [`IDLE_TIMEOUT`].
    pub fn reap(&self) {
        let mut all = self.open.lock().expect("cursor lock");
        self.reap_locked(&mut all);
    }

    fn reap_locked(&self, all: &mut HashMap<i64, Arc<Mutex<Open>>>) {
        all.retain(|_, open| match open.try_lock() {
            Ok(open) => open.last_used.elapsed() < IDLE_TIMEOUT,
            // In use: not idle.
            Err(_) => true,
        });
    }
}

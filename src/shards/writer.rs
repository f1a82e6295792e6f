//! [`BulkWriter`]: one unordered command per target location, all locations at once, with
//! per-statement results and retries of exactly the statements that failed.
//!
//! A batch of [`Statement`]s (inserts for the backfill, deletes for cleanup, updates for
//! stamping in place) is de-duplicated by `(location, id)` (the last one wins), grouped by
//! location, and each group is sent as one unordered `insert` / `delete` / `update` command
//! through `Database::run_raw_command`, so that one command is one round trip and the reply's
//! `writeErrors[].index` names exactly the statements that failed. Each failure goes through
//! [`classify`]: duplicate keys are done, transient and overload failures are re-sent (only
//! those statements) after a full-jitter exponential backoff, the rest become dead letters.
//! A semaphore per shard bounds the commands in flight on that shard across every batch that
//! shares the writer.
//!
//! The writer owns the retries: build its clients with [`disable_driver_write_retries`] so
//! the driver does not also retry overload rejections on its own (and hide them from the
//! throttle).

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::future::join_all;
use mongodb::bson::{rawdoc, Bson, Document, RawArrayBuf, RawBson, RawDocumentBuf};
use mongodb::options::{Acknowledgment, ClientOptions, WriteConcern};
use mongodb::Database;
use rand::Rng;
use tokio::sync::Semaphore;

use super::classify::{
    classify, failure_from_error, failures_from_reply, FailureClass, FailureOrigin, WriteFailure,
};
use crate::routing::Location;

mod statement;
pub use statement::{MissingId, Modification, OpKind, Statement, StatementResult, WriteOp};

/// The most statements one write command may carry (the server's `maxWriteBatchSize`).
pub const MAX_STATEMENTS_PER_COMMAND: usize = 100_000;
/// The most bytes of statements one command may carry: the server's `maxBsonObjectSize`
/// (16 MiB). A command may be 16 KiB larger than that, which leaves room for its envelope.
pub const MAX_COMMAND_BYTES: usize = 16 * 1024 * 1024;
/// Bytes an array element adds to a statement's own size: a type byte and the index as a
/// NUL-terminated decimal key (at most `"99999\0"`).
const ARRAY_ELEMENT_OVERHEAD: usize = 8;

/// Turns off the driver's own write retries, including its retries of overload rejections
/// (`SystemOverloadedError` + `RetryableError`), for a client the writer uses: the writer
/// retries, counts and reports every failure itself. `run_command` is never retried for other
/// errors, so this only matters for overload.
pub fn disable_driver_write_retries(options: &mut ClientOptions) {
    options.retry_writes = Some(false);
}

/// Retries of transient and overload failures: exponential backoff with full jitter and a cap
/// on attempts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RetryPolicy {
    /// How many times a statement is sent at most, the first time included.
    pub max_attempts: u32,
    /// The backoff ceiling after the first failure; it doubles after each further one.
    pub base_delay: Duration,
    /// The most the backoff ceiling grows to.
    pub max_delay: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            max_attempts: 8,
            base_delay: Duration::from_millis(100),
            max_delay: Duration::from_secs(10),
        }
    }
}

/// The backoff ceiling before attempt `attempt + 1` after `attempt` failed attempts:
/// `min(cap, base * 2^(attempt - 1))`.
pub fn backoff_ceiling(attempt: u32, base: Duration, cap: Duration) -> Duration {
    let exponent = attempt.saturating_sub(1).min(31);
    base.checked_mul(1u32 << exponent).unwrap_or(cap).min(cap)
}

/// Full jitter: a delay drawn uniformly from `[0, backoff_ceiling(attempt, base, cap)]`, so
/// that writers rejected together do not come back together. (The `backon` crate's
/// `ExponentialBuilder` with jitter could replace this function.)
pub fn backoff_delay(attempt: u32, base: Duration, cap: Duration, rng: &mut impl Rng) -> Duration {
    backoff_ceiling(attempt, base, cap).mul_f64(rng.gen::<f64>())
}

/// How big one command may be; split beyond that.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CommandLimits {
    /// Statements per command (`maxWriteBatchSize`).
    pub max_statements: usize,
    /// Bytes of statements per command (`maxBsonObjectSize`).
    pub max_bytes: usize,
}

impl Default for CommandLimits {
    fn default() -> Self {
        CommandLimits {
            max_statements: MAX_STATEMENTS_PER_COMMAND,
            max_bytes: MAX_COMMAND_BYTES,
        }
    }
}

/// Splits statements of the given encoded sizes into commands, in order, within `limits`.
/// Returns the chunks (positions into `sizes`) and the positions of statements too large to
/// be sent at all.
pub fn split_into_commands(
    sizes: &[usize],
    limits: CommandLimits,
) -> (Vec<Vec<usize>>, Vec<usize>) {
    let mut chunks: Vec<Vec<usize>> = Vec::new();
    let mut too_large = Vec::new();
    let mut current: Vec<usize> = Vec::new();
    let mut bytes = 0;
    for (position, size) in sizes.iter().enumerate() {
        let size = size + ARRAY_ELEMENT_OVERHEAD;
        if size > limits.max_bytes {
            too_large.push(position);
            continue;
        }
        if !current.is_empty()
            && (current.len() >= limits.max_statements || bytes + size > limits.max_bytes)
        {
            chunks.push(std::mem::take(&mut current));
            bytes = 0;
        }
        current.push(position);
        bytes += size;
    }
    if !current.is_empty() {
        chunks.push(current);
    }
    (chunks, too_large)
}

/// Told about every command that was rejected for overload, so the throttle can cut the rate.
pub trait OverloadSink: Send + Sync {
    /// A command to `shard` came back with at least one overload rejection.
    fn overloaded(&self, shard: &str);
}

impl<F: Fn(&str) + Send + Sync> OverloadSink for F {
    fn overloaded(&self, shard: &str) {
        self(shard)
    }
}

/// How the writer writes.
#[derive(Clone, Debug)]
pub struct WriterOptions {
    /// The write concern of every command; `{w: "majority", j: true}` by default, so a
    /// checkpoint recorded after the reply never points past a write that could be lost.
    pub write_concern: WriteConcern,
    /// Commands in flight per shard, across every batch sharing the writer.
    pub max_in_flight_per_shard: usize,
    /// Retries of transient and overload failures.
    pub retry: RetryPolicy,
    /// When to split a location's statements into several commands.
    pub limits: CommandLimits,
}

impl Default for WriterOptions {
    fn default() -> Self {
        WriterOptions {
            write_concern: WriteConcern::builder()
                .w(Acknowledgment::Majority)
                .journal(true)
                .build(),
            max_in_flight_per_shard: 2,
            retry: RetryPolicy::default(),
            limits: CommandLimits::default(),
        }
    }
}

/// A statement named a shard the writer has no connection for.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WriterError {
    /// Nothing was sent.
    #[error("statement {index} goes to shard {shard:?}, which the writer has no connection for")]
    UnknownShard {
        /// The statement's index in the batch.
        index: usize,
        /// The shard it names.
        shard: String,
    },
}

/// What happened on one shard during one batch.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ShardReport {
    /// Commands sent (round trips), retries included.
    pub commands: u32,
    /// Statements sent, re-sends included.
    pub statements_sent: u64,
    /// Statements re-sent after a transient or overload failure.
    pub retries: u64,
    /// Commands that came back with an overload rejection.
    pub overload_events: u32,
    /// Round-trip time of each command, in the order the replies arrived per location.
    pub latencies: Vec<Duration>,
    /// Time from the start of the batch until this shard's last statement was settled.
    pub finished_after: Duration,
}

/// Per-result counts of a batch.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BatchCounts {
    /// [`StatementResult::Inserted`]
    pub inserted: u64,
    /// [`StatementResult::Applied`]
    pub applied: u64,
    /// [`StatementResult::AlreadyPresent`]
    pub already_present: u64,
    /// [`StatementResult::DroppedDuplicate`]
    pub duplicates_dropped: u64,
    /// [`StatementResult::DeadLettered`]
    pub dead_lettered: u64,
    /// [`StatementResult::Expired`]
    pub expired: u64,
}

/// The outcome of [`BulkWriter::write`].
#[derive(Clone, Debug, Default, PartialEq)]
pub struct BatchReport {
    /// One result per input statement, in input order.
    pub results: Vec<StatementResult>,
    /// The results, counted.
    pub counts: BatchCounts,
    /// Statements re-sent, over all shards.
    pub retries: u64,
    /// Commands rejected for overload, over all shards.
    pub overload_events: u64,
    /// Documents the servers reported as inserted, deleted or matched (the replies' `n`).
    pub affected: u64,
    /// Per shard.
    pub shards: BTreeMap<String, ShardReport>,
}

impl BatchReport {
    /// Commands sent (round trips) over all shards.
    pub fn commands(&self) -> u32 {
        self.shards.values().map(|s| s.commands).sum()
    }

    /// The dead-lettered statements: `(index in the batch, result)`.
    pub fn dead_letters(&self) -> impl Iterator<Item = (usize, &StatementResult)> {
        self.results
            .iter()
            .enumerate()
            .filter(|(_, r)| matches!(r, StatementResult::DeadLettered { .. }))
    }
}

struct Shard {
    database: Database,
    in_flight: Semaphore,
}

/// Sends batches of statements to shards; cheap to clone, and clones share the per-shard
/// in-flight bounds.
#[derive(Clone)]
pub struct BulkWriter {
    shards: Arc<HashMap<String, Shard>>,
    options: Arc<WriterOptions>,
    overload: Option<Arc<dyn OverloadSink>>,
}

impl std::fmt::Debug for BulkWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut shards: Vec<&String> = self.shards.keys().collect();
        shards.sort();
        f.debug_struct("BulkWriter")
            .field("shards", &shards)
            .field("options", &self.options)
            .finish()
    }
}

/// What one location's statements came to.
#[derive(Default)]
struct GroupOutcome {
    shard: String,
    results: Vec<(usize, StatementResult)>,
    report: ShardReport,
    affected: u64,
}

impl BulkWriter {
    /// A writer over the shards `shards` is connected to now.
    pub fn over(shards: &super::Shards, options: WriterOptions) -> Self {
        BulkWriter::new(shards.entries(), options)
    }

    /// A writer over `shards` (shard name -> the database the shard's collections are in):
    /// handles the caller opened itself (a test's, a benchmark's).
    pub fn new(
        shards: impl IntoIterator<Item = (String, Database)>,
        options: WriterOptions,
    ) -> Self {
        let permits = options.max_in_flight_per_shard.max(1);
        let shards = shards
            .into_iter()
            .map(|(name, database)| {
                let shard = Shard {
                    database,
                    in_flight: Semaphore::new(permits),
                };
                (name, shard)
            })
            .collect();
        BulkWriter {
            shards: Arc::new(shards),
            options: Arc::new(options),
            overload: None,
        }
    }

    /// The same writer, telling `sink` about overload rejections.
    pub fn with_overload_sink(mut self, sink: Arc<dyn OverloadSink>) -> Self {
        self.overload = Some(sink);
        self
    }

    /// The writer's options.
    pub fn options(&self) -> &WriterOptions {
        &self.options
    }

    /// Writes a batch: de-duplicates, sends one unordered command per location (all at
    /// once), retries failed statements, and reports per statement. Fails only when a
    /// statement names an unknown shard, before anything is sent.
    pub async fn write(&self, statements: Vec<Statement>) -> Result<BatchReport, WriterError> {
        self.write_until(statements, None).await
    }

    /// [`BulkWriter::write`], ending by `deadline`: no command is sent after it, each command
    /// carries `maxTimeMS` until it and is waited for only until it (so nothing of the batch
    /// lands later than it plus a command's transit), and what is not settled by then is
    /// [`StatementResult::Expired`]. Workers pass their partition lease's deadline, so a
    /// worker that stalls cannot write after another took its partition over.
    pub async fn write_until(
        &self,
        statements: Vec<Statement>,
        deadline: Option<tokio::time::Instant>,
    ) -> Result<BatchReport, WriterError> {
        self.write_by(statements, deadline.map(Deadline::at)).await
    }

    /// [`BulkWriter::write_until`] with a deadline read again before each command is sent
    /// (and each retry's wait), so that a lease renewed while a command waited for its
    /// shard's permit gives it the later deadline.
    pub async fn write_by(
        &self,
        statements: Vec<Statement>,
        deadline: Option<Deadline>,
    ) -> Result<BatchReport, WriterError> {
        let started = Instant::now();
        for (index, statement) in statements.iter().enumerate() {
            if !self.shards.contains_key(&statement.location.shard) {
                return Err(WriterError::UnknownShard {
                    index,
                    shard: statement.location.shard.clone(),
                });
            }
        }

        let mut results: Vec<Option<StatementResult>> = vec![None; statements.len()];
        let mut last: HashMap<(&Location, Vec<u8>), usize> = HashMap::new();
        for (index, statement) in statements.iter().enumerate() {
            let key = (&statement.location, id_key(&statement.id));
            if let Some(previous) = last.insert(key, index) {
                results[previous] = Some(StatementResult::DroppedDuplicate { kept: index });
            }
        }
        let mut groups: BTreeMap<(&Location, OpKind), Vec<usize>> = BTreeMap::new();
        for (index, statement) in statements.iter().enumerate() {
            if results[index].is_none() {
                groups
                    .entry((&statement.location, statement.op.kind()))
                    .or_default()
                    .push(index);
            }
        }

        let outcomes = join_all(groups.into_iter().map(|((location, kind), indices)| {
            self.write_group(
                location,
                kind,
                indices,
                &statements,
                started,
                deadline.clone(),
            )
        }))
        .await;

        let mut report = BatchReport::default();
        for outcome in outcomes {
            for (index, result) in outcome.results {
                results[index] = Some(result);
            }
            report.affected += outcome.affected;
            let shard = report.shards.entry(outcome.shard).or_default();
            merge_shard_report(shard, outcome.report);
        }
        report.results = results
            .into_iter()
            .map(|r| r.expect("every statement is dropped or sent"))
            .collect();
        for result in &report.results {
            let counts = &mut report.counts;
            match result {
                StatementResult::Inserted => counts.inserted += 1,
                StatementResult::Applied => counts.applied += 1,
                StatementResult::AlreadyPresent => counts.already_present += 1,
                StatementResult::DroppedDuplicate { .. } => counts.duplicates_dropped += 1,
                StatementResult::DeadLettered { .. } => counts.dead_lettered += 1,
                StatementResult::Expired => counts.expired += 1,
            }
        }
        report.retries = report.shards.values().map(|s| s.retries).sum();
        report.overload_events = report
            .shards
            .values()
            .map(|s| u64::from(s.overload_events))
            .sum();
        Ok(report)
    }

    /// Sends one location's statements until each is settled or out of attempts.
    async fn write_group(
        &self,
        location: &Location,
        kind: OpKind,
        indices: Vec<usize>,
        statements: &[Statement],
        started: Instant,
        deadline: Option<Deadline>,
    ) -> GroupOutcome {
        let shard = &self.shards[&location.shard];
        let policy = self.options.retry;
        let mut outcome = GroupOutcome {
            shard: location.shard.clone(),
            ..GroupOutcome::default()
        };
        let success = match kind {
            OpKind::Insert => StatementResult::Inserted,
            OpKind::Delete | OpKind::Update => StatementResult::Applied,
        };

        // Encode once; re-sends reuse the bytes.
        let mut encoded: Vec<(usize, RawDocumentBuf)> = Vec::with_capacity(indices.len());
        for index in indices {
            match statements[index].op.encode() {
                Ok(raw) => encoded.push((index, raw)),
                Err(e) => {
                    let failure = WriteFailure::new(FailureOrigin::Client, None, e.to_string());
                    outcome.results.push((index, dead_letter(&failure, 0)));
                }
            }
        }

        let mut pending: Vec<usize> = (0..encoded.len()).collect();
        let mut attempt: u32 = 1;
        while !pending.is_empty() {
            if deadline
                .as_ref()
                .is_some_and(|d| tokio::time::Instant::now() >= d.now())
            {
                for position in pending {
                    outcome
                        .results
                        .push((encoded[position].0, StatementResult::Expired));
                }
                break;
            }
            let sizes: Vec<usize> = pending
                .iter()
                .map(|&p| encoded[p].1.as_bytes().len())
                .collect();
            let (chunks, too_large) = split_into_commands(&sizes, self.options.limits);
            for position in too_large {
                let failure = WriteFailure::new(
                    FailureOrigin::Client,
                    Some(10334),
                    format!(
                        "the statement is {} bytes, more than a command may carry ({})",
                        sizes[position], self.options.limits.max_bytes
                    ),
                );
                let index = encoded[pending[position]].0;
                outcome.results.push((index, dead_letter(&failure, 0)));
            }
            let chunks: Vec<Vec<usize>> = chunks
                .into_iter()
                .map(|chunk| {
                    chunk
                        .into_iter()
                        .map(|position| pending[position])
                        .collect()
                })
                .collect();

            let replies = join_all(chunks.iter().map(|chunk| {
                let command = build_command(
                    kind,
                    &location.collection,
                    chunk.iter().map(|&p| &encoded[p].1),
                    &self.options.write_concern,
                );
                send(shard, command, deadline.as_ref())
            }))
            .await;

            let mut retry: Vec<(usize, WriteFailure)> = Vec::new();
            for (chunk, (reply, latency)) in chunks.iter().zip(replies) {
                outcome.report.commands += 1;
                outcome.report.statements_sent += chunk.len() as u64;
                outcome.report.latencies.push(latency);
                let failures: Vec<(usize, WriteFailure)> = match reply {
                    // No answer by the deadline: each statement of the command may have
                    // landed, by then.
                    Err(Sent::Expired) => {
                        for &position in chunk {
                            outcome
                                .results
                                .push((encoded[position].0, StatementResult::Expired));
                        }
                        continue;
                    }
                    Ok(reply) => {
                        let parsed = failures_from_reply(&reply, chunk.len());
                        outcome.affected += parsed.n;
                        parsed.failures
                    }
                    Err(Sent::Failed(error)) => {
                        let failure = failure_from_error(&error);
                        (0..chunk.len()).map(|i| (i, failure.clone())).collect()
                    }
                };
                let mut failed = vec![false; chunk.len()];
                let mut overloaded = false;
                for (i, failure) in failures {
                    failed[i] = true;
                    let position = chunk[i];
                    let index = encoded[position].0;
                    match classify(&failure) {
                        FailureClass::AlreadyPresent => {
                            outcome
                                .results
                                .push((index, StatementResult::AlreadyPresent));
                        }
                        FailureClass::Permanent => {
                            outcome
                                .results
                                .push((index, dead_letter(&failure, attempt)));
                        }
                        FailureClass::Overload => {
                            overloaded = true;
                            retry.push((position, failure));
                        }
                        FailureClass::Transient => retry.push((position, failure)),
                    }
                }
                for (i, _) in failed.iter().enumerate().filter(|(_, f)| !**f) {
                    outcome.results.push((encoded[chunk[i]].0, success.clone()));
                }
                if overloaded {
                    outcome.report.overload_events += 1;
                    if let Some(sink) = &self.overload {
                        sink.overloaded(&location.shard);
                    }
                }
            }

            if retry.is_empty() {
                break;
            }
            if attempt >= policy.max_attempts {
                for (position, failure) in retry {
                    let index = encoded[position].0;
                    outcome
                        .results
                        .push((index, dead_letter(&failure, attempt)));
                }
                break;
            }
            outcome.report.retries += retry.len() as u64;
            let delay = backoff_delay(
                attempt,
                policy.base_delay,
                policy.max_delay,
                &mut rand::thread_rng(),
            );
            match &deadline {
                Some(d) => {
                    tokio::time::sleep_until(d.now().min(tokio::time::Instant::now() + delay)).await
                }
                None => tokio::time::sleep(delay).await,
            }
            attempt += 1;
            pending = retry.into_iter().map(|(position, _)| position).collect();
        }
        outcome.report.finished_after = started.elapsed();
        outcome
    }
}

/// When a batch's commands must end: a fixed instant, or one read again before each command
/// (a lease's deadline, which moves later as the lease is renewed).
#[derive(Clone)]
pub struct Deadline(Arc<dyn Fn() -> tokio::time::Instant + Send + Sync>);

impl Deadline {
    /// A fixed deadline.
    pub fn at(instant: tokio::time::Instant) -> Deadline {
        Deadline(Arc::new(move || instant))
    }

    /// A deadline `read` gives anew each time it is asked.
    pub fn read(read: impl Fn() -> tokio::time::Instant + Send + Sync + 'static) -> Deadline {
        Deadline(Arc::new(read))
    }

    /// The deadline now.
    pub fn now(&self) -> tokio::time::Instant {
        (self.0)()
    }
}

/// Why a command has no reply.
enum Sent {
    /// The deadline came first (before sending, or before the answer).
    Expired,
    Failed(mongodb::error::Error),
}

/// Sends one command, holding one of the shard's in-flight permits; returns the reply and the
/// round-trip time (the wait for the permit excluded). With a deadline, the command carries
/// `maxTimeMS` until it and is waited for only until it.
async fn send(
    shard: &Shard,
    mut command: RawDocumentBuf,
    deadline: Option<&Deadline>,
) -> (Result<Document, Sent>, Duration) {
    let _permit = shard
        .in_flight
        .acquire()
        .await
        .expect("the in-flight semaphore is never closed");
    let sent = Instant::now();
    // Read once the permit is held: the command ends by the deadline known when it is sent.
    let Some(deadline) = deadline.map(Deadline::now) else {
        let reply = shard.database.run_raw_command(command).await;
        return (reply.map_err(Sent::Failed), sent.elapsed());
    };
    let now = tokio::time::Instant::now();
    if now >= deadline {
        return (Err(Sent::Expired), Duration::ZERO);
    }
    command.append("maxTimeMS", (deadline - now).as_millis().max(1) as i64);
    let reply =
        match tokio::time::timeout_at(deadline, shard.database.run_raw_command(command)).await {
            Err(_) => Err(Sent::Expired),
            Ok(reply) => reply.map_err(Sent::Failed),
        };
    (reply, sent.elapsed())
}

fn build_command<'a>(
    kind: OpKind,
    collection: &str,
    statements: impl Iterator<Item = &'a RawDocumentBuf>,
    write_concern: &WriteConcern,
) -> RawDocumentBuf {
    let mut array = RawArrayBuf::new();
    for statement in statements {
        array.push(RawBson::Document(statement.clone()));
    }
    let mut command = rawdoc! {};
    command.append(kind.command_name(), collection);
    command.append(kind.array_name(), array);
    command.append("ordered", false);
    let concern = mongodb::bson::to_document(write_concern)
        .ok()
        .and_then(|d| RawDocumentBuf::from_document(&d).ok());
    if let Some(concern) = concern.filter(|c| !c.is_empty()) {
        command.append("writeConcern", concern);
    }
    command
}

fn dead_letter(failure: &WriteFailure, attempts: u32) -> StatementResult {
    StatementResult::DeadLettered {
        code: failure.code,
        code_name: failure.code_name.clone(),
        message: failure.message.clone(),
        info: failure.info.clone(),
        class: classify(failure),
        attempts,
    }
}

/// The bytes of `{"": id}`: equal for equal ids of the same BSON type. (An int32 and an int64
/// id of the same value are kept apart here; the server then reports the second as a
/// duplicate key.)
fn id_key(id: &Bson) -> Vec<u8> {
    let mut raw = RawDocumentBuf::new();
    match RawBson::try_from(id.clone()) {
        Ok(value) => raw.append("", value),
        Err(_) => return format!("{id:?}").into_bytes(),
    }
    raw.into_bytes()
}

fn merge_shard_report(into: &mut ShardReport, from: ShardReport) {
    into.commands += from.commands;
    into.statements_sent += from.statements_sent;
    into.retries += from.retries;
    into.overload_events += from.overload_events;
    into.latencies.extend(from.latencies);
    into.finished_after = into.finished_after.max(from.finished_after);
}

#[cfg(test)]
mod tests;

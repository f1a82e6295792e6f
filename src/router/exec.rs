//! Turns the protocol's single-document steps into MongoDB commands on the right location,
//! and stamps what the router writes (`_reshard`, the routing field).
//!
//! Every step runs under the router's lease: it is not sent once the lease is about to run
//! out, and the command it sends ends before the lease does ([`crate::shards::command`]). An
//! operation cut short that way reports [`RouterError::RoutingStale`] when it had only read,
//! and [`RouterError::OutcomeUnknown`] when a write of it may have landed.

use mongodb::bson::{doc, Bson, Document};
use tokio::time::Instant;

use super::{Inner, RouterError, Snapshot};
use crate::envelope::{self, is_tombstone, revision, META};
use crate::protocol::{
    self, Answer, Found, Interrupted, Listed, Next, Operation, OperationMachine, Outcome, Payload,
    Side, Step,
};
use crate::routing::{KeyValue, Located, Location, RoutingVersion};
use crate::shards::command::{self, CommandError, Modify, Written};
use crate::shards::At;

/// The keys of the document an operation addresses, as given and as routing keys, and the
/// operation's terms.
pub struct Keys<'a> {
    pub tenant: &'a Bson,
    pub id: &'a Bson,
    pub tenant_key: &'a KeyValue,
    pub id_key: &'a KeyValue,
    pub terms: &'a Terms,
}

/// What an operation asks beyond the protocol's single document: a condition the document
/// must match besides its id, and the image of it the caller wants back. The library's own
/// calls ask neither; the front's `update`, `delete` and `findAndModify` with a filter do.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Terms {
    /// A filter (MongoDB's query language, evaluated by the server holding the document)
    /// the document must match as well as its id. The executor checks it with every find
    /// ([`Found::Unmatched`] when a live document does not match) and puts it in the filter
    /// of every write that acts on a live document, so it holds at the moment of the write.
    pub condition: Option<Document>,
    /// Which image of the document the caller wants back.
    pub image: Image,
}

/// Which image of a written document an operation returns ([`Terms::image`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Image {
    #[default]
    None,
    /// As it was before the write (`None` when the write created it).
    Before,
    /// As the write left it (`None` when the write deleted it).
    After,
}

/// The images of the document an operation's writes saw, as stored (the outcome shows them
/// as the application sees them: [`Snapshot::view`]).
#[derive(Debug, Default)]
struct Images {
    before: Option<Document>,
    after: Option<Document>,
    /// The live document the last find of each side returned (source, target).
    found: [Option<Document>; 2],
}

impl Images {
    fn found_on(&mut self, side: Side) -> &mut Option<Document> {
        &mut self.found[usize::from(side == Side::Target)]
    }

    /// A write replaced `before` by `after`.
    fn wrote(&mut self, before: Option<Document>, after: Option<Document>) {
        self.before = before;
        self.after = after;
    }

    fn pick(self, image: Image) -> Option<Document> {
        match image {
            Image::None => None,
            Image::Before => self.before,
            Image::After => self.after,
        }
    }
}

/// Runs one protocol machine to its outcome, each step under the router's lease, with the
/// image [`Terms::image`] asks for.
pub async fn run_operation(
    inner: &Inner,
    snapshot: &Snapshot,
    keys: &Keys<'_>,
    op: Operation<Document, Document>,
) -> Result<(Outcome<Document>, Option<Document>), RouterError> {
    let mut machine = OperationMachine::new(snapshot.phase, op).sealed(snapshot.sealed);
    let mut answer = None;
    let mut images = Images::default();
    loop {
        // The lease is checked again before every step (not only when the operation starts):
        // a step delayed past it must not land after the driver counted this router out.
        let step = match machine.next(answer.take())? {
            Next::Done(outcome) => {
                let outcome = match outcome {
                    Outcome::Read(found) => Outcome::Read(found.map(|d| snapshot.view(d))),
                    other => other,
                };
                let image = images.pick(keys.terms.image).map(|d| snapshot.view(d));
                return Ok((outcome, image));
            }
            Next::Do(step) => step,
        };
        let side = step_side(&step);
        if let Some(hook) = &inner.config.step_hook {
            hook(step_event(&step, side)).await;
        }
        let Some(deadline) = inner.step_deadline() else {
            return Err(interrupted(machine.interrupted()));
        };
        match execute(inner, snapshot, keys, step, deadline, &mut images).await {
            Ok(a) => answer = Some(a),
            Err(StepError::NotSent) => return Err(interrupted(machine.interrupted())),
            Err(StepError::NoAnswer) => return Err(interrupted(machine.interrupted_in_flight())),
            Err(StepError::Router(e)) => return Err(e),
        }
    }
}

/// The error of an operation its lease cut short.
fn interrupted(what: Interrupted) -> RouterError {
    match what {
        Interrupted::NothingApplied => RouterError::RoutingStale,
        Interrupted::MayHaveApplied => RouterError::OutcomeUnknown,
    }
}

/// Why a step did not answer.
enum StepError {
    /// The lease's deadline had passed: the step (or the part of it left) was not sent.
    NotSent,
    /// Sent, and no answer came by the lease's deadline: it may have landed, by then.
    NoAnswer,
    Router(RouterError),
}

impl<E: Into<RouterError>> From<E> for StepError {
    fn from(e: E) -> Self {
        StepError::Router(e.into())
    }
}

fn command_error(e: CommandError) -> StepError {
    match e {
        CommandError::NotSent => StepError::NotSent,
        CommandError::NoAnswer => StepError::NoAnswer,
        CommandError::Write(failure) => StepError::Router(RouterError::Write(failure)),
        CommandError::Mongo(e) => StepError::Router(RouterError::Mongo(e)),
    }
}

fn version(snapshot: &Snapshot, side: Side) -> &RoutingVersion {
    match side {
        Side::Source => &snapshot.source,
        Side::Target => &snapshot.target,
    }
}

/// The collection at `location`, for the step commands.
fn at(inner: &Inner, location: &Location) -> Result<At, RouterError> {
    inner
        .shards
        .at(location)
        .map_err(|e| RouterError::UnknownShard(e.0))
}

async fn execute(
    inner: &Inner,
    snapshot: &Snapshot,
    keys: &Keys<'_>,
    step: Step<Document, Document>,
    deadline: Instant,
    images: &mut Images,
) -> Result<Answer<Document>, StepError> {
    let wc = &inner.config.write_concern;
    let side = step_side(&step);
    if let Step::MirrorToSource = step {
        return mirror_to_source(inner, snapshot, keys, wc, deadline).await;
    }
    let v = version(snapshot, side);
    let located = v.locate(keys.tenant_key, keys.id_key)?;
    let by_id = doc! { "_id": keys.id.clone() };
    let condition = keys.terms.condition.as_ref();
    // The writes that act on a live document hold only while it matches the condition.
    let live = match condition {
        Some(c) => crate::ids::and(envelope::live(keys.id), c.clone()),
        None => envelope::live(keys.id),
    };
    let tombstone = envelope::tombstone_of(keys.id);
    if let Step::Find(side) = step {
        let found = match find(inner, side, &located.locations, &by_id, condition, deadline).await?
        {
            None => Found::Absent,
            Some((found, _, _)) if is_tombstone(&found) => Found::Tombstone,
            Some((_, _, false)) => Found::Unmatched,
            Some((found, _, true)) => Found::Live(found),
        };
        // Each find replaces what the last one of its side saw: an image is never one an
        // earlier round of a restarted operation read.
        *images.found_on(side) = match &found {
            Found::Live(d) => Some(d.clone()),
            _ => None,
        };
        return Ok(Answer::Found(found));
    }
    // A version that lists several locations for the id (a fanout source) holds its document
    // on one of them: every listed location is asked at once, and the protocol says where
    // the write goes (where the document is; an insert only where none is), or answers it
    // without sending anything.
    let location = match located.locations.as_slice() {
        [location] => location,
        listed => {
            let holds = holding(inner, listed, &by_id, deadline).await?;
            match protocol::listed_location(&step, listed, &holds) {
                Listed::At(location) => location,
                Listed::Answered(answer) => return Ok(answer),
            }
        }
    };
    let at = &at(inner, location)?;
    let materialise = |payload: Payload<Document>, rev: i64| {
        let mut doc = materialise(snapshot, v, &located, keys, payload, rev);
        if let Some(m) = rolled_back_source(snapshot, side) {
            if let Ok(meta) = doc.get_document_mut(META) {
                meta.insert("mig", m);
            }
        }
        doc
    };
    let delete = |filter: Document| async move {
        command::delete_one(at, filter, wc, deadline)
            .await
            .map(|w| Answer::Matched(w.matched()))
            .map_err(command_error)
    };
    Ok(match step {
        Step::Find(_) => unreachable!("handled above"),
        Step::Insert(_, payload) => {
            // A new id starts at revision 1; a pristine copy is revision 0.
            let rev = i64::from(!matches!(payload, Payload::Copy(_)));
            let kind = PayloadKind::of(&payload);
            let doc = materialise(payload, rev);
            let after = (kind == PayloadKind::App).then(|| doc.clone());
            match command::insert_one(at, doc, wc, deadline)
                .await
                .map_err(command_error)?
            {
                Written::Applied { .. } => {
                    match kind {
                        // The application's document in the target: over the source's
                        // live image when it replaces a document only the source holds,
                        // else a new one.
                        PayloadKind::App => {
                            let before = match side {
                                Side::Target => images.found_on(Side::Source).take(),
                                Side::Source => None,
                            };
                            images.wrote(before, after)
                        }
                        // A delete of a document only the source holds: the source's image
                        // is the one deleted.
                        PayloadKind::Tombstone => {
                            let before = images.found_on(Side::Source).take();
                            images.wrote(before, None);
                        }
                        PayloadKind::Copy => {}
                    }
                    Answer::Inserted
                }
                Written::DuplicateKey => Answer::DuplicateKey,
            }
        }
        Step::ReplaceLive(_, payload) => {
            let kind = PayloadKind::of(&payload);
            let replaced = replace_next_revision(at, &live, wc, deadline, |rev| {
                materialise(payload.clone(), rev)
            })
            .await?;
            let matched = replaced.is_some();
            if let Some((before, after)) = replaced {
                images.wrote(Some(before), (kind == PayloadKind::App).then_some(after));
            }
            Answer::Matched(matched)
        }
        Step::ReplaceTombstone(_, payload) => {
            let kind = PayloadKind::of(&payload);
            let replaced = replace_next_revision(at, &tombstone, wc, deadline, |rev| {
                materialise(payload.clone(), rev)
            })
            .await?;
            let matched = replaced.is_some();
            if let Some((_, after)) = replaced {
                images.wrote(None, (kind == PayloadKind::App).then_some(after));
            }
            Answer::Matched(matched)
        }
        Step::ReplaceCopy(_, payload) => {
            let filter = crate::envelope::pristine_copy_of(keys.id);
            let w = command::update_one(at, filter, materialise(payload, 0), false, wc, deadline)
                .await
                .map_err(command_error)?;
            Answer::Matched(w.matched())
        }
        Step::UpdateLive(_, update) => {
            let mut update = envelope::app_update(update, v, located.sub_bucket, snapshot.epoch);
            if let Some(m) = rolled_back_source(snapshot, side) {
                if let Ok(set) = update.get_document_mut("$set") {
                    set.insert(format!("{META}.mig"), m);
                }
            }
            if keys.terms.image == Image::None {
                let w = command::update_one(at, live, update, false, wc, deadline)
                    .await
                    .map_err(command_error)?;
                return Ok(Answer::Matched(w.matched()));
            }
            // The image and the write in one server operation: no writer gets in between.
            let after = keys.terms.image == Image::After;
            let image = command::find_and_modify(
                at,
                live,
                Modify::Update(update.into()),
                after,
                wc,
                deadline,
            )
            .await
            .map_err(command_error)?;
            let matched = image.is_some();
            if after {
                images.wrote(None, image);
            } else {
                images.wrote(image, None);
            }
            Answer::Matched(matched)
        }
        Step::Delete(_) => delete(by_id).await?,
        Step::DeleteLive(_) if keys.terms.image == Image::Before => {
            let image = command::find_and_modify(at, live, Modify::Remove, false, wc, deadline)
                .await
                .map_err(command_error)?;
            let matched = image.is_some();
            images.wrote(image, None);
            Answer::Matched(matched)
        }
        Step::DeleteLive(_) => delete(live).await?,
        Step::DeleteTombstone(_) => delete(tombstone).await?,
        Step::DeleteUnmarked(_) => delete(envelope::unmarked_of(keys.id)).await?,
        Step::MirrorToSource => unreachable!("handled above"),
    })
}

/// After a rollback, a source write carries the migration (`_reshard.mig`) and counts its
/// revision on from the mirrored one: a router still in `revert_switch` may carry an older
/// target image of the id back to the source, and the mirror's condition
/// ([`envelope::mirror`]) then sees the source as newer.
fn rolled_back_source(snapshot: &Snapshot, side: Side) -> Option<i64> {
    (snapshot.phase == crate::phase::Phase::RolledBack && side == Side::Source)
        .then_some(snapshot.migration_id)
        .flatten()
}

/// The document `by_id` finds at `location`, if any, and whether it matches `condition`
/// (read with it in one atomic step; `true` without a condition).
async fn probe(
    inner: &Inner,
    location: &Location,
    by_id: &Document,
    condition: Option<&Document>,
    deadline: Instant,
) -> Result<Option<(Document, bool)>, StepError> {
    let at = at(inner, location)?;
    match condition {
        None => command::find_one(&at, by_id.clone(), deadline)
            .await
            .map(|found| found.map(|d| (d, true))),
        Some(c) => {
            // A condition of plain equalities the document surely meets (the tenant and `_id`
            // a driver names a document by, say) is judged on the one document a find read,
            // as atomic as the server's judgement and much cheaper than an aggregation; any
            // other verdict is the server's.
            match command::find_one(&at, by_id.clone(), deadline).await {
                Ok(Some(d)) if crate::mql::filter::surely_matches(&d, c) => Ok(Some((d, true))),
                Ok(None) => Ok(None),
                Ok(Some(_)) => command::find_one_matching(&at, by_id.clone(), c, deadline).await,
                Err(e) => Err(e),
            }
        }
    }
    .map_err(command_error)
}

/// What each of `locations` holds under `by_id`, asked of all at once.
async fn probe_each(
    inner: &Inner,
    locations: &[Location],
    by_id: &Document,
    condition: Option<&Document>,
    deadline: Instant,
) -> Result<Vec<Option<(Document, bool)>>, StepError> {
    futures::future::try_join_all(
        locations
            .iter()
            .map(|location| probe(inner, location, by_id, condition, deadline)),
    )
    .await
}

/// Whether each of `locations` holds a document matching `by_id`, asked of all at once.
async fn holding(
    inner: &Inner,
    locations: &[Location],
    by_id: &Document,
    deadline: Instant,
) -> Result<Vec<bool>, StepError> {
    let found = probe_each(inner, locations, by_id, None, deadline).await?;
    Ok(found.iter().map(Option::is_some).collect())
}

/// The document `by_id` finds on `side` among `locations` (those its version lists for the
/// id), where, and whether it matches `condition`: at the one location of a hashed layout;
/// among several (`fanout`), each asked at once, where the protocol reads it
/// ([`protocol::listed_location`]: the first listed location holding the id).
async fn find<'a>(
    inner: &Inner,
    side: Side,
    locations: &'a [Location],
    by_id: &Document,
    condition: Option<&Document>,
    deadline: Instant,
) -> Result<Option<(Document, &'a Location, bool)>, StepError> {
    if let [location] = locations {
        let found = probe(inner, location, by_id, condition, deadline).await?;
        return Ok(found.map(|(found, matched)| (found, location, matched)));
    }
    let mut found = probe_each(inner, locations, by_id, condition, deadline).await?;
    let holds: Vec<bool> = found.iter().map(Option::is_some).collect();
    let step = Step::<Document, Document>::Find(side);
    Ok(match protocol::listed_location(&step, locations, &holds) {
        Listed::At(location) => locations
            .iter()
            .position(|l| std::ptr::eq(l, location))
            .and_then(|i| found[i].take())
            .map(|(found, matched)| (found, location, matched)),
        Listed::Answered(_) => None,
    })
}

/// Carries the target's image of the id to the source unless the source already holds an equal
/// or newer revision (see [`Step::MirrorToSource`]).
async fn mirror_to_source(
    inner: &Inner,
    snapshot: &Snapshot,
    keys: &Keys<'_>,
    wc: &mongodb::options::WriteConcern,
    deadline: Instant,
) -> Result<Answer<Document>, StepError> {
    let target = snapshot.target.locate(keys.tenant_key, keys.id_key)?;
    let by_id = doc! { "_id": keys.id.clone() };
    let Some((image, found_at, _)) = find(
        inner,
        Side::Target,
        &target.locations,
        &by_id,
        None,
        deadline,
    )
    .await?
    else {
        return Ok(Answer::Matched(false));
    };
    let source = snapshot.source.locate(keys.tenant_key, keys.id_key)?;
    // In a collection both layouts share, the image is the source's document already.
    if !protocol::mirror_writes(found_at, &source.locations) {
        return Ok(Answer::Matched(true));
    }
    // A fanout source lists several locations the id may be on: the mirror replaces the
    // source document where it is (the first listed location holding the id, as a read finds
    // it), not a new one beside it at the first listed location, which a mirrored delete
    // would leave live after the rollback.
    let holds = if source.locations.len() > 1 {
        holding(inner, &source.locations, &by_id, deadline).await?
    } else {
        Vec::new()
    };
    let Some(back) = protocol::mirror_location(&source.locations, &holds) else {
        return Ok(Answer::Matched(false));
    };
    let (filter, image) = envelope::mirror(
        image,
        snapshot.migration_id.unwrap_or(0),
        &snapshot.source,
        &snapshot.target,
        source.sub_bucket,
    );
    // The duplicate key of a refused upsert means the source is already newer.
    let w = command::update_one(&at(inner, back)?, filter, image, true, wc, deadline)
        .await
        .map_err(command_error)?;
    Ok(Answer::Matched(w.matched()))
}

/// Replaces the document matching `filter` by `make(previous revision + 1)`, as one atomic
/// compare-and-set on the revision it read: a concurrent writer that got in between makes the
/// replace match nothing, and it is tried again on the new revision. Returns the document it
/// replaced and the one it wrote, or `None` when no document matches `filter` any more.
async fn replace_next_revision(
    at: &At,
    filter: &Document,
    wc: &mongodb::options::WriteConcern,
    deadline: Instant,
    make: impl Fn(i64) -> Document,
) -> Result<Option<(Document, Document)>, StepError> {
    loop {
        let current = command::find_one(at, filter.clone(), deadline)
            .await
            .map_err(command_error)?;
        let Some(current) = current else {
            return Ok(None);
        };
        let rev = revision(&current);
        let mut cas = filter.clone();
        if rev == 0 {
            cas.insert(format!("{META}.rev"), doc! { "$in": [0, Bson::Null] });
        } else {
            cas.insert(format!("{META}.rev"), rev);
        }
        let next = make(rev + 1);
        let w = command::update_one(at, cas, next.clone(), false, wc, deadline)
            .await
            .map_err(command_error)?;
        if w.matched() {
            return Ok(Some((current, next)));
        }
    }
}

/// What a payload is, once it has been materialised.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum PayloadKind {
    App,
    Copy,
    Tombstone,
}

impl PayloadKind {
    fn of<D>(payload: &Payload<D>) -> PayloadKind {
        match payload {
            Payload::App(_) => PayloadKind::App,
            Payload::Copy(_) => PayloadKind::Copy,
            Payload::Tombstone => PayloadKind::Tombstone,
        }
    }
}

fn step_event<D, U>(step: &Step<D, U>, side: Side) -> super::StepEvent {
    let payload_name = |p: &Payload<D>| match p {
        Payload::App(_) => "app",
        Payload::Copy(_) => "copy",
        Payload::Tombstone => "tombstone",
    };
    let (step, payload) = match step {
        Step::Find(_) => ("find", None),
        Step::Insert(_, p) => ("insert", Some(payload_name(p))),
        Step::ReplaceLive(_, p) => ("replace_live", Some(payload_name(p))),
        Step::ReplaceTombstone(_, p) => ("replace_tombstone", Some(payload_name(p))),
        Step::ReplaceCopy(_, p) => ("replace_copy", Some(payload_name(p))),
        Step::UpdateLive(_, _) => ("update_live", None),
        Step::Delete(_) => ("delete", None),
        Step::DeleteLive(_) => ("delete_live", None),
        Step::DeleteTombstone(_) => ("delete_tombstone", None),
        Step::DeleteUnmarked(_) => ("delete_unmarked", None),
        Step::MirrorToSource => ("mirror_to_source", None),
    };
    super::StepEvent {
        step,
        side,
        payload,
    }
}

fn step_side<D, U>(step: &Step<D, U>) -> Side {
    match step {
        Step::Find(s)
        | Step::Insert(s, _)
        | Step::ReplaceLive(s, _)
        | Step::ReplaceTombstone(s, _)
        | Step::ReplaceCopy(s, _)
        | Step::UpdateLive(s, _)
        | Step::Delete(s)
        | Step::DeleteLive(s)
        | Step::DeleteTombstone(s)
        | Step::DeleteUnmarked(s) => *s,
        Step::MirrorToSource => Side::Source,
    }
}

/// A duplicate key on `_id`.
pub fn is_duplicate_key(e: &mongodb::error::Error) -> bool {
    crate::shards::classify::is_duplicate_key(e)
}

fn materialise(
    snapshot: &Snapshot,
    version: &RoutingVersion,
    located: &Located,
    keys: &Keys<'_>,
    payload: Payload<Document>,
    rev: i64,
) -> Document {
    match payload {
        Payload::App(d) => envelope::app_write(d, version, located.sub_bucket, snapshot.epoch, rev),
        // A copy keeps the source document's revision, so revisions only grow across the
        // sides: a mirror back to the source compares like with like.
        Payload::Copy(d) => envelope::copy(d, version, located.sub_bucket, snapshot.epoch),
        Payload::Tombstone => envelope::tombstone(
            keys.id,
            keys.tenant,
            version,
            located.sub_bucket,
            snapshot.epoch,
            rev,
        ),
    }
}

/// Fields no write may set: the tenant key, the id, the routing fields, `_reshard`.
fn immutable(snapshot: &Snapshot, path: &str) -> bool {
    let mut fields = Vec::new();
    fields.extend(snapshot.source.routing_field());
    fields.extend(snapshot.target.routing_field());
    envelope::immutable(path, &snapshot.target.tenant_key, &fields)
}

/// A whole document the application writes may not carry reshard's bookkeeping, nor a
/// routing field of the versions in play (reshard derives it from the tenant and the id, and
/// the application never sees it: [`Snapshot::view`]).
pub fn check_document(snapshot: &Snapshot, doc: &Document) -> Result<(), RouterError> {
    if doc.contains_key(META) {
        return Err(RouterError::InvalidUpdate(format!(
            "{META} is reserved for reshard's bookkeeping"
        )));
    }
    for field in [
        snapshot.source.routing_field(),
        snapshot.target.routing_field(),
    ]
    .into_iter()
    .flatten()
    {
        if doc.contains_key(field) {
            return Err(RouterError::InvalidUpdate(format!(
                "{field:?} is the routing field of the collection's layout: reshard sets it \
                 from the tenant key and the id, and a document may not carry it"
            )));
        }
    }
    Ok(())
}

/// A partial update must use update operators and leave the immutable fields alone.
pub fn check_update(snapshot: &Snapshot, update: &Document) -> Result<(), RouterError> {
    if update.is_empty() {
        return Err(RouterError::InvalidUpdate("the update is empty".into()));
    }
    for (op, fields) in update {
        if !op.starts_with('$') {
            return Err(RouterError::InvalidUpdate(format!(
                "{op:?} is not an update operator; use replace() for whole documents"
            )));
        }
        let Bson::Document(fields) = fields else {
            return Err(RouterError::InvalidUpdate(format!(
                "{op} must be given a document"
            )));
        };
        for (path, value) in fields {
            if immutable(snapshot, path) {
                return Err(RouterError::ImmutableField(path.clone()));
            }
            if op == "$rename" {
                if let Bson::String(to) = value {
                    if immutable(snapshot, to) {
                        return Err(RouterError::ImmutableField(to.clone()));
                    }
                }
            }
        }
    }
    Ok(())
}

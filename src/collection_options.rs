//! Which of a collection's options reshard carries to the target collections it creates, and
//! which make it refuse the migration: a decision over what `listCollections` says of each
//! location (its `type` and `options`), taken before anything is created ([`crate::prepare`]).
//!
//! MongoDB's `create` options (the manual's `create` command), one by one:
//! - carried to a target reshard creates, and compared on a target that exists: `validator`,
//!   `validationLevel`, `validationAction`, `collation` (how every query, sort and unique
//!   index compares strings), `changeStreamPreAndPostImages`, `clusteredIndex` and the
//!   `expireAfterSeconds` that goes with it;
//! - carried, not compared: `storageEngine` and `indexOptionDefaults` say how a server stores
//!   the data, not what the collection holds or how it answers; an operator may choose
//!   otherwise for a target on new hardware;
//! - refused: a view (`viewOn`, `pipeline`), a time-series collection (`timeseries`), a capped
//!   one (`capped`, with `size` and `max`), Queryable Encryption (`encryptedFields`), no `_id`
//!   index (`autoIndexId: false`): reshard's copies and write protocol cannot reproduce them
//!   ([`Unmovable`] says why, each);
//! - ignored: `autoIndexId: true` (the default) and `flags` (MMAPv1's allocation setting,
//!   which WiredTiger ignores);
//! - any other option is one reshard cannot judge: it creates no target without it, and keeps
//!   a target the operator created with the same value.
//!
//! A validator is carried only if it lets reshard's own documents through (see
//! [`ValidatorProblem`]): copies and the application's writes carry `_reshard` and the routing
//! field, and a delete leaves a tombstone that holds little else. Where the source locations
//! differ in an option that is compared, the migration is refused: the targets get one set.

use std::fmt;

use mongodb::bson::{Bson, Document};

use crate::envelope::META;
use crate::routing::{Location, RoutingVersion};

mod validator;
use validator::validator_problems;

/// What `listCollections` says of one collection: its kind and its options.
#[derive(Clone, Debug, PartialEq)]
pub struct Listing {
    /// `collection`, `view` or `timeseries`.
    pub kind: String,
    pub options: Document,
}

impl Listing {
    /// An ordinary collection with `options`.
    pub fn collection(options: Document) -> Listing {
        Listing {
            kind: "collection".to_owned(),
            options,
        }
    }

    /// From one entry of a `listCollections` reply (`type` is missing before MongoDB 3.4:
    /// those were collections).
    pub fn from_entry(entry: &Document) -> Listing {
        Listing {
            kind: entry.get_str("type").unwrap_or("collection").to_owned(),
            options: entry.get_document("options").cloned().unwrap_or_default(),
        }
    }
}

/// The fields of the documents reshard writes that a validator has to let through.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Bookkeeping {
    /// The target version's: a tombstone in the target carries it.
    pub tenant_key: String,
    /// The routing fields of both versions: a copy keeps its source's and gets the target's.
    pub routing_fields: Vec<String>,
}

impl Bookkeeping {
    pub fn of(from: &RoutingVersion, to: &RoutingVersion) -> Bookkeeping {
        let mut routing_fields: Vec<String> = [from.routing_field(), to.routing_field()]
            .into_iter()
            .flatten()
            .map(str::to_owned)
            .collect();
        routing_fields.dedup();
        Bookkeeping {
            tenant_key: to.tenant_key.clone(),
            routing_fields,
        }
    }

    /// The fields reshard adds to the application's documents.
    fn added(&self) -> Vec<&str> {
        std::iter::once(META)
            .chain(self.routing_fields.iter().map(String::as_str))
            .collect()
    }

    /// Every field a tombstone holds (`envelope::tombstone`).
    fn tombstone(&self) -> Vec<&str> {
        ["_id", self.tenant_key.as_str()]
            .into_iter()
            .chain(self.routing_fields.iter().map(String::as_str))
            .chain(std::iter::once(META))
            .collect()
    }
}

/// A kind of collection reshard cannot move, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Unmovable {
    /// A view of another collection.
    View {
        on: String,
    },
    TimeSeries,
    Capped,
    /// Queryable Encryption's `encryptedFields`.
    Encrypted,
    /// `autoIndexId: false`.
    WithoutIdIndex,
    /// A `type` other than `collection`, `view` and `timeseries`.
    Other(String),
}

impl Unmovable {
    fn what(&self) -> String {
        match self {
            Unmovable::View { on } => format!("a view (of {on:?})"),
            Unmovable::TimeSeries => "a time-series collection".to_owned(),
            Unmovable::Capped => "a capped collection".to_owned(),
            Unmovable::Encrypted => {
                "a collection with Queryable Encryption (encryptedFields)".to_owned()
            }
            Unmovable::WithoutIdIndex => "a collection without an _id index".to_owned(),
            Unmovable::Other(kind) => format!("of type {kind:?}, not a collection"),
        }
    }

    fn why(&self) -> &'static str {
        match self {
            Unmovable::View { .. } => {
                "it holds no documents of its own to move. Reshard the collection it reads, \
                 then define the view again where the application reads it"
            }
            Unmovable::TimeSeries => {
                "MongoDB keeps its documents in buckets, with no unique index on _id and no \
                 replacement by _id, which reshard's copies and the router's writes are made \
                 of. Move it with MongoDB's own tools (mongodump and mongorestore, or $out into \
                 time-series collections laid out as the target version says)"
            }
            Unmovable::Capped => {
                "once full it evicts its oldest documents, so the copies, tombstones and \
                 application writes reshard puts in it would push out documents nobody \
                 deleted (and MongoDB cannot shard a capped collection either). Copy it into an \
                 ordinary collection ($out), rename that into its place (or expire documents \
                 with a TTL index instead of the cap), and advance again"
            }
            Unmovable::Encrypted => {
                "the metadata of its encrypted fields lives in state collections of its own, \
                 which reshard's copies do not carry. Move it with a client that decrypts and \
                 encrypts again"
            }
            Unmovable::WithoutIdIndex => {
                "reshard finds, copies and writes documents by _id and needs it unique. Copy \
                 it into a collection with an _id index first"
            }
            Unmovable::Other(_) => {
                "reshard moves the documents of ordinary collections only. Move it with \
                 MongoDB's own tools"
            }
        }
    }
}

/// Why a source's validator would refuse documents reshard writes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ValidatorProblem {
    /// It refuses copies and the application's writes through the router, for their
    /// `_reshard` or routing field (`why`).
    RefusesBookkeeping {
        why: Vec<String>,
        added: Vec<String>,
    },
    /// It refuses tombstones (`why`), which hold only `fields`.
    RefusesTombstones {
        why: Vec<String>,
        fields: Vec<String>,
    },
    /// reshard cannot tell whether it accepts a tombstone holding only `fields`.
    MayRefuseTombstones { fields: Vec<String> },
}

/// Why the target collections cannot be made (or kept) as the source is.
#[derive(Clone, Debug, PartialEq)]
pub enum Refusal {
    /// Source collections of a kind reshard cannot move.
    Unmovable {
        locations: Vec<Location>,
        kind: Unmovable,
    },
    /// The sources' validator would refuse documents reshard writes.
    Validator {
        locations: Vec<Location>,
        problem: ValidatorProblem,
    },
    /// An option reshard does not know, on sources whose `targets` it would have to create.
    UnknownOption {
        locations: Vec<Location>,
        option: String,
        targets: Vec<Location>,
    },
    /// Two source locations differ in an option the targets would get.
    SourcesDiffer {
        option: String,
        first: Location,
        first_value: Option<Bson>,
        other: Location,
        other_value: Option<Bson>,
    },
    /// A target collection exists and is not an ordinary collection.
    TargetUnmovable { target: Location, kind: Unmovable },
    /// A target collection exists with another value of an option that matters.
    TargetDiffers {
        option: String,
        source: Location,
        source_value: Option<Bson>,
        target: Location,
        target_value: Option<Bson>,
    },
}

/// Every refusal of a migration's collection options, in the order found.
#[derive(Clone, Debug, PartialEq)]
pub struct Refused(pub Vec<Refusal>);

impl std::error::Error for Refused {}

impl fmt::Display for Refused {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "the collection's options cannot be carried to the target, so nothing was created:"
        )?;
        for refusal in &self.0 {
            write!(f, "\n- {refusal}")?;
        }
        Ok(())
    }
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Refusal::Unmovable { locations, kind } => write!(
                f,
                "{} {} {}: {}",
                listed(locations),
                if locations.len() > 1 {
                    "are each"
                } else {
                    "is"
                },
                kind.what(),
                kind.why()
            ),
            Refusal::Validator { locations, problem } => {
                let remedy = "the target gets the same validator";
                match problem {
                    ValidatorProblem::RefusesBookkeeping { why, added } => write!(
                        f,
                        "{}: the validator would refuse reshard's copies and the application's \
                         writes through the router: {}. Every document reshard writes carries \
                         {}; let them through on the source first (collMod), e.g. by adding {} \
                         to the schema's properties; {remedy}",
                        listed(locations),
                        why.join("; "),
                        fields(added),
                        added
                            .iter()
                            .map(|f| if f == META {
                                format!("{f}: {{bsonType: \"object\"}}")
                            } else {
                                format!("{f}: {{bsonType: \"int\"}}")
                            })
                            .collect::<Vec<_>>()
                            .join(" and ")
                    ),
                    ValidatorProblem::RefusesTombstones { why, fields: held } => write!(
                        f,
                        "{}: the validator would refuse reshard's tombstones: {}. {}",
                        listed(locations),
                        why.join("; "),
                        tombstone_remedy(held)
                    ),
                    ValidatorProblem::MayRefuseTombstones { fields: held } => write!(
                        f,
                        "{}: reshard cannot tell whether the validator accepts its tombstones \
                         (it judges a $jsonSchema's required, properties and \
                         additionalProperties, and $and and $or of them). {}",
                        listed(locations),
                        tombstone_remedy(held)
                    ),
                }
            }
            Refusal::UnknownOption {
                locations,
                option,
                targets,
            } => write!(
                f,
                "{}: option {option:?} is one reshard does not know, so it creates no target \
                 collection without it ({}). Create those yourself with the source's options \
                 (reshard keeps a target that exists when its options match), or drop the \
                 option from the source",
                listed(locations),
                listed(targets)
            ),
            Refusal::SourcesDiffer {
                option,
                first,
                first_value,
                other,
                other_value,
            } => write!(
                f,
                "the source locations differ in {option:?}: {first} has {}, {other} has {}. \
                 The target collections get one set of options: make the sources agree \
                 first, then advance again",
                shown(first_value),
                shown(other_value)
            ),
            Refusal::TargetUnmovable { target, kind } => write!(
                f,
                "{target} exists and is {}; reshard writes a target's documents into an \
                 ordinary collection: drop it (or name another collection for its shard in \
                 the target version), then advance again",
                kind.what()
            ),
            Refusal::TargetDiffers {
                option,
                source,
                source_value,
                target,
                target_value,
            } => write!(
                f,
                "{target} exists with {option:?} {}, and the source ({source}) has {}: {}. \
                 Drop the target collection if it holds nothing yet, and reshard creates it as \
                 the source is; or make it match (collMod; a collation is set only when a \
                 collection is created)",
                shown(target_value),
                shown(source_value),
                consequence(option)
            ),
        }
    }
}

fn tombstone_remedy(held: &[String]) -> String {
    format!(
        "A delete through the router leaves a tombstone holding only {} in the target (and, \
         after a rollback, in the source), so the application's deletes would fail. Exempt \
         tombstones on the source first (collMod): validator {{$or: [{{\"{META}.deleted\": \
         true}}, <the validator>]}}; the target gets the same validator",
        fields(held)
    )
}

/// What a difference in `option` between a source and its target would change.
fn consequence(option: &str) -> &'static str {
    match option {
        "collation" => {
            "the two would compare strings differently, in queries, sorts and unique indexes"
        }
        "validator" | "validationLevel" | "validationAction" => {
            "the two would accept different documents"
        }
        "changeStreamPreAndPostImages" => {
            "change streams on the two would not carry the same images"
        }
        "clusteredIndex" | "expireAfterSeconds" => {
            "the two would store and expire documents differently"
        }
        _ => "the target would not be what the source is",
    }
}

fn listed(locations: &[Location]) -> String {
    locations
        .iter()
        .map(Location::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

/// `_id`, `customerId` and `_reshard`.
fn fields(names: &[String]) -> String {
    let quoted: Vec<String> = names.iter().map(|n| format!("`{n}`")).collect();
    match quoted.split_last() {
        Some((last, rest)) if !rest.is_empty() => format!("{} and {last}", rest.join(", ")),
        Some((last, _)) => last.clone(),
        None => "nothing".to_owned(),
    }
}

fn shown(value: &Option<Bson>) -> String {
    match value {
        Some(v) => v.to_string(),
        None => "none".to_owned(),
    }
}

/// What reshard does with one option.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Treatment {
    /// Carried to a target reshard creates and compared on one that exists.
    Carried,
    /// Carried to a target reshard creates; not compared (how the data is stored).
    Stored,
    /// Neither carried nor compared.
    Ignored,
    /// The collection cannot be moved.
    Unmovable(Unmovable),
    /// Not known to reshard: not carried; compared on a target that exists.
    Unknown,
}

fn treatment(name: &str, value: &Bson, options: &Document) -> Treatment {
    match name {
        "validator"
        | "validationLevel"
        | "validationAction"
        | "collation"
        | "changeStreamPreAndPostImages"
        | "clusteredIndex"
        | "expireAfterSeconds" => Treatment::Carried,
        "storageEngine" | "indexOptionDefaults" => Treatment::Stored,
        "flags" => Treatment::Ignored,
        "autoIndexId" if value == &Bson::Boolean(false) => {
            Treatment::Unmovable(Unmovable::WithoutIdIndex)
        }
        "autoIndexId" => Treatment::Ignored,
        "capped" if truthy(value) => Treatment::Unmovable(Unmovable::Capped),
        // `size` and `max` mean something only with `capped`, which is judged itself.
        "capped" | "size" | "max" => Treatment::Ignored,
        "timeseries" => Treatment::Unmovable(Unmovable::TimeSeries),
        "viewOn" | "pipeline" => Treatment::Unmovable(Unmovable::View {
            on: options.get_str("viewOn").unwrap_or("?").to_owned(),
        }),
        "encryptedFields" => Treatment::Unmovable(Unmovable::Encrypted),
        _ => Treatment::Unknown,
    }
}

fn truthy(value: &Bson) -> bool {
    match value {
        Bson::Boolean(b) => *b,
        Bson::Int32(n) => *n != 0,
        Bson::Int64(n) => *n != 0,
        Bson::Double(n) => *n != 0.0,
        Bson::Null => false,
        _ => true,
    }
}

/// The kind of a listed collection reshard cannot move, if it is one.
fn unmovable(listing: &Listing) -> Option<Unmovable> {
    match listing.kind.as_str() {
        "collection" => {}
        "view" => {
            return Some(Unmovable::View {
                on: listing.options.get_str("viewOn").unwrap_or("?").to_owned(),
            })
        }
        "timeseries" => return Some(Unmovable::TimeSeries),
        other => return Some(Unmovable::Other(other.to_owned())),
    }
    listing.options.iter().find_map(|(name, value)| {
        match treatment(name, value, &listing.options) {
            Treatment::Unmovable(kind) => Some(kind),
            _ => None,
        }
    })
}

/// The options a target reshard creates gets, as `create` takes them: what the listing says,
/// which is what `create` was given (MongoDB's listing is made to be created from again, as
/// mongorestore does), less what is not carried.
fn create_options(listing: &Listing) -> Document {
    listing
        .options
        .iter()
        .filter(|(name, value)| {
            matches!(
                treatment(name, value, &listing.options),
                Treatment::Carried | Treatment::Stored
            )
        })
        .map(|(name, value)| (name.clone(), value.clone()))
        .collect()
}

/// The options that two collections must share, with MongoDB's defaults written out so that
/// what a server lists and what it was given compare equal: no validator is an empty one, a
/// validator's level and action default to `strict` and `error`, the `simple` collation is no
/// collation, pre- and post-images not enabled are none.
fn compared(listing: &Listing) -> Document {
    let options = &listing.options;
    let mut out = Document::new();
    for (name, value) in options {
        match treatment(name, value, options) {
            Treatment::Carried | Treatment::Unknown => {}
            _ => continue,
        }
        match name.as_str() {
            "validator" => {
                if value.as_document().is_some_and(|v| !v.is_empty()) {
                    out.insert(name, value.clone());
                }
            }
            // Written out below, with the validator they belong to.
            "validationLevel" | "validationAction" => {}
            "collation" => {
                let simple =
                    value.as_document().and_then(|c| c.get_str("locale").ok()) == Some("simple");
                if !simple {
                    out.insert(name, value.clone());
                }
            }
            "changeStreamPreAndPostImages" => {
                let enabled = value
                    .as_document()
                    .and_then(|c| c.get_bool("enabled").ok())
                    .unwrap_or(false);
                if enabled {
                    out.insert(name, mongodb::bson::doc! { "enabled": true });
                }
            }
            "clusteredIndex" => {
                // The index version is the server's, not the collection's.
                let mut spec = value.clone();
                if let Bson::Document(d) = &mut spec {
                    d.remove("v");
                }
                out.insert(name, spec);
            }
            "expireAfterSeconds" => {
                let seconds = match value {
                    Bson::Int32(n) => Bson::Int64(i64::from(*n)),
                    Bson::Double(n) if n.fract() == 0.0 => Bson::Int64(*n as i64),
                    other => other.clone(),
                };
                out.insert(name, seconds);
            }
            _ => {
                out.insert(name, value.clone());
            }
        }
    }
    if out.contains_key("validator") {
        let level = options.get_str("validationLevel").unwrap_or("strict");
        let action = options.get_str("validationAction").unwrap_or("error");
        out.insert("validationLevel", level);
        out.insert("validationAction", action);
    }
    out
}

/// The options in which `a` and `b` differ, each with its value on either side, in `a`'s
/// order and then `b`'s.
fn differences(a: &Document, b: &Document) -> Vec<(String, Option<Bson>, Option<Bson>)> {
    let mut out = Vec::new();
    for (name, value) in a {
        if b.get(name) != Some(value) {
            out.push((name.clone(), Some(value.clone()), b.get(name).cloned()));
        }
    }
    for (name, value) in b {
        if !a.contains_key(name) {
            out.push((name.clone(), None, Some(value.clone())));
        }
    }
    out
}

/// Decides what the target collections are created with: the options of the first source
/// location (`sources` holds the ones that exist, in order), or every reason not to.
/// `targets` are the target locations that are not source locations too, with their listing
/// when they exist (a collection both layouts share is a source and stays as it is).
pub fn decide(
    sources: &[(Location, Listing)],
    targets: &[(Location, Option<Listing>)],
    bookkeeping: &Bookkeeping,
) -> Result<Document, Refused> {
    let mut refusals = Vec::new();
    let missing: Vec<Location> = targets
        .iter()
        .filter(|(_, listing)| listing.is_none())
        .map(|(location, _)| location.clone())
        .collect();

    // What each source location is: the same finding on several locations is one refusal.
    let mut unmovable_at: Vec<(Unmovable, Vec<Location>)> = Vec::new();
    let mut validator_at: Vec<(ValidatorProblem, Vec<Location>)> = Vec::new();
    let mut unknown_at: Vec<(String, Vec<Location>)> = Vec::new();
    for (location, listing) in sources {
        if let Some(kind) = unmovable(listing) {
            add_at(&mut unmovable_at, kind, location);
            continue;
        }
        for problem in validator_problems(&listing.options, bookkeeping) {
            add_at(&mut validator_at, problem, location);
        }
        if !missing.is_empty() {
            for (name, value) in &listing.options {
                if treatment(name, value, &listing.options) == Treatment::Unknown {
                    add_at(&mut unknown_at, name.clone(), location);
                }
            }
        }
    }
    refusals.extend(
        unmovable_at
            .into_iter()
            .map(|(kind, locations)| Refusal::Unmovable { locations, kind }),
    );
    refusals.extend(
        validator_at
            .into_iter()
            .map(|(problem, locations)| Refusal::Validator { locations, problem }),
    );
    refusals.extend(
        unknown_at
            .into_iter()
            .map(|(option, locations)| Refusal::UnknownOption {
                locations,
                option,
                targets: missing.clone(),
            }),
    );

    let Some((first, first_listing)) = sources.first() else {
        // No source collection exists: the targets start as plain collections, and one that
        // exists only has to be one.
        for (target, listing) in targets {
            if let Some(kind) = listing.as_ref().and_then(unmovable) {
                refusals.push(Refusal::TargetUnmovable {
                    target: target.clone(),
                    kind,
                });
            }
        }
        return refused_or(refusals, Document::new());
    };
    let carried = compared(first_listing);
    for (other, listing) in &sources[1..] {
        for (option, first_value, other_value) in differences(&carried, &compared(listing)) {
            refusals.push(Refusal::SourcesDiffer {
                option,
                first: first.clone(),
                first_value,
                other: other.clone(),
                other_value,
            });
        }
    }
    for (target, listing) in targets {
        let Some(listing) = listing else {
            continue;
        };
        if let Some(kind) = unmovable(listing) {
            refusals.push(Refusal::TargetUnmovable {
                target: target.clone(),
                kind,
            });
            continue;
        }
        for (option, source_value, target_value) in differences(&carried, &compared(listing)) {
            refusals.push(Refusal::TargetDiffers {
                option,
                source: first.clone(),
                source_value,
                target: target.clone(),
                target_value,
            });
        }
    }
    refused_or(refusals, create_options(first_listing))
}

fn add_at<T: PartialEq>(found: &mut Vec<(T, Vec<Location>)>, what: T, location: &Location) {
    match found.iter_mut().find(|(w, _)| *w == what) {
        Some((_, locations)) => locations.push(location.clone()),
        None => found.push((what, vec![location.clone()])),
    }
}

fn refused_or(refusals: Vec<Refusal>, create: Document) -> Result<Document, Refused> {
    if refusals.is_empty() {
        Ok(create)
    } else {
        Err(Refused(refusals))
    }
}

#[cfg(test)]
mod tests;

//! Writes that bypass the router: what a change event on a watched location means. Pure.
//!
//! reshard does not replay a log: it relies on every write going through a router or one of
//! its workers. A write that does not (a cron job, an admin script, a service on an old build)
//! is a *bypass*. Every location a migration touches is watched with a change stream
//! (`crate::watch`), and each event is judged here:
//!
//! - Everything reshard writes after the write switch carries its envelope: inserts and
//!   replacements by routers, copiers, repairs and mirrors hold `_reshard`; a router's update
//!   bumps `_reshard.rev`. The one write that does not is the backfill's stamp of a document
//!   that stays where it is, which sets the target's routing field and nothing else.
//! - Nothing reshard runs deletes a document physically before the migration ends, except the
//!   cleaner, which deletes source documents inside the `_id` ranges it has claimed.
//! - Before the write switch the source is authoritative and routers write it plainly: a
//!   plain write there is not told apart from the application's, and it needs no telling
//!   apart, since the backfill copies whatever the source holds. The target is never written
//!   plainly.
//!
//! So: on a location's source side from the write switch on, and on a target location from
//! the start, a write without the envelope, an update that leaves it alone (but for the
//! stamp), and a delete the cleaner cannot have made are bypasses. A watch that lost its
//! place (its history is gone, or the collection was dropped or renamed) is a *gap*: writes
//! may have been missed, and an operator must decide.

use mongodb::bson::Document;
use serde::Serialize;

use crate::envelope::META;
use crate::routing::{Location, RoutingVersion};

/// What a watched location is to a migration.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    Source,
    Target,
    /// A collection both layouts use.
    Shared,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Source => "source",
            Role::Target => "target",
            Role::Shared => "shared",
        }
    }

    pub fn parse(text: &str) -> Option<Role> {
        match text {
            "source" => Some(Role::Source),
            "target" => Some(Role::Target),
            "shared" => Some(Role::Shared),
            _ => None,
        }
    }

    /// Whether source documents live here (which the cleaner deletes, and routers write
    /// plainly before the write switch).
    pub fn holds_source(self) -> bool {
        matches!(self, Role::Source | Role::Shared)
    }
}

/// Every location of a migration with its role, each once.
pub fn locations(from: &RoutingVersion, to: &RoutingVersion) -> Vec<(Location, Role)> {
    let sources = from.locations();
    let targets = to.locations();
    let mut out: Vec<(Location, Role)> = Vec::new();
    for s in &sources {
        let role = if targets.contains(s) {
            Role::Shared
        } else {
            Role::Source
        };
        if !out.iter().any(|(l, _)| l == s) {
            out.push((s.clone(), role));
        }
    }
    for t in &targets {
        if !out.iter().any(|(l, _)| l == t) {
            out.push((t.clone(), Role::Target));
        }
    }
    out.sort();
    out
}

/// A stored role (the column's CHECK allows exactly these names).
impl TryFrom<String> for Role {
    type Error = String;

    fn try_from(text: String) -> Result<Role, String> {
        Role::parse(&text).ok_or_else(|| format!("unknown watch role {text:?}"))
    }
}

/// A stored operation (the column's CHECK allows exactly these names).
impl TryFrom<String> for Operation {
    type Error = String;

    fn try_from(text: String) -> Result<Operation, String> {
        Operation::parse(&text).ok_or_else(|| format!("unknown bypass operation {text:?}"))
    }
}

/// The kind of write a bypass was, as recorded.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Operation {
    Insert,
    Update,
    Replace,
    Delete,
    /// The watch lost its place: writes may have been missed.
    Gap,
}

impl Operation {
    pub const ALL: [Operation; 5] = [
        Operation::Insert,
        Operation::Update,
        Operation::Replace,
        Operation::Delete,
        Operation::Gap,
    ];

    pub fn parse(text: &str) -> Option<Operation> {
        Operation::ALL.into_iter().find(|o| o.as_str() == text)
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Operation::Insert => "insert",
            Operation::Update => "update",
            Operation::Replace => "replace",
            Operation::Delete => "delete",
            Operation::Gap => "gap",
        }
    }
}

/// A change event, as far as the judgement needs it.
#[derive(Clone, Debug, PartialEq)]
pub enum Change<'a> {
    Insert(&'a Document),
    Replace(&'a Document),
    /// The paths the update set or removed.
    Update(Vec<String>),
    Delete,
    /// The stream ended for good (`invalidate`, `drop`, `rename`, `dropDatabase`) or could
    /// not resume (its history is gone): what happened meanwhile is unknown.
    Lost(String),
    /// An event that changes no document (`createIndexes`, ...).
    Other,
}

/// Where the write happened, as far as the judgement needs it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Context<'a> {
    pub role: Role,
    /// The watch passed the write switch (routers no longer write the source plainly).
    pub switched: bool,
    /// The target version's routing field, which the backfill stamps on staying documents.
    pub routing_field: Option<&'a str>,
    /// For a delete: the id lies in an `_id` range the cleaner has claimed.
    pub in_cleaned_range: bool,
}

/// What an event is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// reshard wrote it (or it changes nothing).
    Ours,
    /// Before the write switch on the source side: the source is authoritative and the
    /// backfill carries whatever it holds.
    Unwatched,
    /// A write that did not come through reshard.
    Bypass(Operation),
}

/// Judges one change event on a watched location.
pub fn classify(ctx: &Context<'_>, change: &Change<'_>) -> Verdict {
    let watched = ctx.switched || ctx.role == Role::Target;
    if !watched {
        return Verdict::Unwatched;
    }
    match change {
        Change::Insert(doc) if !has_envelope(doc) => Verdict::Bypass(Operation::Insert),
        Change::Replace(doc) if !has_envelope(doc) => Verdict::Bypass(Operation::Replace),
        Change::Insert(_) | Change::Replace(_) => Verdict::Ours,
        Change::Update(paths) => {
            let envelope = paths.iter().any(|p| touches(p, META));
            let stamp = ctx.role.holds_source()
                && !paths.is_empty()
                && ctx
                    .routing_field
                    .is_some_and(|f| paths.iter().all(|p| touches(p, f)));
            if envelope || stamp {
                Verdict::Ours
            } else {
                Verdict::Bypass(Operation::Update)
            }
        }
        Change::Delete if ctx.role.holds_source() && ctx.in_cleaned_range => Verdict::Ours,
        Change::Delete => Verdict::Bypass(Operation::Delete),
        Change::Lost(_) => Verdict::Bypass(Operation::Gap),
        Change::Other => Verdict::Ours,
    }
}

fn has_envelope(doc: &Document) -> bool {
    doc.contains_key(META)
}

/// Whether `path` is `field` or inside it.
fn touches(path: &str, field: &str) -> bool {
    path == field
        || path
            .strip_prefix(field)
            .is_some_and(|rest| rest.starts_with('.'))
}

/// The paths an update event's `updateDescription` names: set, removed and truncated.
pub fn update_paths(description: &Document) -> Vec<String> {
    let mut paths: Vec<String> = description
        .get_document("updatedFields")
        .map(|d| d.keys().cloned().collect())
        .unwrap_or_default();
    if let Ok(removed) = description.get_array("removedFields") {
        paths.extend(removed.iter().filter_map(|b| b.as_str().map(str::to_owned)));
    }
    if let Ok(truncated) = description.get_array("truncatedArrays") {
        paths.extend(
            truncated
                .iter()
                .filter_map(|b| b.as_document()?.get_str("field").ok().map(str::to_owned)),
        );
    }
    paths
}

/// What an operator decides about a bypass.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Resolution {
    /// Carry the write into the authoritative layout by the protocol's rules.
    Recopy,
    /// Leave it: the operator knows the write does not matter.
    Ignore,
}

impl Resolution {
    pub fn as_str(self) -> &'static str {
        match self {
            Resolution::Recopy => "recopy",
            Resolution::Ignore => "ignore",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mongodb::bson::doc;

    #[test]
    fn stored_roles_and_operations_read_back_as_written_and_nothing_else() {
        for role in [Role::Source, Role::Target, Role::Shared] {
            assert_eq!(Role::try_from(role.as_str().to_owned()), Ok(role));
        }
        for operation in Operation::ALL {
            assert_eq!(
                Operation::try_from(operation.as_str().to_owned()),
                Ok(operation)
            );
        }
        assert!(Role::try_from("Source".to_owned()).is_err());
        assert!(Operation::try_from("upsert".to_owned()).is_err());
    }

    fn ctx(role: Role, switched: bool) -> Context<'static> {
        Context {
            role,
            switched,
            routing_field: Some("bucket"),
            in_cleaned_range: false,
        }
    }

    #[test]
    fn before_the_switch_the_source_side_is_not_judged() {
        let plain = doc! { "_id": 1 };
        for role in [Role::Source, Role::Shared] {
            for change in [
                Change::Insert(&plain),
                Change::Update(vec!["x".into()]),
                Change::Delete,
                Change::Lost("history lost".into()),
            ] {
                assert_eq!(classify(&ctx(role, false), &change), Verdict::Unwatched);
            }
        }
        // The target is never written plainly, switched or not.
        assert_eq!(
            classify(&ctx(Role::Target, false), &Change::Insert(&plain)),
            Verdict::Bypass(Operation::Insert)
        );
    }

    #[test]
    fn plain_writes_after_the_switch_are_bypasses_and_enveloped_ones_are_ours() {
        let plain = doc! { "_id": 1, "x": 1 };
        let stamped = doc! { "_id": 1, "x": 1, "_reshard": { "src": "app", "rev": 2 } };
        for role in [Role::Source, Role::Shared, Role::Target] {
            let c = ctx(role, true);
            assert_eq!(
                classify(&c, &Change::Insert(&plain)),
                Verdict::Bypass(Operation::Insert)
            );
            assert_eq!(
                classify(&c, &Change::Replace(&plain)),
                Verdict::Bypass(Operation::Replace)
            );
            assert_eq!(classify(&c, &Change::Insert(&stamped)), Verdict::Ours);
            assert_eq!(classify(&c, &Change::Replace(&stamped)), Verdict::Ours);
            assert_eq!(
                classify(&c, &Change::Update(vec!["x".into()])),
                Verdict::Bypass(Operation::Update)
            );
            // A router's update bumps the revision; servers name it dotted or as the field.
            assert_eq!(
                classify(&c, &Change::Update(vec!["x".into(), "_reshard.rev".into()])),
                Verdict::Ours
            );
            assert_eq!(
                classify(&c, &Change::Update(vec!["_reshard".into()])),
                Verdict::Ours
            );
            // A look-alike field is not the envelope.
            assert_eq!(
                classify(&c, &Change::Update(vec!["_reshardx".into()])),
                Verdict::Bypass(Operation::Update)
            );
            assert_eq!(classify(&c, &Change::Other), Verdict::Ours);
            assert_eq!(
                classify(&c, &Change::Lost("invalidate".into())),
                Verdict::Bypass(Operation::Gap)
            );
        }
    }

    #[test]
    fn the_stamp_of_a_staying_document_is_ours_only_where_source_documents_live() {
        let stamp = Change::Update(vec!["bucket".into()]);
        assert_eq!(classify(&ctx(Role::Shared, true), &stamp), Verdict::Ours);
        assert_eq!(classify(&ctx(Role::Source, true), &stamp), Verdict::Ours);
        assert_eq!(
            classify(&ctx(Role::Target, true), &stamp),
            Verdict::Bypass(Operation::Update)
        );
        // The stamp and anything else is not the stamp.
        assert_eq!(
            classify(
                &ctx(Role::Shared, true),
                &Change::Update(vec!["bucket".into(), "x".into()])
            ),
            Verdict::Bypass(Operation::Update)
        );
        let no_field = Context {
            routing_field: None,
            ..ctx(Role::Shared, true)
        };
        assert_eq!(
            classify(&no_field, &stamp),
            Verdict::Bypass(Operation::Update)
        );
        assert_eq!(
            classify(&ctx(Role::Shared, true), &Change::Update(vec![])),
            Verdict::Bypass(Operation::Update)
        );
    }

    #[test]
    fn deletes_are_the_cleaners_only_inside_its_ranges_on_the_source_side() {
        let cleaned = |role| Context {
            in_cleaned_range: true,
            ..ctx(role, true)
        };
        assert_eq!(
            classify(&cleaned(Role::Source), &Change::Delete),
            Verdict::Ours
        );
        assert_eq!(
            classify(&cleaned(Role::Shared), &Change::Delete),
            Verdict::Ours
        );
        assert_eq!(
            classify(&cleaned(Role::Target), &Change::Delete),
            Verdict::Bypass(Operation::Delete)
        );
        assert_eq!(
            classify(&ctx(Role::Source, true), &Change::Delete),
            Verdict::Bypass(Operation::Delete)
        );
    }

    #[test]
    fn update_paths_cover_set_removed_and_truncated_fields() {
        let d = doc! {
            "updatedFields": { "a": 1, "b.c": 2 },
            "removedFields": ["d"],
            "truncatedArrays": [{ "field": "e", "newSize": 1 }],
        };
        assert_eq!(update_paths(&d), vec!["a", "b.c", "d", "e"]);
        assert!(update_paths(&doc! {}).is_empty());
    }

    #[test]
    fn locations_name_each_collection_once_with_its_role() {
        use crate::routing::{Layout, RoutingVersion};
        let version = |shards: &[&str]| {
            RoutingVersion::new(
                "orders",
                "customerId",
                Layout::Fanout {
                    shards: shards.iter().map(|s| (*s).to_owned()).collect(),
                },
            )
        };
        let from = version(&["a", "b"]);
        let to = version(&["b", "c"]);
        let got = locations(&from, &to);
        assert_eq!(
            got,
            vec![
                (Location::new("a", "orders"), Role::Source),
                (Location::new("b", "orders"), Role::Shared),
                (Location::new("c", "orders"), Role::Target),
            ]
        );
    }
}

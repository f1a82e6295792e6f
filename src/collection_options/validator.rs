//! Whether a source's validator lets reshard's own documents through: a live document (with
//! `_reshard` and the routing fields) and a tombstone (which holds little else), judged over
//! the validator's query operators and `$jsonSchema` ([`super::ValidatorProblem`] says why not).

use mongodb::bson::{Bson, Document};

use super::{fields, truthy, Bookkeeping, ValidatorProblem};
use crate::envelope::META;

/// What a validator does to one kind of document reshard writes.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Verdict {
    Accepts,
    Refuses(Vec<String>),
    /// reshard cannot tell.
    Unknown,
}

/// The documents reshard writes, as a validator sees them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Written {
    /// A copy or an application write: the application's fields, `_reshard` and the routing
    /// field.
    Live,
    /// A tombstone: `_id`, the tenant key, the routing field and `_reshard`.
    Tombstone,
}

/// Why the validator of a collection with `options` would refuse documents reshard writes.
/// A validator that only warns, or is off, refuses nothing.
pub(super) fn validator_problems(
    options: &Document,
    bookkeeping: &Bookkeeping,
) -> Vec<ValidatorProblem> {
    let Ok(validator) = options.get_document("validator") else {
        return Vec::new();
    };
    let level = options.get_str("validationLevel").unwrap_or("strict");
    let action = options.get_str("validationAction").unwrap_or("error");
    if validator.is_empty() || level == "off" || action == "warn" {
        return Vec::new();
    }
    let added: Vec<String> = bookkeeping.added().into_iter().map(str::to_owned).collect();
    let held: Vec<String> = bookkeeping
        .tombstone()
        .into_iter()
        .map(str::to_owned)
        .collect();
    let mut problems = Vec::new();
    let mut live_why = Vec::new();
    if let Verdict::Refuses(why) = judge(validator, Written::Live, bookkeeping) {
        live_why = why.clone();
        problems.push(ValidatorProblem::RefusesBookkeeping { why, added });
    }
    match judge(validator, Written::Tombstone, bookkeeping) {
        Verdict::Accepts => {}
        // What live documents are refused for is said once, with them.
        Verdict::Refuses(why) => {
            let why: Vec<String> = why.into_iter().filter(|w| !live_why.contains(w)).collect();
            if !why.is_empty() {
                problems.push(ValidatorProblem::RefusesTombstones { why, fields: held });
            }
        }
        Verdict::Unknown => problems.push(ValidatorProblem::MayRefuseTombstones { fields: held }),
    }
    problems
}

/// Every part must accept.
fn all(verdicts: impl IntoIterator<Item = Verdict>) -> Verdict {
    let mut refused = Vec::new();
    let mut unknown = false;
    for verdict in verdicts {
        match verdict {
            Verdict::Accepts => {}
            Verdict::Refuses(why) => refused.extend(why),
            Verdict::Unknown => unknown = true,
        }
    }
    if !refused.is_empty() {
        Verdict::Refuses(refused)
    } else if unknown {
        Verdict::Unknown
    } else {
        Verdict::Accepts
    }
}

/// One branch must accept.
fn any(verdicts: impl IntoIterator<Item = Verdict>) -> Verdict {
    let mut refused = Vec::new();
    let mut unknown = false;
    let mut branches = 0;
    for verdict in verdicts {
        branches += 1;
        match verdict {
            Verdict::Accepts => return Verdict::Accepts,
            Verdict::Refuses(why) => refused.extend(why),
            Verdict::Unknown => unknown = true,
        }
    }
    if unknown || branches == 0 {
        Verdict::Unknown
    } else {
        Verdict::Refuses(refused)
    }
}

/// What a validator (a query expression) does to `written`. Only what reshard can judge
/// without the application's documents is judged: `$and`, `$or`, `$jsonSchema`, and the
/// tombstones' exemption; a condition on an application field is unknown.
fn judge(expression: &Document, written: Written, bookkeeping: &Bookkeeping) -> Verdict {
    all(expression.iter().map(|(key, value)| match key.as_str() {
        "$and" | "$or" => {
            let Some(branches) = value.as_array() else {
                return Verdict::Unknown;
            };
            let verdicts = branches.iter().map(|b| match b.as_document() {
                Some(b) => judge(b, written, bookkeeping),
                None => Verdict::Unknown,
            });
            if key == "$and" {
                all(verdicts)
            } else {
                any(verdicts)
            }
        }
        "$jsonSchema" => match value.as_document() {
            Some(schema) => judge_schema(schema, written, bookkeeping),
            None => Verdict::Unknown,
        },
        _ if is_tombstone_exemption(key, value) => match written {
            Written::Tombstone => Verdict::Accepts,
            Written::Live => {
                Verdict::Refuses(vec![format!("it accepts only tombstones ({key}: true)")])
            }
        },
        _ => Verdict::Unknown,
    }))
}

/// `{"_reshard.deleted": true}` (or `{$eq: true}`, `{$exists: true}`): what tombstones match.
fn is_tombstone_exemption(key: &str, value: &Bson) -> bool {
    if key != format!("{META}.deleted") {
        return false;
    }
    match value {
        Bson::Boolean(true) => true,
        Bson::Document(d) if d.len() == 1 => {
            d.get("$eq") == Some(&Bson::Boolean(true)) || d.get("$exists").is_some_and(truthy)
        }
        _ => false,
    }
}

/// The keywords of a `$jsonSchema` reshard judges; any other one (`allOf`, `maxProperties`,
/// `patternProperties`, ...) may refuse a document for reasons it cannot tell.
const JUDGED_KEYWORDS: &[&str] = &[
    "bsonType",
    "type",
    "title",
    "description",
    "required",
    "properties",
    "additionalProperties",
];

fn judge_schema(schema: &Document, written: Written, bookkeeping: &Bookkeeping) -> Verdict {
    let mut verdicts = Vec::new();
    if schema
        .keys()
        .any(|k| !JUDGED_KEYWORDS.contains(&k.as_str()))
    {
        verdicts.push(Verdict::Unknown);
    }
    if written == Written::Tombstone {
        let held = bookkeeping.tombstone();
        let missing: Vec<String> = schema
            .get_array("required")
            .map(|r| r.iter().filter_map(Bson::as_str).collect::<Vec<_>>())
            .unwrap_or_default()
            .into_iter()
            .filter(|name| !held.contains(name))
            .map(str::to_owned)
            .collect();
        if !missing.is_empty() {
            verdicts.push(Verdict::Refuses(vec![format!(
                "its $jsonSchema requires {}",
                fields(&missing)
            )]));
        }
    }
    let properties = schema.get_document("properties").ok();
    let mut unlisted = Vec::new();
    for field in bookkeeping.added() {
        match properties.and_then(|p| p.get(field)) {
            None => unlisted.push(field.to_owned()),
            Some(spec) => verdicts.push(judge_field(field, spec)),
        }
    }
    if !unlisted.is_empty() {
        match schema.get("additionalProperties") {
            Some(Bson::Boolean(false)) => verdicts.push(Verdict::Refuses(vec![format!(
                "its $jsonSchema allows only the fields it lists (additionalProperties: false), \
                 and {} {} not among them",
                fields(&unlisted),
                if unlisted.len() > 1 { "are" } else { "is" }
            )])),
            Some(Bson::Document(_)) => verdicts.push(Verdict::Unknown),
            _ => {}
        }
    }
    all(verdicts)
}

/// What a `$jsonSchema`'s properties entry for a field reshard adds does to it: `_reshard` is
/// an object, a routing field a 32-bit integer.
fn judge_field(field: &str, spec: &Bson) -> Verdict {
    let Some(spec) = spec.as_document() else {
        return Verdict::Unknown;
    };
    let (bson_types, json_types, is): (&[&str], &[&str], &str) = if field == META {
        (&["object"], &["object"], "an object")
    } else {
        (
            &["int", "number"],
            &["integer", "number"],
            "a 32-bit integer",
        )
    };
    let mut verdicts = Vec::new();
    for (keyword, admitted) in [("bsonType", bson_types), ("type", json_types)] {
        let declared: Vec<&str> = match spec.get(keyword) {
            None => continue,
            Some(Bson::String(t)) => vec![t.as_str()],
            Some(Bson::Array(ts)) => ts.iter().filter_map(Bson::as_str).collect(),
            Some(_) => {
                verdicts.push(Verdict::Unknown);
                continue;
            }
        };
        if !declared.iter().any(|t| admitted.contains(t)) {
            verdicts.push(Verdict::Refuses(vec![format!(
                "its $jsonSchema wants `{field}` to be of {keyword} {}, and reshard writes {is}",
                declared.join(" or ")
            )]));
        }
    }
    if spec
        .keys()
        .any(|k| !["bsonType", "type", "title", "description"].contains(&k.as_str()))
    {
        verdicts.push(Verdict::Unknown);
    }
    all(verdicts)
}

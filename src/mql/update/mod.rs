//! Update documents as MongoDB reads and applies them: their kind ([`kind`]), the update
//! operators applied to a document ([`Update`], [`apply`]), a replacement ([`replace`]), and
//! the document an upsert inserts ([`seed_from_filter`], [`upsert_document`]).
//!
//! Operators: `$set`, `$unset`, `$inc`, `$mul`, `$min`, `$max`, `$rename`, `$setOnInsert`,
//! `$currentDate`, `$push` (with `$each`, `$position`, `$slice`, `$sort`), `$addToSet` (with
//! `$each`), `$pop`, `$pull` (of a value, by equality) and `$pullAll`, on dotted paths whose
//! numeric components index arrays. As in MongoDB: every path of one update is checked
//! against the others first (two that overlap are ConflictingUpdateOperators, 40); the
//! operations are applied field by field in the order of the field names (numeric names in
//! numeric order), so fields an update creates appear in that order, not in the update's; an
//! update that would change `_id` fails (ImmutableField, 66); a failed update changes nothing.
//!
//! Refused, naming what is supported (NotImplemented): positional paths (`$`, `$[]`,
//! `$[<id>]`), `$bit`, `$pull` with a condition (a document or a regular expression), and
//! arithmetic on `Decimal128` values. Pipeline-style updates (an array) are recognised by
//! [`kind`] and left to the caller.

use std::cmp::Ordering;
use std::collections::BTreeMap;

use bson::{Bson, DateTime, Document};

use super::text::element;
use super::MqlError;

mod apply;
mod seed;

pub use seed::seed_from_filter;

/// What an update document is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum UpdateKind {
    /// `{$set: ..., $inc: ...}`: operators.
    Operators,
    /// A document without `$` fields (an empty one too): the new document.
    Replacement,
    /// An array: an aggregation pipeline.
    Pipeline,
}

/// The kind of an update (`u` of an update statement, `update` of `findAndModify`): by its
/// first field, as MongoDB tells them apart, refusing a mix in MongoDB's words.
pub fn kind(update: &Bson) -> Result<UpdateKind, MqlError> {
    let d = match update {
        Bson::Array(_) => return Ok(UpdateKind::Pipeline),
        Bson::Document(d) => d,
        _ => {
            return Err(MqlError::failed_to_parse(
                "Update argument must be either an object or an array",
            ))
        }
    };
    let operators = d.keys().next().is_some_and(|k| k.starts_with('$'));
    for key in d.keys() {
        match (operators, key.starts_with('$')) {
            (true, false) => return Err(unknown_modifier(key)),
            (false, true) => {
                return Err(MqlError::dollar_prefixed_field_name(format!(
                    "The dollar ($) prefixed field '{key}' in '{key}' is not allowed in the \
                     context of an update's replacement document. Consider using an \
                     aggregation pipeline with $replaceWith."
                )))
            }
            _ => {}
        }
    }
    Ok(if operators {
        UpdateKind::Operators
    } else {
        UpdateKind::Replacement
    })
}

fn unknown_modifier(name: &str) -> MqlError {
    MqlError::failed_to_parse(format!(
        "Unknown modifier: {name}. Expected a valid update modifier or pipeline-style update \
         specified as an array"
    ))
}

/// Applies update operators to `doc` as MongoDB would on the server (`inserting`: the
/// document an upsert inserts, so `$setOnInsert` applies too; `now`: the time `$currentDate`
/// writes). On error `doc` is unchanged.
pub fn apply(
    doc: &mut Document,
    update: &Document,
    inserting: bool,
    now: DateTime,
) -> Result<(), MqlError> {
    Update::parse(update)?.apply(doc, inserting, now)
}

/// A replacement of `existing` by `replacement`, as MongoDB makes it: `existing`'s `_id` first
/// and kept (a replacement that gives another `_id` fails), then the replacement's fields.
pub fn replace(existing: &Document, replacement: &Document) -> Result<Document, MqlError> {
    kind(&Bson::Document(replacement.clone()))?;
    let mut out = Document::new();
    if let Some(id) = existing.get("_id") {
        if let Some(new) = replacement.get("_id") {
            if !super::order::equal(id, new) {
                return Err(altered_id(new));
            }
        }
        out.insert("_id", id.clone());
    }
    for (k, v) in replacement {
        if k != "_id" || !out.contains_key("_id") {
            out.insert(k.clone(), v.clone());
        }
    }
    Ok(id_first(out))
}

fn altered_id(new: &Bson) -> MqlError {
    MqlError::immutable_field(format!(
        "After applying the update, the (immutable) field '_id' was found to have been altered \
         to {}",
        element("_id", new)
    ))
}

/// The document an upsert inserts when `filter` matches nothing: for operators, the filter's
/// equality conditions ([`seed_from_filter`]) with the operators applied (`$setOnInsert`
/// included); for a replacement, the replacement with the filter's `_id` equality when it has
/// one. `_id` comes first. A document without `_id` is returned without one: MongoDB then
/// generates an ObjectId, first in the document, which is the caller's to do (this module
/// is pure). Pipeline updates are refused.
pub fn upsert_document(
    filter: &Document,
    update: &Bson,
    now: DateTime,
) -> Result<Document, MqlError> {
    match kind(update)? {
        UpdateKind::Pipeline => Err(MqlError::not_implemented(
            "the front does not run pipeline-style updates (an array): use update operators or \
             a replacement document",
        )),
        UpdateKind::Operators => {
            let Bson::Document(ops) = update else {
                unreachable!("operators are a document")
            };
            let parsed = Update::parse(ops)?;
            let mut doc = seed_from_filter(filter)?;
            parsed.apply(&mut doc, true, now)?;
            Ok(id_first(doc))
        }
        UpdateKind::Replacement => {
            let Bson::Document(replacement) = update else {
                unreachable!("a replacement is a document")
            };
            let seed = seed::id_from_filter(filter)?;
            replace(&seed, replacement)
        }
    }
}

/// `_id` moved to the front, as MongoDB stores a document.
fn id_first(mut doc: Document) -> Document {
    match doc.remove("_id") {
        None => doc,
        Some(id) => {
            let mut out = Document::new();
            out.insert("_id", id);
            out.extend(doc);
            out
        }
    }
}

/// Update operators, parsed and checked: every problem is found here, before any document is
/// read.
#[derive(Clone, Debug, PartialEq)]
pub struct Update {
    root: Node,
    /// `$rename`s: (from, to).
    renames: Vec<(String, String)>,
    /// Every path the update writes, for the `_id` check.
    paths: Vec<String>,
}

/// One level of the update's paths, in MongoDB's order of field names.
#[derive(Clone, Debug, PartialEq, Default)]
struct Node {
    children: BTreeMap<FieldName, Entry>,
}

#[derive(Clone, Debug, PartialEq)]
enum Entry {
    Leaf(Leaf),
    Node(Node),
}

#[derive(Clone, Debug, PartialEq)]
struct Leaf {
    /// The whole dotted path, for messages.
    path: String,
    op: Op,
}

#[derive(Clone, Debug, PartialEq)]
enum Op {
    Set(Bson),
    SetOnInsert(Bson),
    Unset,
    Inc(Bson),
    Mul(Bson),
    Min(Bson),
    Max(Bson),
    CurrentDate {
        timestamp: bool,
    },
    Push(Push),
    AddToSet(Vec<Bson>),
    Pop {
        front: bool,
    },
    Pull(Bson),
    PullAll(Vec<Bson>),
    /// The destination of a `$rename` from this path.
    RenameTo {
        from: String,
    },
    /// The source of a `$rename` (removed after the walk; holds its path against conflicts).
    RenameFrom,
}

#[derive(Clone, Debug, PartialEq)]
struct Push {
    values: Vec<Bson>,
    position: Option<i64>,
    slice: Option<i64>,
    sort: Option<PushSort>,
}

#[derive(Clone, Debug, PartialEq)]
enum PushSort {
    /// `$sort: 1` / `-1`: whole elements.
    Whole(bool),
    /// `$sort: {field: 1, ...}`: by fields of embedded documents.
    Fields(Vec<(String, bool)>),
}

/// A field name ordered as MongoDB orders an update's fields: names of digits (without a
/// leading zero) by number, others by bytes (`cmpPathsAndArrayIndexes`).
#[derive(Clone, Debug, PartialEq, Eq)]
struct FieldName(String);

impl Ord for FieldName {
    fn cmp(&self, other: &FieldName) -> Ordering {
        let (a, b) = (self.0.as_bytes(), other.0.as_bytes());
        let numeric =
            |s: &[u8]| !s.is_empty() && s[0].is_ascii_digit() && !(s[0] == b'0' && s.len() > 1);
        if !numeric(a) || !numeric(b) {
            return a.cmp(b);
        }
        a.len().cmp(&b.len()).then_with(|| a.cmp(b))
    }
}

impl PartialOrd for FieldName {
    fn partial_cmp(&self, other: &FieldName) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

const OPERATORS: &str = "$set, $unset, $inc, $mul, $min, $max, $rename, $setOnInsert, \
                         $currentDate, $push, $addToSet, $pop, $pull, $pullAll";

impl Update {
    /// Parses update operators, with MongoDB's errors for unknown operators, bad arguments,
    /// bad paths and conflicting paths.
    pub fn parse(update: &Document) -> Result<Update, MqlError> {
        let mut parsed = Update {
            root: Node::default(),
            renames: Vec::new(),
            paths: Vec::new(),
        };
        for (name, fields) in update {
            if !name.starts_with('$') {
                return Err(unknown_modifier(name));
            }
            if name == "$bit" {
                return Err(MqlError::not_implemented(format!(
                    "the front does not apply $bit: it applies {OPERATORS}"
                )));
            }
            let Bson::Document(fields) = fields else {
                return Err(MqlError::failed_to_parse(format!(
                    "Modifiers operate on fields but we found type {} instead. For example: \
                     {{$mod: {{<field>: ...}}}} not {{{name}: {}}}",
                    super::type_name(fields),
                    super::shell(fields)
                )));
            };
            // Since MongoDB 5.0 an operator with no field (`{$set: {}}`) is no change, not an
            // error (the manual's `$set` page).
            for (path, value) in fields {
                check_path(path)?;
                if name == "$rename" {
                    let to = rename_target(path, value)?;
                    parsed.add(path, Op::RenameFrom)?;
                    parsed.add(&to, Op::RenameTo { from: path.clone() })?;
                    parsed.renames.push((path.clone(), to));
                    continue;
                }
                let op = parse_op(name, path, value)?;
                parsed.add(path, op)?;
            }
        }
        Ok(parsed)
    }

    fn add(&mut self, path: &str, op: Op) -> Result<(), MqlError> {
        let parts: Vec<&str> = path.split('.').collect();
        let conflict = |at: &str| {
            MqlError::conflicting_update_operators(format!(
                "Updating the path '{path}' would create a conflict at '{at}'"
            ))
        };
        let mut node = &mut self.root;
        for (i, part) in parts.iter().enumerate() {
            let key = FieldName((*part).to_owned());
            if i + 1 == parts.len() {
                if node.children.contains_key(&key) {
                    return Err(conflict(path));
                }
                node.children.insert(
                    key,
                    Entry::Leaf(Leaf {
                        path: path.to_owned(),
                        op,
                    }),
                );
                break;
            }
            let entry = node
                .children
                .entry(key)
                .or_insert_with(|| Entry::Node(Node::default()));
            node = match entry {
                Entry::Node(n) => n,
                Entry::Leaf(_) => return Err(conflict(&parts[..=i].join("."))),
            };
        }
        self.paths.push(path.to_owned());
        Ok(())
    }

    /// Applies the update to `doc` (see [`apply`]).
    pub fn apply(
        &self,
        doc: &mut Document,
        inserting: bool,
        now: DateTime,
    ) -> Result<(), MqlError> {
        let mut work = doc.clone();
        apply::run(self, &mut work, inserting, now)?;
        if let Some(id) = doc.get("_id") {
            if work.get("_id") != Some(id) {
                let path = self
                    .paths
                    .iter()
                    .find(|p| *p == "_id" || p.starts_with("_id."))
                    .map_or("_id", String::as_str);
                return Err(MqlError::immutable_field(format!(
                    "Performing an update on the path '{path}' would modify the immutable field \
                     '_id'"
                )));
            }
        }
        *doc = work;
        Ok(())
    }
}

/// MongoDB's checks of an update path (`fieldchecker::isUpdatable`, storage validation), and
/// the positional paths the front does not apply.
fn check_path(path: &str) -> Result<(), MqlError> {
    if path.is_empty() {
        return Err(MqlError::empty_field_name(
            "An empty update path is not valid.",
        ));
    }
    for part in path.split('.') {
        if part.is_empty() {
            return Err(MqlError::empty_field_name(format!(
                "The update path '{path}' contains an empty field name, which is not allowed."
            )));
        }
        if part == "$" || part.starts_with("$[") {
            return Err(MqlError::not_implemented(format!(
                "the front does not apply positional updates ('{path}'): use paths without \
                 $, $[] or $[<identifier>]"
            )));
        }
        if part.starts_with('$') {
            return Err(MqlError::dollar_prefixed_field_name(format!(
                "The dollar ($) prefixed field '{part}' in '{path}' is not valid for storage."
            )));
        }
    }
    Ok(())
}

fn rename_target(from: &str, value: &Bson) -> Result<String, MqlError> {
    let Bson::String(to) = value else {
        return Err(MqlError::bad_value(format!(
            "The 'to' field for $rename must be a string: {}",
            element(from, value)
        )));
    };
    check_path(to)?;
    if to == from {
        return Err(MqlError::bad_value(format!(
            "The source and target field for $rename must differ: {}",
            element(from, value)
        )));
    }
    if super::path::overlap(from, to) {
        return Err(MqlError::bad_value(format!(
            "The source and target field for $rename must not be on the same path: {}",
            element(from, value)
        )));
    }
    Ok(to.clone())
}

fn parse_op(name: &str, path: &str, value: &Bson) -> Result<Op, MqlError> {
    let numeric = |verb: &str| {
        if super::number::is_number(value) {
            Ok(value.clone())
        } else {
            Err(MqlError::type_mismatch(format!(
                "Cannot {verb} with non-numeric argument: {{{}}}",
                element(path, value)
            )))
        }
    };
    Ok(match name {
        "$set" => Op::Set(value.clone()),
        "$setOnInsert" => Op::SetOnInsert(value.clone()),
        "$unset" => Op::Unset,
        "$inc" => Op::Inc(numeric("increment")?),
        "$mul" => Op::Mul(numeric("multiply")?),
        "$min" => Op::Min(value.clone()),
        "$max" => Op::Max(value.clone()),
        "$currentDate" => Op::CurrentDate {
            timestamp: current_date_type(path, value)?,
        },
        "$push" => Op::Push(parse_push(value)?),
        "$addToSet" => Op::AddToSet(parse_add_to_set(value)?),
        "$pop" => Op::Pop {
            front: pop_direction(path, value)?,
        },
        "$pull" => {
            if matches!(value, Bson::Document(_) | Bson::RegularExpression(_)) {
                return Err(MqlError::not_implemented(format!(
                    "the front does not apply $pull with a condition ({}): it removes the \
                     elements equal to a value that is not a document or a regular \
                     expression; $pullAll removes several values",
                    element(path, value)
                )));
            }
            Op::Pull(value.clone())
        }
        "$pullAll" => match value {
            Bson::Array(values) => Op::PullAll(values.clone()),
            other => {
                return Err(MqlError::bad_value(format!(
                    "$pullAll requires an array argument but was given a {}",
                    super::type_name(other)
                )))
            }
        },
        _ => return Err(unknown_modifier(name)),
    })
}

fn current_date_type(path: &str, value: &Bson) -> Result<bool, MqlError> {
    match value {
        Bson::Boolean(_) => Ok(false),
        Bson::Document(d) => {
            let mut timestamp = None;
            for (k, v) in d {
                if k != "$type" {
                    return Err(MqlError::bad_value(format!(
                        "Unrecognized $currentDate option: {k}"
                    )));
                }
                timestamp =
                    match v {
                        Bson::String(s) if s == "date" => Some(false),
                        Bson::String(s) if s == "timestamp" => Some(true),
                        _ => return Err(MqlError::bad_value(
                            "The '$type' string field is required to be 'date' or 'timestamp': \
                             {$currentDate: {field : {$type: 'date'}}}",
                        )),
                    };
            }
            timestamp.ok_or_else(|| {
                MqlError::bad_value(
                    "The '$type' string field is required to be 'date' or 'timestamp': \
                     {$currentDate: {field : {$type: 'date'}}}",
                )
            })
        }
        _ => Err(MqlError::bad_value(format!(
            "{path} is not valid type for $currentDate. Please use a boolean ('true') or a \
             $type expression ({{$type: 'timestamp/date'}})."
        ))),
    }
}

fn pop_direction(path: &str, value: &Bson) -> Result<bool, MqlError> {
    let n = integer(value).ok_or_else(|| {
        MqlError::failed_to_parse(format!("Expected a number in: {}", element(path, value)))
    })?;
    match n {
        1 => Ok(false),
        -1 => Ok(true),
        other => Err(MqlError::failed_to_parse(format!(
            "$pop expects 1 or -1, found: {other}"
        ))),
    }
}

/// A number that is a whole integer, as MongoDB's `parseIntegerElementToLong` reads one.
fn integer(value: &Bson) -> Option<i64> {
    match value {
        Bson::Int32(i) => Some(i64::from(*i)),
        Bson::Int64(i) => Some(*i),
        Bson::Double(d) if d.fract() == 0.0 && d.abs() < 9.2e18 => Some(*d as i64),
        _ => None,
    }
}

fn parse_push(value: &Bson) -> Result<Push, MqlError> {
    let each = match value {
        Bson::Document(d) if d.contains_key("$each") => d,
        _ => {
            return Ok(Push {
                values: vec![value.clone()],
                position: None,
                slice: None,
                sort: None,
            })
        }
    };
    let mut push = Push {
        values: Vec::new(),
        position: None,
        slice: None,
        sort: None,
    };
    for (clause, arg) in each {
        match clause.as_str() {
            "$each" => match arg {
                Bson::Array(values) => push.values = values.clone(),
                other => {
                    return Err(MqlError::bad_value(format!(
                        "The argument to $each in $push must be an array but it was of type: {}",
                        super::type_name(other)
                    )))
                }
            },
            "$slice" => {
                push.slice = Some(integer(arg).ok_or_else(|| {
                    MqlError::bad_value(format!(
                        "The value for $slice must be an integer value but was given type: {}",
                        super::type_name(arg)
                    ))
                })?)
            }
            "$position" => {
                push.position = Some(integer(arg).ok_or_else(|| {
                    MqlError::bad_value(format!(
                        "The value for $position must be an integer value, not of type: {}",
                        super::type_name(arg)
                    ))
                })?)
            }
            "$sort" => push.sort = Some(parse_push_sort(arg)?),
            other => {
                return Err(MqlError::bad_value(format!(
                    "Unrecognized clause in $push: {other}"
                )))
            }
        }
    }
    Ok(push)
}

fn parse_push_sort(arg: &Bson) -> Result<PushSort, MqlError> {
    let direction = |v: &Bson| match v {
        Bson::Int32(1) | Bson::Int64(1) => Some(true),
        Bson::Int32(-1) | Bson::Int64(-1) => Some(false),
        Bson::Double(d) if *d == 1.0 => Some(true),
        Bson::Double(d) if *d == -1.0 => Some(false),
        _ => None,
    };
    let bad_direction = || MqlError::bad_value("The $sort element value must be either 1 or -1");
    match arg {
        Bson::Document(d) => {
            if d.is_empty() {
                return Err(MqlError::bad_value(
                    "The $sort pattern is empty when it should be a set of fields.",
                ));
            }
            let mut fields = Vec::new();
            for (k, v) in d {
                let asc = direction(v).ok_or_else(bad_direction)?;
                if k.is_empty() || k.split('.').any(str::is_empty) {
                    return Err(MqlError::bad_value(format!(
                        "The $sort field is a dotted field but has an empty part: {k}"
                    )));
                }
                fields.push((k.clone(), asc));
            }
            Ok(PushSort::Fields(fields))
        }
        v if super::number::is_number(v) => {
            Ok(PushSort::Whole(direction(v).ok_or_else(bad_direction)?))
        }
        _ => Err(MqlError::bad_value(
            "The $sort is invalid: use 1/-1 to sort the whole element, or {field:1/-1} to sort \
             embedded fields",
        )),
    }
}

fn parse_add_to_set(value: &Bson) -> Result<Vec<Bson>, MqlError> {
    let values = match value {
        Bson::Document(d) if d.keys().next().map(String::as_str) == Some("$each") => {
            if d.len() > 1 {
                let extra: Vec<&str> = d.keys().skip(1).map(String::as_str).collect();
                return Err(MqlError::bad_value(format!(
                    "Found unexpected fields after $each in $addToSet: {}",
                    extra.join(", ")
                )));
            }
            match &d["$each"] {
                Bson::Array(values) => values.clone(),
                other => {
                    return Err(MqlError::type_mismatch(format!(
                        "The argument to $each in $addToSet must be an array but it was of \
                         type {}",
                        super::type_name(other)
                    )))
                }
            }
        }
        other => vec![other.clone()],
    };
    // The values added, each once (the first of equal ones).
    let mut distinct: Vec<Bson> = Vec::new();
    for v in values {
        if !distinct.iter().any(|d| super::order::equal(d, &v)) {
            distinct.push(v);
        }
    }
    Ok(distinct)
}

impl PushSort {
    fn compare(&self, a: &Bson, b: &Bson) -> Ordering {
        match self {
            PushSort::Whole(asc) => {
                let o = super::order::compare(a, b);
                if *asc {
                    o
                } else {
                    o.reverse()
                }
            }
            PushSort::Fields(fields) => {
                let value = |v: &Bson, p: &str| match v {
                    Bson::Document(d) => super::path::get(d, p).cloned().unwrap_or(Bson::Null),
                    _ => Bson::Null,
                };
                for (p, asc) in fields {
                    let o = super::order::compare(&value(a, p), &value(b, p));
                    let o = if *asc { o } else { o.reverse() };
                    if o != Ordering::Equal {
                        return o;
                    }
                }
                Ordering::Equal
            }
        }
    }
}

#[cfg(test)]
mod tests;

//! The walk of a parsed [`Update`] over a document, field by field in MongoDB's order, and
//! what each operator does to an element that exists and to one that does not (MongoDB's
//! `applyToExistingElement` / `applyToNonexistentElement` of each modifier).

use std::collections::HashMap;

use bson::{Bson, DateTime, Document, Timestamp};

use super::{Entry, Leaf, Node, Op, Push, Update};
use crate::mql::number::{self, Arithmetic};
use crate::mql::path::{self, array_index, cannot_create};
use crate::mql::text::element;
use crate::mql::{order, type_name, MqlError};

struct Context {
    inserting: bool,
    now: DateTime,
    /// The document's `_id` as messages quote it (`_id: 1`), or `no id`.
    id: String,
    /// Each `$rename` source's value before the update, when it exists.
    sources: HashMap<String, Option<Bson>>,
}

pub(super) fn run(
    update: &Update,
    doc: &mut Document,
    inserting: bool,
    now: DateTime,
) -> Result<(), MqlError> {
    let id = doc
        .get("_id")
        .map_or_else(|| "no id".to_owned(), |v| element("_id", v));
    let mut sources = HashMap::new();
    for (from, _) in &update.renames {
        sources.insert(from.clone(), rename_source(doc, from, &id)?);
    }
    let ctx = Context {
        inserting,
        now,
        id,
        sources,
    };
    let mut root = Parent::Document(doc);
    for (name, entry) in &update.root.children {
        apply_entry(&mut root, "", &name.0, entry, 0, &ctx)?;
    }
    for (from, _) in &update.renames {
        if ctx.sources[from].is_some() {
            unset(doc, from);
        }
    }
    Ok(())
}

/// The value a `$rename` moves, read before the update; a source inside an array is refused.
fn rename_source(doc: &Document, from: &str, id: &str) -> Result<Option<Bson>, MqlError> {
    let parts = path::parts(from);
    let mut current = match doc.get(parts[0]) {
        Some(v) => v,
        None => return Ok(None),
    };
    for (i, part) in parts.iter().enumerate().skip(1) {
        current = match current {
            Bson::Document(d) => match d.get(*part) {
                Some(v) => v,
                None => return Ok(None),
            },
            Bson::Array(_) => {
                return Err(MqlError::bad_value(format!(
                    "The source field cannot be an array element, '{from}' in doc with {id} has \
                     an array field called '{}'",
                    parts[i - 1]
                )))
            }
            _ => return Ok(None),
        };
    }
    Ok(Some(current.clone()))
}

/// Removes the value at `path` (a `$rename`'s source; no array on the way, checked before).
fn unset(doc: &mut Document, path: &str) {
    match path.split_once('.') {
        None => {
            doc.remove(path);
        }
        Some((head, rest)) => {
            if let Some(Bson::Document(d)) = doc.get_mut(head) {
                unset(d, rest);
            }
        }
    }
}

/// Where an element is looked up or created: a document's field or an array's element.
enum Parent<'a> {
    Document(&'a mut Document),
    Array(&'a mut Vec<Bson>),
}

impl Parent<'_> {
    fn get_mut(&mut self, field: &str) -> Option<&mut Bson> {
        match self {
            Parent::Document(d) => d.get_mut(field),
            Parent::Array(a) => array_index(field).and_then(|i| a.get_mut(i)),
        }
    }

    /// `$unset`'s removal: a document's field goes, an array's element becomes null (the
    /// array keeps its length).
    fn remove(&mut self, field: &str) {
        match self {
            Parent::Document(d) => {
                d.remove(field);
            }
            Parent::Array(a) => {
                if let Some(v) = array_index(field).and_then(|i| a.get_mut(i)) {
                    *v = Bson::Null;
                }
            }
        }
    }

    /// Creates `field` with `value`: appended to a document; at its index in an array (padded
    /// with nulls); refused for a name that is not an index of an array.
    fn create(&mut self, name: &str, field: &str, value: Bson) -> Result<(), MqlError> {
        match self {
            Parent::Document(d) => {
                d.insert(field, value);
                Ok(())
            }
            Parent::Array(a) => match array_index(field) {
                Some(index) => {
                    path::pad(a, index)?;
                    a.push(value);
                    Ok(())
                }
                None => Err(cannot_create(field, name, &Bson::Array(a.to_vec()))),
            },
        }
    }

    fn value(&self) -> Bson {
        match self {
            Parent::Document(d) => Bson::Document((*d).clone()),
            Parent::Array(a) => Bson::Array(a.to_vec()),
        }
    }
}

/// Applies `entry` to the field `field` of `parent` (named `name`); `depth` is the index of
/// `field` among the components of the paths below it.
fn apply_entry(
    parent: &mut Parent,
    name: &str,
    field: &str,
    entry: &Entry,
    depth: usize,
    ctx: &Context,
) -> Result<(), MqlError> {
    match entry {
        Entry::Leaf(leaf) => {
            if let Op::RenameTo { from } = &leaf.op {
                if ctx.sources[from].is_some() {
                    if let Parent::Array(_) = parent {
                        return Err(MqlError::bad_value(format!(
                            "The destination field cannot be an array element, '{}' in doc \
                             with {} has an array field called '{name}'",
                            leaf.path, ctx.id
                        )));
                    }
                }
            }
            match parent.get_mut(field) {
                Some(value) => {
                    if existing(leaf, field, value, ctx)? == Outcome::Remove {
                        parent.remove(field);
                    }
                    Ok(())
                }
                None => match created(leaf, ctx) {
                    Some(value) => parent.create(name, field, value),
                    None => {
                        if let (Op::Pop { .. }, Parent::Array(_)) = (&leaf.op, &*parent) {
                            if array_index(field).is_none() {
                                return Err(untraversable(leaf, depth, name, &parent.value()));
                            }
                        }
                        Ok(())
                    }
                },
            }
        }
        Entry::Node(node) => match parent.get_mut(field) {
            Some(Bson::Document(d)) => {
                let mut inner = Parent::Document(d);
                apply_children(&mut inner, field, node, depth + 1, ctx)
            }
            Some(Bson::Array(a)) => {
                let mut inner = Parent::Array(a);
                apply_children(&mut inner, field, node, depth + 1, ctx)
            }
            Some(blocking) => {
                let blocking = blocking.clone();
                blocked(node, field, &blocking, depth, ctx)
            }
            None => {
                // The path goes on where nothing is: what the leaves below create, created.
                let mut created = Document::new();
                let mut inner = Parent::Document(&mut created);
                apply_children(&mut inner, field, node, depth + 1, ctx)?;
                if created.is_empty() {
                    return Ok(());
                }
                parent.create(name, field, Bson::Document(created))
            }
        },
    }
}

fn apply_children(
    parent: &mut Parent,
    name: &str,
    node: &Node,
    depth: usize,
    ctx: &Context,
) -> Result<(), MqlError> {
    for (child, entry) in &node.children {
        apply_entry(parent, name, &child.0, entry, depth, ctx)?;
    }
    Ok(())
}

/// Paths that go on through a value that is neither a document nor an array: the first
/// operation that would create something there fails, `$pop` fails, the others do nothing.
fn blocked(
    node: &Node,
    field: &str,
    value: &Bson,
    depth: usize,
    ctx: &Context,
) -> Result<(), MqlError> {
    let mut leaves = Vec::new();
    collect_leaves(node, &mut leaves);
    for leaf in leaves {
        let next = leaf.path.split('.').nth(depth + 1).unwrap_or_default();
        if created(leaf, ctx).is_some() {
            return Err(cannot_create(next, field, value));
        }
        if matches!(leaf.op, Op::Pop { .. }) {
            return Err(untraversable(leaf, depth, field, value));
        }
    }
    Ok(())
}

fn collect_leaves<'a>(node: &'a Node, out: &mut Vec<&'a Leaf>) {
    for entry in node.children.values() {
        match entry {
            Entry::Leaf(l) => out.push(l),
            Entry::Node(n) => collect_leaves(n, out),
        }
    }
}

/// `$pop`'s refusal of a path it cannot follow (`checkViability`).
fn untraversable(leaf: &Leaf, depth: usize, name: &str, value: &Bson) -> MqlError {
    let next = leaf.path.split('.').nth(depth + 1).unwrap_or_default();
    MqlError::path_not_viable(format!(
        "Cannot use the part ({next}) of ({}) to traverse the element ({{{}}})",
        leaf.path,
        element(name, value)
    ))
}

#[derive(Debug, PartialEq, Eq)]
enum Outcome {
    Keep,
    Remove,
}

/// An operation on an element that exists (`name` is its field name).
fn existing(leaf: &Leaf, name: &str, value: &mut Bson, ctx: &Context) -> Result<Outcome, MqlError> {
    match &leaf.op {
        Op::Set(v) => *value = v.clone(),
        Op::SetOnInsert(v) => {
            if ctx.inserting {
                *value = v.clone();
            }
        }
        Op::Unset => return Ok(Outcome::Remove),
        Op::Inc(by) => *value = arithmetic("$inc", name, value, by, ctx)?,
        Op::Mul(by) => *value = arithmetic("$mul", name, value, by, ctx)?,
        Op::Min(v) => {
            if order::compare(v, value).is_lt() {
                *value = v.clone();
            }
        }
        Op::Max(v) => {
            if order::compare(v, value).is_gt() {
                *value = v.clone();
            }
        }
        Op::CurrentDate { timestamp } => *value = now(*timestamp, ctx),
        Op::Push(push) => match value {
            Bson::Array(a) => perform_push(a, push),
            other => {
                return Err(MqlError::bad_value(format!(
                    "The field '{}' must be an array but is of type {} in document {{{}}}",
                    leaf.path,
                    type_name(other),
                    ctx.id
                )))
            }
        },
        Op::AddToSet(values) => match value {
            Bson::Array(a) => {
                for v in values {
                    if !a.iter().any(|e| order::equal(e, v)) {
                        a.push(v.clone());
                    }
                }
            }
            other => {
                return Err(MqlError::bad_value(format!(
                    "Cannot apply $addToSet to non-array field. Field named '{name}' has \
                     non-array type {}",
                    type_name(other)
                )))
            }
        },
        Op::Pop { front } => match value {
            Bson::Array(a) => {
                if !a.is_empty() {
                    if *front {
                        a.remove(0);
                    } else {
                        a.pop();
                    }
                }
            }
            other => {
                return Err(MqlError::type_mismatch(format!(
                    "Path '{}' contains an element of non-array type '{}'",
                    leaf.path,
                    type_name(other)
                )))
            }
        },
        Op::Pull(v) => cull(value, |e| order::equal(e, v))?,
        Op::PullAll(values) => cull(value, |e| values.iter().any(|v| order::equal(e, v)))?,
        Op::RenameTo { from } => {
            if let Some(v) = &ctx.sources[from] {
                *value = v.clone();
            }
        }
        Op::RenameFrom => {}
    }
    Ok(Outcome::Keep)
}

/// The value an operation creates where its path reaches nothing, or `None` when it creates
/// nothing (`$unset`, `$pop`, `$pull`, `$pullAll`, `$setOnInsert` outside an insert, a
/// `$rename` of nothing).
fn created(leaf: &Leaf, ctx: &Context) -> Option<Bson> {
    Some(match &leaf.op {
        Op::Set(v) | Op::Min(v) | Op::Max(v) | Op::Inc(v) => v.clone(),
        Op::SetOnInsert(v) if ctx.inserting => v.clone(),
        // A zero of the operand's type (`$mul` of a missing field).
        Op::Mul(by) => match number::multiply(by, &Bson::Int32(0)) {
            Arithmetic::Value(v) => v,
            _ => by.clone(),
        },
        Op::CurrentDate { timestamp } => now(*timestamp, ctx),
        Op::Push(push) => {
            let mut a = Vec::new();
            perform_push(&mut a, push);
            Bson::Array(a)
        }
        Op::AddToSet(values) => Bson::Array(values.clone()),
        Op::RenameTo { from } => ctx.sources[from].clone()?,
        Op::SetOnInsert(_)
        | Op::Unset
        | Op::Pop { .. }
        | Op::Pull(_)
        | Op::PullAll(_)
        | Op::RenameFrom => return None,
    })
}

/// `$currentDate`'s value: the date, or a timestamp of its seconds (MongoDB writes its
/// cluster time; increment 1 here).
fn now(timestamp: bool, ctx: &Context) -> Bson {
    if timestamp {
        Bson::Timestamp(Timestamp {
            time: (ctx.now.timestamp_millis().max(0) / 1000) as u32,
            increment: 1,
        })
    } else {
        Bson::DateTime(ctx.now)
    }
}

fn arithmetic(
    operator: &str,
    name: &str,
    current: &Bson,
    by: &Bson,
    ctx: &Context,
) -> Result<Bson, MqlError> {
    if !number::is_number(current) {
        return Err(MqlError::type_mismatch(format!(
            "Cannot apply {operator} to a value of non-numeric type. {{{}}} has the field \
             '{name}' of non-numeric type {}",
            ctx.id,
            type_name(current)
        )));
    }
    let result = if operator == "$inc" {
        number::add(current, by)
    } else {
        number::multiply(current, by)
    };
    match result {
        Arithmetic::Value(v) => Ok(v),
        Arithmetic::Overflow => {
            let shown = match current {
                Bson::Int32(i) => format!("(NumberInt){i}"),
                Bson::Int64(i) => format!("(NumberLong){i}"),
                other => format!("(NumberDouble){other}"),
            };
            Err(MqlError::bad_value(format!(
                "Failed to apply {operator} operations to current value ({shown}) for document \
                 {{{}}}",
                ctx.id
            )))
        }
        Arithmetic::Decimal | Arithmetic::NotANumber => Err(MqlError::not_implemented(format!(
            "the front does not compute {operator} with Decimal128 values (field '{name}'): \
             int, long and double are supported"
        ))),
    }
}

/// `$pull`'s and `$pullAll`'s removal of the elements `remove` selects.
fn cull(value: &mut Bson, remove: impl Fn(&Bson) -> bool) -> Result<(), MqlError> {
    match value {
        Bson::Array(a) => {
            a.retain(|e| !remove(e));
            Ok(())
        }
        _ => Err(MqlError::bad_value(
            "Cannot apply $pull to a non-array value",
        )),
    }
}

/// `$push`: the values inserted at `$position` (appended without one; counted from the end
/// when negative), then the array sorted (stably) by `$sort`, then cut to `$slice` elements
/// (the first ones, or the last ones when negative).
fn perform_push(array: &mut Vec<Bson>, push: &Push) {
    let len = array.len() as i64;
    let at = match push.position {
        None => len,
        Some(p) if p >= 0 => p.min(len),
        Some(p) => (len + p).max(0),
    } as usize;
    array.splice(at..at, push.values.iter().cloned());
    if let Some(sort) = &push.sort {
        array.sort_by(|a, b| sort.compare(a, b));
    }
    if let Some(slice) = push.slice {
        let keep = slice.unsigned_abs().min(array.len() as u64) as usize;
        if slice >= 0 {
            array.truncate(keep);
        } else {
            array.drain(..array.len() - keep);
        }
    }
}

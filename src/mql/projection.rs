//! Projections: `find`'s `projection`, the `$project` and `$unset` stages, applied to
//! documents as MongoDB applies them, and the projection the servers can apply before the
//! front does ([`Projection::for_servers`]).
//!
//! A projection includes (`{a: 1, "b.c": true}`) or excludes (`{a: 0}`) dotted paths, never
//! both, but for `_id`, which is included unless excluded and may be excluded from an
//! inclusion (`{_id: 0, a: 1}`) or included in an exclusion. Values are booleans or numbers
//! (non-zero includes); `{a: {b: 1}}` is `{"a.b": 1}`. Through arrays, an inclusion keeps from
//! each element what the rest of the path keeps (`{"a.b": 1}` on `{a: [{b: 1, c: 2}, 5]}`
//! gives `{a: [{b: 1}]}`: elements that are not documents are dropped) and an exclusion removes
//! it (keeping other elements). Included fields keep the order of the document, not of the
//! projection. Arrays inside arrays are projected likewise, in `find` and `$project` alike
//! (MongoDB's `kRecurseNestedArrays`, the default of both policies).
//!
//! Supported too: `find`'s `$slice` (`{a: {$slice: 2}}`, `-2`, `[skip, limit]`). Refused,
//! naming what is supported: the positional `$`, `$elemMatch`, `$meta`, and computed fields
//! (literals, `"$path"`, expressions).

use bson::{Bson, Document};

use super::path;
use super::MqlError;

/// Which command's rules a projection follows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Policy {
    /// `find`, `findAndModify`: `find`'s `$slice` allowed, an empty projection is none.
    Find,
    /// The `$project` and `$unset` stages: no `find`-only feature, no empty projection.
    Aggregation,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    Inclusion,
    Exclusion,
}

/// A parsed projection.
#[derive(Clone, Debug, PartialEq)]
pub struct Projection {
    mode: Mode,
    root: Node,
    policy: Policy,
}

/// The projection of one level of a document: its fields in the order the projection names
/// them.
#[derive(Clone, Debug, PartialEq, Default)]
struct Node {
    children: Vec<(String, Child)>,
}

#[derive(Clone, Debug, PartialEq)]
enum Child {
    /// Included (`true`) or excluded whole.
    Whole(bool),
    /// `$slice`: the array kept, cut (`find` only).
    Slice {
        skip: i64,
        limit: Option<i64>,
    },
    Node(Node),
}

impl Node {
    fn get(&self, name: &str) -> Option<&Child> {
        self.children
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, c)| c)
    }

    fn get_mut(&mut self, name: &str) -> Option<&mut Child> {
        self.children
            .iter_mut()
            .find(|(n, _)| n == name)
            .map(|(_, c)| c)
    }

    /// Adds `child` at `parts`, with MongoDB's path collision errors.
    fn add(&mut self, full: &str, parts: &[&str], child: Child) -> Result<(), MqlError> {
        let (head, rest) = (parts[0], &parts[1..]);
        if rest.is_empty() {
            if self.get(head).is_some() {
                return Err(MqlError::location(
                    31250,
                    format!("Path collision at {full}"),
                ));
            }
            self.children.push((head.to_owned(), child));
            return Ok(());
        }
        if self.get(head).is_none() {
            self.children
                .push((head.to_owned(), Child::Node(Node::default())));
        }
        match self.get_mut(head) {
            Some(Child::Node(n)) => n.add(full, rest, child),
            _ => Err(MqlError::location(
                31249,
                format!(
                    "Path collision at {full} remaining portion {}",
                    rest.join(".")
                ),
            )),
        }
    }

    /// The node at `parts`, created when missing (for a sub-projection `{a: {b: 1}}`).
    fn node_at(&mut self, full: &str, parts: &[&str]) -> Result<&mut Node, MqlError> {
        let (head, rest) = (parts[0], &parts[1..]);
        if self.get(head).is_none() {
            self.children
                .push((head.to_owned(), Child::Node(Node::default())));
        }
        match self.get_mut(head) {
            Some(Child::Node(n)) => {
                if rest.is_empty() {
                    Ok(n)
                } else {
                    n.node_at(full, rest)
                }
            }
            _ => Err(MqlError::location(
                31250,
                format!("Path collision at {full}"),
            )),
        }
    }

    fn remove(&mut self, name: &str) {
        self.children.retain(|(n, _)| n != name);
    }
}

/// What parsing has found so far (MongoDB's `ParseContext`).
#[derive(Default)]
struct Parse {
    mode: Option<Mode>,
    id_specified: bool,
    id_included: bool,
    id_excluded: bool,
    has_slice: bool,
}

impl Projection {
    /// `find`'s projection. An empty projection returns whole documents.
    pub fn parse(spec: &Document) -> Result<Projection, MqlError> {
        Projection::parse_with(spec, Policy::Find)
    }

    /// The `$project` stage's specification (an empty one is refused, as MongoDB refuses it).
    pub fn parse_stage(spec: &Document) -> Result<Projection, MqlError> {
        let context = |e: MqlError| MqlError {
            message: format!("Invalid $project :: caused by :: {}", e.message),
            ..e
        };
        if spec.is_empty() {
            return Err(context(MqlError::location(
                51272,
                "projection specification must have at least one field",
            )));
        }
        Projection::parse_with(spec, Policy::Aggregation).map_err(context)
    }

    /// The exclusion of `paths`, as the `$unset` stage is.
    pub fn exclusion<'a>(paths: impl IntoIterator<Item = &'a str>) -> Result<Projection, MqlError> {
        let mut root = Node::default();
        for p in paths {
            let parts = path::check(p)?;
            root.add(p, &parts, Child::Whole(false))?;
        }
        Ok(Projection {
            mode: Mode::Exclusion,
            root,
            policy: Policy::Aggregation,
        })
    }

    fn parse_with(spec: &Document, policy: Policy) -> Result<Projection, MqlError> {
        let mut root = Node::default();
        let mut parse = Parse::default();
        for (field, value) in spec {
            parse.id_specified |= field == "_id" || field.starts_with("_id.");
            parse_element(&mut parse, &mut root, true, "", field, value, policy)?;
        }
        let mode = match parse.mode {
            Some(m) => m,
            None if parse.has_slice && !parse.id_included => Mode::Exclusion,
            None if parse.has_slice || parse.id_included => Mode::Inclusion,
            None => Mode::Exclusion,
        };
        if mode == Mode::Inclusion && !parse.id_specified {
            root.children
                .insert(0, ("_id".to_owned(), Child::Whole(true)));
        }
        if mode == Mode::Exclusion && parse.id_included {
            // `{_id: 1, a: 0}`: legal, and the same as `{a: 0}`.
            root.remove("_id");
        }
        Ok(Projection { mode, root, policy })
    }

    /// Whether the projection returns whole documents.
    pub fn is_identity(&self) -> bool {
        self.mode == Mode::Exclusion && self.root.children.is_empty()
    }

    /// Which command's rules the projection was parsed by.
    pub fn policy(&self) -> Policy {
        self.policy
    }

    /// Whether the projection names the fields to keep (else the fields to drop).
    pub fn is_inclusion(&self) -> bool {
        self.mode == Mode::Inclusion
    }

    /// The projection of one document.
    pub fn apply(&self, doc: &Document) -> Document {
        match self.mode {
            Mode::Inclusion => include(doc, &self.root),
            Mode::Exclusion => exclude(doc, &self.root),
        }
    }

    /// The projection to send to the servers that read the documents, so that the caller
    /// still has `_id` and every path in `also` (sort keys, for instance) after it, and
    /// [`Projection::apply`] on what they return gives what it gives on whole documents.
    /// `None` when whole documents must be read.
    ///
    /// A path in `also` keeps its whole top-level field (a sort key on `"a.b"` depends on
    /// every element of an array `a`, which an inclusion of `"a.b"` would drop). `$slice` is
    /// applied by the front only (a `[skip, limit]` slice applied twice cuts twice). Send it
    /// as a `find` projection: `find` and `$project` project paths alike.
    pub fn for_servers(&self, also: &[&str]) -> Option<Document> {
        let kept: Vec<&str> = also
            .iter()
            .map(|p| p.split('.').next().unwrap_or(p))
            .chain(["_id"])
            .collect();
        match self.mode {
            Mode::Inclusion => {
                let mut paths: Vec<String> = Vec::new();
                collect_included(&self.root, "", &mut paths);
                paths.extend(kept.iter().map(|k| (*k).to_owned()));
                // A path under another one adds nothing.
                let mut spec = Document::new();
                for p in &paths {
                    let covered = paths.iter().any(|q| path::is_prefix(q, p));
                    if !covered && !spec.contains_key(p) {
                        spec.insert(p.clone(), 1);
                    }
                }
                Some(spec)
            }
            Mode::Exclusion => {
                let mut paths = Vec::new();
                collect_excluded(&self.root, "", &mut paths);
                let spec: Document = paths
                    .into_iter()
                    .filter(|p| {
                        let top = p.split('.').next().unwrap_or(p);
                        !kept.contains(&top)
                    })
                    .map(|p| (p, Bson::Int32(0)))
                    .collect();
                (!spec.is_empty()).then_some(spec)
            }
        }
    }
}

fn parse_element(
    parse: &mut Parse,
    parent: &mut Node,
    at_root: bool,
    prefix: &str,
    field: &str,
    value: &Bson,
    policy: Policy,
) -> Result<(), MqlError> {
    let full = if prefix.is_empty() {
        field.to_owned()
    } else {
        format!("{prefix}.{field}")
    };
    if field == "$" || field.ends_with(".$") || field.contains(".$.") {
        return Err(MqlError::not_implemented(format!(
            "the front does not apply the positional projection '{full}': project paths with \
             1 or 0 (and $slice)"
        )));
    }
    let parts = path::check(field)?;
    let top_level_id = at_root && field == "_id";
    match value {
        Bson::Document(sub) => {
            let first = sub.keys().next().map(String::as_str);
            if sub.len() == 1 && first.is_some_and(|k| k.starts_with('$')) {
                let operator = first.expect("one field");
                if operator == "$slice" && policy == Policy::Find {
                    let child = parse_slice(&sub["$slice"])?;
                    parent.add(&full, &parts, child)?;
                    parse.has_slice = true;
                    return Ok(());
                }
                return Err(MqlError::not_implemented(format!(
                    "the front does not evaluate the projection {{{full}: {{{operator}: ...}}}}: \
                     it includes or excludes paths with 1 or 0{}",
                    if policy == Policy::Find {
                        ", and applies $slice"
                    } else {
                        ""
                    }
                )));
            }
            let node = parent.node_at(&full, &parts)?;
            for (k, v) in sub {
                parse_element(parse, node, false, &full, k, v, policy)?;
            }
            Ok(())
        }
        Bson::Boolean(_)
        | Bson::Int32(_)
        | Bson::Int64(_)
        | Bson::Double(_)
        | Bson::Decimal128(_) => {
            let include = truthy(value);
            parent.add(&full, &parts, Child::Whole(include))?;
            if top_level_id {
                if include {
                    parse.id_included = true;
                } else {
                    parse.id_excluded = true;
                }
                return Ok(());
            }
            let (mode, code, word) = if include {
                (Mode::Inclusion, 31253, "inclusion")
            } else {
                (Mode::Exclusion, 31254, "exclusion")
            };
            if parse.mode.is_some_and(|m| m != mode) {
                let other = if include { "exclusion" } else { "inclusion" };
                return Err(MqlError::location(
                    code,
                    format!("Cannot do {word} on field {full} in {other} projection"),
                ));
            }
            parse.mode = Some(mode);
            Ok(())
        }
        other => Err(MqlError::not_implemented(format!(
            "the front does not compute the projected field {}: it includes or excludes paths \
             with 1 or 0 (literal values and \"$path\" expressions are not evaluated)",
            super::text::element(&full, other)
        ))),
    }
}

/// MongoDB's truth of an inclusion value: `true` or a non-zero number.
fn truthy(value: &Bson) -> bool {
    match value {
        Bson::Boolean(b) => *b,
        Bson::Int32(i) => *i != 0,
        Bson::Int64(i) => *i != 0,
        Bson::Double(d) => *d != 0.0,
        Bson::Decimal128(_) => !super::order::equal(value, &Bson::Int32(0)),
        _ => false,
    }
}

fn parse_slice(value: &Bson) -> Result<Child, MqlError> {
    let int = |v: &Bson| match v {
        Bson::Int32(i) => Some(i64::from(*i)),
        Bson::Int64(i) => Some(*i),
        Bson::Double(d) => Some(*d as i64),
        _ => None,
    };
    if let Some(n) = int(value) {
        return Ok(Child::Slice {
            skip: n,
            limit: None,
        });
    }
    let Bson::Array(args) = value else {
        return Err(MqlError::location(
            31273,
            "$slice only supports numbers and [skip, limit] arrays",
        ));
    };
    if args.len() != 2 {
        return Err(MqlError::location(
            31272,
            "$slice array argument should be of form [skip, limit]",
        ));
    }
    let skip = int(&args[0]).ok_or_else(|| {
        MqlError::location(
            31257,
            format!(
                "$slice expects the skip argument to be a number, got {}",
                super::type_name(&args[0])
            ),
        )
    })?;
    let limit = int(&args[1]).ok_or_else(|| {
        MqlError::location(
            31258,
            format!(
                "$slice expects the limit argument to be a number, got {}",
                super::type_name(&args[1])
            ),
        )
    })?;
    if limit <= 0 {
        return Err(MqlError::location(
            31259,
            format!("$slice limit must be positive, got {limit}"),
        ));
    }
    Ok(Child::Slice {
        skip,
        limit: Some(limit),
    })
}

fn include(doc: &Document, node: &Node) -> Document {
    let mut out = Document::new();
    for (field, value) in doc {
        match node.get(field) {
            Some(Child::Whole(true)) => {
                out.insert(field.clone(), value.clone());
            }
            Some(Child::Slice { skip, limit }) => {
                out.insert(field.clone(), slice_value(value, *skip, *limit));
            }
            Some(Child::Node(n)) => {
                if let Some(v) = include_value(value, n) {
                    out.insert(field.clone(), v);
                }
            }
            Some(Child::Whole(false)) | None => {}
        }
    }
    out
}

/// What an inclusion keeps of a value the path goes on into: a document's projection; an
/// array's elements projected (documents and arrays), the others dropped; nothing of a
/// scalar.
fn include_value(value: &Bson, node: &Node) -> Option<Bson> {
    match value {
        Bson::Document(d) => Some(Bson::Document(include(d, node))),
        Bson::Array(a) => Some(Bson::Array(
            a.iter()
                .filter_map(|v| match v {
                    Bson::Document(d) => Some(Bson::Document(include(d, node))),
                    Bson::Array(_) => include_value(v, node),
                    _ => None,
                })
                .collect(),
        )),
        _ => None,
    }
}

fn exclude(doc: &Document, node: &Node) -> Document {
    let mut out = Document::new();
    for (field, value) in doc {
        match node.get(field) {
            Some(Child::Whole(false)) => {}
            Some(Child::Slice { skip, limit }) => {
                out.insert(field.clone(), slice_value(value, *skip, *limit));
            }
            Some(Child::Node(n)) => {
                out.insert(field.clone(), exclude_value(value, n));
            }
            Some(Child::Whole(true)) | None => {
                out.insert(field.clone(), value.clone());
            }
        }
    }
    out
}

fn exclude_value(value: &Bson, node: &Node) -> Bson {
    match value {
        Bson::Document(d) => Bson::Document(exclude(d, node)),
        Bson::Array(a) => Bson::Array(
            a.iter()
                .map(|v| match v {
                    Bson::Document(d) => Bson::Document(exclude(d, node)),
                    Bson::Array(_) => exclude_value(v, node),
                    other => other.clone(),
                })
                .collect(),
        ),
        other => other.clone(),
    }
}

/// `find`'s `$slice` of a value: an array cut (the first `skip` elements, the last `-skip`,
/// or `limit` elements from `skip`, from the end when negative); anything else as it is.
fn slice_value(value: &Bson, skip: i64, limit: Option<i64>) -> Bson {
    let Bson::Array(a) = value else {
        return value.clone();
    };
    let len = a.len() as i64;
    let (start, count) = match limit {
        None if skip >= 0 => (0, skip.min(len)),
        None => {
            let start = (len + skip).max(0);
            (start, len - start)
        }
        Some(limit) => {
            let start = if skip >= 0 {
                skip.min(len)
            } else {
                (len + skip).max(0)
            };
            (start, (len - start).min(limit))
        }
    };
    Bson::Array(a[start as usize..(start + count) as usize].to_vec())
}

fn collect_included(node: &Node, prefix: &str, out: &mut Vec<String>) {
    for (name, child) in &node.children {
        let full = if prefix.is_empty() {
            name.clone()
        } else {
            format!("{prefix}.{name}")
        };
        match child {
            Child::Whole(true) => out.push(full),
            // The front slices: the servers return the whole top-level field.
            Child::Slice { .. } => out.push(full.split('.').next().unwrap_or(&full).to_owned()),
            Child::Node(n) => collect_included(n, &full, out),
            Child::Whole(false) => {}
        }
    }
}

fn collect_excluded(node: &Node, prefix: &str, out: &mut Vec<String>) {
    for (name, child) in &node.children {
        let full = if prefix.is_empty() {
            name.clone()
        } else {
            format!("{prefix}.{name}")
        };
        match child {
            Child::Whole(false) => out.push(full),
            Child::Node(n) => collect_excluded(n, &full, out),
            Child::Whole(true) | Child::Slice { .. } => {}
        }
    }
}

#[cfg(test)]
mod tests;

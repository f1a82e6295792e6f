//! Sort specifications (`{a: 1, "b.c": -1}`) and MongoDB's sort order of documents under them.
//!
//! A document's sort key is computed as MongoDB computes it (`SortKeyGenerator`, through the
//! index key generator): the values each path reaches, with arrays expanded as an index over
//! the paths would expand them, and then the smallest key tuple in the sort's order. So, per
//! the manual's "Comparison/Sort Order" page:
//!
//! - a missing field sorts as `null` (`{}` and `{a: null}` tie);
//! - a path through an array gives every element's value: an ascending sort uses the smallest,
//!   a descending sort the largest (`[1, 5]` sorts as 1 ascending, as 5 descending);
//! - an empty array at the end of the path sorts as `undefined`, below `null` and missing, in
//!   both directions (so it comes first ascending and last descending); an empty array in the
//!   middle of a path gives `null`; an array element that is not a document, where the path
//!   goes on, gives `null`;
//! - arrays inside arrays are not expanded further (`[[1, 2], 3]` gives `[1, 2]` and `3`);
//! - a numeric component after an array indexes it when the element exists (`"a.0"`);
//! - the paths of a compound sort that go through the same array take their values from the
//!   same element (`{a: [{x: 1, y: 1}, {x: 2, y: 5}]}` under `{"a.x": 1, "a.y": -1}` sorts as
//!   `(1, 1)`, not as `(1, 5)`), and paths through two different arrays are refused ("cannot
//!   sort with keys that are parallel arrays", BadValue).
//!
//! Ties are not ordered by the key: [`SortSpec::sort`] is stable (documents that tie keep the
//! order they were given in); MongoDB itself promises no order among ties.

use std::cmp::Ordering;

use bson::{Bson, Document};

use super::order;
use super::path::{self, element_index};
use super::text::element;
use super::MqlError;

/// A parsed sort specification: `(path, ascending)` in order. Empty: no sort.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct SortSpec {
    keys: Vec<(String, bool)>,
}

/// A document's sort key under a [`SortSpec`]: one value per path.
#[derive(Clone, Debug, PartialEq)]
pub struct SortKey(pub Vec<Bson>);

impl SortSpec {
    /// Parses a sort specification as `find`'s `sort` and the `$sort` stage read it: each
    /// value `1` or `-1` of any numeric type (`1.0`, `NumberLong(-1)`; 2 or 0 are refused, as
    /// MongoDB 7.0 refuses them), each path a valid field path. `{$meta: ...}` (text or search
    /// scores) is refused: the front has no scores. An empty specification is no sort (the
    /// `$sort` stage refuses it: [`super::pipeline`]).
    pub fn parse(spec: &Document) -> Result<SortSpec, MqlError> {
        let mut keys = Vec::with_capacity(spec.len());
        for (field, value) in spec {
            if let Bson::Document(d) = value {
                if d.keys().next().map(String::as_str) == Some("$meta") {
                    return Err(MqlError::not_implemented(format!(
                        "the front does not sort by {{$meta: ...}} ({}): it has no text or \
                         search scores; sort by field paths with 1 or -1",
                        element(field, value)
                    )));
                }
                return Err(MqlError::location(
                    17312,
                    "$meta is the only expression supported by $sort right now",
                ));
            }
            let direction = match value {
                Bson::Int32(i) => f64::from(*i),
                Bson::Int64(i) => *i as f64,
                Bson::Double(d) => *d,
                Bson::Decimal128(_) => decimal_direction(value),
                _ => {
                    return Err(MqlError::location(
                        15974,
                        format!(
                            "Illegal key in $sort specification: {}",
                            element(field, value)
                        ),
                    ))
                }
            };
            if direction != 1.0 && direction != -1.0 {
                return Err(MqlError::location(
                    15975,
                    "$sort key ordering must be 1 (for ascending) or -1 (for descending)",
                ));
            }
            if field == "$natural" {
                return Err(MqlError::not_implemented(
                    "the front does not sort by $natural: documents merged from several \
                     locations have no natural order; sort by field paths with 1 or -1",
                ));
            }
            path::check(field)?;
            keys.push((field.clone(), direction > 0.0));
        }
        Ok(SortSpec { keys })
    }

    /// Whether the specification sorts by nothing.
    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// The paths sorted by, in order.
    pub fn paths(&self) -> impl Iterator<Item = &str> {
        self.keys.iter().map(|(p, _)| p.as_str())
    }

    /// The paths with their directions (`true`: ascending), in order.
    pub fn keys(&self) -> &[(String, bool)] {
        &self.keys
    }

    /// The specification as a document (`{a: 1, b: -1}`), to send to the servers.
    pub fn to_document(&self) -> Document {
        self.keys
            .iter()
            .map(|(p, asc)| (p.clone(), Bson::Int32(if *asc { 1 } else { -1 })))
            .collect()
    }

    /// A document's sort key. Fails as MongoDB fails a sort whose paths go through two
    /// different arrays of the document.
    pub fn key(&self, doc: &Document) -> Result<SortKey, MqlError> {
        let paths: Vec<Vec<&str>> = self.keys.iter().map(|(p, _)| path::parts(p)).collect();
        let mut tuples = Vec::new();
        let remaining: Vec<&[&str]> = paths.iter().map(Vec::as_slice).collect();
        generate(
            Container::Document(doc),
            remaining,
            vec![Bson::Null; paths.len()],
            vec![None; paths.len()],
            &mut tuples,
        )?;
        let best = tuples
            .into_iter()
            .min_by(|a, b| self.compare_tuples(a, b))
            .expect("a document has at least one key");
        Ok(SortKey(best))
    }

    /// Two sort keys in the specification's order.
    pub fn compare_keys(&self, a: &SortKey, b: &SortKey) -> Ordering {
        self.compare_tuples(&a.0, &b.0)
    }

    /// Two documents in the specification's order (`Equal` for ties). A document MongoDB
    /// could not sort (parallel arrays: the servers refuse such a sort, so merged results do
    /// not hold one) is compared by each path's values separately.
    pub fn compare(&self, a: &Document, b: &Document) -> Ordering {
        let key = |d: &Document| {
            self.key(d).unwrap_or_else(|_| {
                SortKey(
                    self.keys
                        .iter()
                        .map(|(p, asc)| SortSpec::one(p, *asc).key(d).map(|k| k.0))
                        .map(|k| k.ok().and_then(|mut k| k.pop()).unwrap_or(Bson::Null))
                        .collect(),
                )
            })
        };
        self.compare_keys(&key(a), &key(b))
    }

    /// Sorts `docs` in the specification's order, stably (ties keep their order), computing
    /// each key once; fails when MongoDB would (parallel arrays), leaving `docs` as it was.
    pub fn sort(&self, docs: &mut Vec<Document>) -> Result<(), MqlError> {
        if self.is_empty() {
            return Ok(());
        }
        let mut keyed = Vec::with_capacity(docs.len());
        for doc in docs.drain(..) {
            keyed.push((self.key(&doc), doc));
        }
        if let Some(err) = keyed.iter().find_map(|(k, _)| k.as_ref().err().cloned()) {
            docs.extend(keyed.into_iter().map(|(_, d)| d));
            return Err(err);
        }
        let mut keyed: Vec<(SortKey, Document)> = keyed
            .into_iter()
            .map(|(k, d)| (k.expect("checked above"), d))
            .collect();
        keyed.sort_by(|(a, _), (b, _)| self.compare_keys(a, b));
        docs.extend(keyed.into_iter().map(|(_, d)| d));
        Ok(())
    }

    fn one(path: &str, ascending: bool) -> SortSpec {
        SortSpec {
            keys: vec![(path.to_owned(), ascending)],
        }
    }

    fn compare_tuples(&self, a: &[Bson], b: &[Bson]) -> Ordering {
        for ((x, y), (_, ascending)) in a.iter().zip(b).zip(&self.keys) {
            let order = order::compare(x, y);
            let order = if *ascending { order } else { order.reverse() };
            if order != Ordering::Equal {
                return order;
            }
        }
        Ordering::Equal
    }
}

/// A Decimal128 direction: 1 or -1 exactly, else anything else (refused by the caller).
fn decimal_direction(value: &Bson) -> f64 {
    for d in [1.0, -1.0] {
        if order::equal(value, &Bson::Double(d)) {
            return d;
        }
    }
    0.0
}

/// Where a path is looked up: a document, an array read as the document of its elements
/// (`"0"`, `"1"`, ...), or nothing (an array element that is not a document).
#[derive(Clone, Copy)]
enum Container<'a> {
    Document(&'a Document),
    Array(&'a [Bson]),
    Nothing,
}

impl<'a> Container<'a> {
    fn field(self, name: &str) -> Option<&'a Bson> {
        match self {
            Container::Document(d) => d.get(name),
            Container::Array(a) => element_index(name).and_then(|i| a.get(i)),
            Container::Nothing => None,
        }
    }
}

/// An array element a numeric component selects, found at the array's level and used by the
/// next level down (MongoDB's `PositionalPathInfo`).
#[derive(Clone, Copy)]
struct Positional<'a, 'p> {
    value: Option<&'a Bson>,
    rest: &'p [&'p str],
    indexed_is_array: bool,
}

/// The value at `parts` or the first array along them, and the components after it.
fn along<'a, 'p>(
    container: Container<'a>,
    parts: &'p [&'p str],
) -> (Option<&'a Bson>, &'p [&'p str]) {
    let rest = &parts[1..];
    match container.field(parts[0]) {
        None => (None, rest),
        Some(v @ Bson::Array(_)) => (Some(v), rest),
        Some(v) if rest.is_empty() => (Some(v), rest),
        Some(Bson::Document(d)) => along(Container::Document(d), rest),
        Some(_) => (None, rest),
    }
}

/// Every key tuple of a document, as MongoDB's index key generator makes them: one array is
/// expanded per level (the paths through it take their values from the same element), a
/// missing value is null, an empty array at a path's end is undefined.
fn generate<'a, 'p>(
    container: Container<'a>,
    mut remaining: Vec<&'p [&'p str]>,
    mut fixed: Vec<Bson>,
    positional: Vec<Option<Positional<'a, 'p>>>,
    out: &mut Vec<Vec<Bson>>,
) -> Result<(), MqlError> {
    let mut array: Option<&'a Vec<Bson>> = None;
    let mut through_array = Vec::new();
    let mut expand_elements = true;
    for i in 0..remaining.len() {
        if remaining[i].is_empty() {
            continue;
        }
        let own_field = container.field(remaining[i][0]).is_some();
        let (found, rest, nested) = match (own_field, positional[i]) {
            (true, Some(_)) => {
                return Err(MqlError::location(
                    16746,
                    format!(
                        "Ambiguous field name found in array (do not use numeric field names \
                         in embedded elements in an array), field: '{}'",
                        remaining[i][0]
                    ),
                ))
            }
            (true, None) => {
                let (found, rest) = along(container, remaining[i]);
                (found, rest, false)
            }
            (false, Some(p)) => (p.value, p.rest, p.indexed_is_array),
            (false, None) => (None, &[][..], false),
        };
        remaining[i] = rest;
        match found {
            None => {
                fixed[i] = Bson::Null;
                remaining[i] = &[];
            }
            Some(Bson::Array(a)) => {
                through_array.push(i);
                match array {
                    None => array = Some(a),
                    Some(seen) if !std::ptr::eq(seen, a) => {
                        return Err(MqlError::bad_value(
                            "cannot sort with keys that are parallel arrays",
                        ))
                    }
                    Some(_) => {}
                }
                if nested {
                    expand_elements = false;
                }
            }
            Some(v) => {
                fixed[i] = v.clone();
                remaining[i] = &[];
            }
        }
    }
    let Some(array) = array else {
        out.push(fixed);
        return Ok(());
    };
    if array.is_empty() {
        for &i in &through_array {
            if remaining[i].is_empty() {
                fixed[i] = Bson::Undefined;
            }
        }
        let none = vec![None; remaining.len()];
        return generate(Container::Nothing, remaining, fixed, none, out);
    }
    let mut below: Vec<Option<Positional>> = vec![None; remaining.len()];
    for &i in &through_array {
        if remaining[i].is_empty() {
            continue;
        }
        if let Some(indexed) = element_index(remaining[i][0]).and_then(|k| array.get(k)) {
            let (value, rest) = along(Container::Array(array), remaining[i]);
            below[i] = Some(Positional {
                value,
                rest,
                indexed_is_array: matches!(indexed, Bson::Array(_)),
            });
        }
    }
    for value in array {
        let mut fixed = fixed.clone();
        for &i in &through_array {
            if remaining[i].is_empty() {
                fixed[i] = if expand_elements {
                    value.clone()
                } else {
                    Bson::Array(array.clone())
                };
            }
        }
        let container = match value {
            Bson::Document(d) => Container::Document(d),
            _ => Container::Nothing,
        };
        generate(container, remaining.clone(), fixed, below.clone(), out)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests;

//! Dotted field paths (`"a.b.0.c"`) as MongoDB reads them in each of its contexts, for the
//! other modules of [`super`]:
//!
//! - [`check`]: the rules of MongoDB's `FieldPath` (sort keys, projections, `$group`): no empty
//!   path, no empty component, no component that starts with `$`;
//! - [`get`]: the one value at a path, numeric components indexing arrays and nothing expanded
//!   (the lookup of updates and `$push`'s `$sort`);
//! - [`expression_value`]: an aggregation field path (`"$a.b"`), which maps over arrays and
//!   collects what each element has, numeric components being field names;
//! - [`set`]: a value put at a path, creating intermediate documents (and, at a numeric
//!   component of an array, the element, padding with nulls), as an upsert seeds its document;
//! - [`is_prefix`] and [`overlap`]: how two paths relate, component by component.
//!
//! The sort keys a path gives, with their rules for arrays, are [`super::sort`]'s.

use bson::{Bson, Document};

use super::text::element;
use super::MqlError;

/// The components of a path.
pub fn parts(path: &str) -> Vec<&str> {
    path.split('.').collect()
}

/// A path checked as MongoDB's `FieldPath` checks it.
pub fn check(path: &str) -> Result<Vec<&str>, MqlError> {
    if path.is_empty() {
        return Err(MqlError::location(
            40352,
            "FieldPath cannot be constructed with empty string",
        ));
    }
    let parts = parts(path);
    for part in &parts {
        if part.is_empty() {
            return Err(MqlError::location(
                15998,
                "FieldPath field names may not be empty strings.",
            ));
        }
        if part.starts_with('$') {
            return Err(MqlError::location(
                16410,
                "FieldPath field names may not start with '$'. Consider using $getField or \
                 $setField.",
            ));
        }
    }
    Ok(parts)
}

/// A component as an array index, as updates read one: decimal digits only (`"01"` is 1).
pub fn array_index(part: &str) -> Option<usize> {
    if part.is_empty() || !part.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    part.parse().ok()
}

/// A component as the name of an array element: the canonical decimal form only (`"1"`, not
/// `"01"`), since an array's elements are named `"0"`, `"1"`, ... in BSON.
pub fn element_index(part: &str) -> Option<usize> {
    let index = array_index(part)?;
    (index.to_string() == part).then_some(index)
}

/// The value at `path` in `doc`, without expanding arrays: at an array, a numeric component is
/// an index and any other reaches nothing.
pub fn get<'a>(doc: &'a Document, path: &str) -> Option<&'a Bson> {
    let mut parts = path.split('.');
    let mut current = doc.get(parts.next()?)?;
    for part in parts {
        current = step(current, part)?;
    }
    Some(current)
}

/// One component further into a value.
pub fn step<'a>(value: &'a Bson, part: &str) -> Option<&'a Bson> {
    match value {
        Bson::Document(d) => d.get(part),
        Bson::Array(a) => a.get(array_index(part)?),
        _ => None,
    }
}

/// The value of the aggregation field path `path` (written `"$path"`) in `doc`: a document is
/// entered; an array gives the array of what each of its elements gives (documents entered,
/// nested arrays mapped likewise, other elements and missing values left out); numeric
/// components are field names. `None` when the path reaches nothing (the value is "missing").
pub fn expression_value(doc: &Document, path: &str) -> Option<Bson> {
    let parts = parts(path);
    in_document(doc, &parts)
}

fn in_document(doc: &Document, parts: &[&str]) -> Option<Bson> {
    let value = doc.get(parts[0])?;
    if parts.len() == 1 {
        return Some(value.clone());
    }
    match value {
        Bson::Document(d) => in_document(d, &parts[1..]),
        Bson::Array(a) => Some(in_array(a, &parts[1..])),
        _ => None,
    }
}

fn in_array(array: &[Bson], parts: &[&str]) -> Bson {
    Bson::Array(
        array
            .iter()
            .filter_map(|element| match element {
                Bson::Document(d) => in_document(d, parts),
                Bson::Array(a) => Some(in_array(a, parts)),
                _ => None,
            })
            .collect(),
    )
}

/// Puts `value` at `path`, creating the documents the path needs (and, at a numeric component
/// of an array, that element, padding with nulls). A path through a value that is neither a
/// document nor an array, or a non-numeric component of an array, is refused as MongoDB
/// refuses it (PathNotViable).
pub fn set(doc: &mut Document, path: &str, value: Bson) -> Result<(), MqlError> {
    let parts = parts(path);
    set_in_document(doc, &parts, value)
}

/// The most nulls MongoDB pads an array with to reach an index.
pub const MAX_PADDING: usize = 1_500_000;

fn set_in_document(doc: &mut Document, parts: &[&str], value: Bson) -> Result<(), MqlError> {
    let (head, rest) = (parts[0], &parts[1..]);
    if rest.is_empty() {
        doc.insert(head, value);
        return Ok(());
    }
    match doc.get_mut(head) {
        None => {
            doc.insert(head, Bson::Document(nested(rest, value)));
            Ok(())
        }
        Some(child) => set_in_value(head, child, rest, value),
    }
}

fn set_in_value(name: &str, child: &mut Bson, rest: &[&str], value: Bson) -> Result<(), MqlError> {
    match child {
        Bson::Document(d) => set_in_document(d, rest, value),
        Bson::Array(a) => match array_index(rest[0]) {
            Some(index) => {
                if index >= a.len() {
                    pad(a, index)?;
                    a.push(if rest.len() == 1 {
                        value
                    } else {
                        Bson::Document(nested(&rest[1..], value))
                    });
                    return Ok(());
                }
                if rest.len() == 1 {
                    a[index] = value;
                    return Ok(());
                }
                let name = rest[0].to_owned();
                set_in_value(&name, &mut a[index], &rest[1..], value)
            }
            None => Err(cannot_create(rest[0], name, child)),
        },
        _ => Err(cannot_create(rest[0], name, child)),
    }
}

/// Pads `array` with nulls up to (not including) `index`.
pub(crate) fn pad(array: &mut Vec<Bson>, index: usize) -> Result<(), MqlError> {
    if index - array.len() > MAX_PADDING {
        return Err(MqlError::location(
            // CannotBackfillArray
            10,
            format!("can't backfill more than {MAX_PADDING} elements"),
        ));
    }
    array.resize(index, Bson::Null);
    Ok(())
}

/// `{rest: value}` as nested documents.
pub(crate) fn nested(rest: &[&str], value: Bson) -> Document {
    let mut inner = value;
    for part in rest.iter().skip(1).rev() {
        let mut d = Document::new();
        d.insert(*part, inner);
        inner = Bson::Document(d);
    }
    let mut d = Document::new();
    d.insert(rest[0], inner);
    d
}

/// MongoDB's refusal to create `part` under the element `name: value`.
pub(crate) fn cannot_create(part: &str, name: &str, value: &Bson) -> MqlError {
    MqlError::path_not_viable(format!(
        "Cannot create field '{part}' in element {{{}}}",
        element(name, value)
    ))
}

/// Whether `prefix` is a strict prefix of `path`, component by component (`"a"` of `"a.b"`,
/// not of `"ab"`).
pub fn is_prefix(prefix: &str, path: &str) -> bool {
    path.len() > prefix.len() && path.starts_with(prefix) && path.as_bytes()[prefix.len()] == b'.'
}

/// Whether two paths are equal or one is a prefix of the other: writing one changes the other.
pub fn overlap(a: &str, b: &str) -> bool {
    a == b || is_prefix(a, b) || is_prefix(b, a)
}

#[cfg(test)]
mod tests {
    use super::*;
    use bson::doc;

    #[test]
    fn field_paths_are_checked_as_mongodb_checks_them() {
        assert_eq!(check("a.b").unwrap(), ["a", "b"]);
        assert_eq!(check("").unwrap_err().code, 40352);
        assert_eq!(check("a..b").unwrap_err().code, 15998);
        assert_eq!(check("a.").unwrap_err().code, 15998);
        assert_eq!(check("a.$b").unwrap_err().code, 16410);
    }

    #[test]
    fn get_indexes_arrays_and_expands_nothing() {
        let d = doc! { "a": [{ "b": 1 }, { "b": 2 }], "c": { "d": 3 } };
        assert_eq!(get(&d, "a.1.b"), Some(&Bson::Int32(2)));
        assert_eq!(get(&d, "a.01.b"), Some(&Bson::Int32(2)));
        assert_eq!(get(&d, "a.b"), None);
        assert_eq!(get(&d, "c.d"), Some(&Bson::Int32(3)));
        assert_eq!(get(&d, "c.d.e"), None);
        assert_eq!(element_index("01"), None);
        assert_eq!(element_index("10"), Some(10));
    }

    #[test]
    fn expression_paths_map_over_arrays() {
        // The aggregation manual, "Field Paths": "$a.b" on an array of documents is the array
        // of their b values; elements without b (and scalars) are left out.
        let d = doc! { "a": [{ "b": 1 }, 5, { "c": 2 }, [{ "b": 3 }], { "b": [4] }] };
        assert_eq!(
            expression_value(&d, "a.b"),
            Some(Bson::Array(vec![
                Bson::Int32(1),
                Bson::Array(vec![Bson::Int32(3)]),
                Bson::Array(vec![Bson::Int32(4)]),
            ]))
        );
        assert_eq!(expression_value(&d, "x"), None);
        assert_eq!(expression_value(&doc! { "a": 1 }, "a.b"), None);
        // Numeric components are field names, not indexes.
        assert_eq!(
            expression_value(&doc! { "a": [{ "0": 7 }, 8] }, "a.0"),
            Some(Bson::Array(vec![Bson::Int32(7)]))
        );
    }

    #[test]
    fn set_creates_documents_and_pads_arrays() {
        let mut d = doc! { "a": { "x": 1 }, "l": [0] };
        set(&mut d, "a.b.c", Bson::Int32(2)).unwrap();
        set(&mut d, "l.2", Bson::Int32(9)).unwrap();
        set(&mut d, "l.4.z", Bson::Int32(5)).unwrap();
        set(&mut d, "n", Bson::Int32(3)).unwrap();
        assert_eq!(
            d,
            doc! {
                "a": { "x": 1, "b": { "c": 2 } },
                "l": [0, null, 9, null, { "z": 5 }],
                "n": 3,
            }
        );
        let err = set(&mut doc! { "a": 5 }, "a.b", Bson::Null).unwrap_err();
        assert_eq!(
            (err.code, err.message.as_str()),
            (28, "Cannot create field 'b' in element {a: 5}")
        );
        assert_eq!(
            set(&mut doc! { "a": [1] }, "a.b", Bson::Null)
                .unwrap_err()
                .code,
            28
        );
    }

    #[test]
    fn paths_relate_component_by_component() {
        assert!(is_prefix("a", "a.b"));
        assert!(!is_prefix("a", "ab"));
        assert!(!is_prefix("a.b", "a.b"));
        assert!(overlap("a.b", "a"));
        assert!(overlap("a", "a"));
        assert!(!overlap("a.b", "a.c"));
    }
}

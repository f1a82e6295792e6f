//! What the front reads from a query filter before any I/O: the values a filter pins a field
//! to ([`pinned`]), so that a read or a write goes only to the locations that can hold them.
//!
//! Matching is the servers': this module never decides that a document does not match. It
//! finds the equality conditions on one field that every matching document must meet, and is
//! conservative everywhere else (no pin is always a correct answer). One shortcut
//! ([`surely_matches`]) says a document certainly matches a filter of plain equalities, which
//! spares the router the server's judgement in the common case; "not surely" is left to it.

use bson::{Bson, Document};

use super::order;
use super::MqlError;

/// Whether `doc` certainly matches `filter`, judged on the document alone: `true` only when
/// every condition of the filter is a top-level field equal to a plain value (not a document,
/// an array, a regular expression, null or undefined, and no operator or dotted path) and the
/// document's field is bytewise that value by MongoDB's equality, or an array holding it.
/// Such a match holds under any collation (a collation only makes more strings equal).
/// `false` means "ask the server": the filter has another form, a collation could make it
/// match, or it does not.
pub fn surely_matches(doc: &Document, filter: &Document) -> bool {
    filter.iter().all(|(key, wanted)| {
        if key.starts_with('$') || key.contains('.') {
            return false;
        }
        if matches!(
            wanted,
            Bson::Document(_)
                | Bson::Array(_)
                | Bson::RegularExpression(_)
                | Bson::Null
                | Bson::Undefined
                | Bson::JavaScriptCode(_)
                | Bson::JavaScriptCodeWithScope(_)
        ) {
            return false;
        }
        let same = |v: &Bson| same_value(v, wanted);
        match doc.get(key) {
            Some(Bson::Array(items)) => items.iter().any(same),
            Some(value) => same(value),
            None => false,
        }
    })
}

/// MongoDB's equality, with strings compared bytewise (what every collation agrees is equal).
fn same_value(value: &Bson, wanted: &Bson) -> bool {
    match (value, wanted) {
        (Bson::String(a), Bson::String(b)) => a == b,
        (Bson::String(_), _) | (_, Bson::String(_)) => false,
        (a, b) => order::equal(a, b),
    }
}

/// The values of `field` a filter pins it to: `{f: v}`, `{f: {$eq: v}}`, `{f: {$in: [...]}}`,
/// also inside a top-level `$and` (the intersection when several conditions pin it), and an
/// `$or` every branch of which pins it (the union of the branches). `None` when the filter does
/// not pin the field to a finite set (`$gt`, `$ne`, `$nor`, an `$or` with a branch that does
/// not pin it, no condition on it...). A value that is a regular expression (which matches by
/// pattern) or an operator document does not pin it; nor does a condition on a path under the
/// field (`"f.x"`).
///
/// Values are compared with MongoDB's equality (`1`, `1.0` and `NumberLong(1)` are one value,
/// the first one seen is kept). `{f: v}` also matches a document whose `f` is an array that
/// holds `v`: the intersection is exact for fields that never hold arrays (a routing key).
/// `Some([])`: the filter matches no document (`{f: 1, $and: [{f: 2}]}`, `{f: {$in: []}}`).
/// Errors: the malformed `$and`, `$or` and `$in` MongoDB refuses, in its words.
pub fn pinned(filter: &Document, field: &str) -> Result<Option<Vec<Bson>>, MqlError> {
    let mut pin = None;
    for (key, value) in filter {
        let found = match key.as_str() {
            "$and" => {
                let mut all = None;
                for clause in clauses("$and", value)? {
                    all = intersect(all, pinned(clause, field)?);
                }
                all
            }
            "$or" => {
                let mut any = Some(Vec::new());
                for clause in clauses("$or", value)? {
                    any = match (any, pinned(clause, field)?) {
                        (Some(mut values), Some(more)) => {
                            for v in more {
                                push_distinct(&mut values, v);
                            }
                            Some(values)
                        }
                        _ => None,
                    };
                }
                any
            }
            k if k == field => condition(value)?,
            _ => None,
        };
        pin = intersect(pin, found);
    }
    Ok(pin)
}

/// The clauses of an `$and` or `$or`, checked as MongoDB checks them.
pub(super) fn clauses<'a>(name: &str, value: &'a Bson) -> Result<Vec<&'a Document>, MqlError> {
    let Bson::Array(items) = value else {
        return Err(MqlError::bad_value(format!("{name} must be an array")));
    };
    if items.is_empty() {
        return Err(MqlError::bad_value(
            "$and/$or/$nor must be a nonempty array",
        ));
    }
    items
        .iter()
        .map(|item| match item {
            Bson::Document(d) => Ok(d),
            _ => Err(MqlError::bad_value(
                "$and/$or/$nor entries need to be full objects",
            )),
        })
        .collect()
}

/// The values one condition on the field pins it to.
fn condition(value: &Bson) -> Result<Option<Vec<Bson>>, MqlError> {
    match value {
        Bson::RegularExpression(_) => Ok(None),
        Bson::Document(ops) if ops.keys().next().is_some_and(|k| k.starts_with('$')) => {
            let mut pin = None;
            for (op, operand) in ops {
                let found = match op.as_str() {
                    "$eq" => literal(operand).then(|| vec![operand.clone()]),
                    "$in" => {
                        let Bson::Array(values) = operand else {
                            return Err(MqlError::bad_value("$in needs an array"));
                        };
                        let mut out = Vec::new();
                        let mut finite = true;
                        for v in values {
                            if is_operator_document(v) {
                                return Err(MqlError::bad_value("cannot nest $ under $in"));
                            }
                            finite &= !matches!(v, Bson::RegularExpression(_));
                            push_distinct(&mut out, v.clone());
                        }
                        finite.then_some(out)
                    }
                    o if !o.starts_with('$') => {
                        return Err(MqlError::bad_value(format!("unknown operator: {o}")))
                    }
                    _ => None,
                };
                pin = intersect(pin, found);
            }
            Ok(pin)
        }
        other => Ok(Some(vec![other.clone()])),
    }
}

/// Whether a value stands for itself in an equality (not a pattern, not operators).
fn literal(value: &Bson) -> bool {
    !matches!(value, Bson::RegularExpression(_)) && !is_operator_document(value)
}

fn is_operator_document(value: &Bson) -> bool {
    matches!(value, Bson::Document(d) if d.keys().next().is_some_and(|k| k.starts_with('$')))
}

fn push_distinct(values: &mut Vec<Bson>, v: Bson) {
    if !values.iter().any(|seen| order::equal(seen, &v)) {
        values.push(v);
    }
}

/// Both constraints: `None` is no constraint.
fn intersect(a: Option<Vec<Bson>>, b: Option<Vec<Bson>>) -> Option<Vec<Bson>> {
    match (a, b) {
        (None, b) => b,
        (a, None) => a,
        (Some(a), Some(b)) => Some(
            a.into_iter()
                .filter(|v| b.iter().any(|w| order::equal(v, w)))
                .collect(),
        ),
    }
}

#[cfg(test)]
mod tests {

    #[test]
    fn a_filter_of_plain_equalities_surely_matches_a_document_that_holds_them() {
        let d = doc! {"_id": 7, "customerId": "c-1", "n": 2.0, "tags": ["a", "b"]};
        assert!(surely_matches(&d, &doc! {}));
        assert!(surely_matches(&d, &doc! {"customerId": "c-1", "_id": 7}));
        // Numbers by value, arrays by what they hold.
        assert!(surely_matches(&d, &doc! {"_id": 7.0, "n": 2_i64}));
        assert!(surely_matches(&d, &doc! {"tags": "b"}));
        // Not equal, or another form: the server judges.
        assert!(!surely_matches(&d, &doc! {"customerId": "c-2"}));
        assert!(
            !surely_matches(&d, &doc! {"customerId": "C-1"}),
            "a collation may say yes"
        );
        assert!(!surely_matches(&d, &doc! {"n": "2"}));
        assert!(!surely_matches(&d, &doc! {"missing": 1}));
        assert!(!surely_matches(&d, &doc! {"n": {"$gt": 1}}));
        assert!(!surely_matches(&d, &doc! {"$or": [{"n": 2}]}));
        assert!(!surely_matches(&d, &doc! {"tags.0": "a"}));
        assert!(!surely_matches(&d, &doc! {"tags": ["a", "b"]}));
        assert!(!surely_matches(&d, &doc! {"missing": null}));
    }

    use super::*;
    use bson::{doc, Regex};

    fn pin(filter: Document) -> Option<Vec<Bson>> {
        pinned(&filter, "t").unwrap()
    }

    #[test]
    fn equalities_and_in_pin_the_field() {
        assert_eq!(pin(doc! { "t": 5, "x": 1 }), Some(vec![Bson::Int32(5)]));
        assert_eq!(
            pin(doc! { "t": { "$eq": "a" } }),
            Some(vec![Bson::String("a".into())])
        );
        assert_eq!(
            pin(doc! { "t": { "$in": [1, 2, 1.0] } }),
            Some(vec![Bson::Int32(1), Bson::Int32(2)])
        );
        assert_eq!(
            pin(doc! { "t": { "a": 1 } }),
            Some(vec![Bson::Document(doc! { "a": 1 })])
        );
        assert_eq!(pin(doc! { "t": null }), Some(vec![Bson::Null]));
        // Other conditions beside an equality narrow nothing further here.
        assert_eq!(
            pin(doc! { "t": { "$eq": 3, "$gt": 0 } }),
            Some(vec![Bson::Int32(3)])
        );
        assert_eq!(
            pin(doc! { "t": { "$in": [1, 2, 3], "$eq": 2 } }),
            Some(vec![Bson::Int32(2)])
        );
    }

    #[test]
    fn and_intersects_and_or_unites() {
        assert_eq!(
            pin(
                doc! { "t": { "$in": [1, 2, 3] }, "$and": [{ "t": { "$in": [2, 3, 4] } }, { "t": { "$ne": 9 } }] }
            ),
            Some(vec![Bson::Int32(2), Bson::Int32(3)])
        );
        assert_eq!(pin(doc! { "t": 1, "$and": [{ "t": 2 }] }), Some(vec![]));
        assert_eq!(pin(doc! { "t": { "$in": [] } }), Some(vec![]));
        assert_eq!(
            pin(doc! { "$or": [{ "t": 1 }, { "t": { "$in": [2, 1] } }] }),
            Some(vec![Bson::Int32(1), Bson::Int32(2)])
        );
        assert_eq!(pin(doc! { "$or": [{ "t": 1 }, { "x": 2 }] }), None);
        assert_eq!(
            pin(doc! { "t": { "$in": [1, 2] }, "$or": [{ "t": 2 }, { "t": 3 }] }),
            Some(vec![Bson::Int32(2)])
        );
        assert_eq!(
            pin(doc! { "$and": [{ "$and": [{ "t": 7 }] }] }),
            Some(vec![Bson::Int32(7)])
        );
    }

    #[test]
    fn conditions_that_admit_infinitely_many_values_pin_nothing() {
        let re = Bson::RegularExpression(Regex {
            pattern: "^a".into(),
            options: String::new(),
        });
        for filter in [
            doc! {},
            doc! { "x": 1 },
            doc! { "t": { "$gt": 1 } },
            doc! { "t": { "$ne": 1 } },
            doc! { "t": re.clone() },
            doc! { "t": { "$in": [1, re.clone()] } },
            doc! { "t": { "$eq": re } },
            doc! { "t.x": 1 },
            doc! { "$nor": [{ "t": 1 }] },
            doc! { "t": { "$not": { "$eq": 1 } } },
        ] {
            assert_eq!(pin(filter.clone()), None, "{filter}");
        }
    }

    #[test]
    fn malformed_logical_operators_are_refused_in_mongodbs_words() {
        let e = |f: Document| pinned(&f, "t").unwrap_err();
        assert_eq!(e(doc! { "$and": 1 }).message, "$and must be an array");
        assert_eq!(
            e(doc! { "$or": [] }).message,
            "$and/$or/$nor must be a nonempty array"
        );
        assert_eq!(
            e(doc! { "$and": [1] }).message,
            "$and/$or/$nor entries need to be full objects"
        );
        assert_eq!(e(doc! { "t": { "$in": 1 } }).message, "$in needs an array");
        assert_eq!(
            e(doc! { "t": { "$in": [{ "$gt": 1 }] } }).message,
            "cannot nest $ under $in"
        );
        assert_eq!(
            e(doc! { "t": { "$eq": 1, "a": 1 } }).message,
            "unknown operator: a"
        );
        assert_eq!(e(doc! { "$and": 1 }).code, 2);
    }
}

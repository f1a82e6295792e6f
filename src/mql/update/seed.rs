//! The fields an upsert's new document starts with, taken from the equality conditions of its
//! filter as MongoDB takes them (`extractEqualityMatches` over the canonical query).

use bson::{Bson, Document};

use crate::mql::filter::clauses;
use crate::mql::path;
use crate::mql::MqlError;

/// The document an upsert with update operators starts from: each equality condition of the
/// filter (`{a: 1}`, `{a: {$eq: 1}}`, a single-value `{a: {$in: [1]}}`, each value of an
/// `{a: {$all: [...]}}`, inside `$and` at any depth and inside an `$or` of one clause, as
/// MongoDB's canonical query has them) set at its path, dotted paths becoming nested documents
/// (`{"a.b": 1}` gives `{a: {b: 1}}`), `_id` included. Two conditions on one path, or on a path
/// and a path under it, are refused (NotSingleValueField, 54), even with equal values.
/// Ranges, regular expressions, `$ne`, `$or`s of several clauses and the like contribute
/// nothing; `$expr` is refused, as MongoDB refuses it in an upsert (QueryFeatureNotAllowed).
///
/// The fields come in the order of their paths (MongoDB 7.0 collects them in a hash map, so
/// its order is unspecified); [`super::upsert_document`] then puts `_id` first.
pub fn seed_from_filter(filter: &Document) -> Result<Document, MqlError> {
    let mut equalities: Vec<(String, Bson)> = Vec::new();
    collect(filter, &mut equalities)?;
    equalities.sort_by(|a, b| a.0.cmp(&b.0));
    let mut doc = Document::new();
    for (p, value) in equalities {
        path::set(&mut doc, &p, value)?;
    }
    Ok(doc)
}

/// The `_id` a replacement upsert keeps from its filter: only an equality on the whole `_id`
/// (a condition on a path under it is refused, NotExactValueField, as MongoDB refuses it).
pub(super) fn id_from_filter(filter: &Document) -> Result<Document, MqlError> {
    let mut equalities = Vec::new();
    collect(filter, &mut equalities)?;
    let mut doc = Document::new();
    for (p, value) in equalities {
        if p == "_id" {
            doc.insert("_id", value);
        } else if path::is_prefix("_id", &p) {
            return Err(MqlError::not_exact_value_field(format!(
                "field at '_id' must be exactly specified, field at sub-path '{p}'found"
            )));
        }
    }
    Ok(doc)
}

fn collect(filter: &Document, out: &mut Vec<(String, Bson)>) -> Result<(), MqlError> {
    for (key, value) in filter {
        match key.as_str() {
            "$and" => {
                for clause in clauses("$and", value)? {
                    collect(clause, out)?;
                }
            }
            "$or" => {
                let clauses = clauses("$or", value)?;
                if let [only] = clauses.as_slice() {
                    collect(only, out)?;
                }
                for clause in clauses {
                    refuse_expr(clause)?;
                }
            }
            "$nor" => {
                for clause in clauses("$nor", value)? {
                    refuse_expr(clause)?;
                }
            }
            "$expr" => return Err(expr_refused()),
            k if k.starts_with('$') => {}
            field => {
                for v in equalities(value) {
                    add(out, field, v)?;
                }
            }
        }
    }
    Ok(())
}

/// MongoDB refuses `$expr` anywhere in an upsert's filter (DOCS-14158).
fn refuse_expr(filter: &Document) -> Result<(), MqlError> {
    for (key, value) in filter {
        match key.as_str() {
            "$expr" => return Err(expr_refused()),
            "$and" | "$or" | "$nor" => {
                for clause in clauses(key, value)? {
                    refuse_expr(clause)?;
                }
            }
            _ => {}
        }
    }
    Ok(())
}

fn expr_refused() -> MqlError {
    MqlError::query_feature_not_allowed("$expr is not allowed in the query predicate for an upsert")
}

/// The values a condition on one path is an equality with.
fn equalities(value: &Bson) -> Vec<Bson> {
    let operator = |v: &Bson| matches!(v, Bson::Document(d) if d.keys().next().is_some_and(|k| k.starts_with('$')));
    match value {
        Bson::RegularExpression(_) => vec![],
        Bson::Document(ops) if operator(value) => {
            let mut out = Vec::new();
            for (op, operand) in ops {
                match (op.as_str(), operand) {
                    ("$eq", v) => out.push(v.clone()),
                    ("$in", Bson::Array(values)) => {
                        if let [only] = values.as_slice() {
                            if !matches!(only, Bson::RegularExpression(_)) && !operator(only) {
                                out.push(only.clone());
                            }
                        }
                    }
                    ("$all", Bson::Array(values)) => out.extend(
                        values
                            .iter()
                            .filter(|v| !matches!(v, Bson::RegularExpression(_)) && !operator(v))
                            .cloned(),
                    ),
                    _ => {}
                }
            }
            out
        }
        other => vec![other.clone()],
    }
}

fn add(out: &mut Vec<(String, Bson)>, p: &str, value: Bson) -> Result<(), MqlError> {
    for (seen, _) in out.iter() {
        let message = if seen == p {
            format!("cannot infer query fields to set, path '{p}' is matched twice")
        } else if path::is_prefix(seen, p) {
            format!("cannot infer query fields to set, both paths '{p}' and '{seen}' are matched")
        } else if path::is_prefix(p, seen) {
            format!("cannot infer query fields to set, both paths '{seen}' and '{p}' are matched")
        } else {
            continue;
        };
        return Err(MqlError::not_single_value_field(message));
    }
    out.push((p.to_owned(), value));
    Ok(())
}

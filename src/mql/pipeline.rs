//! The aggregation stages the front runs itself, on one tenant's documents merged from every
//! location that holds them: `$sort`, `$skip`, `$limit`, `$project`, `$unset`, `$count` and
//! `$group` (with `_id` null, a constant, `"$path"` or a document or array of those, and the
//! accumulators `$sum`, `$avg`, `$min`, `$max`, `$first`, `$last`, `$push`, `$addToSet` and
//! `$count`). A leading `$match` is the servers' ([`split_leading_match`]); anything else is
//! refused at [`Stages::parse`], before any I/O, naming the stage and what is supported.
//!
//! As MongoDB: `$sum` widens `int` to `long` on overflow and to `double` ([`super::number::Sum`])
//! and ignores non-numbers; `$avg` of no number is null; `$min`/`$max` skip null and missing
//! and compare in [`super::order`]; `$push`/`$addToSet` skip missing values; an accumulator
//! with nothing to say (a `$first` of a missing field, a `$min` of nothing) gives null;
//! documents group together when their keys are equal in MongoDB's sense (`1` and `1.0`), the
//! group keeping the first key seen; `$count` of no document is no document. MongoDB promises
//! no order of groups: here they come in the order their first document came, and
//! `$addToSet` keeps first-seen order.

use std::collections::HashMap;

use bson::{Bson, Document};

use super::number::Sum;
use super::projection::Projection;
use super::sort::SortSpec;
use super::{order, path, MqlError};

/// Parsed stages, in order.
#[derive(Clone, Debug, PartialEq)]
pub struct Stages {
    stages: Vec<Stage>,
}

#[derive(Clone, Debug, PartialEq)]
enum Stage {
    Sort(SortSpec),
    Skip(u64),
    Limit(u64),
    Project(Projection),
    Count(String),
    Group(Group),
}

#[derive(Clone, Debug, PartialEq)]
struct Group {
    id: Expr,
    fields: Vec<(String, Accumulator, Expr)>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Accumulator {
    Sum,
    Avg,
    Min,
    Max,
    First,
    Last,
    Push,
    AddToSet,
    Count,
}

/// The expressions `$group` evaluates: a constant, a field path, the whole document, or a
/// document or array of those.
#[derive(Clone, Debug, PartialEq)]
enum Expr {
    Constant(Bson),
    Path(String),
    Root,
    Document(Vec<(String, Expr)>),
    Array(Vec<Expr>),
}

const SUPPORTED: &str = "$sort, $skip, $limit, $project, $unset, $count and $group (and $match \
                         as the first stage)";

/// Every stage name of MongoDB 7.0: the ones the front does not run are refused as such, any
/// other name as MongoDB refuses an unknown stage.
const KNOWN_STAGES: &[&str] = &[
    "$addFields",
    "$bucket",
    "$bucketAuto",
    "$changeStream",
    "$changeStreamSplitLargeEvent",
    "$collStats",
    "$count",
    "$currentOp",
    "$densify",
    "$documents",
    "$facet",
    "$fill",
    "$geoNear",
    "$graphLookup",
    "$group",
    "$indexStats",
    "$limit",
    "$listLocalSessions",
    "$listSampledQueries",
    "$listSearchIndexes",
    "$listSessions",
    "$lookup",
    "$match",
    "$merge",
    "$out",
    "$planCacheStats",
    "$project",
    "$redact",
    "$replaceRoot",
    "$replaceWith",
    "$sample",
    "$search",
    "$searchMeta",
    "$set",
    "$setWindowFields",
    "$shardedDataDistribution",
    "$skip",
    "$sort",
    "$sortByCount",
    "$unionWith",
    "$unset",
    "$unwind",
    "$vectorSearch",
];

/// A pipeline's leading `$match` filter, which the caller sends to the servers, and the stages
/// after it.
pub fn split_leading_match(stages: &[Bson]) -> (Option<&Document>, &[Bson]) {
    match stages.first() {
        Some(Bson::Document(d)) if d.len() == 1 => match d.get("$match") {
            Some(Bson::Document(filter)) => (Some(filter), &stages[1..]),
            _ => (None, stages),
        },
        _ => (None, stages),
    }
}

impl Stages {
    /// Checks the stages, every one before any I/O (see the module's documentation).
    pub fn parse(stages: &[Bson]) -> Result<Stages, MqlError> {
        let mut parsed = Vec::with_capacity(stages.len());
        for stage in stages {
            let Bson::Document(d) = stage else {
                return Err(MqlError::type_mismatch(
                    "Each element of the 'pipeline' array must be an object",
                ));
            };
            if d.len() != 1 {
                return Err(MqlError::location(
                    40323,
                    "A pipeline stage specification object must contain exactly one field.",
                ));
            }
            let (name, spec) = d.iter().next().expect("one field");
            parsed.push(parse_stage(name, spec)?);
        }
        Ok(Stages { stages: parsed })
    }

    /// Whether there is no stage to run.
    pub fn is_empty(&self) -> bool {
        self.stages.is_empty()
    }

    /// Whether the stages end in at most one document (`$count`, or a `$group` whose `_id`
    /// reads no field), for callers that want to know the size of the result.
    pub fn single_result(&self) -> bool {
        let mut single = false;
        for stage in &self.stages {
            match stage {
                Stage::Count(_) => single = true,
                Stage::Group(g) => single = !g.id.reads_fields(),
                _ => {}
            }
        }
        single
    }

    /// Runs the stages on `docs` (merged, in the order given), as MongoDB would.
    pub fn run(&self, mut docs: Vec<Document>) -> Result<Vec<Document>, MqlError> {
        for stage in &self.stages {
            docs = match stage {
                Stage::Sort(spec) => {
                    spec.sort(&mut docs)?;
                    docs
                }
                Stage::Skip(n) => docs.into_iter().skip(clamp(*n)).collect(),
                Stage::Limit(n) => {
                    docs.truncate(clamp(*n));
                    docs
                }
                Stage::Project(p) => docs.iter().map(|d| p.apply(d)).collect(),
                Stage::Count(name) => {
                    if docs.is_empty() {
                        Vec::new()
                    } else {
                        let n = docs.len() as i64;
                        let count = i32::try_from(n).map_or(Bson::Int64(n), Bson::Int32);
                        let mut out = Document::new();
                        out.insert(name.clone(), count);
                        vec![out]
                    }
                }
                Stage::Group(g) => g.run(&docs)?,
            };
        }
        Ok(docs)
    }
}

fn clamp(n: u64) -> usize {
    usize::try_from(n).unwrap_or(usize::MAX)
}

fn parse_stage(name: &str, spec: &Bson) -> Result<Stage, MqlError> {
    match name {
        "$sort" => {
            let Bson::Document(d) = spec else {
                return Err(MqlError::location(
                    15973,
                    "the $sort key specification must be an object",
                ));
            };
            if d.is_empty() {
                return Err(MqlError::location(
                    15976,
                    "$sort stage must have at least one sort key",
                ));
            }
            Ok(Stage::Sort(SortSpec::parse(d)?))
        }
        "$skip" => Ok(Stage::Skip(non_negative("$skip", spec, 5107200)?)),
        "$limit" => {
            let n = non_negative("$limit", spec, 5107201)?;
            if n == 0 {
                return Err(MqlError::location(15958, "the limit must be positive"));
            }
            Ok(Stage::Limit(n))
        }
        "$project" => match spec {
            Bson::Document(d) => Ok(Stage::Project(Projection::parse_stage(d)?)),
            _ => Err(MqlError::location(
                15969,
                "$project specification must be an object",
            )),
        },
        "$unset" => Ok(Stage::Project(parse_unset(spec)?)),
        "$count" => Ok(Stage::Count(parse_count(spec)?)),
        "$group" => Ok(Stage::Group(Group::parse(spec)?)),
        "$match" => Err(MqlError::not_implemented(format!(
            "the front runs $match only as the pipeline's first stage, which the servers \
             evaluate; it runs {SUPPORTED}"
        ))),
        other if KNOWN_STAGES.contains(&other) => Err(MqlError::not_implemented(format!(
            "the front does not run the {other} stage on a routed collection: it runs \
             {SUPPORTED}"
        ))),
        other => Err(MqlError::location(
            40324,
            format!("Unrecognized pipeline stage name: '{other}'"),
        )),
    }
}

fn non_negative(stage: &str, spec: &Bson, code: i32) -> Result<u64, MqlError> {
    let refuse = |expected: &str| {
        MqlError::location(
            code,
            format!(
                "invalid argument to {stage} stage: {expected}: {}",
                super::text::element(stage, spec)
            ),
        )
    };
    let negative = || refuse("Expected a non-negative number in");
    match spec {
        Bson::Int32(i) => u64::try_from(*i).map_err(|_| negative()),
        Bson::Int64(i) => u64::try_from(*i).map_err(|_| negative()),
        Bson::Double(d) if d.fract() != 0.0 || d.is_nan() => Err(refuse("Expected an integer")),
        Bson::Double(d) if *d < 0.0 => Err(negative()),
        Bson::Double(d) if *d < 1.8e19 => Ok(*d as u64),
        Bson::Double(_) => Err(refuse("Cannot represent as a 64-bit integer")),
        _ => Err(refuse("Expected a number in")),
    }
}

fn parse_unset(spec: &Bson) -> Result<Projection, MqlError> {
    let paths: Vec<&str> = match spec {
        Bson::String(s) => vec![s.as_str()],
        Bson::Array(items) => {
            if items.is_empty() {
                return Err(MqlError::location(
                    31119,
                    "$unset specification must be a string or an array with at least one field",
                ));
            }
            items
                .iter()
                .map(|i| match i {
                    Bson::String(s) => Ok(s.as_str()),
                    _ => Err(MqlError::location(
                        31120,
                        "$unset specification must be a string or an array containing only \
                         string values",
                    )),
                })
                .collect::<Result<_, _>>()?
        }
        _ => {
            return Err(MqlError::location(
                31002,
                "$unset specification must be a string or an array",
            ))
        }
    };
    Projection::exclusion(paths)
}

fn parse_count(spec: &Bson) -> Result<String, MqlError> {
    let Bson::String(name) = spec else {
        return Err(MqlError::location(
            40156,
            "the count field must be a non-empty string",
        ));
    };
    if name.is_empty() {
        return Err(MqlError::location(
            40157,
            "the count field must be a non-empty string",
        ));
    }
    if name.starts_with('$') {
        return Err(MqlError::location(
            40158,
            "the count field cannot be a $-prefixed path",
        ));
    }
    if name.contains('.') {
        return Err(MqlError::location(
            40160,
            "the count field cannot contain '.'",
        ));
    }
    Ok(name.clone())
}

impl Group {
    fn parse(spec: &Bson) -> Result<Group, MqlError> {
        let Bson::Document(d) = spec else {
            return Err(MqlError::location(
                15947,
                "a group's fields must be specified in an object",
            ));
        };
        let mut id = None;
        let mut fields = Vec::new();
        for (name, value) in d {
            if name == "_id" {
                if let Bson::Document(fields) = value {
                    let operator = fields.keys().next().is_some_and(|k| k.starts_with('$'));
                    if !operator
                        && fields
                            .values()
                            .any(|v| matches!(v, Bson::Boolean(_)) || super::number::is_number(v))
                    {
                        return Err(MqlError::location(
                            17390,
                            "$group does not support inclusion-style expressions",
                        ));
                    }
                }
                id = Some(Expr::parse(value)?);
                continue;
            }
            if name.starts_with('$') {
                return Err(MqlError::location(
                    40236,
                    format!("The field name '{name}' cannot be an operator name"),
                ));
            }
            if name.contains('.') {
                return Err(MqlError::location(
                    40235,
                    format!("The field name '{name}' cannot contain '.'"),
                ));
            }
            let Bson::Document(acc) = value else {
                return Err(MqlError::location(
                    40234,
                    format!("The field '{name}' must be an accumulator object"),
                ));
            };
            if acc.len() != 1 {
                return Err(MqlError::location(
                    40238,
                    format!("The field '{name}' must specify one accumulator"),
                ));
            }
            let (op, arg) = acc.iter().next().expect("one accumulator");
            let accumulator = match op.as_str() {
                "$sum" => Accumulator::Sum,
                "$avg" => Accumulator::Avg,
                "$min" => Accumulator::Min,
                "$max" => Accumulator::Max,
                "$first" => Accumulator::First,
                "$last" => Accumulator::Last,
                "$push" => Accumulator::Push,
                "$addToSet" => Accumulator::AddToSet,
                "$count" => {
                    if !matches!(arg, Bson::Document(a) if a.is_empty()) {
                        return Err(MqlError::location(
                            4544702,
                            "$count takes no arguments, i.e. $count:{}",
                        ));
                    }
                    fields.push((
                        name.clone(),
                        Accumulator::Count,
                        Expr::Constant(Bson::Int32(1)),
                    ));
                    continue;
                }
                known @ ("$stdDevPop" | "$stdDevSamp" | "$mergeObjects" | "$top" | "$bottom"
                | "$topN" | "$bottomN" | "$firstN" | "$lastN" | "$maxN" | "$minN"
                | "$accumulator" | "$median" | "$percentile") => {
                    return Err(MqlError::not_implemented(format!(
                        "the front does not compute the {known} accumulator: it computes $sum, \
                         $avg, $min, $max, $first, $last, $push, $addToSet and $count"
                    )))
                }
                other => {
                    return Err(MqlError::location(
                        15952,
                        format!("unknown group operator '{other}'"),
                    ))
                }
            };
            if let Bson::Array(_) = arg {
                return Err(MqlError::location(
                    40237,
                    format!("The {op} accumulator is a unary operator"),
                ));
            }
            fields.push((name.clone(), accumulator, Expr::parse(arg)?));
        }
        let id = id.ok_or_else(|| {
            MqlError::location(15955, "a group specification must include an _id")
        })?;
        Ok(Group { id, fields })
    }

    fn run(&self, docs: &[Document]) -> Result<Vec<Document>, MqlError> {
        let mut keys: Vec<Bson> = Vec::new();
        let mut states: Vec<Vec<State>> = Vec::new();
        let mut buckets: HashMap<Vec<u8>, Vec<usize>> = HashMap::new();
        for doc in docs {
            let key = self.id.evaluate(doc).unwrap_or(Bson::Null);
            let mut coarse = Vec::new();
            coarse_key(&key, &mut coarse);
            let bucket = buckets.entry(coarse).or_default();
            let index = match bucket.iter().find(|&&i| order::equal(&keys[i], &key)) {
                Some(&i) => i,
                None => {
                    keys.push(key);
                    states.push(self.fields.iter().map(|_| State::default()).collect());
                    bucket.push(keys.len() - 1);
                    keys.len() - 1
                }
            };
            for ((name, accumulator, expr), state) in self.fields.iter().zip(&mut states[index]) {
                state.add(name, *accumulator, expr.evaluate(doc))?;
            }
        }
        Ok(keys
            .into_iter()
            .zip(states)
            .map(|(key, states)| {
                let mut out = Document::new();
                out.insert("_id", key);
                for ((name, accumulator, _), state) in self.fields.iter().zip(states) {
                    out.insert(name.clone(), state.value(*accumulator));
                }
                out
            })
            .collect())
    }
}

/// A group's running state for one accumulator.
#[derive(Clone, Debug, Default)]
struct State {
    sum: Sum,
    value: Option<Bson>,
    seen: bool,
    values: Vec<Bson>,
}

impl State {
    fn add(
        &mut self,
        name: &str,
        accumulator: Accumulator,
        value: Option<Bson>,
    ) -> Result<(), MqlError> {
        let nullish = |v: &Option<Bson>| matches!(v, None | Some(Bson::Null | Bson::Undefined));
        match accumulator {
            Accumulator::Sum | Accumulator::Avg | Accumulator::Count => {
                if let Some(v) = &value {
                    self.sum.add(v);
                    if self.sum.has_decimal() {
                        return Err(MqlError::not_implemented(format!(
                            "the front does not sum Decimal128 values ('{name}'): $sum and $avg \
                             of int, long and double are supported"
                        )));
                    }
                }
            }
            Accumulator::Min | Accumulator::Max => {
                if nullish(&value) {
                    return Ok(());
                }
                let v = value.expect("not missing");
                let better = match &self.value {
                    None => true,
                    Some(current) => {
                        let o = order::compare(&v, current);
                        if accumulator == Accumulator::Min {
                            o.is_lt()
                        } else {
                            o.is_gt()
                        }
                    }
                };
                if better {
                    self.value = Some(v);
                }
            }
            Accumulator::First => {
                if !self.seen {
                    self.seen = true;
                    self.value = value;
                }
            }
            Accumulator::Last => self.value = value,
            Accumulator::Push => self.values.extend(value),
            Accumulator::AddToSet => {
                if let Some(v) = value {
                    if !self.values.iter().any(|seen| order::equal(seen, &v)) {
                        self.values.push(v);
                    }
                }
            }
        }
        Ok(())
    }

    fn value(self, accumulator: Accumulator) -> Bson {
        match accumulator {
            Accumulator::Sum | Accumulator::Count => self.sum.total(),
            Accumulator::Avg => self.sum.average(),
            Accumulator::Push | Accumulator::AddToSet => Bson::Array(self.values),
            // "We return null in this case so return objects are predictable."
            Accumulator::Min | Accumulator::Max | Accumulator::First | Accumulator::Last => {
                self.value.unwrap_or(Bson::Null)
            }
        }
    }
}

impl Expr {
    fn parse(value: &Bson) -> Result<Expr, MqlError> {
        let unsupported = |what: &str| {
            MqlError::not_implemented(format!(
                "the front does not evaluate {what} in $group: _id and accumulators take null, \
                 a constant, \"$path\", \"$$ROOT\", or documents and arrays of those"
            ))
        };
        Ok(match value {
            Bson::String(s) if s == "$$ROOT" || s == "$$CURRENT" => Expr::Root,
            Bson::String(s) if s.starts_with("$$") => {
                return Err(unsupported(&format!("the variable {s}")))
            }
            Bson::String(s) if s.starts_with('$') => {
                if s.len() == 1 {
                    return Err(MqlError::location(
                        16872,
                        "'$' by itself is not a valid FieldPath",
                    ));
                }
                path::check(&s[1..])?;
                Expr::Path(s[1..].to_owned())
            }
            Bson::Document(d) => {
                if let Some(op) = d.keys().next().filter(|k| k.starts_with('$')) {
                    if op == "$literal" && d.len() == 1 {
                        return Ok(Expr::Constant(d["$literal"].clone()));
                    }
                    return Err(unsupported(&format!("the expression {op}")));
                }
                Expr::Document(
                    d.iter()
                        .map(|(k, v)| Ok((k.clone(), Expr::parse(v)?)))
                        .collect::<Result<_, MqlError>>()?,
                )
            }
            Bson::Array(items) => {
                Expr::Array(items.iter().map(Expr::parse).collect::<Result<_, _>>()?)
            }
            other => Expr::Constant(other.clone()),
        })
    }

    /// The expression's value in `doc`; `None` is missing.
    fn evaluate(&self, doc: &Document) -> Option<Bson> {
        match self {
            Expr::Constant(v) => Some(v.clone()),
            Expr::Path(p) => path::expression_value(doc, p),
            Expr::Root => Some(Bson::Document(doc.clone())),
            // A field whose value is missing is left out of the document.
            Expr::Document(fields) => Some(Bson::Document(
                fields
                    .iter()
                    .filter_map(|(k, e)| Some((k.clone(), e.evaluate(doc)?)))
                    .collect(),
            )),
            Expr::Array(items) => Some(Bson::Array(
                items
                    .iter()
                    .map(|e| e.evaluate(doc).unwrap_or(Bson::Null))
                    .collect(),
            )),
        }
    }

    fn reads_fields(&self) -> bool {
        match self {
            Expr::Constant(_) => false,
            Expr::Path(_) | Expr::Root => true,
            Expr::Document(fields) => fields.iter().any(|(_, e)| e.reads_fields()),
            Expr::Array(items) => items.iter().any(Expr::reads_fields),
        }
    }
}

/// A key that values equal in MongoDB's sense always share (numbers by their nearest double),
/// so that grouping compares a document's key with few others.
fn coarse_key(value: &Bson, out: &mut Vec<u8>) {
    out.push(crate::ids::Class::of(value) as u8);
    match value {
        Bson::Int32(_) | Bson::Int64(_) | Bson::Double(_) | Bson::Decimal128(_) => {
            let d = match value {
                Bson::Int32(i) => f64::from(*i),
                Bson::Int64(i) => *i as f64,
                Bson::Double(d) => *d,
                Bson::Decimal128(d) => d.to_string().parse::<f64>().unwrap_or(f64::NAN),
                _ => unreachable!("a number"),
            };
            // -0 and 0, and every NaN, are one key.
            let d = if d == 0.0 {
                0.0
            } else if d.is_nan() {
                f64::NAN
            } else {
                d
            };
            out.extend_from_slice(&d.to_bits().to_le_bytes());
        }
        Bson::String(s) | Bson::Symbol(s) => {
            out.extend_from_slice(s.as_bytes());
            out.push(0);
        }
        Bson::Document(d) => {
            for (k, v) in d {
                out.extend_from_slice(k.as_bytes());
                out.push(0);
                coarse_key(v, out);
            }
            out.push(0xFF);
        }
        Bson::Array(a) => {
            for v in a {
                coarse_key(v, out);
            }
            out.push(0xFF);
        }
        Bson::Null | Bson::Undefined | Bson::MinKey | Bson::MaxKey => {}
        other => out.extend_from_slice(
            other
                .clone()
                .into_canonical_extjson()
                .to_string()
                .as_bytes(),
        ),
    }
}

#[cfg(test)]
mod tests;

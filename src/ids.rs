//! `_id` values: MongoDB's order across type brackets, partition bounds, cursors that continue
//! across brackets, and the encodings stored in Postgres.
//!
//! A MongoDB comparison (`$gt`, `$lt`, ...) matches only values of the operand's type bracket
//! (numbers of every width compare with each other; strings, binary data and ObjectIds each
//! stand alone). Every reader that continues "after an `_id`" must therefore step across
//! brackets explicitly ([`after`]), and every scan bounded by a range stays inside one bracket
//! ([`range_filter`]): partitions are cut per bracket. Orders here are MongoDB's (simple
//! collation): brackets in BSON sort order (numbers < strings < binary < ObjectIds); numbers by
//! exact value whatever their width, strings by UTF-8 bytes, binary by length, then subtype,
//! then bytes, ObjectIds by bytes.

use std::cmp::Ordering;

use mongodb::bson::spec::BinarySubtype;
use mongodb::bson::{doc, oid::ObjectId, Binary, Bson, Document};

/// The BSON types (`$type` aliases) of the ids reshard can route: a `double` only when it is
/// a whole number ([`crate::routing::KeyValue::from_bson`]).
pub const ROUTABLE_TYPES: [&str; 6] = ["int", "long", "double", "string", "objectId", "binData"];

/// An `_id` type bracket that reshard partitions by (the routable key types), in MongoDB's
/// sort order: the derived `Ord` is the order in which brackets follow each other.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Bracket {
    Number,
    String,
    Binary,
    ObjectId,
}

impl Bracket {
    /// Every bracket, in MongoDB's sort order.
    pub const ALL: [Bracket; 4] = [
        Bracket::Number,
        Bracket::String,
        Bracket::Binary,
        Bracket::ObjectId,
    ];

    /// The bracket of a value; `None` for types reshard cannot route.
    pub fn of(id: &Bson) -> Option<Bracket> {
        match id {
            Bson::Int32(_) | Bson::Int64(_) | Bson::Double(_) | Bson::Decimal128(_) => {
                Some(Bracket::Number)
            }
            Bson::String(_) => Some(Bracket::String),
            Bson::ObjectId(_) => Some(Bracket::ObjectId),
            Bson::Binary(_) => Some(Bracket::Binary),
            _ => None,
        }
    }

    /// The name stored with a partition (MongoDB's `$type` alias of the bracket).
    pub fn name(self) -> &'static str {
        match self {
            Bracket::Number => "number",
            Bracket::String => "string",
            Bracket::ObjectId => "objectId",
            Bracket::Binary => "binData",
        }
    }

    pub fn parse(name: &str) -> Option<Bracket> {
        Bracket::ALL.into_iter().find(|b| b.name() == name)
    }

    /// The smallest value of the bracket: `{$gte: floor}` matches exactly the bracket (for
    /// numbers, every number but NaN, which reshard cannot route and the planner looks for).
    pub fn floor(self) -> Bson {
        match self {
            Bracket::Number => Bson::Double(f64::NEG_INFINITY),
            Bracket::String => Bson::String(String::new()),
            Bracket::ObjectId => Bson::ObjectId(ObjectId::from_bytes([0; 12])),
            Bracket::Binary => Bson::Binary(Binary {
                subtype: BinarySubtype::Generic,
                bytes: Vec::new(),
            }),
        }
    }

    /// The brackets that sort after this one.
    pub fn later(self) -> impl Iterator<Item = Bracket> {
        Bracket::ALL.into_iter().filter(move |b| *b > self)
    }
}

/// Why a value cannot be a cursor position.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0} is not an _id reshard can continue after: ids are strings, integers, ObjectIds or binary data")]
pub struct NotAnId(pub String);

/// The `_id` condition "after `id` in MongoDB's order", across type brackets: the rest of
/// `id`'s bracket, then every later bracket whole. (`{_id: {$gt: 7}}` alone never matches a
/// string or an ObjectId.) Merge it into a filter that has no other `$or`.
pub fn after(id: &Bson) -> Result<Document, NotAnId> {
    let bracket = Bracket::of(id).ok_or_else(|| NotAnId(text(id)))?;
    let mut branches = vec![Bson::Document(doc! { "_id": { "$gt": id.clone() } })];
    branches.extend(
        bracket
            .later()
            .map(|b| Bson::Document(doc! { "_id": { "$gte": b.floor() } })),
    );
    Ok(doc! { "$or": branches })
}

/// MongoDB's order of `_id`s: brackets in sort order ([`Bracket`]); numbers by exact value
/// whatever their width (an `int64` above 2^53 and the nearest `double` are told apart);
/// strings by UTF-8 bytes; binary data by length, then subtype, then bytes; ObjectIds by bytes.
/// Values of the types reshard cannot route sort by their [`Class`] among these (a `null`
/// below every number, a boolean above every ObjectId); two of one such class compare equal.
pub fn compare(a: &Bson, b: &Bson) -> Ordering {
    match (a, b) {
        (Bson::String(x), Bson::String(y)) => x.as_bytes().cmp(y.as_bytes()),
        (Bson::ObjectId(x), Bson::ObjectId(y)) => x.bytes().cmp(&y.bytes()),
        (Bson::Binary(x), Bson::Binary(y)) => x
            .bytes
            .len()
            .cmp(&y.bytes.len())
            .then(u8::from(x.subtype).cmp(&u8::from(y.subtype)))
            .then(x.bytes.cmp(&y.bytes)),
        _ => match (number(a), number(b)) {
            (Some(x), Some(y)) => x.cmp(&y),
            _ => rank(a).cmp(&rank(b)),
        },
    }
}

fn rank(b: &Bson) -> Class {
    Class::of(b)
}

/// A number as MongoDB compares it: integers exactly, doubles exactly, NaN below everything.
#[derive(Clone, Copy, Debug)]
enum Number {
    Int(i64),
    Float(f64),
}

fn number(b: &Bson) -> Option<Number> {
    match b {
        Bson::Int32(v) => Some(Number::Int(i64::from(*v))),
        Bson::Int64(v) => Some(Number::Int(*v)),
        Bson::Double(v) => Some(Number::Float(*v)),
        _ => None,
    }
}

impl Number {
    fn cmp(&self, other: &Number) -> Ordering {
        match (*self, *other) {
            (Number::Int(x), Number::Int(y)) => x.cmp(&y),
            (Number::Float(x), Number::Float(y)) => float_cmp(x, y),
            (Number::Int(x), Number::Float(y)) => int_float_cmp(x, y),
            (Number::Float(x), Number::Int(y)) => int_float_cmp(y, x).reverse(),
        }
    }
}

/// Doubles in MongoDB's order: NaN below every other number, equal to itself.
fn float_cmp(x: f64, y: f64) -> Ordering {
    match (x.is_nan(), y.is_nan()) {
        (true, true) => Ordering::Equal,
        (true, false) => Ordering::Less,
        (false, true) => Ordering::Greater,
        (false, false) => x.partial_cmp(&y).expect("neither is NaN"),
    }
}

/// An integer against a double, exactly (no rounding of the integer to 53 bits).
fn int_float_cmp(x: i64, y: f64) -> Ordering {
    if y.is_nan() {
        return Ordering::Greater;
    }
    // 2^63 is exactly representable; every i64 is below it and at or above -2^63.
    const TWO_63: f64 = 9_223_372_036_854_775_808.0;
    if y >= TWO_63 {
        return Ordering::Less;
    }
    if y < -TWO_63 {
        return Ordering::Greater;
    }
    let whole = y.trunc();
    // `whole` is within [-2^63, 2^63), so it converts to i64 exactly.
    match x.cmp(&(whole as i64)) {
        Ordering::Equal if y > whole => Ordering::Less,
        Ordering::Equal if y < whole => Ordering::Greater,
        other => other,
    }
}

/// An `_id` as stored in Postgres (partition bounds, checkpoints, dead letters): the BSON of
/// `{"v": id}`, so every type round-trips exactly.
pub fn encode(id: &Bson) -> Vec<u8> {
    mongodb::bson::to_vec(&doc! { "v": id.clone() }).expect("a BSON value encodes")
}

pub fn decode(bytes: &[u8]) -> Result<Bson, String> {
    let d: Document =
        mongodb::bson::from_slice(bytes).map_err(|e| format!("stored _id unreadable: {e}"))?;
    d.get("v")
        .cloned()
        .ok_or_else(|| "stored _id unreadable: no value".to_owned())
}

/// A key equal for two ids exactly when MongoDB takes them for the same `_id`: numbers by
/// value whatever their width (`7`, `7_i64` and `7.0` are one key), everything else by its
/// exact encoding. For matching what a lookup by id returned with what was asked for.
pub fn key(id: &Bson) -> Vec<u8> {
    let whole = |v: i64| {
        let mut k = b"n".to_vec();
        k.extend_from_slice(&v.to_be_bytes());
        k
    };
    match id {
        Bson::Int32(v) => whole(i64::from(*v)),
        Bson::Int64(v) => whole(*v),
        Bson::Double(v) => match crate::routing::KeyValue::from_bson(id) {
            Ok(crate::routing::KeyValue::Int(i)) => whole(i),
            _ => {
                let mut k = b"d".to_vec();
                k.extend_from_slice(&v.to_bits().to_be_bytes());
                k
            }
        },
        other => encode(other),
    }
}

/// The [`key`]s of ids as stored ([`encode`]), for asking whether a document read from a
/// shard is one of them (`7` and `7.0` are one document; `7` and `"7"` are two). Ids that
/// cannot be read are left out.
pub fn keys_of_encoded(stored: &[Vec<u8>]) -> std::collections::HashSet<Vec<u8>> {
    stored
        .iter()
        .filter_map(|b| decode(b).ok())
        .map(|id| key(&id))
        .collect()
}

/// An `_id` as an operator types it and sees it: strings bare, numbers as digits, others in
/// relaxed extended JSON (`{"$oid": "..."}`).
pub fn text(id: &Bson) -> String {
    match id {
        Bson::String(s) => s.clone(),
        Bson::Int32(i) => i.to_string(),
        Bson::Int64(i) => i.to_string(),
        other => other.clone().into_relaxed_extjson().to_string(),
    }
}

/// An `_id` as JSON output carries it: canonical Extended JSON, so its type survives
/// (`{"$numberLong": "13996721"}`, `{"$oid": "..."}`; a string stays a JSON string).
pub fn extjson(id: &Bson) -> serde_json::Value {
    id.clone().into_canonical_extjson()
}

/// [`extjson`] of an id as stored in Postgres ([`encode`]); `null` when it cannot be read.
pub fn extjson_encoded(bytes: &[u8]) -> serde_json::Value {
    decode(bytes).map_or(serde_json::Value::Null, |id| extjson(&id))
}

/// Serializes a stored id (`#[serde(serialize_with)]`) as [`extjson_encoded`].
#[allow(clippy::ptr_arg)] // serde hands the field as it is declared
pub fn serialize_encoded<S: serde::Serializer>(bytes: &Vec<u8>, s: S) -> Result<S::Ok, S::Error> {
    serde::Serialize::serialize(&extjson_encoded(bytes), s)
}

/// [`serialize_encoded`] for an id that may be absent (`null`).
pub fn serialize_encoded_opt<S: serde::Serializer>(
    bytes: &Option<Vec<u8>>,
    s: S,
) -> Result<S::Ok, S::Error> {
    let value = bytes
        .as_deref()
        .map_or(serde_json::Value::Null, extjson_encoded);
    serde::Serialize::serialize(&value, s)
}

/// An `_id` as text output shows it, so two ids of different types never look alike:
/// numbers as digits, ObjectIds and binary data in relaxed Extended JSON, a string bare
/// unless it would read as something else (a number, JSON, blanks at an end, nothing at
/// all), then as a JSON string in double quotes. [`parse_given`] reads every one back.
pub fn shown(id: &Bson) -> String {
    match id {
        Bson::String(s) if string_needs_quotes(s) => {
            serde_json::Value::from(s.as_str()).to_string()
        }
        other => text(other),
    }
}

/// [`shown`] of a stored id; `fallback` (the text stored beside it) when it cannot be read.
pub fn shown_encoded(bytes: &[u8], fallback: &str) -> String {
    decode(bytes).map_or_else(|_| fallback.to_owned(), |id| shown(&id))
}

/// [`shown_encoded`] of an id that may be absent: the stored text when no id was stored.
pub fn shown_stored(bytes: Option<&[u8]>, text: Option<&str>) -> Option<String> {
    match bytes {
        Some(bytes) => Some(shown_encoded(bytes, text.unwrap_or("?"))),
        None => text.map(str::to_owned),
    }
}

fn string_needs_quotes(s: &str) -> bool {
    s.is_empty()
        || s.trim() != s
        || s.starts_with('{')
        || s.starts_with('"')
        || s.parse::<serde_json::Number>().is_ok()
}

/// Reads an `_id` an operator gives (`--id`): Extended JSON when it starts with `{` or `"`
/// (canonical or relaxed: `{"$numberLong": "7"}`, `{"$oid": "..."}`, `"7"` for the string),
/// a number when it reads as a JSON number, otherwise the string itself. Whatever [`shown`]
/// prints reads back as the same id. Any BSON value is accepted: a bypass may record an id
/// of a type reshard cannot route, and an operator still names it to resolve it.
pub fn parse_given(given: &str) -> Result<Bson, String> {
    let value = if given.starts_with('{') || given.starts_with('"') {
        let json: serde_json::Value = serde_json::from_str(given).map_err(|e| {
            format!(
                "--id {given}: not JSON ({e}); give Extended JSON such as                  '{{\"$numberLong\": \"7\"}}', '{{\"$oid\": \"...\"}}' or '\"text\"'"
            )
        })?;
        Bson::try_from(json).map_err(|e| format!("--id {given}: not Extended JSON ({e})"))?
    } else if let Ok(number) = given.parse::<serde_json::Number>() {
        Bson::try_from(serde_json::Value::Number(number))
            .map_err(|e| format!("--id {given}: {e}"))?
    } else {
        Bson::String(given.to_owned())
    };
    Ok(value)
}

/// Whether a stored id is the one an operator gave ([`parse_given`]): by [`key`], so `7`
/// matches an int, a long and a double 7 alike, and never the string `"7"`.
pub fn given_matches(given: &Bson, encoded: &[u8]) -> bool {
    decode(encoded).is_ok_and(|id| key(&id) == key(given))
}

/// What to say when no row matched a given id that may have been meant as another type.
pub fn given_hint(given: &Bson) -> Option<String> {
    match given {
        Bson::Int32(_) | Bson::Int64(_) | Bson::Double(_) => Some(format!(
            "{} was read as a number; a string id is given in double quotes: --id '\"{}\"'",
            text(given),
            text(given)
        )),
        _ => None,
    }
}

/// `parts - 1` split points (fewer when the sample has fewer distinct values) that cut
/// `sorted` (sorted by [`compare`]) into `parts` runs of about equal size. Each point is the
/// inclusive lower bound of the next partition; the points are strictly increasing.
pub fn split_points(sorted: &[Bson], parts: usize) -> Vec<Bson> {
    let mut points: Vec<Bson> = Vec::new();
    if parts < 2 || sorted.is_empty() {
        return points;
    }
    for k in 1..parts {
        let candidate = &sorted[k * sorted.len() / parts];
        let above_last = points
            .last()
            .is_none_or(|last| compare(candidate, last) == Ordering::Greater);
        // The first value of the sample is no use as a bound: it would leave an empty
        // partition below it only by accident of sampling.
        if above_last && compare(candidate, &sorted[0]) == Ordering::Greater {
            points.push(candidate.clone());
        }
    }
    points
}

/// The `_id` condition of a partition's scan: from `lower` (inclusive) or after `resume`
/// (exclusive), below `upper`, within `bracket`.
pub fn range_filter(
    bracket: Bracket,
    lower: Option<&Bson>,
    resume_after: Option<&Bson>,
    upper: Option<&Bson>,
) -> Document {
    let mut cond = match resume_after {
        Some(after) => doc! { "$gt": after.clone() },
        None => doc! { "$gte": lower.cloned().unwrap_or_else(|| bracket.floor()) },
    };
    if let Some(upper) = upper {
        cond.insert("$lt", upper.clone());
    }
    doc! { "_id": cond }
}

/// MongoDB's sort classes: the BSON types that compare with each other share one (every
/// number; strings and symbols), and the classes follow each other in this order whatever the
/// values (`canonicalizeBSONType`). Every `_id` falls in exactly one; reshard routes four of
/// them ([`Bracket`]), but a range across classes ([`IdRange`]) holds the others too, so a
/// scan of it meets every document and the ledger counts each.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Class {
    MinKey,
    Undefined,
    Null,
    Number,
    String,
    Object,
    Array,
    Binary,
    ObjectId,
    Boolean,
    Date,
    Timestamp,
    Regex,
    DbPointer,
    JavaScript,
    JavaScriptWithScope,
    MaxKey,
}

impl Class {
    /// Every class, in MongoDB's sort order.
    pub const ALL: [Class; 17] = [
        Class::MinKey,
        Class::Undefined,
        Class::Null,
        Class::Number,
        Class::String,
        Class::Object,
        Class::Array,
        Class::Binary,
        Class::ObjectId,
        Class::Boolean,
        Class::Date,
        Class::Timestamp,
        Class::Regex,
        Class::DbPointer,
        Class::JavaScript,
        Class::JavaScriptWithScope,
        Class::MaxKey,
    ];

    pub fn of(value: &Bson) -> Class {
        match value {
            Bson::MinKey => Class::MinKey,
            Bson::Undefined => Class::Undefined,
            Bson::Null => Class::Null,
            Bson::Int32(_) | Bson::Int64(_) | Bson::Double(_) | Bson::Decimal128(_) => {
                Class::Number
            }
            Bson::String(_) | Bson::Symbol(_) => Class::String,
            Bson::Document(_) => Class::Object,
            Bson::Array(_) => Class::Array,
            Bson::Binary(_) => Class::Binary,
            Bson::ObjectId(_) => Class::ObjectId,
            Bson::Boolean(_) => Class::Boolean,
            Bson::DateTime(_) => Class::Date,
            Bson::Timestamp(_) => Class::Timestamp,
            Bson::RegularExpression(_) => Class::Regex,
            Bson::DbPointer(_) => Class::DbPointer,
            Bson::JavaScriptCode(_) => Class::JavaScript,
            Bson::JavaScriptCodeWithScope(_) => Class::JavaScriptWithScope,
            Bson::MaxKey => Class::MaxKey,
        }
    }

    /// The `$type` aliases that match exactly this class.
    pub fn type_aliases(self) -> &'static [&'static str] {
        match self {
            Class::MinKey => &["minKey"],
            Class::Undefined => &["undefined"],
            Class::Null => &["null"],
            Class::Number => &["number"],
            Class::String => &["string", "symbol"],
            Class::Object => &["object"],
            Class::Array => &["array"],
            Class::Binary => &["binData"],
            Class::ObjectId => &["objectId"],
            Class::Boolean => &["bool"],
            Class::Date => &["date"],
            Class::Timestamp => &["timestamp"],
            Class::Regex => &["regex"],
            Class::DbPointer => &["dbPointer"],
            Class::JavaScript => &["javascript"],
            Class::JavaScriptWithScope => &["javascriptWithScope"],
            Class::MaxKey => &["maxKey"],
        }
    }
}

/// The partition type of a range across every class ([`IdRange`] with no bracket); the other
/// partition types are bracket names ([`Bracket::name`]), which plans made before ranges
/// crossed classes hold.
pub const ANY_TYPE: &str = "any";

/// A partition's ids: `[lower, upper)` within one bracket, or (`bracket: None`) in MongoDB's
/// total order across every class, from the very first `_id` (`lower: None`) to the very last
/// (`upper: None`). A plan's ranges across classes follow each other without a gap, so the
/// scans of a plan meet every document, whatever its `_id`'s type. Bounds are ids reshard can
/// route.
#[derive(Clone, Debug, PartialEq)]
pub struct IdRange {
    pub bracket: Option<Bracket>,
    pub lower: Option<Bson>,
    pub upper: Option<Bson>,
}

impl IdRange {
    /// The range a partition of type `id_type` ([`ANY_TYPE`] or a bracket name) holds.
    pub fn of_type(
        id_type: &str,
        lower: Option<Bson>,
        upper: Option<Bson>,
    ) -> Result<IdRange, String> {
        let bracket = match id_type {
            ANY_TYPE => None,
            name => Some(Bracket::parse(name).ok_or_else(|| format!("unknown _id type {name:?}"))?),
        };
        Ok(IdRange {
            bracket,
            lower,
            upper,
        })
    }

    /// Every `_id` there is.
    pub fn everything() -> IdRange {
        IdRange {
            bracket: None,
            lower: None,
            upper: None,
        }
    }

    /// The partition type stored for this range.
    pub fn type_name(&self) -> &'static str {
        self.bracket.map_or(ANY_TYPE, Bracket::name)
    }

    /// Whether `id` lies in the range.
    pub fn contains(&self, id: &Bson) -> bool {
        if let Some(b) = self.bracket {
            if Bracket::of(id) != Some(b) {
                return false;
            }
        }
        self.lower.as_ref().is_none_or(|l| compare(l, id).is_le())
            && self.upper.as_ref().is_none_or(|u| compare(id, u).is_lt())
    }

    /// The `_id` condition of a scan of the range, whole or after `resume` (exclusive: a
    /// checkpoint's last id, of any type). Merge it into a filter with [`and`].
    pub fn filter(&self, resume: Option<&Bson>) -> Document {
        if let Some(bracket) = self.bracket {
            return range_filter(bracket, self.lower.as_ref(), resume, self.upper.as_ref());
        }
        let lower = match (resume, &self.lower) {
            (Some(r), _) => Lower::After(r),
            (None, Some(l)) => Lower::From(l),
            (None, None) => Lower::Unbounded,
        };
        span_filter(lower, self.upper.as_ref())
    }
}

/// Where a range across classes starts.
#[derive(Clone, Copy, Debug)]
enum Lower<'a> {
    Unbounded,
    From(&'a Bson),
    After(&'a Bson),
}

fn is_nan(v: &Bson) -> bool {
    matches!(v, Bson::Double(d) if d.is_nan())
}

/// `[lower, upper)` in MongoDB's total order, as conditions the `_id` index answers: a
/// comparison only matches its operand's class, so the range is the part of `lower`'s class at
/// or after it, every class between whole (`$type`), and the part of `upper`'s class below
/// it. NaN, which every comparison but equality skips, is named where the range holds the
/// bottom of the numbers.
fn span_filter(lower: Lower<'_>, upper: Option<&Bson>) -> Document {
    let whole = |c: Class| doc! { "_id": { "$type": c.type_aliases().to_vec() } };
    let first = match lower {
        Lower::Unbounded => None,
        Lower::From(v) | Lower::After(v) => Some(Class::of(v)),
    };
    let last = upper.map(Class::of);
    // The part of `lower`'s class the range holds, given what bounds it above in that class.
    let lower_part = |v: &Bson, inclusive: bool, below: Option<&Bson>| -> Vec<Document> {
        // `$gt`/`$gte` with MinKey match every class (MinKey sorts below everything, and
        // MongoDB compares it across types): its class holds MinKey alone.
        if Class::of(v) == Class::MinKey {
            return if inclusive {
                vec![whole(Class::MinKey)]
            } else {
                vec![]
            };
        }
        let mut cond = if is_nan(v) {
            // Every number is above NaN (the one NaN `_id` there can be is `v` itself).
            let mut parts = vec![];
            if inclusive {
                parts.push(doc! { "_id": f64::NAN });
            }
            let mut rest = doc! { "$gte": f64::NEG_INFINITY };
            if let Some(u) = below {
                rest.insert("$lt", u.clone());
            }
            parts.push(doc! { "_id": rest });
            return parts;
        } else if inclusive {
            doc! { "$gte": v.clone() }
        } else {
            doc! { "$gt": v.clone() }
        };
        if let Some(u) = below {
            cond.insert("$lt", u.clone());
        }
        vec![doc! { "_id": cond }]
    };
    let upper_part = |u: &Bson| -> Vec<Document> {
        // Likewise `$lt` with MaxKey matches every class: below MaxKey, its class holds
        // nothing (and below MinKey nothing is).
        if matches!(Class::of(u), Class::MaxKey | Class::MinKey) {
            return vec![];
        }
        let mut parts = vec![doc! { "_id": { "$lt": u.clone() } }];
        if Class::of(u) == Class::Number && !is_nan(u) {
            parts.push(doc! { "_id": f64::NAN });
        }
        parts
    };
    let mut branches: Vec<Document> = Vec::new();
    match (lower, upper) {
        (Lower::Unbounded, None) => return Document::new(),
        (Lower::From(v) | Lower::After(v), Some(u)) if first == last => {
            branches.extend(lower_part(v, matches!(lower, Lower::From(_)), Some(u)));
        }
        _ => {
            if let Lower::From(v) | Lower::After(v) = lower {
                branches.extend(lower_part(v, matches!(lower, Lower::From(_)), None));
            }
            for c in Class::ALL {
                let above_first = first.is_none_or(|f| c > f);
                let below_last = last.is_none_or(|l| c < l);
                if above_first && below_last {
                    branches.push(whole(c));
                }
            }
            if let Some(u) = upper {
                branches.extend(upper_part(u));
            }
        }
    }
    match branches.len() {
        // An empty range: a condition nothing meets (no `_id` is of no type).
        0 => doc! { "_id": { "$exists": false } },
        1 => branches.pop().expect("one branch"),
        _ => doc! { "$or": branches.into_iter().map(Bson::Document).collect::<Vec<_>>() },
    }
}

/// `a` and `b` together: merged when their keys differ, else both under `$and`. A condition of
/// `b` that `a` holds already, the same key with the same value (a filter's `_id`), is left
/// out: a condition and itself is the condition, and a filter kept flat stays on the `_id`
/// index for every planner.
pub fn and(mut a: Document, b: Document) -> Document {
    let b: Document = b.into_iter().filter(|(k, v)| a.get(k) != Some(v)).collect();
    if b.keys().any(|k| a.contains_key(k)) {
        return doc! { "$and": [a, b] };
    }
    a.extend(b);
    a
}

#[cfg(test)]
mod tests;

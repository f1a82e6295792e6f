//! The routed commands as plans: what a command document asks of a routed collection, read
//! and checked before any I/O (the tenants and the id its filter pins, the sort, the
//! projection, each write statement), so that a plan is tested by value and an unsupported
//! form is refused with MongoDB's code before anything is read or written.
//!
//! What the front does not run on a routed collection, and why:
//! - a filter that does not pin the tenant key (`ShardKeyNotFound`): the front reads the
//!   locations of the tenants asked for, never every shard;
//! - a collation other than the simple one, `arrayFilters`, `let`, pipeline updates, tailable
//!   cursors, `min`/`max`/`returnKey`/`showRecordId`, read concern `snapshot`
//!   (`NotImplemented`): the merge compares strings by their bytes, and the rest the
//!   protocol's single-document steps cannot carry;
//! - `hint` is accepted and not used: each location's server plans its own read.

use bson::{Bson, Document};

use super::error::{CommandError, ErrorCode};
use crate::mql::projection::Projection;
use crate::mql::sort::SortSpec;
use crate::mql::update::{self, UpdateKind};

/// What a filter pins: the tenants it reads, and the one `_id` it names, if it names one.
#[derive(Clone, Debug, PartialEq)]
pub struct Pinned {
    pub tenants: Vec<Bson>,
    pub id: Option<Bson>,
}

impl Pinned {
    /// The one document the filter can match at most, by tenant and id.
    pub fn one(&self) -> Option<(Bson, Bson)> {
        match (self.tenants.as_slice(), &self.id) {
            ([tenant], Some(id)) => Some((tenant.clone(), id.clone())),
            _ => None,
        }
    }
}

/// The tenants and the id `filter` pins on a collection routed by `tenant_key`.
pub fn pinned(
    filter: &Document,
    tenant_key: &str,
    collection: &str,
) -> Result<Pinned, CommandError> {
    let tenants = crate::mql::filter::pinned(filter, tenant_key)?.ok_or_else(|| {
        CommandError::new(
            ErrorCode::ShardKeyNotFound,
            format!(
                "a filter on the routed collection '{collection}' must pin its tenant key \
                 '{tenant_key}' (an equality, $eq or $in, at the top level or inside $and): the \
                 front reads the locations of the tenants asked for, not every shard"
            ),
        )
    })?;
    let id = match crate::mql::filter::pinned(filter, "_id")? {
        Some(ids) if ids.len() == 1 => ids.into_iter().next(),
        _ => None,
    };
    Ok(Pinned { tenants, id })
}

/// A `find`.
#[derive(Clone, Debug)]
pub struct Find {
    pub filter: Document,
    pub pinned: Pinned,
    pub sort: Option<SortSpec>,
    pub projection: Option<Projection>,
    pub skip: u64,
    /// At most this many documents (`None`: all).
    pub limit: Option<u64>,
    /// The first batch's size (`None`: MongoDB's default, 101).
    pub batch_size: Option<u64>,
    /// One batch, then the cursor closes.
    pub single_batch: bool,
}

/// The first batch of a `find` without `batchSize`, as MongoDB's.
pub const DEFAULT_FIRST_BATCH: u64 = 101;

pub fn find(command: &Document, tenant_key: &str) -> Result<Find, CommandError> {
    let collection = collection_of(command, "find")?;
    refuse_unsupported(
        command,
        "find",
        &[
            "tailable",
            "awaitData",
            "oplogReplay",
            "returnKey",
            "showRecordId",
            "min",
            "max",
            "let",
        ],
    )?;
    check_collation(command)?;
    check_read_concern(command)?;
    let filter = document_field(command, "find", "filter")?.unwrap_or_default();
    let pinned = pinned(&filter, tenant_key, &collection)?;
    let sort = match document_field(command, "find", "sort")? {
        Some(s) if !s.is_empty() => Some(SortSpec::parse(&s)?),
        _ => None,
    };
    let projection = match document_field(command, "find", "projection")? {
        Some(p) if !p.is_empty() => Some(Projection::parse(&p)?),
        _ => None,
    };
    let skip = count_field(command, "find", "skip")?.unwrap_or(0);
    let limit = count_field(command, "find", "limit")?.filter(|l| *l > 0);
    let batch_size = count_field(command, "find", "batchSize")?;
    let single_batch = matches!(command.get("singleBatch"), Some(Bson::Boolean(true)));
    Ok(Find {
        filter,
        pinned,
        sort,
        projection,
        skip,
        limit,
        batch_size,
        single_batch,
    })
}

/// What an update statement (or a `findAndModify`) writes.
#[derive(Clone, Debug, PartialEq)]
pub enum Change {
    /// Update operators, applied by the server holding the document.
    Operators(Document),
    /// A whole new document (its `_id` kept).
    Replacement(Document),
}

impl Change {
    pub fn parse(update: &Bson) -> Result<Change, CommandError> {
        match (update::kind(update)?, update) {
            (UpdateKind::Operators, Bson::Document(d)) => {
                // Checked whole now (operators, paths, conflicts), before anything is read.
                update::Update::parse(d)?;
                Ok(Change::Operators(d.clone()))
            }
            (UpdateKind::Replacement, Bson::Document(d)) => Ok(Change::Replacement(d.clone())),
            _ => Err(CommandError::passed(
                238,
                "NotImplemented",
                "the front does not run pipeline-style updates (an array) on a routed \
                 collection: use update operators or a replacement document",
            )),
        }
    }

    /// The update as the server gets it (operators or the replacement).
    pub fn as_bson(&self) -> Bson {
        match self {
            Change::Operators(d) | Change::Replacement(d) => Bson::Document(d.clone()),
        }
    }
}

/// One statement of an `update` command.
#[derive(Clone, Debug)]
pub struct UpdateStatement {
    pub filter: Document,
    pub pinned: Pinned,
    pub change: Change,
    pub upsert: bool,
    pub multi: bool,
}

/// One statement of a `delete` command.
#[derive(Clone, Debug)]
pub struct DeleteStatement {
    pub filter: Document,
    pub pinned: Pinned,
    /// `limit: 1`: the first matching document only; `limit: 0`: every one.
    pub just_one: bool,
}

/// A write command's statements, each planned or refused on its own (a refusal is that
/// statement's write error, as MongoDB reports it), and whether they are ordered.
pub struct Statements<T> {
    pub statements: Vec<Result<T, CommandError>>,
    pub ordered: bool,
}

/// An `insert`'s documents: each must carry the tenant key.
pub fn insert(command: &Document, tenant_key: &str) -> Result<Statements<Document>, CommandError> {
    let collection = collection_of(command, "insert")?;
    let documents = array_field(command, "insert", "documents")?;
    let ordered = ordered(command, "insert")?;
    let statements = documents
        .iter()
        .map(|d| match d {
            Bson::Document(d) if d.contains_key(tenant_key) => Ok(d.clone()),
            Bson::Document(_) => Err(CommandError::new(
                ErrorCode::ShardKeyNotFound,
                format!(
                    "the document has no '{tenant_key}', the tenant key of the routed collection \
                     '{collection}'"
                ),
            )),
            _ => Err(CommandError::type_mismatch("insert", "documents", "object")),
        })
        .collect();
    Ok(Statements {
        statements,
        ordered,
    })
}

pub fn update(
    command: &Document,
    tenant_key: &str,
) -> Result<Statements<UpdateStatement>, CommandError> {
    let collection = collection_of(command, "update")?;
    let updates = array_field(command, "update", "updates")?;
    let ordered = ordered(command, "update")?;
    refuse_unsupported(command, "update", &["let"])?;
    let mut statements = Vec::with_capacity(updates.len());
    for u in updates {
        let Bson::Document(u) = u else {
            return Err(CommandError::type_mismatch("update", "updates", "object"));
        };
        let filter = required_document(u, "update.updates", "q")?;
        let change = u
            .get("u")
            .ok_or_else(|| CommandError::missing_field("update.updates", "u"))?;
        statements.push((|| {
            refuse_unsupported(u, "update.updates", &["arrayFilters", "c"])?;
            check_collation(u)?;
            let change = Change::parse(change)?;
            let multi = bool_field(u, "multi")?;
            if multi && matches!(change, Change::Replacement(_)) {
                return Err(CommandError::new(
                    ErrorCode::FailedToParse,
                    "multi update is not supported for replacement-style update",
                ));
            }
            Ok(UpdateStatement {
                pinned: pinned(&filter, tenant_key, &collection)?,
                filter: filter.clone(),
                change,
                upsert: bool_field(u, "upsert")?,
                multi,
            })
        })());
    }
    Ok(Statements {
        statements,
        ordered,
    })
}

pub fn delete(
    command: &Document,
    tenant_key: &str,
) -> Result<Statements<DeleteStatement>, CommandError> {
    let collection = collection_of(command, "delete")?;
    let deletes = array_field(command, "delete", "deletes")?;
    let ordered = ordered(command, "delete")?;
    refuse_unsupported(command, "delete", &["let"])?;
    let mut statements = Vec::with_capacity(deletes.len());
    for d in deletes {
        let Bson::Document(d) = d else {
            return Err(CommandError::type_mismatch("delete", "deletes", "object"));
        };
        let filter = required_document(d, "delete.deletes", "q")?;
        let limit = match d.get("limit") {
            None => return Err(CommandError::missing_field("delete.deletes", "limit")),
            Some(l) => as_count(l)
                .ok_or_else(|| CommandError::type_mismatch("delete.deletes", "limit", "number"))?,
        };
        if limit > 1 {
            return Err(CommandError::new(
                ErrorCode::FailedToParse,
                format!("The limit field in delete objects must be 0 or 1. Got {limit}"),
            ));
        }
        statements.push((|| {
            check_collation(d)?;
            Ok(DeleteStatement {
                pinned: pinned(&filter, tenant_key, &collection)?,
                filter: filter.clone(),
                just_one: limit == 1,
            })
        })());
    }
    Ok(Statements {
        statements,
        ordered,
    })
}

/// A `findAndModify`.
#[derive(Clone, Debug)]
pub struct FindAndModify {
    pub filter: Document,
    pub pinned: Pinned,
    pub sort: Option<SortSpec>,
    /// `None`: remove the document.
    pub change: Option<Change>,
    /// Return the document as the write left it (else as it was).
    pub new: bool,
    pub upsert: bool,
    pub fields: Option<Projection>,
}

pub fn find_and_modify(
    command: &Document,
    tenant_key: &str,
) -> Result<FindAndModify, CommandError> {
    let name = "findAndModify";
    let collection = collection_of(command, name)?;
    refuse_unsupported(command, name, &["arrayFilters", "let"])?;
    check_collation(command)?;
    let filter = document_field(command, name, "query")?.unwrap_or_default();
    let remove = bool_field(command, "remove")?;
    let change = match (remove, command.get("update")) {
        (true, Some(_)) => {
            return Err(CommandError::new(
                ErrorCode::FailedToParse,
                "Cannot specify both an update and remove=true",
            ))
        }
        (true, None) => None,
        (false, Some(u)) => Some(Change::parse(u)?),
        (false, None) => {
            return Err(CommandError::new(
                ErrorCode::FailedToParse,
                "Either an update or remove=true must be specified",
            ))
        }
    };
    let upsert = bool_field(command, "upsert")?;
    let new = bool_field(command, "new")?;
    if remove && (upsert || new) {
        return Err(CommandError::new(
            ErrorCode::FailedToParse,
            "Cannot specify both upsert=true and remove=true, or new=true and remove=true",
        ));
    }
    let sort = match document_field(command, name, "sort")? {
        Some(s) if !s.is_empty() => Some(SortSpec::parse(&s)?),
        _ => None,
    };
    let fields = match document_field(command, name, "fields")? {
        Some(f) if !f.is_empty() => Some(Projection::parse(&f)?),
        _ => None,
    };
    Ok(FindAndModify {
        pinned: pinned(&filter, tenant_key, &collection)?,
        filter,
        sort,
        change,
        new,
        upsert,
        fields,
    })
}

/// A `count`.
#[derive(Clone, Debug)]
pub struct Count {
    pub filter: Document,
    pub pinned: Pinned,
    pub skip: u64,
    pub limit: Option<u64>,
}

pub fn count(command: &Document, tenant_key: &str) -> Result<Count, CommandError> {
    let collection = collection_of(command, "count")?;
    check_collation(command)?;
    check_read_concern(command)?;
    let filter = document_field(command, "count", "query")?.unwrap_or_default();
    Ok(Count {
        pinned: pinned(&filter, tenant_key, &collection)?,
        filter,
        skip: count_field(command, "count", "skip")?.unwrap_or(0),
        // A negative limit counts like a positive one.
        limit: match command.get("limit") {
            Some(Bson::Int32(l)) if *l != 0 => Some(l.unsigned_abs() as u64),
            Some(Bson::Int64(l)) if *l != 0 => Some(l.unsigned_abs()),
            Some(Bson::Double(l)) if *l != 0.0 => Some(l.abs() as u64),
            _ => None,
        },
    })
}

/// A `distinct`.
#[derive(Clone, Debug)]
pub struct Distinct {
    pub key: String,
    pub filter: Document,
    pub pinned: Pinned,
}

pub fn distinct(command: &Document, tenant_key: &str) -> Result<Distinct, CommandError> {
    let collection = collection_of(command, "distinct")?;
    check_collation(command)?;
    check_read_concern(command)?;
    let key = match command.get("key") {
        Some(Bson::String(k)) => k.clone(),
        Some(_) => return Err(CommandError::type_mismatch("distinct", "key", "string")),
        None => return Err(CommandError::missing_field("distinct", "key")),
    };
    crate::mql::path::check(&key)?;
    let filter = document_field(command, "distinct", "query")?.unwrap_or_default();
    Ok(Distinct {
        key,
        pinned: pinned(&filter, tenant_key, &collection)?,
        filter,
    })
}

/// An `aggregate` on a routed collection: its leading `$match` (which pins the tenants and is
/// what each location evaluates) and the stages the front runs on the merged documents.
#[derive(Clone, Debug)]
pub struct Aggregate {
    pub filter: Document,
    pub pinned: Pinned,
    pub stages: crate::mql::pipeline::Stages,
    /// The first batch's size (`cursor.batchSize`).
    pub batch_size: Option<u64>,
    /// Whether the stages read nothing of the documents but that they exist (`$count`, a
    /// `$group` by a constant summing constants, `$skip`, `$limit`): the locations then
    /// return ids only.
    pub counts_only: bool,
}

pub fn aggregate(command: &Document, tenant_key: &str) -> Result<Aggregate, CommandError> {
    let name = "aggregate";
    let collection = collection_of(command, name)?;
    refuse_unsupported(command, name, &["explain", "let"])?;
    check_collation(command)?;
    check_read_concern(command)?;
    let pipeline = array_field(command, name, "pipeline")?;
    if let Some(Bson::Document(first)) = pipeline.first() {
        if first.contains_key("$changeStream") {
            return Err(CommandError::new(
                ErrorCode::CommandNotSupported,
                format!(
                    "change streams on the routed collection '{collection}' are not served by the \
                     front: its documents move between locations during a migration, and a \
                     merged stream of them is not implemented; watch each location, or a \
                     collection the front does not route"
                ),
            ));
        }
    }
    let (matched, rest) = crate::mql::pipeline::split_leading_match(pipeline);
    let Some(filter) = matched.cloned() else {
        return Err(CommandError::new(
            ErrorCode::ShardKeyNotFound,
            format!(
                "an aggregation on the routed collection '{collection}' must begin with a $match \
                 that pins its tenant key '{tenant_key}': the front reads the locations of the \
                 tenants asked for, then runs the rest of the pipeline on their documents"
            ),
        ));
    };
    let stages = crate::mql::pipeline::Stages::parse(rest)?;
    let cursor = document_field(command, name, "cursor")?.ok_or_else(|| {
        CommandError::new(
            ErrorCode::FailedToParse,
            "The 'cursor' option is required, except for aggregate with the explain argument",
        )
    })?;
    Ok(Aggregate {
        pinned: pinned(&filter, tenant_key, &collection)?,
        filter,
        counts_only: !rest.is_empty() && counts_only(rest),
        stages,
        batch_size: count_field(&cursor, "aggregate.cursor", "batchSize")?,
    })
}

/// Whether stages read nothing of the documents but their number.
fn counts_only(stages: &[Bson]) -> bool {
    let constant = |v: &Bson| {
        !matches!(v, Bson::String(s) if s.starts_with('$'))
            && !matches!(v, Bson::Document(_) | Bson::Array(_))
    };
    stages.iter().all(|stage| {
        let Bson::Document(stage) = stage else {
            return false;
        };
        let Some((name, spec)) = stage.iter().next() else {
            return false;
        };
        match (name.as_str(), spec) {
            ("$skip" | "$limit" | "$count", _) => true,
            ("$group", Bson::Document(group)) => {
                group.iter().all(|(field, v)| match (field.as_str(), v) {
                    ("_id", id) => constant(id),
                    (_, Bson::Document(acc)) => acc.iter().all(|(op, arg)| match op.as_str() {
                        "$sum" => constant(arg),
                        "$count" => true,
                        _ => false,
                    }),
                    _ => false,
                })
            }
            _ => false,
        }
    })
}

// ---------------------------------------------------------------------------------------------
// Fields.

/// The collection a command names (its first field's string value).
pub fn collection_of(command: &Document, name: &str) -> Result<String, CommandError> {
    match command.get(name) {
        Some(Bson::String(c)) if !c.is_empty() => Ok(c.clone()),
        Some(Bson::String(_)) => Err(CommandError::new(
            ErrorCode::InvalidNamespace,
            "Invalid namespace specified",
        )),
        _ => Err(CommandError::new(
            ErrorCode::InvalidNamespace,
            format!(
                "collection name has invalid type {}",
                type_of(command.get(name))
            ),
        )),
    }
}

fn type_of(v: Option<&Bson>) -> &'static str {
    v.map_or("missing", crate::mql::type_name)
}

fn document_field(
    command: &Document,
    name: &str,
    field: &str,
) -> Result<Option<Document>, CommandError> {
    match command.get(field) {
        None | Some(Bson::Null) => Ok(None),
        Some(Bson::Document(d)) => Ok(Some(d.clone())),
        Some(_) => Err(CommandError::type_mismatch(name, field, "object")),
    }
}

fn required_document(
    command: &Document,
    name: &str,
    field: &str,
) -> Result<Document, CommandError> {
    document_field(command, name, field)?.ok_or_else(|| CommandError::missing_field(name, field))
}

fn array_field<'a>(
    command: &'a Document,
    name: &str,
    field: &str,
) -> Result<&'a Vec<Bson>, CommandError> {
    match command.get(field) {
        Some(Bson::Array(a)) => Ok(a),
        Some(_) => Err(CommandError::type_mismatch(name, field, "array")),
        None => Err(CommandError::missing_field(name, field)),
    }
}

fn bool_field(command: &Document, field: &str) -> Result<bool, CommandError> {
    match command.get(field) {
        None | Some(Bson::Null) => Ok(false),
        Some(Bson::Boolean(b)) => Ok(*b),
        Some(Bson::Int32(i)) => Ok(*i != 0),
        Some(Bson::Int64(i)) => Ok(*i != 0),
        Some(Bson::Double(d)) => Ok(*d != 0.0),
        Some(_) => Err(CommandError::new(
            ErrorCode::TypeMismatch,
            format!("BSON field '{field}' is the wrong type, expected type 'bool'"),
        )),
    }
}

fn ordered(command: &Document, name: &str) -> Result<bool, CommandError> {
    match command.get("ordered") {
        None => Ok(true),
        Some(Bson::Boolean(b)) => Ok(*b),
        Some(_) => Err(CommandError::type_mismatch(name, "ordered", "bool")),
    }
}

fn as_count(v: &Bson) -> Option<u64> {
    match v {
        Bson::Int32(i) if *i >= 0 => Some(*i as u64),
        Bson::Int64(i) if *i >= 0 => Some(*i as u64),
        Bson::Double(d) if *d >= 0.0 && d.fract() == 0.0 => Some(*d as u64),
        _ => None,
    }
}

/// A non-negative whole number field (`skip`, `limit`, `batchSize`), as MongoDB checks them.
fn count_field(command: &Document, name: &str, field: &str) -> Result<Option<u64>, CommandError> {
    match command.get(field) {
        None | Some(Bson::Null) => Ok(None),
        Some(v) => match v {
            Bson::Int32(_) | Bson::Int64(_) | Bson::Double(_) => {
                as_count(v).map(Some).ok_or_else(|| {
                    CommandError::new(
                        ErrorCode::BadValue,
                        format!("BSON field '{field}' value must be >= 0, actual value '{v}'"),
                    )
                })
            }
            _ => Err(CommandError::type_mismatch(name, field, "long")),
        },
    }
}

/// Refuses the options the front does not run on a routed collection, naming them.
fn refuse_unsupported(
    command: &Document,
    name: &str,
    unsupported: &[&str],
) -> Result<(), CommandError> {
    for field in unsupported {
        let set = match command.get(*field) {
            None | Some(Bson::Null) | Some(Bson::Boolean(false)) => false,
            Some(Bson::Array(a)) => !a.is_empty(),
            Some(_) => true,
        };
        if set {
            return Err(not_implemented(format!(
                "'{name}.{field}' is not supported on a routed collection by the front"
            )));
        }
    }
    Ok(())
}

/// Only the simple collation: the front's merge compares strings by their bytes.
fn check_collation(command: &Document) -> Result<(), CommandError> {
    match command.get("collation") {
        None | Some(Bson::Null) => Ok(()),
        Some(Bson::Document(c)) if c.get_str("locale") == Ok("simple") => Ok(()),
        Some(_) => Err(not_implemented(
            "a collation other than {locale: \"simple\"} is not supported on a routed collection \
             by the front: it merges the locations' documents comparing strings by their bytes",
        )),
    }
}

fn check_read_concern(command: &Document) -> Result<(), CommandError> {
    match command
        .get_document("readConcern")
        .ok()
        .and_then(|r| r.get_str("level").ok())
    {
        Some("snapshot") => Err(not_implemented(
            "read concern 'snapshot' is not supported on a routed collection by the front: a read \
             of several locations has no common snapshot",
        )),
        _ => Ok(()),
    }
}

fn not_implemented(message: impl Into<String>) -> CommandError {
    CommandError::passed(238, "NotImplemented", message)
}

#[cfg(test)]
mod tests {
    use super::*;
    use bson::doc;

    #[test]
    fn a_filter_must_pin_the_tenant_and_may_pin_one_id() {
        let p = pinned(&doc! {"customerId": "c1", "_id": 7}, "customerId", "orders").unwrap();
        assert_eq!(p.one(), Some((Bson::from("c1"), Bson::from(7))));
        let p = pinned(
            &doc! {"customerId": {"$in": ["a", "b"]}, "total": {"$gt": 3}},
            "customerId",
            "orders",
        )
        .unwrap();
        assert_eq!(p.tenants.len(), 2);
        assert_eq!(p.id, None);
        assert_eq!(p.one(), None);
        let e = pinned(&doc! {"total": {"$gt": 3}}, "customerId", "orders").unwrap_err();
        assert_eq!(e.code, ErrorCode::ShardKeyNotFound);
        assert!(e.message.contains("'customerId'"), "{e}");
        let e = pinned(
            &doc! {"$or": [{"customerId": "a"}, {"total": 1}]},
            "customerId",
            "orders",
        )
        .unwrap_err();
        assert_eq!(e.code, ErrorCode::ShardKeyNotFound);
    }

    #[test]
    fn a_find_is_planned_whole_before_any_read() {
        let f = find(
            &doc! {"find": "orders", "filter": {"customerId": "c1"}, "sort": {"total": -1},
            "projection": {"total": 1}, "skip": 2, "limit": 5, "batchSize": 3},
            "customerId",
        )
        .unwrap();
        assert_eq!((f.skip, f.limit, f.batch_size), (2, Some(5), Some(3)));
        assert!(f.sort.is_some() && f.projection.is_some());
        for (bad, code) in [
            (
                doc! {"find": "orders", "filter": {"customerId": "c1"}, "tailable": true},
                238,
            ),
            (
                doc! {"find": "orders", "filter": {"customerId": "c1"}, "collation": {"locale": "fr"}},
                238,
            ),
            (
                doc! {"find": "orders", "filter": {"customerId": "c1"}, "skip": -1},
                2,
            ),
            (
                doc! {"find": "orders", "filter": {"customerId": "c1"}, "sort": {"a": 2}},
                15975,
            ),
            (
                doc! {"find": "orders", "filter": {"customerId": "c1"}, "projection": {"a": 1, "b": 0}},
                31254,
            ),
            (doc! {"find": "orders"}, 61),
            (doc! {"find": "orders", "filter": 3}, 14),
        ] {
            let e = find(&bad, "customerId").unwrap_err();
            assert_eq!(e.number(), code, "{bad}: {e}");
        }
        let simple = doc! {"find": "orders", "filter": {"customerId": "c1"}, "collation": {"locale": "simple"}};
        assert!(find(&simple, "customerId").is_ok());
    }

    #[test]
    fn each_write_statement_is_planned_or_refused_on_its_own() {
        let s = update(
            &doc! {"update": "orders", "ordered": false, "updates": [
                {"q": {"customerId": "c1", "_id": 1}, "u": {"$inc": {"n": 1}}},
                {"q": {"total": 3}, "u": {"$set": {"a": 1}}},
                {"q": {"customerId": "c1"}, "u": {"a": 1}, "multi": true},
                {"q": {"customerId": "c1"}, "u": [{"$set": {"a": 1}}]},
                {"q": {"customerId": "c1"}, "u": {"$set": {"a": 1}}, "arrayFilters": [{"x": 1}]},
                {"q": {"customerId": "c1"}, "u": {"$set": {"a": 1}, "b": 2}},
            ]},
            "customerId",
        )
        .unwrap();
        assert!(!s.ordered);
        let codes: Vec<Option<i32>> = s
            .statements
            .iter()
            .map(|r| r.as_ref().err().map(|e| e.number()))
            .collect();
        assert_eq!(
            codes,
            vec![None, Some(61), Some(9), Some(238), Some(238), Some(9)]
        );
        // A statement without `u` is malformed: the whole command fails.
        let e = update(
            &doc! {"update": "orders", "updates": [{"q": {}}]},
            "customerId",
        )
        .err()
        .unwrap();
        assert_eq!(e.code, ErrorCode::Location40414);

        let d = delete(
            &doc! {"delete": "orders", "deletes": [
                {"q": {"customerId": "c1", "_id": 1}, "limit": 1},
                {"q": {"customerId": "c1", "total": {"$lt": 3}}, "limit": 0},
            ]},
            "customerId",
        )
        .unwrap();
        let plans: Vec<bool> = d
            .statements
            .iter()
            .map(|r| r.as_ref().unwrap().just_one)
            .collect();
        assert_eq!(plans, vec![true, false]);
        let e = delete(
            &doc! {"delete": "orders", "deletes": [{"q": {}, "limit": 2}]},
            "customerId",
        )
        .err()
        .unwrap();
        assert_eq!(e.code, ErrorCode::FailedToParse);

        let i = insert(
            &doc! {"insert": "orders", "documents": [{"customerId": "c1"}, {"total": 1}]},
            "customerId",
        )
        .unwrap();
        assert!(i.statements[0].is_ok());
        assert_eq!(
            i.statements[1].as_ref().unwrap_err().code,
            ErrorCode::ShardKeyNotFound
        );
    }

    #[test]
    fn find_and_modify_says_what_it_writes_and_returns() {
        let f = find_and_modify(
            &doc! {"findAndModify": "jobs", "query": {"customerId": "c1", "state": "ready"},
            "sort": {"priority": -1}, "update": {"$set": {"state": "taken"}}, "new": true},
            "customerId",
        )
        .unwrap();
        assert!(f.new && !f.upsert);
        assert_eq!(
            f.change,
            Some(Change::Operators(doc! {"$set": {"state": "taken"}}))
        );
        let r = find_and_modify(
            &doc! {"findAndModify": "jobs", "query": {"customerId": "c1"}, "remove": true},
            "customerId",
        )
        .unwrap();
        assert_eq!(r.change, None);
        for bad in [
            doc! {"findAndModify": "jobs", "query": {"customerId": "c1"}},
            doc! {"findAndModify": "jobs", "query": {"customerId": "c1"}, "remove": true, "update": {"$set": {"a": 1}}},
            doc! {"findAndModify": "jobs", "query": {"customerId": "c1"}, "remove": true, "new": true},
        ] {
            assert_eq!(
                find_and_modify(&bad, "customerId").unwrap_err().code,
                ErrorCode::FailedToParse,
                "{bad}"
            );
        }
    }

    #[test]
    fn an_aggregation_begins_with_the_tenant_s_match_and_says_when_it_only_counts() {
        let count = aggregate(
            &doc! {"aggregate": "orders", "cursor": {}, "pipeline": [
                {"$match": {"customerId": "c1"}}, {"$skip": 1},
                {"$group": {"_id": 1, "n": {"$sum": 1}}},
            ]},
            "customerId",
        )
        .unwrap();
        assert!(count.counts_only);
        let sums = aggregate(
            &doc! {"aggregate": "orders", "cursor": {"batchSize": 5}, "pipeline": [
                {"$match": {"customerId": "c1"}}, {"$group": {"_id": "$state", "t": {"$sum": "$total"}}},
            ]},
            "customerId",
        )
        .unwrap();
        assert!(!sums.counts_only);
        assert_eq!(sums.batch_size, Some(5));
        let e = aggregate(
            &doc! {"aggregate": "orders", "cursor": {}, "pipeline": [{"$sort": {"a": 1}}]},
            "customerId",
        )
        .unwrap_err();
        assert_eq!(e.code, ErrorCode::ShardKeyNotFound);
        let e = aggregate(
            &doc! {"aggregate": "orders", "cursor": {}, "pipeline": [{"$changeStream": {}}]},
            "customerId",
        )
        .unwrap_err();
        assert_eq!(e.code, ErrorCode::CommandNotSupported);
        let e = aggregate(
            &doc! {"aggregate": "orders", "cursor": {}, "pipeline": [{"$match": {"customerId": "c1"}}, {"$lookup": {}}]},
            "customerId",
        )
        .unwrap_err();
        assert_eq!(e.number(), 238, "{e}");
    }
}

//! Routing version spec files: the YAML an operator writes to describe a new
//! routing version, and the errors that point back into it.
//!
//! This is the only module that reads YAML. It turns a spec into a
//! [`RoutingVersion`] (version 0; the store numbers it) and reports problems as
//! `file:line:column: path: message`, so that an operator editing a spec for a
//! production migration can go straight to the offending line. Syntax and type
//! errors come from `serde_yaml` with their position; problems found later (by
//! [`RoutingVersion::validate`] or while converting) carry a field path, which a
//! small locator maps back to the line and column of that field in the text.
//!
//! # Format
//!
//! ```yaml
//! # orders v2: the hot customer gets 16 buckets
//! tenant_key: customerId
//! id_field: _id              # optional, default _id
//! layout: hashed             # hashed | fanout | tenant_table
//! virtual_buckets: 1024      # optional, default 1024; fixed for a collection
//! default_buckets: 1         # optional, default 1
//! tenant_buckets:            # optional
//!   - tenant: cust-0001
//!     buckets: 16
//! routing_field: bucket      # optional
//! placement:
//!   - vbuckets: [0, 256]     # half-open [start, end)
//!     shard: s1
//!   - vbuckets: [256, 1024]
//!     shard: s2
//! collections:               # optional per-shard collection name
//!   s2: orders_v2
//! ```
//!
//! A `fanout` layout (a source not made by reshard; a document may be on any of
//! the shards) takes `shards: [s1, s2]`. A `tenant_table` layout takes
//! `tenants: [{tenant: cust-1, shard: s1}, …]` and an optional `default_shard`.
//! Fields of another layout are an error.
//!
//! A tenant is written as a YAML string (a string key), a YAML integer (an int
//! key), or a one-entry mapping: `{oid: <24 hex digits>}`, `{uuid: <uuid>}` or
//! `{binary: <hex>}` (subtype 0; add `subtype: <n>` for another subtype). Quote
//! string tenants that YAML would read as numbers or booleans (`"0042"`, `"true"`).

pub mod playbook;

use std::collections::{BTreeMap, HashMap};
use std::fmt;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::routing::{
    KeyValue, Layout, PlacementRange, RoutingVersion, TenantBuckets, TenantShard,
    ValidationContext, DEFAULT_VIRTUAL_BUCKETS, GENERIC_BINARY_SUBTYPE,
};

/// One problem with a spec file, located as precisely as possible.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SpecError {
    /// The file name, as given by the caller.
    pub file: String,
    /// 1-based line, when known.
    pub line: Option<usize>,
    /// 1-based column, when known.
    pub column: Option<usize>,
    /// The field path, like `placement[1].shard`; empty when unknown.
    pub path: String,
    /// What is wrong.
    pub message: String,
}

/// Prints `file:line:column: path: message`, leaving out the parts that are unknown.
impl fmt::Display for SpecError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.file)?;
        if let Some(line) = self.line {
            write!(f, ":{line}")?;
            if let Some(column) = self.column {
                write!(f, ":{column}")?;
            }
        }
        if !self.path.is_empty() {
            write!(f, ": {}", self.path)?;
        }
        write!(f, ": {}", self.message)
    }
}

impl std::error::Error for SpecError {}

const HASHED_FIELDS: &[&str] = &[
    "virtual_buckets",
    "default_buckets",
    "tenant_buckets",
    "routing_field",
    "placement",
];
const FANOUT_FIELDS: &[&str] = &["shards"];
const TENANT_TABLE_FIELDS: &[&str] = &["tenants", "default_shard"];
const TENANT_FORMS: &str =
    "a string, an integer, {oid: <24 hex digits>}, {uuid: <uuid>} or {binary: <hex>}";

/// A routing version as written in a spec file or in a playbook's `source` / `target`: the
/// fields before conversion (see the module docs).
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields, expecting = "a mapping of routing version fields")]
pub struct VersionSpec {
    /// The document field that routes (the tenant key), e.g. `customerId`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    tenant_key: Option<String>,
    /// The id field (default `_id`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    id_field: Option<String>,
    /// `hashed`, `fanout` or `tenant_table`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("enum" = ["hashed", "fanout", "tenant_table"]))]
    layout: Option<String>,
    /// V: the number of virtual buckets (default 1024), fixed for a collection.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    virtual_buckets: Option<u32>,
    /// Buckets of a tenant without an override (default 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    default_buckets: Option<u32>,
    /// Per-tenant bucket counts (hot tenants).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    tenant_buckets: Option<Vec<RawTenantBuckets>>,
    /// A field every document written in this layout carries its sub-bucket in.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    routing_field: Option<String>,
    /// Half-open vbucket ranges covering `[0, V)` exactly once, each on a shard.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    placement: Option<Vec<RawPlacement>>,
    /// Per-shard collection names (default: the collection's name).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    collections: Option<BTreeMap<String, String>>,
    /// `fanout`: the shards a document may be on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    shards: Option<Vec<String>>,
    /// `tenant_table`: tenant to shard.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    tenants: Option<Vec<RawTenantShard>>,
    /// `tenant_table`: the shard of tenants not in the table.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    default_shard: Option<String>,
}

type RawSpec = VersionSpec;

/// The forms a tenant is written in (for the JSON Schema; the spec reads them from YAML).
#[allow(dead_code)]
#[derive(JsonSchema)]
#[serde(untagged)]
enum TenantForm {
    /// A string key.
    String(String),
    /// An integer key.
    Int(i64),
    /// An ObjectId, 24 hex digits.
    ObjectId { oid: String },
    /// A UUID.
    Uuid { uuid: String },
    /// Binary data in hex (subtype 0 unless given).
    Binary {
        binary: String,
        #[serde(default)]
        subtype: Option<u8>,
    },
}

impl RawSpec {
    /// The layout-specific fields present in the spec.
    fn present_layout_fields(&self) -> Vec<&'static str> {
        let present = [
            ("virtual_buckets", self.virtual_buckets.is_some()),
            ("default_buckets", self.default_buckets.is_some()),
            ("tenant_buckets", self.tenant_buckets.is_some()),
            ("routing_field", self.routing_field.is_some()),
            ("placement", self.placement.is_some()),
            ("shards", self.shards.is_some()),
            ("tenants", self.tenants.is_some()),
            ("default_shard", self.default_shard.is_some()),
        ];
        present
            .into_iter()
            .filter_map(|(name, is_present)| is_present.then_some(name))
            .collect()
    }
}

#[derive(Clone, Debug, PartialEq, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields, expecting = "a mapping with tenant and buckets")]
struct RawTenantBuckets {
    #[schemars(with = "TenantForm")]
    tenant: serde_yaml::Value,
    #[schemars(range(min = 1))]
    buckets: u32,
}

#[derive(Clone, Debug, PartialEq, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields, expecting = "a mapping with vbuckets and shard")]
struct RawPlacement {
    /// `[start, end]`, half-open.
    #[schemars(length(min = 2, max = 2))]
    vbuckets: Vec<u32>,
    shard: String,
}

#[derive(Clone, Debug, PartialEq, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields, expecting = "a mapping with tenant and shard")]
struct RawTenantShard {
    #[schemars(with = "TenantForm")]
    tenant: serde_yaml::Value,
    shard: String,
}

/// Problems found while converting, by field path; located at the end.
#[derive(Default)]
struct Problems(Vec<(String, String)>);

impl Problems {
    fn add(&mut self, path: impl Into<String>, message: impl Into<String>) {
        self.0.push((path.into(), message.into()));
    }
}

/// A version spec as the text stored with a version registered from a playbook.
pub fn spec_text(spec: &VersionSpec) -> String {
    serde_yaml::to_string(spec).unwrap_or_default()
}

/// Parses a spec file into version 0 of `collection`.
///
/// `file` only names the file in errors. Every conversion problem is reported;
/// a YAML syntax or type error stops at the first one. The result is not yet
/// validated against the registered shards; see [`check_version_spec`].
pub fn parse_version_spec(
    file: &str,
    text: &str,
    collection: &str,
) -> Result<RoutingVersion, Vec<SpecError>> {
    let locator = YamlLocator::new(text);
    let located = |problems: Problems| -> Vec<SpecError> {
        problems
            .0
            .into_iter()
            .map(|(path, message)| locator.error(file, path, message))
            .collect()
    };

    if matches!(
        serde_yaml::from_str::<serde_yaml::Value>(text),
        Ok(serde_yaml::Value::Null)
    ) {
        let mut problems = Problems::default();
        problems.add(
            "",
            "the spec is empty; it needs at least tenant_key, layout and the fields of that layout",
        );
        return Err(located(problems));
    }
    let raw: RawSpec =
        serde_yaml::from_str(text).map_err(|error| vec![yaml_error(file, &error)])?;
    let mut problems = Problems::default();
    match version_from_spec(&raw, collection, "", &mut problems) {
        Some(version) if problems.0.is_empty() => Ok(version),
        _ => Err(located(problems)),
    }
}

/// Converts a version spec into version 0 of `collection`, adding every problem to
/// `problems` with its field path under `prefix` (`""` for a spec file, `target.` in a
/// playbook).
fn version_from_spec(
    raw: &VersionSpec,
    collection: &str,
    prefix: &str,
    outer: &mut Problems,
) -> Option<RoutingVersion> {
    let mut problems = Problems::default();
    let version = version_problems(raw, collection, &mut problems);
    for (path, message) in problems.0 {
        outer.add(format!("{prefix}{path}"), message);
    }
    version
}

fn version_problems(
    raw: &VersionSpec,
    collection: &str,
    problems: &mut Problems,
) -> Option<RoutingVersion> {
    let tenant_key = raw.tenant_key.clone().unwrap_or_else(|| {
        problems.add(
            "tenant_key",
            "missing; name the document field that routes today, e.g. tenant_key: customerId",
        );
        String::new()
    });
    let id_field = raw
        .id_field
        .clone()
        .unwrap_or_else(|| crate::routing::DEFAULT_ID_FIELD.to_owned());

    let layout = match raw.layout.as_deref() {
        None => {
            problems.add("layout", "missing; choose hashed, fanout or tenant_table");
            None
        }
        Some("hashed") => Some(hashed_layout(raw, problems)),
        Some("fanout") => Some(fanout_layout(raw, problems)),
        Some("tenant_table") => Some(tenant_table_layout(raw, problems)),
        Some(other) => {
            problems.add(
                "layout",
                format!("unknown layout {other:?}; choose hashed, fanout or tenant_table"),
            );
            None
        }
    };
    if let Some(kind) = raw.layout.as_deref() {
        let own: &[&str] = match kind {
            "hashed" => HASHED_FIELDS,
            "fanout" => FANOUT_FIELDS,
            "tenant_table" => TENANT_TABLE_FIELDS,
            _ => &[],
        };
        if !own.is_empty() {
            for field in raw.present_layout_fields() {
                if !own.contains(&field) {
                    problems.add(
                        field,
                        format!(
                            "{field} does not belong to layout {kind}; {kind} takes {}",
                            own.join(", ")
                        ),
                    );
                }
            }
        }
    }

    match layout {
        Some(layout) if problems.0.is_empty() => Some(
            RoutingVersion::new(collection, tenant_key, layout)
                .with_id_field(id_field)
                .with_collections(raw.collections.clone().unwrap_or_default()),
        ),
        _ => None,
    }
}

/// Validates a parsed spec against the registered shards and the collection's
/// earlier versions, pointing every problem at its place in `text`.
pub fn check_version_spec(
    file: &str,
    text: &str,
    version: &RoutingVersion,
    ctx: &ValidationContext<'_>,
) -> Result<(), Vec<SpecError>> {
    version.validate(ctx).map_err(|errors| {
        let locator = YamlLocator::new(text);
        errors
            .into_iter()
            .map(|error| locator.error(file, error.path, error.message))
            .collect()
    })
}

fn hashed_layout(raw: &RawSpec, problems: &mut Problems) -> Layout {
    let tenant_buckets = raw
        .tenant_buckets
        .iter()
        .flatten()
        .enumerate()
        .filter_map(|(index, entry)| {
            let tenant = tenant_key(
                &entry.tenant,
                &format!("tenant_buckets[{index}].tenant"),
                problems,
            )?;
            Some(TenantBuckets {
                tenant,
                buckets: entry.buckets,
            })
        })
        .collect();
    let placement = match &raw.placement {
        None => {
            problems.add(
                "placement",
                "missing; a hashed layout places vbuckets on shards, e.g. \
                 placement: [{vbuckets: [0, 1024], shard: s1}]",
            );
            Vec::new()
        }
        Some(ranges) => ranges
            .iter()
            .enumerate()
            .filter_map(|(index, range)| match range.vbuckets[..] {
                [start, end] => Some(PlacementRange {
                    start,
                    end,
                    shard: range.shard.clone(),
                }),
                _ => {
                    problems.add(
                        format!("placement[{index}].vbuckets"),
                        format!(
                            "expected [start, end] (half-open), got {} number(s)",
                            range.vbuckets.len()
                        ),
                    );
                    None
                }
            })
            .collect(),
    };
    Layout::Hashed {
        virtual_buckets: raw.virtual_buckets.unwrap_or(DEFAULT_VIRTUAL_BUCKETS),
        default_buckets: raw.default_buckets.unwrap_or(1),
        tenant_buckets,
        placement,
        routing_field: raw.routing_field.clone(),
    }
}

fn fanout_layout(raw: &RawSpec, problems: &mut Problems) -> Layout {
    let shards = raw.shards.clone().unwrap_or_else(|| {
        problems.add(
            "shards",
            "missing; a fanout layout lists the shards to look in, e.g. shards: [s1, s2]",
        );
        Vec::new()
    });
    Layout::Fanout { shards }
}

fn tenant_table_layout(raw: &RawSpec, problems: &mut Problems) -> Layout {
    let tenants = raw
        .tenants
        .iter()
        .flatten()
        .enumerate()
        .filter_map(|(index, row)| {
            let tenant = tenant_key(&row.tenant, &format!("tenants[{index}].tenant"), problems)?;
            Some(TenantShard {
                tenant,
                shard: row.shard.clone(),
            })
        })
        .collect();
    Layout::TenantTable {
        tenants,
        default_shard: raw.default_shard.clone(),
    }
}

/// Reads a tenant written in the spec (see the module docs for the forms).
fn tenant_key(value: &serde_yaml::Value, path: &str, problems: &mut Problems) -> Option<KeyValue> {
    use serde_yaml::Value;
    let mut fail = |message: String| {
        problems.add(path, message);
        None
    };
    match value {
        Value::String(text) => Some(KeyValue::String(text.clone())),
        Value::Number(number) => match number.as_i64() {
            Some(int) => Some(KeyValue::Int(int)),
            None => fail(format!(
                "{number} is not a 64-bit integer; a tenant is {TENANT_FORMS} (quote it to make it a string)"
            )),
        },
        Value::Mapping(mapping) => {
            if let Some((key, number)) = ["oid", "uuid", "binary"]
                .iter()
                .find_map(|key| Some((key, mapping.get(*key).filter(|v| v.is_number())?)))
            {
                return fail(format!(
                    "YAML reads {} as a number; write the {key} value in quotes",
                    yaml_inline(number)
                ));
            }
            let entry = |key: &str| mapping.get(key).and_then(Value::as_str);
            let known = ["oid", "uuid", "binary", "subtype"];
            if let Some(other) = mapping.keys().find(|key| !key.as_str().is_some_and(|key| known.contains(&key))) {
                return fail(format!(
                    "unexpected key {} in a tenant; a tenant is {TENANT_FORMS}",
                    yaml_inline(other)
                ));
            }
            let parsed = match (entry("oid"), entry("uuid"), entry("binary"), mapping.len()) {
                (Some(oid), None, None, 1) => KeyValue::parse_cli(&format!("oid:{oid}")),
                (None, Some(uuid), None, 1) => KeyValue::parse_cli(&format!("uuid:{uuid}")),
                (None, None, Some(bytes), _) => {
                    let subtype = match mapping.get("subtype") {
                        None => Some(GENERIC_BINARY_SUBTYPE),
                        Some(subtype) => subtype.as_u64().and_then(|s| u8::try_from(s).ok()),
                    };
                    match subtype {
                        Some(subtype) => KeyValue::parse_cli(&format!("bin:{subtype}:{bytes}")),
                        None => {
                            return fail("subtype must be an integer between 0 and 255".to_owned())
                        }
                    }
                }
                _ => return fail(format!("a tenant is {TENANT_FORMS}")),
            };
            match parsed {
                Ok(key) => Some(key),
                Err(crate::routing::RoutingError::InvalidCliKey { reason, .. }) => {
                    fail(format!("{reason}; a tenant is {TENANT_FORMS}"))
                }
                Err(other) => fail(other.to_string()),
            }
        }
        other => fail(format!(
            "{} is not a tenant; a tenant is {TENANT_FORMS} (quote it to make it a string)",
            yaml_inline(other)
        )),
    }
}

/// A YAML value on one line, for messages.
fn yaml_inline(value: &serde_yaml::Value) -> String {
    match value {
        serde_yaml::Value::Null => "null".to_owned(),
        other => serde_yaml::to_string(other)
            .map(|text| text.trim_end().replace('\n', " "))
            .unwrap_or_else(|_| "this value".to_owned()),
    }
}

/// Turns a `serde_yaml` error into a spec error. serde_yaml puts the path in
/// front of the message (`placement[0]: missing field ...`) and the position
/// behind it (`at line 3 column 5`); both are split off into their own fields.
fn yaml_error(file: &str, error: &serde_yaml::Error) -> SpecError {
    let mut message = error.to_string();
    let (line, column) = match error.location() {
        Some(location) => {
            let suffix = format!(" at line {} column {}", location.line(), location.column());
            if let Some(at) = message.find(&suffix) {
                message.replace_range(at..at + suffix.len(), "");
            }
            (Some(location.line()), Some(location.column()))
        }
        None => (None, None),
    };
    let mut path = String::new();
    if let Some((prefix, rest)) = message.split_once(": ") {
        if !prefix.is_empty() && !prefix.contains(char::is_whitespace) {
            path = prefix.to_owned();
            message = rest.to_owned();
        }
    }
    SpecError {
        file: file.to_owned(),
        line,
        column,
        path,
        message,
    }
}

/// Maps field paths (`placement[1].shard`) to 1-based line and column in YAML
/// text. It understands block mappings and sequences (including `- key: value`
/// items and sequences indented like their parent key); values in flow style
/// (`[0, 256]`, `{oid: …}`) are located at their key. A path that is not found
/// is located at its longest prefix that is.
struct YamlLocator {
    positions: HashMap<String, (usize, usize)>,
}

/// An open block mapping or sequence while scanning.
struct Frame {
    indent: usize,
    path: String,
    is_sequence: bool,
    next_index: usize,
}

impl YamlLocator {
    fn new(text: &str) -> Self {
        let mut locator = YamlLocator {
            positions: HashMap::new(),
        };
        let mut stack = vec![Frame {
            indent: 0,
            path: String::new(),
            is_sequence: false,
            next_index: 0,
        }];
        // A key with no value on its line, whose block follows: (path, indent).
        let mut pending: Option<(String, usize)> = None;
        for (line_index, raw_line) in text.lines().enumerate() {
            let line = strip_comment(raw_line).trim_end();
            let indent = line.len() - line.trim_start_matches(' ').len();
            let content = &line[indent..];
            if content.is_empty() || content.starts_with("---") || content == "..." {
                continue;
            }
            let is_item = is_sequence_item(content);
            if let Some((path, key_indent)) = pending.take() {
                if indent > key_indent || (indent == key_indent && is_item) {
                    stack.push(Frame {
                        indent,
                        path,
                        is_sequence: is_item,
                        next_index: 0,
                    });
                }
            }
            while stack.len() > 1 {
                let top = &stack[stack.len() - 1];
                if top.indent > indent || (top.indent == indent && top.is_sequence != is_item) {
                    stack.pop();
                } else {
                    break;
                }
            }
            locator.scan_node(&mut stack, &mut pending, line_index + 1, indent, content);
        }
        locator
    }

    /// Records the key or item at `column` (0-based) and opens what it starts.
    fn scan_node(
        &mut self,
        stack: &mut Vec<Frame>,
        pending: &mut Option<(String, usize)>,
        line: usize,
        column: usize,
        content: &str,
    ) {
        let frame = stack.last_mut().expect("the root frame is never popped");
        if is_sequence_item(content) {
            if !frame.is_sequence {
                return;
            }
            let path = format!("{}[{}]", frame.path, frame.next_index);
            frame.next_index += 1;
            self.record(&path, line, column);
            let rest = content[1..].trim_start_matches(' ');
            let rest_column = column + (content.len() - rest.len());
            if rest.is_empty() {
                *pending = Some((path, column));
            } else if is_sequence_item(rest) || split_key(rest).is_some() {
                stack.push(Frame {
                    indent: rest_column,
                    path,
                    is_sequence: is_sequence_item(rest),
                    next_index: 0,
                });
                self.scan_node(stack, pending, line, rest_column, rest);
            }
        } else if let Some((key, value)) = split_key(content) {
            if frame.is_sequence {
                return;
            }
            let path = if frame.path.is_empty() {
                key.to_owned()
            } else {
                format!("{}.{key}", frame.path)
            };
            self.record(&path, line, column);
            if value.is_empty() {
                *pending = Some((path, column));
            }
        }
    }

    fn record(&mut self, path: &str, line: usize, column: usize) {
        self.positions
            .entry(path.to_owned())
            .or_insert((line, column + 1));
    }

    /// The position of `path`, or of its longest located prefix.
    fn position(&self, path: &str) -> Option<(usize, usize)> {
        let mut path = path;
        loop {
            if let Some(position) = self.positions.get(path) {
                return Some(*position);
            }
            let cut = path.rfind(['.', '['])?;
            path = &path[..cut];
        }
    }

    fn error(&self, file: &str, path: String, message: String) -> SpecError {
        let position = self.position(&path);
        SpecError {
            file: file.to_owned(),
            line: position.map(|(line, _)| line),
            column: position.map(|(_, column)| column),
            path,
            message,
        }
    }
}

fn is_sequence_item(content: &str) -> bool {
    content == "-" || content.starts_with("- ")
}

/// Splits `key: value` (or `key:`) into key and value; `None` for anything
/// that is not a mapping entry (scalars, flow collections).
fn split_key(content: &str) -> Option<(&str, &str)> {
    let first = content.chars().next()?;
    if matches!(first, '[' | '{' | '|' | '>' | '&' | '*' | '!') {
        return None;
    }
    let (key, rest) = if first == '"' || first == '\'' {
        let close = content[1..].find(first)? + 1;
        (&content[1..close], &content[close + 1..])
    } else {
        let colon = content
            .match_indices(':')
            .map(|(at, _)| at)
            .find(|&at| content[at + 1..].is_empty() || content[at + 1..].starts_with(' '))?;
        (content[..colon].trim_end(), &content[colon..])
    };
    let value = rest.strip_prefix(':')?;
    if !(value.is_empty() || value.starts_with(' ')) {
        return None;
    }
    Some((key, value.trim()))
}

/// The line without its comment (`#` at the start or after a space, outside quotes).
fn strip_comment(line: &str) -> &str {
    let mut quote: Option<char> = None;
    let mut previous = ' ';
    for (at, ch) in line.char_indices() {
        match quote {
            Some(open) if ch == open => quote = None,
            Some(_) => {}
            None if ch == '"' || ch == '\'' => quote = Some(ch),
            None if ch == '#' && previous.is_whitespace() => return &line[..at],
            None => {}
        }
        previous = ch;
    }
    line
}

#[cfg(test)]
mod tests;

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
mod tests {
    use std::collections::BTreeSet;

    use super::*;
    use crate::routing::Location;

    const ORDERS_V2: &str = "\
# orders v2: the hot customer gets 16 buckets
tenant_key: customerId
id_field: _id              # optional, default _id
layout: hashed             # hashed | fanout | tenant_table
virtual_buckets: 1024
default_buckets: 1
tenant_buckets:
  - tenant: cust-0001
    buckets: 16
  - tenant: 42
    buckets: 4
  - tenant: {oid: 650f1a2b3c4d5e6f708192a3}
    buckets: 2
  - tenant: {uuid: 123e4567-e89b-12d3-a456-426614174000}
    buckets: 2
  - tenant: {binary: 00ff}
    buckets: 2
routing_field: bucket
placement:
  - vbuckets: [0, 256]     # half-open [start, end)
    shard: s1
  - vbuckets: [256, 1024]
    shard: s2
collections:
  s2: orders_v2
";

    fn shards() -> BTreeSet<String> {
        ["s1", "s2", "s3"].map(String::from).into()
    }

    fn messages(errors: &[SpecError]) -> Vec<String> {
        errors.iter().map(ToString::to_string).collect()
    }

    fn parse_errors(text: &str) -> Vec<String> {
        messages(&parse_version_spec("v2.yaml", text, "orders").unwrap_err())
    }

    #[test]
    fn parses_the_documented_example() {
        let version = parse_version_spec("v2.yaml", ORDERS_V2, "orders").unwrap();
        assert_eq!(version.version, 0);
        assert_eq!(version.collection, "orders");
        assert_eq!(version.tenant_key, "customerId");
        assert_eq!(version.id_field, "_id");
        assert_eq!(version.virtual_buckets(), Some(1024));
        assert_eq!(version.routing_field(), Some("bucket"));
        assert_eq!(
            version.buckets_of(&KeyValue::String("cust-0001".into())),
            16
        );
        assert_eq!(version.buckets_of(&KeyValue::Int(42)), 4);
        assert_eq!(
            version.buckets_of(&KeyValue::parse_cli("oid:650f1a2b3c4d5e6f708192a3").unwrap()),
            2
        );
        assert_eq!(
            version.buckets_of(
                &KeyValue::parse_cli("uuid:123e4567-e89b-12d3-a456-426614174000").unwrap()
            ),
            2
        );
        assert_eq!(
            version.buckets_of(&KeyValue::parse_cli("hex:00ff").unwrap()),
            2
        );
        assert_eq!(
            version.locations(),
            vec![
                Location::new("s1", "orders"),
                Location::new("s2", "orders_v2")
            ]
        );
        let shards = shards();
        let ctx = ValidationContext {
            registered_shards: &shards,
            previous_virtual_buckets: Some(1024),
        };
        assert_eq!(
            check_version_spec("v2.yaml", ORDERS_V2, &version, &ctx),
            Ok(())
        );
    }

    #[test]
    fn parses_fanout_and_tenant_table() {
        let fanout = parse_version_spec(
            "v1.yaml",
            "tenant_key: customerId\nlayout: fanout\nshards: [s1, s2]\n",
            "orders",
        )
        .unwrap();
        assert_eq!(
            fanout.layout(),
            &Layout::Fanout {
                shards: vec!["s1".into(), "s2".into()]
            }
        );
        let table = parse_version_spec(
            "v1.yaml",
            "tenant_key: customerId\nid_field: orderId\nlayout: tenant_table\n\
             tenants:\n- tenant: cust-1\n  shard: s1\n- {tenant: 7, shard: s2}\ndefault_shard: s3\n",
            "orders",
        )
        .unwrap();
        assert_eq!(table.id_field, "orderId");
        assert_eq!(
            table.layout(),
            &Layout::TenantTable {
                tenants: vec![
                    TenantShard {
                        tenant: KeyValue::String("cust-1".into()),
                        shard: "s1".into()
                    },
                    TenantShard {
                        tenant: KeyValue::Int(7),
                        shard: "s2".into()
                    },
                ],
                default_shard: Some("s3".into()),
            }
        );
    }

    #[test]
    fn defaults_apply() {
        let version = parse_version_spec(
            "v.yaml",
            "tenant_key: t\nlayout: hashed\nplacement:\n- vbuckets: [0, 1024]\n  shard: s1\n",
            "c",
        )
        .unwrap();
        assert_eq!(version.id_field, "_id");
        assert_eq!(version.virtual_buckets(), Some(1024));
        assert_eq!(version.buckets_of(&KeyValue::Int(1)), 1);
        assert_eq!(version.routing_field(), None);
    }

    #[test]
    fn unknown_fields_list_the_allowed_ones() {
        let errors = parse_errors("tenant_key: t\nlayout: hashed\nshardz: [s1]\n");
        assert_eq!(errors.len(), 1);
        assert!(
            errors[0]
                .starts_with("v2.yaml:3:1: unknown field `shardz`, expected one of `tenant_key`"),
            "{}",
            errors[0]
        );
        assert!(errors[0].contains("`default_shard`"), "{}", errors[0]);
    }

    #[test]
    fn type_errors_carry_path_and_position() {
        let errors = parse_errors(
            "tenant_key: t\nlayout: hashed\nplacement:\n  - vbuckets: [0, many]\n    shard: s1\n",
        );
        assert_eq!(errors.len(), 1);
        assert!(
            errors[0].starts_with("v2.yaml:4:")
                && errors[0].contains(": placement[0].vbuckets[1]: invalid type"),
            "{}",
            errors[0]
        );
        let missing =
            parse_errors("tenant_key: t\nlayout: hashed\nplacement:\n  - vbuckets: [0, 1]\n");
        assert!(
            missing[0].contains("placement[0]: missing field `shard`"),
            "{}",
            missing[0]
        );
    }

    #[test]
    fn syntax_errors_have_a_position() {
        let errors =
            parse_version_spec("v2.yaml", "tenant_key: t\n  layout: [\n", "orders").unwrap_err();
        assert_eq!(errors.len(), 1);
        assert!(errors[0].line.is_some(), "{:?}", errors[0]);
    }

    #[test]
    fn empty_and_non_mapping_specs() {
        assert_eq!(
            parse_errors("# nothing yet\n"),
            vec!["v2.yaml: the spec is empty; it needs at least tenant_key, layout and the fields of that layout"]
        );
        let errors = parse_errors("- a\n- b\n");
        assert!(
            errors[0].contains("expected a mapping of routing version fields"),
            "{}",
            errors[0]
        );
    }

    #[test]
    fn missing_and_foreign_fields_name_the_layout() {
        assert_eq!(
            parse_errors("tenant_key: t\nlayout: fanout\nshards: [s1]\nvirtual_buckets: 1024\ndefault_shard: s1\n"),
            vec![
                "v2.yaml:4:1: virtual_buckets: virtual_buckets does not belong to layout fanout; fanout takes shards",
                "v2.yaml:5:1: default_shard: default_shard does not belong to layout fanout; fanout takes shards",
            ]
        );
        assert_eq!(
            parse_errors("layout: hashed\n"),
            vec![
                "v2.yaml: tenant_key: missing; name the document field that routes today, e.g. tenant_key: customerId",
                "v2.yaml: placement: missing; a hashed layout places vbuckets on shards, e.g. placement: [{vbuckets: [0, 1024], shard: s1}]",
            ]
        );
        assert_eq!(
            parse_errors("tenant_key: t\nlayout: ring\n"),
            vec!["v2.yaml:2:1: layout: unknown layout \"ring\"; choose hashed, fanout or tenant_table"]
        );
    }

    #[test]
    fn bad_tenants_and_ranges() {
        let errors = parse_errors(
            "tenant_key: t\nlayout: hashed\ntenant_buckets:\n  - tenant: 1.5\n    buckets: 2\n  - tenant: {oid: \"12\"}\n    buckets: 2\n  - tenant: true\n    buckets: 2\n  - tenant: {md5: aa}\n    buckets: 2\n  - tenant: {binary: 12}\n    buckets: 2\nplacement:\n  - vbuckets: [0, 512, 1024]\n    shard: s1\n",
        );
        assert_eq!(errors.len(), 6, "{errors:#?}");
        assert!(
            errors[0]
                .starts_with("v2.yaml:4:5: tenant_buckets[0].tenant: 1.5 is not a 64-bit integer"),
            "{}",
            errors[0]
        );
        assert!(
            errors[1]
                .starts_with("v2.yaml:6:5: tenant_buckets[1].tenant: \"12\" is not 24 hex digits"),
            "{}",
            errors[1]
        );
        assert!(
            errors[2].starts_with("v2.yaml:8:5: tenant_buckets[2].tenant: true is not a tenant"),
            "{}",
            errors[2]
        );
        assert!(
            errors[3].starts_with("v2.yaml:10:5: tenant_buckets[3].tenant: unexpected key md5"),
            "{}",
            errors[3]
        );
        assert_eq!(
            errors[4],
            "v2.yaml:12:5: tenant_buckets[4].tenant: YAML reads 12 as a number; write the binary value in quotes"
        );
        assert_eq!(
            errors[5],
            "v2.yaml:15:5: placement[0].vbuckets: expected [start, end] (half-open), got 3 number(s)"
        );
    }

    #[test]
    fn validation_problems_point_at_their_lines() {
        let text = "\
tenant_key: customerId
layout: hashed
virtual_buckets: 2048
tenant_buckets:
  - tenant: cust-1
    buckets: 0
placement:
  - vbuckets: [0, 600]
    shard: s1
  - vbuckets: [512, 2000]
    shard: s9
collections:
  s3: orders_v3
";
        let version = parse_version_spec("v3.yaml", text, "orders").unwrap();
        let shards = shards();
        let ctx = ValidationContext {
            registered_shards: &shards,
            previous_virtual_buckets: Some(1024),
        };
        let errors = check_version_spec("v3.yaml", text, &version, &ctx).unwrap_err();
        assert_eq!(
            messages(&errors),
            vec![
                "v3.yaml:3:1: virtual_buckets: virtual_buckets is 2048 but earlier versions of this collection use 1024; V stays fixed for a collection",
                "v3.yaml:6:5: tenant_buckets[0].buckets: bucket count must be at least 1",
                "v3.yaml:11:5: placement[1].shard: unknown shard \"s9\"; registered shards: s1, s2, s3",
                "v3.yaml:10:5: placement[1].vbuckets: vbuckets [512, 600) are placed by both placement[0] and placement[1]",
                "v3.yaml:7:1: placement: vbuckets [2000, 2048) are not placed by any range",
                "v3.yaml:13:3: collections.s3: shard \"s3\" is not used by this version (it uses s1, s9)",
            ]
        );
    }

    #[test]
    fn locator_handles_block_styles() {
        let text = "\
# comment: not a key
a: 1
b:
  c: 2   # trailing comment
  d:
    - x
    - e: 3
      f: [1, 2]
    -
      g: 4
h:
- i: 5
- 'quoted key': 6
  \"j\": 7
k: \"value # not a comment\"
l: {m: 1}
";
        let locator = YamlLocator::new(text);
        let at = |path: &str| locator.position(path);
        assert_eq!(at("a"), Some((2, 1)));
        assert_eq!(at("b"), Some((3, 1)));
        assert_eq!(at("b.c"), Some((4, 3)));
        assert_eq!(at("b.d"), Some((5, 3)));
        assert_eq!(at("b.d[0]"), Some((6, 5)));
        assert_eq!(at("b.d[1]"), Some((7, 5)));
        assert_eq!(at("b.d[1].e"), Some((7, 7)));
        assert_eq!(at("b.d[1].f"), Some((8, 7)));
        assert_eq!(
            at("b.d[1].f[1]"),
            Some((8, 7)),
            "flow values fall back to their key"
        );
        assert_eq!(at("b.d[2]"), Some((9, 5)));
        assert_eq!(at("b.d[2].g"), Some((10, 7)));
        assert_eq!(at("h[0].i"), Some((12, 3)));
        assert_eq!(at("h[1].quoted key"), Some((13, 3)));
        assert_eq!(at("h[1].j"), Some((14, 3)));
        assert_eq!(at("k"), Some((15, 1)));
        assert_eq!(at("l.m"), Some((16, 1)));
        assert_eq!(at("nowhere"), None);
        assert_eq!(at("b.zzz"), Some((3, 1)));
    }

    #[test]
    fn spec_error_display_omits_unknown_parts() {
        let mut error = SpecError {
            file: "f.yaml".into(),
            line: Some(3),
            column: Some(7),
            path: "placement[0].shard".into(),
            message: "boom".into(),
        };
        assert_eq!(error.to_string(), "f.yaml:3:7: placement[0].shard: boom");
        error.column = None;
        error.path.clear();
        assert_eq!(error.to_string(), "f.yaml:3: boom");
        error.line = None;
        assert_eq!(error.to_string(), "f.yaml: boom");
    }
}

//! The shape check: a playbook's JSON form against the schema, each schema error turned into
//! a problem at its field path, in the words an operator reads (the allowed values, the
//! expected type, the fields a step takes).

use std::collections::BTreeSet;

use super::doc::{schema, STEP_KINDS};
use super::resolve::{is_duration_field, NO_STEPS};
use crate::spec::Problems;

/// Every problem of the document's shape, by the JSON Schema.
pub(super) fn shape_problems(json: &serde_json::Value) -> Problems {
    let schema = schema();
    let validator = jsonschema::validator_for(&schema).expect("the generated schema compiles");
    let mut problems = Problems::default();
    let mut seen = BTreeSet::new();
    for error in validator.iter_errors(json) {
        let path = pointer_to_path(&error.instance_path().to_string());
        let (path, message) = describe(&error, &path, json);
        if seen.insert((path.clone(), message.clone())) {
            problems.add(path, message);
        }
    }
    problems
}

/// `/steps/2/backfill` as `steps[2].backfill`.
pub(super) fn pointer_to_path(pointer: &str) -> String {
    let mut out = String::new();
    for part in pointer.split('/').skip(1) {
        let part = part.replace("~1", "/").replace("~0", "~");
        if part.parse::<usize>().is_ok() {
            out.push_str(&format!("[{part}]"));
        } else {
            if !out.is_empty() {
                out.push('.');
            }
            out.push_str(&part);
        }
    }
    out
}

pub(super) fn child(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_owned()
    } else {
        format!("{path}.{key}")
    }
}

/// A schema error as a located sentence: what is wrong and what is allowed.
pub(super) fn describe(
    error: &jsonschema::ValidationError<'_>,
    path: &str,
    json: &serde_json::Value,
) -> (String, String) {
    use jsonschema::error::ValidationErrorKind as K;
    let at = |p: &str| pointer_get(json, p);
    let found = error.instance().to_string();
    match error.kind() {
        K::AdditionalProperties { unexpected } => {
            let allowed = allowed_properties(&error.schema_path().to_string());
            let key = unexpected.first().cloned().unwrap_or_default();
            (
                child(path, &key),
                match allowed {
                    Some(a) => format!("unknown field {key:?}; allowed: {a}"),
                    None => format!("unknown field {key:?}"),
                },
            )
        }
        K::Required { property } => {
            let name = property.as_str().unwrap_or_default().to_owned();
            (
                path.to_owned(),
                format!("missing field {name:?}{}", required_hint(path, &name)),
            )
        }
        K::Enum { options } => (
            path.to_owned(),
            format!("{found} is not allowed; allowed: {}", list(options)),
        ),
        K::Constant { expected_value } => (
            path.to_owned(),
            format!("{found} is not allowed; expected {expected_value}"),
        ),
        K::Type { .. } if error.instance().is_number() && is_duration_field(path) => {
            (path.to_owned(), crate::duration::bare_number(&found))
        }
        K::Type { kind } => (
            path.to_owned(),
            format!("{found} has the wrong type; expected {}", type_names(kind)),
        ),
        K::Minimum { limit } | K::ExclusiveMinimum { limit } => (
            path.to_owned(),
            format!("{found} is too small; the least allowed is {limit}"),
        ),
        K::Maximum { limit } | K::ExclusiveMaximum { limit } => (
            path.to_owned(),
            format!("{found} is too large; the most allowed is {limit}"),
        ),
        K::MinItems { limit } | K::MaxItems { limit } if *limit == 3 => (
            path.to_owned(),
            format!("{found} needs exactly 3 numbers (cumulative percentages, the last 100)"),
        ),
        K::MinItems { .. } if path == "steps" => (path.to_owned(), NO_STEPS.to_owned()),
        K::MinItems { limit } => (
            path.to_owned(),
            format!("{found} needs at least {limit} item(s)"),
        ),
        K::MaxItems { limit } => (
            path.to_owned(),
            format!("{found} has more than {limit} item(s)"),
        ),
        K::MinLength { limit } => (
            path.to_owned(),
            format!("{found} is too short; at least {limit} character(s)"),
        ),
        K::MaxLength { limit } => (
            path.to_owned(),
            format!("{found} is too long; at most {limit} character(s)"),
        ),
        // A duration is told what the duration parser says of it (the unit to write).
        K::Pattern { .. } if is_duration_field(path) && error.instance().is_string() => {
            let text = error.instance().as_str().unwrap_or_default();
            let message = match crate::duration::parse(text) {
                Err(e) => e,
                Ok(_) => format!(
                    "{found} is not a duration; write {}",
                    crate::duration::FORMS
                ),
            };
            (path.to_owned(), message)
        }
        K::Pattern { pattern } => (
            path.to_owned(),
            format!("{found} is not allowed; it must match {pattern}"),
        ),
        K::OneOfNotValid { context } | K::AnyOf { context }
            if error.instance().is_object()
                && path.contains('.')
                && !path.starts_with("source") =>
        {
            // A short form or a long one (`advance`, `soak`): given a map, the long form's
            // own problem is the one to name (the unknown key, the missing `to`, the phase).
            let here = error.instance_path().to_string();
            let long_form = context
                .iter()
                .filter(|branch| {
                    !branch.iter().any(|e| {
                        e.instance_path().to_string() == here
                            && matches!(e.kind(), K::Type { .. } | K::Enum { .. })
                    })
                })
                .flatten()
                .next();
            match long_form {
                Some(inner) => {
                    let inner_path = pointer_to_path(&inner.instance_path().to_string());
                    describe(inner, &inner_path, json)
                }
                None => oneof_message(path, at(&here)),
            }
        }
        K::OneOfNotValid { .. } | K::OneOfMultipleValid { .. } | K::AnyOf { .. } => {
            if let Some(allowed) = branch_enums(&error.schema_path().to_string()) {
                return (
                    path.to_owned(),
                    format!("{found} is not allowed; allowed: {allowed}"),
                );
            }
            let value = at(&error.instance_path().to_string());
            oneof_message(path, value)
        }
        _ => (path.to_owned(), error.to_string()),
    }
}

/// What a `oneOf` / `anyOf` failure means where playbooks use them: a step needs exactly one
/// kind; `source` needs `version` or `spec`; `advance` and `soak` have a short and a long
/// form.
pub(super) fn oneof_message(path: &str, value: Option<&serde_json::Value>) -> (String, String) {
    let kinds = STEP_KINDS.join(", ");
    if path.starts_with("steps[") && !path.contains('.') {
        let present: Vec<&str> = value
            .and_then(|v| v.as_object())
            .map(|o| {
                STEP_KINDS
                    .iter()
                    .copied()
                    .filter(|k| o.contains_key(*k))
                    .collect()
            })
            .unwrap_or_default();
        let message = if present.is_empty() {
            format!("a step needs one of: {kinds}")
        } else {
            format!(
                "a step has exactly one kind, this one has {}; split it into steps",
                present.join(" and ")
            )
        };
        return (path.to_owned(), message);
    }
    if path == "source" {
        return (
            path.to_owned(),
            "give exactly one of version (a registered version number) or spec (a declared \
             layout)"
                .into(),
        );
    }
    if path.ends_with(".advance") {
        return (
            path.to_owned(),
            format!(
                "expected a phase or {{to: PHASE, timeout, switch_timeout}}; phases: {}",
                list(&serde_json::json!([
                    "dual_read",
                    "write_switch",
                    "new_writes",
                    "backfill",
                    "reconcile",
                    "new_reads",
                    "cleanup",
                    "completed"
                ]))
            ),
        );
    }
    if let Some(n) = value.filter(|v| v.is_number()) {
        if path.ends_with(".soak") {
            return (
                path.to_owned(),
                crate::duration::bare_number(&n.to_string()),
            );
        }
    }
    if path.ends_with(".soak") {
        return (
            path.to_owned(),
            "expected a duration (e.g. 10m) or {duration, max_findings, max_dead_letters, \
             max_router_errors, overload_for}"
                .into(),
        );
    }
    if path.ends_with(".tenant") {
        return (
            path.to_owned(),
            format!("not a tenant; a tenant is {}", crate::spec::TENANT_FORMS),
        );
    }
    (path.to_owned(), "does not match any allowed form".into())
}

/// The values allowed by the enums among the branches of an `anyOf` / `oneOf` at
/// `schema_path` (an optional enum is `anyOf: [{$ref: Enum}, {type: null}]`).
pub(super) fn branch_enums(schema_path: &str) -> Option<String> {
    let schema = schema();
    let node = schema.pointer(schema_path)?;
    let branches = node.as_array()?;
    let mut values = Vec::new();
    for b in branches {
        let b = match b.get("$ref").and_then(|r| r.as_str()) {
            Some(r) => schema.pointer(r.strip_prefix('#')?)?,
            None => b,
        };
        if let Some(e) = b.get("enum").and_then(|e| e.as_array()) {
            values.extend(e.iter().filter_map(|v| v.as_str().map(str::to_owned)));
        }
        if let Some(one_of) = b.get("oneOf").and_then(|o| o.as_array()) {
            for o in one_of {
                if let Some(c) = o.get("const").and_then(|c| c.as_str()) {
                    values.push(c.to_owned());
                }
                if let Some(e) = o.get("enum").and_then(|e| e.as_array()) {
                    values.extend(e.iter().filter_map(|v| v.as_str().map(str::to_owned)));
                }
            }
        }
    }
    (!values.is_empty()).then(|| values.join(", "))
}

pub(super) fn required_hint(path: &str, name: &str) -> &'static str {
    match (path, name) {
        ("", "apiVersion") => " (apiVersion: reshard/v1)",
        ("", "source") => " (source: {version: 1} or source: {spec: {...}})",
        ("", "target") => " (the target version's spec fields)",
        _ => "",
    }
}

pub(super) fn pointer_get<'a>(
    json: &'a serde_json::Value,
    pointer: &str,
) -> Option<&'a serde_json::Value> {
    json.pointer(pointer)
}

pub(super) fn list(options: &serde_json::Value) -> String {
    match options.as_array() {
        Some(items) => items
            .iter()
            .map(|i| i.as_str().map_or_else(|| i.to_string(), str::to_owned))
            .collect::<Vec<_>>()
            .join(", "),
        None => options.to_string(),
    }
}

pub(super) fn type_names(kind: &jsonschema::error::TypeKind) -> String {
    match kind {
        jsonschema::error::TypeKind::Single(t) => t.to_string(),
        jsonschema::error::TypeKind::Multiple(ts) => {
            let names: Vec<String> = (*ts).into_iter().map(|t| t.to_string()).collect();
            names.join(" or ")
        }
    }
}

/// The property names the schema at `schema_path` (ending in `/additionalProperties`)
/// allows.
pub(super) fn allowed_properties(schema_path: &str) -> Option<String> {
    let base = schema_path.strip_suffix("/additionalProperties")?;
    let schema = schema();
    let node = schema.pointer(base)?;
    let properties = node.get("properties")?.as_object()?;
    Some(properties.keys().cloned().collect::<Vec<_>>().join(", "))
}

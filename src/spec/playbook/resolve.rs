//! The playbook's meaning, once its shape holds: versions converted and checked, durations
//! parsed, settings and hooks resolved, steps named and ordered.

use std::collections::BTreeSet;
use std::time::Duration;

use super::doc::*;
use super::shape::child;
use super::{
    default_name, default_steps, Action, Playbook, Reconcile, Soak, Source, Step, Workers,
};
use crate::phase::Phase;
use crate::routing::KeyValue;
use crate::settings::MigrationSettings;
use crate::spec::{version_from_spec, Problems};

/// The declared hooks, checked: names unique, events known, timeouts in range.
pub(super) fn hooks(docs: &[HookDoc], problems: &mut Problems) -> Vec<crate::hooks::NewHook> {
    use crate::hooks::HookOn;
    let mut names = BTreeSet::new();
    let mut out = Vec::new();
    for (i, h) in docs.iter().enumerate() {
        let path = format!("hooks[{i}]");
        if let Err(why) = crate::hooks::check_name(&h.name) {
            problems.add(format!("{path}.name"), why);
        } else if !names.insert(h.name.clone()) {
            problems.add(
                format!("{path}.name"),
                format!("hook name {:?} is used twice; names must be unique", h.name),
            );
        }
        let mut on = Vec::new();
        for (j, name) in h.on.iter().enumerate() {
            match HookOn::parse(name) {
                Ok(o) if !on.contains(&o) => on.push(o),
                Ok(_) => {}
                Err(why) => problems.add(format!("{path}.on[{j}]"), why),
            }
        }
        if h.on.is_empty() {
            problems.add(format!("{path}.on"), "name at least one event");
        }
        if h.command.trim().is_empty() {
            problems.add(format!("{path}.command"), "the command is empty");
        }
        let timeout = match &h.timeout {
            None => Some(Duration::from_secs(30)),
            Some(t) => whole_duration(
                t,
                &format!("{path}.timeout"),
                crate::duration::Unit::Milliseconds,
                problems,
            )
            .and_then(|d| {
                if d < Duration::from_millis(100) || d > Duration::from_secs(3600) {
                    problems.add(
                        format!("{path}.timeout"),
                        format!("{t:?} is outside the allowed range: from 100ms to 1h"),
                    );
                    None
                } else {
                    Some(d)
                }
            }),
        };
        if let Some(timeout) = timeout {
            out.push(crate::hooks::NewHook {
                name: h.name.clone(),
                on,
                command: h.command.clone(),
                blocking: h.blocking.unwrap_or(false),
                timeout,
            });
        }
    }
    out
}

/// A duration at `path` that is stored as a whole number of `unit` (a setting in whole
/// seconds or milliseconds): one the unit cannot hold is a problem, with what to write, not a
/// value rounded without a word.
pub(super) fn whole_duration(
    text: &str,
    path: &str,
    unit: crate::duration::Unit,
    problems: &mut Problems,
) -> Option<Duration> {
    let d = duration(text, path, problems)?;
    match crate::duration::whole(d, unit) {
        Ok(_) => Some(d),
        Err(why) => {
            problems.add(path, format!("{}: {why}", text.trim()));
            None
        }
    }
}

/// `"30s"`, `"500ms"`, `"5m"` at `path`.
pub(super) fn duration(text: &str, path: &str, problems: &mut Problems) -> Option<Duration> {
    match crate::duration::parse(text) {
        Ok(d) if !d.is_zero() => Some(d),
        Ok(_) => {
            problems.add(path, "a duration of zero is not allowed");
            None
        }
        Err(message) => {
            problems.add(path, message);
            None
        }
    }
}

/// Whether the field at `path` (`steps[1].advance.timeout`) holds a duration: its name is
/// one the schema marks with `x-duration`, so a number there gets the unit to write rather
/// than "wrong type".
/// What an empty `steps` list is told (by the schema's `minItems` and the check of meaning).
pub(super) const NO_STEPS: &str = "no steps; leave `steps` out for the whole forward path \
     (with an approval before cleanup), or list the steps to run";

pub(super) fn is_duration_field(path: &str) -> bool {
    fn collect(node: &serde_json::Value, names: &mut BTreeSet<String>) {
        match node {
            serde_json::Value::Object(map) => {
                if let Some(serde_json::Value::Object(props)) = map.get("properties") {
                    for (name, prop) in props {
                        if prop.get("x-duration") == Some(&serde_json::Value::Bool(true)) {
                            names.insert(name.clone());
                        }
                    }
                }
                map.values().for_each(|v| collect(v, names));
            }
            serde_json::Value::Array(items) => items.iter().for_each(|v| collect(v, names)),
            _ => {}
        }
    }
    let mut names = BTreeSet::new();
    collect(&schema(), &mut names);
    let field = path.rsplit('.').next().unwrap_or(path);
    names.contains(field)
}

pub(super) fn opt_duration(
    text: &Option<String>,
    path: &str,
    default: Duration,
    problems: &mut Problems,
) -> Duration {
    match text {
        Some(t) => duration(t, path, problems).unwrap_or(default),
        None => default,
    }
}

pub(super) fn waves(
    values: &Option<Vec<f64>>,
    path: &str,
    problems: &mut Problems,
) -> Option<[f64; 3]> {
    let values = values.as_ref()?;
    match <[f64; 3]>::try_from(values.as_slice()) {
        Ok(w)
            if w.iter().all(|x| *x > 0.0 && *x <= 100.0)
                && w.windows(2).all(|p| p[0] <= p[1])
                && w[2] == 100.0 =>
        {
            Some(w)
        }
        _ => {
            problems.add(
                path,
                format!(
                    "{values:?} is not allowed; use three increasing percentages in (0, 100], \
                     the last one 100"
                ),
            );
            None
        }
    }
}

pub(super) fn workers(doc: &WorkersDoc, path: &str, problems: &mut Problems) -> Workers {
    Workers {
        workers: doc.workers,
        lease_ttl: opt_duration(
            &doc.lease_ttl,
            &child(path, "lease_ttl"),
            Duration::from_secs(30),
            problems,
        ),
        batch_size: doc.batch_size,
        max_docs_per_sec: doc.max_docs_per_sec,
        max_in_flight_per_shard: doc.max_in_flight_per_shard,
        target_batch_latency: doc.target_batch_latency.as_ref().and_then(|t| {
            whole_duration(
                t,
                &child(path, "target_batch_latency"),
                crate::duration::Unit::Milliseconds,
                problems,
            )
        }),
        cleanup_waves: waves(&doc.cleanup_waves, &child(path, "cleanup_waves"), problems),
    }
}

/// What is wrong with a shard's URI: it must be a MongoDB connection string
/// (`mongodb://`, `mongodb+srv://`) or name one by `${ENV_VAR}`.
pub(super) fn uri_problem(uri: &str) -> Option<String> {
    // Shown without its password, should the file hold one.
    let shown = crate::redact::redact_uri(uri);
    let mut rest = uri;
    while let Some(at) = rest.find("${") {
        let after = &rest[at + 2..];
        let Some(end) = after.find('}') else {
            return Some(format!(
                "{shown:?}: `${{` is not closed; write ${{ENV_VAR}}"
            ));
        };
        let name = &after[..end];
        let file = name
            .strip_prefix("file:")
            .is_some_and(|path| !path.is_empty());
        if !file
            && (name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'))
        {
            return Some(format!(
                "{shown:?}: {name:?} is not an environment variable name (letters, digits, _) \
                 or a file (file:PATH)"
            ));
        }
        rest = &after[end + 1..];
    }
    if crate::redact::has_inline_password(uri) {
        return Some(format!(
            "{shown:?} holds a password in plain text: a playbook is kept in version control \
             and its URIs are stored as written; use ${{ENV_VAR}} or ${{file:PATH}} for the \
             password (or the whole URI)"
        ));
    }
    let whole_variable =
        uri.starts_with("${") && uri.ends_with('}') && uri.matches("${").count() == 1;
    if whole_variable || uri.starts_with("mongodb://") || uri.starts_with("mongodb+srv://") {
        return None;
    }
    Some(format!(
        "{shown:?} is not a MongoDB URI; expected mongodb://..., mongodb+srv://... or ${{ENV_VAR}}"
    ))
}

/// The document's meaning: versions, durations, settings, steps.
pub(super) fn resolve(mut doc: PlaybookDoc, problems: &mut Problems) -> Option<Playbook> {
    let source = match (&doc.source.version, &doc.source.spec) {
        (Some(v), None) => Some(Source::Version(*v as i32)),
        (None, Some(spec)) => {
            version_from_spec(spec, &doc.collection, "source.spec.", problems).map(Source::Spec)
        }
        _ => {
            problems.add(
                "source",
                "give exactly one of version (a registered version number) or spec (a declared \
                 layout)",
            );
            None
        }
    };
    let target = version_from_spec(&doc.target, &doc.collection, "target.", problems);
    let mut shard_names = BTreeSet::new();
    for (i, shard) in doc.shards.iter().enumerate() {
        if !shard_names.insert(shard.name.clone()) {
            problems.add(
                format!("shards[{i}].name"),
                format!("shard {:?} is listed twice", shard.name),
            );
        }
    }
    for (i, shard) in doc.shards.iter().enumerate() {
        if let Some(why) = uri_problem(&shard.uri) {
            problems.add(format!("shards[{i}].uri"), why);
        } else if let Err(why) = crate::names::uri_options(&shard.uri) {
            problems.add(format!("shards[{i}].uri"), why);
        }
        if let Err(rule) = crate::names::database(&shard.database) {
            problems.add(format!("shards[{i}].database"), rule);
        }
    }
    // The layouts themselves (placement covers every vbucket once, shards are declared, V
    // stays, tenants once): the rules `reshard version create` applies. Shards are checked
    // against the ones the playbook declares, when it declares any.
    let referenced: BTreeSet<String> = match &source {
        Some(Source::Spec(v)) => v.shards(),
        _ => BTreeSet::new(),
    }
    .into_iter()
    .chain(target.iter().flat_map(|t| t.shards()))
    .collect();
    let known = if doc.shards.is_empty() {
        &referenced
    } else {
        &shard_names
    };
    let source_v = match &source {
        Some(Source::Spec(v)) => {
            let ctx = crate::routing::ValidationContext {
                registered_shards: known,
                previous_virtual_buckets: None,
            };
            if let Err(errors) = v.validate(&ctx) {
                for e in errors {
                    problems.add(format!("source.spec.{}", e.path), e.message);
                }
            }
            v.virtual_buckets()
        }
        _ => None,
    };
    if let Some(t) = &target {
        let ctx = crate::routing::ValidationContext {
            registered_shards: known,
            previous_virtual_buckets: source_v,
        };
        if let Err(errors) = t.validate(&ctx) {
            for e in errors {
                problems.add(format!("target.{}", e.path), e.message);
            }
        }
    }
    if doc.steps.as_ref().is_some_and(|s| s.is_empty()) {
        problems.add("steps", NO_STEPS);
    }
    // A target that routes every document where the source does moves nothing: the
    // migration would run every phase for no change (a copy of the source pasted twice).
    if let (Some(Source::Spec(from)), Some(to)) = (&source, &target) {
        if serde_json::to_value(from).ok() == serde_json::to_value(to).ok() {
            problems.add(
                "target",
                "the target is the same layout as source.spec: it moves nothing; change its \
                 placement, buckets or routing field",
            );
        }
    }
    let settings = settings(&doc.settings, problems);
    if let Some(capacity) = &doc.capacity {
        if let Some(w) = &capacity.window {
            duration(w, "capacity.window", problems);
        }
        if capacity
            .timestamp_field
            .as_ref()
            .is_some_and(|f| f.trim().is_empty())
        {
            problems.add(
                "capacity.timestamp_field",
                "empty; name the field that holds each document's write time (say createdAt), \
                 or leave timestamp_field out",
            );
        }
        for (i, rate) in capacity.tenant_rates.iter().enumerate() {
            if KeyValue::from_yaml(&rate.tenant).is_none() {
                problems.add(
                    format!("capacity.tenant_rates[{i}].tenant"),
                    format!("not a tenant; a tenant is {}", crate::spec::TENANT_FORMS),
                );
            }
        }
    }

    let hooks = hooks(&doc.hooks, problems);

    // Steps: default when left out; every one named, the names unique.
    let mut step_docs = doc.steps.clone().unwrap_or_else(default_steps);
    let mut names = BTreeSet::new();
    let mut steps = Vec::new();
    let mut reached: Option<(usize, Phase)> = None;
    for (i, s) in step_docs.iter_mut().enumerate() {
        let path = format!("steps[{i}]");
        let explicit = s.name.is_some();
        let mut name = s.name.clone().unwrap_or_else(|| default_name(&s.kind));
        if !explicit {
            // Unnamed steps of one kind are numbered: `soak`, `soak-2`, ...
            let base = name.clone();
            let mut n = 2;
            while names.contains(&name) {
                name = format!("{base}-{n}");
                n += 1;
            }
        }
        if !names.insert(name.clone()) {
            problems.add(
                format!("{path}.name"),
                format!("step name {name:?} is used twice; names must be unique"),
            );
        }
        s.name = Some(name.clone());
        let action = match &s.kind {
            StepKindDoc::Advance(a) => {
                let (to, timeout, switch_timeout) = match a {
                    AdvanceDoc::To(p) => (*p, None, None),
                    AdvanceDoc::With(w) => (w.to, w.timeout.clone(), w.switch_timeout.clone()),
                };
                Action::Advance {
                    to: to.into(),
                    timeout: opt_duration(
                        &timeout,
                        &format!("{path}.advance.timeout"),
                        Duration::from_secs(60),
                        problems,
                    ),
                    switch_timeout: opt_duration(
                        &switch_timeout,
                        &format!("{path}.advance.switch_timeout"),
                        Duration::from_secs(5),
                        problems,
                    ),
                }
            }
            StepKindDoc::Backfill(w) => {
                Action::Backfill(workers(w, &format!("{path}.backfill"), problems))
            }
            StepKindDoc::Cleanup(w) => {
                Action::Cleanup(workers(w, &format!("{path}.cleanup"), problems))
            }
            StepKindDoc::Rollback(w) => {
                Action::Rollback(workers(w, &format!("{path}.rollback"), problems))
            }
            StepKindDoc::Reconcile(r) => Action::Reconcile(Reconcile {
                sample: r.sample.unwrap_or(100),
                stratify: r.stratify.unwrap_or(StrataDoc::Shard),
                recheck_delay: opt_duration(
                    &r.recheck_delay,
                    &format!("{path}.reconcile.recheck_delay"),
                    Duration::from_secs(2),
                    problems,
                ),
                full: r.full.unwrap_or(false),
                repair: r.repair.unwrap_or(false),
                attempts: r
                    .attempts
                    .unwrap_or(if r.repair.unwrap_or(false) { 3 } else { 1 }),
                max_missing: r.max_missing,
                max_mismatched: r.max_mismatched,
                max_misplaced: r.max_misplaced,
            }),
            StepKindDoc::Soak(SoakDoc::For(d)) => Action::Soak(Soak {
                duration: duration(d, &format!("{path}.soak"), problems)
                    .unwrap_or(Duration::from_secs(1)),
                max_findings: 0,
                max_dead_letters: 0,
                max_router_errors: 0,
                overload_for: None,
            }),
            StepKindDoc::Soak(SoakDoc::With(w)) => Action::Soak(Soak {
                duration: duration(&w.duration, &format!("{path}.soak.duration"), problems)
                    .unwrap_or(Duration::from_secs(1)),
                max_findings: w.max_findings.unwrap_or(0),
                max_dead_letters: w.max_dead_letters.unwrap_or(0),
                max_router_errors: w.max_router_errors.unwrap_or(0),
                overload_for: w
                    .overload_for
                    .as_ref()
                    .and_then(|d| duration(d, &format!("{path}.soak.overload_for"), problems)),
            }),
            StepKindDoc::Approve(a) => {
                if a.message.as_ref().is_some_and(|m| m.trim().is_empty()) {
                    problems.add(
                        format!("{path}.approve.message"),
                        "empty; say what the approver agrees to (shown by `reshard run` and \
                         in the event log), or leave message out",
                    );
                }
                Action::Approve {
                    message: a.message.clone(),
                }
            }
            StepKindDoc::Complete(c) => Action::Complete {
                timeout: opt_duration(
                    &c.timeout,
                    &format!("{path}.complete.timeout"),
                    Duration::from_secs(60),
                    problems,
                ),
            },
        };
        // Steps go forward: none may bring the migration back to an earlier phase, and
        // nothing follows the end of the migration.
        if let Some(to) = action.reaches() {
            if let Some((at, before)) = reached {
                if before.is_terminal() {
                    problems.add(
                        path.clone(),
                        format!(
                            "step {name:?} comes after steps[{at}], which ends the migration \
                             ({before}); nothing can follow it"
                        ),
                    );
                } else if to == Phase::RolledBack && !before.leads_to(Phase::RolledBack) {
                    problems.add(
                        path.clone(),
                        format!(
                            "step {name:?} rolls back after steps[{at}] reached {before}, from \
                             which a migration cannot roll back (cleanup deletes from the \
                             source); roll back before that step, or remove this one"
                        ),
                    );
                } else if to != Phase::RolledBack && forward_rank(to) < forward_rank(before) {
                    problems.add(
                        path.clone(),
                        format!(
                            "step {name:?} goes back to {to} after steps[{at}] reached \
                             {before}; steps go forward (to roll back, use a rollback step)"
                        ),
                    );
                }
            }
            reached = Some((i, to));
        }
        steps.push(Step { name, action });
    }
    doc.steps = Some(step_docs);
    Some(Playbook {
        doc,
        source: source?,
        target: target?,
        settings: settings?,
        hooks,
        steps,
        deprecations: Vec::new(),
    })
}

/// The position of a phase on the forward path (rollback phases after it).
pub fn forward_rank(phase: Phase) -> usize {
    const ORDER: [Phase; 9] = [
        Phase::Planned,
        Phase::DualRead,
        Phase::WriteSwitch,
        Phase::NewWrites,
        Phase::Backfill,
        Phase::Reconcile,
        Phase::NewReads,
        Phase::Cleanup,
        Phase::Completed,
    ];
    ORDER
        .iter()
        .position(|p| *p == phase)
        .unwrap_or(ORDER.len())
}

pub(super) fn settings(doc: &SettingsDoc, problems: &mut Problems) -> Option<MigrationSettings> {
    let mut s = MigrationSettings::default();
    if let Some(v) = doc.max_docs_per_sec {
        s.max_docs_per_sec = v;
    }
    if let Some(v) = doc.batch_size {
        s.batch_size = v;
    }
    if let Some(v) = doc.max_in_flight_per_shard {
        s.max_in_flight_per_shard = v;
    }
    if let Some(t) = &doc.target_batch_latency {
        if let Some(d) = whole_duration(
            t,
            "settings.target_batch_latency",
            crate::duration::Unit::Milliseconds,
            problems,
        ) {
            s.target_batch_latency_ms = d.as_millis() as u64;
        }
    }
    if let Some(t) = &doc.capacity_signal_after {
        if let Some(d) = whole_duration(
            t,
            "settings.capacity_signal_after",
            crate::duration::Unit::Seconds,
            problems,
        ) {
            s.capacity_signal_after_secs = d.as_secs();
        }
    }
    if let Some(v) = doc.documents_per_partition {
        s.documents_per_partition = Some(v);
    }
    if let Some(v) = doc.max_missing {
        s.max_missing = v;
    }
    if let Some(v) = doc.max_mismatched {
        s.max_mismatched = v;
    }
    if let Some(v) = doc.max_misplaced {
        s.max_misplaced = v;
    }
    if let Some(w) = waves(&doc.cleanup_waves, "settings.cleanup_waves", problems) {
        s.cleanup_waves = w;
    }
    if let Some(v) = doc.drop_empty_source {
        s.drop_empty_source = v;
    }
    if let Some(v) = doc.shadow_read_percent {
        s.shadow_read_percent = v;
    }
    if let Some(text) = &doc.latency_budget {
        match crate::settings::LatencyBudget::parse(text) {
            Ok(budget) => budget.apply(&mut s),
            Err(why) => problems.add("settings.latency_budget", why),
        }
    }
    let found = s.problems();
    for p in &found {
        let (field, message) = p.split_once(": ").unwrap_or(("", p));
        problems.add(child("settings", field), message.to_owned());
    }
    found.is_empty().then_some(s)
}

impl KeyValue {
    /// A tenant as a playbook or spec writes it (see the spec module's docs), or `None`.
    pub fn from_yaml(value: &serde_yaml::Value) -> Option<KeyValue> {
        let mut problems = Problems::default();
        crate::spec::tenant_key(value, "", &mut problems)
    }
}

//! Playbooks: a migration as a file an operator keeps in version control: what moves (the
//! collection, its shards, the source and target versions), how carefully (settings), and
//! the steps, in order. `reshard run` executes what remains of them from the state stored in
//! PostgreSQL.
//!
//! A playbook is read in three passes, so that every problem is reported at once:
//! 1. YAML syntax (the first error stops here: nothing after it can be read);
//! 2. its shape, against the JSON Schema generated from the types below ([`schema`]):
//!    unknown fields, wrong types, values outside the allowed ones, missing fields;
//! 3. its meaning: the routing versions, durations, settings, step names and order.
//!
//! Each problem is `file:line:column: field path: what is wrong` and, where a choice is
//! fixed, the allowed values.
//!
//! ```yaml
//! apiVersion: reshard/v1
//! name: orders-hot-tenant          # names the migration in the state store
//! collection: orders
//! shards:                          # registered if missing (URIs may use ${ENV_VAR})
//!   - {name: s1, uri: "${RESHARD_S1_URI}", database: shop}
//! source: {version: 1}             # or {spec: {<version spec fields>}}
//! target:                          # the version spec fields (README, "Version spec format")
//!   tenant_key: customerId
//!   layout: hashed
//!   tenant_buckets: [{tenant: cust-hot, buckets: 16}]
//!   routing_field: bucket
//!   placement: [{vbuckets: [0, 1024], shard: s1}]
//! settings: {max_docs_per_sec: 5000, batch_size: 1000}
//! steps:                           # optional: the whole forward path by default
//!   - advance: dual_read
//!   - advance: {to: write_switch, switch_timeout: 5s}
//!   - backfill: {workers: 2}
//!   - reconcile: {sample: 200, repair: true}
//!   - soak: 10m
//!   - advance: new_reads
//!   - name: go-ahead
//!     approve: {message: "check the dashboards"}
//!   - cleanup: {workers: 2}
//!   - complete: {}
//! ```

mod doc;
mod renamed;
mod resolve;
mod shape;

pub use doc::*;
pub use renamed::with_current_names;
pub use resolve::forward_rank;

use std::time::Duration;

use super::{yaml_error, Problems, SpecError, YamlLocator};
use crate::phase::Phase;
use crate::routing::RoutingVersion;
use crate::settings::MigrationSettings;
use resolve::resolve;
use shape::shape_problems;

/// The format version this module reads.
pub const API_VERSION: &str = "reshard/v1";

// ---------------------------------------------------------------------------------------------
// The playbook, resolved.

/// A playbook, read and checked: versions converted, durations parsed, defaults in place.
#[derive(Clone, Debug)]
pub struct Playbook {
    /// What was written, with every step named: pinned to the migration, and compared with
    /// later edits.
    pub doc: PlaybookDoc,
    pub source: Source,
    pub target: RoutingVersion,
    /// The settings the playbook gives, over the defaults.
    pub settings: MigrationSettings,
    /// The hooks it declares.
    pub hooks: Vec<crate::hooks::NewHook>,
    pub steps: Vec<Step>,
    /// Where the file uses an old name of a step option, located, each saying the new name
    /// ([`crate::vocabulary::RENAMED_PLAYBOOK_KEYS`]; accepted until 0.2).
    pub deprecations: Vec<SpecError>,
}

/// One per playbook: the size of the declared layout does not matter.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug)]
pub enum Source {
    /// A version registered already.
    Version(i32),
    /// A layout declared in the playbook.
    Spec(RoutingVersion),
}

/// A step, resolved.
#[derive(Clone, Debug, PartialEq)]
pub struct Step {
    pub name: String,
    pub action: Action,
}

#[derive(Clone, Debug, PartialEq)]
pub enum Action {
    Advance {
        to: Phase,
        timeout: Duration,
        switch_timeout: Duration,
    },
    Backfill(Workers),
    Reconcile(Reconcile),
    Soak(Soak),
    Approve {
        message: Option<String>,
    },
    Cleanup(Workers),
    Complete {
        timeout: Duration,
    },
    Rollback(Workers),
}

impl Action {
    /// The phase the migration is in once the step is done (`None`: it does not move it).
    pub fn reaches(&self) -> Option<Phase> {
        match self {
            Action::Advance { to, .. } => Some(match to {
                // The write switch moves on to new_writes by itself.
                Phase::WriteSwitch => Phase::NewWrites,
                other => *other,
            }),
            Action::Backfill(_) => Some(Phase::Backfill),
            Action::Reconcile(_) => Some(Phase::Reconcile),
            Action::Cleanup(_) => Some(Phase::Cleanup),
            Action::Complete { .. } => Some(Phase::Completed),
            Action::Rollback(_) => Some(Phase::RolledBack),
            Action::Soak(_) | Action::Approve { .. } => None,
        }
    }
}

/// Workers and throttle of a step. `workers` of `None` takes the `--workers` of `reshard run`.
#[derive(Clone, Debug, PartialEq)]
pub struct Workers {
    pub workers: Option<usize>,
    pub lease_ttl: Duration,
    pub batch_size: Option<usize>,
    pub max_docs_per_sec: Option<f64>,
    pub max_in_flight_per_shard: Option<usize>,
    pub target_batch_latency: Option<Duration>,
    pub cleanup_waves: Option<[f64; 3]>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Reconcile {
    pub sample: usize,
    pub stratify: StrataDoc,
    pub recheck_delay: Duration,
    pub full: bool,
    pub repair: bool,
    pub attempts: u32,
    pub max_missing: Option<u64>,
    pub max_mismatched: Option<u64>,
    pub max_misplaced: Option<u64>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Soak {
    pub duration: Duration,
    pub max_findings: u64,
    pub max_dead_letters: u64,
    pub max_router_errors: u64,
    /// `None`: any capacity signal fails the step.
    pub overload_for: Option<Duration>,
}

/// The steps of a playbook that leaves them out: the whole forward path, with an approval
/// before cleanup.
pub fn default_steps() -> Vec<StepDoc> {
    let step = |kind| StepDoc { name: None, kind };
    let advance = |p| step(StepKindDoc::Advance(AdvanceDoc::To(p)));
    vec![
        advance(ForwardPhase::DualRead),
        advance(ForwardPhase::WriteSwitch),
        step(StepKindDoc::Backfill(WorkersDoc::default())),
        step(StepKindDoc::Reconcile(ReconcileDoc::default())),
        advance(ForwardPhase::NewReads),
        StepDoc {
            name: Some("approve-cleanup".into()),
            kind: StepKindDoc::Approve(ApproveDoc {
                message: Some(
                    "the new layout serves every read; cleanup deletes the moved documents \
                     from the source, after which the migration can no longer roll back"
                        .into(),
                ),
            }),
        },
        step(StepKindDoc::Cleanup(WorkersDoc::default())),
        step(StepKindDoc::Complete(CompleteDoc::default())),
    ]
}

/// The name a step gets when it has none: its kind, and for `advance` its phase.
fn default_name(kind: &StepKindDoc) -> String {
    match kind {
        StepKindDoc::Advance(AdvanceDoc::To(p) | AdvanceDoc::With(AdvanceWith { to: p, .. })) => {
            Phase::from(*p).as_str().to_owned()
        }
        StepKindDoc::Backfill(_) => "backfill".into(),
        StepKindDoc::Reconcile(_) => "reconcile".into(),
        StepKindDoc::Soak(_) => "soak".into(),
        StepKindDoc::Approve(_) => "approve".into(),
        StepKindDoc::Cleanup(_) => "cleanup".into(),
        StepKindDoc::Complete(_) => "complete".into(),
        StepKindDoc::Rollback(_) => "rollback".into(),
    }
}

impl From<ForwardPhase> for Phase {
    fn from(p: ForwardPhase) -> Phase {
        p.phase()
    }
}

// ---------------------------------------------------------------------------------------------
// Reading.

/// Reads a playbook. Every problem is reported, located (see the module docs); `file` only
/// names the file in them.
pub fn parse_playbook(file: &str, text: &str) -> Result<Playbook, Vec<SpecError>> {
    let locator = YamlLocator::new(text);
    let located = |problems: Problems| -> Vec<SpecError> {
        let mut errors: Vec<SpecError> = problems
            .0
            .into_iter()
            .map(|(path, message)| locator.error(file, path, message))
            .collect();
        // In the order of the file (a problem of the whole file first).
        errors.sort_by_key(|e| (e.line.unwrap_or(0), e.column.unwrap_or(0)));
        errors
    };
    let mut value: serde_yaml::Value =
        serde_yaml::from_str(text).map_err(|e| vec![yaml_error(file, &e)])?;
    if value.is_null() {
        let mut p = Problems::default();
        p.add(
            "",
            "the playbook is empty; it needs apiVersion, name, collection, source and target",
        );
        return Err(located(p));
    }
    let mut json = match serde_json::to_value(&value) {
        Ok(json) => json,
        Err(e) => {
            let mut p = Problems::default();
            p.add("", format!("not a playbook: {e} (keys must be strings)"));
            return Err(located(p));
        }
    };
    // Old names of step options read as the new ones; every problem is then told where the
    // file has it.
    let renaming = renamed::rename(&mut json);
    let located = |problems: Problems| {
        located(Problems(
            problems
                .0
                .into_iter()
                .map(|(path, message)| (renaming.in_file(&path), message))
                .collect(),
        ))
    };
    let mut shape = shape_problems(&json);
    for (path, old, new) in &renaming.both {
        shape.add(
            path.clone(),
            format!("`{old}` is the old name of `{new}`, which the step gives too: keep `{new}`"),
        );
    }
    renamed::rename_yaml(&mut value, &renaming);
    let doc: PlaybookDoc = match serde_yaml::from_value(value) {
        Ok(doc) => doc,
        // A shape the types cannot read (a wrong type, an unknown or missing field): the
        // schema's problems are all there is to say.
        Err(_) if !shape.0.is_empty() => return Err(located(shape)),
        // The schema accepted it: a mismatch between schema and types is a bug, reported
        // rather than hidden.
        Err(e) => {
            let mut p = Problems::default();
            p.add("", format!("cannot read the playbook: {e}"));
            return Err(located(p));
        }
    };
    // The types read it, so the checks of meaning run even when the schema found problems
    // (a value out of its range or pattern): every problem of the file is told at once.
    let mut problems = Problems::default();
    let playbook = resolve(doc, &mut problems);
    match playbook {
        Some(mut playbook) if problems.0.is_empty() && shape.0.is_empty() => {
            playbook.deprecations = renaming
                .renamed
                .iter()
                .map(|r| {
                    locator.error(
                        file,
                        r.old_path.clone(),
                        crate::vocabulary::deprecation(r.old, r.new),
                    )
                })
                .collect();
            Ok(playbook)
        }
        _ => Err(located(merged(shape, problems))),
    }
}

/// The schema's problems and the checks of meaning's together, in the order of the file's
/// fields: where both name one field, the check of meaning's words (written for that field)
/// stand alone.
fn merged(shape: Problems, meaning: Problems) -> Problems {
    let mut all = meaning.0;
    for (path, message) in shape.0 {
        if !all.iter().any(|(p, _)| *p == path) {
            all.push((path, message));
        }
    }
    Problems(all)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MINIMAL: &str = "\
apiVersion: reshard/v1
name: orders-hot
collection: orders
source: {version: 1}
target:
  tenant_key: customerId
  layout: hashed
  virtual_buckets: 64
  tenant_buckets: [{tenant: cust-hot, buckets: 4}]
  placement:
    - vbuckets: [0, 64]
      shard: s1
";

    #[test]
    fn a_playbook_without_steps_gets_the_whole_forward_path() {
        let p = parse_playbook("p.yaml", MINIMAL).unwrap();
        let names: Vec<&str> = p.steps.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "dual_read",
                "write_switch",
                "backfill",
                "reconcile",
                "new_reads",
                "approve-cleanup",
                "cleanup",
                "complete"
            ]
        );
        assert_eq!(p.doc.steps.as_ref().unwrap().len(), 8);
        assert!(matches!(p.source, Source::Version(1)));
    }

    #[test]
    fn every_shape_problem_is_reported_with_its_place_and_the_allowed_values() {
        let text = format!(
            "{MINIMAL}settings: {{batch_size: 0, colour: red}}\nsteps:\n  - advance: sideways\n  - backfill: {{wrkers: 2}}\n  - soak: 10m\n    approve: {{}}\n"
        );
        let errors = parse_playbook("p.yaml", &text).unwrap_err();
        let text: Vec<String> = errors.iter().map(|e| e.to_string()).collect();
        let all = text.join("\n");
        assert!(
            all.contains("settings.colour: unknown field \"colour\"; allowed:"),
            "{all}"
        );
        assert!(all.contains("settings.batch_size: 0 is too small"), "{all}");
        assert!(all.contains("steps[0].advance"), "{all}");
        assert!(
            all.contains("steps[1].backfill.wrkers: unknown field"),
            "{all}"
        );
        assert!(all.contains("exactly one kind"), "{all}");
        // Located: the line of the offending step.
        assert!(errors.iter().all(|e| e.line.is_some()), "{all}");
    }

    #[test]
    fn old_names_of_step_options_read_as_the_new_ones_with_a_located_warning() {
        let steps = |rate: &str, strata: &str, waves: &str| {
            format!(
                "{MINIMAL}steps:\n  - advance: dual_read\n  - advance: write_switch\n  \
                 - backfill: {{{rate}: 500, workers: 1}}\n  - reconcile: {{{strata}: tenant}}\n  \
                 - advance: new_reads\n  - cleanup: {{{waves}: [5, 50, 100]}}\n"
            )
        };
        let new = parse_playbook(
            "p.yaml",
            &steps("max_docs_per_sec", "stratify", "cleanup_waves"),
        )
        .unwrap();
        assert!(new.deprecations.is_empty());
        let old = parse_playbook("p.yaml", &steps("rate", "strata", "waves")).unwrap();
        assert_eq!(old.steps, new.steps);
        assert_eq!(old.doc, new.doc, "pinned as written with the new names");
        let Action::Backfill(w) = &new.steps[2].action else {
            panic!("{:?}", new.steps[2])
        };
        assert_eq!(w.max_docs_per_sec, Some(500.0));
        let warnings: Vec<String> = old.deprecations.iter().map(|d| d.to_string()).collect();
        assert_eq!(
            warnings,
            [
                "p.yaml:16:5: steps[2].backfill.rate: `rate` is deprecated and goes in 0.2: use \
                 `max_docs_per_sec`",
                "p.yaml:17:5: steps[3].reconcile.strata: `strata` is deprecated and goes in 0.2: \
                 use `stratify`",
                "p.yaml:19:5: steps[5].cleanup.waves: `waves` is deprecated and goes in 0.2: use \
                 `cleanup_waves`",
            ]
        );
        // A problem of an old key is told where the file has it, under its old name.
        let bad = steps("rate", "strata", "waves").replace("[5, 50, 100]", "[50, 5, 100]");
        let errors = parse_playbook("p.yaml", &bad).unwrap_err();
        assert_eq!(errors.len(), 1, "{errors:?}");
        assert_eq!(errors[0].path, "steps[5].cleanup.waves");
        // Both names in one step: refused, saying which to keep.
        let both =
            steps("rate", "strata", "waves").replace("rate: 500", "rate: 500, max_docs_per_sec: 9");
        let errors = parse_playbook("p.yaml", &both).unwrap_err();
        assert!(
            errors.iter().any(|e| e.path == "steps[2].backfill.rate"
                && e.message.contains("keep `max_docs_per_sec`")),
            "{errors:?}"
        );
    }

    #[test]
    fn shadow_reads_are_a_setting_of_the_playbook() {
        let text = format!("{MINIMAL}settings: {{shadow_read_percent: 10}}\n");
        let p = parse_playbook("p.yaml", &text).unwrap();
        assert_eq!(p.settings.shadow_read_percent, 10.0);
        assert_eq!(
            parse_playbook("p.yaml", MINIMAL)
                .unwrap()
                .settings
                .shadow_read_percent,
            0.0
        );
        let text = format!("{MINIMAL}settings: {{shadow_read_percent: 150}}\n");
        let all: Vec<String> = parse_playbook("p.yaml", &text)
            .unwrap_err()
            .iter()
            .map(|e| e.to_string())
            .collect();
        let all = all.join("\n");
        assert!(all.contains("settings.shadow_read_percent: 150"), "{all}");
    }

    #[test]
    fn steps_go_forward_and_names_are_unique() {
        let text = format!(
            "{MINIMAL}steps:\n  - advance: new_reads\n  - advance: dual_read\n  - name: x\n    soak: 1m\n  - name: x\n    soak: 2m\n"
        );
        let all: Vec<String> = parse_playbook("p.yaml", &text)
            .unwrap_err()
            .iter()
            .map(|e| e.to_string())
            .collect();
        let all = all.join("\n");
        assert!(all.contains("goes back to dual_read"), "{all}");
        assert!(all.contains("\"x\" is used twice"), "{all}");
    }

    #[test]
    fn durations_are_durations() {
        let text = format!("{MINIMAL}steps:\n  - soak: ten minutes\n");
        let all = parse_playbook("p.yaml", &text).unwrap_err()[0].to_string();
        assert!(
            all.contains("steps[0].soak: \"ten minutes\" is not a duration"),
            "{all}"
        );
        let text = format!("{MINIMAL}steps:\n  - soak: 90s\n");
        let p = parse_playbook("p.yaml", &text).unwrap();
        assert!(
            matches!(&p.steps[0].action, Action::Soak(s) if s.duration == Duration::from_secs(90))
        );
    }

    #[test]
    fn the_schema_is_generated_and_lists_every_step_kind() {
        let s = schema();
        let step = &s["$defs"]["Step"];
        for kind in STEP_KINDS {
            assert!(step["properties"].get(kind).is_some(), "{kind}");
        }
        assert_eq!(s["properties"]["apiVersion"]["$ref"], "#/$defs/ApiVersion");
    }
}

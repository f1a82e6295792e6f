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

use std::collections::BTreeSet;
use std::time::Duration;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::{version_from_spec, yaml_error, Problems, SpecError, VersionSpec, YamlLocator};
use crate::phase::Phase;
use crate::routing::{KeyValue, RoutingVersion};
use crate::settings::MigrationSettings;

/// The format version this module reads.
pub const API_VERSION: &str = "reshard/v1";

// ---------------------------------------------------------------------------------------------
// The document, as written.

/// A reshard playbook.
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(title = "reshard playbook")]
pub struct PlaybookDoc {
    /// The format version: `reshard/v1`.
    #[serde(rename = "apiVersion")]
    pub api_version: ApiVersion,
    /// The playbook's name: the migration it drives is found by it. Lower-case letters,
    /// digits, `.`, `_` and `-`.
    #[schemars(regex(pattern = r"^[a-z0-9][a-z0-9._-]{0,62}$"))]
    pub name: String,
    /// The collection that moves.
    #[schemars(length(min = 1, max = 120))]
    pub collection: String,
    /// The MongoDB locations the versions use, registered when missing. A URI may reference
    /// `${ENV_VAR}`: each process resolves it when it connects; it is stored unexpanded.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub shards: Vec<ShardDoc>,
    /// Where the documents are today: an existing version, or a declared layout.
    pub source: SourceDoc,
    /// Where they should be: the fields of a version spec.
    pub target: VersionSpec,
    /// How carefully to go.
    #[serde(default)]
    pub settings: SettingsDoc,
    /// The capacity planner's inputs (`reshard plan`).
    // Not nullable in the schema: a problem inside is then reported where it is, rather than
    // as "matches no allowed form" of an `anyOf` with null.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "CapacityDoc")]
    pub capacity: Option<CapacityDoc>,
    /// Commands to run on the migration's events (`reshard hook list` shows them; a playbook
    /// run keeps them in step with this list).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub hooks: Vec<HookDoc>,
    /// The steps, in order. Left out: the whole forward path, with an approval before
    /// cleanup.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub steps: Option<Vec<StepDoc>>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
pub enum ApiVersion {
    #[serde(rename = "reshard/v1")]
    V1,
}

/// A MongoDB location.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ShardDoc {
    #[schemars(regex(pattern = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$"))]
    pub name: String,
    /// `mongodb://...` or `mongodb+srv://...`, or `${ENV_VAR}` holding one.
    #[schemars(length(min = 1))]
    pub uri: String,
    /// MongoDB's rules: under 64 bytes, none of `/ \\ . " $ * < > : | ?`, a space or NUL.
    #[schemars(length(min = 1, max = 63))]
    pub database: String,
}

/// The source version: `{version: N}` (registered already) or `{spec: {...}}` (a layout
/// reshard did not make, declared here).
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(extend("oneOf" = [{ "required": ["version"] }, { "required": ["spec"] }]))]
pub struct SourceDoc {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub version: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "VersionSpec")]
    pub spec: Option<VersionSpec>,
}

/// A migration's settings; what is left out keeps its default (`reshard throttle show`).
#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SettingsDoc {
    /// Documents per second across all workers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub max_docs_per_sec: Option<f64>,
    /// Documents per batch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 100000))]
    pub batch_size: Option<usize>,
    /// Write commands in flight per target shard, per worker.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 64))]
    pub max_in_flight_per_shard: Option<usize>,
    /// A batch slower than this halves the rate (`500ms`, `2s`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("x-duration" = true))]
    pub target_batch_latency: Option<String>,
    /// Overload lasting this long is a capacity signal (`30s`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("x-duration" = true))]
    pub capacity_signal_after: Option<String>,
    /// The planner aims at partitions of about this many documents.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub documents_per_partition: Option<u64>,
    /// Reconciliation gate: the most missing documents a passing run may find.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_missing: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_mismatched: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_misplaced: Option<u64>,
    /// Cumulative percentages of the cleanup partitions, e.g. `[1, 10, 100]`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 3, max = 3))]
    pub cleanup_waves: Option<Vec<f64>>,
    /// Drop a source collection cleanup emptied.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drop_empty_source: Option<bool>,
    /// Shadow reads: the percentage of reads routers also compare with the other side, in
    /// `dual_read` through `reconcile` (default 0: off).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 100))]
    pub shadow_read_percent: Option<f64>,
    /// The application's latency budget: a p99 (`25ms`), a multiple of the p99 its routers
    /// reported when the backfill was planned (`1.3x`), or `off` (the default). While a
    /// router reports more, workers halve their rate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub latency_budget: Option<String>,
}

/// A hook: a shell command that gets each event it is on as JSON on stdin.
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct HookDoc {
    /// Lower-case letters, digits, `.`, `_` and `-`; unique among the playbook's hooks.
    #[schemars(regex(pattern = r"^[a-z0-9][a-z0-9._-]{0,62}$"))]
    pub name: String,
    /// `phase_change`, `failure`, `capacity_signal`, `approval_gate`, `all`, or event kinds
    /// (`rate_cut`, `bypass_found`, ...).
    #[schemars(length(min = 1))]
    pub on: Vec<String>,
    /// Run with `sh -c`. Keep secrets in the environment (`$PAGER_TOKEN`), not here.
    #[schemars(length(min = 1))]
    pub command: String,
    /// A failure pauses the migration until it is resumed (default: logged, and the
    /// migration goes on).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub blocking: Option<bool>,
    /// How long the command may run (`30s` when left out; 100ms to 1h).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("x-duration" = true))]
    pub timeout: Option<String>,
}

/// The capacity planner's inputs.
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CapacityDoc {
    /// The writes per second one shard may take.
    #[schemars(range(min = 0.001))]
    pub per_shard_write_limit: f64,
    /// Spare capacity to plan for: 0.3 is 30 % on top of the peak rate (default 0.25).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0.0, max = 10.0))]
    pub headroom: Option<f64>,
    /// A document field with its write time: rates are measured over `window` from it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1))]
    pub timestamp_field: Option<String>,
    /// How far back `timestamp_field` counts writes (`1h`; default `10m`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("x-duration" = true))]
    pub window: Option<String>,
    /// Peak write rates known from elsewhere (they win over measured ones).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tenant_rates: Vec<TenantRateDoc>,
    /// Documents sampled per source location (default 2000).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 100000))]
    pub sample: Option<usize>,
}

#[derive(Clone, Debug, PartialEq, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TenantRateDoc {
    #[schemars(with = "super::TenantForm")]
    pub tenant: serde_yaml::Value,
    #[schemars(range(min = 0.0))]
    pub peak_writes_per_sec: f64,
}

/// One step: exactly one kind, and an optional name (unique; the default derives from the
/// kind).
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
pub struct StepDoc {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(flatten)]
    pub kind: StepKindDoc,
}

#[derive(Clone, Debug, PartialEq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum StepKindDoc {
    /// Move to a phase (and through the ones before it), waiting for every router.
    Advance(AdvanceDoc),
    /// Copy the old documents: workers in this process (`workers: N`) or elsewhere
    /// (`workers: 0`); waits for the backfill gate.
    Backfill(WorkersDoc),
    /// Counts and samples (or everything) decide the reconciliation gate.
    Reconcile(ReconcileDoc),
    /// Wait, and fail on new findings, lasting overload, dead letters or router errors.
    Soak(SoakDoc),
    /// A manual gate: `reshard run` stops here until `reshard approve NAME --step S`.
    Approve(ApproveDoc),
    /// Delete the moved documents from the source, in waves.
    Cleanup(WorkersDoc),
    /// Move to `completed`: purge tombstones (and drop emptied sources when configured).
    Complete(CompleteDoc),
    /// Roll back from where the migration stands: copy the application's writes back and
    /// end in `rolled_back`.
    Rollback(WorkersDoc),
}

/// `advance: PHASE` or `advance: {to: PHASE, timeout: 60s, switch_timeout: 5s}`.
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize, JsonSchema)]
#[serde(untagged)]
pub enum AdvanceDoc {
    To(ForwardPhase),
    With(AdvanceWith),
}

#[derive(Clone, Debug, PartialEq, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct AdvanceWith {
    pub to: ForwardPhase,
    /// How long the barrier waits for routers (default `60s`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("x-duration" = true))]
    pub timeout: Option<String>,
    /// How long the write switch holds writes before it goes back (default `5s`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("x-duration" = true))]
    pub switch_timeout: Option<String>,
}

/// The phases a playbook advances to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum ForwardPhase {
    DualRead,
    WriteSwitch,
    NewWrites,
    Backfill,
    Reconcile,
    NewReads,
    Cleanup,
    Completed,
}

impl ForwardPhase {
    pub fn phase(self) -> Phase {
        match self {
            ForwardPhase::DualRead => Phase::DualRead,
            ForwardPhase::WriteSwitch => Phase::WriteSwitch,
            ForwardPhase::NewWrites => Phase::NewWrites,
            ForwardPhase::Backfill => Phase::Backfill,
            ForwardPhase::Reconcile => Phase::Reconcile,
            ForwardPhase::NewReads => Phase::NewReads,
            ForwardPhase::Cleanup => Phase::Cleanup,
            ForwardPhase::Completed => Phase::Completed,
        }
    }
}

/// Workers of a backfill, cleanup or rollback step, and the throttle while it runs.
#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct WorkersDoc {
    /// Workers in this process (default: `reshard run --workers`, else 2); 0: workers run
    /// elsewhere (`reshard worker`) and the step waits for them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(max = 64))]
    pub workers: Option<usize>,
    /// Documents per batch while the step runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 100000))]
    pub batch_size: Option<usize>,
    /// Documents per second across all workers while the step runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub rate: Option<f64>,
    /// Write commands in flight per target shard, per worker.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 64))]
    pub in_flight: Option<usize>,
    /// A batch slower than this halves the rate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("x-duration" = true))]
    pub latency_target: Option<String>,
    /// How long a worker's partition lease lasts without a heartbeat (default `30s`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("x-duration" = true))]
    pub lease_ttl: Option<String>,
    /// Cleanup: cumulative wave percentages, e.g. `[1, 10, 100]`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 3, max = 3))]
    pub waves: Option<Vec<f64>>,
}

#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ReconcileDoc {
    /// Samples per stratum (default 100).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 100000))]
    pub sample: Option<usize>,
    /// How samples are grouped (default `shard`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub strata: Option<StrataDoc>,
    /// How long to wait before findings are checked again (default `2s`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("x-duration" = true))]
    pub recheck_delay: Option<String>,
    /// Check every document instead of samples.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub full: Option<bool>,
    /// Repair what a run finds and run again (up to `attempts` runs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub repair: Option<bool>,
    /// Runs at most (default 3 with `repair`, else 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 20))]
    pub attempts: Option<u32>,
    /// Gate thresholds for this step (the settings' by default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_missing: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_mismatched: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_misplaced: Option<u64>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum StrataDoc {
    Shard,
    Tenant,
    Bucket,
}

/// `soak: DURATION` or `soak: {duration, max_findings, max_dead_letters, max_router_errors,
/// overload_for}`.
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize, JsonSchema)]
#[serde(untagged)]
pub enum SoakDoc {
    For(String),
    With(SoakWith),
}

#[derive(Clone, Debug, PartialEq, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SoakWith {
    #[schemars(extend("x-duration" = true))]
    pub duration: String,
    /// New reconciliation findings allowed while soaking (default 0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_findings: Option<u64>,
    /// Open dead letters allowed (default 0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_dead_letters: Option<u64>,
    /// Errors routers report while soaking (default 0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_router_errors: Option<u64>,
    /// Overload (a capacity signal) lasting this long fails the step (default: any).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("x-duration" = true))]
    pub overload_for: Option<String>,
}

#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ApproveDoc {
    /// Shown to whoever approves.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1))]
    pub message: Option<String>,
}

#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CompleteDoc {
    /// How long the last barrier waits for routers (default `60s`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("x-duration" = true))]
    pub timeout: Option<String>,
}

/// The step kinds, as the JSON Schema lists them.
const STEP_KINDS: [&str; 8] = [
    "advance",
    "backfill",
    "reconcile",
    "soak",
    "approve",
    "cleanup",
    "complete",
    "rollback",
];

impl JsonSchema for StepDoc {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "Step".into()
    }

    /// An object with an optional `name` and exactly one kind: each kind's value is described
    /// by its own type, and no other field is allowed.
    fn json_schema(generator: &mut schemars::SchemaGenerator) -> schemars::Schema {
        let mut properties = serde_json::Map::new();
        properties.insert(
            "name".into(),
            serde_json::json!({ "type": "string", "pattern": r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$" }),
        );
        let kinds: [(&str, schemars::Schema); 8] = [
            ("advance", generator.subschema_for::<AdvanceDoc>()),
            ("backfill", generator.subschema_for::<WorkersDoc>()),
            ("reconcile", generator.subschema_for::<ReconcileDoc>()),
            ("soak", generator.subschema_for::<SoakDoc>()),
            ("approve", generator.subschema_for::<ApproveDoc>()),
            ("cleanup", generator.subschema_for::<WorkersDoc>()),
            ("complete", generator.subschema_for::<CompleteDoc>()),
            ("rollback", generator.subschema_for::<WorkersDoc>()),
        ];
        for (name, schema) in kinds {
            properties.insert(name.into(), schema.to_value());
        }
        let one_of: Vec<serde_json::Value> = STEP_KINDS
            .iter()
            .map(|k| serde_json::json!({ "required": [k] }))
            .collect();
        serde_json::from_value(serde_json::json!({
            "type": "object",
            "description": "One step: exactly one of advance, backfill, reconcile, soak, approve, cleanup, complete, rollback, and an optional name.",
            "properties": properties,
            "additionalProperties": false,
            "oneOf": one_of,
        }))
        .expect("a valid schema")
    }
}

/// The JSON Schema of playbooks, generated from the types above: editors use it, and
/// [`parse_playbook`] checks every playbook's shape against it.
///
/// Its `$id` names the format (`apiVersion: reshard/v1`); `playbooks/schema.json` is this
/// schema as a file, which the example playbooks point editors to with a first line
/// `# yaml-language-server: $schema=./schema.json` (the YAML language server's hint, read by
/// VS Code's YAML extension, Neovim's and Helix's yaml-language-server, and JetBrains IDEs).
pub fn schema() -> serde_json::Value {
    let mut schema =
        serde_json::to_value(schemars::schema_for!(PlaybookDoc)).expect("the schema serialises");
    if let Some(object) = schema.as_object_mut() {
        object.insert("$id".into(), SCHEMA_ID.into());
    }
    schema
}

/// The `$id` of the playbook schema: the format's name, a URN since the schema is shipped
/// with the binary (`reshard playbook schema`) and in the repository, not served.
pub const SCHEMA_ID: &str = "urn:reshard:schema:playbook:v1";

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
    pub rate: Option<f64>,
    pub in_flight: Option<usize>,
    pub latency_target: Option<Duration>,
    pub waves: Option<[f64; 3]>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Reconcile {
    pub sample: usize,
    pub strata: StrataDoc,
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
        problems
            .0
            .into_iter()
            .map(|(path, message)| locator.error(file, path, message))
            .collect()
    };
    let value: serde_yaml::Value =
        serde_yaml::from_str(text).map_err(|e| vec![yaml_error(file, &e)])?;
    if value.is_null() {
        let mut p = Problems::default();
        p.add(
            "",
            "the playbook is empty; it needs apiVersion, name, collection, source and target",
        );
        return Err(located(p));
    }
    let json = match serde_json::to_value(&value) {
        Ok(json) => json,
        Err(e) => {
            let mut p = Problems::default();
            p.add("", format!("not a playbook: {e} (keys must be strings)"));
            return Err(located(p));
        }
    };
    let shape = shape_problems(&json);
    if !shape.0.is_empty() {
        return Err(located(shape));
    }
    let doc: PlaybookDoc = match serde_yaml::from_value(value) {
        Ok(doc) => doc,
        // The schema accepted it: a mismatch between schema and types is a bug, reported
        // rather than hidden.
        Err(e) => {
            let mut p = Problems::default();
            p.add("", format!("cannot read the playbook: {e}"));
            return Err(located(p));
        }
    };
    let mut problems = Problems::default();
    let playbook = resolve(doc, &mut problems);
    match playbook {
        Some(playbook) if problems.0.is_empty() => Ok(playbook),
        _ => Err(located(problems)),
    }
}

/// Every problem of the document's shape, by the JSON Schema.
fn shape_problems(json: &serde_json::Value) -> Problems {
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
fn pointer_to_path(pointer: &str) -> String {
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

fn child(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_owned()
    } else {
        format!("{path}.{key}")
    }
}

/// A schema error as a located sentence: what is wrong and what is allowed.
fn describe(
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
fn oneof_message(path: &str, value: Option<&serde_json::Value>) -> (String, String) {
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
            format!("not a tenant; a tenant is {}", super::TENANT_FORMS),
        );
    }
    (path.to_owned(), "does not match any allowed form".into())
}

/// The values allowed by the enums among the branches of an `anyOf` / `oneOf` at
/// `schema_path` (an optional enum is `anyOf: [{$ref: Enum}, {type: null}]`).
fn branch_enums(schema_path: &str) -> Option<String> {
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

fn required_hint(path: &str, name: &str) -> &'static str {
    match (path, name) {
        ("", "apiVersion") => " (apiVersion: reshard/v1)",
        ("", "source") => " (source: {version: 1} or source: {spec: {...}})",
        ("", "target") => " (the target version's spec fields)",
        _ => "",
    }
}

fn pointer_get<'a>(json: &'a serde_json::Value, pointer: &str) -> Option<&'a serde_json::Value> {
    json.pointer(pointer)
}

fn list(options: &serde_json::Value) -> String {
    match options.as_array() {
        Some(items) => items
            .iter()
            .map(|i| i.as_str().map_or_else(|| i.to_string(), str::to_owned))
            .collect::<Vec<_>>()
            .join(", "),
        None => options.to_string(),
    }
}

fn type_names(kind: &jsonschema::error::TypeKind) -> String {
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
fn allowed_properties(schema_path: &str) -> Option<String> {
    let base = schema_path.strip_suffix("/additionalProperties")?;
    let schema = schema();
    let node = schema.pointer(base)?;
    let properties = node.get("properties")?.as_object()?;
    Some(properties.keys().cloned().collect::<Vec<_>>().join(", "))
}

/// The declared hooks, checked: names unique, events known, timeouts in range.
fn hooks(docs: &[HookDoc], problems: &mut Problems) -> Vec<crate::hooks::NewHook> {
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
fn whole_duration(
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
fn duration(text: &str, path: &str, problems: &mut Problems) -> Option<Duration> {
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
fn is_duration_field(path: &str) -> bool {
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

fn opt_duration(
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

fn waves(values: &Option<Vec<f64>>, path: &str, problems: &mut Problems) -> Option<[f64; 3]> {
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

fn workers(doc: &WorkersDoc, path: &str, problems: &mut Problems) -> Workers {
    Workers {
        workers: doc.workers,
        lease_ttl: opt_duration(
            &doc.lease_ttl,
            &child(path, "lease_ttl"),
            Duration::from_secs(30),
            problems,
        ),
        batch_size: doc.batch_size,
        rate: doc.rate,
        in_flight: doc.in_flight,
        latency_target: doc.latency_target.as_ref().and_then(|t| {
            whole_duration(
                t,
                &child(path, "latency_target"),
                crate::duration::Unit::Milliseconds,
                problems,
            )
        }),
        waves: waves(&doc.waves, &child(path, "waves"), problems),
    }
}

/// What is wrong with a shard's URI: it must be a MongoDB connection string
/// (`mongodb://`, `mongodb+srv://`) or name one by `${ENV_VAR}`.
fn uri_problem(uri: &str) -> Option<String> {
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
fn resolve(mut doc: PlaybookDoc, problems: &mut Problems) -> Option<Playbook> {
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
        problems.add(
            "steps",
            "no steps; leave `steps` out for the whole forward path (with an approval before \
             cleanup), or list the steps to run",
        );
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
                    format!("not a tenant; a tenant is {}", super::TENANT_FORMS),
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
                strata: r.strata.unwrap_or(StrataDoc::Shard),
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

fn settings(doc: &SettingsDoc, problems: &mut Problems) -> Option<MigrationSettings> {
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
        super::tenant_key(value, "", &mut problems)
    }
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

//! The playbook document as written: the serde types of `reshard/v1`, with the JSON Schema
//! that editors and the shape check read, generated from them.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::phase::Phase;
use crate::spec::VersionSpec;

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
    #[schemars(length(min = 1))]
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
    #[schemars(regex(pattern = r"^(mongodb(\+srv)?://.+|\$\{(file:[^}]+|[A-Za-z0-9_]+)\})$"))]
    pub uri: String,
    /// MongoDB's rules: under 64 bytes, none of `/ \\ . " $ * < > : | ?`, a space or NUL.
    #[schemars(length(min = 1, max = 63))]
    #[schemars(regex(pattern = r#"^[^/\\. "$*<>:|?\x00]+$"#))]
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
    #[schemars(length(min = 3, max = 3), inner(range(min = 0, max = 100)))]
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
    #[schemars(with = "crate::spec::TenantForm")]
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
    /// A manual gate: `reshard run` stops here until `reshard approve MIGRATION_ID --step S`.
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
    /// Documents per second across all workers while the step runs (was `rate`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub max_docs_per_sec: Option<f64>,
    /// Write commands in flight per target shard, per worker (was `in_flight`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 64))]
    pub max_in_flight_per_shard: Option<usize>,
    /// A batch slower than this halves the rate (was `latency_target`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("x-duration" = true))]
    pub target_batch_latency: Option<String>,
    /// How long a worker's partition lease lasts without a heartbeat (default `30s`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("x-duration" = true))]
    pub lease_ttl: Option<String>,
    /// Cleanup: cumulative wave percentages, e.g. `[1, 10, 100]` (was `waves`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 3, max = 3), inner(range(min = 0, max = 100)))]
    pub cleanup_waves: Option<Vec<f64>>,
}

#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ReconcileDoc {
    /// Samples per stratum (default 100).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 100000))]
    pub sample: Option<usize>,
    /// How samples are grouped (default `shard`), as `reshard reconcile --stratify` (was
    /// `strata`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stratify: Option<StrataDoc>,
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
    #[schemars(extend("x-duration" = true))]
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
pub(super) const STEP_KINDS: [&str; 8] = [
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
    constrain_durations(&mut schema);
    schema
}

/// What a duration's text looks like (humantime: whole numbers, each with its unit: `500ms`,
/// `1h 30m`): a superset of what [`crate::duration::parse`] reads, so that an editor flags a
/// bare number or a sentence while the check of meaning keeps the last word (`0s`, an unknown
/// unit).
pub const DURATION_PATTERN: &str = r"^\s*([0-9]+\s*[A-Za-zµ]+\s*)+$";

/// Gives every schema marked `x-duration` the [`DURATION_PATTERN`].
fn constrain_durations(node: &mut serde_json::Value) {
    match node {
        serde_json::Value::Object(map) => {
            if map.get("x-duration") == Some(&serde_json::Value::Bool(true)) {
                map.insert("pattern".into(), DURATION_PATTERN.into());
            }
            map.values_mut().for_each(constrain_durations);
        }
        serde_json::Value::Array(items) => items.iter_mut().for_each(constrain_durations),
        _ => {}
    }
}

/// The `$id` of the playbook schema: the format's name, a URN since the schema is shipped
/// with the binary (`reshard playbook schema`) and in the repository, not served.
pub const SCHEMA_ID: &str = "urn:reshard:schema:playbook:v1";

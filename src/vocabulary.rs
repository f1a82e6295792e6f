//! One vocabulary (docs/glossary.md): the names that changed so that one concept has one name,
//! and how the old ones keep working for one version. Until 0.2 an old command word is
//! accepted with a warning, and JSON that had an old key carries it beside the new one.

use serde_json::Value;

/// JSON keys renamed, as (old, new). A migration referred to from another object is
/// `migration_id` everywhere; `migration status`, `migration configure`, `throttle set|show`,
/// `run`'s results and the routers' shadow stats called it `migration`. Why a migration failed
/// is `failure_reason`, as in its row; `migration status`, hooks' payloads and phase-change
/// events called it `failure`.
/// A setting is called by its name in `migration status` too: its `throttle`, `cleanup` and
/// `shadow_reads` objects called three of them `configured_docs_per_sec`, `waves` and
/// `percent`.
pub const RENAMED_KEYS: &[(&str, &str)] = &[
    ("migration", "migration_id"),
    ("failure", "failure_reason"),
    ("configured_docs_per_sec", "max_docs_per_sec"),
    ("waves", "cleanup_waves"),
    ("percent", "shadow_read_percent"),
];

/// Command words renamed, as (old, new): nouns are singular, and what takes a registration away
/// is `remove` (`shard remove`, `hook remove`, `router remove`).
pub const RENAMED_COMMANDS: &[(&str, &str)] = &[
    ("routers forget", "router remove"),
    ("routers", "router"),
    ("router forget", "router remove"),
    ("approve PLAYBOOK_NAME", "approve MIGRATION_ID"),
];

/// Playbook keys renamed, as (steps, old, new): a step's options take the names of the
/// settings they override for the step (`settings.max_docs_per_sec`, `reshard throttle set
/// --max-docs-per-sec`, ...), and the reconcile step takes the word of `reshard reconcile
/// --stratify`. Each applies to the options of the step kinds listed.
pub const RENAMED_PLAYBOOK_KEYS: &[(&[&str], &str, &str)] = &[
    (WORKER_STEPS, "rate", "max_docs_per_sec"),
    (WORKER_STEPS, "in_flight", "max_in_flight_per_shard"),
    (WORKER_STEPS, "latency_target", "target_batch_latency"),
    (WORKER_STEPS, "waves", "cleanup_waves"),
    (&["reconcile"], "strata", "stratify"),
];

/// The steps whose options are a [`crate::spec::playbook::WorkersDoc`].
const WORKER_STEPS: &[&str] = &["backfill", "cleanup", "rollback"];

/// Command-line flags renamed, as (old, new): a flag takes the name of the setting it sets.
pub const RENAMED_FLAGS: &[(&str, &str)] = &[("--shadow-reads", "--shadow-read-percent")];

/// The entry of [`RENAMED_FLAGS`] for the old flag `old`.
pub fn renamed_flag(old: &str) -> (&'static str, &'static str) {
    *RENAMED_FLAGS
        .iter()
        .find(|(o, _)| *o == old)
        .unwrap_or_else(|| panic!("{old:?} is not in RENAMED_FLAGS"))
}

/// The entry of [`RENAMED_COMMANDS`] for the old words `old`.
pub fn renamed_command(old: &str) -> (&'static str, &'static str) {
    *RENAMED_COMMANDS
        .iter()
        .find(|(o, _)| *o == old)
        .unwrap_or_else(|| panic!("{old:?} is not in RENAMED_COMMANDS"))
}

/// The version that stops accepting the old names.
pub const OLD_NAMES_UNTIL: &str = "0.2";

/// `value` with the old name of each renamed key beside its new one, where the new one is
/// among its keys: what an object whose old JSON had the old key prints until 0.2.
pub fn with_old_names(mut value: Value) -> Value {
    if let Value::Object(map) = &mut value {
        for (old, new) in RENAMED_KEYS {
            if let Some(v) = map.get(*new).cloned() {
                map.entry(*old).or_insert(v);
            }
        }
    }
    value
}

/// The warning a command line with an old name gets.
pub fn deprecation(old: &str, new: &str) -> String {
    format!("`{old}` is deprecated and goes in {OLD_NAMES_UNTIL}: use `{new}`")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn an_old_key_is_added_beside_its_new_one_and_nowhere_else() {
        let v = with_old_names(json!({ "migration_id": 7, "phase": "backfill" }));
        assert_eq!(v["migration"], 7);
        assert_eq!(v["migration_id"], 7);
        // Without the new key nothing is added; an existing old key (a hook's migration
        // object) is kept as it is.
        assert_eq!(with_old_names(json!({ "id": 7 })), json!({ "id": 7 }));
        let hook = json!({ "migration_id": 7, "migration": { "id": 7 } });
        assert_eq!(with_old_names(hook.clone()), hook);
        // Only an object's own keys: an array is left alone.
        assert_eq!(
            with_old_names(json!([{ "migration_id": 1 }])),
            json!([{ "migration_id": 1 }])
        );
    }

    #[test]
    fn a_deprecation_names_the_old_words_the_new_ones_and_when_the_old_go() {
        let line = deprecation("routers forget", "router remove");
        assert!(line.contains("`router remove`"), "{line}");
        assert!(line.contains("`router remove`"), "{line}");
        assert!(line.contains(OLD_NAMES_UNTIL), "{line}");
    }
}

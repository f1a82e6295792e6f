//! The old names of step options ([`crate::vocabulary::RENAMED_PLAYBOOK_KEYS`]), read as the
//! new ones until 0.2: a playbook written with `rate:` or `strata:` reads as one written with
//! `max_docs_per_sec:` or `stratify:`, and says where the old name stands. The pinned content
//! of a playbook stored before the rename is read through the same table, so resuming it is
//! not taken for an edit of its finished steps.

use serde_json::Value;

use super::shape::child;
use crate::vocabulary::RENAMED_PLAYBOOK_KEYS;

/// One old key read as its new name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Renamed {
    /// Where it stands in the file (`steps[3].backfill.rate`).
    pub old_path: String,
    /// Where it stands once renamed (`steps[3].backfill.max_docs_per_sec`).
    pub new_path: String,
    pub old: &'static str,
    pub new: &'static str,
    /// The step's position and kind.
    step: usize,
    kind: String,
}

/// What renaming found: the keys renamed, and the steps that give a key under both names.
#[derive(Debug, Default)]
pub(super) struct Renaming {
    pub renamed: Vec<Renamed>,
    /// (path of the old key, old, new): both names given; nothing is renamed there.
    pub both: Vec<(String, &'static str, &'static str)>,
}

impl Renaming {
    /// `path` of the renamed document, as it stands in the file.
    pub fn in_file(&self, path: &str) -> String {
        for r in &self.renamed {
            if let Some(rest) = path.strip_prefix(&r.new_path) {
                if rest.is_empty() || rest.starts_with('.') || rest.starts_with('[') {
                    return format!("{}{rest}", r.old_path);
                }
            }
        }
        path.to_owned()
    }
}

/// Renames, in a playbook's JSON form, every old step option to its new name.
pub(super) fn rename(json: &mut Value) -> Renaming {
    let mut out = Renaming::default();
    let Some(steps) = json.get_mut("steps").and_then(Value::as_array_mut) else {
        return out;
    };
    for (i, step) in steps.iter_mut().enumerate() {
        let Some(step) = step.as_object_mut() else {
            continue;
        };
        for (kind, options) in step.iter_mut() {
            let Some(options) = options.as_object_mut() else {
                continue;
            };
            let at = child(&format!("steps[{i}]"), kind);
            for (kinds, old, new) in RENAMED_PLAYBOOK_KEYS {
                if !kinds.contains(&kind.as_str()) || !options.contains_key(*old) {
                    continue;
                }
                if options.contains_key(*new) {
                    out.both.push((child(&at, old), old, new));
                    continue;
                }
                let value = options.remove(*old).expect("present");
                options.insert((*new).to_owned(), value);
                out.renamed.push(Renamed {
                    old_path: child(&at, old),
                    new_path: child(&at, new),
                    old,
                    new,
                    step: i,
                    kind: kind.clone(),
                });
            }
        }
    }
    out
}

/// The same renames in the YAML form the types read (which keeps what JSON cannot hold, an
/// infinite number, for the checks of meaning to refuse).
pub(super) fn rename_yaml(yaml: &mut serde_yaml::Value, renaming: &Renaming) {
    for r in &renaming.renamed {
        let Some(options) = yaml
            .get_mut("steps")
            .and_then(|steps| steps.get_mut(r.step))
            .and_then(|step| step.get_mut(r.kind.as_str()))
            .and_then(serde_yaml::Value::as_mapping_mut)
        else {
            continue;
        };
        if let Some(value) = options.remove(r.old) {
            options.insert(serde_yaml::Value::String(r.new.to_owned()), value);
        }
    }
}

/// A playbook's pinned content with the current names: what an earlier version stored reads
/// as what this one would store for the same file.
pub fn with_current_names(content: &Value) -> Value {
    let mut content = content.clone();
    rename(&mut content);
    content
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn old_step_options_take_the_settings_names_and_keep_their_place_in_the_file() {
        let mut doc = json!({
            "steps": [
                { "advance": "dual_read" },
                { "name": "copy", "backfill": { "rate": 500, "in_flight": 4, "latency_target": "1s" } },
                { "reconcile": { "strata": "tenant", "sample": 10 } },
                { "cleanup": { "waves": [1, 10, 100], "max_docs_per_sec": 7 } },
                { "soak": "1m" },
            ]
        });
        let r = rename(&mut doc);
        assert_eq!(
            doc["steps"][1]["backfill"],
            json!({ "max_docs_per_sec": 500, "max_in_flight_per_shard": 4, "target_batch_latency": "1s" })
        );
        assert_eq!(
            doc["steps"][2]["reconcile"],
            json!({ "stratify": "tenant", "sample": 10 })
        );
        assert_eq!(
            doc["steps"][3]["cleanup"]["cleanup_waves"],
            json!([1, 10, 100])
        );
        assert_eq!(doc["steps"][4], json!({ "soak": "1m" }));
        let olds: Vec<&str> = r.renamed.iter().map(|r| r.old_path.as_str()).collect();
        assert_eq!(
            olds,
            [
                "steps[1].backfill.rate",
                "steps[1].backfill.in_flight",
                "steps[1].backfill.latency_target",
                "steps[2].reconcile.strata",
                "steps[3].cleanup.waves",
            ]
        );
        // A problem found under the new name is told where the file has the old one.
        assert_eq!(
            r.in_file("steps[3].cleanup.cleanup_waves"),
            "steps[3].cleanup.waves"
        );
        assert_eq!(
            r.in_file("steps[3].cleanup.cleanup_waves[2]"),
            "steps[3].cleanup.waves[2]"
        );
        assert_eq!(
            r.in_file("steps[3].cleanup.workers"),
            "steps[3].cleanup.workers"
        );
        assert!(r.both.is_empty());
    }

    #[test]
    fn a_key_under_both_names_is_left_for_the_reader_to_settle() {
        let mut doc = json!({ "steps": [{ "backfill": { "rate": 1, "max_docs_per_sec": 2 } }] });
        let r = rename(&mut doc);
        assert!(r.renamed.is_empty());
        assert_eq!(
            r.both,
            [(
                "steps[0].backfill.rate".to_owned(),
                "rate",
                "max_docs_per_sec"
            )]
        );
        // An option of another step kind is not a renamed one.
        let mut other =
            json!({ "steps": [{ "soak": { "rate": 1 } }, { "reconcile": { "waves": 1 } }] });
        assert!(rename(&mut other).renamed.is_empty());
        assert_eq!(other["steps"][0]["soak"], json!({ "rate": 1 }));
    }

    #[test]
    fn pinned_content_of_an_older_version_reads_as_this_ones() {
        let old = json!({ "name": "p", "steps": [{ "name": "b", "backfill": { "rate": 5 } }] });
        let new = json!({ "name": "p", "steps": [{ "name": "b", "backfill": { "max_docs_per_sec": 5 } }] });
        assert_eq!(with_current_names(&old), new);
        assert_eq!(with_current_names(&new), new);
    }
}

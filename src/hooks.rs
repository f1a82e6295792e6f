//! Hooks: commands a migration runs when something happens to it (gh-ost's hook model).
//!
//! A hook names the events it wants (`on`), a shell command, whether it is *blocking* and how
//! long it may take. Each event of the migration's log that the hook wants is handed to the
//! command as one JSON object on stdin (`payload`), with the same facts in `RESHARD_*`
//! environment variables. Delivery is at least once and in the order of the log: a hook's
//! position in the log moves past an event only after the command ran for it (or the event
//! was not for it). What runs the commands is `driver::hooks`; this module holds the pure
//! parts: what an `on` name means, which events match, what the command receives.
//!
//! A failing hook is logged (a `hook_failed` event) and the migration goes on, unless the hook
//! is blocking: then the migration is paused, and the event is delivered again once the
//! operator resumes it.

use serde::Serialize;

use crate::events::EventKind;

/// What a hook may be told about: a class of events, or one kind by its name.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum HookOn {
    /// Every phase move (forward and back): `advance` events.
    PhaseChange,
    /// Something went wrong and a migration or a playbook run stopped: every event kind that
    /// [`EventKind::is_failure`] (`fail`, `barrier_timed_out`, `switch_failed`,
    /// `prepare_failed`, `reconciliation_failed`, `soak_failed`, `step_failed`).
    Failure,
    /// Overload lasted: the targets need capacity or a lower rate.
    CapacitySignal,
    /// A playbook stopped at a manual approval.
    ApprovalGate,
    /// Every event.
    All,
    /// One event kind.
    Kind(EventKind),
}

/// The class names `on` accepts, besides every event kind.
pub const CLASSES: [&str; 5] = [
    "phase_change",
    "failure",
    "capacity_signal",
    "approval_gate",
    "all",
];

impl HookOn {
    /// Reads one name: a class, or an event kind (`rate_cut`, `bypass_found`, ...).
    pub fn parse(name: &str) -> Result<HookOn, String> {
        Ok(match name {
            "phase_change" => HookOn::PhaseChange,
            "failure" => HookOn::Failure,
            "capacity_signal" => HookOn::CapacitySignal,
            "approval_gate" => HookOn::ApprovalGate,
            "all" => HookOn::All,
            other => match EventKind::ALL.iter().find(|k| k.as_str() == other) {
                Some(kind) => HookOn::Kind(*kind),
                None => {
                    return Err(format!(
                        "unknown hook event {other:?}: use one of {}, or an event kind ({})",
                        CLASSES.join(", "),
                        EventKind::ALL
                            .iter()
                            .map(|k| k.as_str())
                            .collect::<Vec<_>>()
                            .join(", ")
                    ))
                }
            },
        })
    }

    /// Reads a comma-separated list; duplicates are dropped, order kept.
    pub fn parse_list(names: &str) -> Result<Vec<HookOn>, String> {
        let mut out = Vec::new();
        for name in names.split(',').map(str::trim) {
            if name.is_empty() {
                return Err("an empty hook event name: separate names with single commas".into());
            }
            let on = HookOn::parse(name)?;
            if !out.contains(&on) {
                out.push(on);
            }
        }
        Ok(out)
    }

    pub fn as_str(self) -> &'static str {
        match self {
            HookOn::PhaseChange => "phase_change",
            HookOn::Failure => "failure",
            HookOn::CapacitySignal => "capacity_signal",
            HookOn::ApprovalGate => "approval_gate",
            HookOn::All => "all",
            HookOn::Kind(kind) => kind.as_str(),
        }
    }

    /// Whether an event of `kind` is for a hook on this.
    pub fn matches(self, kind: EventKind) -> bool {
        match self {
            HookOn::PhaseChange => kind == EventKind::Advance,
            HookOn::Failure => kind.is_failure(),
            HookOn::CapacitySignal => kind == EventKind::CapacitySignal,
            HookOn::ApprovalGate => kind == EventKind::ApprovalRequested,
            // A hook's own failures are not news to hooks on everything: a failing hook on
            // `all` would otherwise feed itself.
            HookOn::All => kind != EventKind::HookFailed,
            HookOn::Kind(k) => k == kind,
        }
    }
}

/// A hook to declare.
#[derive(Clone, Debug, PartialEq)]
pub struct NewHook {
    pub name: String,
    pub on: Vec<HookOn>,
    pub command: String,
    pub blocking: bool,
    pub timeout: std::time::Duration,
}

impl NewHook {
    pub fn on_names(&self) -> Vec<String> {
        self.on.iter().map(|o| o.as_str().to_owned()).collect()
    }

    pub fn timeout_ms(&self) -> i64 {
        self.timeout.as_millis().clamp(1, i64::MAX as u128) as i64
    }
}

/// Whether a hook on `on` wants an event of `kind`.
pub fn wanted(on: &[HookOn], kind: EventKind) -> bool {
    on.iter().any(|o| o.matches(kind))
}

/// What the command reads on stdin: the event, and the migration as it is when the hook runs.
#[derive(Clone, Debug, Serialize)]
pub struct Payload<'a> {
    pub hook: &'a str,
    pub migration: MigrationFacts<'a>,
    pub event: EventFacts<'a>,
}

#[derive(Clone, Debug, Serialize)]
pub struct MigrationFacts<'a> {
    pub id: i64,
    pub collection: &'a str,
    pub phase: &'a str,
    pub epoch: i64,
    pub paused: bool,
    /// Why the migration failed, if it did.
    pub failure_reason: Option<&'a str>,
    /// The old name of `failure_reason` (deprecated, written beside it until 0.2).
    pub failure: Option<&'a str>,
}

#[derive(Clone, Debug, Serialize)]
pub struct EventFacts<'a> {
    pub id: i64,
    pub kind: EventKind,
    pub at: String,
    pub actor: &'a str,
    pub from_phase: Option<&'a str>,
    pub to_phase: Option<&'a str>,
    pub epoch: i64,
    pub reason: Option<&'a str>,
    pub details: &'a serde_json::Value,
}

impl Payload<'_> {
    /// The environment the command also gets: the same facts, for scripts that need no JSON.
    pub fn env(&self) -> Vec<(&'static str, String)> {
        let mut env = vec![
            ("RESHARD_HOOK", self.hook.to_owned()),
            ("RESHARD_MIGRATION", self.migration.id.to_string()),
            ("RESHARD_COLLECTION", self.migration.collection.to_owned()),
            ("RESHARD_PHASE", self.migration.phase.to_owned()),
            ("RESHARD_EVENT_ID", self.event.id.to_string()),
            ("RESHARD_EVENT_KIND", self.event.kind.as_str().to_owned()),
        ];
        if let Some(from) = self.event.from_phase {
            env.push(("RESHARD_FROM_PHASE", from.to_owned()));
        }
        if let Some(to) = self.event.to_phase {
            env.push(("RESHARD_TO_PHASE", to.to_owned()));
        }
        env
    }
}

/// Checks a hook's name: what `hook remove` and the event log call it by.
pub fn check_name(name: &str) -> Result<(), String> {
    let ok = !name.is_empty()
        && name.len() <= 63
        && name
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_lowercase() || c.is_ascii_digit())
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || "._-".contains(c));
    if ok {
        Ok(())
    } else {
        Err(format!(
            "hook name {name:?}: use 1 to 63 lower-case letters, digits, '.', '_' and '-', \
             starting with a letter or a digit"
        ))
    }
}

/// The end of a command's output worth showing in a failure: its last non-empty lines, at
/// most `max` characters.
pub fn tail(output: &str, max: usize) -> String {
    let trimmed = output.trim();
    if trimmed.chars().count() <= max {
        return trimmed.to_owned();
    }
    let start = trimmed
        .char_indices()
        .rev()
        .nth(max - 1)
        .map_or(0, |(i, _)| i);
    format!("…{}", &trimmed[start..])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes_match_their_kinds_only() {
        assert!(HookOn::PhaseChange.matches(EventKind::Advance));
        assert!(!HookOn::PhaseChange.matches(EventKind::Pause));
        assert!(HookOn::Failure.matches(EventKind::Fail));
        assert!(HookOn::Failure.matches(EventKind::BarrierTimedOut));
        assert!(HookOn::Failure.matches(EventKind::SoakFailed));
        assert!(!HookOn::Failure.matches(EventKind::HookFailed));
        assert!(!HookOn::Failure.matches(EventKind::BarrierWaited));
        assert!(HookOn::CapacitySignal.matches(EventKind::CapacitySignal));
        assert!(!HookOn::CapacitySignal.matches(EventKind::RateCut));
        assert!(HookOn::ApprovalGate.matches(EventKind::ApprovalRequested));
        assert!(!HookOn::ApprovalGate.matches(EventKind::Approved));
        assert!(HookOn::Kind(EventKind::RateCut).matches(EventKind::RateCut));
        assert!(HookOn::All.matches(EventKind::BypassFound));
        assert!(!HookOn::All.matches(EventKind::HookFailed));
        assert!(HookOn::Kind(EventKind::HookFailed).matches(EventKind::HookFailed));
    }

    #[test]
    fn names_parse_to_classes_and_kinds() {
        assert_eq!(
            HookOn::parse_list("phase_change, rate_cut,phase_change").unwrap(),
            vec![HookOn::PhaseChange, HookOn::Kind(EventKind::RateCut)]
        );
        for kind in EventKind::ALL {
            assert_eq!(
                HookOn::parse(kind.as_str()).unwrap().as_str(),
                kind.as_str()
            );
        }
        for class in CLASSES {
            assert_eq!(HookOn::parse(class).unwrap().as_str(), class);
        }
        let err = HookOn::parse("phase-change").unwrap_err();
        assert!(err.contains("\"phase-change\""), "{err}");
        assert!(
            err.contains("approval_gate") && err.contains("bypass_found"),
            "{err}"
        );
        assert!(HookOn::parse_list("failure,,all").is_err());
    }

    #[test]
    fn wanted_is_any_of() {
        let on = [HookOn::Failure, HookOn::ApprovalGate];
        assert!(wanted(&on, EventKind::Fail));
        assert!(wanted(&on, EventKind::ApprovalRequested));
        assert!(!wanted(&on, EventKind::Advance));
        assert!(!wanted(&[], EventKind::Advance));
    }

    #[test]
    fn names_are_checked() {
        assert!(check_name("page-oncall.v2").is_ok());
        assert!(check_name("").is_err());
        assert!(check_name("Page").is_err());
        assert!(check_name("-x").is_err());
        assert!(check_name(&"a".repeat(64)).is_err());
    }

    #[test]
    fn tails_keep_the_end() {
        assert_eq!(tail("  short \n", 10), "short");
        assert_eq!(tail("0123456789abcdef", 4), "…cdef");
        assert_eq!(tail("ééééé", 2), "…éé");
    }

    #[test]
    fn the_environment_names_the_event() {
        let details = serde_json::json!({});
        let p = Payload {
            hook: "h",
            migration: MigrationFacts {
                id: 3,
                collection: "orders",
                phase: "backfill",
                epoch: 9,
                paused: false,
                failure_reason: None,
                failure: None,
            },
            event: EventFacts {
                id: 41,
                kind: EventKind::Advance,
                at: "t".into(),
                actor: "me",
                from_phase: Some("new_writes"),
                to_phase: Some("backfill"),
                epoch: 9,
                reason: None,
                details: &details,
            },
        };
        let env = p.env();
        assert!(env.contains(&("RESHARD_EVENT_KIND", "advance".into())));
        assert!(env.contains(&("RESHARD_TO_PHASE", "backfill".into())));
        assert!(env.contains(&("RESHARD_MIGRATION", "3".into())));
        let json = serde_json::to_value(&p).unwrap();
        assert_eq!(json["event"]["kind"], "advance");
        assert_eq!(json["migration"]["phase"], "backfill");
    }
}

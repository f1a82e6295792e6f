//! Durations as operators write them, on the command line and in playbooks alike: humantime
//! (`500ms`, `30s`, `5m`, `1h`). A bare number is refused with the unit to write: flags used to
//! mean seconds in some places and milliseconds in others, so a number alone says too little.

use std::time::Duration;

/// The forms a duration may take, for messages.
pub const FORMS: &str = "e.g. 500ms, 30s, 10m, 1h";

/// Parses `text` as a humantime duration; a bare number gets [`bare_number`]'s message.
pub fn parse(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    if is_bare_number(text) {
        return Err(bare_number(text));
    }
    humantime::parse_duration(text)
        .map_err(|e| format!("{text:?} is not a duration ({e}); write {FORMS}"))
}

/// Whether `text` is a number without a unit (`30`, `1.5`).
pub fn is_bare_number(text: &str) -> bool {
    !text.is_empty() && text.parse::<f64>().is_ok()
}

/// What to say about a bare number: that it needs a unit, and which to write.
pub fn bare_number(number: &str) -> String {
    format!("{number} has no unit; write a unit: {number}s (or {number}ms, {number}m; {FORMS})")
}

/// The unit a stored setting counts in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unit {
    Seconds,
    Milliseconds,
}

/// `d` as a whole, non-zero number of `unit`; a duration the unit cannot hold is refused with
/// what to write (`use whole seconds (e.g. 2s)`), rather than rounded without a word.
pub fn whole(d: Duration, unit: Unit) -> Result<u64, String> {
    let (per, suffix, name) = match unit {
        Unit::Seconds => (1_000_000_000_u128, "s", "seconds"),
        Unit::Milliseconds => (1_000_000_u128, "ms", "milliseconds"),
    };
    let nanos = d.as_nanos();
    if nanos == 0 {
        return Err(format!("use at least 1{suffix}"));
    }
    if !nanos.is_multiple_of(per) {
        return Err(format!(
            "use whole {name} (e.g. {}{suffix})",
            nanos.div_ceil(per)
        ));
    }
    u64::try_from(nanos / per).map_err(|_| format!("too long; use at most {}{suffix}", u64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn humantime_forms_parse() {
        for (text, expected) in [
            ("500ms", Duration::from_millis(500)),
            ("90s", Duration::from_secs(90)),
            ("5m", Duration::from_secs(300)),
            ("1h 30m", Duration::from_secs(5400)),
            (" 2s ", Duration::from_secs(2)),
        ] {
            assert_eq!(parse(text), Ok(expected), "{text}");
        }
    }

    #[test]
    fn a_setting_stored_in_whole_units_refuses_what_it_cannot_hold() {
        let ms = Duration::from_millis;
        assert_eq!(whole(ms(2000), Unit::Seconds), Ok(2));
        assert_eq!(
            whole(ms(1500), Unit::Seconds),
            Err("use whole seconds (e.g. 2s)".into())
        );
        assert_eq!(
            whole(ms(500), Unit::Seconds),
            Err("use whole seconds (e.g. 1s)".into())
        );
        assert_eq!(whole(ms(0), Unit::Seconds), Err("use at least 1s".into()));
        assert_eq!(whole(ms(750), Unit::Milliseconds), Ok(750));
        assert_eq!(
            whole(Duration::from_micros(1500), Unit::Milliseconds),
            Err("use whole milliseconds (e.g. 2ms)".into())
        );
    }

    #[test]
    fn a_bare_number_is_refused_naming_the_unit_to_write() {
        for number in ["30", "0", "1.5", "2000"] {
            let message = parse(number).unwrap_err();
            assert!(
                message.contains(&format!("write a unit: {number}s")),
                "{number}: {message}"
            );
        }
        assert!(parse("ten").unwrap_err().contains("is not a duration"));
        assert!(parse("").is_err());
    }
}

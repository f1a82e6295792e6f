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

//! Credentials never reach output or logs: every connection string shown to anyone passes
//! through [`redact_uri`] or is wrapped in [`Redacted`].

use std::fmt;

/// Replaces the password of every `scheme://user:password@host` in `text` with `***`, and the
/// value of `password=` query parameters too. Text without credentials comes back unchanged.
pub fn redact_uri(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(pos) = rest.find("://") {
        let (head, tail) = rest.split_at(pos + 3);
        out.push_str(head);
        // The authority ends at the first '/', '?', '#' or whitespace; credentials end at its
        // last '@' (a password may itself contain '@' when not percent-encoded).
        let end = tail
            .find(|c: char| c == '/' || c == '?' || c == '#' || c.is_whitespace())
            .unwrap_or(tail.len());
        let authority = &tail[..end];
        match authority.rfind('@') {
            Some(at) => {
                let userinfo = &authority[..at];
                match userinfo.find(':') {
                    Some(colon) => {
                        out.push_str(&userinfo[..colon]);
                        out.push_str(":***");
                    }
                    None => out.push_str(userinfo),
                }
                out.push_str(&authority[at..]);
            }
            None => out.push_str(authority),
        }
        rest = &tail[end..];
    }
    out.push_str(rest);
    redact_password_params(&out)
}

/// Whether a connection string holds a password in plain text: a `user:password@` whose
/// password is not only `${...}` references (resolved by each process when it connects), or a
/// `password=` option.
pub fn has_inline_password(uri: &str) -> bool {
    let plain = |value: &str| {
        let mut rest = value;
        while let Some(at) = rest.find("${") {
            if !rest[..at].is_empty() {
                return true;
            }
            match rest[at..].find('}') {
                Some(end) => rest = &rest[at + end + 1..],
                None => return true,
            }
        }
        !rest.is_empty()
    };
    let Some(pos) = uri.find("://") else {
        return false;
    };
    let tail = &uri[pos + 3..];
    let end = tail.find(['/', '?', '#']).unwrap_or(tail.len());
    let authority = &tail[..end];
    if let Some(at) = authority.rfind('@') {
        if let Some((_, password)) = authority[..at].split_once(':') {
            if plain(password) {
                return true;
            }
        }
    }
    uri.split_once('?').is_some_and(|(_, query)| {
        query.split(['&', ';']).any(|pair| {
            pair.split_once('=')
                .is_some_and(|(k, v)| k.eq_ignore_ascii_case("password") && plain(v))
        })
    })
}

fn redact_password_params(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(pos) = find_password_param(rest) {
        let (head, tail) = rest.split_at(pos);
        out.push_str(head);
        let eq = tail.find('=').expect("matched a key ending in '='") + 1;
        out.push_str(&tail[..eq]);
        out.push_str("***");
        let end = tail[eq..]
            .find(|c: char| c == '&' || c == '#' || c.is_whitespace())
            .map(|e| eq + e)
            .unwrap_or(tail.len());
        rest = &tail[end..];
    }
    out.push_str(rest);
    out
}

fn find_password_param(text: &str) -> Option<usize> {
    let lower = text.to_ascii_lowercase();
    ["?password=", "&password=", " password="]
        .iter()
        .filter_map(|key| lower.find(key).map(|p| p + 1))
        .min()
}

/// `text` without the secrets a connection string's references stood for (`values`: what
/// each `${...}` was replaced by). A value that is itself a URI counts for its password only.
/// Hidden as `***`: each whole occurrence of a secret, and each word with a part (between URI
/// delimiters) of three or more characters found inside one. A parse error of the driver
/// quotes what it could not read, and for a password holding an unencoded `?` that is a piece
/// of the password (`invalid server address app:Xy7p: ... got Xy7p`), which [`redact_uri`]
/// cannot recognise as a password.
pub fn scrub(text: &str, values: &[String]) -> String {
    let secrets: Vec<&str> = values
        .iter()
        .filter_map(|v| match v.find("://") {
            Some(scheme) => {
                // Loosely: from the first ':' of the authority to its last '@', wherever a
                // misplaced '?', '/' or '#' in the password has moved the authority's end.
                let tail = &v[scheme + 3..];
                let at = tail.rfind('@')?;
                let colon = tail[..at].find(':')?;
                Some(&tail[colon + 1..at])
            }
            None => Some(v.as_str()),
        })
        .filter(|s| !s.is_empty())
        .collect();
    if secrets.is_empty() {
        return text.to_owned();
    }
    let mut text = text.to_owned();
    for s in &secrets {
        text = text.replace(s, "***");
    }
    let secret_part = |part: &str| part.len() >= 3 && secrets.iter().any(|s| s.contains(part));
    let edge = |c: char| {
        matches!(
            c,
            '(' | ')' | '[' | ']' | '"' | '\'' | ',' | ';' | ':' | '.'
        )
    };
    text.split(' ')
        .map(|word| {
            let core = word.trim_matches(edge);
            let hidden = core
                .split(|c: char| !(c.is_alphanumeric() || matches!(c, '-' | '_' | '~' | '%')))
                .any(secret_part);
            if hidden {
                let start = word.len() - word.trim_start_matches(edge).len();
                let end = word.trim_end_matches(edge).len();
                format!("{}***{}", &word[..start], &word[end.max(start)..])
            } else {
                word.to_owned()
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// A connection string that prints redacted through `Display` and `Debug`.
#[derive(Clone, PartialEq, Eq)]
pub struct Redacted(String);

impl Redacted {
    pub fn new(uri: impl Into<String>) -> Self {
        Redacted(uri.into())
    }

    /// The real value, for handing to a driver. Never print it.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Redacted {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&redact_uri(&self.0))
    }
}

impl fmt::Debug for Redacted {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Redacted({:?})", redact_uri(&self.0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_password_in_plain_text_is_told_from_a_reference() {
        for plain in [
            "mongodb://app:hunter2@h:27017/db",
            "mongodb://app:p@ss@h",
            "mongodb://app:x${PW}@h",
            "mongodb://app:${PW@h",
            "mongodb://h/?authMechanism=PLAIN&password=hunter2",
        ] {
            assert!(has_inline_password(plain), "{plain}");
        }
        for safe in [
            "mongodb://h:27017",
            "mongodb://app@h/?authSource=admin",
            "mongodb://app:${MONGO_PASSWORD}@h",
            "mongodb://app:${file:/run/secrets/pw}@h",
            "mongodb://${USER}:${PW}@h/?replicaSet=rs0",
            "${RESHARD_S1_URI}",
            "${file:/run/secrets/s1-uri}",
        ] {
            assert!(!has_inline_password(safe), "{safe}");
        }
    }

    #[test]
    fn passwords_are_replaced_and_everything_else_kept() {
        let cases = [
            (
                "postgres://alice:s3cret@db.example:5432/reshard",
                "postgres://alice:***@db.example:5432/reshard",
            ),
            (
                "mongodb://u:p@h1:27017,h2:27017/?replicaSet=rs0",
                "mongodb://u:***@h1:27017,h2:27017/?replicaSet=rs0",
            ),
            (
                "mongodb+srv://app:p@ss@cluster0.example/orders",
                "mongodb+srv://app:***@cluster0.example/orders",
            ),
            ("postgres://bob@localhost/x", "postgres://bob@localhost/x"),
            (
                "postgres://localhost/x?user=a&password=hunter2&sslmode=require",
                "postgres://localhost/x?user=a&password=***&sslmode=require",
            ),
            (
                "cannot reach mongodb://u:pw@h:1 and postgres://v:pw2@h:2/db",
                "cannot reach mongodb://u:***@h:1 and postgres://v:***@h:2/db",
            ),
            ("no uri here", "no uri here"),
        ];
        for (input, expected) in cases {
            assert_eq!(redact_uri(input), expected, "{input}");
        }
    }

    #[test]
    fn what_references_stood_for_is_scrubbed_from_a_message() {
        let password = "Xy7pQ2?mZ9/kL4".to_owned();
        let uri = "mongodb://app:Xy7pQ2?mZ9/kL4@h:27017/?authSource=admin".to_owned();
        let cases = [
            // The driver's parse error for a password with an unencoded '?'.
            (
                "invalid server address app:Xy7pQ2: the port must be an integer, got Xy7pQ2",
                &password,
                "invalid server address ***: the port must be an integer, got ***",
            ),
            (
                "option is not a 'key=value' pair: mZ9/kL4@h:27017/",
                &password,
                "option is not a 'key=value' pair: ***",
            ),
            // A whole URI from a file: its password counts, not its host or options.
            (
                "invalid server address app:Xy7pQ2 (h:27017, authSource=admin)",
                &uri,
                "invalid server address *** (h:27017, authSource=admin)",
            ),
            (
                "the password is Xy7pQ2?mZ9/kL4.",
                &password,
                "the password is ***.",
            ),
            ("no such host h", &password, "no such host h"),
            ("got Xy7p.", &password, "got ***."),
        ];
        for (text, value, expected) in cases {
            assert_eq!(scrub(text, std::slice::from_ref(value)), expected, "{text}");
        }
        assert_eq!(scrub("got Xy7p", &[]), "got Xy7p");
    }

    #[test]
    fn redacted_never_prints_the_secret() {
        let r = Redacted::new("mongodb://root:topsecret@h:27017");
        assert!(!format!("{r} {r:?}").contains("topsecret"));
        assert_eq!(r.expose(), "mongodb://root:topsecret@h:27017");
    }
}
